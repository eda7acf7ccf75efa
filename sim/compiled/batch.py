"""The batch being built and the accounting after it ran: the compiled twins of ``policies.base.BatchBuilder`` and
of ``SchedulerState.shape_of`` / ``complete``, over ``sim.compiled.state``'s arrays (same order, same records; the KV
cache's and the conversations' steps are the very kernels the reference engine runs)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from sim.compiled.state import (
    ACCEPTED_TOKENS,
    ARRIVAL,
    B_CACHED,
    B_HOLD,
    B_LEN,
    B_RUNNING,
    B_RUNNING_PREFILL,
    BATCH_IDS,
    BATCH_NEW,
    BATCH_NO,
    BATCH_VERIFIED,
    COMPUTED,
    DEC_CTX,
    DRAFT_TOKENS,
    DRAFTS,
    FINISH,
    FINISHED,
    FIRST_SCHEDULED,
    FIRST_TOKEN,
    GENERATED,
    HELD_DONE,
    LAST_TOKEN,
    LOG_BASE,
    LOG_DEC,
    LOG_PF,
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
    VF_CTX,
    VF_NEW,
    W_LEN,
    is_prefilling,
    remaining,
)
from sim.kernels import kv as kvc
from sim.kernels.jit import kernel
from sim.kernels.kvstate import CACHING, USED
from sim.kernels.sessions import release_turns
from sim.kernels.speculation import accepted
from sim.records import tally, tally_end, tally_start
from sim.speculation import NUM_DRAFTS, SEED, SP_HEAD

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


# ---- the batch being built (BatchBuilder) ----------------------------------------------------------------------------


@kernel
def batch_start(sc: IntArray) -> None:
    sc[B_LEN] = 0
    sc[B_HOLD] = 0
    sc[B_CACHED] = 0
    sc[B_RUNNING] = 0
    sc[B_RUNNING_PREFILL] = 0
    sc[BATCH_NO] += 1


@kernel
def end_running_pass(ri: IntArray, wk: IntArray, sc: IntArray) -> None:
    """``BatchBuilder.end_running_pass``."""
    sc[B_RUNNING] = sc[B_LEN]
    for k in range(sc[B_LEN]):
        if is_prefilling(ri, wk[BATCH_IDS, k]):
            sc[B_RUNNING_PREFILL] = 1


@kernel
def batch_add(ri: IntArray, wk: IntArray, sc: IntArray, req: int, tokens: int) -> None:
    batch_add_verified(ri, wk, sc, req, tokens, tokens)


@kernel
def batch_add_verified(ri: IntArray, wk: IntArray, sc: IntArray, req: int, tokens: int, verified: int) -> None:
    """``BatchBuilder.add``: ``req`` computes ``tokens``, of which ``verified`` are not draft tokens."""
    k = sc[B_LEN]
    wk[BATCH_IDS, k] = req
    wk[BATCH_NEW, k] = tokens
    wk[BATCH_VERIFIED, k] = verified
    ri[STAMP, req] = sc[BATCH_NO]
    sc[B_LEN] = k + 1


@kernel
def in_batch(ri: IntArray, sc: IntArray, req: int) -> bool:
    return ri[STAMP, req] == sc[BATCH_NO]


# ---- after the iteration (SchedulerState.shape_of and complete) ------------------------------------------------------


@kernel
def build_shape(ri: IntArray, wk: IntArray, sc: IntArray) -> tuple[int, int, int, int]:
    """``SchedulerState.shape_of``: fill the shape rows from the batch, and its totals for the log (``sc[SHAPE_CTX]``,
    ``SHAPE_PF_TOKENS``, ``LOG_PF``, ``LOG_DEC``); returns (prefill chunks, decodes, prefill chunks that sample,
    verified sequences)."""
    n_pf = 0
    n_dec = 0
    n_vf = 0
    log_pf = 0
    sampled = 0
    context = 0
    pf_tokens = 0
    for k in range(sc[B_LEN]):
        req = wk[BATCH_IDS, k]
        ctx = ri[COMPUTED, req]
        new = wk[BATCH_NEW, k]
        need = remaining(ri, req)
        context += ctx
        prefilling = is_prefilling(ri, req)
        if prefilling:
            pf_tokens += min(new, need)
            log_pf += 1
        if new > need:  # verified with its draft tokens (or placeholders)
            wk[VF_NEW, n_vf] = new
            wk[VF_CTX, n_vf] = ctx
            n_vf += 1
        elif prefilling:
            wk[PF_NEW, n_pf] = new
            wk[PF_CTX, n_pf] = ctx
            n_pf += 1
            if ctx + new == ri[PROMPT, req] + ri[GENERATED, req]:
                sampled += 1
        else:
            wk[DEC_CTX, n_dec] = ctx
            n_dec += 1
    sc[SHAPE_CTX] = context
    sc[SHAPE_PF_TOKENS] = pf_tokens
    sc[LOG_PF] = log_pf
    sc[LOG_DEC] = sc[B_LEN] - log_pf
    return n_pf, n_dec, sampled, n_vf


@kernel
def complete(
    ri: IntArray,
    rf: FloatArray,
    wk: IntArray,
    sc: IntArray,
    kv,  # noqa: ANN001
    ss,  # noqa: ANN001
    sp,  # noqa: ANN001
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
    ``batch_rows`` (``sim.records.BATCH_COLUMNS``) gets the batch's members unless it has no rows at all. ``sp`` is
    the replica's speculative decoding (``sim.speculation``: its ``array``, its conditional rates, its counters)."""
    iteration = sc[N_ITERS]
    row = iteration - sc[LOG_BASE]  # in the log's chunk being written
    nb = sc[B_LEN]
    spec, rates, counters = sp
    if batch_rows.shape[0] > 0:
        m = sc[N_BATCH_ROWS]
        for k in range(nb):
            req = wk[BATCH_IDS, k]
            drafts = max(wk[BATCH_NEW, k] - remaining(ri, req), 0)
            batch_rows[m, 0] = iteration
            batch_rows[m, 1] = req
            batch_rows[m, 2] = wk[BATCH_NEW, k]
            batch_rows[m, 3] = ri[COMPUTED, req]
            batch_rows[m, 4] = 1 if is_prefilling(ri, req) else 0
            batch_rows[m, 5] = drafts
            batch_rows[m, 6] = _accepted(ri, spec, rates, req, drafts)
            m += 1
        sc[N_BATCH_ROWS] = m
    caching = kv[1][CACHING] != 0
    for k in range(nb if caching else 0):  # every member's tokens first: a prefix cache caches what they filled
        req = wk[BATCH_IDS, k]
        if math.isnan(rf[FIRST_SCHEDULED, req]):
            rf[FIRST_SCHEDULED, req] = start
        ri[COMPUTED, req] += wk[BATCH_NEW, k]
        # the verified tokens only (vLLM caches no draft token)
        kvc.register(kv, req, min(ri[COMPUTED, req], ri[PROMPT, req] + ri[GENERATED, req]))
    drafted = 0
    took = 0
    after = spec[SP_HEAD + min(nb, spec.shape[0] - SP_HEAD - 1)]  # drafts proposed after this step
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
        total = ri[PROMPT, req] + ri[GENERATED, req]
        if ri[COMPUTED, req] < total:
            ri[DRAFTS, req] = 0
            continue
        made = 1
        drafts = ri[COMPUTED, req] - total
        if drafts > 0:  # the rejected drafts rolled back; the accepted ones and one more appended
            a = _accepted(ri, spec, rates, req, drafts)
            ri[COMPUTED, req] -= drafts - a
            made = min(a + 1, ri[OUTPUT, req] - ri[GENERATED, req])
            ri[DRAFT_TOKENS, req] += drafts
            ri[ACCEPTED_TOKENS, req] += a
            drafted += drafts
            took += a
            counters[NUM_DRAFTS] += 1
            for j in range(a):
                counters[1 + j] += 1
        if ri[GENERATED, req] == 0:
            rf[FIRST_TOKEN, req] = end
        else:  # one gap a step (the tokens of a step come as one chunk)
            gaps = tally(gaps, end - rf[LAST_TOKEN, req], itl_hist, itl_gaps)
        ri[GENERATED, req] += made
        rf[LAST_TOKEN, req] = end
        ri[DRAFTS, req] = after  # proposed by the drafter (0 without speculation; cleared below if it is done)
        if ri[GENERATED, req] >= ri[OUTPUT, req]:
            ri[DRAFTS, req] = 0
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
    log_counts[row, 0] = sc[LOG_PF]
    log_counts[row, 1] = sc[SHAPE_PF_TOKENS]
    log_counts[row, 2] = sc[LOG_DEC]
    log_counts[row, 3] = sc[SHAPE_CTX]
    log_counts[row, 4] = kv_used
    log_counts[row, 5] = seats
    log_counts[row, 6] = held
    log_counts[row, 7] = sc[W_LEN]
    log_counts[row, 8] = sc[PREEMPTED_SINCE]
    log_counts[row, 9] = done
    log_counts[row, 10] = drafted
    log_counts[row, 11] = took
    sc[PREEMPTED_SINCE] = 0
    sc[N_ITERS] = iteration + 1


@kernel
def _accepted(ri: IntArray, spec: IntArray, rates: FloatArray, req: int, drafts: int) -> int:
    """``SchedulerState._verify`` for one request: the drafts it accepts of ``drafts`` scheduled (none of
    placeholders, scheduled to a request that had no drafts)."""
    if drafts <= 0 or ri[DRAFTS, req] <= 0:
        return 0
    return accepted(rates, spec[SEED], req, ri[GENERATED, req], drafts)
