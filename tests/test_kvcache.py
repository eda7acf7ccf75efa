"""The KV-cache manager's block arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.kvcache import KVCacheManager


def test_allocate_rounds_up_to_blocks_and_frees() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=16, num_requests=3)
    assert kv.allocate(0, 17)  # 2 blocks
    assert kv.held[0] == 2 and kv.used == 2
    assert kv.allocate(0, 32)  # still 2
    assert kv.used == 2
    assert kv.allocate(0, 33)
    assert kv.used == 3
    assert not kv.allocate(1, 16 * 8)  # 8 blocks > 7 free: refused, nothing changes
    assert kv.held[1] == 0 and kv.used == 3
    assert kv.allocate(1, 16 * 7)
    assert kv.free == 0
    assert kv.free_request(0) == 3
    assert kv.free == 3


def test_watermark_applies_to_admission_only() -> None:
    kv = KVCacheManager(num_blocks=100, block_size=1, num_requests=2, watermark=0.1)
    assert not kv.can_allocate(0, 95, admission=True)
    assert kv.can_allocate(0, 90, admission=True)
    assert kv.allocate(0, 95)  # growth of a running request may use the watermark


def test_allocate_all_is_all_or_nothing() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=2, num_requests=3)
    ids = np.array([0, 1, 2])
    assert kv.allocate_all(ids, np.array([2, 2, 2]))
    assert not kv.allocate_all(ids, np.array([3, 3, 2]))  # needs 2 more, 1 free
    assert list(kv.held) == [1, 1, 1]
    assert kv.allocate_all(ids, np.array([3, 2, 2]))
    assert kv.free == 0


@pytest.mark.parametrize("bad", [dict(num_blocks=0), dict(block_size=0), dict(watermark=1.0)])
def test_bad_sizes_are_refused(bad: dict) -> None:
    args = dict(num_blocks=4, block_size=2, num_requests=1) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        KVCacheManager(**args)


@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 200), st.booleans()), max_size=60))
def test_used_equals_sum_held_and_never_exceeds_capacity(ops: list) -> None:
    kv = KVCacheManager(num_blocks=20, block_size=8, num_requests=5)
    for req, tokens, free in ops:
        if free:
            kv.free_request(req)
        else:
            before = kv.held.copy()
            granted = kv.allocate(req, tokens)
            if not granted:
                assert (kv.held == before).all()
            else:
                assert kv.held[req] * kv.block_size >= tokens
        assert kv.used == kv.held.sum() <= kv.num_blocks
