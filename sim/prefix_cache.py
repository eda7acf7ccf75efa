"""Automatic prefix caching: KV blocks identified by their content, reused by any later request with the same prefix.

Semantics follow vLLM V1's ``KVCacheManager`` with ``enable_prefix_caching`` (``vllm/v1/core/kv_cache_manager.py``,
``block_pool.py``, ``kv_cache_utils.py``, vLLM main as of late 2026):

- a *full* block of ``block_size`` tokens is identified by the hash of its tokens and of every token before it (the
  parent block's hash chained in); a partial block is never shared;
- when a request is admitted, the longest run of its leading full blocks found in the cache is reused: those tokens
  are not computed again (its prefill starts after them), though attention still reads them. At most
  ``num_tokens - 1`` tokens hit, so the last token is always computed and a token sampled
  (``get_computed_blocks``'s ``max_cache_hit_length``);
- a block is cached as soon as a step is scheduled to fill it (``allocate_slots`` caches up to the tokens computed
  and scheduled; with speculative decoding, only verified tokens), so a request admitted later in the same step
  already finds it; a block computed while a copy of it is cached (two requests computing it at once, a recompute
  past a hit) is cached too, a further copy that a lookup finds once the copies cached before it are evicted (vLLM
  keeps every copy, ``BlockHashToBlockMap``);
- every full block is cached, a request's own content too: a preempted request finds its own blocks again when it
  is readmitted, if they are still there;
- a freed block with nothing cached (a partial block) is reused first; a freed cached block stays
  cached until its room is needed, cached blocks evicted least recently freed first, a request's blocks freed tail
  first (``BlockPool.free_blocks`` prepends the uncached ones to the free queue and appends the cached ones, in
  reverse order), so a common prefix outlives the suffixes that hung from it. A block is never evicted while a
  request references it.

ferry has no tokens: a request's content is given as *segments* (``sim.workload.prefixes``): ids of token runs that
requests share (a system prompt, a conversation so far, a Mooncake ``hash_id``). A block's key is the chained hash
of the segments up to the one holding its last token and its position; a block reaching into a request's own tokens
(beyond its segments) gets a key of that request's alone.

Memory: ``used`` counts the distinct blocks some request references (a shared block once); cached blocks nobody
references are free to take (``free`` counts them) and are evicted as new blocks are needed.

The cache is ``sim.kernels.prefix``'s kernels over ``sim.kernels.kvstate``'s arrays, which both engines run; this
class gives Python callers its counters and, for tests, views of what is cached.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sim.kernels import prefix
from sim.kernels.kvstate import (
    CACHED,
    EMPTY,
    EVICTABLE,
    EVICTIONS,
    HIT_BLOCKS,
    HIT_TOKENS,
    KEY,
    LRU_HEAD,
    NEXT,
    NKEYS,
    QUERY_BLOCKS,
    QUERY_TOKENS,
    REFS,
    REGISTERED,
    make_kv,
)
from sim.kvcache import KVCacheManager, check_sizes
from sim.workload import Workload

IntArray = npt.NDArray[np.int64]


class PrefixCachingKV(KVCacheManager):
    """``KVCacheManager`` with automatic prefix caching over the content of ``workload``'s requests (their shared
    segments, ``Workload.prefixes``, and their lengths: every full block of a prompt and its output has a key)."""

    def __init__(self, num_blocks: int, block_size: int, workload: Workload, watermark: float = 0.0,
                 drop_last_block: bool = False) -> None:  # fmt: skip
        """``drop_last_block``: a hit loses its last block, as vLLM drops it for an EAGLE-like drafter (speculative
        decoding: the drafter needs the hidden states of the tokens before the first one computed)."""
        check_sizes(num_blocks, block_size, watermark)
        p = workload.prefixes
        totals = np.asarray(workload.prompt_tokens + workload.output_tokens, dtype=np.int64)
        segments = None if p is None else (p.ids, p.tokens, p.offsets)
        self.arrays = make_kv(num_blocks, block_size, len(workload), int(watermark * num_blocks), totals, segments,
                              drop_last=drop_last_block)  # fmt: skip

    def keys(self, req: int) -> IntArray:
        """The keys of ``req``'s full blocks, in order."""
        out = np.zeros(int(self.arrays[0][NKEYS, req]), dtype=np.int64)
        prefix.keys(self.arrays, req, out)
        return out

    def lookup(self, req: int, num_tokens: int) -> tuple[int, int]:
        """Blocks of ``req``'s leading full blocks found cached, of at most ``num_tokens - 1`` tokens, and how many of
        those nobody references now. Changes nothing."""
        hits, unreferenced = prefix.lookup(self.arrays, req, num_tokens)
        return int(hits), int(unreferenced)

    @property
    def cached_blocks(self) -> int:
        """Blocks that hold a cached prefix (referenced or not)."""
        ks = self.arrays[1]
        return int(ks[CACHED] + ks[EVICTABLE])

    @property
    def query_tokens(self) -> int:
        return int(self.arrays[1][QUERY_TOKENS])

    @property
    def hit_tokens(self) -> int:
        return int(self.arrays[1][HIT_TOKENS])

    @property
    def evictions(self) -> int:
        return int(self.arrays[1][EVICTIONS])

    def counters(self) -> dict[str, int]:
        """The hit-rate counters (tokens and blocks looked up and found at admissions) and evictions."""
        ks = self.arrays[1]
        return {
            "prefix_cache_queries": int(ks[QUERY_TOKENS]),
            "prefix_cache_hits": int(ks[HIT_TOKENS]),
            "prefix_cache_query_blocks": int(ks[QUERY_BLOCKS]),
            "prefix_cache_hit_blocks": int(ks[HIT_BLOCKS]),
            "prefix_cache_evictions": int(ks[EVICTIONS]),
        }

    # ---- views, for tests and for reading a run's cache -----------------------------------------------------------
    @property
    def refcount(self) -> dict[int, int]:
        """Cached block key -> requests referencing it (referenced blocks only)."""
        entries = self.arrays[3]
        live = np.flatnonzero(entries[REFS] > 0)
        return {int(entries[KEY, e]): int(entries[REFS, e]) for e in live}

    @property
    def evictable(self) -> list[int]:
        """Keys of the cached blocks nobody references, least recently freed (evicted) first."""
        entries, out, e = self.arrays[3], [], int(self.arrays[1][LRU_HEAD])
        while e != EMPTY:
            out.append(int(entries[KEY, e]))
            e = int(entries[NEXT, e])
        return out

    @property
    def shared(self) -> dict[int, list[int]]:
        """Request -> keys of the cached blocks it references, in order (requests that reference some)."""
        kr, out = self.arrays[0], {}
        for req in np.flatnonzero(kr[REGISTERED] > 0).tolist():
            keys = self.keys(req)
            refs = [
                int(keys[j])
                for j in range(min(int(kr[REGISTERED, req]), len(keys)))
                if prefix.references(self.arrays, req, j)
            ]
            if refs:
                out[req] = refs
        return out
