"""The replica: a SimPy process that replays arrivals through a policy and times each iteration with a cost model.

The engine owns time. Each turn it shows the policy the requests that have arrived by now, and either runs the batch
the policy returns for as long as the cost model says, or sleeps until the policy's wake-up time or the next arrival.
Arrivals are not events of their own: requests become visible when the clock passes their arrival time, so a run
costs one SimPy event per iteration or idle wait, not one per request.

``decide`` is the turn without the clock: a real executor (``experiments.real.executor``) drives the same policy
objects with it against wall time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any, Protocol

import simpy

from costmodel.shape import IterationShape
from sim.compiled.engine import loop_on_disk, simulate_compiled
from sim.kvcache import KVCacheManager
from sim.prefix_cache import PrefixCachingKV
from sim.records import RunRecords
from sim.request import Reason, RequestTable, Status
from sim.speculation import Speculation
from sim.state import Batch, SchedulerState, Wait


class IterationTimer(Protocol):
    """Anything that says how long an iteration takes: the roofline cost model, or a stand-in in tests."""

    def iteration_time(self, shape: IterationShape) -> float:
        """Seconds the iteration of this shape takes on the replica."""
        ...


class Scheduler(Protocol):
    def schedule(self, state: SchedulerState) -> Batch | Wait: ...


def decide(state: SchedulerState, policy: Scheduler, now: float) -> Batch | float | None:
    """One turn at time ``now`` (s): receive arrivals and ask the policy. Returns the batch to run now, or the time to
    wake up and ask again (s, > now; inf for a replica of a cluster with nothing to do until its router hands it a
    request), or None when every request (routed here) has ended."""
    while True:
        state.now = now
        state.receive_arrivals(now)
        if not state.unfinished:
            return None
        decision = policy.schedule(state)
        if isinstance(decision, Batch):
            return decision
        if not state.unfinished:  # the policy's last act was to release the final batch
            return None
        if decision.until is not None and decision.until <= now:
            raise RuntimeError(f"{type(policy).__name__} asked to wait until {decision.until} at time {now}")
        wake = min(decision.until if decision.until is not None else math.inf, state.next_arrival)
        if wake == math.inf and state.more:
            return wake  # a replica of a cluster: asleep until its router hands it a request
        if wake == math.inf:
            # the policy will never act again and nothing else will arrive: end what is left, with a reason
            for req in list(state.running) + list(state.waiting):
                state.reject(req, Reason.STALLED)
            return None
        if wake > now:
            return wake


PROGRESS_EVERY = 5000  # iterations between progress calls on the reference engine


def replica(
    env: simpy.Environment,
    state: SchedulerState,
    policy: Scheduler,
    timer: IterationTimer,
    on_progress: Callable[[float, int], None] | None = None,
) -> Generator[simpy.Event, Any, None]:
    """The replica process: decide, run, account; or wait."""
    turns = 0
    while True:
        turns += 1
        if on_progress is not None and turns % PROGRESS_EVERY == 0:
            on_progress(env.now, state.unfinished)
        now = env.now
        action = decide(state, policy, now)
        if action is None:
            return
        if isinstance(action, Batch):
            shape = state.shape_of(action)
            duration = timer.iteration_time(shape)
            if not duration > 0:
                raise RuntimeError(f"the cost model gave a non-positive iteration time {duration!r} for {shape}")
            yield env.timeout(duration)
            state.complete(action, shape, now, env.now)
        else:
            yield env.timeout(action - now)


ENGINES = ("auto", "compiled", "reference")


def default_stream(policy: object) -> bool:
    """Whether a policy's responses are streamed by default: yes, unless it returns every member's response when its
    batch ends (``returns_at_batch_end``: static and dynamic batching, as Triton's dynamic batcher returns whole
    responses)."""
    return not getattr(policy, "returns_at_batch_end", False)


def describe_run(records: RunRecords, policy: object, stream: bool | None) -> RunRecords:
    """Note on ``records`` what metrics need to know of the run beyond the engine: how responses were delivered
    (``stream``; None: the policy's default) and how many seats the policy offers (its ``seats``, 0 if unknown)."""
    records.stream = default_stream(policy) if stream is None else bool(stream)
    records.seats = int(getattr(policy, "seats", 0) or 0)
    return records


def simulate(
    requests: RequestTable,
    policy: Scheduler,
    timer: IterationTimer,
    kv: KVCacheManager,
    max_model_len: int,
    engine: str = "auto",
    exact_itl: bool | None = None,
    on_progress: Callable[[float, int], None] | None = None,
    stream: bool | None = None,
    record_batches: bool = False,
    spec: Speculation | None = None,
) -> RunRecords:
    """Replay ``requests`` (arrival order) through ``policy`` on one replica; returns the run's records.

    ``engine``: ``reference`` runs the policy object on this module's SimPy loop; ``compiled`` runs its numba twin
    (``policy.compiled()``) on ``sim.compiled.engine``'s loop with the cost model's compiled timer
    (``timer.compiled()``), to the same records; ``auto`` takes the compiled engine when both offer it and the job is
    large enough to repay loading or compiling it (``choose_engine``). ``exact_itl``
    keeps every token gap (default: unless the run could make more than ``sim.records.EXACT_GAPS_LIMIT``).
    ``on_progress(now, unfinished)`` is called now and then with the simulated clock and the requests not yet ended.
    ``stream``: whether clients receive tokens as they are made (None: the policy's default, ``default_stream``).
    ``record_batches`` keeps who took part in each iteration (``records.batches``; one row per request and
    iteration). ``spec``: speculative decoding (``sim.speculation``), which the built-in chunked policy and continuous
    batching with mixed prefills schedule. The request table is the run's state and ends up in its records: give each
    run a new one."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: choose one of {', '.join(ENGINES)}")
    if (requests.status != Status.PENDING).any() or requests.computed.any():
        raise ValueError("this RequestTable has already been simulated; build a new one for each run")
    kernel = getattr(policy, "compiled", None)
    timing = getattr(timer, "compiled", None)
    if engine == "compiled" and (kernel is None or timing is None):
        raise ValueError(f"the compiled engine needs a built-in policy and the roofline cost model ({policy}, {timer})")
    compiled_ok = kernel is not None and timing is not None
    chosen, why = choose_engine(engine, compiled_ok, requests, lambda: loop_on_disk(kernel()[0], timing()[0]))  # type: ignore[misc]
    if chosen == "compiled":
        assert kernel is not None and timing is not None
        records = simulate_compiled(
            requests, kernel(), timing(), kv, max_model_len, exact_itl, on_progress, record_batches, spec
        )
    else:
        state = SchedulerState(requests, kv, max_model_len, exact_itl, record_batches, spec=spec)
        env = simpy.Environment()
        env.process(replica(env, state, policy, timer, on_progress))
        env.run()
        if isinstance(kv, PrefixCachingKV):
            state.records.prefix_cache = kv.counters()
        records = state.records
    records.engine_choice = why
    return describe_run(records, policy, stream)


# ``auto`` runs the compiled engine when it saves the user time. Both engines load the KV cache's kernels from numba's
# disk cache (most of a second at a process's start, whichever runs); the compiled loop of a (policy, timer) pair then
# loads in ~0.06 s, while the reference engine's Python loop costs ~25 us per output token more (this 2-core machine,
# chunked, 20 requests of 1024/256 tokens: 0.14 s against 0.002 s). So, with the loop on disk, the compiled engine
# from ``AUTO_LOADED_MIN_TOKENS``; before its first compilation on this machine (~10-25 s once, after install or an
# edit of ferry's source) only for jobs from ``AUTO_COMPILED_MIN_TOKENS``, where the loop soon repays it. Both give
# the same records; the choice changes only how long the user waits.
AUTO_LOADED_MIN_TOKENS = 2_000
AUTO_COMPILED_MIN_TOKENS = 10_000


def choose_engine(
    engine: str, compiled_ok: bool, requests: RequestTable, on_disk: Callable[[], bool] = lambda: False
) -> tuple[str, str]:
    """(the engine to run, why: what the summary's header says) for ``engine`` (auto, compiled or reference) when
    the policy and cost model offer a compiled twin (``compiled_ok``) and the job is ``requests``; ``on_disk()``:
    whether the compiled loops the job needs are in numba's disk cache (``sim.compiled.engine.loop_on_disk``)."""
    if engine == "reference":
        return "reference", "asked"
    if engine == "compiled":
        return "compiled", "asked"
    if not compiled_ok:
        return "reference", "auto: this policy or cost model has no compiled twin"
    tokens = int(requests.output_wanted.sum())
    if tokens < AUTO_LOADED_MIN_TOKENS:
        return "reference", f"auto: {tokens:,} output tokens, under {AUTO_LOADED_MIN_TOKENS:,}"
    loaded = on_disk()
    if tokens >= AUTO_COMPILED_MIN_TOKENS:
        return "compiled", f"auto: {tokens:,} output tokens" + ("" if loaded else ", its loop compiled now (once)")
    if loaded:
        return "compiled", f"auto: {tokens:,} output tokens, the compiled loop on disk"
    later = f"the compiled loop not built yet (from {AUTO_COMPILED_MIN_TOKENS:,})"
    return "reference", f"auto: {tokens:,} output tokens, {later}"
