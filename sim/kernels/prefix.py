"""Automatic prefix caching, compiled: block keys, the index of cached blocks, the list of evictable ones, and what
each request references, over ``sim.kernels.kvstate``'s arrays. The semantics (vLLM V1's) are in
``sim.prefix_cache``'s docstring; ``sim.kernels.kv`` calls these for both engines.

Keys: block ``j`` of a request whose last token lies within the request's segments has the key of the segments up to
that one (each segment's id and length chained into a hash) and ``j``: equal keys, equal tokens from the first on. A
block past its segments is the request's own (a key made of the request and ``j``). Keys are non-negative int64.

The index (``table``) holds only the cached blocks of segments, which other requests may find; a cached copy of a
request's own block is found through the request (``own``), as only the request itself can ever look it up again (a
preempted request, readmitted). The two are one cache: one list of evictable blocks, one count, the same decisions; the
index is spared a key, a probe and a deletion for every block most requests cache (most of a prompt is its own).

A block computed again while a copy of it is cached (two requests computing a shared block at once, a request that
recomputes a block past its hit, a hit's last block an EAGLE drafter drops) is cached too, as a further copy of its key
(``DUP``: vLLM keeps every copy, ``block_pool.py``'s ``BlockHashToBlockMap``). The index (or ``own``) points at the
first copy cached, which a lookup finds; when it is evicted, the next one takes its place.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sim.kernels.jit import kernel
from sim.kernels.kvstate import (
    BLOCK_SIZE,
    CACHED,
    CURSOR_CHAIN,
    CURSOR_COVERED,
    CURSOR_SEG,
    DROP_LAST,
    EMPTY,
    EVICTABLE,
    EVICTIONS,
    HELD,
    HIT_BLOCKS,
    HIT_TOKENS,
    LOOKED_UP,
    LRU_HEAD,
    LRU_TAIL,
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
from sim.kernels.prefix_index import find, insert, insert_copy, insert_own, own_copy, remove, slot  # noqa: F401

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
    """Blocks of ``req``'s leading full blocks found cached, of at most ``num_tokens - 1`` tokens (less the last one
    found where the cache drops it, ``DROP_LAST``), and how many of those nobody references now (taking them uses free
    room). Changes nothing."""
    kr, entries, found = kv[0], kv[3], kv[8]
    bs = kv[1][BLOCK_SIZE]
    most = min(kr[NKEYS, req], max(num_tokens - 1, 0) // bs)
    seg, chain, covered = key_cursor(kv, req)
    hits = 0
    unreferenced = 0
    for j in range(most):
        key, seg, chain, covered = block_key(kv, req, j, seg, chain, covered)
        e = own_copy(kv, kr[REFS_AT, req] + j, key) if covered < (j + 1) * bs else find(kv, key)
        if e == EMPTY:
            break
        found[j] = e  # for the take that follows (an eviction or a free forgets them)
        hits += 1
        if entries[REFS, e] == 0:
            unreferenced += 1
    if kv[1][DROP_LAST] and hits > 0:  # its KV is recomputed: the drafter needs the hidden states of its tokens
        hits -= 1
        if entries[REFS, found[hits]] == 0:
            unreferenced -= 1
    kv[1][LOOKED_UP] = req
    return hits, unreferenced


@kernel
def take(kv, req: int, hits: int, num_tokens: int) -> None:  # noqa: ANN001
    """``req`` (holding nothing) references its first ``hits`` cached blocks, found by ``lookup`` for a request of
    ``num_tokens`` tokens; counts the lookup in the hit rate."""
    kr, ks, entries = kv[0], kv[1], kv[3]
    seg, chain, covered = key_cursor(kv, req)
    looked_up = ks[LOOKED_UP] == req
    bs = ks[BLOCK_SIZE]
    for j in range(hits):
        key, seg, chain, covered = block_key(kv, req, j, seg, chain, covered)
        if looked_up:
            e = kv[8][j]
        else:
            e = own_copy(kv, kr[REFS_AT, req] + j, key) if covered < (j + 1) * bs else find(kv, key)
        if entries[REFS, e] == 0:  # unreferenced until now: it leaves the eviction list and takes room
            lru_remove(kv, e)
            ks[CACHED] += 1
            ks[USED] += 1
        entries[REFS, e] += 1
        _refer(kv, req, j, e)
    kr[HELD, req] = hits
    kr[REGISTERED, req] = hits
    _keep_cursor(kv, req, seg, chain, covered)
    ks[QUERY_TOKENS] += num_tokens
    ks[HIT_TOKENS] += hits * bs
    ks[QUERY_BLOCKS] += num_tokens // bs
    ks[HIT_BLOCKS] += hits


@kernel
def register(kv, req: int, tokens: int) -> None:  # noqa: ANN001
    """``req`` holds KV for ``tokens`` tokens (computed, or scheduled to be): cache the full blocks not looked at yet
    (a block whose key is cached already, a further copy of it)."""
    kr, ks, entries = kv[0], kv[1], kv[3]
    full = tokens // ks[BLOCK_SIZE]
    start = kr[REGISTERED, req]
    if full <= start:
        return
    seg, chain, covered = _kept_cursor(kv, req)
    table, bs, at = kv[2], ks[BLOCK_SIZE], kr[REFS_AT, req]
    for j in range(start, min(full, kr[NKEYS, req])):
        key, seg, chain, covered = block_key(kv, req, j, seg, chain, covered)
        if covered < (j + 1) * bs:  # its own block: cached through the request (after an earlier copy, if cached)
            first = own_copy(kv, at + j, key)
            e = insert_own(kv, at + j, key) if first == EMPTY else insert_copy(kv, first, key, at + j)
        else:
            i = slot(kv, key)
            e = insert(kv, i, key) if table[2 * i] != key else insert_copy(kv, table[2 * i + 1], key, EMPTY)
        # the request's block becomes a cached one (used is unchanged)
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
