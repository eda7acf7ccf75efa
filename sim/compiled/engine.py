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
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import simpy
from numba import njit

from sim.compiled.batch import build_shape, complete
from sim.compiled.state import (
    B_LEN,
    BLOCK_SIZE,
    DEC_CTX,
    MAX_MODEL_LEN,
    N_BATCH_ROWS,
    N_ITERS,
    NUM_BLOCKS,
    NUM_SCALARS,
    NUM_WK,
    PF_CTX,
    PF_NEW,
    UNFINISHED,
    USED,
    WATERMARK,
    next_arrival,
    pack,
    receive_arrivals,
    reject_stalled,
    unpack,
)
from sim.kvcache import KVCacheManager
from sim.records import BatchLog, IterationLog, ItlLog, RunRecords
from sim.request import RequestTable
from sim.state import max_gaps

# what a segment ended with
DONE, PAUSED, LOG_FULL, BAD_WAIT, BAD_DURATION, BATCH_LOG_FULL = range(6)
SEGMENT_ITERATIONS = 200_000


# Not cached: it takes the policy and the timer as function arguments, and numba's cache cannot key on those (each
# process compiles it once per policy and timer, ~2 s; everything it calls is cached).
@njit
def run_segment(
    ri: np.ndarray,
    rf: np.ndarray,
    wk: np.ndarray,
    sc: np.ndarray,
    logs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    schedule: Any,
    params: np.ndarray,
    timer: Any,
    timer_args: Any,
    now: float,
    stop_at: float,
    max_iterations: int,
) -> tuple[int, float]:
    """Run from ``now`` until every request has ended, or the clock reaches ``stop_at``, or ``max_iterations``
    iterations have run, or the iteration log is full. Returns (what ended it, the clock). ``logs`` is
    ``(itl sums, itl histogram, itl gaps, iteration times, iteration counts, batch rows)``; a batch log without rows
    is not kept."""
    itl_sums, itl_hist, itl_gaps, log_times, log_counts, batch_rows = logs
    iterations = 0
    while True:
        if sc[N_ITERS] >= log_times.shape[0]:
            return LOG_FULL, now  # before deciding anything: the caller grows the log and calls again
        if batch_rows.shape[0] > 0 and sc[N_BATCH_ROWS] + ri.shape[1] > batch_rows.shape[0]:
            return BATCH_LOG_FULL, now  # room for a batch of every request, or the caller grows it
        wake = now
        # decide (sim.engine.decide)
        while True:
            receive_arrivals(ri, rf, wk, sc, now)
            if sc[UNFINISHED] == 0:
                return DONE, now
            until = schedule(ri, rf, wk, sc, params, now)
            if sc[B_LEN] > 0:
                break
            if sc[UNFINISHED] == 0:
                return DONE, now
            if until <= now:
                return BAD_WAIT, now
            wake = min(until, next_arrival(rf, sc))
            if wake == math.inf:
                reject_stalled(ri, wk, sc)
                return DONE, now
            if wake > now:
                break
        if sc[B_LEN] == 0:  # sleep until wake
            now = now + (wake - now)
        else:  # run the batch
            n_pf, n_dec, sampled = build_shape(ri, wk, sc)
            duration = timer(timer_args, wk[PF_NEW, :n_pf], wk[PF_CTX, :n_pf], wk[DEC_CTX, :n_dec], sampled)
            if not duration > 0.0:
                return BAD_DURATION, now
            end = now + duration
            complete(
                ri, rf, wk, sc, n_pf, n_dec, now, end, itl_sums, itl_hist, itl_gaps, log_times, log_counts, batch_rows
            )
            now = end
            iterations += 1
        if now >= stop_at or iterations >= max_iterations:
            return PAUSED, now


class CompiledRun:
    """The arrays of one compiled run, and the SimPy process that drives the loop over them."""

    def __init__(
        self, requests: RequestTable, kv: KVCacheManager, max_model_len: int, itl: ItlLog, record_batches: bool = False
    ) -> None:
        n = len(requests)
        self.requests, self.kv, self.itl = requests, kv, itl
        self.ri, self.rf = pack(requests, kv.held)
        self.wk = np.zeros((NUM_WK, max(n, 1)), dtype=np.int64)
        self.sc = np.zeros(NUM_SCALARS, dtype=np.int64)
        self.sc[NUM_BLOCKS], self.sc[BLOCK_SIZE], self.sc[WATERMARK] = kv.num_blocks, kv.block_size, kv.watermark_blocks
        self.sc[MAX_MODEL_LEN], self.sc[UNFINISHED] = max_model_len, n
        self.log = IterationLog(capacity=max(1024, 2 * n))
        self.batches = BatchLog(capacity=max(1024, 4 * n)) if record_batches else BatchLog(capacity=0)
        self.record_batches = record_batches

    def process(
        self,
        env: simpy.Environment,
        policy: tuple[Any, np.ndarray],
        timer: tuple[Any, Any],
        on_segment: Callable[[float, int], None] | None = None,
    ) -> Generator[simpy.Event, Any, None]:
        """The replica process on the compiled loop: one SimPy timeout per segment. The loop's clock is the run's
        clock; SimPy's follows it."""
        schedule, params = policy
        fn, args = timer
        now = float(env.now)
        while True:
            logs = (self.itl.sums, self.itl.hist, self.itl.gaps, self.log.times, self.log.counts, self.batches.rows)
            code, now = run_segment(
                self.ri, self.rf, self.wk, self.sc, logs, schedule, params, fn, args, now, math.inf, SEGMENT_ITERATIONS
            )
            if code == LOG_FULL:
                self.log.grow()
            elif code == BATCH_LOG_FULL:
                self.batches.grow()
            elif code == BAD_WAIT:
                raise RuntimeError(f"the compiled policy asked to wait until a time not after {now}")
            elif code == BAD_DURATION:
                raise RuntimeError(f"the cost model gave a non-positive iteration time at {now}")
            if now > env.now:
                yield env.timeout(now - env.now)
            if on_segment is not None:
                on_segment(now, int(self.sc[UNFINISHED]))
            if code == DONE:
                return

    def records(self) -> RunRecords:
        unpack(self.ri, self.rf, self.requests, self.kv.held)
        self.kv.used = int(self.sc[USED])
        self.log.n = int(self.sc[N_ITERS])
        self.batches.n = int(self.sc[N_BATCH_ROWS])
        return RunRecords(
            requests=self.requests,
            itl=self.itl,
            iterations=self.log,
            kv_num_blocks=self.kv.num_blocks,
            kv_block_size=self.kv.block_size,
            engine="compiled",
            batches=self.batches if self.record_batches else None,
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
) -> RunRecords:
    """``sim.engine.simulate`` on the compiled loop: ``policy`` is a compiled policy's ``(kernel, params)`` and
    ``timer`` a cost model's ``compiled()`` pair."""
    run = CompiledRun(requests, kv, max_model_len, ItlLog(max_gaps(requests), exact_itl), record_batches)
    env = simpy.Environment()
    env.process(run.process(env, policy, timer, on_segment))
    env.run()
    return run.records()
