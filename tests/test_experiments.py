"""The experiment scripts run end to end on small inputs (their full-size results are in docs/)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments import bench, paged_vs_static


def test_paged_vs_static_runs_and_paging_wins(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(0)
    lengths = tmp_path / "lengths.csv"
    prompts, outputs = rng.integers(20, 600, 300), rng.integers(20, 400, 300)
    lengths.write_text(
        "num_prefill_tokens,num_decode_tokens\n" + "".join(f"{p},{o}\n" for p, o in zip(prompts, outputs, strict=True))
    )
    out = tmp_path / "r.json"
    args = ["--lengths", str(lengths), "--num-prompts", "150", "--batch-sizes", "4", "--rel-tol", "0.1",
            "--max-normalized-latency-ms", "150", "--json", str(out)]  # fmt: skip
    assert paged_vs_static.main(args) == 0
    assert "paged continuous / continuous, reserve max_model_len" in capsys.readouterr().out
    rates = json.loads(out.read_text())["max_rate"]
    assert rates[paged_vs_static.PAGED] > rates[paged_vs_static.ORCA_MAX] > 0


def test_bench_measures_one_case_and_the_bare_loop() -> None:
    row = bench.one_case("chunked", 300, "compiled", seed=0)
    assert row["requests"] == 300 and row["completed"] == 300 and row["iterations"] > 300
    assert row["engine"] == "compiled" and row["wall_s"] > 0 and row["peak_rss_mb"] > 0
    assert bench.bare_simpy(1000) > 0
    cached = bench.one_case("chunked", 300, "compiled", feature="prefix-caching", seed=0)
    assert cached["feature"] == "prefix-caching" and cached["completed"] == 300
    # the goals compare a feature's time per iteration with the plain case of its size
    lines = bench.goals([row, cached])
    assert len(lines) == 1 and "prefix-caching" in lines[0] and "per iteration" in lines[0]


def test_the_disaggregation_study_finds_each_layouts_goodput() -> None:
    from experiments.studies import disaggregation as study

    layouts = study.layouts(3)
    assert list(layouts)[-2:] == ["disaggregated 1P:2D", "disaggregated 2P:1D"]
    assert sum(name.startswith("aggregated") for name in layouts) == 1 + len(study.SMALL_BUDGETS)
    rate, summary = study.goodput("short", layouts["disaggregated 1P:2D"], seconds=4.0)
    assert rate > 0 and summary is not None and study.attainment(summary) >= study.ATTAINMENT
    assert summary["num_gpus"] == 3 and summary["kv_transfer"]["transfers"] == summary["completed"]
    rows = [{"workload": "short", "layout": "disaggregated 1P:2D", "goodput_per_gpu": rate / 3, "p90_ttft_ms": 30.0,
             "p90_tpot_ms": 11.0}, {"workload": "short", "layout": "aggregated x3", "goodput_per_gpu": rate / 6,
             "p90_ttft_ms": None, "p90_tpot_ms": None}]  # fmt: skip
    assert "2.00x" in study.table(rows)
