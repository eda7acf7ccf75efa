"""The KV-cache memory manager: the one place in ferry that does block arithmetic.

The cache holds ``num_blocks`` blocks of ``block_size`` tokens each (vLLM's paged layout). A request holds
``ceil(tokens / block_size)`` blocks for the tokens whose KV it keeps. Policies ask ``allocate`` for room for a number
of tokens and get ``True`` (granted) or ``False`` (no room, nothing changed); they never count blocks themselves.

The state is ``sim.kernels.kvstate``'s arrays (``arrays``) and every operation is a kernel of ``sim.kernels.kv``:
the compiled engine calls those kernels on the same arrays, so both engines run one implementation. The classes
here are what Python callers (the reference engine's policies, the real executor) hold.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sim.kernels import kv as kernels
from sim.kernels.kvstate import BLOCK_SIZE, CACHING, HELD, KV, NUM_BLOCKS, PRESENT, USED, WATERMARK, grow_rows, make_kv

IntArray = npt.NDArray[np.int64]
NOTHING = np.zeros(0, dtype=np.int64)  # no step being built (``found``)


class KVCacheManager:
    """Paged KV-cache accounting for one replica, per request, in blocks."""

    def __init__(self, num_blocks: int, block_size: int, num_requests: int, watermark: float = 0.0) -> None:
        """``num_blocks`` blocks of ``block_size`` tokens; ``watermark`` is the fraction of blocks that admission of a
        new request must leave free (vLLM V0's ``watermark``), so running requests have room to grow."""
        check_sizes(num_blocks, block_size, watermark)
        self.arrays: KV = make_kv(num_blocks, block_size, num_requests, int(watermark * num_blocks))

    @property
    def caching(self) -> bool:
        """Whether this cache caches prefixes (``sim.prefix_cache.PrefixCachingKV``)."""
        return bool(self.arrays[1][CACHING])

    @property
    def num_blocks(self) -> int:
        return int(self.arrays[1][NUM_BLOCKS])

    @property
    def block_size(self) -> int:
        return int(self.arrays[1][BLOCK_SIZE])

    @property
    def watermark_blocks(self) -> int:
        """Blocks admission must leave free while something runs."""
        return int(self.arrays[1][WATERMARK])

    @watermark_blocks.setter
    def watermark_blocks(self, blocks: int) -> None:
        self.arrays[1][WATERMARK] = blocks

    @property
    def held(self) -> IntArray:
        """Blocks each request holds (a view: the cache's own row)."""
        return self.arrays[0][HELD]

    @held.setter
    def held(self, value: IntArray) -> None:
        """A longer ``held`` (a live server's new requests): the rows grow to it."""
        if len(value) != self.arrays[0].shape[1]:
            self.arrays = grow_rows(self.arrays, len(value))
        self.arrays[0][HELD] = value

    @property
    def used(self) -> int:
        """Blocks held by all requests (a block several reference counts once)."""
        return int(self.arrays[1][USED])

    @property
    def free(self) -> int:
        """Blocks nobody holds."""
        return self.num_blocks - self.used

    @property
    def capacity_tokens(self) -> int:
        """Tokens the whole cache can hold."""
        return self.num_blocks * self.block_size

    def blocks_for(self, tokens: int | IntArray) -> int | IntArray:
        """Blocks needed to hold ``tokens`` tokens (ceil division)."""
        return -(-tokens // self.block_size)

    def extra_blocks(self, req: int, tokens: int) -> int:
        """Blocks ``req`` must add to hold ``tokens`` tokens in all (0 if it already holds enough)."""
        return max(0, -(-tokens // self.block_size) - int(self.held[req]))

    def can_allocate(self, req: int, tokens: int, admission: bool = False) -> bool:
        """Whether ``req`` could grow to ``tokens`` tokens now; ``admission`` also keeps the watermark free."""
        return bool(kernels.fits(self.arrays, req, tokens, 0, 0, admission))

    def allocate(self, req: int, tokens: int, admission: bool = False) -> bool:
        """Grow ``req``'s holding to cover ``tokens`` tokens in all. ``False`` (and no change) if there is no room."""
        return bool(kernels.allocate(self.arrays, req, tokens, admission))

    def allocate_all(self, reqs: IntArray, tokens: IntArray) -> bool:
        """Grow every ``reqs[k]`` to ``tokens[k]`` tokens, all or nothing (the fast path for a decode batch)."""
        ids, want = _ints(reqs), _ints(tokens)
        return bool(kernels.allocate_all(self.arrays, ids, want, len(ids)))

    def computed(self, reqs: IntArray, computed: IntArray) -> None:
        """``reqs`` hold KV for ``computed`` tokens each (scheduled, or after an iteration): a prefix cache caches
        their full blocks."""
        if self.caching:
            ids = _ints(reqs)
            kernels.register_all(self.arrays, ids, _ints(computed), len(ids))

    def free_request(self, req: int) -> int:
        """Release every block ``req`` holds; returns how many."""
        return int(kernels.free(self.arrays, req))

    # ---- admission (``policies.base.admit_waiting``): the same three calls, whatever the cache does ---------------
    def found(
        self, req: int, num_tokens: int, ids: list[int], news: list[int], computed: IntArray, start: int = 0
    ) -> tuple[int, int, int]:
        """Tokens of ``req`` (``num_tokens`` in all) whose KV is present at admission, the cached blocks behind them,
        and how many of those nobody references (``sim.kernels.kv.found``); ``ids`` and ``news`` are the step being
        built so far (from ``start`` on not yet cached), ``computed`` the requests' computed tokens."""
        if self.caching and len(ids) > start:
            step_ids, step_news = _ints(ids), _ints(news)
            return kernels.found(self.arrays, req, num_tokens, step_ids, step_news, computed, start, len(step_ids))
        return kernels.found(self.arrays, req, num_tokens, NOTHING, NOTHING, NOTHING, 0, 0)

    def fits(self, req: int, tokens: int, hits: int, unreferenced: int, admission: bool) -> bool:
        """Whether ``req`` could hold ``tokens`` tokens with its first ``hits`` blocks found cached."""
        return bool(kernels.fits(self.arrays, req, tokens, hits, unreferenced, admission))

    def take(self, req: int, hits: int, num_tokens: int) -> None:
        """``req`` was admitted with what ``found`` found."""
        kernels.take(self.arrays, req, hits, num_tokens)


class TransferredKV(KVCacheManager):
    """A decode replica's cache under prefill/decode disaggregation: request ``req`` arrives with the KV of its first
    ``present[req]`` tokens computed on a prefill replica and sent over. Admission allocates their blocks (they must
    fit, as vLLM's ``KVCacheManager.allocate_slots`` asks of a remote prefill's blocks) and counts them as computed
    (``found``); a request preempted later recomputes everything here."""

    def __init__(
        self, num_blocks: int, block_size: int, present: npt.NDArray[np.int64], watermark: float = 0.0
    ) -> None:
        check_sizes(num_blocks, block_size, watermark)
        tokens = np.asarray(present, dtype=np.int64)
        self.arrays = make_kv(num_blocks, block_size, len(tokens), int(watermark * num_blocks), present=tokens)

    @property
    def present(self) -> IntArray:
        """Tokens whose KV each request brought (0 once admitted: after a preemption it recomputes them)."""
        return self.arrays[0][PRESENT]


def check_sizes(num_blocks: int, block_size: int, watermark: float) -> None:
    if num_blocks < 1:
        raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if not 0.0 <= watermark < 1.0:
        raise ValueError(f"watermark must be in [0, 1), got {watermark}")


def _ints(values: npt.ArrayLike) -> IntArray:
    return np.ascontiguousarray(values, dtype=np.int64)
