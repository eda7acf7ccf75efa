"""An OpenAI-compatible HTTP front of the live engine (``experiments.real.live``), as an ASGI app (Starlette).

The API follows what vLLM's OpenAI server serves (``vllm/entrypoints/openai/protocol.py``: ``CompletionRequest``,
``CompletionStreamResponse``, ``ErrorResponse``; ``serving_completion.py``: the stream and the usage chunk), for the
completions API only, one prompt and one choice per request:

- ``POST /v1/completions``: a JSON object with
  ``model`` (the served name; absent: the served model; another name: 404),
  ``prompt`` (a string, a list of token ids, or a list holding one of those; more than one prompt: 400),
  ``max_tokens`` (output tokens, default 16; null: up to ``max_model_len``),
  ``stream`` (bool, default false), ``stream_options`` (``{"include_usage": bool}``, only with ``stream``; vLLM's
  default when given is true), ``ignore_eos`` (accepted: ferry samples no end-of-sequence token, so every request
  makes exactly ``max_tokens`` tokens), ``n``/``best_of`` (must be 1), ``echo`` (must be false), ``logprobs`` (must be
  null); everything else (``temperature``, ``top_p``, ``seed``, ``stop``, ...) is accepted and ignored (the weights
  are random: greedy tokens are as meaningless as sampled ones).
  Streamed: ``text/event-stream``, one ``data: {json}`` event per output token as soon as the iteration that made it
  ends: ``{"id": "cmpl-...", "object": "text_completion", "created": UNIX_S, "model": NAME, "choices": [{"index": 0,
  "text": " tok<ID>", "logprobs": null, "finish_reason": null, "stop_reason": null}]}``, the last token's with
  ``"finish_reason": "length"``; then with ``include_usage`` a chunk with ``"choices": []`` and ``"usage":
  {"prompt_tokens", "completion_tokens", "total_tokens"}``; then ``data: [DONE]``. Not streamed: one
  ``text_completion`` object with the whole text, ``finish_reason`` and ``usage``.
- ``GET /v1/models``: the served model, with its ``max_model_len`` and, for the policies that have them, the
  scheduler's ``max_num_batched_tokens`` and ``max_num_seqs`` (vLLM's card states only ``max_model_len``).
- ``GET /health``: 200, empty.
- ``GET /metrics``: Prometheus text, vLLM's names: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``
  (gauges), ``vllm:prompt_tokens_total`` (prompt tokens of requests whose prefill is done) and
  ``vllm:generation_tokens_total`` (output tokens made), labelled ``model_name``.

Tokens. A string prompt is split on whitespace and each word is one token, id ``zlib.crc32(word as UTF-8) %
vocab_size`` (deterministic, no tokenizer to download); a list of ids is used as given (each in ``[0, vocab_size)``).
Each output token ``t`` is the text ``" tok<t>"``.

Errors are vLLM's ``{"error": {"message", "type", "param": null, "code": HTTP_STATUS}}``: 400 (``BadRequestError``)
for bad JSON (nested deeper than the decoder goes, about 1,000 levels, included), wrong types, ids out of the
vocabulary, an empty prompt, or prompt + ``max_tokens`` beyond ``max_model_len`` (vLLM's wording); 404
(``NotFoundError``) for another model; 413 for a body longer than ``--max-request-body-bytes``, unread
(``experiments.http_limits``); 500 (``InternalServerError``, one line in the log) for a bug of ours. Errors of the
HTTP layer (an unknown path, a wrong method) take the same shape, typed by vLLM's name where it has one
(``NotFoundError``), else by the status's phrase (``Method Not Allowed``), as vLLM's handler of ``HTTPException``
does. A request the scheduler rejects after it was accepted (``exceeds_kv_cache``: it could never
fit the KV cache) answers 400 when not streamed, and when streamed (the stream has begun) an event ``data: {"error":
{...}}`` then ``data: [DONE]``; a request ended by the server stopping answers 503 (``ServiceUnavailableError``) the
same ways: when the server stops, every open request ends so (``EngineServer``).

A prompt is looked at no further than ``max_model_len`` tokens: a longer one cannot fit, and is refused before the
rest of it is tokenized or checked.

A client that disconnects aborts its request, as vLLM's server does (``with_cancellation`` in
``vllm/entrypoints/utils.py``): its seat and KV cache are freed at the engine's next turn. A stream notices it at once
(Starlette's streaming response listens for the disconnect); a request answered whole listens for it while it waits.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import reprlib
import socket
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive

from experiments.http_limits import DEFAULT_MAX_REQUEST_BODY_BYTES, Guard
from experiments.real.live import Handle, LiveEngine, Output

DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest default
_WORD = re.compile(r"\S+")  # a word: what str.split() splits out (the same whitespace)


def tokenize(text: str, vocab_size: int, most: int | None = None) -> list[int]:
    """One token per whitespace-separated word: ``zlib.crc32(word as UTF-8) % vocab_size``; only the first ``most``
    words are read (None: every word)."""
    words = itertools.islice(_WORD.finditer(text), most)
    return [zlib.crc32(m.group().encode("utf-8", "surrogatepass")) % vocab_size for m in words]


def token_text(token: int) -> str:
    """The text of an output token."""
    return f" tok{token}"


class ApiError(Exception):
    """An error answered as vLLM's ``ErrorResponse``."""

    # vLLM's types for its own errors; any other status takes its phrase ("Request Entity Too Large"), as vLLM's
    # handler of HTTPException does
    TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailableError"}

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.status = message, status

    def body(self) -> dict[str, Any]:
        kind = self.TYPES.get(self.status) or _phrase(self.status)
        return {"error": {"message": self.message, "type": kind, "param": None, "code": self.status}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


# how a request that ended without finishing is answered: the reason's label -> (HTTP status, message)
ENDINGS = {
    "exceeds_kv_cache": (400, "the prompt and max_tokens can never fit in the KV cache (rejected: exceeds_kv_cache)"),
    "exceeds_max_model_len": (400, "the prompt and max_tokens exceed max_model_len (rejected: exceeds_max_model_len)"),
    "empty": (400, "the prompt or max_tokens is empty (rejected: empty)"),
    "aborted": (503, "the server stopped before the request ended (aborted)"),
}


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


_REPR = reprlib.Repr()  # a client's value in a message: short, and never deep
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong, _REPR.maxlist, _REPR.maxdict = 2, 40, 40, 40, 4, 4


def _shown(value: Any) -> str:
    return _REPR.repr(value)


def load_json(raw: bytes) -> Any:
    """A request body as JSON; ``ApiError`` (400) if it is not JSON, or nests deeper than the decoder goes."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ApiError("the request body nests JSON too deeply (a completion request needs 3 levels)") from None
    except ValueError as exc:  # not JSON, not UTF-8, or a number too long to read
        raise ApiError(f"the request body is not valid JSON: {' '.join(str(exc).split())[:200]}") from None


def ending_error(label: str) -> ApiError:
    status, message = ENDINGS.get(label, (503, f"the request ended without finishing ({label})"))
    return ApiError(message, status)


@dataclass(frozen=True, slots=True)
class Completion:
    """A completion request, checked."""

    prompt_ids: list[int]  # the prompt's token ids
    max_tokens: int  # output tokens to make (tokens)
    stream: bool
    include_usage: bool  # streamed: end with a usage chunk


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _prompt_ids(prompt: Any, vocab_size: int, max_model_len: int) -> list[int]:
    """The token ids of ``prompt``: a string, a list of ids, or a list of one of those. A prompt of ``max_model_len``
    tokens or more leaves no room for an output token: it is refused before the rest of it is read (a string's words
    after the first ``max_model_len`` are not tokenized, a list's ids not checked)."""
    shape = "'prompt' must be a string, a list of token ids (integers), or a list holding one of those"
    if isinstance(prompt, list) and prompt and not _is_int(prompt[0]):
        if len(prompt) != 1:
            raise ApiError(f"ferry serve takes one prompt per request; got a list of {len(prompt)} prompts")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenize(prompt, vocab_size, most=max_model_len)
    elif isinstance(prompt, list):
        ids = prompt
    else:
        raise ApiError(f"{shape}; got {type(prompt).__name__}")
    if len(ids) >= max_model_len:
        counted = "at least " if isinstance(prompt, str) else ""
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt has {counted}"
            f"{len(ids)} tokens, which leaves no room for the completion. Please reduce the length of the prompt."
        )
    if isinstance(prompt, list):
        wrong = next((t for t in ids if not _is_int(t)), None)
        if wrong is not None:
            raise ApiError(f"{shape}; got {_shown(wrong)} in a list")
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ApiError(f"token id {bad} is out of vocabulary: ids must be in [0, {vocab_size})")
    if not ids:
        raise ApiError("the prompt is empty: give at least one word or token id")
    return ids


def parse_completion(body: Any, served_name: str, vocab_size: int, max_model_len: int) -> Completion:
    """Check a ``/v1/completions`` body; ``ApiError`` names what is wrong."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError("'model' must be a string")
    if model is not None and model != served_name:
        raise ApiError(f"The model `{model}` does not exist.", 404)
    if "prompt" not in body:
        raise ApiError("'prompt' is required")
    ids = _prompt_ids(body["prompt"], vocab_size, max_model_len)
    max_tokens = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens is None:
        max_tokens = max(max_model_len - len(ids), 1)
    if not _is_int(max_tokens) or max_tokens < 1:
        raise ApiError(f"'max_tokens' must be an integer >= 1, got {_shown(max_tokens)}")
    if len(ids) + max_tokens > max_model_len:
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{len(ids) + max_tokens} tokens ({len(ids)} in the prompt, {max_tokens} in the completion). "
            "Please reduce the length of the prompt or completion."
        )
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        raise ApiError(f"'stream' must be a boolean, got {_shown(stream)}")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise ApiError("Stream options can only be defined when `stream=True`.")
    if options is not None and not isinstance(options, dict):
        raise ApiError("'stream_options' must be an object")
    include_usage = False if options is None else options.get("include_usage")
    include_usage = True if include_usage is None else include_usage  # vLLM's StreamOptions default
    if not isinstance(include_usage, bool):
        raise ApiError(f"'stream_options.include_usage' must be a boolean, got {_shown(include_usage)}")
    for key in ("n", "best_of"):
        if body.get(key) not in (None, 1):
            raise ApiError(f"'{key}' must be 1: ferry serve makes one completion per request")
    if body.get("echo"):
        raise ApiError("'echo' is not supported by ferry serve")
    if body.get("logprobs") is not None:
        raise ApiError("'logprobs' is not supported by ferry serve (the weights are random)")
    if not isinstance(body.get("ignore_eos", False), bool):
        raise ApiError("'ignore_eos' must be a boolean")
    return Completion(ids, int(max_tokens), stream, include_usage)


class Api:
    """The endpoints over one live engine serving one model."""

    def __init__(self, engine: LiveEngine, served_name: str, max_model_len: int,
                 limits: dict[str, int] | None = None) -> None:  # fmt: skip
        self.engine = engine
        self.name = served_name
        self.max_model_len = int(max_model_len)
        self.limits = dict(limits or {})  # the scheduler's per-iteration limits the model card states
        self.created = int(time.time())

    async def completions(self, request: Request) -> Response:
        try:
            try:
                raw = await request.body()  # at most the body limit: ``Guard`` counts it as it comes
            except ClientDisconnect:  # gone before the body came: nobody to answer
                return Response(status_code=400)
            req = parse_completion(load_json(raw), self.name, self.engine.vocab_size, self.max_model_len)
            if self.engine.error is not None:
                raise ApiError(f"the engine has stopped: {self.engine.error}", 503)
            try:
                handle = self.engine.submit(req.prompt_ids, req.max_tokens)
            except RuntimeError as exc:
                raise ApiError(str(exc), 503) from None
        except ApiError as err:
            return err.response()
        rid = f"cmpl-{uuid.uuid4().hex}"
        if req.stream:
            return StreamingResponse(self._stream(handle, req, rid), media_type="text/event-stream")
        return await self._whole(handle, req, rid, request.receive)

    def _usage(self, req: Completion, completion_tokens: int) -> dict[str, int]:
        n = len(req.prompt_ids)
        return {"prompt_tokens": n, "completion_tokens": completion_tokens, "total_tokens": n + completion_tokens}

    def _chunk(self, rid: str, choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": self.name}
        return _event({**body, "choices": choices, **extra})

    async def _stream(self, handle: Handle, req: Completion, rid: str) -> AsyncIterator[str]:
        ended = False
        made = 0
        try:
            while not ended:
                out: Output = await handle.queue.get()
                ended = out.finished or out.error is not None
                if out.error is not None:
                    yield _event(ending_error(out.error).body())
                    break
                for k, token in enumerate(out.token_ids):
                    last = out.finished and k == len(out.token_ids) - 1
                    choice = {"index": 0, "text": token_text(token), "logprobs": None,
                              "finish_reason": "length" if last else None, "stop_reason": None}  # fmt: skip
                    yield self._chunk(rid, [choice])
                made += len(out.token_ids)
                if out.finished and req.include_usage:
                    yield self._chunk(rid, [], usage=self._usage(req, made))
            yield "data: [DONE]\n\n"
        finally:
            if not ended:  # the client went away (or the response was cancelled): free its seat
                self.engine.abort(handle)

    async def _whole(self, handle: Handle, req: Completion, rid: str, receive: Receive) -> Response:
        tokens: list[int] = []
        ended = False
        watch = asyncio.ensure_future(self._abort_when_gone(handle, receive))
        try:
            while not ended:
                out = await handle.queue.get()
                ended = out.finished or out.error is not None
                if out.error is not None:
                    return ending_error(out.error).response()
                tokens += out.token_ids
        finally:
            watch.cancel()
            if not ended:  # the handler was cancelled: free its seat
                self.engine.abort(handle)
        choice = {"index": 0, "text": "".join(token_text(t) for t in tokens), "logprobs": None,
                  "finish_reason": "length", "stop_reason": None}  # fmt: skip
        body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": self.name,
                "choices": [choice], "usage": self._usage(req, len(tokens))}  # fmt: skip
        return JSONResponse(body)

    async def _abort_when_gone(self, handle: Handle, receive: Receive) -> None:
        """Abort the request when its client disconnects (the body has been read: the next message is that)."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self.engine.abort(handle)

    async def models(self, request: Request) -> Response:
        card = {"id": self.name, "object": "model", "created": self.created, "owned_by": "ferry",
                "root": self.name, "parent": None, "max_model_len": self.max_model_len} | self.limits  # fmt: skip
        return JSONResponse({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200 if self.engine.error is None else 503)

    async def metrics(self, request: Request) -> Response:
        label = f'{{model_name="{self.name}"}}'
        e = self.engine
        lines = []
        for name, kind, value, about in (
            ("vllm:num_requests_running", "gauge", e.num_running, "Requests seated and generating."),
            ("vllm:num_requests_waiting", "gauge", e.num_waiting, "Requests waiting to be seated."),
            ("vllm:prompt_tokens_total", "counter", e.prompt_tokens_total, "Prompt tokens of prefilled requests."),
            ("vllm:generation_tokens_total", "counter", e.generation_tokens_total, "Output tokens made."),
        ):
            lines += [f"# HELP {name} {about}", f"# TYPE {name} {kind}", f"{name}{label} {value}"]
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4; charset=utf-8")


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _http_error(request: Request, exc: Exception) -> Response:
    """An error of the HTTP layer (no such path, a wrong method) in vLLM's shape."""
    assert isinstance(exc, HTTPException)
    body = ApiError(str(exc.detail), exc.status_code).body()
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def build_app(
    engine: LiveEngine,
    served_name: str,
    max_model_len: int,
    on_ready: Callable[[], None] | None = None,
    max_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
    limits: dict[str, int] | None = None,
) -> Starlette:
    """The ASGI app over ``engine`` (started and stopped by its owner); ``on_ready`` is called once the app has
    started (before it serves its first request); a request body longer than ``max_body_bytes`` (bytes) is refused
    unread (413); ``limits`` (``max_num_batched_tokens``, ``max_num_seqs``: tokens, sequences) are stated on the
    model's card, where a client such as ``ferry probe`` reads them."""
    api = Api(engine, served_name, max_model_len, limits)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if on_ready is not None:
            on_ready()
        yield

    routes = [
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
    ]
    guard = Middleware(Guard, max_body_bytes=max_body_bytes, name="ferry serve",
                       error_body=lambda status, message: ApiError(message, status).body())  # fmt: skip
    return Starlette(
        routes=routes, middleware=[guard], exception_handlers={HTTPException: _http_error}, lifespan=lifespan
    )


class EngineServer(uvicorn.Server):
    """uvicorn's server over a live engine. When it stops (a signal, or the engine failing) the engine stops first,
    before uvicorn waits for the open connections: every request still open then ends as its client was promised (a
    stream with its 503 error event and ``data: [DONE]``, a whole response with its 503) and its connection closes by
    itself, where uvicorn alone would wait out its graceful timeout and then cut the streams by cancelling them."""

    def __init__(self, config: uvicorn.Config, engine: LiveEngine) -> None:
        super().__init__(config)
        self.engine = engine

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.engine.stop(timeout=0)  # not waited for here: the engine thread ends after its iteration in progress
        await super().shutdown(sockets)
