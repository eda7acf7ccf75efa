"""The built-in policies compiled with numba, for the compiled engine (``sim.compiled.engine``).

Each kernel is the twin of a policy class in this package, decision for decision, over ``sim.compiled.state``'s arrays
instead of ``SchedulerState``: same order of passes, same tie-breaks, same victims. The classes stay the reference
(and the only path for user policies and the real executor); tests run both and compare the records to the last bit.

A kernel is ``schedule(ri, rf, wk, sc, kv, ss, params, now) -> wake``: it builds the batch into
``sim.compiled.state``'s batch rows (``sc[B_LEN]`` entries), or leaves it empty and returns when to ask again (``inf``:
at the next arrival). ``params`` is a float64 array whose layout each policy's ``compiled()`` writes. The KV cache
(``kv``) is asked through ``sim.compiled.kv``, the kernels the reference engine's ``KVCacheManager`` runs too.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from sim.compiled import kv as kvc
from sim.compiled.batch import batch_add, batch_start, in_batch
from sim.compiled.jit import kernel
from sim.compiled.kvstate import BLOCK_SIZE, NUM_BLOCKS
from sim.compiled.state import (
    ARRIVAL,
    B_CACHED,
    B_HOLD,
    B_LEN,
    BATCH_IDS,
    BATCH_NEW,
    COMPUTED,
    GENERATED,
    MAX_MODEL_LEN,
    OUTPUT,
    PROMPT,
    R_LEN,
    RUNNING,
    RUNNING_Q,
    SCRATCH,
    STATUS,
    TOKENS,
    W_LEN,
    admit_next,
    cached,
    is_prefilling,
    more_arrivals,
    preempt,
    release_running,
    remaining,
    waiting_at,
)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# ---- shared steps (policies.base) ------------------------------------------------------------------------------------


@kernel
def allocate_or_preempt(ri: IntArray, wk: IntArray, sc: IntArray, kv, req: int, tokens: int) -> tuple[bool, bool]:  # noqa: ANN001
    """(granted, preempted anything): ``policies.base.allocate_or_preempt``."""
    preempted = False
    while not kvc.allocate(kv, req, tokens, False):
        victim = -1
        for j in range(sc[R_LEN] - 1, -1, -1):
            r = wk[RUNNING_Q, j]
            if r != req and not in_batch(ri, sc, r):
                victim = r
                break
        preempt(ri, wk, sc, kv, req if victim < 0 else victim)
        preempted = True
        if victim < 0:
            return False, preempted
    return True, preempted


@kernel
def schedule_decodes(ri: IntArray, wk: IntArray, sc: IntArray, kv, budget: int) -> tuple[int, bool]:  # noqa: ANN001
    """``policies.base.schedule_decodes``; returns (budget left, preempted)."""
    n = 0
    cap = max(budget, 0)
    decoding = wk[SCRATCH]
    total = 0  # blocks they need (kv.allocate_all, asked as the list is built)
    for j in range(sc[R_LEN]):
        r = wk[RUNNING_Q, j]
        if not is_prefilling(ri, r):
            if n == cap:
                break
            decoding[n] = r
            total += kvc.growth(kv, r, ri[COMPUTED, r] + 1)
            n += 1
    if n == 0:
        return budget, False
    if kvc.reserve(kv, total):
        for k in range(n):
            req = decoding[k]
            kvc.grow(kv, req, kvc.growth(kv, req, ri[COMPUTED, req] + 1))
            batch_add(ri, wk, sc, req, 1)
        return budget - n, False
    preempted = False
    for k in range(n):  # victims leave the running set, not this list
        req = decoding[k]
        if ri[STATUS, req] != RUNNING:
            continue
        granted, p = allocate_or_preempt(ri, wk, sc, kv, req, ri[COMPUTED, req] + 1)
        preempted |= p
        if granted:
            batch_add(ri, wk, sc, req, 1)
            budget -= 1
    return budget, preempted


@kernel
def schedule_running(ri: IntArray, wk: IntArray, sc: IntArray, kv, budget: int, cap: int) -> tuple[int, bool]:  # noqa: ANN001
    """``policies.base.schedule_running``, with the same all-or-nothing fast path; returns (budget left,
    preempted)."""
    # the common case first: everyone the budget reaches fits in the cache (kv.allocate_all, asked as the list is
    # built)
    chunks = wk[TOKENS]
    left = budget
    reached = 0
    total = 0
    for k in range(sc[R_LEN]):
        if left <= 0:
            break
        req = wk[RUNNING_Q, k]
        chunk = min(remaining(ri, req), cap, left)
        chunks[reached] = chunk
        total += kvc.growth(kv, req, ri[COMPUTED, req] + chunk)
        left -= chunk
        reached += 1
    if kvc.reserve(kv, total):
        for k in range(reached):
            req = wk[RUNNING_Q, k]
            kvc.grow(kv, req, kvc.growth(kv, req, ri[COMPUTED, req] + chunks[k]))
            batch_add(ri, wk, sc, req, chunks[k])
            budget -= chunks[k]
        return budget, False
    return _one_by_one(ri, wk, sc, kv, budget, cap, False)


@kernel
def schedule_partial_prefills(
    ri: IntArray,
    wk: IntArray,
    sc: IntArray,
    kv,
    budget: int,
    cap: int,  # noqa: ANN001
) -> tuple[int, bool]:
    """``policies.base.schedule_partial_prefills``; returns (budget left, preempted)."""
    return _one_by_one(ri, wk, sc, kv, budget, cap, True)


@kernel
def _one_by_one(
    ri: IntArray,
    wk: IntArray,
    sc: IntArray,
    kv,
    budget: int,
    cap: int,
    prefills_only: bool,  # noqa: ANN001
) -> tuple[int, bool]:
    """``policies.base._one_by_one``; returns (budget left, preempted)."""
    n = sc[R_LEN]
    snapshot = wk[SCRATCH]
    for j in range(n):
        snapshot[j] = wk[RUNNING_Q, j]
    preempted = False
    for k in range(n):
        req = snapshot[k]
        if budget <= 0:
            break
        if ri[STATUS, req] != RUNNING:
            continue
        if prefills_only and (in_batch(ri, sc, req) or not is_prefilling(ri, req)):
            continue
        tokens = min(remaining(ri, req), cap, budget)
        granted, p = allocate_or_preempt(ri, wk, sc, kv, req, ri[COMPUTED, req] + tokens)
        preempted |= p
        if not granted:
            break
        batch_add(ri, wk, sc, req, tokens)
        budget -= tokens
    return budget, preempted


# reservations, as indices of policies.base.RESERVATIONS
PAGED, OUTPUT_RESERVED, MAX_MODEL_LEN_RESERVED = 0, 1, 2


@kernel
def reserved_tokens(ri: IntArray, sc: IntArray, kv, req: int, tokens: int, reservation: int) -> int:  # noqa: ANN001
    """``policies.base.reserved_tokens``."""
    if reservation == PAGED:
        return tokens
    whole = ri[PROMPT, req] + ri[OUTPUT, req]
    if reservation == MAX_MODEL_LEN_RESERVED:
        whole = max(whole, min(sc[MAX_MODEL_LEN], kv[1][NUM_BLOCKS] * kv[1][BLOCK_SIZE]))
    return max(tokens, whole)


@kernel
def admit_waiting(
    ri: IntArray,
    wk: IntArray,
    sc: IntArray,
    kv,  # noqa: ANN001
    budget: int,
    max_seqs: int,
    cap: int,
    reservation: int,
    full_prompt: bool,
) -> tuple[int, int]:
    """``policies.base.admit_waiting`` (``cap < 0``: whole prompts only); returns (budget left, admitted)."""
    admitted = 0
    while sc[W_LEN] > 0 and sc[R_LEN] < max_seqs and budget > 0:
        req = waiting_at(wk, sc, 0)
        total = ri[PROMPT, req] + ri[GENERATED, req]
        present, hits, unreferenced = kvc.found(
            kv, req, total, wk[BATCH_IDS], wk[BATCH_NEW], ri[COMPUTED], sc[B_CACHED], sc[B_LEN]
        )
        sc[B_CACHED] = sc[B_LEN]
        need = remaining(ri, req) - present
        chunk = need if cap < 0 else min(need, budget, cap)
        if chunk > budget:
            break
        tokens = reserved_tokens(ri, sc, kv, req, ri[COMPUTED, req] + present + chunk, reservation)
        check = max(tokens, total) if full_prompt else tokens
        if not kvc.fits(kv, req, check, hits, unreferenced, sc[R_LEN] > 0):
            break
        admit_next(ri, wk, sc)
        kvc.take(kv, req, hits, total)
        if present:
            cached(ri, req, present)
        kvc.allocate(kv, req, tokens, False)
        batch_add(ri, wk, sc, req, chunk)
        budget -= chunk
        admitted += 1
    return budget, admitted


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
    if params[2] > 0:
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
    if params[5] == 0:
        budget, preempted = schedule_running(ri, wk, sc, kv, budget, cap)
    else:
        budget, preempted = schedule_decodes(ri, wk, sc, kv, budget)
        budget, p = schedule_partial_prefills(ri, wk, sc, kv, budget, cap)
        preempted |= p
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
