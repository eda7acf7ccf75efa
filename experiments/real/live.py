"""The live engine: ferry's real executor serving requests that arrive while it runs (what ``ferry serve`` drives).

``experiments.real.executor.replay`` serves a trace known in advance; here the requests come from clients. One thread
owns the scheduler state, the policy and the model, and loops over the simulator's turn against the wall clock:

1. take the requests submitted since the last turn (``LiveEngine.submit``, from any thread): each is appended to the
   request table (``RequestTable.append``) with its arrival (when it was submitted, on the engine clock) and handed to
   the replica's inbox (``SchedulerState.route``, a replica in ``routed`` mode); its prompt token ids go to the
   executor, which runs the model on them;
2. ``sim.engine.decide``: the policy (the same objects as in a simulation) returns a batch, or a time to ask again;
3. a batch runs on the model (``Executor.run``), ``SchedulerState.complete`` accounts for it with real times, and the
   token each member sampled goes to its consumer at once (``Output``, put on the consumer's asyncio queue from the
   engine thread with ``loop.call_soon_threadsafe``); a request that ends without finishing (rejected, or aborted by
   its client) gets one ``Output`` naming the reason (``sim.request.Reason``);
4. a wait blocks on a condition variable until the policy's wake-up time or the next submission, never polling: the
   HTTP server shares the interpreter (and its lock) with this thread.

The clock is ``time.perf_counter`` in seconds from the engine's start. An iteration is timed as ``replay`` times it:
from the moment its turn began (the decision, bookkeeping and input preparation are host work of the iteration) when it
follows the previous one at once, or from the decision after an idle wait, to the moment its sampled tokens are on the
host. Every iteration is kept (``IterationRecord``); ``iteration_table`` turns them into the iteration log that ``ferry
serve --iterations-log`` writes and ``ferry calibrate --from-iterations`` reads.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from costmodel.shape import IterationShape
from experiments.real.executor import Executor, _warm_up_policy
from experiments.real.llama import Llama
from sim.engine import Scheduler, decide, describe_run
from sim.kvcache import KVCacheManager
from sim.request import MIN_CAPACITY, Reason, RequestTable, Status
from sim.state import Batch, SchedulerState

# the iteration log's columns (seconds on the engine clock; counts in sequences or tokens), in order
ITERATION_LOG_COLUMNS = (
    "start_s",  # when the iteration began (s, engine clock)
    "duration_s",  # its measured length, decision to sampled tokens on the host (s)
    "num_prefill_seqs",  # prefill chunks (whole prompts, chunks, recomputes) in it (count)
    "prefill_tokens",  # new prompt tokens of those chunks (tokens)
    "prefill_context_tokens",  # tokens of those sequences cached before their chunk (tokens)
    "num_decode_seqs",  # one-token decode steps (count)
    "decode_context_tokens",  # tokens cached before the step, summed over the decode steps (tokens)
    "prefill_chunks",  # JSON [[new_tokens, context_tokens], ...], one pair per chunk in batch order
    "forward_s",  # of duration_s, the model's forward pass (device work, s)
)


@dataclass(frozen=True, slots=True)
class Output:
    """What the engine hands a request's consumer: the tokens one iteration made for it, or how it ended."""

    # tokens sampled for it (one per iteration that samples it; none when it ended without a token)
    token_ids: tuple[int, ...] = ()
    # it made its last token (``max_tokens`` reached: finish_reason "length")
    finished: bool = False
    # it ended without finishing: the ``Reason`` label (``exceeds_kv_cache``, ``aborted``, ...); None otherwise
    error: str | None = None


class Handle:
    """A submitted request as its consumer sees it: ``Output`` values arrive on ``queue`` (an asyncio queue, filled
    from the engine thread through ``loop``), the last with ``finished`` or ``error`` set."""

    def __init__(self, prompt_ids: list[int], max_tokens: int, loop: asyncio.AbstractEventLoop) -> None:
        self.prompt_ids = prompt_ids
        self.max_tokens = max_tokens  # output tokens wanted (tokens)
        self.loop = loop
        self.queue: asyncio.Queue[Output] = asyncio.Queue()
        self.arrival = math.nan  # when it was submitted (s, engine clock)
        self.index = -1  # its row in the engine's request table, once the engine has taken it
        self.delivered = 0  # output tokens handed to the consumer so far (engine thread only)


@dataclass(frozen=True, slots=True)
class IterationRecord:
    """One iteration the engine ran."""

    start: float  # when it began (s, engine clock)
    end: float  # when its sampled tokens were on the host (s, engine clock)
    shape: IterationShape  # its prefill chunks and decode steps (``SchedulerState.shape_of``)
    forward_s: float  # seconds in the model's forward pass (``Executor.last_forward_s``)


def iteration_table(records: list[IterationRecord]) -> pd.DataFrame:
    """The iteration log: one row per record, the columns of ``ITERATION_LOG_COLUMNS``."""
    rows = []
    for r in records:
        s = r.shape
        rows.append(
            (
                r.start,
                r.end - r.start,
                len(s.prefill_new),
                int(s.prefill_new.sum()),
                int(s.prefill_ctx.sum()),
                len(s.decode_ctx),
                int(s.decode_ctx.sum()),
                json.dumps([[int(n), int(c)] for n, c in zip(s.prefill_new, s.prefill_ctx, strict=True)]),
                r.forward_s,
            )
        )
    return pd.DataFrame(rows, columns=list(ITERATION_LOG_COLUMNS))


class LiveExecutor(Executor):
    """An executor whose requests arrive while it runs: each brings its own prompt token ids (``add``)."""

    def __init__(self, model: Llama, slots: int = 8) -> None:
        """``slots``: sequences the model's KV cache holds at first (it doubles when more are seated)."""
        super().__init__(model, RequestTable([], [], []), np.random.default_rng(0), slots)

    def add(self, prompt_ids: list[int]) -> int:
        """A new request with these prompt tokens (the next row of the request table); returns its row."""
        self.tokens.append(list(prompt_ids))
        return len(self.tokens) - 1

    def forget(self, req: int) -> None:
        """Drop the tokens of a request that has ended (a recompute will never read them again)."""
        self.tokens[req] = []


class _LiveState(SchedulerState):
    """The replica's state, noting every request that ends without finishing (rejected or aborted), wherever it
    happens (arrival checks, an abort, a stalled policy), so their consumers can be told."""

    def __init__(self, requests: RequestTable, kv: KVCacheManager, max_model_len: int) -> None:
        super().__init__(requests, kv, max_model_len, routed=True)
        self.ended: list[int] = []

    def reject(self, req: int, reason: Reason) -> None:
        super().reject(req, reason)
        self.ended.append(req)


def _reserve_kv_rows(kv: KVCacheManager, n: int) -> None:
    """Make the KV manager's per-request column hold at least ``n`` requests (doubling)."""
    if n > len(kv.held):
        extra = max(MIN_CAPACITY, len(kv.held), n - len(kv.held))
        kv.held = np.concatenate([kv.held, np.zeros(extra, dtype=kv.held.dtype)])


def _put_all(items: list[tuple[asyncio.Queue[Output], Output]]) -> None:
    for queue, output in items:
        queue.put_nowait(output)


class LiveEngine:
    """The engine loop of a live server, in a thread of its own (``start``, ``stop``); ``submit`` and ``abort`` may be
    called from any thread."""

    def __init__(
        self,
        policy: Scheduler,
        executor: LiveExecutor,
        kv: KVCacheManager,
        max_model_len: int,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.policy = policy
        self.executor = executor
        self.max_model_len = int(max_model_len)
        self.vocab_size = executor.model.spec.vocab_size
        self.requests = RequestTable([], [], [])
        self.state = _LiveState(self.requests, kv, max_model_len)
        describe_run(self.state.records, policy, stream=True)
        self.iterations: list[IterationRecord] = []
        self.error: BaseException | None = None  # what stopped the engine thread, if it failed
        self.on_error: Callable[[BaseException], None] | None = None  # called (engine thread) when it fails
        # vLLM's counters (``/metrics``): prompt tokens of requests whose prefill is done, output tokens made
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._clock = clock
        self._t0 = clock()
        self._cond = threading.Condition()  # guards _submitted and _aborted; wakes the loop
        self._submitted: list[Handle] = []
        self._aborted: list[Handle] = []
        self._stop = threading.Event()
        self._live: dict[int, Handle] = {}  # requests taken and not yet ended, by row
        self._thread = threading.Thread(target=self._main, name="ferry-engine", daemon=True)

    # ---- any thread -----------------------------------------------------------------------------------------------
    def now(self) -> float:
        """Seconds on the engine clock."""
        return self._clock() - self._t0

    def start(self) -> None:
        """Warm up the model and the policy (untimed throwaway iterations), start the clock and the loop."""
        self.executor.warmup()
        _warm_up_policy(self.policy, self.executor.model, self.max_model_len)
        self._t0 = self._clock()
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the loop after the iteration in progress, waiting at most ``timeout`` seconds for it (0: not at all,
        as from an event loop); every request not ended, seated, waiting or submitted and not yet taken, gets
        ``Output(error="aborted")``, and later submissions raise."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def submit(self, prompt_ids: list[int], max_tokens: int, loop: asyncio.AbstractEventLoop | None = None) -> Handle:
        """Queue a request for ``max_tokens`` output tokens after ``prompt_ids``; its outputs arrive on the returned
        handle's queue, on ``loop`` (default: the running loop). Its arrival is now."""
        if any(not 0 <= t < self.vocab_size for t in prompt_ids):
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")
        handle = Handle(list(prompt_ids), int(max_tokens), loop or asyncio.get_running_loop())
        with self._cond:
            if self._stop.is_set() or self.error is not None:
                raise RuntimeError("the engine is not running")
            handle.arrival = self.now()  # under the lock: submissions arrive in the order they are queued
            self._submitted.append(handle)
            self._cond.notify()
        return handle

    def abort(self, handle: Handle) -> None:
        """The consumer is gone: end the request at the next turn (its seat and KV are freed), if not ended yet."""
        with self._cond:
            self._aborted.append(handle)
            self._cond.notify()

    @property
    def num_running(self) -> int:
        """Requests seated and still generating."""
        return len(self.state.running) - self.state.num_held

    @property
    def num_waiting(self) -> int:
        """Requests submitted or queued for admission, not yet seated."""
        return len(self.state.waiting) + len(self._submitted)

    # ---- the engine thread ----------------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the consumers must hear of it; the server decides what to do
            self.error = exc
            if self.on_error is not None:
                self.on_error(exc)
        finally:  # every request not ended ends now, those submitted and not yet taken too
            gone = "aborted" if self.error is None else "engine_error"
            self.state.ended.extend(self._live)
            self._deliver(sampled=[], gone=gone)
            with self._cond:  # a submission after this raises: the stop (or the error) is set
                pending, self._submitted = self._submitted, []
            for handle in pending:
                try:
                    handle.loop.call_soon_threadsafe(handle.queue.put_nowait, Output(error=gone))
                except RuntimeError:  # its loop is closed: nobody is listening any more
                    pass

    def _loop(self) -> None:
        state, executor = self.state, self.executor
        carried: float | None = None  # end of the previous iteration when this turn follows it at once
        while not self._stop.is_set():
            now = self._take()
            action = decide(state, self.policy, now)
            if isinstance(action, Batch):
                start = now if carried is None else carried
                start = max(start, float(self.requests.arrival[action.req_ids].max()))
                shape = state.shape_of(action)
                executor.run(state, action)
                end = self.now()
                state.complete(action, shape, start, end)
                executor.release(state)
                self.iterations.append(IterationRecord(start, end, shape, executor.last_forward_s))
                ids = action.req_ids
                self._deliver(ids[self.requests.last_token[ids] == end].tolist())
                carried = end
            else:
                self._deliver(sampled=[])
                carried = None
                self._sleep(math.inf if action is None else action)

    def _take(self) -> float:
        """Route the submitted requests to the replica and receive them; end the aborted ones. Returns now (s): after
        every request taken arrived."""
        with self._cond:
            submitted, self._submitted = self._submitted, []
            aborted, self._aborted = self._aborted, []
        now = self.now()
        state = self.state
        for handle in submitted:
            req = self.requests.append(handle.arrival, len(handle.prompt_ids), handle.max_tokens)
            _reserve_kv_rows(state.kv, self.requests.n)
            self.executor.add(handle.prompt_ids)
            handle.index = req
            self._live[req] = handle
            state.route(req)
        state.now = now
        state.receive_arrivals(now)  # so that an aborted request is queued (or rejected) before it is ended
        for handle in aborted:
            req = handle.index
            if req in self._live and self.requests.status[req] in (Status.WAITING, Status.RUNNING):
                state.reject(req, Reason.ABORTED)
        if aborted:
            self.executor.release(state)
        return now

    def _deliver(self, sampled: list[int], gone: str = "aborted") -> None:
        """Hand each consumer what this turn made: the token each of ``sampled`` made, and the end of every request
        that ended without finishing (``state.ended``: its rejection reason, or ``gone`` if it was not rejected)."""
        reqs, tokens = self.requests, self.executor.tokens
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Output], Output]]] = {}
        for req in sampled:
            handle = self._live[req]
            made = int(reqs.generated[req])
            start = len(handle.prompt_ids) + handle.delivered
            new = tuple(tokens[req][start : len(handle.prompt_ids) + made])
            if handle.delivered == 0:  # its first token: its prompt is done
                self.prompt_tokens_total += len(handle.prompt_ids)
            handle.delivered = made
            self.generation_tokens_total += len(new)
            finished = made >= handle.max_tokens
            by_loop.setdefault(handle.loop, []).append((handle.queue, Output(new, finished)))
            if finished:
                self._end(req)
        for req in self.state.ended:
            if req in self._live:
                handle = self._live[req]
                label = Reason(int(reqs.reason[req])).label if reqs.status[req] == Status.REJECTED else gone
                by_loop.setdefault(handle.loop, []).append((handle.queue, Output(error=label)))
                self._end(req)
        self.state.ended.clear()
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # its loop is closed: nobody is listening any more
                pass

    def _end(self, req: int) -> None:
        del self._live[req]
        self.executor.forget(req)

    def _sleep(self, until: float) -> None:
        """Block until ``until`` (s, engine clock; inf: no deadline), a submission or an abort, or ``stop``."""
        with self._cond:
            while not (self._submitted or self._aborted or self._stop.is_set()):
                left = until - self.now()
                if left <= 0:
                    return
                self._cond.wait(None if math.isinf(left) else left)
