"""A streaming client of an OpenAI-compatible completions server (vLLM, SGLang, TensorRT-LLM, llama.cpp, ``ferry
serve``): what ``ferry probe`` and ``ferry validate --url`` send, and what they measure from the client's side.

Requests follow ``vllm bench serve``'s OpenAI completions backend (``vllm/benchmarks/lib/endpoint_request_func.py``,
vLLM main, late 2026): ``POST {base}/completions`` with ``stream: true``, ``stream_options.include_usage``,
``ignore_eos: true`` (so a response has exactly ``max_tokens`` tokens) and greedy sampling; the time of each streamed
chunk is taken when it arrives (``time.perf_counter``, seconds from the caller's origin). Prompts are token ids where
the server takes them (vLLM does; ``prompt`` as a list of ints), so their length is exact; the server's
``usage.prompt_tokens`` is checked against it. Every chunk is assumed to carry one token; a response whose chunks
do not add up to ``usage.completion_tokens`` is flagged (``coalesced``) and its gaps are not trusted. A chunk that
only closes the stream is no token: choices without text, each with a finish reason, beside a ``usage`` that counts
exactly the tokens already streamed (llama-server's last chunk; vLLM ends with the last token's chunk, then a usage
chunk without choices).

A server that answers something else fails its request with one line naming what it answered (status, content
type, a short excerpt): an HTTP error, a body that is not an SSE stream (``text/event-stream``), a ``data:`` line
that is not a completion chunk. Every wait is bounded: a request fails when its response, or its next token, has
not come within ``timeout_s`` (a stream of keep-alive comments without a token is silence), and a stream that goes
past ``max_tokens`` (one chunk more is a last one that only ends it) is ended there and fails; a ``usage`` whose
counts are not whole numbers >= 0 fails its request, naming the count.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# ``ferry validate --url``'s default wait for a response or a token (s). An open-loop trace may overload the server
# (the default request rate sends every request at once), and vLLM then holds a request silent while it waits for a
# seat: minutes are legitimate there, an hour (what vllm bench serve allows, 6 h in all) is not worth waiting for.
REQUEST_TIMEOUT_S = 300.0
# the longest wait for ``GET /models`` (s): a server that is up answers it from its API process, without its engine
MODELS_TIMEOUT_S = 30.0
EXCERPT = 120  # characters of an odd answer quoted in an error

# words for text prompts, where a server takes no token ids (one word is one token in most tokenizers)
WORDS = (
    "the of and to in is was for that with as on by at from his her are were which this be have had not but they "
    "one all we their there been has when who will more no if out so said what up its about into than them can only "
    "other new some could time these two may then do first any my now such like our over man me even most made after"
).split()


@dataclass
class Stream:
    """One completion as its client saw it (seconds on the client's clock, from the caller's origin)."""

    sent_s: float  # when the request was sent
    prompt_sent: int  # prompt tokens sent (token ids), or words (text)
    max_tokens: int
    chunk_s: list[float] = field(default_factory=list)  # arrival of each chunk with a token
    prompt_tokens: int | None = None  # the server's usage.prompt_tokens
    completion_tokens: int | None = None  # the server's usage.completion_tokens
    error: str | None = None  # why it failed (the server's answer, the connection, a timeout); set when not ok
    done_s: float = float("nan")  # when the response ended ([DONE] or the connection closed)

    @property
    def ok(self) -> bool:
        return self.error is None and len(self.chunk_s) > 0

    @property
    def ttft_s(self) -> float:
        return self.chunk_s[0] - self.sent_s if self.chunk_s else float("nan")

    @property
    def gaps_s(self) -> np.ndarray:
        """Gaps between consecutive chunks (s): gap k is the k-th decode step's, context prompt + k - 1 tokens."""
        return np.diff(np.asarray(self.chunk_s, dtype=float))

    @property
    def coalesced(self) -> bool:
        """Whether the server packed several tokens into some chunk (chunks and usage disagree)."""
        return self.completion_tokens is not None and self.completion_tokens != len(self.chunk_s)

    @property
    def tokens(self) -> int:
        """Prompt tokens as the server counted them (as sent when it reports no usage)."""
        return self.prompt_tokens if self.prompt_tokens is not None else self.prompt_sent


# no server streams a request's tokens faster than this (s per token): a stream whose median gap is below it got its
# tokens held back by the server (or a starved client) and then all at once, which times no step
MIN_STEP_S = 1e-4


def held_back(s: Stream) -> bool:
    """Whether ``s`` came in one burst: three tokens or more whose median gap is below ``MIN_STEP_S``. Seen with
    vLLM 0.32.0 for CPUs on a 2-core machine whose engine busy-waits on the client's cores: the server wrote every
    token on time, but the client was not scheduled for up to 1.5 s (``experiments/vllm_check/serve_vllm.py``)."""
    return s.ok and len(s.chunk_s) > 2 and float(np.median(s.gaps_s)) < MIN_STEP_S


def check_url(url: str) -> str:
    """``url`` without its trailing slash; ValueError unless it is ``http(s)://HOST[:PORT]/...``."""
    try:
        parts = urllib.parse.urlsplit(str(url))
        parts.port  # noqa: B018 (parsing it is the check)
    except ValueError as exc:
        raise ValueError(f"--url {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url {url!r}: not an http:// or https:// URL with a host (e.g. http://127.0.0.1:8000/v1)")
    return str(url).rstrip("/")


def check_timeout(timeout_s: float) -> float:
    if not 0 < timeout_s < float("inf"):
        raise ValueError(f"--timeout must be a number of seconds > 0, got {timeout_s:g}")
    return float(timeout_s)


def excerpt(text: str | bytes, n: int = EXCERPT) -> str:
    """The start of an odd answer on one line, quoted (``n`` characters at most)."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    flat = " ".join(text.split())
    return repr(flat[:n] + ("..." if len(flat) > n else "")) if flat else "an empty body"


def reason(exc: BaseException, timeout_s: float | None = None) -> str:
    """``exc`` as a one-line reason that is never empty: its type, what it says, the timeout it ran into."""
    import httpx

    name = type(exc).__name__
    text = " ".join(str(exc).split())
    if timeout_s is not None and isinstance(exc, (httpx.TimeoutException, TimeoutError)):
        name = f"{name} after {timeout_s:g} s"
    return f"{name}: {text}" if text else name


def request_body(model: str, prompt: list[int] | str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": int(max_tokens),
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _answered(status: int, content_type: str) -> str:
    return f"HTTP {status} ({content_type or 'no content type'})"


def _error_text(payload: str, status: int, content_type: str = "") -> str:
    """An error answer on one line: ``HTTP STATUS (TYPE): the server's message``, or an excerpt of its body."""
    try:
        data = json.loads(payload)
    except ValueError:
        return f"{_answered(status, content_type)}: {excerpt(payload)}"
    err = data.get("error", data) if isinstance(data, dict) else data
    message = err.get("message", err) if isinstance(err, dict) else err
    return f"{_answered(status, content_type)}: {excerpt(str(message))}"


async def _head(response: Any, limit: int = 2048) -> bytes:
    """The first ``limit`` bytes of a body (an odd answer may never end)."""
    got = b""
    async for part in response.aiter_bytes():
        got += part
        if len(got) >= limit:
            break
    return got


def _closing(choices: list[dict[str, Any]], usage: Any, streamed: int) -> bool:
    """Whether a chunk only closes a stream of ``streamed`` tokens: its choices carry no text, only a finish reason,
    and its ``usage`` counts those tokens. llama-server streams one chunk per token, then one such chunk, finish
    reason and usage together (``tools/server/server-task.cpp``, ``server_task_result_cmpl_final::to_json_oaicompat``;
    in a stream its content is empty: ``server-context.cpp``, ``send_final_response``)."""
    return (
        streamed > 0
        and isinstance(usage, dict)
        and usage.get("completion_tokens") == streamed
        and all(c.get("text") == "" and c.get("finish_reason") is not None for c in choices)
    )


def _take(out: Stream, data: str, now: float) -> str | None:
    """Read one ``data:`` payload of a completion stream into ``out``; why not, if it is not a completion chunk."""
    try:
        chunk = json.loads(data)
    except ValueError:
        return f"not JSON in the stream: {excerpt(data)}"
    if isinstance(chunk, dict) and ("error" in chunk or chunk.get("object") == "error"):
        err = chunk.get("error", chunk)
        message = err.get("message", err) if isinstance(err, dict) else err
        return f"the server's error in the stream: {excerpt(str(message))}"
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    if not isinstance(choices, list) and not isinstance(usage, dict):
        return f"not a completion chunk in the stream (no 'choices'): {excerpt(data)}"
    if isinstance(choices, list) and not all(isinstance(c, dict) for c in choices):
        return f"not a completion chunk in the stream ('choices' are not objects): {excerpt(data)}"
    if choices and not _closing(choices, usage, len(out.chunk_s)):
        out.chunk_s.append(now)
    if isinstance(usage, dict):
        for key in ("prompt_tokens", "completion_tokens"):
            count = usage.get(key)
            if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
                return f"the server's usage is not a count of tokens: {key}={json.dumps(count)[:40]}"
        out.prompt_tokens, out.completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return None


async def complete(
    client: Any,
    base_url: str,
    model: str,
    prompt: list[int] | str,
    max_tokens: int,
    origin: float,
    into: Stream | None = None,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> Stream:
    """Send one streamed completion and record when each chunk arrives (``client``: an ``httpx.AsyncClient``;
    ``origin``: the ``perf_counter`` reading that is time 0; ``into``: a Stream to fill, which the caller can watch
    while the response streams; ``timeout_s``: seconds it waits for the response and then for each token). Never
    raises for the server's errors, odd answers or timeouts: they are kept, one line, in ``Stream.error``."""
    import httpx

    size = len(prompt) if isinstance(prompt, list) else len(prompt.split())
    out = into if into is not None else Stream(0.0, size, max_tokens)
    out.sent_s, out.prompt_sent, out.max_tokens = time.perf_counter() - origin, size, max_tokens
    loop = asyncio.get_running_loop()
    answered, idle, done = False, 0, False  # a response came; lines since the last token; [DONE] came
    try:
        async with asyncio.timeout(timeout_s) as patience:
            body = request_body(model, prompt, max_tokens)
            async with client.stream("POST", f"{base_url}/completions", json=body) as r:
                answered = True
                patience.reschedule(loop.time() + timeout_s)
                kind = r.headers.get("content-type", "")
                if r.status_code != 200:
                    out.error = _error_text((await _head(r)).decode(errors="replace"), r.status_code, kind)
                elif "text/event-stream" not in kind:
                    out.error = f"{_answered(r.status_code, kind)}, not an SSE stream: {excerpt(await _head(r))}"
                else:
                    async for line in r.aiter_lines():
                        now = time.perf_counter() - origin
                        if not line.startswith("data:"):
                            idle += bool(line.strip())  # a comment (keep-alive), or an event's other fields
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            done = True
                            break
                        made = len(out.chunk_s)
                        out.error = _take(out, data, now)
                        if out.error:
                            break
                        if len(out.chunk_s) > max_tokens + 1:  # one more: a last chunk that only ends it
                            out.error = (
                                f"the stream went past max_tokens={max_tokens} ({len(out.chunk_s)} chunks) without "
                                "ending; ended here"
                            )
                            break
                        if len(out.chunk_s) > made:
                            idle = 0
                            patience.reschedule(loop.time() + timeout_s)
    except TimeoutError:
        waited = f"{len(out.chunk_s)} tokens in" if out.chunk_s else "none yet"
        comments = f", {idle} keep-alive lines" if idle else ""
        if not answered:
            out.error = f"TimeoutError: no response within {timeout_s:g} s"
        else:
            out.error = f"TimeoutError: no token for {timeout_s:g} s ({waited}{comments})"
    except (httpx.HTTPError, httpx.StreamError, httpx.InvalidURL, OSError) as exc:
        out.error = reason(exc, timeout_s)
    if out.error is None and not out.chunk_s:
        out.error = "the stream ended without a token" + (" ([DONE] came first)" if done else "")
    out.done_s = time.perf_counter() - origin
    return out


async def models(client: Any, base_url: str, timeout_s: float = MODELS_TIMEOUT_S) -> list[dict[str, Any]]:
    """The server's ``GET /models`` list (each with ``id``; vLLM adds ``max_model_len``), within ``timeout_s``
    seconds. ValueError, one line naming what it answered, when nothing answers or it is not an OpenAI model list."""
    import httpx

    where = f"{base_url}/models"
    hint = "is this an OpenAI-compatible server's /v1 URL?"
    try:
        async with asyncio.timeout(timeout_s):
            r = await client.get(where, timeout=timeout_s)
    except (TimeoutError, httpx.TimeoutException) as exc:
        why = f"no answer within {timeout_s:g} s ({type(exc).__name__})"
        raise ValueError(f"{where}: {why}; is the server up, and is this its /v1 URL?") from None
    except (httpx.HTTPError, httpx.StreamError, httpx.InvalidURL, OSError) as exc:
        raise ValueError(f"cannot reach {where} ({reason(exc)}); is the server up?") from None
    kind = r.headers.get("content-type", "")
    if r.status_code != 200:
        raise ValueError(f"{where} answered {_error_text(r.text, r.status_code, kind)}; {hint}")
    try:
        data = r.json()
    except ValueError:
        raise ValueError(
            f"{where} answered {_answered(r.status_code, kind)}, not JSON: {excerpt(r.text)}; {hint}"
        ) from None
    cards = data.get("data") if isinstance(data, dict) else None
    if not isinstance(cards, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in cards):
        raise ValueError(
            f"{where} answered {_answered(r.status_code, kind)}, not an OpenAI model list "
            f'({{"data": [{{"id": ...}}]}}): {excerpt(r.text)}; {hint}'
        )
    return cards


def served(cards: list[dict[str, Any]], model: str, base_url: str, flag: str) -> dict[str, Any]:
    """The card of ``model`` among the server's; ValueError naming what it serves when absent (``flag``: the option
    that gave the name)."""
    for card in cards:
        if card["id"] == model:
            return card
    names = ", ".join(repr(c["id"]) for c in cards) or "no model"
    raise ValueError(f"{flag} {model!r}: {base_url} serves {names}")


def card_int(card: dict[str, Any], key: str) -> int | None:
    """A positive integer the card states (``max_model_len``, ``max_num_batched_tokens``), else None."""
    value = card.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_server(base_url: str, model: str, flag: str, timeout_s: float = MODELS_TIMEOUT_S) -> dict[str, Any]:
    """Ask ``base_url``'s ``/models`` (within ``timeout_s`` seconds) and return ``model``'s card (see ``served``)."""

    async def ask() -> dict[str, Any]:
        async with new_client(1, timeout_s) as client:
            return served(await models(client, base_url, timeout_s), model, base_url, flag)

    return asyncio.run(ask())


def new_client(concurrency: int, timeout_s: float) -> Any:
    """An ``httpx.AsyncClient`` for ``concurrency`` streams at once, each wait (connect, write, read, a connection
    from the pool) at most ``timeout_s`` seconds (no proxy from the environment: a local server is reached
    directly)."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s), trust_env=False)


def fresh_seed() -> int:
    """A seed from the operating system's entropy (63 bits): prompts a server has not seen (and cached) before."""
    return int(np.random.default_rng().integers(1 << 63))


class Prompts:
    """Unique prompts of exact lengths: random token ids in ``[low, high)`` (a fresh draw per prompt, so no two
    share a prefix a server could cache), or, where the server takes no ids, random common words."""

    def __init__(self, rng: np.random.Generator, low: int = 100, high: int = 8000, text: bool = False) -> None:
        if not 0 <= low < high:
            raise ValueError(f"token id range [{low}, {high}) is empty")
        self.rng, self.low, self.high, self.text = rng, low, high, text

    def make(self, tokens: int) -> list[int] | str:
        if self.text:
            return " ".join(self.rng.choice(WORDS, size=max(tokens, 1)).tolist())
        return self.rng.integers(self.low, self.high, size=max(tokens, 1)).tolist()


async def gather_limited(jobs: list[Any], limit: int) -> list[Any]:
    """Await coroutines with at most ``limit`` running at once; results in order."""
    gate = asyncio.Semaphore(max(limit, 1))

    async def run(job: Any) -> Any:
        async with gate:
            return await job

    return list(await asyncio.gather(*(run(j) for j in jobs)))


async def _replay(
    base_url: str, model: str, arrivals: np.ndarray, prompts: list[list[int] | str], outputs: np.ndarray,
    concurrency: int, timeout_s: float,
) -> list[Stream]:  # fmt: skip
    origin = time.perf_counter()
    gate = asyncio.Semaphore(max(concurrency, 1))
    async with new_client(min(concurrency, len(prompts)), timeout_s) as client:

        async def one(i: int) -> Stream:
            await asyncio.sleep(max(0.0, float(arrivals[i]) - (time.perf_counter() - origin)))
            async with gate:
                return await complete(client, base_url, model, prompts[i], int(outputs[i]), origin, timeout_s=timeout_s)

        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))


def replay_trace(
    base_url: str,
    model: str,
    arrivals: np.ndarray,
    prompts: list[list[int] | str],
    outputs: np.ndarray,
    concurrency: int = 1 << 16,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> list[Stream]:
    """Send request i at ``arrivals[i]`` seconds from now (open loop, as ``vllm bench serve`` with a request rate:
    a request is sent at its time whatever the server's state, at most ``concurrency`` open at once), streamed;
    returns each request's stream, in order. A request whose response or next token takes over ``timeout_s``
    seconds fails (``Stream.error``)."""
    return asyncio.run(_replay(base_url.rstrip("/"), model, arrivals, prompts, outputs, concurrency, timeout_s))
