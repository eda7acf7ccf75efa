"""The batch being built and the accounting after it ran: the compiled twins of ``policies.base.BatchBuilder`` and
of ``SchedulerState.shape_of`` / ``complete``, over ``sim.compiled.state``'s arrays (same order, same records; the KV
cache's and the conversations' steps are the very kernels the reference engine runs)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from sim.compiled import kv as kvc
from sim.compiled.jit import kernel
from sim.compiled.kvstate import CACHING, USED
from sim.compiled.sessions import release_turns
from sim.compiled.state import (
    ARRIVAL,
    B_CACHED,
    B_HOLD,
    B_LEN,
    BATCH_IDS,
    BATCH_NEW,
    BATCH_NO,
    COMPUTED,
    DEC_CTX,
    FINISH,
    FINISHED,
    FIRST_SCHEDULED,
    FIRST_TOKEN,
    GENERATED,
    HELD_DONE,
    LAST_TOKEN,
    LOG_BASE,
    N_BATCH_ROWS,
    N_ITERS,
    NUM_HELD,
    OUTPUT,
    PF_CTX,
    PF_NEW,
    PREEMPTED_SINCE,
    PROMPT,
    R_LEN,
    RELEASED,
    RUNNING_Q,
    SESSIONS,
    SHAPE_CTX,
    SHAPE_PF_TOKENS,
    STAMP,
    STATUS,
    UNFINISHED,
    W_LEN,
    is_prefilling,
)
from sim.records import tally, tally_end, tally_start

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


# ---- the batch being built (BatchBuilder) ----------------------------------------------------------------------------


@kernel
def batch_start(sc: IntArray) -> None:
    sc[B_LEN] = 0
    sc[B_HOLD] = 0
    sc[B_CACHED] = 0
    sc[BATCH_NO] += 1


@kernel
def batch_add(ri: IntArray, wk: IntArray, sc: IntArray, req: int, tokens: int) -> None:
    k = sc[B_LEN]
    wk[BATCH_IDS, k] = req
    wk[BATCH_NEW, k] = tokens
    ri[STAMP, req] = sc[BATCH_NO]
    sc[B_LEN] = k + 1


@kernel
def in_batch(ri: IntArray, sc: IntArray, req: int) -> bool:
    return ri[STAMP, req] == sc[BATCH_NO]


# ---- after the iteration (SchedulerState.shape_of and complete) ------------------------------------------------------


@kernel
def build_shape(ri: IntArray, wk: IntArray, sc: IntArray) -> tuple[int, int, int]:
    """Fill the shape rows from the batch, and its totals (``sc[SHAPE_CTX]``, ``sc[SHAPE_PF_TOKENS]``, for the log);
    returns (prefill chunks, decodes, prefill chunks that sample)."""
    n_pf = 0
    n_dec = 0
    sampled = 0
    context = 0
    pf_tokens = 0
    for k in range(sc[B_LEN]):
        req = wk[BATCH_IDS, k]
        ctx = ri[COMPUTED, req]
        context += ctx
        if is_prefilling(ri, req):
            wk[PF_NEW, n_pf] = wk[BATCH_NEW, k]
            wk[PF_CTX, n_pf] = ctx
            pf_tokens += wk[BATCH_NEW, k]
            n_pf += 1
            if ctx + wk[BATCH_NEW, k] == ri[PROMPT, req] + ri[GENERATED, req]:
                sampled += 1
        else:
            wk[DEC_CTX, n_dec] = ctx
            n_dec += 1
    sc[SHAPE_CTX] = context
    sc[SHAPE_PF_TOKENS] = pf_tokens
    return n_pf, n_dec, sampled


@kernel
def complete(
    ri: IntArray,
    rf: FloatArray,
    wk: IntArray,
    sc: IntArray,
    kv,  # noqa: ANN001
    ss,  # noqa: ANN001
    n_pf: int,
    n_dec: int,
    start: float,
    end: float,
    itl_sums: FloatArray,
    itl_hist: IntArray,
    itl_gaps: FloatArray,
    log_times: FloatArray,
    log_counts: npt.NDArray[np.int32],
    batch_rows: IntArray,
) -> None:
    """Account for the batch that ran from ``start`` to ``end`` and log it (the logs have room: the loop checks);
    ``batch_rows`` (``sim.records.BATCH_COLUMNS``) gets the batch's members unless it has no rows at all."""
    iteration = sc[N_ITERS]
    row = iteration - sc[LOG_BASE]  # in the log's chunk being written
    nb = sc[B_LEN]
    if batch_rows.shape[0] > 0:
        m = sc[N_BATCH_ROWS]
        for k in range(nb):
            req = wk[BATCH_IDS, k]
            batch_rows[m, 0] = iteration
            batch_rows[m, 1] = req
            batch_rows[m, 2] = wk[BATCH_NEW, k]
            batch_rows[m, 3] = ri[COMPUTED, req]
            batch_rows[m, 4] = 1 if is_prefilling(ri, req) else 0
            m += 1
        sc[N_BATCH_ROWS] = m
    caching = kv[1][CACHING] != 0
    for k in range(nb if caching else 0):  # every member's tokens first: a prefix cache caches what they filled
        req = wk[BATCH_IDS, k]
        if math.isnan(rf[FIRST_SCHEDULED, req]):
            rf[FIRST_SCHEDULED, req] = start
        ri[COMPUTED, req] += wk[BATCH_NEW, k]
        kvc.register(kv, req, ri[COMPUTED, req])
    done = 0
    seats = sc[R_LEN]
    held = sc[NUM_HELD]
    kv_used = kv[1][USED]
    hold = sc[B_HOLD] != 0
    gaps = tally_start(itl_sums)
    for k in range(nb):
        req = wk[BATCH_IDS, k]
        if not caching:  # else done above
            if math.isnan(rf[FIRST_SCHEDULED, req]):
                rf[FIRST_SCHEDULED, req] = start
            ri[COMPUTED, req] += wk[BATCH_NEW, k]
        if ri[COMPUTED, req] != ri[PROMPT, req] + ri[GENERATED, req]:
            continue
        if ri[GENERATED, req] == 0:
            rf[FIRST_TOKEN, req] = end
        else:
            gaps = tally(gaps, end - rf[LAST_TOKEN, req], itl_hist, itl_gaps)
        ri[GENERATED, req] += 1
        rf[LAST_TOKEN, req] = end
        if ri[GENERATED, req] >= ri[OUTPUT, req]:
            rf[FINISH, req] = end
            done += 1
            if hold:
                ri[STATUS, req] = HELD_DONE
            else:
                ri[STATUS, req] = FINISHED
                rf[RELEASED, req] = end
                kvc.free(kv, req)
                if sc[SESSIONS]:
                    release_turns(ss, rf[ARRIVAL], req, end)
    tally_end(gaps, itl_sums, itl_hist)
    if done:
        if hold:
            sc[NUM_HELD] += done
        else:
            k = 0
            for j in range(sc[R_LEN]):
                r = wk[RUNNING_Q, j]
                if ri[STATUS, r] != FINISHED:
                    wk[RUNNING_Q, k] = r
                    k += 1
            sc[R_LEN] = k
            sc[UNFINISHED] -= done
    log_times[row, 0] = start
    log_times[row, 1] = end
    log_counts[row, 0] = n_pf
    log_counts[row, 1] = sc[SHAPE_PF_TOKENS]
    log_counts[row, 2] = n_dec
    log_counts[row, 3] = sc[SHAPE_CTX]
    log_counts[row, 4] = kv_used
    log_counts[row, 5] = seats
    log_counts[row, 6] = held
    log_counts[row, 7] = sc[W_LEN]
    log_counts[row, 8] = sc[PREEMPTED_SINCE]
    log_counts[row, 9] = done
    sc[PREEMPTED_SINCE] = 0
    sc[N_ITERS] = iteration + 1
