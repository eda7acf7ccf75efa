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
  and scheduled), so a request admitted later in the same step already finds it; two requests that compute the
  same block in one step keep one cached copy and the other's stays private;
- every full block is cached, a request's own content too: a preempted request finds its own blocks again when it
  is readmitted, if they are still there;
- a freed block with nothing cached (a partial block, a second copy) is reused first; a freed cached block stays
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
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from sim.kvcache import KVCacheManager
from sim.workload import Workload

IntArray = npt.NDArray[np.int64]
NO_KEY = -1  # a block whose content cannot be looked up (not cached)
_OWN = 0x6F776E  # marks the keys of a request's own blocks
_MASK = (1 << 63) - 1


class PrefixCachingKV(KVCacheManager):
    """``KVCacheManager`` with automatic prefix caching. ``keys_of(req)`` gives the keys of a request's full blocks
    in order (``NO_KEY`` where unshared), over its prompt and output; it is asked once per request, when needed."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_requests: int,
        keys_of: Callable[[int], IntArray],
        watermark: float = 0.0,
    ) -> None:
        super().__init__(num_blocks, block_size, num_requests, watermark)
        self.keys_of = keys_of
        self._keys: dict[int, IntArray] = {}
        self.refcount: dict[int, int] = {}  # cached block key -> requests referencing it
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced, least recently freed first
        self.shared: dict[int, list[int]] = {}  # request -> keys of the cached blocks it references, in order
        self.registered = np.zeros(num_requests, dtype=np.int64)  # leading blocks of a request looked at for caching
        # counters, over admissions (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens, and in blocks)
        self.query_tokens = 0
        self.hit_tokens = 0
        self.query_blocks = 0
        self.hit_blocks = 0
        self.evictions = 0

    def keys(self, req: int) -> IntArray:
        keys = self._keys.get(req)
        if keys is None:
            keys = self._keys[req] = np.asarray(self.keys_of(req), dtype=np.int64)
        return keys

    @property
    def cached_blocks(self) -> int:
        """Blocks that hold a cached prefix (referenced or not)."""
        return len(self.refcount) + len(self.evictable)

    def lookup(self, req: int, num_tokens: int) -> tuple[int, int]:
        """Blocks of ``req``'s leading full blocks found cached, of at most ``num_tokens - 1`` tokens, and how many of
        those nobody references now (taking them uses free room). Changes nothing."""
        keys = self.keys(req)
        most = min(len(keys), max(num_tokens - 1, 0) // self.block_size)
        hits = unreferenced = 0
        for key in keys[:most]:
            if key == NO_KEY:
                break
            if key in self.refcount:
                hits += 1
            elif key in self.evictable:
                hits += 1
                unreferenced += 1
            else:
                break
        return hits, unreferenced

    def can_admit(self, req: int, tokens: int, hits: int, unreferenced: int, admission: bool) -> bool:
        """Whether ``req`` could hold ``tokens`` tokens with its first ``hits`` blocks taken from the cache."""
        reserve = self.watermark_blocks if admission else 0
        new = max(0, int(self.blocks_for(tokens)) - hits - int(self.held[req]))
        return new + unreferenced <= self.free - reserve

    def take(self, req: int, hits: int, num_tokens: int) -> None:
        """``req`` (holding nothing) references its first ``hits`` cached blocks, found by ``lookup`` for a request of
        ``num_tokens`` tokens; counts the lookup in the hit rate."""
        assert self.held[req] == 0, "a request takes cached blocks only when admitted with nothing held"
        refs = self.shared.setdefault(req, [])
        for key in self.keys(req)[:hits]:
            k = int(key)
            if k in self.evictable:
                del self.evictable[k]
                self.refcount[k] = 1
                self.used += 1
            else:
                self.refcount[k] += 1
            refs.append(k)
        self.held[req] = hits
        self.registered[req] = hits
        self.query_tokens += num_tokens
        self.hit_tokens += hits * self.block_size
        self.query_blocks += num_tokens // self.block_size
        self.hit_blocks += hits

    def allocate(self, req: int, tokens: int, admission: bool = False) -> bool:
        extra = self.extra_blocks(req, tokens)
        reserve = self.watermark_blocks if admission else 0
        if extra > self.free - reserve:
            return False
        self._make_room(extra)
        self.held[req] += extra
        self.used += extra
        return True

    def allocate_all(self, reqs: IntArray, tokens: IntArray) -> bool:
        extra = np.maximum(self.blocks_for(tokens) - self.held[reqs], 0)
        total = int(extra.sum())
        if total > self.free:
            return False
        self._make_room(total)
        self.held[reqs] += extra
        self.used += total
        return True

    def _make_room(self, blocks: int) -> None:
        """Evict cached, unreferenced blocks until ``blocks`` blocks are empty (nothing cached in them)."""
        empty = self.num_blocks - self.used - len(self.evictable)
        for _ in range(max(0, blocks - empty)):
            self.evictable.popitem(last=False)
            self.evictions += 1

    def computed(self, reqs: IntArray, computed: IntArray) -> None:
        """Cache the blocks of ``reqs`` that ``computed`` tokens fill: when a step is scheduled (the tokens computed
        and scheduled, before a later admission's lookup) and after it ran (idempotent)."""
        full = computed // self.block_size
        for req, blocks in zip(reqs.tolist(), full.tolist(), strict=True):
            start = int(self.registered[req])
            if blocks <= start:
                continue
            keys = self.keys(req)
            refs = self.shared.setdefault(req, [])
            for j in range(start, min(blocks, len(keys))):
                k = int(keys[j])
                if k == NO_KEY or k in self.refcount or k in self.evictable:
                    continue  # not to be cached, or a copy another request cached first: stays private
                self.refcount[k] = 1  # the request's own block becomes the cached one (used is unchanged)
                refs.append(k)
            self.registered[req] = blocks

    def free_request(self, req: int) -> int:
        blocks = int(self.held[req])
        refs = self.shared.pop(req, [])
        self.used -= blocks - len(refs)  # its private blocks
        for k in reversed(refs):  # tail first: the longest-shared blocks are evicted last
            left = self.refcount[k] - 1
            if left:
                self.refcount[k] = left
            else:
                del self.refcount[k]
                self.evictable[k] = None
                self.used -= 1
        self.held[req] = 0
        self.registered[req] = 0
        return blocks

    def counters(self) -> dict[str, int]:
        """The hit-rate counters (tokens and blocks looked up and found at admissions) and evictions."""
        return {
            "prefix_cache_queries": self.query_tokens,
            "prefix_cache_hits": self.hit_tokens,
            "prefix_cache_query_blocks": self.query_blocks,
            "prefix_cache_hit_blocks": self.hit_blocks,
            "prefix_cache_evictions": self.evictions,
        }


def block_keys(workload: Workload, block_size: int) -> Callable[[int], IntArray]:
    """The keys of each full block of a request's prompt and output: its segments' (``Prefixes.block_keys``), then
    keys of its own for the blocks past them (vLLM caches every full block; only the request itself can find these,
    when it is readmitted after a preemption)."""
    prefixes = workload.prefixes
    total = workload.prompt_tokens + workload.output_tokens

    def keys(req: int) -> IntArray:
        shared = np.empty(0, dtype=np.int64) if prefixes is None else prefixes.block_keys(req, block_size)
        own = [hash((_OWN, req, j)) & _MASK for j in range(len(shared), int(total[req]) // block_size)]
        return np.concatenate([shared, np.asarray(own, dtype=np.int64)])

    return keys
