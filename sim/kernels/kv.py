"""The KV cache's block arithmetic, compiled: the one implementation both engines run.

Every operation on a cache (``sim.kernels.kvstate``'s arrays) is here, for a plain paged cache, one with automatic
prefix caching (``sim.kernels.prefix``) and the decode side of disaggregation (KV that arrives with a request). The
reference engine reaches them through ``sim.kvcache.KVCacheManager``'s methods, the compiled policies
(``policies.compiled``) and loop (``sim.compiled.batch``) call them directly, so both engines make the same
decisions on the same state by the same code. A new KV feature goes here (and in ``kvstate``'s arrays), and both
engines have it.

What admission asks of a cache is three calls, the same whatever the cache does (``policies.base.admit_waiting``
and its twin): ``found`` (tokens of the request already present, and the cached blocks behind them), ``fits`` (room
for the tokens it would hold), ``take`` (it was admitted: it references what was found).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sim.kernels import prefix
from sim.kernels.jit import kernel
from sim.kernels.kvstate import (
    BLOCK_SIZE,
    CACHING,
    HELD,
    NUM_BLOCKS,
    PRESENT,
    REGISTERED,
    SHIFT,
    TRANSFER,
    USED,
    WATERMARK,
)

IntArray = npt.NDArray[np.int64]


@kernel
def blocks_for(ks: IntArray, tokens: int) -> int:
    """Blocks that hold ``tokens`` (>= 0) tokens (ceil division)."""
    if ks[SHIFT] >= 0:
        return (tokens + ks[BLOCK_SIZE] - 1) >> ks[SHIFT]
    return -(-tokens // ks[BLOCK_SIZE])


@kernel
def free_blocks(ks: IntArray) -> int:
    """Blocks nobody holds (with prefix caching, cached blocks nobody references count as free: they are evicted
    when their room is needed)."""
    return ks[NUM_BLOCKS] - ks[USED]


@kernel
def fits(kv, req: int, tokens: int, hits: int, unreferenced: int, admission: bool) -> bool:  # noqa: ANN001
    """Whether ``req`` could hold ``tokens`` tokens now, its first ``hits`` blocks taken from the prefix cache (of
    which ``unreferenced`` nobody references: taking them uses free room); ``admission`` also keeps the watermark
    free."""
    kr, ks = kv[0], kv[1]
    reserve = ks[WATERMARK] if admission else 0
    new = max(0, blocks_for(ks, tokens) - hits - kr[HELD, req])
    return new + unreferenced <= free_blocks(ks) - reserve


@kernel
def allocate(kv, req: int, tokens: int, admission: bool) -> bool:  # noqa: ANN001
    """Grow ``req``'s holding to cover ``tokens`` tokens in all; False (and nothing changed) if there is no room."""
    kr, ks = kv[0], kv[1]
    extra = max(0, blocks_for(ks, tokens) - kr[HELD, req])
    reserve = ks[WATERMARK] if admission else 0
    if extra > free_blocks(ks) - reserve:
        return False
    if ks[CACHING]:
        prefix.make_room(kv, extra)
    kr[HELD, req] += extra
    ks[USED] += extra
    return True


@kernel
def allocate_all(kv, reqs: IntArray, tokens: IntArray, count: int) -> bool:  # noqa: ANN001
    """Grow every ``reqs[k]`` (``k < count``) to ``tokens[k]`` tokens, all or nothing (a decode batch's fast path).
    A loop that builds the list can ask ``growth`` as it goes, ``reserve`` the total, then ``grow`` each."""
    total = 0
    for k in range(count):
        total += growth(kv, reqs[k], tokens[k])
    if not reserve(kv, total):
        return False
    if total:
        for k in range(count):
            grow(kv, reqs[k], growth(kv, reqs[k], tokens[k]))
    return True


@kernel
def growth(kv, req: int, tokens: int) -> int:  # noqa: ANN001
    """Blocks ``req`` must add to hold ``tokens`` tokens in all (0 if it holds enough: most decodes, found without
    dividing)."""
    held = kv[0][HELD, req]
    if tokens <= held * kv[1][BLOCK_SIZE]:
        return 0
    return blocks_for(kv[1], tokens) - held


@kernel
def reserve(kv, blocks: int) -> bool:  # noqa: ANN001
    """Take ``blocks`` free blocks for ``grow`` (a prefix cache evicts what they cached); False if there are not that
    many (nothing changed)."""
    ks = kv[1]
    if blocks > free_blocks(ks):
        return False
    if ks[CACHING]:
        prefix.make_room(kv, blocks)
    ks[USED] += blocks
    return True


@kernel
def grow(kv, req: int, blocks: int) -> None:  # noqa: ANN001
    """``req`` holds ``blocks`` more of the blocks ``reserve`` took."""
    kv[0][HELD, req] += blocks


@kernel
def free(kv, req: int) -> int:  # noqa: ANN001
    """Release every block ``req`` holds; returns how many."""
    kr, ks = kv[0], kv[1]
    if ks[CACHING]:
        return prefix.free(kv, req)
    blocks = kr[HELD, req]
    kr[HELD, req] = 0
    ks[USED] -= blocks
    return blocks


@kernel
def register(kv, req: int, tokens: int) -> None:  # noqa: ANN001
    """``req`` holds KV for ``tokens`` tokens, computed or scheduled to be: a prefix cache caches its full blocks
    (when a step is scheduled, and after it ran; again is harmless)."""
    if kv[1][CACHING] and fills_a_block(kv, req, tokens):
        prefix.register(kv, req, tokens)


@kernel
def fills_a_block(kv, req: int, tokens: int) -> bool:  # noqa: ANN001
    """Whether ``tokens`` tokens fill a block of ``req``'s not yet looked at for caching (most steps do not: the check
    ``register`` makes without dividing)."""
    return tokens >= (kv[0][REGISTERED, req] + 1) * kv[1][BLOCK_SIZE]


@kernel
def register_all(kv, reqs: IntArray, tokens: IntArray, count: int) -> None:  # noqa: ANN001
    """``register`` for ``reqs[k]`` and ``tokens[k]``, ``k < count``, in that order."""
    if kv[1][CACHING]:
        for k in range(count):
            if fills_a_block(kv, reqs[k], tokens[k]):
                prefix.register(kv, reqs[k], tokens[k])


@kernel
def found(
    kv,  # noqa: ANN001
    req: int,
    num_tokens: int,
    ids: IntArray,
    news: IntArray,
    computed: IntArray,
    start: int,
    count: int,
) -> tuple[int, int, int]:
    """At admission: tokens of ``req`` (of ``num_tokens`` in all) whose KV is present and need not be computed, the
    leading blocks found in the prefix cache behind them, and how many of those nobody references. The step being
    built (``ids[:count]``, each computing ``news[k]`` tokens after its ``computed``; those before ``start`` were
    cached by an earlier call) caches its blocks first, as vLLM's ``allocate_slots`` does when it schedules them, so
    that a request admitted after them finds them. Under disaggregation: the tokens computed on the prefill replica
    and sent."""
    kr, ks = kv[0], kv[1]
    if ks[CACHING]:
        for k in range(start, count):
            tokens = computed[ids[k]] + news[k]
            if fills_a_block(kv, ids[k], tokens):
                prefix.register(kv, ids[k], tokens)
        hits, unreferenced = prefix.lookup(kv, req, num_tokens)
        return hits * ks[BLOCK_SIZE], hits, unreferenced
    if ks[TRANSFER]:
        return kr[PRESENT, req], 0, 0
    return 0, 0, 0


@kernel
def take(kv, req: int, hits: int, num_tokens: int) -> None:  # noqa: ANN001
    """``req`` was admitted with what ``found`` found: it references its ``hits`` cached blocks (counted in the hit
    rate), or the blocks it brought become its own (a preempted request recomputes them here)."""
    kr, ks = kv[0], kv[1]
    if ks[CACHING]:
        prefix.take(kv, req, hits, num_tokens)
    elif ks[TRANSFER]:
        kr[PRESENT, req] = 0


@kernel
def lookup(kv, req: int, num_tokens: int) -> tuple[int, int]:  # noqa: ANN001
    """A prefix cache's leading blocks of ``req`` found cached (``prefix.lookup``); (0, 0) without one."""
    if kv[1][CACHING]:
        return prefix.lookup(kv, req, num_tokens)
    return 0, 0
