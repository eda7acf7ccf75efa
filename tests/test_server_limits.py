"""What ferry's HTTP servers limit (``experiments.http_limits``), over real HTTP on this machine.

`ferry serve` (tiny-llama on the CPU, a subprocess) refuses a body past its limit before reading it, answers JSON
nested too deep and a prompt too long with 400 (the prompt before it is tokenized), aborts a request answered whole
whose client has gone, and on SIGINT or SIGTERM ends every open request with its 503 (a stream: the error event and
``[DONE]``) and exits without a traceback. `ferry explore` runs a lognormal without ``max=`` and ``request_rate=inf``,
refuses a run past its work limit naming the length to shorten, lets a small run past large ones, and answers 503
with Retry-After when too many large ones wait (and does not simulate a waiting run whose client has gone). Either
server answers a bug with a JSON 500 and logs one line, not a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

for _module in ("starlette", "uvicorn", "httpx"):  # torch too, where `ferry serve` runs a model
    pytest.importorskip(_module)

import httpx  # noqa: E402

from experiments.explore.app import LARGE_WAITING, RETRY_AFTER_S, build_app  # noqa: E402
from experiments.explore.payload import Explorer, Settings  # noqa: E402
from experiments.http_limits import DEFAULT_MAX_REQUEST_BODY_BYTES  # noqa: E402
from experiments.real import server as api  # noqa: E402
from experiments.runner.config import RunConfig  # noqa: E402
from sim.workload import Workload  # noqa: E402
from tests.helpers import serving  # noqa: E402

MAX_MODEL_LEN = 256
BODY_LIMIT = 1_000_000  # the served test server's --max-request-body-bytes (bytes)


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str  # http://HOST:PORT/v1
    stderr: Path

    @property
    def base(self) -> str:
        return self.url.removesuffix("/v1")

    @property
    def address(self) -> tuple[str, int]:
        host, port = re.match(r"http://\[?([^\]/]+)\]?:(\d+)", self.url).groups()  # type: ignore[union-attr]
        return host, int(port)


def _serve_args(*extra: str) -> list[str]:
    return ["--model", "tiny-llama", "--threads", "1", "--policy", "chunked", "--max-num-batched-tokens", "128",
            "--max-model-len", str(MAX_MODEL_LEN), *extra]  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("limits")
    args = _serve_args("--max-num-seqs", "4", "--max-request-body-bytes", str(BODY_LIMIT))
    with serving(args, out / "stderr.txt") as (proc, url):
        yield Served(proc, url, out / "stderr.txt")


def _metrics(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=10).text
    return {ln.split("{")[0]: float(ln.split()[-1]) for ln in text.splitlines() if not ln.startswith("#")}


def _raw_post(address: tuple[str, int], head: str, body: bytes = b"", timeout: float = 20) -> tuple[int, Any]:
    """POST over a bare socket: the status and the JSON body of what the server answers before it closes."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: test\r\n{head}\r\n".encode() + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def _no_traceback(stderr: Path) -> None:
    text = stderr.read_text()
    assert "Traceback" not in text and "CancelledError" not in text, text[-2000:]


# ---- ferry serve: the body, its JSON, the prompt --------------------------------------------------------------------
def test_a_body_past_the_limit_is_refused_before_it_is_read(served: Served) -> None:
    # only the headers are sent: a server that waited for the body would never answer
    status, body = _raw_post(served.address, "Content-Type: application/json\r\nContent-Length: 100000000\r\n")
    assert status == 413
    error = body["error"]
    assert error["code"] == 413 and error["type"] == "Request Entity Too Large" and error["param"] is None
    assert "--max-request-body-bytes" in error["message"] and f"{BODY_LIMIT:,}" in error["message"]


def test_a_streamed_body_past_the_limit_is_refused_as_it_comes(served: Served) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: sent chunked, 2 MB of a prompt's words
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"word " * 20_000
        yield b'"}'

    r = httpx.post(f"{served.url}/completions", content=chunks(), timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == 413


def test_health_answers_while_a_huge_body_is_refused(served: Served) -> None:
    huge = b'{"prompt": "' + b"a " * 50_000_000 + b'"}'  # 100 MB, one token a word
    answers: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: answers.append(httpx.post(f"{served.url}/completions", content=huge, timeout=120))
    )
    sender.start()
    start = time.monotonic()
    assert httpx.get(served.base + "/health", timeout=30).status_code == 200
    assert time.monotonic() - start < 5, "the event loop was held"
    sender.join(120)
    assert answers and answers[0].status_code == 413


def test_json_nested_too_deep_is_a_400(served: Served) -> None:
    deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(f"{served.url}/completions", content=deep, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "BadRequestError" and "nests JSON too deeply" in error["message"]
    shallow = b'{"prompt": ' + b"[" * 200 + b"1" + b"]" * 200 + b"}"  # decodable, the wrong shape: named, shortly
    r = httpx.post(f"{served.url}/completions", content=shallow, timeout=30)
    assert r.status_code == 400 and "'prompt' must be" in r.json()["error"]["message"]
    assert len(r.json()["error"]["message"]) < 300
    _no_traceback(served.stderr)


def test_a_prompt_too_long_is_refused_before_it_is_tokenized(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    words = "word " * 150_000  # 750 kB, within the body limit: 150,000 tokens
    r = httpx.post(f"{served.url}/completions", json={"prompt": words, "max_tokens": 4}, timeout=30)
    assert r.status_code == 400
    assert "maximum context length is 256" in r.json()["error"]["message"]
    ids = [*range(300), "x"]  # too long, and not all ids: the length is what is said (the ids are not looked at)
    r = httpx.post(f"{served.url}/completions", json={"prompt": ids}, timeout=30)
    assert r.status_code == 400 and "has 301 tokens" in r.json()["error"]["message"]

    hashed: list[bytes] = []  # in-process: how many words are tokenized
    monkeypatch.setattr(api, "zlib", SimpleNamespace(crc32=lambda b: hashed.append(b) or 7))
    with pytest.raises(api.ApiError, match="maximum context length"):
        api.parse_completion({"prompt": words}, "tiny-llama", 8192, MAX_MODEL_LEN)
    assert len(hashed) <= MAX_MODEL_LEN
    assert api.tokenize("a \u3000b\x1cc  d", 10) == api.tokenize("a \u3000b\x1cc  d", 10, most=99)  # str.split's words
    assert len(api.tokenize("a \u3000b\x1cc  d", 10)) == len("a \u3000b\x1cc  d".split())


def test_http_errors_take_vllms_shape(served: Served) -> None:
    r = httpx.get(served.base + "/no/such/path", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    r = httpx.get(f"{served.url}/completions", timeout=10)
    assert r.status_code == 405 and r.json()["error"]["type"] == "Method Not Allowed"


# ---- ferry serve: a client that leaves a request answered whole ----------------------------------------------------
def test_a_request_answered_whole_is_aborted_when_its_client_leaves(served: Served) -> None:
    wanted = MAX_MODEL_LEN - 8
    before = _metrics(served.base)["vllm:generation_tokens_total"]
    body = json.dumps({"prompt": list(range(8)), "max_tokens": wanted}).encode()
    head = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    with socket.create_connection(served.address, timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n" + head + body)
        deadline = time.monotonic() + 30
        while _metrics(served.base)["vllm:generation_tokens_total"] < before + 2:  # it is generating
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.02)
    deadline = time.monotonic() + 10  # the socket is closed: the seat must be freed at the engine's next turn
    while (m := _metrics(served.base))["vllm:num_requests_running"] + m["vllm:num_requests_waiting"] > 0:
        assert time.monotonic() < deadline, "the abandoned request still holds its seat"
        time.sleep(0.02)
    made = m["vllm:generation_tokens_total"] - before
    assert 2 <= made < wanted, made
    r = httpx.post(f"{served.url}/completions", json={"prompt": [1, 2], "max_tokens": 2}, timeout=30)
    assert r.status_code == 200  # it serves on


# ---- ferry serve: a stop signal with requests open -----------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_ends_open_streams_with_the_error_event(sig: signal.Signals, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    stderr = tmp_path / "stderr.txt"
    # two seats, four requests: two seated, two waiting when the signal comes
    with serving(_serve_args("--max-num-seqs", "2"), stderr) as (proc, url):
        streams: list[list[str]] = [[], [], []]
        wholes: list[httpx.Response] = []

        async def stream(client: httpx.AsyncClient, events: list[str]) -> None:
            body = {"prompt": list(range(10)), "max_tokens": MAX_MODEL_LEN - 16, "stream": True}
            async with client.stream("POST", f"{url}/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line:
                        events.append(line.removeprefix("data: "))

        async def whole(client: httpx.AsyncClient) -> None:
            wholes.append(await client.post(f"{url}/completions", json={"prompt": [5], "max_tokens": 200}))

        async def held(client: httpx.AsyncClient, base: str) -> int:
            """Requests the server holds (running and waiting), from its /metrics: on a busy machine the last
            requests can still be on their way when the first stream's tokens flow."""
            text = (await client.get(f"{base}/metrics")).text
            gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
            return sum(int(float(line.split()[-1])) for line in text.splitlines() if line.startswith(gauges))

        async def scenario() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                tasks = [asyncio.create_task(stream(client, events)) for events in streams]
                tasks.append(asyncio.create_task(whole(client)))
                deadline = time.monotonic() + 60
                base = url.removesuffix("/v1")
                while not any(streams) or await held(client, base) < 4:  # tokens flow, and all four are in
                    assert time.monotonic() < deadline, "no stream started, or the server did not get all four"
                    await asyncio.sleep(0.02)
                proc.send_signal(sig)
                await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)

        asyncio.run(scenario())
        code = proc.wait(timeout=30)
        out = proc.stdout.read() if proc.stdout else ""
    assert code == 0 and "stopped after 4 requests" in out, (code, out, stderr.read_text()[-2000:])
    for events in streams:
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == 503 and error["type"] == "ServiceUnavailableError", events[-3:]
        assert all("error" not in json.loads(e) for e in events[:-2])  # tokens, then the ending
    (r,) = wholes
    assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceUnavailableError"
    _no_traceback(stderr)


# ---- ferry explore --------------------------------------------------------------------------------------------------
def test_explore_runs_what_its_help_offers_and_refuses_too_much_work(tmp_path: Path) -> None:
    stderr = tmp_path / "stderr.txt"
    with serving(["--max-run-tokens", "1000000", "--max-request-body-bytes", "4096"], stderr, "explore") as (_, url):
        got = httpx.get(url + "api/run", params={"input_len": "lognormal:median=100,sigma=1"}, timeout=60)
        assert got.status_code == 200, got.text
        assert 1 <= max(r["prompt"] for r in got.json()["requests"]) <= 32768

        got = httpx.get(url + "api/run", params={"request_rate": "inf"}, timeout=60)
        assert got.status_code == 200, got.text
        page = got.json()
        assert page["settings"]["request_rate"] == "inf" and {r["arrival_ms"] for r in page["requests"]} == {0.0}

        query = {"num_prompts": "2000", "output_len": "8000", "max_model_len": "9000"}
        got = httpx.get(url + "api/run", params=query, timeout=60)
        assert got.status_code == 422
        error = got.json()["error"]
        assert error["field"] == "output_len" and "--max-run-tokens" in error["message"], error
        assert "1,000,000" in error["message"] and "\n" not in error["message"]

        got = httpx.request("GET", url + "api/run", content=b"x" * 5000, timeout=30)
        assert got.status_code == 413 and got.json()["error"]["field"] is None
    _no_traceback(stderr)


@contextlib.contextmanager
def running(app: Any) -> Iterator[str]:
    """``app`` under uvicorn in a thread of this process, on a free port: yields its address (``http://HOST:PORT/``)."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


WORK_LIMIT = 1_000_000  # --max-run-tokens of the in-process servers (tokens)
# 976,000 tokens: large (more than a tenth of the limit), seconds without batching; the page's defaults are small
LARGE = {"policy": "none", "num_prompts": "1000", "input_len": "16", "output_len": "960"}


def _until(check: Any, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_small_run_does_not_wait_behind_large_ones() -> None:
    app = build_app(Explorer(max_run_tokens=WORK_LIMIT))

    async def scenario() -> None:
        finished: list[str] = []
        async with httpx.AsyncClient(timeout=300) as client:

            async def ask(name: str, params: dict[str, str]) -> httpx.Response:
                answer = await client.get(url + "api/run", params=params)
                finished.append(name)
                return answer

            large = [asyncio.create_task(ask(f"large {s}", LARGE | {"seed": s})) for s in ("1", "2")]
            await asyncio.sleep(0.5)  # both have arrived: one simulates, the other waits its turn
            small = await ask("small", {"seed": "7"})
            assert small.status_code == 200, small.text
            assert finished == ["small"], f"the small run waited for a large one: {finished}"
            for task in large:
                task.cancel()
            await asyncio.gather(*large, return_exceptions=True)

    with running(app) as url:
        asyncio.run(scenario())


def test_a_full_line_is_answered_503_and_a_run_whose_client_left_is_not_simulated() -> None:
    app = build_app(Explorer(max_run_tokens=WORK_LIMIT))
    runs = app.state.runs

    async def scenario() -> httpx.Response:
        async with httpx.AsyncClient(timeout=300) as client:
            asked = [
                client.get(url + "api/run", params=LARGE | {"seed": str(10 + k)}) for k in range(LARGE_WAITING + 2)
            ]
            tasks = [asyncio.create_task(a) for a in asked]  # one simulates, LARGE_WAITING wait, one is too many
            done, pending = await asyncio.wait(tasks, timeout=120, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:  # the clients leave: the waiting runs must leave the line unsimulated
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return done.pop().result()

    with running(app) as url:
        refused = asyncio.run(scenario())
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == str(RETRY_AFTER_S)
        assert refused.json()["error"]["field"] is None and "waiting" in refused.json()["error"]["message"]
        _until(lambda: runs.large.running == runs.large.waiting == 0, "the large lane did not empty", 120)
        assert runs.large.started == 1  # the two that waited were never simulated
        assert httpx.get(url + "api/run", timeout=60).status_code == 200  # it serves on


# ---- either server: a bug of ours -----------------------------------------------------------------------------------
class _BrokenEngine:
    vocab_size = 100
    error = None

    def submit(self, prompt_ids: list[int], max_tokens: int) -> None:
        raise ZeroDivisionError("a bug\nover two lines")


class _BrokenExplorer(Explorer):
    def workload(self, settings: Settings, config: RunConfig) -> Workload:
        raise ZeroDivisionError("a bug\nover two lines")


@pytest.mark.parametrize("which", ["serve", "explore"])
def test_a_bug_answers_a_json_500_and_logs_one_line(which: str, caplog: pytest.LogCaptureFixture) -> None:
    if which == "serve":
        app = api.build_app(cast(Any, _BrokenEngine()), "tiny-llama", MAX_MODEL_LEN)
    else:
        app = build_app(_BrokenExplorer())
    with caplog.at_level(logging.WARNING), running(app) as url:
        if which == "serve":
            got = httpx.post(url + "v1/completions", json={"prompt": [1, 2]}, timeout=30)
        else:
            got = httpx.get(url + "api/run", params={"seed": "3"}, timeout=30)
    assert got.status_code == 500 and got.headers["content-type"] == "application/json"
    error = got.json()["error"]
    assert "ZeroDivisionError: a bug over two lines" in error["message"] and "\n" not in error["message"]
    if which == "serve":
        assert error["type"] == "InternalServerError" and error["code"] == 500
    else:
        assert error["field"] is None
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and lines[0].exc_info is None and "\n" not in lines[0].getMessage(), lines
    assert f"ferry {which}" in lines[0].getMessage()


def test_the_default_body_limit_fits_the_longest_request_of_a_built_in_model() -> None:
    longest = json.dumps({"prompt": [128255] * 131_071, "max_tokens": 1})  # llama-3.1-8b's context, 6-digit ids
    assert 8 * len(longest) < DEFAULT_MAX_REQUEST_BODY_BYTES
