"""The batch-building steps the compiled policies share (``policies.compiled``): the twins of ``policies.base``'s, step
for step, over ``sim.compiled.state``'s arrays and the KV cache's kernels."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sim.compiled.batch import batch_add, batch_add_verified, in_batch
from sim.compiled.state import (
    B_CACHED,
    B_LEN,
    B_RUNNING,
    B_RUNNING_PREFILL,
    BATCH_IDS,
    BATCH_VERIFIED,
    COMPUTED,
    DRAFTS,
    GENERATED,
    MAX_MODEL_LEN,
    OUTPUT,
    PROMPT,
    R_LEN,
    RUNNING,
    RUNNING_Q,
    SCRATCH,
    SPEC_K,
    SPEC_LOOKAHEAD,
    SPEC_PAD,
    SPEC_SLOTS,
    STATUS,
    TOKENS,
    W_LEN,
    admit_next,
    cached,
    is_prefilling,
    preempt,
    remaining,
    waiting_at,
)
from sim.kernels import kv as kvc
from sim.kernels.jit import kernel
from sim.kernels.kvstate import BLOCK_SIZE, NUM_BLOCKS

IntArray = npt.NDArray[np.int64]


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
    """``policies.base.schedule_running`` (and its ``_speculative_running``), with the same all-or-nothing fast path;
    returns (budget left, preempted)."""
    # the common case first: everyone the budget reaches fits in the cache (kv.allocate_all, asked as the list is
    # built)
    chunks = wk[TOKENS]
    left = budget
    reached = 0
    total = 0
    slots = sc[SPEC_SLOTS]
    for k in range(sc[R_LEN]):
        if left <= 0:
            break
        req = wk[RUNNING_Q, k]
        chunk, room = _wanted(ri, sc, req, cap, left)
        chunks[reached] = chunk
        total += kvc.growth(kv, req, room)
        left -= chunk + slots
        reached += 1
    if kvc.reserve(kv, total):
        for k in range(reached):
            req = wk[RUNNING_Q, k]
            chunk, room = _wanted(ri, sc, req, cap, chunks[k])
            kvc.grow(kv, req, kvc.growth(kv, req, room))
            batch_add_verified(ri, wk, sc, req, chunks[k], min(chunks[k], remaining(ri, req)))
            budget -= chunks[k] + slots
        return budget, False
    return _one_by_one(ri, wk, sc, kv, budget, cap, False)


@kernel
def _wanted(ri: IntArray, sc: IntArray, req: int, cap: int, budget: int) -> tuple[int, int]:
    """(tokens, tokens of KV to hold) of a running request given at most ``cap`` and ``budget`` tokens: what it needs
    before its next sample; with speculative decoding its drafts too, within ``max_model_len - computed - 1``, and
    KV for them and the lookahead slots (at most ``max_model_len``)."""
    computed = ri[COMPUTED, req]
    if sc[SPEC_K] == 0:
        tokens = min(remaining(ri, req), cap, budget)
        return tokens, computed + tokens
    tokens = min(remaining(ri, req) + ri[DRAFTS, req], cap, budget, sc[MAX_MODEL_LEN] - computed - 1)
    return tokens, min(computed + tokens + sc[SPEC_LOOKAHEAD], sc[MAX_MODEL_LEN])


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
        tokens, room = _wanted(ri, sc, req, cap, budget)
        granted, p = allocate_or_preempt(ri, wk, sc, kv, req, room)
        preempted |= p
        if not granted:
            break
        batch_add_verified(ri, wk, sc, req, tokens, min(tokens, remaining(ri, req)))
        budget -= tokens + sc[SPEC_SLOTS]
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
            kv, req, total, wk[BATCH_IDS], wk[BATCH_VERIFIED], ri[COMPUTED], sc[B_CACHED], sc[B_LEN]
        )
        sc[B_CACHED] = sc[B_LEN]
        need = remaining(ri, req) - present
        verified = need
        if sc[SPEC_K] > 0:
            need = pad_drafts(sc, ri[COMPUTED, req] + present, need, present, budget)
            if need < 0:
                break
        chunk = need if cap < 0 else min(need, budget, cap)
        if chunk > budget:
            break
        tokens = reserved_tokens(ri, sc, kv, req, ri[COMPUTED, req] + present + chunk, reservation)
        if sc[SPEC_K] > 0:
            tokens = min(tokens + sc[SPEC_LOOKAHEAD], sc[MAX_MODEL_LEN])
        check = max(tokens, total) if full_prompt else tokens
        if not kvc.fits(kv, req, check, hits, unreferenced, sc[R_LEN] > 0):
            break
        admit_next(ri, wk, sc)
        kvc.take(kv, req, hits, total)
        if present:
            cached(ri, req, present)
        kvc.allocate(kv, req, tokens, False)
        batch_add_verified(ri, wk, sc, req, chunk, min(chunk, verified))
        budget -= chunk + sc[SPEC_SLOTS]
        admitted += 1
    return budget, admitted


@kernel
def pad_drafts(sc: IntArray, computed: int, need: int, cached: int, budget: int) -> int:
    """``policies.base.pad_drafts``."""
    padded = 1 + sc[SPEC_K]
    if not (sc[SPEC_PAD] != 0 and need == 1 and sc[B_RUNNING_PREFILL] == 0 and (sc[B_RUNNING] > 0 or cached > 0)):
        return need
    if computed + padded + 1 > sc[MAX_MODEL_LEN]:
        return need
    return padded if padded <= budget else -1
