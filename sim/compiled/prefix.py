"""Automatic prefix caching, compiled: block keys, the index of cached blocks, the list of evictable ones, and what
each request references, over ``sim.compiled.kvstate``'s arrays. The semantics (vLLM V1's) are in
``sim.prefix_cache``'s docstring; ``sim.compiled.kv`` calls these for both engines.

Keys: block ``j`` of a request whose last token lies within the request's segments has the key of the segments up to
that one (each segment's id and length chained into a hash) and ``j``: equal keys, equal tokens from the first on. A
block past its segments is the request's own (a key made of the request and ``j``). Keys are non-negative int64.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sim.compiled.jit import kernel
from sim.compiled.kvstate import (
    BLOCK_SIZE,
    CACHED,
    CURSOR_CHAIN,
    CURSOR_COVERED,
    CURSOR_SEG,
    EMPTY,
    EVICTABLE,
    EVICTIONS,
    FREE_ENTRY,
    HELD,
    HIT_BLOCKS,
    HIT_TOKENS,
    KEY,
    LOOKED_UP,
    LRU_HEAD,
    LRU_TAIL,
    MASK,
    NEXT,
    NKEYS,
    NUM_BLOCKS,
    PREV,
    QUERY_BLOCKS,
    QUERY_TOKENS,
    REFS,
    REFS_AT,
    REGISTERED,
    USED,
)

IntArray = npt.NDArray[np.int64]
_OWN = np.uint64(0x6F776E)  # marks the keys of a request's own blocks


# ---- keys -----------------------------------------------------------------------------------------------------------


@kernel
def mix(a: int, b: int) -> int:
    """Two integers hashed into one (splitmix64's finaliser over their combination); non-negative."""
    x = np.uint64(a) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(b)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return int(np.int64(x >> np.uint64(1)))


@kernel
def block_key(kv, req: int, j: int, seg: int, chain: int, covered: int) -> tuple[int, int, int, int]:  # noqa: ANN001
    """The key of block ``j`` of ``req``, for ``j`` taken in increasing order from a cursor (``seg``, ``chain``,
    ``covered``: the next segment, the hash of those before it, the tokens they cover) that starts at
    ``key_cursor(kv, req)``; returns the key and the cursor moved on."""
    seg_ids, seg_tokens = kv[5], kv[6]
    last = (j + 1) * kv[1][BLOCK_SIZE]  # tokens up to the block's last
    hi = kv[7][req + 1]
    while covered < last and seg < hi:
        chain = mix(mix(chain, seg_ids[seg]), seg_tokens[seg])
        covered += seg_tokens[seg]
        seg += 1
    if covered >= last:
        return mix(chain, j), seg, chain, covered
    return mix(mix(np.int64(_OWN), req), j), seg, chain, covered


@kernel
def key_cursor(kv, req: int) -> tuple[int, int, int]:  # noqa: ANN001
    """The cursor of ``block_key`` before ``req``'s first block."""
    return kv[7][req], 0, 0


@kernel
def keys(kv, req: int, out: IntArray) -> int:  # noqa: ANN001
    """Fill ``out`` with the keys of ``req``'s full blocks (as many as fit); returns how many it has."""
    n = kv[0][NKEYS, req]
    seg, chain, covered = key_cursor(kv, req)
    for j in range(min(n, out.shape[0])):
        out[j], seg, chain, covered = block_key(kv, req, j, seg, chain, covered)
    return n


# ---- the index: key -> entry (open addressing, linear probing, deletion by backward shift) ------------------------
# Slot i is table[2i] (the key, or EMPTY) and table[2i + 1] (its entry): a probe reads one line. Keys are hashes
# already: a key's home slot is its low bits.


@kernel
def slot(kv, key: int) -> int:  # noqa: ANN001
    """The slot of ``key`` in the index, or the empty slot where it would go."""
    table, mask = kv[2], kv[1][MASK]
    i = key & mask
    while table[2 * i] != EMPTY and table[2 * i] != key:
        i = (i + 1) & mask
    return i


@kernel
def find(kv, key: int) -> int:  # noqa: ANN001
    """The entry of the cached block with ``key``, or EMPTY."""
    i = slot(kv, key)
    return kv[2][2 * i + 1] if kv[2][2 * i] == key else EMPTY


@kernel
def insert(kv, i: int, key: int) -> int:  # noqa: ANN001
    """A new entry for ``key`` at its empty slot ``i`` (``slot``), unreferenced and on no list; returns it."""
    ks, table, entries = kv[1], kv[2], kv[3]
    e = ks[FREE_ENTRY]
    ks[FREE_ENTRY] = entries[NEXT, e]
    entries[KEY, e] = key
    entries[REFS, e] = 0
    entries[PREV, e] = entries[NEXT, e] = EMPTY
    table[2 * i] = key
    table[2 * i + 1] = e
    return e


@kernel
def remove(kv, e: int) -> None:  # noqa: ANN001
    """Forget entry ``e`` (its block is evicted): out of the index, back on the free list."""
    ks, table, entries = kv[1], kv[2], kv[3]
    mask = ks[MASK]
    i = slot(kv, entries[KEY, e])
    j = i
    while True:  # move back every entry of the run after i that may live at i
        j = (j + 1) & mask
        if table[2 * j] == EMPTY:
            break
        home = table[2 * j] & mask
        if (j > i and (home <= i or home > j)) or (j < i and home <= i and home > j):
            table[2 * i] = table[2 * j]
            table[2 * i + 1] = table[2 * j + 1]
            i = j
    table[2 * i] = EMPTY
    entries[NEXT, e] = ks[FREE_ENTRY]
    ks[FREE_ENTRY] = e


# ---- the list of unreferenced cached blocks, least recently freed first ---------------------------------------------


@kernel
def lru_append(kv, e: int) -> None:  # noqa: ANN001
    ks, entries = kv[1], kv[3]
    tail = ks[LRU_TAIL]
    entries[PREV, e] = tail
    entries[NEXT, e] = EMPTY
    if tail == EMPTY:
        ks[LRU_HEAD] = e
    else:
        entries[NEXT, tail] = e
    ks[LRU_TAIL] = e
    ks[EVICTABLE] += 1


@kernel
def lru_remove(kv, e: int) -> None:  # noqa: ANN001
    ks, entries = kv[1], kv[3]
    prev, nxt = entries[PREV, e], entries[NEXT, e]
    if prev == EMPTY:
        ks[LRU_HEAD] = nxt
    else:
        entries[NEXT, prev] = nxt
    if nxt == EMPTY:
        ks[LRU_TAIL] = prev
    else:
        entries[PREV, nxt] = prev
    ks[EVICTABLE] -= 1


@kernel
def make_room(kv, blocks: int) -> None:  # noqa: ANN001
    """Evict cached, unreferenced blocks until ``blocks`` blocks are empty (nothing cached in them)."""
    ks = kv[1]
    empty = ks[NUM_BLOCKS] - ks[USED] - ks[EVICTABLE]
    for _ in range(max(0, blocks - empty)):
        e = ks[LRU_HEAD]
        lru_remove(kv, e)
        remove(kv, e)
        ks[EVICTIONS] += 1
        ks[LOOKED_UP] = EMPTY


# ---- what a request references (``refs[REFS_AT + j]``: the entry of its block j's cached copy, EMPTY if private) --


@kernel
def _refer(kv, req: int, j: int, e: int) -> None:  # noqa: ANN001
    kv[4][kv[0][REFS_AT, req] + j] = e


@kernel
def references(kv, req: int, j: int) -> bool:  # noqa: ANN001
    """Whether ``req`` references the cached copy of its block ``j`` (rather than holding a private one)."""
    return kv[4][kv[0][REFS_AT, req] + j] != EMPTY


# ---- the cache's operations -----------------------------------------------------------------------------------------


@kernel
def lookup(kv, req: int, num_tokens: int) -> tuple[int, int]:  # noqa: ANN001
    """Blocks of ``req``'s leading full blocks found cached, of at most ``num_tokens - 1`` tokens, and how many of
    those nobody references now (taking them uses free room). Changes nothing."""
    kr, entries, found = kv[0], kv[3], kv[8]
    most = min(kr[NKEYS, req], max(num_tokens - 1, 0) // kv[1][BLOCK_SIZE])
    seg, chain, covered = key_cursor(kv, req)
    hits = 0
    unreferenced = 0
    for j in range(most):
        key, seg, chain, covered = block_key(kv, req, j, seg, chain, covered)
        e = find(kv, key)
        if e == EMPTY:
            break
        found[j] = e  # for the take that follows (an eviction or a free forgets them)
        hits += 1
        if entries[REFS, e] == 0:
            unreferenced += 1
    kv[1][LOOKED_UP] = req
    return hits, unreferenced


@kernel
def take(kv, req: int, hits: int, num_tokens: int) -> None:  # noqa: ANN001
    """``req`` (holding nothing) references its first ``hits`` cached blocks, found by ``lookup`` for a request of
    ``num_tokens`` tokens; counts the lookup in the hit rate."""
    kr, ks, entries = kv[0], kv[1], kv[3]
    seg, chain, covered = key_cursor(kv, req)
    looked_up = ks[LOOKED_UP] == req
    for j in range(hits):
        key, seg, chain, covered = block_key(kv, req, j, seg, chain, covered)
        e = kv[8][j] if looked_up else find(kv, key)
        if entries[REFS, e] == 0:  # unreferenced until now: it leaves the eviction list and takes room
            lru_remove(kv, e)
            ks[CACHED] += 1
            ks[USED] += 1
        entries[REFS, e] += 1
        _refer(kv, req, j, e)
    kr[HELD, req] = hits
    kr[REGISTERED, req] = hits
    _keep_cursor(kv, req, seg, chain, covered)
    bs = ks[BLOCK_SIZE]
    ks[QUERY_TOKENS] += num_tokens
    ks[HIT_TOKENS] += hits * bs
    ks[QUERY_BLOCKS] += num_tokens // bs
    ks[HIT_BLOCKS] += hits


@kernel
def register(kv, req: int, tokens: int) -> None:  # noqa: ANN001
    """``req`` holds KV for ``tokens`` tokens (computed, or scheduled to be): cache the full blocks not looked at yet.
    A block whose key is cached already (another request's copy) stays private."""
    kr, ks, entries = kv[0], kv[1], kv[3]
    full = tokens // ks[BLOCK_SIZE]
    start = kr[REGISTERED, req]
    if full <= start:
        return
    seg, chain, covered = _kept_cursor(kv, req)
    table = kv[2]
    for j in range(start, min(full, kr[NKEYS, req])):
        key, seg, chain, covered = block_key(kv, req, j, seg, chain, covered)
        i = slot(kv, key)
        if table[2 * i] == key:
            continue
        e = insert(kv, i, key)  # the request's own block becomes the cached one (used is unchanged)
        entries[REFS, e] = 1
        ks[CACHED] += 1
        _refer(kv, req, j, e)
    kr[REGISTERED, req] = full
    _keep_cursor(kv, req, seg, chain, covered)


@kernel
def _keep_cursor(kv, req: int, seg: int, chain: int, covered: int) -> None:  # noqa: ANN001
    kr = kv[0]
    kr[CURSOR_SEG, req], kr[CURSOR_CHAIN, req], kr[CURSOR_COVERED, req] = seg, chain, covered


@kernel
def _kept_cursor(kv, req: int) -> tuple[int, int, int]:  # noqa: ANN001
    """The cursor of ``block_key`` after the blocks of ``req`` looked at for caching (at its start if none)."""
    kr = kv[0]
    if kr[REGISTERED, req] == 0:
        return key_cursor(kv, req)
    return kr[CURSOR_SEG, req], kr[CURSOR_CHAIN, req], kr[CURSOR_COVERED, req]


@kernel
def free(kv, req: int) -> int:  # noqa: ANN001
    """Release every block ``req`` holds; returns how many. Its cached blocks go back tail first (the longest-shared
    blocks are evicted last), those nobody else references onto the eviction list."""
    kr, ks, entries, refs = kv[0], kv[1], kv[3], kv[4]
    blocks = kr[HELD, req]
    at = kr[REFS_AT, req]
    shared = 0
    for j in range(min(kr[REGISTERED, req], kr[NKEYS, req]) - 1, -1, -1):
        e = refs[at + j]
        if e == EMPTY:  # a private block
            continue
        refs[at + j] = EMPTY
        shared += 1
        entries[REFS, e] -= 1
        if entries[REFS, e] == 0:
            ks[CACHED] -= 1
            lru_append(kv, e)
            ks[USED] -= 1
    ks[USED] -= blocks - shared  # its private blocks
    kr[HELD, req] = 0
    kr[REGISTERED, req] = 0
    return blocks
