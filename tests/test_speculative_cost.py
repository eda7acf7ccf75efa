"""What speculative decoding costs in the roofline: the verification step (each sequence's query of 1 + k tokens over
its context) and the drafter's own work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from costmodel import CostModel, IterationShape, load_hardware, load_model
from costmodel.drafting import NGRAM_HOST_S, drafter_for


@pytest.fixture(scope="module", params=["llama-3-8b", "deepseek-v3"])
def cost(request: pytest.FixtureRequest) -> CostModel:
    tp = 8 if request.param == "deepseek-v3" else 1
    return CostModel(load_model(request.param), load_hardware("h100-sxm.datasheet"), tp=tp, tables=False)


def test_a_one_token_verification_is_a_decode_to_the_last_bit(cost: CostModel) -> None:
    decode = IterationShape.of(decode=[(32, 1000)])
    verify = IterationShape.of(verify=[(32, 1, 1000)])
    assert cost.iteration_time(verify) == cost.iteration_time(decode)


def test_a_verification_reads_its_context_once(cost: CostModel) -> None:
    """q query tokens over a context cost more than one decode (more FLOPs, more LM-head rows) but far less than q
    decodes: the weights and the context's KV are read once."""
    one = cost.iteration_time(IterationShape.of(decode=[(8, 4000)]))
    verify = cost.iteration_time(IterationShape.of(verify=[(8, 5, 4000)]))
    five = 5 * one
    assert one < verify < 0.5 * five
    attention = cost.explain(IterationShape.of(verify=[(8, 5, 4000)])).op("attention_verify")
    decodes = cost.explain(IterationShape.of(decode=[(40, 4000)])).op("attention_decode")
    assert attention.bytes < 0.3 * decodes.bytes  # 8 contexts read, not 40


def test_verifications_count_as_tokens_sequences_and_sampled_rows() -> None:
    shape = IterationShape.of(prefill=[(100, 0)], decode=[(2, 50)], verify=[(3, 4, 10)])
    assert (shape.num_tokens, shape.num_seqs, shape.num_sampled) == (114, 6, 15)
    b = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm")).explain(shape)
    assert (b.num_tokens, b.num_seqs, b.num_sampled) == (114, 6, 15)
    assert np.isclose(b.time_s, b.gpu_time_s + b.communication_s + b.overhead_s)


def test_the_drafters_work_follows_its_kind_and_draft_count() -> None:
    target = load_model("llama-3.1-8b")
    shape = IterationShape.of(decode=[(16, 2000)], verify=[(16, 4, 2000)])
    times = {}
    for method, k in (("eagle", 1), ("eagle", 3), ("eagle3", 3), ("ngram", 3)):
        cm = CostModel(target, load_hardware("h100-sxm.datasheet"))
        cm.speculate(drafter_for(method, k, target))
        b = cm.explain(shape)
        assert b.time_s == pytest.approx(cm.iteration_time(shape), rel=1e-12) and b.drafting_s > 0
        times[method, k] = b.drafting_s
    assert times["eagle", 1] < times["eagle", 3]  # k - 1 more passes over the sequences
    assert times["ngram", 3] == pytest.approx(32 * NGRAM_HOST_S)  # host time a sequence
    assert times["eagle", 3] < 0.3 * CostModel(target, load_hardware("h100-sxm.datasheet")).iteration_time(shape)


def test_a_draft_count_of_zero_drafts_nothing() -> None:
    target = load_model("llama-3-8b")
    cm = CostModel(target, load_hardware("h100-sxm.datasheet"))
    cm.speculate(drafter_for("eagle", 2, target, per_batch=np.array([0, 2, 0], dtype=np.int64)))
    assert cm.explain(IterationShape.of(decode=[(2, 100)])).drafting_s == 0.0
    assert cm.explain(IterationShape.of(decode=[(1, 100)])).drafting_s > 0.0


def test_the_drafter_holds_memory_and_a_draft_model_costs_its_layers() -> None:
    target, hw = load_model("llama-3.1-70b"), load_hardware("h100-sxm")
    plain = CostModel(target, hw, tp=4).memory_plan()
    cm = CostModel(target, hw, tp=4)
    cm.speculate(drafter_for("draft_model", 4, target, load_model("llama-3.1-8b"), tp=4))
    drafted = cm.memory_plan()
    assert drafted.weight_bytes_per_gpu > plain.weight_bytes_per_gpu + 3e9  # an 8B model over 4 GPUs
    assert drafted.kv_bytes_per_token > plain.kv_bytes_per_token and drafted.num_gpu_blocks < plain.num_gpu_blocks


def test_ferry_iteration_shows_verification_and_drafting(capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.cli import main

    args = ["iteration", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--decode", "16@2000"]
    assert main([*args, "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 3}']) == 0
    text = capsys.readouterr().out
    assert "attention_verify" in text and "verification" in text and "drafting" in text and "plain" in text
    assert main([*args, "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}', "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["drafting"]["time_s"] > 0 and out["speculative_decoding"]["num_speculative_tokens"] == 2
