"""The built-in policies compiled with numba, for the compiled engine (``sim.compiled.engine``).

Each kernel is the twin of a policy class in this package, decision for decision, over ``sim.compiled.state``'s arrays
instead of ``SchedulerState``: same order of passes, same tie-breaks, same victims. The classes stay the reference
(and the only path for user policies and the real executor); tests run both and compare the records to the last bit.

A kernel is ``schedule(ri, rf, wk, sc, kv, ss, params, now) -> wake``: it builds the batch into
``sim.compiled.state``'s batch rows (``sc[B_LEN]`` entries), or leaves it empty and returns when to ask again (``inf``:
at the next arrival). ``params`` is a float64 array whose layout each policy's ``compiled()`` writes. The KV cache
(``kv``) is asked through ``sim.kernels.kv``, the kernels the reference engine's ``KVCacheManager`` runs too. The
steps several policies share are ``policies.compiled_steps`` (the twins of ``policies.base``'s).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from policies.compiled_steps import (  # noqa: F401  (the shared steps: their names stay importable from here)
    MAX_MODEL_LEN_RESERVED,
    OUTPUT_RESERVED,
    PAGED,
    admit_waiting,
    allocate_or_preempt,
    pad_drafts,
    reserved_tokens,
    schedule_decodes,
    schedule_partial_prefills,
    schedule_running,
)
from sim.compiled.batch import batch_add, batch_start, end_running_pass
from sim.compiled.state import (
    ARRIVAL,
    B_HOLD,
    COMPUTED,
    PROMPT,
    R_LEN,
    RUNNING,
    RUNNING_Q,
    SPEC_K,
    SPEC_SLOTS,
    STATUS,
    W_LEN,
    admit_next,
    more_arrivals,
    release_running,
    remaining,
    waiting_at,
)
from sim.kernels import kv as kvc
from sim.kernels.jit import kernel

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# ---- the policies ----------------------------------------------------------------------------------------------------


@kernel
def schedule_none(
    ri: IntArray,
    rf: FloatArray,
    wk: IntArray,
    sc: IntArray,
    kv,
    ss,
    params: FloatArray,
    now: float,  # noqa: ANN001
) -> float:
    """``policies.none.NoBatching``; no params."""
    batch_start(sc)
    if sc[R_LEN] == 0:
        if sc[W_LEN] == 0:
            return math.inf
        admit_next(ri, wk, sc)
    req = wk[RUNNING_Q, 0]
    tokens = remaining(ri, req)
    kvc.allocate(kv, req, ri[COMPUTED, req] + tokens, False)  # alone in the cache it always fits
    batch_add(ri, wk, sc, req, tokens)
    return math.inf


# params of schedule_static: [max_batch_size, reservation, dynamic (1/0), max_delay_s, preferred batch sizes, largest
# first ...]
@kernel
def schedule_static(
    ri: IntArray,
    rf: FloatArray,
    wk: IntArray,
    sc: IntArray,
    kv,
    ss,
    params: FloatArray,
    now: float,  # noqa: ANN001
) -> float:
    """``policies.static.StaticBatching`` and ``policies.dynamic.DynamicBatching``."""
    batch_start(sc)
    max_batch = int(params[0])
    if sc[R_LEN] > 0:
        active = False
        for j in range(sc[R_LEN]):
            if ri[STATUS, wk[RUNNING_Q, j]] == RUNNING:
                active = True
                break
        if not active:
            release_running(ri, rf, wk, sc, kv, ss, now)
    if sc[R_LEN] == 0:
        size = _departure_size(rf, wk, sc, ss, params, max_batch, now)
        if size < 0:
            if params[2] > 0 and sc[W_LEN] > 0:
                return rf[ARRIVAL, waiting_at(wk, sc, 0)] + params[3]
            return math.inf
        for _ in range(size):  # board: reserve each member's KV up front
            req = waiting_at(wk, sc, 0)
            if not kvc.allocate(kv, req, reserved_tokens(ri, sc, kv, req, ri[PROMPT, req], int(params[1])), False):
                break
            admit_next(ri, wk, sc)
    for j in range(sc[R_LEN]):
        req = wk[RUNNING_Q, j]
        if ri[STATUS, req] == RUNNING:
            batch_add(ri, wk, sc, req, remaining(ri, req))
    sc[B_HOLD] = 1
    return math.inf


@kernel
def _departure_size(
    rf: FloatArray,
    wk: IntArray,
    sc: IntArray,
    ss,
    params: FloatArray,
    max_batch: int,
    now: float,  # noqa: ANN001
) -> int:
    """``StaticBatching.departure_size`` and ``DynamicBatching.departure_size``; -1 for None."""
    queued = sc[W_LEN]
    if params[2] == 0:  # static
        if queued >= max_batch:
            return max_batch
        if queued > 0 and not more_arrivals(sc, ss):  # the trace has ended: flush
            return queued
        return -1
    if queued == 0:  # dynamic (Triton)
        return -1
    fill = min(queued, max_batch)
    delay = params[3]
    expired = delay > 0 and now >= rf[ARRIVAL, waiting_at(wk, sc, 0)] + delay
    if not expired:
        for k in range(4, params.shape[0]):  # preferred sizes, largest first
            if int(params[k]) <= fill:
                return int(params[k])
    if expired or delay == 0:
        return fill
    return -1


# params of schedule_continuous: [max_num_seqs, max_num_batched_tokens, mix_prefill_decode (1/0), reservation]
@kernel
def schedule_continuous(
    ri: IntArray,
    rf: FloatArray,
    wk: IntArray,
    sc: IntArray,
    kv,
    ss,
    params: FloatArray,
    now: float,  # noqa: ANN001
) -> float:
    """``policies.continuous.ContinuousBatching``."""
    batch_start(sc)
    max_seqs, budget, reservation = int(params[0]), int(params[1]), int(params[3])
    if params[2] > 0 and sc[SPEC_K] > 0:
        budget, preempted = schedule_running(ri, wk, sc, kv, budget - sc[SPEC_SLOTS], int(params[1]))
        end_running_pass(ri, wk, sc)
        if not preempted:
            admit_waiting(ri, wk, sc, kv, budget, max_seqs, -1, reservation, True)
    elif params[2] > 0:
        budget, preempted = schedule_decodes(ri, wk, sc, kv, budget)
        if not preempted:
            admit_waiting(ri, wk, sc, kv, budget, max_seqs, -1, reservation, True)
    else:
        budget, admitted = admit_waiting(ri, wk, sc, kv, budget, max_seqs, -1, reservation, True)
        if admitted == 0:
            schedule_decodes(ri, wk, sc, kv, budget)
    return math.inf


# params of schedule_chunked: [max_num_seqs, max_num_batched_tokens, chunk cap, reservation, full prompt (1/0),
# order (index of policies.config.CHUNKED_ORDERS: 0 vllm, 1 decodes-first)]
@kernel
def schedule_chunked(
    ri: IntArray,
    rf: FloatArray,
    wk: IntArray,
    sc: IntArray,
    kv,
    ss,
    params: FloatArray,
    now: float,  # noqa: ANN001
) -> float:
    """``policies.chunked.ChunkedPrefill``."""
    batch_start(sc)
    max_seqs, budget = int(params[0]), int(params[1])
    cap = prefill_cap(int(params[2]), params[6] > 0, params[7] > 0, budget, sc[R_LEN] + sc[W_LEN])
    budget -= sc[SPEC_SLOTS]  # a draft model's input slot (``BatchBuilder``)
    if params[5] == 0:
        budget, preempted = schedule_running(ri, wk, sc, kv, budget, cap)
    else:
        budget, preempted = schedule_decodes(ri, wk, sc, kv, budget)
        budget, p = schedule_partial_prefills(ri, wk, sc, kv, budget, cap)
        preempted |= p
    if sc[SPEC_K] > 0:
        end_running_pass(ri, wk, sc)
    if not preempted:
        admit_waiting(ri, wk, sc, kv, budget, max_seqs, cap, int(params[3]), params[4] > 0)
    return math.inf


def lone_aware_prefill_cap(threshold: int, adaptive: bool, cap_alone: bool, budget: int, requests: int) -> int:
    """Tokens one request may prefill this iteration (``budget``: no cap), as vLLM's ``Scheduler.schedule`` sets its
    ``long_prefill_token_threshold`` each step (``vllm/v1/core/sched/scheduler.py``, 0.31.0-0.32.0): no cap when
    ``requests`` (running and waiting) is one, unless ``cap_alone`` (releases before 0.31.0); ``adaptive``: at least
    ``budget // requests``. Shared by ``policies.chunked`` and its compiled twin."""
    if threshold <= 0 or (requests <= 1 and not cap_alone):
        return budget
    if adaptive:
        return max(threshold, budget // max(requests, 1))
    return threshold


prefill_cap = kernel(lone_aware_prefill_cap)


def params_array(*values: float) -> FloatArray:
    return np.array(values, dtype=np.float64)
