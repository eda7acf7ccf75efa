"""The compiled engine: the reference engine's loop (``sim.engine``), compiled with numba, for built-in policies.

The loop is ``sim.engine.decide`` plus the SimPy process around it, over ``sim.fast_state``'s arrays: receive
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
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy
from numba import njit

from sim.fast_state import (
    B_LEN,
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    N_ITERS,
    NUM_BLOCKS,
    NUM_SCALARS,
    UNFINISHED,
    WATERMARK,
    FastState,
    build_shape,
    complete,
    next_arrival,
    receive_arrivals,
    reject_stalled,
)
from sim.kvcache import KVCacheManager
from sim.records import IterationLog, ItlLog, RunRecords
from sim.request import RequestTable
from sim.state import max_gaps

# what a segment ended with
DONE, PAUSED, LOG_FULL, BAD_WAIT, BAD_DURATION = range(5)
SEGMENT_ITERATIONS = 200_000


@njit(cache=True)
def run_segment(
    st: FastState,
    schedule: Any,
    params: np.ndarray,
    timer: Any,
    timer_args: Any,
    now: float,
    stop_at: float,
    max_iterations: int,
) -> tuple[int, float]:
    """Run from ``now`` until every request has ended, or the clock reaches ``stop_at``, or ``max_iterations``
    iterations have run, or the iteration log is full. Returns (what ended it, the clock)."""
    iterations = 0
    while True:
        if st.sc[N_ITERS] >= st.log_times.shape[0]:
            return LOG_FULL, now  # before deciding anything: the caller grows the log and calls again
        wake = now
        # decide (sim.engine.decide)
        while True:
            receive_arrivals(st, now)
            if st.sc[UNFINISHED] == 0:
                return DONE, now
            until = schedule(st, params, now)
            if st.sc[B_LEN] > 0:
                break
            if st.sc[UNFINISHED] == 0:
                return DONE, now
            if until <= now:
                return BAD_WAIT, now
            wake = min(until, next_arrival(st))
            if wake == math.inf:
                reject_stalled(st)
                return DONE, now
            if wake > now:
                break
        if st.sc[B_LEN] == 0:  # sleep until wake
            now = now + (wake - now)
        else:  # run the batch
            n_pf, n_dec, sampled = build_shape(st)
            duration = timer(timer_args, st.pf_new[:n_pf], st.pf_ctx[:n_pf], st.dec_ctx[:n_dec], sampled)
            if not duration > 0.0:
                return BAD_DURATION, now
            end = now + duration
            complete(st, n_pf, n_dec, now, end)
            now = end
            iterations += 1
        if now >= stop_at or iterations >= max_iterations:
            return PAUSED, now


def make_state(requests: RequestTable, kv: KVCacheManager, max_model_len: int, itl: ItlLog) -> FastState:
    n = len(requests)
    sc = np.zeros(NUM_SCALARS, dtype=np.int64)
    sc[NUM_BLOCKS], sc[BLOCK_SIZE], sc[WATERMARK] = kv.num_blocks, kv.block_size, kv.watermark_blocks
    sc[MAX_MODEL_LEN], sc[UNFINISHED] = max_model_len, n
    log = IterationLog(capacity=max(1024, 2 * n))
    ints = lambda: np.zeros(max(n, 1), dtype=np.int64)  # noqa: E731
    return FastState(
        requests.arrival,
        requests.prompt,
        requests.output_wanted,
        requests.computed,
        requests.generated,
        requests.status,
        requests.reason,
        requests.preemptions,
        requests.recomputed,
        requests.admit_order,
        requests.first_scheduled,
        requests.first_token,
        requests.last_token,
        requests.finish,
        requests.response,
        kv.held,
        ints(),  # waiting
        ints(),  # running
        ints(),  # batch_ids
        ints(),  # batch_new
        np.full(max(n, 1), -1, dtype=np.int64),  # stamp
        ints(),  # scratch
        ints(),  # pf_new
        ints(),  # pf_ctx
        ints(),  # dec_ctx
        sc,
        itl.sums,
        itl.hist,
        itl.gaps,
        log.times,
        log.counts,
    )


def compiled_replica(
    env: simpy.Environment,
    st: FastState,
    policy: tuple[Any, np.ndarray],
    timer: tuple[Any, Any],
    on_segment: Callable[[float], None] | None = None,
) -> Generator[simpy.Event, Any, FastState]:
    """The replica process on the compiled loop: one SimPy timeout per segment. The loop's clock is the run's
    clock (SimPy's follows it); returns the final state (a grown log replaces the arrays)."""
    schedule, params = policy
    fn, args = timer
    now = float(env.now)
    while True:
        code, now = run_segment(st, schedule, params, fn, args, now, math.inf, SEGMENT_ITERATIONS)
        if code == LOG_FULL:
            st = _grow_log(st)
        elif code == BAD_WAIT:
            raise RuntimeError(f"the compiled policy asked to wait until a time not after {now}")
        elif code == BAD_DURATION:
            raise RuntimeError(f"the cost model gave a non-positive iteration time at {now}")
        if now > env.now:
            yield env.timeout(now - env.now)
        if on_segment is not None:
            on_segment(now)
        if code == DONE:
            return st


def _grow_log(st: FastState) -> FastState:
    log = IterationLog.from_arrays(st.log_times, st.log_counts, int(st.sc[N_ITERS]))
    log.grow()
    return st._replace(log_times=log.times, log_counts=log.counts)


def simulate_compiled(
    requests: RequestTable,
    policy: tuple[Any, np.ndarray],
    timer: tuple[Any, Any],
    kv: KVCacheManager,
    max_model_len: int,
    exact_itl: bool | None = None,
    on_segment: Callable[[float], None] | None = None,
) -> RunRecords:
    """``sim.engine.simulate`` on the compiled loop: ``policy`` is a compiled policy's ``(kernel, params)`` and
    ``timer`` a cost model's ``compiled()`` pair."""
    itl = ItlLog(max_gaps(requests), exact_itl)
    st = make_state(requests, kv, max_model_len, itl)
    env = simpy.Environment()
    process = env.process(compiled_replica(env, st, policy, timer, on_segment))
    env.run()
    st = process.value  # type: ignore[assignment]
    kv.used = int(st.sc[0])  # USED
    iterations = IterationLog.from_arrays(st.log_times, st.log_counts, int(st.sc[N_ITERS]))
    return RunRecords(
        requests=requests,
        itl=itl,
        iterations=iterations,
        kv_num_blocks=kv.num_blocks,
        kv_block_size=kv.block_size,
        engine="compiled",
    )
