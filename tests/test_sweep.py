"""`ferry sweep`: the same table serially, on a process pool and on a Dask LocalCluster; a sweep killed with SIGKILL
resumes without recomputing what it stored; failing points are recorded; where filters; the table's columns."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from experiments.cli import main
from experiments.sweep.spec import SweepSpec, combinations, expand, load_spec

ROOT = Path(__file__).resolve().parents[1]
SMALL = """base: {model: llama-3-8b, hardware: a100-80g, policy: chunked, num_prompts: 60, input_len: 256,
       output_len: 16, request_rate: 20}
grid:
  max_num_seqs: [8, 32]
  max_num_batched_tokens: [256, 1024]
seeds: 2
where: "max_num_batched_tokens >= 16 * max_num_seqs"
"""
COMPARED = ["point", "hash", "status", "seed", "max_num_seqs", "max_num_batched_tokens", "completed", "duration",
            "p99_ttft_ms", "mean_tpot_ms", "output_throughput"]  # fmt: skip


def _sweep(tmp_path: Path, name: str, *extra: str, spec: str = SMALL) -> pd.DataFrame:
    path = tmp_path / "sweep.yaml"
    path.write_text(spec)
    out = tmp_path / name
    assert main(["sweep", str(path), "--out", str(out), *extra]) == 0
    return pd.read_parquet(out / "results.parquet")


def test_the_same_table_serially_on_a_pool_and_on_dask(tmp_path: Path) -> None:
    from distributed import LocalCluster

    serial = _sweep(tmp_path, "serial", "--jobs", "1")
    pool = _sweep(tmp_path, "pool", "--jobs", "2")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        dask = _sweep(tmp_path, "dask", "--dask", cluster.scheduler_address)
    assert len(serial) == 6 and (serial.status == "ok").all()  # 4 combinations, 1 filtered out, x 2 seeds
    assert serial[COMPARED].equals(pool[COMPARED]) and serial[COMPARED].equals(dask[COMPARED])


def test_the_table_has_the_documented_columns(tmp_path: Path) -> None:
    table = _sweep(tmp_path, "cols", "--jobs", "1", "--csv")
    first = ["point", "hash", "status", "error", "seed", "wall_s", "ferry_version", "mode", "max_num_seqs",
             "max_num_batched_tokens"]  # fmt: skip
    assert list(table.columns[: len(first)]) == first
    for metric in ("p99_ttft_ms", "median_tpot_ms", "output_throughput", "gpu_idle_fraction", "completed"):
        assert metric in table.columns
    meta = pq.read_schema(tmp_path / "cols" / "results.parquet").metadata
    assert json.loads(meta[b"ferry.swept"]) == ["max_num_seqs", "max_num_batched_tokens", "seed"]
    assert (tmp_path / "cols" / "results.csv").is_file()
    assert table.hash.is_unique and (table.wall_s > 0).all()


def test_where_filters_and_zip_goes_together() -> None:
    spec = SweepSpec.model_validate({"grid": {"a": [1, 2, 3]}, "zip": {"b": [10, 20], "c": ["x", "y"]},
                                     "where": ["a != 2", "b * a < 40"]})  # fmt: skip
    assert combinations(spec) == [{"a": 1, "b": 10, "c": "x"}, {"a": 1, "b": 20, "c": "y"}, {"a": 3, "b": 10, "c": "x"}]
    with pytest.raises(ValueError, match="not allowed"):
        combinations(SweepSpec.model_validate({"grid": {"a": [1]}, "where": "__import__('os')"}))
    with pytest.raises(ValueError, match="equal lengths"):
        SweepSpec.model_validate({"zip": {"a": [1, 2], "b": [1]}})


def test_a_failing_point_is_stored_with_its_error(tmp_path: Path) -> None:
    spec = SMALL.replace("max_num_seqs: [8, 32]", "max_num_seqs: [8, 32]\n  hardware: [a100-80g, no-such-gpu]")
    table = _sweep(tmp_path, "fail", "--jobs", "1", spec=spec)
    bad = table[table.hardware == "no-such-gpu"]
    assert len(bad) == 6 and (bad.status == "error").all() and bad.error.str.contains("no-such-gpu").all()
    assert (table[table.hardware == "a100-80g"].status == "ok").all()


OVERLOADING = """base: {model: llama-3-8b, hardware: a100-80g, policy: chunked, num_prompts: 60, input_len: 256,
       output_len: 16}
grid:
  request_rate: [2, 20, 200]
  max_num_seqs: [4, 16]
"""


def test_overloaded_points_are_marked_counted_and_said(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Each point's ``overloaded`` is `ferry run`'s own test on that point's run (its summary's ``overload``), with
    the rate it sustains; the sweep says how many there were and what to do, and sweep.json counts them."""
    from experiments.runner.simulation import run_simulation

    table = _sweep(tmp_path, "hot", "--jobs", "1", spec=OVERLOADING)
    assert (table.status == "ok").all() and table.overloaded.dtype == bool
    for point in expand(SweepSpec.model_validate(yaml.safe_load(OVERLOADING))):
        assert point.config is not None
        info = run_simulation(point.config).summary["overload"]
        row = table[table.hash == point.hash].iloc[0]
        assert row.overloaded == bool(info)
        assert row.sustained_rate == pytest.approx(info["sustained_rate"]) if info else pd.isna(row.sustained_rate)
    hot = int(table.overloaded.sum())
    by_rate = table.groupby("request_rate").overloaded.sum()
    assert by_rate[2] == 0 and by_rate[200] == 2 and 0 < hot < len(table)  # the low rate keeps up, the highest not
    err = capsys.readouterr().err
    assert f"ferry sweep: {hot} of {len(table)} points overloaded" in err and "lower request_rate" in err
    assert json.loads((tmp_path / "hot" / "sweep.json").read_text())["overloaded"] == hot


def test_a_capacity_the_slo_does_not_bound_is_flagged(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A TPOT limit alone bounds no wait: the rate search climbs to where the queue grows without end, and the
    sweep says that this rate is not a capacity."""
    spec = """base: {model: llama-3-8b, hardware: a100-80g, policy: chunked, num_prompts: 60, input_len: 256,
       output_len: 16, request_rate: 4, max_num_seqs: 16}
mode: max_rate
slo: {tpot_p99_ms: 100}
"""
    table = _sweep(tmp_path, "cap", "--jobs", "1", spec=spec)
    assert table.overloaded.all() and (table.sustained_rate < table.max_rate).all()
    assert "1 of 1 points overloaded at the highest rate meeting the SLO" in capsys.readouterr().err


def test_a_killed_sweep_resumes_without_recomputing(tmp_path: Path) -> None:
    spec = tmp_path / "big.yaml"
    spec.write_text(
        "base: {model: llama-3-8b, policy: chunked, num_prompts: 400, input_len: 512, output_len: 64,\n"
        "       request_rate: 20}\ngrid:\n  max_num_seqs: [8, 16, 32, 64, 128, 256]\nseeds: 5\n"
    )
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "experiments.cli", "sweep", str(spec), "--out", str(out), "--jobs", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    points = out / "points"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(points.glob("*.json")) if points.is_dir() else []) < 5:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    stored = len(list(points.glob("*.json")))
    assert 5 <= stored < 30, stored  # killed part way
    assert main(["sweep", str(spec), "--out", str(out), "--jobs", "1"]) == 0
    side = json.loads((out / "sweep.json").read_text())
    assert side["skipped"] == stored and side["ran"] == 30 - stored
    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == 30 and (table.status == "ok").all() and table.point.tolist() == list(range(30))


def test_changing_the_sweep_adds_only_the_new_points(tmp_path: Path) -> None:
    _sweep(tmp_path, "grow", "--jobs", "1")
    more = SMALL.replace("max_num_seqs: [8, 32]", "max_num_seqs: [8, 32, 64]")
    table = _sweep(tmp_path, "grow", "--jobs", "1", spec=more)
    side = json.loads((tmp_path / "grow" / "sweep.json").read_text())
    assert side["skipped"] == 6 and side["ran"] == len(table) - 6 > 0


def test_dry_run_lists_the_points(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SMALL)
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("6 points") and "max_num_seqs=8" in out
    assert len({p.hash for p in expand(load_spec(path))}) == 6


def test_the_sarathi_example_holds_without_the_shared_traces(tmp_path: Path) -> None:
    """The example sweep's claim on synthetic lengths (tests do not read ../shared): under a strict P99 ITL and a
    bounded median delay, chunked prefill with a small budget sustains a clearly higher rate than unmixed
    prefill-priority batching."""
    import yaml

    spec = yaml.safe_load((ROOT / "experiments" / "sweeps" / "sarathi.yaml").read_text())
    del spec["grid"]["lengths_from"]
    spec["base"] |= {"num_prompts": 300, "input_len": "lognormal:mean=1500,sigma=1.0,max=6000",
                     "output_len": "lognormal:mean=200,sigma=0.8,max=1000"}  # fmt: skip
    spec["grid"]["max_num_batched_tokens"] = [512, 8192]
    spec["rate_tolerance"] = 0.1
    path = tmp_path / "sarathi.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(path), "--out", str(tmp_path / "s"), "--jobs", "1"]) == 0
    t = pd.read_parquet(tmp_path / "s" / "results.parquet").set_index(["policy", "max_num_batched_tokens"])
    assert (t.status == "ok").all()
    ratio = t.loc[("chunked", 512), "max_rate"] / t.loc[("continuous", 8192), "max_rate"]
    assert ratio > 1.5, ratio
    assert t.loc[("chunked", 512), "p99_itl_ms"] <= 100 and t.loc[("chunked", 512), "median_queueing_ms"] <= 2000


WARMED = 0  # in a worker of the pool below: how many times it was warmed


def _warm() -> None:
    global WARMED
    WARMED += 1


def _pid_and_warmed(_: int) -> tuple[int, int]:
    return os.getpid(), WARMED


def test_a_pool_warms_each_worker_once_and_keeps_it_for_every_round() -> None:
    from experiments import workers

    with workers.Pool(2, _warm) as pool:
        first = pool.ordered(_pid_and_warmed, range(6))
        second = pool.ordered(_pid_and_warmed, range(6))
    assert len({pid for pid, _ in first + second}) <= 2
    assert all(warmed == 1 for _, warmed in first + second)


def test_the_engine_warm_up_runs_every_built_in_policy_and_skips_user_code() -> None:
    """A worker swallows a failing warm-up (its first job pays instead), so it is checked here, in this process."""
    from experiments import workers
    from policies.config import BUILTIN_POLICIES

    workers.warm_engine([*BUILTIN_POLICIES, "my_policies:Mine"])


def test_a_sweep_whose_every_point_fails_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text("base: {num_prompts: 20}\ngrid:\n  tensor_parallel_size: [3, 5]\n")  # heads do not split in 3, 5
    assert main(["sweep", str(spec), "--out", str(tmp_path / "s"), "--jobs", "1"]) == 3
    assert "no point ran" in capsys.readouterr().err
    assert (tmp_path / "s" / "results.parquet").exists()
