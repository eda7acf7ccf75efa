"""The compiled engine against the reference: same summaries with the real cost model, histogram ITL within its
stated error, progress reports, and the engine choice."""

from __future__ import annotations

import io

import numpy as np
import pytest

from experiments.progress import Progress
from experiments.runner.config import RunConfig
from experiments.runner.simulation import run_simulation
from sim.records import HIST_REL_ERROR
from tests.helpers import ConstantTimer, LinearTimer, make_requests, run


def _config(policy: str, **extra: object) -> RunConfig:
    fields = {"model": "llama-3-8b", "hardware": "h100-sxm", "policy": policy, "num_prompts": 300,
              "request_rate": 30.0, "input_len": "lognormal:median=300,sigma=1.0,max=4000",
              "output_len": "lognormal:median=120,sigma=0.8,max=1000", "num_gpu_blocks_override": 1500,
              "seed": 5}  # fmt: skip
    if policy in ("static", "dynamic"):
        fields["max_batch_size"] = 16
    return RunConfig.model_validate(fields | extra)


@pytest.mark.parametrize(
    ("policy", "extra"),
    [("none", {}), ("static", {}), ("dynamic", {"max_delay_ms": 30.0, "preferred_batch_sizes": (4,)}),
     ("continuous", {}), ("continuous", {"mix_prefill_decode": True}), ("chunked", {"max_num_batched_tokens": 512}),
     ("static", {"kv_reservation": "max_model_len", "max_model_len": 4096}),
     ("continuous", {"kv_reservation": "output"}), ("chunked", {"kv_reservation": "max_model_len"})],
)  # fmt: skip
def test_same_summary_on_both_engines_with_the_roofline(policy: str, extra: dict) -> None:
    fast = run_simulation(_config(policy, engine="compiled", **extra)).summary
    reference = run_simulation(_config(policy, engine="reference", **extra)).summary
    assert fast.pop("engine") == "compiled" and reference.pop("engine") == "reference"
    fast["config"].pop("engine"), reference["config"].pop("engine")
    assert fast == reference
    if policy in ("continuous", "chunked") and "kv_reservation" not in extra:
        assert fast["total_preemptions"] > 0  # the small cache made them preempt: that path is compared too


@pytest.mark.parametrize(
    "extra",
    [{"enable_prefix_caching": True, "prefix_len": 512, "num_prefix_groups": 3},
     {"enable_prefix_caching": True, "turns": 3, "think_time_s": 1.0, "num_prompts": 100},
     {"turns": 3, "think_time_s": 0.5, "num_prompts": 100, "policy": "continuous"},
     {"disaggregation": {"prefill": {"count": 1}, "decode": {"count": 2}}}],
    ids=["prefix caching", "conversations cached", "conversations", "disaggregated"],
)  # fmt: skip
def test_every_kv_feature_gives_the_same_summary_on_both_engines(extra: dict) -> None:
    policy = extra.pop("policy", "chunked")
    fast = run_simulation(_config(policy, engine="compiled", **extra)).summary
    reference = run_simulation(_config(policy, engine="reference", **extra)).summary
    assert fast.pop("engine") == "compiled" and reference.pop("engine") == "reference"
    fast["config"].pop("engine"), reference["config"].pop("engine")
    assert fast == reference


def test_histogram_itl_is_within_its_stated_error_of_exact() -> None:
    exact = run_simulation(_config("chunked", itl="exact")).summary
    hist = run_simulation(_config("chunked", itl="histogram")).summary
    assert exact["itl_kept"] == "exact" and hist["itl_kept"].startswith("histogram")
    assert hist["mean_itl_ms"] == pytest.approx(exact["mean_itl_ms"], rel=1e-9)
    assert hist["std_itl_ms"] == pytest.approx(exact["std_itl_ms"], rel=1e-6)
    for key in ("median_itl_ms", "p90_itl_ms", "p99_itl_ms"):
        assert hist[key] == pytest.approx(exact[key], rel=2 * HIST_REL_ERROR), key
    same = {k for k in exact if "itl" not in k and k != "config"}
    assert {k: exact[k] for k in same} == {k: hist[k] for k in same}


def test_progress_is_reported_and_drawn_only_on_a_terminal() -> None:
    calls: list[tuple[float, int, int]] = []
    run_simulation(_config("chunked", num_prompts=3000, request_rate=200.0), on_progress=lambda *a: calls.append(a))
    assert calls and all(total == 3000 and 0 <= left <= 3000 for _, left, total in calls)
    quiet = io.StringIO()
    bar = Progress(quiet, min_interval_s=0.0)
    bar(1.0, 10, 20)
    bar.close()
    assert quiet.getvalue() == ""

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    loud = Tty()
    bar = Progress(loud, min_interval_s=0.0)
    bar(12.5, 5, 20)
    bar.close()
    assert "15/20 requests" in loud.getvalue() and loud.getvalue().endswith("\n")


def test_engine_choice() -> None:
    reqs = make_requests([0.0, 0.1], 10, 3)
    assert run(reqs, ConstantTimer(), policy="continuous", max_model_len=64).engine == "reference"  # no compiled timer
    with pytest.raises(ValueError, match="compiled engine needs"):
        run(make_requests([0.0], 10, 3), ConstantTimer(), policy="continuous", max_model_len=64, engine="compiled")
    with pytest.raises(ValueError, match="engine="):
        run(make_requests([0.0], 10, 3), ConstantTimer(), policy="continuous", max_model_len=64, engine="fast")


def test_a_run_longer_than_the_first_log_grows_it() -> None:
    # ten requests of 500 tokens one at a time: 5000 iterations, past the log's first capacity of max(1024, 2n)
    rec = run(make_requests(np.arange(10.0), 4, 500), LinearTimer(), policy="none", max_model_len=1024,
              engine="compiled")  # fmt: skip
    assert len(rec.iterations) == 5000 and rec.engine == "compiled"
    assert (np.diff(rec.iterations.column("start")) > 0).all()


@pytest.mark.parametrize(
    "spec",
    ['{"method": "eagle3", "num_speculative_tokens": 3}',
     '{"method": "ngram", "num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 8, 4], '
     '[9, 256, 1]]}',
     '{"model": "llama-3-8b", "num_speculative_tokens": 2}'],
    ids=["eagle3", "ngram by batch size", "draft model"],
)  # fmt: skip
def test_speculative_decoding_gives_the_same_summary_on_both_engines(spec: str) -> None:
    extra = {"speculative_config": spec, "enable_prefix_caching": True, "prefix_len": 256, "num_prefix_groups": 2,
             "model": "llama-3.1-8b", "max_model_len": 8192}  # fmt: skip
    fast = run_simulation(_config("chunked", engine="compiled", **extra)).summary
    reference = run_simulation(_config("chunked", engine="reference", **extra)).summary
    assert fast.pop("engine") == "compiled" and reference.pop("engine") == "reference"
    fast["config"].pop("engine"), reference["config"].pop("engine")
    assert fast == reference and fast["spec_decode_num_drafts"] > 0
