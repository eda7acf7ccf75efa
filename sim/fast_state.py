"""The scheduler state as flat arrays, and its operations compiled with numba: the compiled engine's twin of
``sim.state`` and ``sim.kvcache``.

Every function here mirrors a method of ``SchedulerState`` or ``KVCacheManager`` step for step (same order, same
tie-breaks), so that a compiled policy (``policies.compiled``) on this state makes the very decisions its Python class
makes on ``SchedulerState``; tests run both and compare the records to the last bit. The request columns are the
``RequestTable``'s own arrays, written in place.

The waiting queue is a ring buffer of request ids (FCFS; preempted requests go back to the front), the running set an
array in admission order. Scalars live in ``sc`` (int64) at the indices named below.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from numba import njit

from sim.records import add_gap
from sim.request import Reason, Status

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# indices into FastState.sc
USED, NUM_BLOCKS, BLOCK_SIZE, WATERMARK, W_HEAD, W_LEN, R_LEN, ARRIVED = range(8)
ADMISSIONS, UNFINISHED, NUM_HELD, PREEMPTED_SINCE, B_LEN, B_HOLD, STAMP, MAX_MODEL_LEN, N_ITERS = range(8, 17)
NUM_SCALARS = 17

PENDING, WAITING, RUNNING, HELD, FINISHED, REJECTED = (int(s) for s in Status)
EMPTY, EXCEEDS_MAX_MODEL_LEN, EXCEEDS_KV_CACHE, STALLED = (
    int(Reason.EMPTY),
    int(Reason.EXCEEDS_MAX_MODEL_LEN),
    int(Reason.EXCEEDS_KV_CACHE),
    int(Reason.STALLED),
)


class FastState(NamedTuple):
    """Everything the compiled engine and compiled policies read and write."""

    # request columns (the RequestTable's arrays)
    arrival: FloatArray
    prompt: IntArray
    output_wanted: IntArray
    computed: IntArray
    generated: IntArray
    status: npt.NDArray[np.int8]
    reason: npt.NDArray[np.int8]
    preemptions: npt.NDArray[np.int32]
    recomputed: IntArray
    admit_order: IntArray
    first_scheduled: FloatArray
    first_token: FloatArray
    last_token: FloatArray
    finish: FloatArray
    response: FloatArray
    held: IntArray  # KV blocks each request holds
    waiting: IntArray  # ring buffer of request ids
    running: IntArray  # request ids in admission order, R_LEN of them
    batch_ids: IntArray  # the batch being built: request ids ...
    batch_new: IntArray  # ... and the tokens each computes
    stamp: IntArray  # per request: the STAMP of the batch it was last scheduled into
    scratch: IntArray  # working space for policies (n entries)
    pf_new: IntArray  # the iteration's shape: prefill chunks' new tokens ...
    pf_ctx: IntArray  # ... and cached tokens before them ...
    dec_ctx: IntArray  # ... and the decodes' cached tokens
    sc: IntArray  # scalars, indexed by the constants above
    itl_sums: FloatArray  # ItlLog.sums
    itl_hist: npt.NDArray[np.int64]  # ItlLog.hist
    itl_gaps: FloatArray  # ItlLog.gaps
    log_times: FloatArray  # IterationLog.times
    log_counts: npt.NDArray[np.int32]  # IterationLog.counts


# ---- KV cache (KVCacheManager) ---------------------------------------------------------------------------------------


@njit(cache=True)
def blocks_for(st: FastState, tokens: int) -> int:
    return -(-tokens // st.sc[BLOCK_SIZE])


@njit(cache=True)
def kv_extra(st: FastState, req: int, tokens: int) -> int:
    return max(0, blocks_for(st, tokens) - st.held[req])


@njit(cache=True)
def kv_can_allocate(st: FastState, req: int, tokens: int, admission: bool) -> bool:
    reserve = st.sc[WATERMARK] if admission else 0
    return kv_extra(st, req, tokens) <= st.sc[NUM_BLOCKS] - st.sc[USED] - reserve


@njit(cache=True)
def kv_allocate(st: FastState, req: int, tokens: int, admission: bool) -> bool:
    extra = kv_extra(st, req, tokens)
    reserve = st.sc[WATERMARK] if admission else 0
    if extra > st.sc[NUM_BLOCKS] - st.sc[USED] - reserve:
        return False
    st.held[req] += extra
    st.sc[USED] += extra
    return True


@njit(cache=True)
def kv_allocate_all(st: FastState, reqs: IntArray, count: int) -> bool:
    """Grow ``reqs[:count]`` by one token each (the decode fast path), all or nothing."""
    total = 0
    for k in range(count):
        r = reqs[k]
        total += max(blocks_for(st, st.computed[r] + 1) - st.held[r], 0)
    if total > st.sc[NUM_BLOCKS] - st.sc[USED]:
        return False
    for k in range(count):
        r = reqs[k]
        st.held[r] += max(blocks_for(st, st.computed[r] + 1) - st.held[r], 0)
    st.sc[USED] += total
    return True


@njit(cache=True)
def kv_free(st: FastState, req: int) -> None:
    st.sc[USED] -= st.held[req]
    st.held[req] = 0


# ---- queues ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def waiting_at(st: FastState, k: int) -> int:
    """The k-th request of the waiting queue (0 = front)."""
    return st.waiting[(st.sc[W_HEAD] + k) % st.waiting.shape[0]]


@njit(cache=True)
def push_back(st: FastState, req: int) -> None:
    st.waiting[(st.sc[W_HEAD] + st.sc[W_LEN]) % st.waiting.shape[0]] = req
    st.sc[W_LEN] += 1


@njit(cache=True)
def push_front(st: FastState, req: int) -> None:
    st.sc[W_HEAD] = (st.sc[W_HEAD] - 1) % st.waiting.shape[0]
    st.waiting[st.sc[W_HEAD]] = req
    st.sc[W_LEN] += 1


@njit(cache=True)
def pop_front(st: FastState) -> int:
    req = st.waiting[st.sc[W_HEAD]]
    st.sc[W_HEAD] = (st.sc[W_HEAD] + 1) % st.waiting.shape[0]
    st.sc[W_LEN] -= 1
    return req


@njit(cache=True)
def remove_running(st: FastState, req: int) -> None:
    """Take ``req`` out of the running array, keeping the others' order."""
    n = st.sc[R_LEN]
    k = 0
    for j in range(n):
        r = st.running[j]
        if r != req:
            st.running[k] = r
            k += 1
    st.sc[R_LEN] = k


# ---- requests (SchedulerState) ---------------------------------------------------------------------------------------


@njit(cache=True)
def remaining(st: FastState, req: int) -> int:
    return st.prompt[req] + st.generated[req] - st.computed[req]


@njit(cache=True)
def is_prefilling(st: FastState, req: int) -> bool:
    return st.generated[req] == 0 or remaining(st, req) > 1


@njit(cache=True)
def next_arrival(st: FastState) -> float:
    a = st.sc[ARRIVED]
    return st.arrival[a] if a < st.arrival.shape[0] else math.inf


@njit(cache=True)
def receive_arrivals(st: FastState, now: float) -> None:
    n = st.arrival.shape[0]
    end = np.searchsorted(st.arrival, now, side="right")
    for i in range(st.sc[ARRIVED], end):
        total = st.prompt[i] + st.output_wanted[i]
        reason = 0
        if total > st.sc[MAX_MODEL_LEN]:
            reason = EXCEEDS_MAX_MODEL_LEN
        elif blocks_for(st, total) > st.sc[NUM_BLOCKS]:
            reason = EXCEEDS_KV_CACHE
        if st.prompt[i] <= 0 or st.output_wanted[i] <= 0:
            reason = EMPTY
        if reason:
            st.status[i] = REJECTED
            st.reason[i] = reason
            st.sc[UNFINISHED] -= 1
        else:
            st.status[i] = WAITING
            push_back(st, i)
    st.sc[ARRIVED] = max(st.sc[ARRIVED], min(end, n))


@njit(cache=True)
def admit_next(st: FastState) -> int:
    req = pop_front(st)
    st.status[req] = RUNNING
    st.admit_order[req] = st.sc[ADMISSIONS]
    st.sc[ADMISSIONS] += 1
    st.running[st.sc[R_LEN]] = req
    st.sc[R_LEN] += 1
    return req


@njit(cache=True)
def preempt(st: FastState, req: int) -> None:
    remove_running(st, req)
    kv_free(st, req)
    st.recomputed[req] += st.computed[req]
    st.computed[req] = 0
    st.preemptions[req] += 1
    st.status[req] = WAITING
    push_front(st, req)
    st.sc[PREEMPTED_SINCE] += 1


@njit(cache=True)
def release_running(st: FastState, now: float) -> None:
    """Return the responses of every seated request (all held: their batch has ended)."""
    n = st.sc[R_LEN]
    for j in range(n):
        req = st.running[j]
        kv_free(st, req)
        st.status[req] = FINISHED
        st.response[req] = now
    st.sc[NUM_HELD] -= n
    st.sc[R_LEN] = 0
    st.sc[UNFINISHED] -= n


@njit(cache=True)
def reject_stalled(st: FastState) -> None:
    """The policy will never act again: end the running, then the waiting requests, with the reason STALLED."""
    for j in range(st.sc[R_LEN]):
        req = st.running[j]
        kv_free(st, req)
        st.status[req] = REJECTED
        st.reason[req] = STALLED
        st.sc[UNFINISHED] -= 1
    st.sc[R_LEN] = 0
    while st.sc[W_LEN] > 0:
        req = pop_front(st)
        kv_free(st, req)
        st.status[req] = REJECTED
        st.reason[req] = STALLED
        st.sc[UNFINISHED] -= 1


# ---- the batch being built (BatchBuilder) ----------------------------------------------------------------------------


@njit(cache=True)
def batch_start(st: FastState) -> None:
    st.sc[B_LEN] = 0
    st.sc[B_HOLD] = 0
    st.sc[STAMP] += 1


@njit(cache=True)
def batch_add(st: FastState, req: int, tokens: int) -> None:
    k = st.sc[B_LEN]
    st.batch_ids[k] = req
    st.batch_new[k] = tokens
    st.stamp[req] = st.sc[STAMP]
    st.sc[B_LEN] = k + 1


@njit(cache=True)
def in_batch(st: FastState, req: int) -> bool:
    return st.stamp[req] == st.sc[STAMP]


# ---- after the iteration (SchedulerState.shape_of and complete) ------------------------------------------------------


@njit(cache=True)
def build_shape(st: FastState) -> tuple[int, int, int]:
    """Fill pf_new / pf_ctx / dec_ctx from the batch; returns (prefill chunks, decodes, prefill chunks that sample)."""
    n_pf = 0
    n_dec = 0
    sampled = 0
    for k in range(st.sc[B_LEN]):
        req = st.batch_ids[k]
        ctx = st.computed[req]
        if is_prefilling(st, req):
            st.pf_new[n_pf] = st.batch_new[k]
            st.pf_ctx[n_pf] = ctx
            n_pf += 1
            if ctx + st.batch_new[k] == st.prompt[req] + st.generated[req]:
                sampled += 1
        else:
            st.dec_ctx[n_dec] = ctx
            n_dec += 1
    return n_pf, n_dec, sampled


@njit(cache=True)
def complete(st: FastState, n_pf: int, n_dec: int, start: float, end: float) -> None:
    """Account for the batch that ran from ``start`` to ``end`` and log it (the log has room: the loop checks)."""
    row = st.sc[N_ITERS]
    nb = st.sc[B_LEN]
    for k in range(nb):
        req = st.batch_ids[k]
        if math.isnan(st.first_scheduled[req]):
            st.first_scheduled[req] = start
        st.computed[req] += st.batch_new[k]
    done = 0
    seats = st.sc[R_LEN]
    held = st.sc[NUM_HELD]
    kv_used = st.sc[USED]
    for k in range(nb):
        req = st.batch_ids[k]
        if st.computed[req] != st.prompt[req] + st.generated[req]:
            continue
        if st.generated[req] == 0:
            st.first_token[req] = end
        else:
            add_gap(end - st.last_token[req], st.itl_sums, st.itl_hist, st.itl_gaps)
        st.generated[req] += 1
        st.last_token[req] = end
        if st.generated[req] >= st.output_wanted[req]:
            st.finish[req] = end
            done += 1
            if st.sc[B_HOLD]:
                st.status[req] = HELD
            else:
                st.status[req] = FINISHED
                st.response[req] = end
                kv_free(st, req)
    if done:
        if st.sc[B_HOLD]:
            st.sc[NUM_HELD] += done
        else:
            k = 0
            for j in range(st.sc[R_LEN]):
                r = st.running[j]
                if st.status[r] != FINISHED:
                    st.running[k] = r
                    k += 1
            st.sc[R_LEN] = k
            st.sc[UNFINISHED] -= done
    ctx = 0
    pf_tokens = 0
    for j in range(n_pf):
        ctx += st.pf_ctx[j]
        pf_tokens += st.pf_new[j]
    for j in range(n_dec):
        ctx += st.dec_ctx[j]
    st.log_times[row, 0] = start
    st.log_times[row, 1] = end
    c = st.log_counts[row]
    c[0], c[1], c[2], c[3], c[4] = n_pf, pf_tokens, n_dec, ctx, kv_used
    c[5], c[6], c[7], c[8], c[9] = seats, held, st.sc[W_LEN], st.sc[PREEMPTED_SINCE], done
    st.sc[PREEMPTED_SINCE] = 0
    st.sc[N_ITERS] = row + 1
