"""Multi-turn conversations (``--turns``, ``sim.workload.sessions``): a turn is sent a think time after the turn
before has ended, its prompt is the conversation so far, a prefix cache spares what the turn before computed, and a
rejected turn ends its conversation with a reason."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.runner.config import RunConfig
from experiments.runner.simulation import build_workload, run_simulation
from sim.metrics import request_frame
from sim.request import Reason, Status

BASE = {"policy": "chunked", "num_prompts": 20, "request_rate": 2, "input_len": "uniform:50:300",
        "output_len": "uniform:20:200", "turns": 4, "think_time_s": 3.0, "seed": 5}  # fmt: skip


def test_a_turn_is_sent_a_think_time_after_the_turn_before_ends() -> None:
    config = RunConfig.model_validate(BASE)
    w = build_workload(config)
    assert len(w) == 80 and list(w.ids()[:2]) == ["0-1", "1-1"] and w.ids()[20] == "0-2"
    r = run_simulation(config).records.requests
    later = np.flatnonzero(w.after >= 0)
    before = w.after[later]
    np.testing.assert_allclose(r.arrival[later], r.finish[before] + w.think_s[later], rtol=0, atol=1e-12)
    assert (r.first_scheduled[later] >= r.arrival[later]).all()
    # the conversation so far, then a new message
    assert (w.prompt_tokens[later] > w.prompt_tokens[before] + w.output_tokens[before]).all()
    assert (r.status == Status.FINISHED).all()


def test_the_cache_spares_what_the_turn_before_computed() -> None:
    config = RunConfig.model_validate(BASE | {"enable_prefix_caching": True})
    w = build_workload(config)
    result = run_simulation(config)
    r = result.records.requests
    later = np.flatnonzero(w.after >= 0)
    before = w.after[later]
    computed_before = w.prompt_tokens[before] + w.output_tokens[before] - 1  # the last token is sampled, not computed
    blocks = np.minimum(computed_before // 16, (w.prompt_tokens[later] - 1) // 16)
    np.testing.assert_array_equal(r.cached[later], blocks * 16)  # a cache this large evicts nothing
    assert result.summary["prefix_cache_evictions"] == 0
    off = run_simulation(RunConfig.model_validate(BASE | {"enable_prefix_caching": False})).summary
    assert result.summary["mean_ttft_ms"] < 0.8 * off["mean_ttft_ms"]


def test_a_rejected_turn_ends_its_conversation_and_the_counts_add_up() -> None:
    config = RunConfig.model_validate(BASE | {"max_model_len": 900})  # later turns outgrow it
    result = run_simulation(config)
    r = result.records.requests
    w = build_workload(config)
    too_long = r.reason == Reason.EXCEEDS_MAX_MODEL_LEN
    ended = r.reason == Reason.EARLIER_TURN_REJECTED
    assert too_long.any() and ended.any()
    assert ((r.status == Status.FINISHED) | (r.status == Status.REJECTED)).all()
    assert (r.reason[w.after[ended]] != Reason.NONE).all()  # the turn before was rejected too
    s = result.summary
    assert s["completed"] + s["failed"] == len(w) == 80
    assert s["rejected_by_reason"]["earlier_turn_rejected"] == int(ended.sum())


def test_same_seed_same_conversations() -> None:
    a = run_simulation(RunConfig.model_validate(BASE)).summary
    b = run_simulation(RunConfig.model_validate(BASE)).summary
    assert a["mean_ttft_ms"] == b["mean_ttft_ms"] and a["duration"] == b["duration"]


def test_conversations_are_refused_where_they_cannot_run() -> None:
    with pytest.raises(ValueError, match="multi-turn sessions run on one replica"):
        run_simulation(RunConfig.model_validate(BASE | {"replicas": 2}))
    with pytest.raises(ValueError, match="turns=3: synthetic-workload"):
        RunConfig.model_validate({"trace": "x.csv", "turns": 3})


def test_conversations_run_on_both_engines_to_the_same_records() -> None:
    compiled = run_simulation(RunConfig.model_validate(BASE | {"engine": "compiled"}))
    reference = run_simulation(RunConfig.model_validate(BASE | {"engine": "reference"}))
    assert compiled.records.engine == "compiled" and reference.records.engine == "reference"
    assert request_frame(compiled.records).equals(request_frame(reference.records))
    assert compiled.records.iterations.to_frame().equals(reference.records.iterations.to_frame())
