"""What ``ferry probe`` sends to a live server, and how: designed requests whose client-side timing reveals the
server's iteration times.

Four kinds of experiment, each a handful of streamed completions (``experiments.real.client``):

- ``ttft``: one request at a time with a prompt of P tokens and one output token, repeated: its time to first token
  is one prefill iteration of P tokens (plus the server's request handling, fitted apart as ``client_s``);
- ``decode``: one request with a prompt of C tokens and G output tokens: each gap between streamed tokens is one
  decode step of one sequence, its context growing from C;
- ``batch``: B requests sent at once, prompts of C tokens, G output tokens each: once all have their first token
  and none has finished, each gap is one decode step of B sequences;
- ``mixed``: B requests decoding, then one more request with a prompt of P tokens: the running requests' gap that ends
  with its first token is an iteration that mixes a P-token prefill with B decodes (several enlarged gaps: the server
  chunked the prompt, and each holds an equal share of it); then ``BUSY_SAMPLES`` short prompts, one after another
  while the B still decode, whose TTFTs give the server's request handling when it is busy. B is a heavy load
  (``mixed_batch``) and a light one (``mixed_light``), three prompt sizes each.

Experiments of a kind alternate between fitted and held out, in size order, so the fit is scored on whole requests it
never saw. Prompts are unique random token ids (no prefix a server could cache). The probe is polite: experiments run
one after another, at most ``max_concurrency`` streams at once, at most ``max_requests`` in all, and nothing starts
once ``budget_s`` is spent (a running experiment is cancelled at the deadline, its streams closed).

A prompt timed as one iteration (a ``ttft`` prompt; a ``mixed`` prompt with its running decodes) must fit the
server's per-iteration token budget (its ``max_num_batched_tokens``): where that is known, those prompts are capped
to it; a longer one would be chunked by the server over several iterations and its time read as one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from experiments.real.client import Prompts, Stream, complete

KINDS = ("ttft", "decode", "batch", "mixed")
MIN_PROMPT = 16  # the shortest ttft prompt (tokens)
SETTLE_CHUNKS = 8  # tokens every running request has received before a mixed experiment's prompt is sent
BUSY_SAMPLES = 4  # short prompts a mixed experiment sends one after another once its prompt has its first token
WAKE_PROMPT = 64  # the prompt of the idle experiments (tokens; the server's budget if that is smaller)


@dataclass(frozen=True)
class ProbePlan:
    """The sizes probed (tokens, sequences) and the limits that keep the probe polite."""

    max_prompt: int = 2048  # longest prompt (tokens); must fit in one iteration of the server (its token budget)
    decode_tokens: int = 128  # output tokens of each decode and batch request
    repeats: int = 3  # requests per ttft size (their median is kept)
    batch_sizes: tuple[int, ...] = (2, 4, 8, 16, 32, 64, 128)
    decode_contexts: tuple[int, ...] = (32, 128, 512, 2048)  # spread from the first to the longest prompt
    batch_context: int = 256  # prompt of each batch request (tokens)
    mixed_batch: int = 16  # requests decoding when a mixed experiment's prompt arrives (the heavy load)
    mixed_light: int = 2  # and at a light load: the same prompts into this many (handling does not grow linearly)
    max_concurrency: int = 64
    max_requests: int = 1000
    budget_s: float = 600.0  # wall-clock deadline of the whole probe (s), its first checks included
    # the longest wait for a response or for a request's next token (s). The probe waits for each experiment to end
    # before the next, so a request waits at most for the prefills of max_concurrency prompts ahead of it (64 of
    # 256 tokens: about a second on a GPU, tens of seconds for a CPU server); a longer silence is a stalled server,
    # and 60 s says so without waiting out the 600 s budget
    timeout_s: float = 60.0
    max_num_batched_tokens: int | None = None  # the server's per-iteration token budget, where known (tokens)
    max_num_seqs: int | None = None  # requests the server seats at once, where known (sequences)
    # pauses (s) before a short prompt sent to the idle server, each against one sent at once (``wake_up``): what a
    # server left idle adds before its next first token (an engine or its threads asleep); () skips it
    idle_pauses: tuple[float, ...] = (0.1, 0.3, 1.0)

    def check(self) -> None:
        for name in ("max_prompt", "decode_tokens", "repeats", "max_concurrency", "max_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"probe: {name} must be >= 1, got {getattr(self, name)}")
        if self.mixed_light < 1 or self.mixed_batch < 1:
            got = f"{self.mixed_light}, {self.mixed_batch}"
            raise ValueError(f"probe: mixed_light and mixed_batch must be >= 1, got {got}")
        if self.decode_tokens < 2 * SETTLE_CHUNKS:
            raise ValueError(f"probe: decode_tokens must be >= {2 * SETTLE_CHUNKS}, got {self.decode_tokens}")
        for name, flag in (("budget_s", "--budget-s"), ("timeout_s", "--timeout")):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{flag} must be a number of seconds > 0, got {getattr(self, name):g}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < MIN_PROMPT:
            raise ValueError(
                f"--max-num-batched-tokens must be >= {MIN_PROMPT} (the probe's shortest prompt), "
                f"got {self.max_num_batched_tokens}"
            )
        if any(not 0 < x <= 10 for x in self.idle_pauses) or list(self.idle_pauses) != sorted(set(self.idle_pauses)):
            raise ValueError(f"--idle-pauses must rise, each in (0, 10] seconds, got {list(self.idle_pauses)}")
        if self.max_num_seqs is not None and self.max_num_seqs < 2:
            raise ValueError(f"--max-num-seqs must be >= 2 (a batch to time), got {self.max_num_seqs}")


@dataclass
class Experiment:
    kind: str  # one of KINDS
    size: int  # what orders experiments of a kind: prompt tokens (ttft, mixed), context (decode), batch (batch)
    prompt: int  # prompt tokens of each request (the background's, for mixed)
    requests: int  # requests sent at once (1 for ttft and decode; ttft repeats them one after another)
    max_tokens: int
    inject: int = 0  # mixed: the injected prompt (tokens)
    held_out: bool = False
    streams: list[Stream] = field(default_factory=list)
    injected: Stream | None = None
    # mixed: short prompts sent after the injected one while the others still decode (request handling when busy)
    busy: list[Stream] = field(default_factory=list)

    @property
    def label(self) -> str:
        words = {
            "ttft": f"prompt {self.prompt}",
            "decode": f"context {self.prompt}, {self.max_tokens} tokens",
            "batch": f"{self.requests} at once, context {self.prompt}",
            "mixed": f"prompt {self.inject} into {self.requests} decoding",
        }
        return f"{self.kind}: {words[self.kind]}"

    def sent(self) -> int:
        return len(self.streams) + (self.injected is not None) + len(self.busy)

    def requests_needed(self, repeats: int) -> int:
        """Requests the experiment sends at most (``repeats``: per ttft size)."""
        return self.requests * (repeats if self.kind == "ttft" else 1) + (1 + BUSY_SAMPLES) * (self.kind == "mixed")


def _sizes(low: int, high: int) -> list[int]:
    """Sizes from ``low`` to ``high`` in steps of about sqrt(2) (``high`` included)."""
    out, x = [], float(low)
    while x < high:
        out.append(int(round(x / 8.0) * 8) or int(x))
        x *= 2**0.5
    return sorted(set([*out, high]))


def _spread(low: int, high: int, n: int) -> list[int]:
    """``n`` sizes from ``low`` to ``high``, evenly spaced in log, rounded to multiples of 8 (fewer if they meet)."""
    low = min(low, high)
    return sorted({max(8, int(round(x / 8.0)) * 8) if x != high else high for x in np.geomspace(low, high, n)})


def design(
    plan: ProbePlan, max_model_len: int | None, max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
) -> list[Experiment]:  # fmt: skip
    """The experiments, in the order they run, each marked fitted or held out (alternating within its kind).
    ``max_num_batched_tokens`` (the server's per-iteration token budget, tokens; ``plan``'s if it has one) caps the
    prompts timed as one iteration; ``max_num_seqs`` (its seats; ``plan``'s if it has one) caps the requests sent to
    decode together (more would wait for a seat, and never all decode at once)."""
    plan.check()
    limit = max_model_len or 1 << 30
    budget = plan.max_num_batched_tokens or max_num_batched_tokens or 1 << 30
    seats = plan.max_num_seqs or max_num_seqs or 1 << 30
    top = max(MIN_PROMPT, min(plan.max_prompt, limit - plan.decode_tokens - 1))
    g = plan.decode_tokens
    out = [Experiment("ttft", p, p, 1, 1) for p in _sizes(MIN_PROMPT, max(MIN_PROMPT, min(top, budget)))]
    out += [Experiment("decode", c, c, 1, g) for c in _spread(plan.decode_contexts[0], top, len(plan.decode_contexts))]
    context = min(plan.batch_context, top)
    sizes = [b for b in plan.batch_sizes if b <= min(plan.max_concurrency, seats)]
    out += [Experiment("batch", b, context, b, g) for b in sizes]
    if top > 2 * context:  # long contexts too: batched decode then reads mostly KV cache
        out += [Experiment("batch", b, top, b, g) for b in sizes[1::2]]
    heavy = max(1, min(plan.mixed_batch, plan.max_concurrency - 1, seats - 1))
    for background in sorted({min(plan.mixed_light, heavy), heavy}):
        inject = max(MIN_PROMPT, min(top, budget - background))  # the prompt and one token of each decode: one step
        injects = _spread(max(64, inject // 16), inject, 3)
        out += [Experiment("mixed", p, context, background, 3 * g, inject=p) for p in injects]
    for kind in KINDS:
        ranked = sorted((e for e in out if e.kind == kind), key=lambda e: e.size)
        for i, e in enumerate(ranked):
            e.held_out = i % 2 == 1
    return out


async def run_experiment(
    e: Experiment, client: Any, url: str, model: str, prompts: Prompts, repeats: int, origin: float,
    timeout_s: float = ProbePlan.timeout_s,
) -> None:  # fmt: skip
    """Send ``e``'s requests; their streams are kept on ``e`` as they arrive (cancel-safe: what finished stays).
    A request whose response or next token takes over ``timeout_s`` seconds fails."""
    if e.kind == "ttft":
        for _ in range(repeats):
            e.streams.append(await complete(client, url, model, prompts.make(e.prompt), 1, origin, timeout_s=timeout_s))
        return
    running = [Stream(0.0, e.prompt, e.max_tokens) for _ in range(e.requests)]
    tasks = [
        asyncio.ensure_future(
            complete(client, url, model, prompts.make(e.prompt), e.max_tokens, origin, into=s, timeout_s=timeout_s)
        )
        for s in running
    ]
    try:
        if e.kind == "mixed":
            # every running request has received SETTLE_CHUNKS tokens (or has ended): they are all decoding
            while not all(len(s.chunk_s) >= SETTLE_CHUNKS or t.done() for s, t in zip(running, tasks, strict=True)):
                await asyncio.sleep(0.001)
            e.injected = await complete(client, url, model, prompts.make(e.inject), 1, origin, timeout_s=timeout_s)
            for _ in range(BUSY_SAMPLES):  # each arrives into the running decodes, as the injected prompt did
                if any(t.done() for t in tasks):
                    break
                e.busy.append(
                    await complete(client, url, model, prompts.make(MIN_PROMPT), 1, origin, timeout_s=timeout_s)
                )
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        e.streams.extend(running)


def budget_left(deadline: float) -> float:
    return deadline - time.perf_counter()


def seeded_prompts(seed: int, text: bool = False, low: int = 100, high: int = 8000) -> Prompts:
    return Prompts(np.random.default_rng(seed), low, high, text)


async def idle_experiments(
    client: Any, url: str, model: str, prompts: Prompts, plan: ProbePlan, budget: int | None, origin: float,
    room: tuple[float, int], into: list[tuple[float, Stream]], log: Callable[[str], None],
) -> str:  # fmt: skip
    """The idle experiments: ``plan.repeats`` rounds of a prompt of ``WAKE_PROMPT`` tokens (``budget``, the server's,
    if smaller) sent the moment the last response ended (pause 0) and after each of ``plan.idle_pauses`` of silence,
    into ``into`` as (pause, stream), within ``room`` (seconds and requests left). Returns why the probe stops, or
    "". A server that goes quiet may put its engine or its threads to sleep (vLLM's engine core polls for work, then
    blocks; its CPU worker's threads spin, then sleep): its next first token then comes later than one sent to a
    server still awake, which the TTFT experiments (each sent as the last ended) never see, and which every request
    of a sparse trace pays."""
    seconds, requests = room
    if (1 + len(plan.idle_pauses)) * plan.repeats > requests or seconds <= sum(plan.idle_pauses) * plan.repeats:
        return "no requests or time left for the idle experiments"
    size = min(WAKE_PROMPT, budget or WAKE_PROMPT)

    async def send() -> None:
        for _ in range(plan.repeats):
            for pause in (0.0, *plan.idle_pauses):
                await asyncio.sleep(pause)
                got = await complete(client, url, model, prompts.make(size), 1, origin, timeout_s=plan.timeout_s)
                into.append((pause, got))

    try:
        await asyncio.wait_for(send(), seconds)
    except TimeoutError:
        return f"--budget-s {plan.budget_s:g} spent (during the idle experiments)"
    finally:
        log(f"idle: prompt {size} after pauses of {', '.join(f'{p:g}' for p in plan.idle_pauses)} s: {len(into)} "
            "requests")  # fmt: skip
    return ""
