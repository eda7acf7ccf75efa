"""A streaming client of an OpenAI-compatible completions server (vLLM, SGLang, TensorRT-LLM, llama.cpp, ``ferry
serve``): what ``ferry probe`` and ``ferry validate --url`` send, and what they measure from the client's side.

Requests follow ``vllm bench serve``'s OpenAI completions backend (``vllm/benchmarks/lib/endpoint_request_func.py``,
vLLM main, late 2026): ``POST {base}/completions`` with ``stream: true``, ``stream_options.include_usage``,
``ignore_eos: true`` (so a response has exactly ``max_tokens`` tokens) and greedy sampling; the time of each streamed
chunk is taken when it arrives (``time.perf_counter``, seconds from the caller's origin). Prompts are token ids where
the server takes them (vLLM does; ``prompt`` as a list of ints), so their length is exact; the server's
``usage.prompt_tokens`` is checked against it. Every chunk is assumed to carry one token; a response whose chunks
do not add up to ``usage.completion_tokens`` is flagged (``coalesced``) and its gaps are not trusted.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    error: str | None = None  # the server's or the connection's error, if any
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


def _error_text(payload: str, status: int) -> str:
    try:
        data = json.loads(payload)
    except json.JSONDecodeError:
        return f"HTTP {status}: {payload[:200]}"
    err = data.get("error", data) if isinstance(data, dict) else data
    message = err.get("message", err) if isinstance(err, dict) else err
    return f"HTTP {status}: {message}"


async def complete(
    client: Any,
    base_url: str,
    model: str,
    prompt: list[int] | str,
    max_tokens: int,
    origin: float,
    into: Stream | None = None,
) -> Stream:
    """Send one streamed completion and record when each chunk arrives (``client``: an ``httpx.AsyncClient``;
    ``origin``: the ``perf_counter`` reading that is time 0; ``into``: a Stream to fill, which the caller can watch
    while the response streams). Never raises for the server's errors: they are kept in ``Stream.error``."""
    import httpx

    size = len(prompt) if isinstance(prompt, list) else len(prompt.split())
    out = into if into is not None else Stream(0.0, size, max_tokens)
    out.sent_s, out.prompt_sent, out.max_tokens = time.perf_counter() - origin, size, max_tokens
    try:
        async with client.stream("POST", f"{base_url}/completions", json=request_body(model, prompt, max_tokens)) as r:
            if r.status_code != 200:
                out.error = _error_text((await r.aread()).decode(errors="replace"), r.status_code)
                return out
            async for line in r.aiter_lines():
                now = time.perf_counter() - origin
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    out.error = f"not JSON in the stream: {data[:120]!r}"
                    break
                if "error" in chunk:
                    err = chunk["error"]
                    out.error = str(err.get("message", err) if isinstance(err, dict) else err)
                    break
                if chunk.get("choices"):
                    out.chunk_s.append(now)
                usage = chunk.get("usage")
                if usage:
                    out.prompt_tokens = usage.get("prompt_tokens")
                    out.completion_tokens = usage.get("completion_tokens")
    except (httpx.HTTPError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.done_s = time.perf_counter() - origin
    return out


async def models(client: Any, base_url: str) -> list[dict[str, Any]]:
    """The server's ``GET /models`` list (each with ``id``; vLLM adds ``max_model_len``)."""
    import httpx

    try:
        r = await client.get(f"{base_url}/models")
    except (httpx.HTTPError, OSError) as exc:
        raise ValueError(f"cannot reach {base_url}/models ({type(exc).__name__}: {exc}); is the server up?") from None
    if r.status_code != 200:
        raise ValueError(f"{base_url}/models: {_error_text(r.text, r.status_code)}")
    return list(r.json().get("data", []))


def new_client(concurrency: int, timeout_s: float) -> Any:
    """An ``httpx.AsyncClient`` for ``concurrency`` streams at once (no proxy from the environment: a local server
    is reached directly)."""
    import httpx

    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s, connect=10.0), trust_env=False)


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
                return await complete(client, base_url, model, prompts[i], int(outputs[i]), origin)

        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))


def replay_trace(
    base_url: str,
    model: str,
    arrivals: np.ndarray,
    prompts: list[list[int] | str],
    outputs: np.ndarray,
    concurrency: int = 1 << 16,
    timeout_s: float = 3600.0,
) -> list[Stream]:
    """Send request i at ``arrivals[i]`` seconds from now (open loop, as ``vllm bench serve`` with a request rate:
    a request is sent at its time whatever the server's state, at most ``concurrency`` open at once), streamed;
    returns each request's stream, in order."""
    return asyncio.run(_replay(base_url.rstrip("/"), model, arrivals, prompts, outputs, concurrency, timeout_s))
