"""`ferry probe` and `ferry validate --url` against servers that answer wrongly, slowly or not at all: each stops with
one line naming what the server answered (exit 2), within its deadline, and writes nothing that looks complete.

The servers are local and started here: an ``http.server`` in a thread whose behaviour is the first part of the path
(``http://127.0.0.1:PORT/MODE/v1``), a socket that accepts and never answers, a port where nothing listens. Timing
is asserted only as generous bounds ("returned within 15 s with --timeout 1")."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from experiments.cli import main
from experiments.real import client as C
from experiments.real.probe import probe
from experiments.real.probe_design import ProbePlan

httpx = pytest.importorskip("httpx")

NAME = "fake"
CARD = {"id": NAME, "object": "model", "owned_by": "test", "max_model_len": 4096}
TOKEN_S = 0.002  # the fake server's time per token (s)
QUICK_S = 15.0  # the bound on a command that should stop at once, or after a 1-3 s timeout or budget

# ---- the servers ---------------------------------------------------------------------------------------------------


class Fake(BaseHTTPRequestHandler):
    """``GET /MODE/v1/models`` and ``POST /MODE/v1/completions``, answered as MODE says."""

    stop: threading.Event
    served: collections.defaultdict[str, itertools.count[int]] = collections.defaultdict(itertools.count)  # per mode
    lock = threading.Lock()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass

    def _send(self, status: int, kind: str, body: bytes | str) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _open_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        mode = self.path.split("/")[1]
        if mode == "html":
            self._send(200, "text/html", "<!doctype html><html><body><h1>Welcome to nginx!</h1></body></html>")
        elif mode == "list":
            self._send(200, "application/json", json.dumps([CARD]))
        elif mode == "e500":
            self._send(500, "text/html", "<html><body>Internal Server Error</body></html>")
        elif mode == "stall":
            self.stop.wait(60)
        else:
            card = CARD | {"id": "other"} if mode == "wrong" else CARD
            card = card | {"max_num_batched_tokens": 128} if mode == "budget" else card
            self._send(200, "application/json", json.dumps({"object": "list", "data": [card]}))

    def do_POST(self) -> None:  # noqa: N802
        mode = self.path.split("/")[1]
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with self.lock:
            n = next(self.served[mode])
        failing = {"e500": True, "fail500": True, "flaky3": n % 4 != 0, "flaky1": n % 4 == 0, "dies": n >= 3,
                   "drops2": n in (10, 20), "drops4": n >= 3 and n % 4 == 3}  # fmt: skip
        if failing.get(mode, False):
            self._send(500, "application/json", json.dumps({"error": {"message": "the engine is dead"}}))
        elif mode == "nosse":
            choice = {"index": 0, "text": " x" * body["max_tokens"], "finish_reason": "length"}
            self._send(200, "application/json", json.dumps({"object": "text_completion", "choices": [choice]}))
        elif mode in ("garbled", "notchunk"):
            self._open_stream()
            self.wfile.write(b"data: {oops\n\n" if mode == "garbled" else b'data: {"hello": 1}\n\n')
        elif mode == "endless":  # tokens forever, never [DONE]
            self._open_stream()
            choice = {"index": 0, "text": " x", "finish_reason": None}
            line = f"data: {json.dumps({'object': 'text_completion', 'choices': [choice]})}\n\n".encode()
            try:
                while not self.stop.wait(TOKEN_S):
                    self.wfile.write(line)
            except OSError:  # the client went away
                pass
        elif mode == "keepalive":
            self._open_stream()
            try:
                while not self.stop.wait(0.1):
                    self.wfile.write(b": keep-alive\n\n")
            except OSError:  # the client went away
                pass
        else:
            self._stream(body)

    def _stream(self, body: dict[str, object]) -> None:
        self._open_stream()
        prompt = body["prompt"]
        tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        made = int(body["max_tokens"])  # type: ignore[call-overload]
        for k in range(made):
            time.sleep(TOKEN_S)
            choice = {"index": 0, "text": " x", "finish_reason": "length" if k == made - 1 else None}
            self.wfile.write(f"data: {json.dumps({'object': 'text_completion', 'choices': [choice]})}\n\n".encode())
        counted = made + 3 if self.path.startswith("/miscount/") else made
        usage = {"prompt_tokens": -7 if self.path.startswith("/absurd/") else tokens, "completion_tokens": counted,
                 "total_tokens": tokens + counted}  # fmt: skip
        self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())


@pytest.fixture(scope="module")
def fake() -> Iterator[str]:
    """The base of the fake server's URLs: ``f"{fake}/MODE/v1"``."""
    stop = threading.Event()
    handler = type("Handler", (Fake,), {"stop": stop})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def silent() -> Iterator[str]:
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        sock.close()


@pytest.fixture
def nothing() -> str:
    """A port where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def url_of(case: str, fake: str, silent: str, nothing: str) -> str:
    return {"silent": silent, "nothing": nothing, "noscheme": nothing.removeprefix("http://")}.get(
        case, f"{fake}/{case}/v1"
    )


def one_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[str, float]:
    """Run ``ferry ARGS``; expect status 2 and one error line. Returns it and the seconds it took."""
    start = time.perf_counter()
    assert main(args) == 2
    took = time.perf_counter() - start
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert re.match(r"ferry (probe|validate): error: ", err), err
    return err, took


# ---- ferry validate --url ------------------------------------------------------------------------------------------

VALIDATE = ["--model", "tiny-llama", "--hardware", "h100-sxm", "--served-model-name", NAME, "--num-prompts", "4",
            "--request-rate", "inf", "--input-len", "16", "--output-len", "4", "--seed", "1"]  # fmt: skip

# /models first: what the server answered, named, before any request of the workload is sent
REFUSED_BY_VALIDATE = {
    "nothing": "cannot reach http://127.0.0.1:",  # and the connection's error
    "noscheme": "not an http:// or https:// URL with a host",
    "html": "answered HTTP 200 (text/html), not JSON: '<!doctype html><html><body><h1>Welcome to nginx!",
    "list": "answered HTTP 200 (application/json), not an OpenAI model list",
    "e500": "answered HTTP 500 (text/html): '<html><body>Internal Server Error",
    "wrong": "--served-model-name 'fake': http://127.0.0.1:",
    "silent": "no answer within 1 s",
}


@pytest.mark.parametrize("case", sorted(REFUSED_BY_VALIDATE))
def test_validate_url_checks_the_server_before_the_workload(
    case: str, fake: str, silent: str, nothing: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    url = url_of(case, fake, silent, nothing)
    err, took = one_error(capsys, ["validate", "--url", url, *VALIDATE, "--timeout", "1", "--out", str(out)])
    assert REFUSED_BY_VALIDATE[case] in err, err
    assert took < QUICK_S
    assert not out.exists() or not any(out.iterdir())  # nothing written


# every request failed, or most did: one line with how many and the first reason, and no comparison
FAILED_REQUESTS = {
    "fail500": ("4 of 4", "HTTP 500 (application/json): 'the engine is dead'"),
    "nosse": ("4 of 4", 'HTTP 200 (application/json), not an SSE stream: \'{"object": "text_completion"'),
    "garbled": ("4 of 4", "not JSON in the stream: '{oops'"),
    "notchunk": ("4 of 4", "not a completion chunk in the stream (no 'choices'): '{\"hello\": 1}'"),
    "keepalive": ("4 of 4", "TimeoutError: no token for 1 s (none yet, "),
    "flaky3": ("3 of 4", "HTTP 500"),
    "endless": ("4 of 4", "the stream went past max_tokens="),
    "absurd": ("4 of 4", "the server's usage is not a count of tokens: prompt_tokens=-7"),
}


@pytest.mark.parametrize("case", sorted(FAILED_REQUESTS))
def test_validate_url_stops_when_most_requests_failed(
    case: str, fake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["validate", "--url", f"{fake}/{case}/v1", *VALIDATE, "--timeout", "1", "--out", str(out)]
    err, took = one_error(capsys, args)
    count, why = FAILED_REQUESTS[case]
    assert f"{count} requests to {fake}/{case}/v1 failed (request " in err and why in err, err
    assert case != "keepalive" or " keep-alive lines))" in err, err  # comments are not an answer
    assert err.endswith("; nothing written")
    assert took < QUICK_S
    assert not (out / "comparison.json").exists() and not (out / "real").exists()


def test_validate_url_keeps_a_few_failures_in_its_comparison(fake: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["validate", "--url", f"{fake}/flaky1/v1", *VALIDATE, "--json", "--out", str(out)]) == 0
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["failed"]["n"] == 1 and "HTTP 500" in comparison["failed"]["first"]
    real = json.loads((out / "real" / "summary.json").read_text())
    assert real["completed"] == 3 and real["failed"] == 1
    assert main(["validate", "--url", f"{fake}/ok/v1", *VALIDATE, "--json", "--out", str(out)]) == 0
    assert "failed" not in json.loads((out / "comparison.json").read_text())


def test_validate_timeout_needs_a_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err, _ = one_error(capsys, ["validate", *VALIDATE[:4], "--timeout", "5", "--out", str(tmp_path / "o")])
    assert "--timeout 5: it bounds a live server's requests; give --url" in err
    err, _ = one_error(capsys, ["validate", "--url", "http://127.0.0.1:9/v1", *VALIDATE, "--timeout", "0"])
    assert "--timeout must be a number of seconds > 0, got 0" in err


# ---- ferry probe ---------------------------------------------------------------------------------------------------

PROBE = ["--model", NAME, "--model-config", "tiny-llama", "--max-prompt", "128", "--decode-tokens", "16",
         "--batch-sizes", "2", "--max-concurrency", "4"]  # fmt: skip

REFUSED_BY_PROBE = {
    **{k: v for k, v in REFUSED_BY_VALIDATE.items() if k != "wrong"},
    "wrong": "--model 'fake': http://127.0.0.1:",
    "fail500": "the first probe request failed: HTTP 500 (application/json): 'the engine is dead'",
    "nosse": "the first probe request failed: HTTP 200 (application/json), not an SSE stream",
    "garbled": "the first probe request failed: not JSON in the stream: '{oops'",
    "notchunk": "the first probe request failed: not a completion chunk in the stream",
    "keepalive": "the first probe request failed: TimeoutError: no token for 1 s (none yet,",
    "stall": "/models: no answer within 1 s",
    "endless": "the first probe request failed: the stream went past max_tokens=",
    "absurd": "the first probe request failed: the server's usage is not a count of tokens: prompt_tokens=-7",
}


@pytest.mark.parametrize("case", sorted(REFUSED_BY_PROBE))
def test_probe_refuses_a_server_it_cannot_probe_before_any_experiment(
    case: str, fake: str, silent: str, nothing: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.yaml"
    url = url_of(case, fake, silent, nothing)
    err, took = one_error(capsys, ["probe", "--url", url, *PROBE, "--timeout", "1", "--out", str(out)])
    assert REFUSED_BY_PROBE[case] in err, err
    assert took < QUICK_S
    assert not list(tmp_path.iterdir())  # no profile, no report


@pytest.mark.parametrize("case", ["keepalive", "stall", "silent"])
def test_probe_ends_by_its_budget_whatever_the_server_sends(
    case: str, fake: str, silent: str, nothing: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Keep-alive comments, a /models that never answers, a socket that never answers: --budget-s 2 is the wall-clock
    deadline (the default --timeout, 60 s, would wait longer)."""
    url = url_of(case, fake, silent, nothing)
    err, took = one_error(capsys, ["probe", "--url", url, *PROBE, "--budget-s", "2", "--out", str(tmp_path / "p.yaml")])
    at = "the first request" if case == "keepalive" else "GET "
    assert f"--budget-s 2 spent before the probe's first checks ended (at {at}" in err, err
    assert took < QUICK_S


def test_probe_stops_when_a_server_stops_answering(
    fake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server answers the first checks, then fails every request: the probe stops at the first experiment whose
    requests all failed, and, with nothing to fit, says so (it used to send every experiment)."""
    args = ["probe", "--url", f"{fake}/dies/v1", *PROBE, "--out", str(tmp_path / "p.yaml")]
    err, took = one_error(capsys, args)
    assert "gave no usable timing (every request of ttft: prompt 16 failed (HTTP 500 (application/json)" in err, err
    assert next(Fake.served["dies"]) == 3 + 3  # the first checks' three, one experiment's three repeats
    assert took < QUICK_S and not list(tmp_path.iterdir())


def test_probe_caps_its_prompts_to_the_servers_token_budget(fake: str) -> None:
    plan = ProbePlan(max_prompt=384, decode_tokens=16, repeats=1, batch_sizes=(2,), max_concurrency=4,
                     max_requests=12, budget_s=60)  # fmt: skip
    said: list[str] = []
    run = probe(f"{fake}/budget/v1", NAME, plan, log=said.append)  # the server's /models card states 128
    assert run.max_num_batched_tokens == 128 and not run.notes
    ttft = [e.prompt for e in run.experiments if e.kind == "ttft"]
    assert max(ttft) == 128 and all(s.ok for e in run.experiments for s in e.streams)
    run = probe(f"{fake}/ok/v1", NAME, plan, log=said.append)  # it states none: a warning, prompts up to 384
    assert run.max_num_batched_tokens is None and max(e.prompt for e in run.experiments if e.kind == "ttft") == 384
    (note,) = run.notes
    assert note.startswith("warning: the server's per-iteration token budget is unknown") and note in said
    assert "prompts go up to 384 tokens" in note
    run = probe(f"{fake}/budget/v1", NAME, dataclasses.replace(plan, max_num_batched_tokens=64))
    assert max(e.prompt for e in run.experiments if e.kind == "ttft") == 64  # the flag is the user's word
    assert run.notes == ["note: --max-num-batched-tokens 64 kept, where the server says 128"]


# ---- the client's reasons --------------------------------------------------------------------------------------


def test_a_failure_always_says_why() -> None:
    """httpx's timeouts often carry no message: the reason is at least the type, and the wait it ran out."""
    assert C.reason(httpx.ReadTimeout(""), 30) == "ReadTimeout after 30 s"
    assert C.reason(httpx.ConnectError("")) == "ConnectError"
    assert C.reason(OSError("no\nroute")) == "OSError: no route"
    assert C.excerpt("") == "an empty body" and C.excerpt("a\n  b" + "c" * 200, 5) == "'a bcc...'"


def test_a_stream_that_stalls_fails_within_its_timeout(silent: str) -> None:
    async def go() -> C.Stream:
        async with C.new_client(1, 1.0) as client:
            return await C.complete(client, silent, NAME, [1, 2, 3], 4, time.perf_counter(), timeout_s=1.0)

    start = time.perf_counter()
    stream = asyncio.run(go())
    assert time.perf_counter() - start < QUICK_S
    assert not stream.ok and stream.error is not None
    assert re.fullmatch(r"(ReadTimeout after 1 s|TimeoutError: no response within 1 s)", stream.error), stream.error


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("endless", "the stream went past max_tokens=4 (6 chunks) without ending"),
        ("absurd", "the server's usage is not a count of tokens: prompt_tokens=-7"),
    ],
)
def test_a_stream_past_its_tokens_or_with_absurd_usage_fails_saying_so(fake: str, mode: str, why: str) -> None:
    """A server that streams tokens forever and never sends [DONE] is cut off past max_tokens (its per-token timeout
    would never fire); a usage of -7 prompt tokens fails its request instead of entering the outputs."""

    async def go() -> C.Stream:
        async with C.new_client(1, 5.0) as client:
            return await C.complete(client, f"{fake}/{mode}/v1", NAME, [1, 2, 3], 4, time.perf_counter(), timeout_s=5)

    start = time.perf_counter()
    stream = asyncio.run(go())
    assert time.perf_counter() - start < QUICK_S
    assert not stream.ok and stream.error is not None and stream.error.startswith(why), stream.error


def test_validate_url_against_an_endless_stream_ends_within_its_limits(
    fake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    """`ferry validate --url ... --timeout 5` against a server that never ends a stream: every request is ended past
    its max_tokens and counted failed, so it stops with one line naming why, writing nothing (it ran for ever)."""
    args = ["validate", "--url", f"{fake}/endless/v1", "--served-model-name", NAME, "--model", "tiny-llama",
            "--hardware", "h100-sxm", "--timeout", "5", "--num-prompts", "4", "--request-rate", "20", "--input-len",
            "16", "--output-len", "8", "--out", str(tmp_path / "v")]  # fmt: skip
    line, seconds = one_error(capsys, args)
    assert seconds < QUICK_S
    assert "4 of 4 requests" in line and "the stream went past max_tokens=8" in line, line
    assert not (tmp_path / "v" / "comparison.json").exists()


@pytest.mark.parametrize(
    ("flags", "said"),
    [(["--url", "http://127.0.0.1:9/v1", "--device", "cuda"], "--device cuda: it sets ferry's own executor"),
     (["--url", "http://127.0.0.1:9/v1", "--threads", "4"], "--threads 4: it sets ferry's own executor"),
     (["--max-concurrency", "4"], "--max-concurrency 4: it is for a live server's requests; give --url"),
     (["--served-model-name", "x"], "--served-model-name x: it is for a live server's requests; give --url")],
)  # fmt: skip
def test_validate_refuses_the_flags_of_the_side_it_does_not_run(
    flags: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    """`validate --url --device cuda` ignored --device (the server runs where it was started): refused, as a live
    server's flags are without --url, before anything is sent or built."""
    line, seconds = one_error(capsys, ["validate", "--model", "tiny-llama", *flags, "--out", str(tmp_path / "v")])
    assert said in line and seconds < QUICK_S, line


def test_probe_leaves_out_the_experiments_that_lost_requests_and_says_so(fake: str, tmp_path: Path) -> None:
    """Two requests of the probe fail (HTTP 500): their experiments time a batch they were not designed to be, so
    they are left out of the fit and of the held-out error, and the report's first note names them (the probe fitted
    through them, and printed its held-out table as if nothing had happened)."""
    out = tmp_path / "p.yaml"
    assert main(["probe", "--url", f"{fake}/drops2/v1", *PROBE, "--out", str(out)]) == 0
    report = json.loads(out.with_name("p.probe.json").read_text())
    (note,) = [n for n in report["notes"] if "lost requests" in n]
    assert re.match(r"warning: 2 of the \d+ experiments lost requests and are left out of the fit", note), note
    assert note.count("1 of ") == 2 and "HTTP 500" in note
    lost = report["lost"]
    assert len(lost) == 2 and all(x["failed"] == 1 and x["first"].startswith("HTTP 500") for x in lost), lost
    rows = pd.read_csv(out.with_name("p.probe.csv"))
    assert len(rows) and not set(rows["experiment"]) & {x["experiment"] for x in lost}


def test_probe_refuses_to_fit_a_server_that_keeps_failing(
    fake: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    """One request in four fails after the first checks: most experiments lose requests, so no profile is written,
    and the one line says how many and why."""
    err, took = one_error(capsys, ["probe", "--url", f"{fake}/drops4/v1", *PROBE, "--out", str(tmp_path / "p.yaml")])
    assert re.search(r"\d+ of the \d+ experiments sent to .* lost requests \(.*HTTP 500", err), err
    assert "no profile is fitted" in err and took < QUICK_S and not list(tmp_path.iterdir())


def test_validate_url_flags_a_usage_that_disagrees_with_the_chunks(fake: str, tmp_path: Path) -> None:
    """The server's usage counts 3 completion tokens more than the chunks it sent: the comparison counts those
    responses (``coalesced``) and its note says their gaps are not the server's steps (it was not flagged)."""
    out = tmp_path / "out"
    assert main(["validate", "--url", f"{fake}/miscount/v1", *VALIDATE, "--json", "--out", str(out)]) == 0
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["coalesced"]["n"] == comparison["coalesced"]["of"] > 0
    assert "usage counts completion tokens other than the chunks received" in comparison["note"]
