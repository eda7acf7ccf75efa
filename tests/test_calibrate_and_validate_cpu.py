"""The whole loop on this machine's CPU (needs torch): `ferry calibrate --quick` measures tiny-llama's kernels and
executor iterations and fits a profile; `ferry validate` serves a trace on the real model and simulates it with that
profile. What must hold: the fit predicts the measurements it did not see, and the simulation predicts the real run.

Assertions are on medians over many points or iterations, never on absolute speed; the margins held over repeated
runs on a noisy 2-core machine, one of them with the other core kept busy (see docs/guide/calibrate.md). A bound that
fails while other work shared the machine is measured once more (tests/contention.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")

from costmodel import load_hardware  # noqa: E402
from costmodel.hardware import OP_CLASSES  # noqa: E402
from experiments.cli import main  # noqa: E402
from tests.contention import Contention, measured  # noqa: E402

# held-out median |predicted / measured - 1| per operator class that a quick CPU calibration must reach. Over 28 runs
# on the 2-core CI machine (4 rounds of 7 over successive versions, 2 per round with the other core busy) the worst
# were gemm 21%, attention 23%, elementwise 31% and whole iterations 14%: one roofline curve per class follows a CPU's
# kernels less closely than a GPU's (docs/guide/calibrate.md); whole iterations are what the simulator
# needs.
# On an Intel Xeon host of the same machine kind, attention_prefill reached 36% once in 5 runs (22% otherwise); on
# the CI machine gemm reached 38% once (its held-out shapes are few and small, where a CPU GEMM is furthest from a
# roofline).
HELD_OUT_MEDIAN = {
    "gemm": 0.45,
    "attention_prefill": 0.45,
    "attention_decode": 0.35,
    "elementwise": 0.45,
    "iteration": 0.20,
}
WORKLOAD = [
    "--policy", "chunked", "--max-num-seqs", "16", "--max-num-batched-tokens", "256",
    "--num-prompts", "24", "--request-rate", "2", "--input-len", "uniform:32:192", "--output-len", "uniform:8:48",
    "--seed", "1",
]  # fmt: skip


@dataclass
class Calibrated:
    """A profile the calibration wrote, and how busy the machine was with other work while it measured."""

    profile: Path
    load: Contention


def calibrate(out: Path) -> Calibrated:
    args = ["calibrate", "--device", "cpu", "--threads", "1", "--dtype", "float32", "--model", "tiny-llama"]
    with Contention() as load:
        assert main([*args, "--quick", "--out", str(out)]) == 0
    return Calibrated(out, load)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Calibrated:
    return calibrate(tmp_path_factory.mktemp("calibration") / "cpu.calibrated.yaml")


def test_quick_cpu_calibration_predicts_held_out_measurements(calibrated: Calibrated, tmp_path: Path) -> None:
    """What the calibration wrote, whatever the load; its held-out errors are checked by ``check_held_out``, measured
    again once (a second calibration) should they fail while other work shared the machine (tests/contention.py)."""
    hw = load_hardware(str(calibrated.profile))
    assert hw.kind == "calibrated"
    assert hw.provenance.settings is not None and hw.provenance.settings["threads"] == "1"
    raw = pd.read_csv(calibrated.profile.with_name("cpu.calibrated.raw.csv"))
    kernels = raw[raw["op_class"].isin(OP_CLASSES)]
    assert (kernels["min_s"] <= kernels["median_s"]).all() and (kernels["median_s"] <= kernels["max_s"]).all()
    assert set(raw["op"]) >= {"copy", "empty", "iteration", "qkv_proj", "attention_prefill", "attention_decode"}
    assert sorted(raw.loc[raw["op"] == "iteration", "layers"].unique()) == [2, 4]

    def fitted(attempt: int) -> Path:
        return calibrated.profile if attempt == 0 else calibrate(tmp_path / "cpu.calibrated.yaml").profile

    measured(fitted, check_held_out, "the calibration's held-out kernels", earlier=[calibrated.load])


def check_held_out(profile: Path) -> None:
    """Each operator class's held-out median error within HELD_OUT_MEDIAN, over enough points."""
    errors = load_hardware(str(profile)).provenance.held_out_error or {}
    assert set(errors) == {*OP_CLASSES, "iteration"}
    for op_class, limit in HELD_OUT_MEDIAN.items():
        assert errors[op_class]["n"] >= 5
        assert errors[op_class]["median"] < limit, (op_class, errors[op_class])


def test_refitting_the_raw_measurements_gives_the_same_profile(calibrated: Calibrated, tmp_path: Path) -> None:
    again = tmp_path / "again.yaml"
    raw = calibrated.profile.with_name("cpu.calibrated.raw.csv")
    assert main(["calibrate", "--from-measurements", str(raw), "--out", str(again)]) == 0
    first, second = load_hardware(str(calibrated.profile)), load_hardware(str(again))
    assert first.efficiency == second.efficiency and first.overheads == second.overheads


# |sim / real - 1| that `ferry validate` must reach with the quick profile. On the AMD EPYC hosts of the CI machine
# kind the worst seen was 27% (median ITL, with another process on the other core); on an Intel Xeon host of the same
# kind every run over-predicted the single-sequence decodes that dominate this workload: median ITL +25% to +33%,
# the cost model on the run's own iterations +25% to +29% (5 runs). There the forward pass of a one-sequence decode
# (4.2 ms) runs faster than its kernels timed alone (4.8 ms: the 82 MB of weights stay in the host's large cache
# between iterations, not between a kernel benchmark's rotating buffers), which no roofline curve fitted to the
# kernels follows. TTFT stayed within 16% everywhere.
VALIDATE_LIMITS = {"median_ttft_ms": 0.25, "median_itl_ms": 0.40, "iterations": 0.40}


def test_validate_on_the_cpu_matches_the_real_run(calibrated: Calibrated, tmp_path: Path) -> None:
    """The real run against its simulation with the calibrated profile; should the bounds fail while other work
    shared the machine (during the calibration or the run), both are measured again once."""

    def validated(attempt: int) -> Path:
        profile = calibrated.profile if attempt == 0 else calibrate(tmp_path / "cpu.calibrated.yaml").profile
        out = tmp_path / f"validate-{attempt}"
        args = ["validate", "--model", "tiny-llama", "--hardware", str(profile), *WORKLOAD, "--out", str(out)]
        assert main(args) == 0
        return out

    out = measured(validated, check_validated, "the real run against its simulation", earlier=[calibrated.load])
    real = json.loads((out / "real" / "summary.json").read_text())
    sim = json.loads((out / "sim" / "summary.json").read_text())
    assert real["completed"] == sim["completed"] == 24
    for run in ("real", "sim"):
        assert (out / run / "requests.csv").is_file() and (out / run / "iterations.csv").is_file()
    iterations = pd.read_csv(out / "iterations.csv")
    assert len(iterations) == real["num_iterations"] and (iterations["measured_s"] > 0).all()


def check_validated(out: Path) -> None:
    """Median TTFT and ITL, and the cost model on the very iterations the real run executed, within VALIDATE_LIMITS."""
    comparison = json.loads((out / "comparison.json").read_text())
    metrics = comparison["metrics"]
    for key in ("median_ttft_ms", "median_itl_ms"):
        assert abs(metrics[key]["rel_error"]) < VALIDATE_LIMITS[key], (key, metrics[key])
    assert comparison["iterations"]["n"] > 50
    assert comparison["iterations"]["median_abs_rel_error"] < VALIDATE_LIMITS["iterations"]
