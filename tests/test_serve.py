"""`ferry serve`: a request table that grows while it is served keeps the same records as a fixed one, and the server
(a subprocess on a free port, tiny-llama on the CPU) answers the OpenAI completions API as vLLM does, batches
concurrent requests, aborts a request whose client leaves, stops on SIGINT and writes an iteration log that accounts
for every token."""

from __future__ import annotations

import asyncio
import json
import math
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import policies
from costmodel.shape import IterationShape
from experiments.real.live import ITERATION_LOG_COLUMNS, IterationRecord, iteration_table
from policies.config import SchedulerConfig
from sim.engine import decide, simulate
from sim.kvcache import KVCacheManager
from sim.request import COLUMN_FILLS, RequestTable, Status
from sim.state import Batch, SchedulerState
from tests.helpers import LinearTimer, serving

ROOT = Path(__file__).resolve().parents[1]


# ---- a table that grows ------------------------------------------------------------------------------------------
def test_append_grows_every_column_with_a_fresh_request() -> None:
    table = RequestTable([0.0, 0.5], [10, 20], [3, 4])
    table.status[0] = Status.FINISHED
    table.first_token[0] = 0.25
    for k in range(200):  # past several doublings
        assert table.append(1.0 + k, 5 + k, 7) == 2 + k
    assert table.n == len(table) == 202
    for name, fill in COLUMN_FILLS:
        column = getattr(table, name)
        assert len(column) == 202, name
        if name not in ("arrival", "prompt", "output_wanted"):
            assert np.array_equal(column[2:], np.full(200, fill), equal_nan=True), name
    assert table.status[0] == Status.FINISHED and table.first_token[0] == 0.25  # kept
    assert table.arrival[-1] == 200.0 and table.prompt[-1] == 204 and table.output_wanted[-1] == 7
    assert table.admit_order[-1] == -1 and table.computed[-1] == 0 and math.isnan(table.released[-1])
    table.status = table.status.copy()  # a column replaced since the last growth is grown from, not lost
    table.status[1] = Status.RUNNING
    table.append(300.0, 1, 1)
    assert table.status[1] == Status.RUNNING and table.status[-1] == Status.PENDING


def _served_live(arrivals: np.ndarray, prompts: np.ndarray, outputs: np.ndarray, cfg: SchedulerConfig) -> Any:
    """The reference engine's loop, but each request is appended to an empty table and routed when it arrives."""
    policy, timer = policies.get(cfg), LinearTimer(base=0.01, per_token=1e-4, per_ctx=1e-6)
    table = RequestTable([], [], [])
    kv = KVCacheManager(60, 16, 0)
    state = SchedulerState(table, kv, cfg.max_model_len, routed=True)
    now, k, n = 0.0, 0, len(arrivals)
    while True:
        while k < n and arrivals[k] <= now:
            req = table.append(arrivals[k], prompts[k], outputs[k])
            if req >= len(kv.held):
                kv.held = np.concatenate([kv.held, np.zeros(len(kv.held) + 8, dtype=np.int64)])
            state.route(req)
            k += 1
        state.more = k < n
        action = decide(state, policy, now)
        if isinstance(action, Batch):
            shape = state.shape_of(action)
            end = now + timer.iteration_time(shape)
            state.complete(action, shape, now, end)
            now = end
        elif k < n:
            now = min(float(arrivals[k]), math.inf if action is None else action)
        elif action is None:
            return state.records
        else:
            now = action


def test_a_table_grown_one_request_at_a_time_serves_as_a_fixed_one() -> None:
    rng = np.random.default_rng(3)
    n = 150
    arrivals = np.cumsum(rng.exponential(0.02, n))
    prompts = rng.integers(1, 300, n)
    outputs = rng.integers(1, 40, n)
    cfg = SchedulerConfig(policy="chunked", max_num_seqs=16, max_num_batched_tokens=256, max_model_len=512)
    live = _served_live(arrivals, prompts, outputs, cfg)
    fixed = simulate(
        RequestTable(arrivals, prompts, outputs),
        policies.get(cfg),
        LinearTimer(base=0.01, per_token=1e-4, per_ctx=1e-6),
        KVCacheManager(60, 16, n),
        cfg.max_model_len,
        engine="reference",
    )
    assert live.requests.n == n
    assert (live.requests.status == Status.FINISHED).all()
    assert live.requests.preemptions.sum() > 0  # a small KV cache: preemption and recompute happened
    for name, _ in COLUMN_FILLS:
        assert np.array_equal(getattr(live.requests, name), getattr(fixed.requests, name), equal_nan=True), name
    pd.testing.assert_frame_equal(live.iterations.to_frame(), fixed.iterations.to_frame())
    assert np.array_equal(live.itl.values(), fixed.itl.values())


def test_iteration_table_columns() -> None:
    shape = IterationShape(np.array([5, 3]), np.array([0, 16]), np.array([7, 9, 11]), prefill_sampled=1)
    frame = iteration_table([IterationRecord(1.0, 1.25, shape, 0.2)])
    assert tuple(frame.columns) == ITERATION_LOG_COLUMNS
    row = frame.iloc[0]
    assert row.duration_s == 0.25 and row.num_prefill_seqs == 2 and row.prefill_tokens == 8
    assert row.prefill_context_tokens == 16 and row.num_decode_seqs == 3 and row.decode_context_tokens == 27
    assert json.loads(row.prefill_chunks) == [[5, 0], [3, 16]]
    assert list(iteration_table([]).columns) == list(ITERATION_LOG_COLUMNS)


# ---- the server ----------------------------------------------------------------------------------------------------
MAX_MODEL_LEN = 256


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str  # http://HOST:PORT/v1
    log: Path  # --iterations-log
    stderr: Path
    # every request the engine accepted: (prompt tokens, output tokens it made)
    served: list[tuple[int, int]] = field(default_factory=list)
    concurrent: bool = False  # concurrent requests were served (they must have shared iterations)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    for module in ("torch", "starlette", "uvicorn", "httpx"):
        pytest.importorskip(module)
    out = tmp_path_factory.mktemp("serve")
    args = ["--model", "tiny-llama", "--threads", "1",
           "--policy", "chunked", "--max-num-seqs", "8", "--max-num-batched-tokens", "128",
           "--max-model-len", str(MAX_MODEL_LEN), "--iterations-log", str(out / "iterations.csv")]  # fmt: skip
    with serving(args, out / "stderr.txt") as (proc, url):
        yield Server(proc, url, out / "iterations.csv", out / "stderr.txt")


def _post(server: Server, body: Any, **kw: Any) -> Any:
    import httpx

    content = body if isinstance(body, str) else json.dumps(body)
    return httpx.post(f"{server.url}/completions", content=content, timeout=30, **kw)


def _events(text: str) -> list[str]:
    return [block.removeprefix("data: ") for block in text.split("\n\n") if block]


def _metrics(server: Server) -> dict[str, float]:
    import httpx

    text = httpx.get(server.url.removesuffix("/v1") + "/metrics", timeout=10).text
    return {ln.split("{")[0]: float(ln.split()[-1]) for ln in text.splitlines() if not ln.startswith("#")}


def test_health_and_models(server: Server) -> None:
    import httpx

    health = httpx.get(server.url.removesuffix("/v1") + "/health", timeout=10)
    assert health.status_code == 200 and health.content == b""
    models = httpx.get(f"{server.url}/models", timeout=10).json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert card["id"] == "tiny-llama" and card["object"] == "model" and card["owned_by"] == "ferry"
    assert card["max_model_len"] == MAX_MODEL_LEN
    # the scheduler's limits, which a probe caps its prompts to (vLLM's card has none of them)
    assert card["max_num_batched_tokens"] == 128 and card["max_num_seqs"] == 8


def test_streamed_completion_of_token_ids(server: Server) -> None:
    ids = list(range(100, 140))
    body = {"model": "tiny-llama", "prompt": ids, "max_tokens": 6, "stream": True, "ignore_eos": True,
            "temperature": 0.7, "stream_options": {"include_usage": True}}  # fmt: skip
    r = _post(server, body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens, usage = chunks[:-1], chunks[-1]
    assert len(tokens) == 6
    for k, c in enumerate(tokens):
        assert c["object"] == "text_completion" and c["model"] == "tiny-llama" and c["id"].startswith("cmpl-")
        (choice,) = c["choices"]
        assert choice["index"] == 0 and choice["text"].startswith(" tok") and choice["logprobs"] is None
        assert choice["finish_reason"] == ("length" if k == 5 else None)
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 40, "completion_tokens": 6, "total_tokens": 46}
    server.served.append((40, 6))


def test_string_prompt_and_whole_response(server: Server) -> None:
    r = _post(server, {"model": "tiny-llama", "prompt": ["the quick  brown fox\njumps"], "max_tokens": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length" and len(choice["text"].split()) == 3
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}  # one token a word
    server.served.append((5, 3))
    r = _post(server, {"prompt": "one two three", "stream": True})  # no model: the served one; 16 tokens
    assert len(_events(r.text)) == 16 + 1  # no usage chunk without include_usage
    server.served.append((3, 16))


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"model": "tiny-llama", "prompt": [1, 2, 3], "max_tokens": MAX_MODEL_LEN}, 400, "maximum context length"),
        ({"model": "tiny-llama", "prompt": [1, 8192], "max_tokens": 2}, 400, "out of vocabulary"),
        ({"model": "tiny-llama", "prompt": [1, -1]}, 400, "out of vocabulary"),
        ({"model": "tiny-llama", "prompt": ["a", "b"]}, 400, "one prompt"),
        ({"model": "tiny-llama", "prompt": "  "}, 400, "empty"),
        ({"model": "tiny-llama", "prompt": [1], "max_tokens": "4"}, 400, "max_tokens"),
        ({"model": "tiny-llama", "prompt": [1], "stream": "yes"}, 400, "stream"),
        ({"model": "tiny-llama", "prompt": [1], "stream_options": {"include_usage": True}}, 400, "stream=True"),
        ({"model": "tiny-llama"}, 400, "prompt"),
        ([1, 2], 400, "JSON object"),
        ("{not json", 400, "not valid JSON"),
        ({"model": "llama-3-8b", "prompt": [1]}, 404, "does not exist"),
    ],
)
def test_bad_requests(server: Server, body: Any, status: int, words: str) -> None:
    r = _post(server, body)
    assert r.status_code == status
    error = r.json()["error"]
    assert words in error["message"] and error["code"] == status
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


def test_concurrent_streams_are_batched(server: Server) -> None:
    import httpx

    async def one(client: httpx.AsyncClient, k: int) -> list[str]:
        body = {"prompt": list(range(k, k + 20 + 5 * k)), "max_tokens": 12, "stream": True}
        async with client.stream("POST", f"{server.url}/completions", json=body) as r:
            return _events("".join([part async for part in r.aiter_text()]))

    async def all_of_them() -> list[list[str]]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(one(client, k) for k in range(6)))

    for k, events in enumerate(asyncio.run(all_of_them())):
        assert len(events) == 12 + 1 and events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        server.served.append((20 + 5 * k, 12))
    server.concurrent = True


def test_a_client_that_leaves_aborts_its_request(server: Server) -> None:
    import httpx

    before = _metrics(server)["vllm:generation_tokens_total"]
    wanted = MAX_MODEL_LEN - 8
    body = {"prompt": list(range(8)), "max_tokens": wanted, "stream": True}
    with httpx.stream("POST", f"{server.url}/completions", json=body, timeout=30) as r:
        received = 0
        for line in r.iter_lines():
            received += line.startswith("data: {")
            if received == 2:
                break
    deadline = time.monotonic() + 10
    while (m := _metrics(server))["vllm:num_requests_running"] + m["vllm:num_requests_waiting"] > 0:
        assert time.monotonic() < deadline, "the abandoned request still runs"
        time.sleep(0.05)
    made = int(_metrics(server)["vllm:generation_tokens_total"] - before)
    assert 2 <= made < wanted
    server.served.append((8, made))
    r = _post(server, {"prompt": [1, 2], "max_tokens": 2})  # the engine serves on
    assert r.status_code == 200
    server.served.append((2, 2))


def test_sigint_stops_it_and_the_log_accounts_for_every_token(server: Server) -> None:
    metrics = _metrics(server)
    server.proc.send_signal(signal.SIGINT)
    try:
        code = server.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("ferry serve did not stop within 15 s of SIGINT")
    out = server.proc.stdout.read() if server.proc.stdout else ""
    assert code == 0, server.stderr.read_text()
    assert "stopped after" in out and str(server.log) in out
    log = pd.read_csv(server.log)
    assert tuple(log.columns) == ITERATION_LOG_COLUMNS
    assert (log.duration_s > 0).all() and (log.forward_s <= log.duration_s).all()
    assert log.start_s.is_monotonic_increasing
    chunks = log.prefill_chunks.map(json.loads)
    assert (chunks.map(lambda c: sum(n for n, _ in c)) == log.prefill_tokens).all()
    assert (chunks.map(len) == log.num_prefill_seqs).all()
    assert (log.num_decode_seqs > 1).any() or not server.concurrent  # concurrent requests shared iterations
    prompts = sum(p for p, _ in server.served)
    made = sum(o for _, o in server.served)
    assert log.prefill_tokens.sum() == prompts == metrics["vllm:prompt_tokens_total"]  # no preemption: KV is ample
    assert log.num_decode_seqs.sum() == made - len(server.served)  # each request's first token ends its prefill
    assert made == metrics["vllm:generation_tokens_total"]
