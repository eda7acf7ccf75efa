"""The built-in policies compiled with numba, for the compiled engine (``sim.fast_engine``).

Each kernel is the twin of a policy class in this package, decision for decision, over ``sim.fast_state``'s arrays
instead of ``SchedulerState``: same order of passes, same tie-breaks, same victims. The classes stay the reference
(and the only path for user policies and the real executor); tests run both and compare the records to the last bit.

A kernel is ``schedule(st, params, now) -> wake``: it builds the batch into ``st.batch_ids``/``st.batch_new`` (length
``st.sc[B_LEN]``), or leaves it empty and returns when to ask again (``inf``: at the next arrival). ``params`` is a
float64 array whose layout each policy's ``compiled()`` writes.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numba import njit

from sim.fast_state import (
    B_HOLD,
    B_LEN,
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    NUM_BLOCKS,
    R_LEN,
    RUNNING,
    W_LEN,
    FastState,
    admit_next,
    batch_add,
    batch_start,
    in_batch,
    is_prefilling,
    kv_allocate,
    kv_allocate_all,
    kv_can_allocate,
    next_arrival,
    preempt,
    release_running,
    remaining,
    waiting_at,
)

FloatArray = npt.NDArray[np.float64]


# ---- shared steps (policies.base) -----------------------------------------------------------------------------------


@njit(cache=True)
def allocate_or_preempt(st: FastState, req: int, tokens: int) -> tuple[bool, bool]:
    """(granted, preempted anything): ``policies.base.allocate_or_preempt``."""
    preempted = False
    while not kv_allocate(st, req, tokens, False):
        victim = -1
        for j in range(st.sc[R_LEN] - 1, -1, -1):
            r = st.running[j]
            if r != req and not in_batch(st, r):
                victim = r
                break
        preempt(st, req if victim < 0 else victim)
        preempted = True
        if victim < 0:
            return False, preempted
    return True, preempted


@njit(cache=True)
def schedule_decodes(st: FastState, budget: int) -> tuple[int, bool]:
    """``policies.base.schedule_decodes``; returns (budget left, preempted)."""
    n = 0
    cap = max(budget, 0)
    for j in range(st.sc[R_LEN]):
        r = st.running[j]
        if not is_prefilling(st, r):
            if n == cap:
                break
            st.scratch[n] = r
            n += 1
    if n == 0:
        return budget, False
    if kv_allocate_all(st, st.scratch, n):
        for k in range(n):
            batch_add(st, st.scratch[k], 1)
        return budget - n, False
    preempted = False
    decoding = st.scratch[:n].copy()  # victims change the running array under us
    for k in range(n):
        req = decoding[k]
        if st.status[req] != RUNNING:
            continue
        granted, p = allocate_or_preempt(st, req, st.computed[req] + 1)
        preempted |= p
        if granted:
            batch_add(st, req, 1)
            budget -= 1
    return budget, preempted


@njit(cache=True)
def schedule_partial_prefills(st: FastState, budget: int, chunk_cap: int) -> tuple[int, bool]:
    """``policies.base.schedule_partial_prefills``; returns (budget left, preempted)."""
    snapshot = st.running[: st.sc[R_LEN]].copy()
    preempted = False
    for req in snapshot:
        if budget <= 0:
            break
        if in_batch(st, req) or st.status[req] != RUNNING or not is_prefilling(st, req):
            continue
        chunk = min(remaining(st, req), budget, chunk_cap)
        granted, p = allocate_or_preempt(st, req, st.computed[req] + chunk)
        preempted |= p
        if granted:
            batch_add(st, req, chunk)
            budget -= chunk
    return budget, preempted


@njit(cache=True)
def admit_waiting(st: FastState, budget: int, max_num_seqs: int, chunk_cap: int) -> tuple[int, int]:
    """``policies.base.admit_waiting`` (``chunk_cap < 0``: whole prompts only); returns (budget left, admitted)."""
    admitted = 0
    while st.sc[W_LEN] > 0 and st.sc[R_LEN] < max_num_seqs and budget > 0:
        req = waiting_at(st, 0)
        need = remaining(st, req)
        chunk = need if chunk_cap < 0 else min(need, budget, chunk_cap)
        if chunk > budget:
            break
        if not kv_can_allocate(st, req, st.computed[req] + chunk, st.sc[R_LEN] > 0):
            break
        admit_next(st)
        kv_allocate(st, req, st.computed[req] + chunk, False)
        batch_add(st, req, chunk)
        budget -= chunk
        admitted += 1
    return budget, admitted


# ---- the policies ---------------------------------------------------------------------------------------------------


@njit(cache=True)
def schedule_none(st: FastState, params: FloatArray, now: float) -> float:
    """``policies.none.NoBatching``; no params."""
    batch_start(st)
    if st.sc[R_LEN] == 0:
        if st.sc[W_LEN] == 0:
            return math.inf
        admit_next(st)
    req = st.running[0]
    tokens = remaining(st, req)
    kv_allocate(st, req, st.computed[req] + tokens, False)  # alone in the cache it always fits
    batch_add(st, req, tokens)
    return math.inf


# params of schedule_static: [max_batch_size, reserve max_model_len (1) or output (0), dynamic (1/0), max_delay_s,
# preferred batch sizes (largest first)...]
@njit(cache=True)
def schedule_static(st: FastState, params: FloatArray, now: float) -> float:
    """``policies.static.StaticBatching`` and ``policies.dynamic.DynamicBatching``."""
    batch_start(st)
    max_batch = int(params[0])
    if st.sc[R_LEN] > 0:
        active = False
        for j in range(st.sc[R_LEN]):
            if st.status[st.running[j]] == RUNNING:
                active = True
                break
        if not active:
            release_running(st, now)
    if st.sc[R_LEN] == 0:
        size = _departure_size(st, params, max_batch, now)
        if size < 0:
            if params[2] > 0 and st.sc[W_LEN] > 0:
                return st.arrival[waiting_at(st, 0)] + params[3]
            return math.inf
        for _ in range(size):  # board: reserve each member's KV up front
            req = waiting_at(st, 0)
            need = st.prompt[req] + st.output_wanted[req]
            if params[1] > 0:
                need = max(need, min(st.sc[MAX_MODEL_LEN], st.sc[NUM_BLOCKS] * st.sc[BLOCK_SIZE]))
            if not kv_allocate(st, req, need, False):
                break
            admit_next(st)
    for j in range(st.sc[R_LEN]):
        req = st.running[j]
        if st.status[req] == RUNNING:
            batch_add(st, req, remaining(st, req))
    st.sc[B_HOLD] = 1
    return math.inf


@njit(cache=True)
def _departure_size(st: FastState, params: FloatArray, max_batch: int, now: float) -> int:
    queued = st.sc[W_LEN]
    if queued >= max_batch:
        return max_batch
    if queued > 0 and next_arrival(st) == math.inf:  # the trace has ended: flush
        return queued
    if params[2] > 0:  # dynamic
        for k in range(4, params.shape[0]):
            if int(params[k]) <= queued:
                return int(params[k])
        if queued > 0 and now >= st.arrival[waiting_at(st, 0)] + params[3]:
            return min(queued, max_batch)
    return -1


# params of schedule_continuous: [max_num_seqs, max_num_batched_tokens, mix_prefill_decode (1/0)]
@njit(cache=True)
def schedule_continuous(st: FastState, params: FloatArray, now: float) -> float:
    """``policies.continuous.ContinuousBatching``."""
    batch_start(st)
    max_seqs, budget = int(params[0]), int(params[1])
    if params[2] > 0:
        budget, preempted = schedule_decodes(st, budget)
        if not preempted:
            admit_waiting(st, budget, max_seqs, -1)
    else:
        budget, admitted = admit_waiting(st, budget, max_seqs, -1)
        if admitted == 0:
            schedule_decodes(st, budget)
    return math.inf


# params of schedule_chunked: [max_num_seqs, max_num_batched_tokens, chunk cap]
@njit(cache=True)
def schedule_chunked(st: FastState, params: FloatArray, now: float) -> float:
    """``policies.chunked.ChunkedPrefill``."""
    batch_start(st)
    max_seqs, budget, cap = int(params[0]), int(params[1]), int(params[2])
    budget, preempted = schedule_decodes(st, budget)
    budget, p = schedule_partial_prefills(st, budget, cap)
    if not (preempted or p):
        admit_waiting(st, budget, max_seqs, cap)
    return math.inf


def params_array(*values: float) -> FloatArray:
    return np.array(values, dtype=np.float64)


__all__ = ["B_LEN", "params_array", "schedule_chunked", "schedule_continuous", "schedule_none", "schedule_static"]
