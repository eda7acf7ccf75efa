"""The KV-cache memory manager: the one place in ferry that does block arithmetic.

The cache holds ``num_blocks`` blocks of ``block_size`` tokens each (vLLM's paged layout). A request holds
``ceil(tokens / block_size)`` blocks for the tokens whose KV it keeps. Policies ask ``allocate`` for room for a number
of tokens and get ``True`` (granted) or ``False`` (no room, nothing changed); they never count blocks themselves.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


class KVCacheManager:
    """Paged KV-cache accounting for one replica, per request, in blocks."""

    def __init__(self, num_blocks: int, block_size: int, num_requests: int, watermark: float = 0.0) -> None:
        """``num_blocks`` blocks of ``block_size`` tokens; ``watermark`` is the fraction of blocks that admission of a
        new request must leave free (vLLM V0's ``watermark``), so running requests have room to grow."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark}")
        self.num_blocks = int(num_blocks)
        self.block_size = int(block_size)
        self.watermark_blocks = int(watermark * num_blocks)
        self.held = np.zeros(num_requests, dtype=np.int64)  # blocks each request holds
        self.used = 0  # blocks held by all requests

    @property
    def free(self) -> int:
        """Blocks nobody holds."""
        return self.num_blocks - self.used

    @property
    def capacity_tokens(self) -> int:
        """Tokens the whole cache can hold."""
        return self.num_blocks * self.block_size

    def blocks_for(self, tokens: int | npt.NDArray[np.int64]) -> int | npt.NDArray[np.int64]:
        """Blocks needed to hold ``tokens`` tokens (ceil division)."""
        return -(-tokens // self.block_size)

    def extra_blocks(self, req: int, tokens: int) -> int:
        """Blocks ``req`` must add to hold ``tokens`` tokens in all (0 if it already holds enough)."""
        return max(0, -(-tokens // self.block_size) - int(self.held[req]))

    def can_allocate(self, req: int, tokens: int, admission: bool = False) -> bool:
        """Whether ``req`` could grow to ``tokens`` tokens now; ``admission`` also keeps the watermark free."""
        reserve = self.watermark_blocks if admission else 0
        return self.extra_blocks(req, tokens) <= self.free - reserve

    def allocate(self, req: int, tokens: int, admission: bool = False) -> bool:
        """Grow ``req``'s holding to cover ``tokens`` tokens in all. ``False`` (and no change) if there is no room."""
        extra = self.extra_blocks(req, tokens)
        reserve = self.watermark_blocks if admission else 0
        if extra > self.free - reserve:
            return False
        self.held[req] += extra
        self.used += extra
        return True

    def allocate_all(self, reqs: npt.NDArray[np.int64], tokens: npt.NDArray[np.int64]) -> bool:
        """Grow every ``reqs[k]`` to ``tokens[k]`` tokens, all or nothing (the fast path for a decode batch)."""
        extra = np.maximum(self.blocks_for(tokens) - self.held[reqs], 0)
        total = int(extra.sum())
        if total > self.free:
            return False
        self.held[reqs] += extra
        self.used += total
        return True

    def computed(self, reqs: npt.NDArray[np.int64], computed: npt.NDArray[np.int64]) -> None:
        """After an iteration, ``reqs`` hold KV for ``computed`` tokens each (a prefix cache registers full blocks;
        nothing to do here)."""

    def free_request(self, req: int) -> int:
        """Release every block ``req`` holds; returns how many."""
        blocks = int(self.held[req])
        self.held[req] = 0
        self.used -= blocks
        return blocks


class TransferredKV(KVCacheManager):
    """A decode replica's cache under prefill/decode disaggregation: request ``req`` arrives with the KV of its first
    ``present[req]`` tokens computed on a prefill replica and sent over. Admission allocates their blocks (they must
    fit, as vLLM's ``KVCacheManager.allocate_slots`` asks of a remote prefill's blocks) and counts them as computed
    (``policies.base.admit_waiting``); a request preempted later recomputes everything here."""

    def __init__(
        self, num_blocks: int, block_size: int, present: npt.NDArray[np.int64], watermark: float = 0.0
    ) -> None:
        super().__init__(num_blocks, block_size, len(present), watermark)
        self.present = np.asarray(present, dtype=np.int64).copy()  # tokens whose KV arrived with the request

    def found(self, req: int) -> int:
        """Tokens of ``req`` whose KV it brought (0 once taken: after a preemption it recomputes them)."""
        return int(self.present[req])

    def take(self, req: int) -> None:
        """``req`` was admitted with what it brought: its blocks are now its own, like any computed token's."""
        self.present[req] = 0
