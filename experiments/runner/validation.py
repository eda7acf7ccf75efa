"""What `ferry validate` compares and writes, for both of its kinds: a real run on a model here (``validate``) and a
live server (``validate_url``): the run pair (``Validation``), the side-by-side of their summaries (``compare``),
its table (``format_comparison``), the files (``write_validation``), and the settings a profile's calibration kept
(``calibration_setting``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodel.hardware import HardwareProfile
from experiments.runner import outputs
from experiments.runner.simulation import RunResult, write_outputs

# what is compared: (summary key, label)
COMPARED = (
    ("median_ttft_ms", "Median TTFT (ms)"),
    ("p90_ttft_ms", "P90 TTFT (ms)"),
    ("median_tpot_ms", "Median TPOT (ms)"),
    ("p90_tpot_ms", "P90 TPOT (ms)"),
    ("median_itl_ms", "Median ITL (ms)"),
    ("p90_itl_ms", "P90 ITL (ms)"),
    ("median_e2el_ms", "Median E2E latency (ms)"),
    ("p90_e2el_ms", "P90 E2E latency (ms)"),
    ("duration", "Duration (s)"),
    ("request_throughput", "Request throughput (req/s)"),
    ("output_throughput", "Output throughput (tok/s)"),
    ("gpu_idle_fraction", "Idle fraction"),
    ("num_iterations", "Iterations"),
    ("mean_batch_size", "Mean batch size (seqs)"),
)


ABSOLUTE = ("gpu_idle_fraction",)  # compared by difference (sim - real), not ratio


@dataclass
class Validation:
    """A real run and its simulation, with the cost model's error on each real iteration."""

    real: RunResult
    sim: RunResult
    comparison: dict[str, Any]  # per compared key: real, simulated, relative error; and the iteration errors
    iterations: pd.DataFrame  # each real iteration: shape, measured and predicted seconds


def calibration_setting(hardware: HardwareProfile, key: str) -> str | None:
    settings = hardware.provenance.settings or {}
    return settings.get(key) or None


def compare(real: dict[str, Any], sim: dict[str, Any], measured: np.ndarray, predicted: np.ndarray) -> dict[str, Any]:
    """Side by side: each compared summary value real and simulated with the relative error (sim / real - 1); and the
    cost model's error on the real iterations (predicted / measured - 1)."""
    rows = {}
    for key, label in COMPARED:
        r, s = real.get(key), sim.get(key)
        both = isinstance(r, (int, float)) and isinstance(s, (int, float))
        rf, sf = (float(r), float(s)) if both else (math.nan, math.nan)  # type: ignore[arg-type]
        if key in ABSOLUTE:  # a share near 0: its difference says more than its ratio
            rows[key] = {"label": label, "real": r, "sim": s, "abs_error": (sf - rf) if both else None}
        else:
            rows[key] = {"label": label, "real": r, "sim": s, "rel_error": (sf / rf - 1.0) if both and rf else None}
    err = predicted / measured - 1.0 if len(measured) else np.zeros(0)
    iteration = {
        "n": int(len(err)),
        "median_abs_rel_error": float(np.median(np.abs(err))) if len(err) else None,
        "p90_abs_rel_error": float(np.percentile(np.abs(err), 90)) if len(err) else None,
        "median_rel_error": float(np.median(err)) if len(err) else None,
        "total_rel_error": float(predicted.sum() / measured.sum() - 1.0) if len(err) else None,
    }
    return {"metrics": rows, "iterations": iteration}


def format_comparison(c: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        return f"{v:,}"

    lines = [
        f"ferry validate: {c['policy']} on {c['workload']}"
        + (f" against {c['url']}" if "url" in c else "")
        + f"; simulated with {c['profile']}",
        *([f"note: {c['note']}"] if "note" in c else []),
        *([f"failed: {c['failed']['n']} requests ({c['failed']['first']})"] if "failed" in c else []),
        f"{'':<30} {'real':>12} {'simulated':>12} {'sim/real-1':>11}  (idle fraction: sim - real)",
    ]
    for row in c["metrics"].values():
        if "abs_error" in row:
            diff = row["abs_error"]
            e = "-" if diff is None else f"{diff:+.3f}"
        else:
            err = row["rel_error"]
            e = "-" if err is None or not math.isfinite(err) else f"{100 * err:+.1f}%"
        lines.append(f"{row['label']:<30} {fmt(row['real']):>12} {fmt(row['sim']):>12} {e:>11}")
    it = c["iterations"]
    if it["n"]:
        lines.append(
            f"cost model on the {it['n']} real iterations: median |err| {100 * it['median_abs_rel_error']:.1f}%, "
            f"p90 {100 * it['p90_abs_rel_error']:.1f}%, median {100 * it['median_rel_error']:+.1f}%, "
            f"total time {100 * it['total_rel_error']:+.1f}%"
        )
    return "\n".join(lines)


VALIDATE_OUTPUTS = ("real", "sim", "iterations.csv", "comparison.json")


def write_validation(v: Validation, out: Path, force: bool = False) -> list[Path]:
    """Write ``real/`` and ``sim/`` (the files `ferry run` writes), ``iterations.csv`` and, last,
    ``comparison.json`` into ``out``."""
    comparison = json.dumps(v.comparison, indent=2) + "\n"
    outputs.prepare(out, VALIDATE_OUTPUTS, "validate", force)
    paths = write_outputs(v.real, out / "real", command="validate") + write_outputs(
        v.sim, out / "sim", command="validate"
    )
    if not v.iterations.empty:  # a live server's iterations are not seen (``--url``)
        paths.append(outputs.write_frame(out / "iterations.csv", v.iterations))
    paths.append(outputs.write_text(out / "comparison.json", comparison))
    return paths
