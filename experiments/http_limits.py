"""What ferry's HTTP servers limit, in one place: `ferry serve` (the OpenAI API over a real model) and `ferry explore`
(the teaching page, which simulates). Both wrap their app in ``Guard`` and take the same flags (``add_arguments``):

- ``--max-request-body-bytes``: a longer request body is answered 413 before it is read, at once when its
  Content-Length says so, else as soon as that many bytes have come; the connection is then closed. The request line
  and headers (so the page's query string) are bounded by uvicorn's HTTP parser (h11: 16 KiB);
- ``--max-run-tokens`` (servers that simulate): the most work one run may be, its requests' prompt and output tokens
  summed (requests x (prompt + output) tokens); ``ferry explore`` counts them on the drawn requests before simulating;
- an unexpected exception answers a JSON 500 in the server's error shape and logs one line, never a traceback; a
  handler that the server cancels while stopping logs one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

# The longest request a built-in model can take is 131,072 token ids (llama-3.1-8b's context), at most 8 bytes an id
# in JSON ("128255, "): about 1 MiB. 16 times that leaves room for text prompts (a non-ASCII character escaped as
# \uXXXX takes 6 bytes, and a word of any length is one token), and a body this long is parsed in about 0.1 s, so
# the event loop is never held for long. `ferry explore` reads no bodies at all.
DEFAULT_MAX_REQUEST_BODY_BYTES = 16 * 2**20
# A run of 2,000,000 tokens, all of them output (the costliest kind: every token is a step of some iteration), takes
# about 6 s and 1.2 GB on a 2-core machine (1,000 requests x 2,000 output tokens, one at a time or four to a boat);
# prompt tokens cost less (many to an iteration). The page's default run is about 4,000 tokens, and 2,000 requests of
# up to 512 prompt and 500 output tokens fit.
DEFAULT_MAX_RUN_TOKENS = 2_000_000

log = logging.getLogger("ferry.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
# a server's error JSON for (HTTP status, one-line message)
ErrorBody = Callable[[int, str], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The limits of one server."""

    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES  # longest request body read (bytes)
    max_run_tokens: int = DEFAULT_MAX_RUN_TOKENS  # most requests x (prompt + output) tokens one run simulates (tokens)


def _at_least_one(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def add_arguments(p: argparse.ArgumentParser, simulates: bool) -> None:
    """The limit flags of a server (``simulates``: it runs simulations, so it takes ``--max-run-tokens``)."""
    g = p.add_argument_group("limits")
    g.add_argument("--max-request-body-bytes", type=_at_least_one, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                   metavar="BYTES", help="longer request bodies are answered 413 unread (default 16 MiB)")  # fmt: skip
    if simulates:
        g.add_argument("--max-run-tokens", type=_at_least_one, default=DEFAULT_MAX_RUN_TOKENS, metavar="TOKENS",
                       help="most requests x (prompt + output) tokens a run simulates (default 2,000,000)")  # fmt: skip


LIMIT_FLAGS = frozenset({"max_request_body_bytes", "max_run_tokens"})  # the namespace keys ``add_arguments`` adds


def from_args(args: argparse.Namespace) -> HttpLimits:
    """The limits the flags of ``add_arguments`` give."""
    given = {k: getattr(args, k) for k in LIMIT_FLAGS if getattr(args, k, None) is not None}
    return HttpLimits(**given)


class BodyTooLarge(Exception):
    """The request body went past the limit while it was read."""

    def __init__(self, received: int) -> None:
        super().__init__(f"{received:,} bytes")
        self.received = received  # bytes read when the limit was passed


def one_line(exc: BaseException, most: int = 300) -> str:
    """An exception as ``Type: message``, on one line, at most ``most`` characters."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= most else text[: most - 3] + "..."


class Guard:
    """ASGI middleware: the body limit, and one JSON answer and one log line for whatever the app did not handle.

    It must sit inside the framework's own error middleware (a Starlette ``Middleware`` entry), which would otherwise
    answer plain text and hand the traceback to the server's log."""

    def __init__(self, app: App, *, max_body_bytes: int, error_body: ErrorBody, name: str) -> None:
        self.app = app
        self.max_body_bytes = int(max_body_bytes)  # bytes
        self.error_body = error_body
        self.name = name  # the command, for the log lines ("ferry serve")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._answer(send, 413, self._too_large(declared), close=True)
            return
        received = 0
        started = done = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(received)
            return message

        async def tracked(message: Message) -> None:
            nonlocal started, done
            started = started or message["type"] == "http.response.start"
            done = done or (message["type"] == "http.response.body" and not message.get("more_body", False))
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge:
            if not started:
                await self._answer(send, 413, self._too_large(None), close=True)
        except asyncio.CancelledError:  # the server gave up waiting for it while stopping: end it quietly
            log.warning("%s: %s cancelled: the server is stopping", self.name, _target(scope))
            await self._end(send, started, done, 503, "the server is stopping")
        except Exception as exc:  # a bug of ours: one line in the log, one JSON answer
            log.error("%s: %s failed: %s", self.name, _target(scope), one_line(exc))
            await self._end(send, started, done, 500, f"internal error ({one_line(exc)})")

    def _too_large(self, declared: int | None) -> str:
        size = "" if declared is None else f" ({declared:,} bytes)"
        return (f"the request body{size} is longer than this server reads "
                f"(at most {self.max_body_bytes:,} bytes: --max-request-body-bytes)")  # fmt: skip

    async def _end(self, send: Send, started: bool, done: bool, status: int, message: str) -> None:
        """Answer, or end a response already begun (its body so far is what the client gets)."""
        try:
            if not started:
                await self._answer(send, status, message)
            elif not done:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:  # the connection is gone: nothing to tell
            pass

    async def _answer(self, send: Send, status: int, message: str, close: bool = False) -> None:
        body = json.dumps(self.error_body(status, message)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if close:  # the body was not read: the connection cannot carry another request
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _target(scope: Scope) -> str:
    query = scope.get("query_string", b"").decode("latin-1")
    path = scope.get("path", "")
    target = f"{path}?{query}" if query else path
    return f"{scope.get('method', '')} {target[:200]}"
