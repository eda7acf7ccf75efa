"""The KV cache's state as arrays, the same for both engines: what ``sim.kernels.kv``'s kernels read and write.

A cache is a tuple ``kv = (kr, ks, table, entries, refs, seg_ids, seg_tokens, seg_offsets, scratch, own)``:
- ``kr`` int64 ``[row, request]``: the blocks each request holds (``HELD``), and with prefix caching its leading
  blocks looked at for caching (``REGISTERED``, with where their keys stood: ``CURSOR_*``), its full blocks
  (``NKEYS``) and where its references start (``REFS_AT``); under disaggregation the tokens whose KV it
  brought (``PRESENT``);
- ``ks`` int64: scalars (``USED`` ...), the counters of the prefix cache among them;
- ``table``: the prefix cache's index, open addressing over block keys, each slot a key and its entry (or ``EMPTY``);
- ``entries`` int64 ``[row, entry]``: one per cached block: its key, the requests referencing it, and its place in
  the list of unreferenced cached blocks (least recently freed first, evicted first);
- ``refs`` int32: per request, one per full block: the entry of the cached copy it references, or ``EMPTY`` where
  its block is private (nothing cached, or a copy of a block another request cached first);
- ``seg_ids``, ``seg_tokens``, ``seg_offsets``: what the requests share (``sim.workload.prefixes.Prefixes``), from
  which the block keys are computed;
- ``scratch``: room for one request's entries (``sim.kernels.prefix``: those a lookup found, for the take after it);
- ``own`` int32: per request, one per full block: the entry of the cached copy of its block j where that block is its
  own (past its segments: no other request has its key), kept after the request lets it go (a preempted request finds
  it again, if it was not evicted meanwhile); such a copy is not in ``table``, which only other requests would search.

A cache without prefix caching keeps the prefix arrays at one element each; nothing reads them.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
KV = tuple[
    IntArray,
    IntArray,
    IntArray,
    IntArray,
    npt.NDArray[np.int32],
    IntArray,
    IntArray,
    IntArray,
    IntArray,
    npt.NDArray[np.int32],
]

# rows of kr (CURSOR_*: where the keys of a request's blocks stood after the last one looked at for caching:
# ``sim.kernels.prefix.block_key``'s cursor, so that caching the next block does not walk the segments again)
HELD, REGISTERED, NKEYS, REFS_AT, PRESENT, CURSOR_SEG, CURSOR_CHAIN, CURSOR_COVERED = range(8)
NUM_KR = 8
# indices of ks
USED, NUM_BLOCKS, BLOCK_SIZE, WATERMARK, CACHING, TRANSFER, MASK = range(7)
# the prefix cache: entries referenced and unreferenced, the list of unreferenced ones, the entries' free list
CACHED, EVICTABLE, LRU_HEAD, LRU_TAIL, FREE_ENTRY = range(7, 12)
# its counters over admissions (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens and in blocks)
QUERY_TOKENS, HIT_TOKENS, QUERY_BLOCKS, HIT_BLOCKS, EVICTIONS = range(12, 17)
SHIFT = 17  # log2(block_size) when it is a power of two (a shift divides faster), else -1
# the request whose entries found by the last lookup are in ``scratch`` (-1: none), for the take that follows it
LOOKED_UP = 18
# 1: a hit loses its last block, recomputed for the drafter (speculative decoding with EAGLE-like drafters: vLLM's
# ``use_eagle`` cache drop, ``FullAttentionManager.find_longest_cache_hit``)
DROP_LAST = 19
NUM_KS = 20
# rows of entries
# OWNER: for a copy of a request's own block (past its segments, which no other request can share), where that block
# stands in ``refs`` and ``own`` (the request's REFS_AT + j); EMPTY for a block in the index. KEY is EMPTY for an
# entry not in use
# DUP: the next cached copy of the same block (another request computed it too: vLLM caches every copy, and finds the
# first cached while it lasts, ``BlockHashToBlockMap``), EMPTY for the last
KEY, REFS, PREV, NEXT, OWNER, DUP = range(6)
EMPTY = -1  # a free slot of the table; the end of a list


def make_kv(
    num_blocks: int,
    block_size: int,
    num_requests: int,
    watermark_blocks: int,
    totals: IntArray | None = None,
    segments: tuple[IntArray, IntArray, IntArray] | None = None,
    present: IntArray | None = None,
    drop_last: bool = False,
) -> KV:
    """A fresh cache of ``num_blocks`` blocks of ``block_size`` tokens for ``num_requests`` requests. Prefix caching:
    ``totals`` (each request's prompt + output tokens) and ``segments`` (ids, tokens, offsets; None: nothing shared),
    and ``drop_last``: a hit loses its last block (``DROP_LAST``).
    Disaggregation's decode side: ``present`` (tokens of each request's KV that arrive with it)."""
    caching = totals is not None
    rows = NUM_KR if caching else PRESENT + 1 if present is not None else HELD + 1  # the rows the cache uses
    kr = np.zeros((rows, num_requests), dtype=np.int64)
    ks = np.zeros(NUM_KS, dtype=np.int64)
    ks[NUM_BLOCKS], ks[BLOCK_SIZE], ks[WATERMARK] = num_blocks, block_size, watermark_blocks
    ks[SHIFT] = block_size.bit_length() - 1 if block_size & (block_size - 1) == 0 else -1
    ks[LRU_HEAD] = ks[LRU_TAIL] = ks[LOOKED_UP] = EMPTY
    one = np.zeros(1, dtype=np.int64)
    table, entries, scratch = one.copy(), np.zeros((4, 1), dtype=np.int64), one.copy()
    refs = np.full(1, EMPTY, dtype=np.int32)
    own = refs.copy()
    seg_ids, seg_tokens, seg_offsets = one.copy(), one.copy(), one.copy()
    if present is not None:
        ks[TRANSFER] = 1
        kr[PRESENT] = present
    if caching:
        assert totals is not None
        ks[CACHING] = 1
        ks[DROP_LAST] = int(drop_last)
        kr[NKEYS] = totals // block_size
        kr[REFS_AT] = np.cumsum(kr[NKEYS]) - kr[NKEYS]
        refs = np.full(max(int(kr[NKEYS].sum()), 1), EMPTY, dtype=np.int32)  # 4 bytes a full block
        own = refs.copy()  # and 4 more: the cached copy of a request's own block, which outlives its holding
        size = 1 << max(4, int(2 * (num_blocks + 1)).bit_length())  # at most a quarter full: short probes
        table = np.full(2 * size, EMPTY, dtype=np.int64)  # (key, entry) a slot
        ks[MASK] = size - 1
        entries = np.full((6, num_blocks + 1), EMPTY, dtype=np.int64)  # a cached block is a block: at most all
        entries[NEXT, :-1] = np.arange(1, num_blocks + 1)  # the free list: every entry
        entries[NEXT, -1] = EMPTY
        ks[FREE_ENTRY] = 0
        scratch = np.zeros(max(int(kr[NKEYS].max(initial=0)), 1), dtype=np.int64)
        if segments is not None:
            seg_ids, seg_tokens, seg_offsets = (np.array(a, dtype=np.int64) for a in segments)  # writable: one type
        else:
            seg_offsets = np.zeros(num_requests + 1, dtype=np.int64)
    return kr, ks, table, entries, refs, seg_ids, seg_tokens, seg_offsets, scratch, own


def grow_rows(kv: KV, num_requests: int) -> KV:
    """The cache with room for ``num_requests`` requests (a live server learns them one by one); plain caches only."""
    kr = kv[0]
    if kv[1][CACHING]:
        raise ValueError("a prefix cache knows its requests from the start; it cannot take more")
    grown = np.zeros((kr.shape[0], num_requests), dtype=np.int64)
    grown[:, : kr.shape[1]] = kr
    return (grown, *kv[1:])
