"""``--speculative-config`` as vLLM 0.32.0 reads it, the acceptance presets, and the seeded acceptance draws."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.runner.speculative import (
    parse,
    preset_rates,
    presets,
    speculation,
    unconditional_rates,
)
from sim.kernels.speculation import accepted, conditional, uniform, uniform_py
from sim.speculation import dense_schedule


def test_vllm_keys_and_defaults() -> None:
    ngram = parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert ngram.k == 3 and ngram.lookup_window == (5, 5)
    assert parse('{"model": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}').lookup_window == (4, 4)
    assert parse({"method": "mtp"}).k == 1  # the MTP module's one prediction
    assert parse({"model": "llama-3.2-1b", "num_speculative_tokens": 4}).resolved_method == "draft_model"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"method": "eagle3"}', "give num_speculative_tokens"),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', "give model"),
        ('{"method": "eagle", "num_speculative_tokens": 2, "prompt_lookup_max": 3}', "only method ngram"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 3}', "<="),
        ('{"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic"}', "exactly one"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "synthetic_acceptance_rates": [0.5, 0.2]}', "only valid"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic", '
         '"synthetic_acceptance_rates": [0.5, 0.6]}', "non-increasing"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": "synthetic", '
         '"synthetic_acceptance_rates": [0.5]}', "length 2"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[2, 8, 1]]}',
         "start at 1"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": '
         '[[1, 8, 1], [4, 9, 2]]}', "non-overlapping"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "acceptance": "nope"}', "not a preset"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "block": 1}', "Extra inputs"),
        ("ngram", "not JSON"),
    ],
)  # fmt: skip
def test_refusals_name_the_key(config: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse(config)


def test_synthetic_length_is_vllms_minimum_variance_schedule() -> None:
    config = parse('{"method": "ngram", "num_speculative_tokens": 4, "rejection_sample_method": "synthetic", '
                   '"synthetic_acceptance_length": 2.5}')  # fmt: skip
    assert unconditional_rates(config, "llama-3-8b")[0] == [1.0, 0.5, 0.0, 0.0]


def test_conditional_rates_as_vllm_converts_them() -> None:
    assert conditional([0.8, 0.4, 0.0, 0.0]) == [0.8, 0.5, 0.0, 0.0]


def test_every_preset_gives_non_increasing_rates_and_cites_or_assumes() -> None:
    for name, entry in presets().items():
        rates = preset_rates(entry)
        assert rates and all(0 <= r <= 1 for r in rates), name
        assert all(b <= a + 1e-12 for a, b in zip(rates, rates[1:], strict=False)), name
        assert entry.get("source") or entry.get("assumption"), name
    # a chain drafter's lengths by k give the rates as differences (RedHat's Llama-4-Maverick EAGLE-3 card)
    maverick = preset_rates(presets()["eagle3-llama-4-maverick"])
    assert maverick[:3] == pytest.approx([0.86, 0.70, 0.52])
    # one published mean at k = 7, geometric: its mean acceptance length is the published one
    assert 1 + sum(preset_rates(presets()["eagle3-llama-3.1-8b"])) == pytest.approx(2.77, abs=1e-6)


def test_presets_by_method_and_model_and_their_extension() -> None:
    mtp = parse('{"method": "mtp", "num_speculative_tokens": 3}')
    rates, note = unconditional_rates(mtp, "deepseek-v3")
    assert "mtp-deepseek-v3" in note and "assumed" in note
    assert rates == pytest.approx([0.875, 0.875**2, 0.875**3])
    eagle = parse('{"method": "eagle3", "num_speculative_tokens": 2}')
    assert "eagle3-llama-4-maverick" in unconditional_rates(eagle, "llama-4-maverick")[1]
    assert "eagle3-llama-3.1-8b" in unconditional_rates(eagle, "qwen3-8b")[1]  # the method's default


def test_speculation_follows_vllms_lookahead_slots_and_block_drop() -> None:
    eagle = speculation(parse('{"method": "eagle3", "num_speculative_tokens": 3}'), "llama-3.1-8b", 8, 1)
    assert (eagle.lookahead, eagle.draft_slots, eagle.drop_cached_block, eagle.pad) == (3, 0, True, True)
    ngram = speculation(parse('{"method": "ngram", "num_speculative_tokens": 3}'), "llama-3.1-8b", 8, 1)
    assert (ngram.lookahead, ngram.draft_slots, ngram.drop_cached_block) == (0, 0, False)
    draft = speculation(parse('{"model": "llama-3.2-1b", "num_speculative_tokens": 2}'), "llama-3.1-8b", 8, 1)
    assert (draft.lookahead, draft.draft_slots) == (2, 1)
    kept = parse('{"method": "mtp", "disable_eagle_block_drop": true}')
    assert not speculation(kept, "deepseek-v3", 8, 1).drop_cached_block
    dynamic = parse('{"method": "ngram", "num_speculative_tokens": 4, '
                    '"num_speculative_tokens_per_batch_size": [[1, 2, 6], [5, 6, 2]]}')  # fmt: skip
    spec = speculation(dynamic, "llama-3-8b", 8, 1)
    assert not spec.pad and [spec.drafts_after(b) for b in range(1, 9)] == [4, 4, 4, 4, 2, 2, 2, 2]


def test_dense_schedule_fills_gaps_and_tail_as_vllm() -> None:
    dense = dense_schedule([(1, 16, 3), (32, 128, 2)], 200, 4)
    assert dense[1] == dense[16] == dense[17] == dense[31] == 3
    assert dense[32] == dense[128] == dense[200] == 2


def test_the_draws_are_seeded_the_same_in_python_and_compiled_and_uniform() -> None:
    points = [(s, r, g, j) for s in (0, 7, 2**40) for r in (0, 5, 10**6) for g in (0, 1, 999) for j in range(5)]
    assert all(uniform(*p) == uniform_py(*p) for p in points)
    u = np.array([uniform(3, r, g, 0) for r in range(100) for g in range(100)])
    assert abs(u.mean() - 0.5) < 0.01 and 0.0 <= u.min() and u.max() < 1.0
    rates = np.array([0.8, 0.75, 0.5])
    counts = np.bincount([accepted(rates, 3, r, g, 3) for r in range(100) for g in range(100)], minlength=4)
    # P(0) = 0.2, P(1) = 0.8 x 0.25, P(2) = 0.6 x 0.5, P(3) = 0.3
    assert counts / counts.sum() == pytest.approx([0.2, 0.2, 0.3, 0.3], abs=0.02)
    assert accepted(rates, 3, 1, 1, -3) == 0  # placeholders are never accepted
