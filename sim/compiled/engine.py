"""The compiled engine: the reference engine's loop (``sim.engine``), compiled with numba, for built-in policies.

The loop is ``sim.engine.decide`` plus the SimPy process around it, over ``sim.compiled.state``'s arrays: receive
arrivals, ask the policy (a numba kernel, ``policies.compiled``), run the batch for as long as the cost model's compiled
``iteration_time`` says, account for it; or sleep until the wake-up time. The clock advances by the same floating-point
operations as SimPy's (``now + duration``, ``now + (wake - now)``), so both engines produce the same records bit for
bit; ``tests/test_fast_engine.py`` checks it.

SimPy still keeps the time: the loop runs in segments (until a time, or a number of iterations), and the replica
process yields one timeout per segment, so a segment is where a future cluster's router, or a progress bar, gets a
word in. A single replica needs nothing in between and runs in segments of ``SEGMENT_ITERATIONS``.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy
from numba import njit

from costmodel import numba_cache
from sim.compiled.batch import build_shape, complete
from sim.compiled.state import (
    ARRIVAL,
    B_LEN,
    DEC_CTX,
    FLIGHT_END,
    FLIGHT_START,
    IN_FLIGHT,
    INBOX,
    LOG_BASE,
    MAX_MODEL_LEN,
    MORE,
    N_BATCH_ROWS,
    N_DEC,
    N_ITERS,
    N_PF,
    N_VF,
    NUM_SCALARS,
    NUM_WK,
    OUTPUT,
    PF_CTX,
    PF_NEW,
    ROUTED,
    SESSIONS,
    SLEEPING,
    SPEC_K,
    SPEC_LOOKAHEAD,
    SPEC_PAD,
    SPEC_SLOTS,
    UNFINISHED,
    VF_CTX,
    VF_NEW,
    W_HEAD,
    W_LEN,
    WAITING_Q,
    WAKE,
    next_arrival,
    pack,
    receive_arrivals,
    reject_stalled,
    unpack,
    work_left,
)
from sim.kernels.jit import NO_REFCOUNTS, WITH_REFCOUNTS, kernel
from sim.kernels.sessions import first_turns, sessions_of
from sim.kvcache import KVCacheManager
from sim.prefix_cache import PrefixCachingKV
from sim.records import BatchLog, IterationLog, ItlLog, RunRecords
from sim.request import RequestTable
from sim.speculation import SP_HEAD, Speculation
from sim.state import max_gaps

NO_SESSIONS = sessions_of(np.full(1, -1, dtype=np.int64), np.zeros(1))  # a replica without conversations


def speculation_arrays(spec: Speculation | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A replica's speculative decoding as the compiled loop takes it (``sp``): ``Speculation.array`` (its scalars
    and the drafts proposed by batch size), the conditional acceptance rates, and the counters (``RunRecords
    .speculation``); zeros without it (no drafts are ever proposed)."""
    if spec is None:
        return np.zeros(SP_HEAD + 1, dtype=np.int64), np.zeros(1), np.zeros(1, dtype=np.int64)
    size = len(spec.per_batch) - 1 if spec.per_batch is not None else 0
    return spec.array(size), spec.rates.copy(), spec.counters()


# what a segment ended with
DONE, PAUSED, LOG_FULL, BAD_WAIT, BAD_DURATION, BATCH_LOG_FULL, IDLE = range(7)
SEGMENT_ITERATIONS = 200_000


# The loop is written once, below, as a template over two global names, ``schedule`` (the policy kernel) and
# ``timer`` (the cost model's compiled timer), and compiled once per pair by ``segment_runner``, which binds them as
# globals of a copy of the function. numba calls a global function directly and caches the result on disk; a function
# passed as an argument would be a run-time address, which numba cannot cache ("uses dynamic globals"), and the loop,
# with everything it calls, was compiled again in every process (~5 s at the start of each run).
schedule: Any = None
timer: Any = None


def time_iteration(timer_args: Any, wk: np.ndarray, n_pf: int, n_dec: int, sampled: int, n_vf: int) -> float:
    """Seconds the iteration of the shape in ``wk`` takes (the cost model's ``timer``). Reference counted, unlike the
    loop (``sim.kernels.jit``): the cost model allocates, and a callee inherits the flag of its caller unless it
    sets its own."""
    seconds: float = timer(timer_args, wk[PF_NEW, :n_pf], wk[PF_CTX, :n_pf], wk[DEC_CTX, :n_dec], sampled,
                           wk[VF_NEW, :n_vf], wk[VF_CTX, :n_vf])  # fmt: skip
    return seconds


def run_segment(
    ri: np.ndarray,
    rf: np.ndarray,
    wk: np.ndarray,
    sc: np.ndarray,
    kv: Any,
    ss: Any,
    sp: Any,
    clock: np.ndarray,
    logs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    params: np.ndarray,
    timer_args: Any,
    now: float,
    stop_at: float,
    max_iterations: int,
) -> tuple[int, float]:
    """Run every event before ``stop_at`` (s): account for the iteration in flight when it ends, wake up, decide,
    start the next iteration or sleep; return when the next event is at ``stop_at`` or later (an iteration ending
    then stays in flight, a wake-up then stays pending: a router may route a request at ``stop_at`` first), when
    every request has ended (DONE), when nothing is left and a router may still route more (IDLE), after
    ``max_iterations`` iterations, or when a log is full. Returns (what ended it, the replica's clock). ``logs`` is
    ``(itl sums, itl histogram, itl gaps, iteration times, iteration counts, batch rows)``; a batch log without rows
    is not kept. ``kv`` is the KV cache (``sim.kernels.kvstate``), ``ss`` the conversations (``sim.compiled.state``),
    ``sp`` the speculative decoding (``speculation_arrays``).
    The iteration in flight and the wake-up time persist in ``sc`` and ``clock`` between calls."""
    itl_sums, itl_hist, itl_gaps, log_times, log_counts, batch_rows = logs
    iterations = 0
    while True:
        if sc[N_ITERS] - sc[LOG_BASE] >= log_times.shape[0]:
            return LOG_FULL, now  # before anything is logged: the caller grows the log and calls again
        if batch_rows.shape[0] > 0 and sc[N_BATCH_ROWS] + wk.shape[1] > batch_rows.shape[0]:
            return BATCH_LOG_FULL, now  # room for a batch of every request here, or the caller grows it
        if sc[IN_FLIGHT]:
            end = clock[FLIGHT_END]
            if end >= stop_at:
                return PAUSED, now
            complete(ri, rf, wk, sc, kv, ss, sp, clock[FLIGHT_START], end, itl_sums, itl_hist, itl_gaps, log_times,
                     log_counts, batch_rows)  # fmt: skip
            sc[IN_FLIGHT] = 0
            now = end
            iterations += 1
            if iterations >= max_iterations:
                return PAUSED, now
            continue
        if sc[SLEEPING]:
            wake = clock[WAKE]
            if wake == math.inf and sc[MORE] == 0:
                sc[SLEEPING] = 0  # its router has closed: nothing will wake it; decide once more, now
            elif wake >= stop_at:
                return (IDLE if wake == math.inf else PAUSED), now
            else:
                now = now + (wake - now)
                sc[SLEEPING] = 0
        # decide (sim.engine.decide)
        wake = now
        while True:
            receive_arrivals(ri, rf, wk, sc, kv, ss, now)
            if sc[UNFINISHED] == 0:
                return _nothing_left(sc, clock), now
            until = schedule(ri, rf, wk, sc, kv, ss, params, now)
            if sc[B_LEN] > 0:
                break
            if sc[UNFINISHED] == 0:
                return _nothing_left(sc, clock), now
            if until <= now:
                return BAD_WAIT, now
            wake = min(until, next_arrival(rf, wk, sc, ss))
            if wake == math.inf and sc[MORE] == 0:
                reject_stalled(ri, rf, wk, sc, kv, ss, now)
                return DONE, now
            if wake > now:
                break
        if sc[B_LEN] == 0:  # sleep until wake (inf: until a router hands this replica a request)
            sc[SLEEPING] = 1
            clock[WAKE] = wake
        else:  # start the batch; it is accounted for when it ends
            n_pf, n_dec, sampled, n_vf = build_shape(ri, wk, sc)
            duration = time_iteration(timer_args, wk, n_pf, n_dec, sampled, n_vf)
            if not duration > 0.0:
                return BAD_DURATION, now
            clock[FLIGHT_START] = now
            clock[FLIGHT_END] = now + duration
            sc[N_PF] = n_pf
            sc[N_DEC] = n_dec
            sc[N_VF] = n_vf
            sc[IN_FLIGHT] = 1


_RUNNERS: dict[tuple[Any, Any], Any] = {}


def segment_runner(policy_kernel: Any, cost_timer: Any) -> Any:
    """``run_segment`` compiled with ``schedule`` and ``timer`` bound to a policy kernel and a cost model's timer
    (numba dispatchers): ``run(ri, rf, wk, sc, kv, ss, clock, logs, params, timer_args, now, stop_at,
    max_iterations)``. Compiled once per pair and machine (numba's disk cache, keyed by the pair's names); loaded once
    per pair and process."""
    key = (policy_kernel, cost_timer)
    if key not in _RUNNERS:
        cache = cacheable(policy_kernel, cost_timer)
        timed = njit(cache=cache, **WITH_REFCOUNTS)(bound(time_iteration, _name_of(cost_timer), timer=cost_timer))
        name = f"{_name_of(policy_kernel)}__{_name_of(cost_timer)}"
        loop = bound(run_segment, name, schedule=policy_kernel, time_iteration=timed)
        _RUNNERS[key] = njit(cache=cache, **NO_REFCOUNTS)(loop)
    return _RUNNERS[key]


def loop_on_disk(policy_kernel: Any, cost_timer: Any) -> bool:
    """Whether numba's disk cache holds the loop of this pair, compiled before on this machine for this version of
    ferry's source (``costmodel.numba_cache``): loading it then costs ~0.06 s, where compiling it costs ~10-25 s."""
    return on_disk(segment_runner(policy_kernel, cost_timer))


def on_disk(runner: Any) -> bool:
    """Whether numba's disk cache holds a compiled copy of ``runner`` (a dispatcher). Reads its cache index only
    (numba's ``IndexDataCacheFile``, 0.68); anything unexpected there reads as absent."""
    try:
        return bool(runner._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 (numba's internals moved, or an unreadable index: compile as if absent)
        return False


def cacheable(*functions: Any) -> bool:
    """Whether a loop bound to ``functions`` may be kept on disk: numba keys a cached copy on the template's code and
    ferry's source (``costmodel.numba_cache``), not on what is bound, so a kernel or timer of the user's own (a
    test's, a script's) is compiled anew in each process."""
    return all(_module_of(fn).split(".")[0] in numba_cache.PACKAGES for fn in functions)


def bound(template: Callable[..., Any], suffix: str, **names: Any) -> Callable[..., Any]:
    """A copy of ``template`` whose globals ``names`` are bound to the given objects, named ``template__suffix`` (the
    name numba's disk cache files the compiled copy under, so every pair has its own entry)."""
    name = f"{template.__name__}__{suffix}"
    code = template.__code__.replace(co_name=name, co_qualname=name)
    copy = types.FunctionType(code, {**template.__globals__, **names}, name, template.__defaults__)
    copy.__doc__ = template.__doc__
    return copy


def _module_of(fn: Any) -> str:
    return str(getattr(getattr(fn, "py_func", fn), "__module__", ""))


def _name_of(fn: Any) -> str:
    """A dispatcher's Python function as ``module_qualname`` (what a cache file may be named with)."""
    py = getattr(fn, "py_func", fn)
    return f"{py.__module__}.{py.__qualname__}".replace(".", "_").replace("<", "").replace(">", "")


@kernel
def _nothing_left(sc: np.ndarray, clock: np.ndarray) -> int:
    """Every request here has ended: DONE, or IDLE (asleep until routed to) while a router may route more."""
    if sc[MORE] == 0:
        return DONE
    sc[SLEEPING] = 1
    clock[WAKE] = math.inf
    return IDLE


class CompiledReplica:
    """One replica's arrays for the compiled loop: its queues (``wk``), scalars (``sc``), clock and logs, over the
    request blocks (``ri``, ``rf``), which the replicas of a cluster share (a request belongs to one of them).

    A single replica's inbox is every request (``routed=False``), or with conversations (``sessions``: the turn before
    each request and the think times, ``Workload.after`` and ``think_s``) every first turn; a cluster's replica starts
    empty and is handed requests by its router (``route``), its columns growing as they come. The KV cache ``kv`` is
    the same object the reference engine would use (its arrays are the state)."""

    def __init__(
        self,
        ri: np.ndarray,
        rf: np.ndarray,
        kv: KVCacheManager,
        max_model_len: int,
        itl: ItlLog,
        record_batches: bool = False,
        routed: bool = False,
        capacity: int = 1024,
        sessions: tuple[np.ndarray, np.ndarray] | None = None,
        spec: Speculation | None = None,
    ) -> None:
        n = ri.shape[1]
        self.ri, self.rf, self.kv, self.itl = ri, rf, kv, itl
        self.wk = np.zeros((NUM_WK, max(capacity if routed else n, 1)), dtype=np.int64)
        self.sc = np.zeros(NUM_SCALARS, dtype=np.int64)
        self.sc[MAX_MODEL_LEN] = max_model_len
        self.spec = spec
        self.sp = speculation_arrays(spec)
        if spec is not None:  # what the policy kernels read
            self.sc[SPEC_K], self.sc[SPEC_LOOKAHEAD] = spec.num_speculative_tokens, spec.lookahead
            self.sc[SPEC_SLOTS], self.sc[SPEC_PAD] = spec.draft_slots, int(spec.pad)
        if not routed:
            self.wk[INBOX, :n] = np.arange(n)
            self.sc[ROUTED] = self.sc[UNFINISHED] = n
        self.sc[MORE] = int(routed)
        self.ss = NO_SESSIONS
        if sessions is not None:
            after, think = sessions
            first = first_turns(after)
            self.wk[INBOX, : len(first)] = first
            self.sc[ROUTED] = len(first)
            self.sc[SESSIONS] = 1
            self.ss = sessions_of(after, think)
        self.clock = np.zeros(3)
        self.now = 0.0
        # room for 8 iterations a request (each row's memory is taken when it is written, as np.zeros gives pages)
        self.log = IterationLog(capacity=max(1024, 8 * (capacity if routed else n)))
        self.batches = BatchLog(capacity=max(1024, 4 * self.wk.shape[1])) if record_batches else BatchLog(capacity=0)
        self.record_batches = record_batches
        self._logs: tuple[np.ndarray, ...] | None = None  # the log arrays as the loop takes them
        self._run: Any = None  # the loop compiled for the policy and timer last given to ``advance``
        self._policy: Any = None
        self._timer: Any = None

    def advance(self, policy: tuple[Any, np.ndarray], timer: tuple[Any, Any], stop_at: float,
                max_iterations: int = SEGMENT_ITERATIONS) -> int:  # fmt: skip
        """Run the loop until ``stop_at`` (or ``max_iterations`` iterations): DONE, IDLE or PAUSED. (A cluster
        calls this once or more per request and replica: the common case is a single call into the loop.)"""
        if self._run is None or self._policy is not policy or self._timer is not timer:
            self._run, self._policy, self._timer = segment_runner(policy[0], timer[0]), policy, timer
        run, params, args = self._run, policy[1], timer[1]
        while True:
            code, self.now = run(self.ri, self.rf, self.wk, self.sc, self.kv.arrays, self.ss, self.sp, self.clock,
                                 self.logs(), params, args, self.now, stop_at, max_iterations)  # fmt: skip
            if code == DONE or code == PAUSED or code == IDLE:
                return code
            self.handle(code)

    def logs(self) -> tuple[np.ndarray, ...]:
        """The log arrays as the loop takes them (built again only when a log has grown)."""
        logs = self._logs
        if logs is None or logs[2] is not self.itl.gaps:
            logs = self._logs = (self.itl.sums, self.itl.hist, self.itl.gaps, self.log.times, self.log.counts,
                                 self.batches.rows)  # fmt: skip
        return logs

    def handle(self, code: int) -> None:
        """What a segment that ended with ``code`` (not DONE, PAUSED or IDLE) asks for: a log grown, or an error."""
        self._logs = None
        if code == LOG_FULL:
            self.log.grow()
            self.sc[LOG_BASE] = self.log.base
        elif code == BATCH_LOG_FULL:
            self.batches.grow()
        elif code == BAD_WAIT:
            raise RuntimeError(f"the compiled policy asked to wait until a time not after {self.now}")
        else:
            raise RuntimeError(f"the cost model gave a non-positive iteration time at {self.now}")

    def state(self, policy: tuple[Any, np.ndarray], timer: tuple[Any, Any]) -> tuple[Any, ...]:
        """This replica's arrays as ``sim.compiled.cluster.route_arrivals`` takes them, with the policy's parameters
        and the timer's arguments: (wk, sc, kv, ss, sp, clock, logs, params, timer_args)."""
        return self.wk, self.sc, self.kv.arrays, self.ss, self.sp, self.clock, self.logs(), policy[1], timer[1]

    def next_event(self) -> float:
        """When this replica acts next (s): the end of its iteration in flight, its wake-up (inf: when routed to),
        or now (it stopped after a number of iterations)."""
        if self.sc[IN_FLIGHT]:
            return float(self.clock[FLIGHT_END])
        if self.sc[SLEEPING]:
            return float(self.clock[WAKE])
        return self.now

    def route(self, req: int) -> None:
        """Hand this replica request ``req``, arriving now (no earlier than those before it); a sleeping replica
        wakes at its arrival at the latest."""
        k = int(self.sc[ROUTED])
        if k == self.wk.shape[1]:
            self.grow()
        self.wk[INBOX, k] = req
        self.sc[ROUTED] = k + 1
        self.sc[UNFINISHED] += 1
        self.itl.reserve(max(int(self.ri[OUTPUT, req]) - 1, 0))
        if self.sc[SLEEPING]:
            self.clock[WAKE] = min(self.clock[WAKE], self.rf[ARRIVAL, req])

    def route_many(self, reqs: np.ndarray) -> None:
        """``route`` each of ``reqs`` (in arrival order), before the replica has run (it does not sleep yet)."""
        k, m = int(self.sc[ROUTED]), len(reqs)
        while k + m > self.wk.shape[1]:
            self.grow()
        self.wk[INBOX, k : k + m] = reqs
        self.sc[ROUTED] = k + m
        self.sc[UNFINISHED] += m
        self.itl.reserve(int(np.maximum(self.ri[OUTPUT, reqs] - 1, 0).sum()))

    def close(self) -> None:
        """No request will be routed here any more."""
        self.sc[MORE] = 0

    def grow(self) -> None:
        """Double the columns of ``wk``, unrolling the waiting queue's ring to the front."""
        old, n = self.wk, self.wk.shape[1]
        wk = np.zeros((NUM_WK, 2 * n), dtype=np.int64)
        wk[:, :n] = old
        head, length = int(self.sc[W_HEAD]), int(self.sc[W_LEN])
        wk[WAITING_Q, :length] = old[WAITING_Q, (head + np.arange(length)) % n]
        self.sc[W_HEAD] = 0
        self.wk = wk

    def load(self, reads: tuple[str, ...]) -> tuple[int, int, int]:
        """What a router sees: unfinished requests, tokens of work left (0 unless ``reads`` has "work_left", which
        walks the queues), KV blocks in use."""
        work = int(work_left(self.ri, self.wk, self.sc)) if "work_left" in reads else 0
        return int(self.sc[UNFINISHED]), work, self.kv.used

    def run_records(self, requests: RequestTable) -> RunRecords:
        """This replica's records over ``requests`` (the table the blocks were packed from)."""
        self.log.n = int(self.sc[N_ITERS])
        self.batches.n = int(self.sc[N_BATCH_ROWS])
        return RunRecords(
            requests=requests,
            itl=self.itl,
            iterations=self.log,
            kv_num_blocks=self.kv.num_blocks,
            kv_block_size=self.kv.block_size,
            engine="compiled",
            batches=self.batches if self.record_batches else None,
            prefix_cache=self.kv.counters() if isinstance(self.kv, PrefixCachingKV) else None,
            speculation=self.sp[2] if self.spec is not None else None,
        )


def simulate_compiled(
    requests: RequestTable,
    policy: tuple[Any, np.ndarray],
    timer: tuple[Any, Any],
    kv: KVCacheManager,
    max_model_len: int,
    exact_itl: bool | None = None,
    on_segment: Callable[[float, int], None] | None = None,
    record_batches: bool = False,
    spec: Speculation | None = None,
) -> RunRecords:
    """``sim.engine.simulate`` on the compiled loop: ``policy`` is a compiled policy's ``(kernel, params)`` and
    ``timer`` a cost model's ``compiled()`` pair. SimPy keeps the time: one timeout per segment of
    ``SEGMENT_ITERATIONS`` iterations, where ``on_segment(now, unfinished)`` is called."""
    ri, rf = pack(requests)
    sessions = None
    if requests.after is not None:
        assert requests.think is not None
        sessions = (requests.after, requests.think)
    replica = CompiledReplica(ri, rf, kv, max_model_len, ItlLog(max_gaps(requests), exact_itl), record_batches,
                              sessions=sessions, spec=spec)  # fmt: skip
    env = simpy.Environment()

    def process() -> Generator[simpy.Event, Any, None]:
        while True:
            code = replica.advance(policy, timer, math.inf)
            if replica.now > env.now:
                yield env.timeout(replica.now - env.now)
            if on_segment is not None:
                on_segment(replica.now, int(replica.sc[UNFINISHED]))
            if code == DONE:
                return

    env.process(process())
    env.run()
    unpack(ri, rf, requests)
    return replica.run_records(requests)
