"""A fit's numbers written as a hardware profile's fields: each efficiency curve with its note (held-out error, the
side the fit saw), the overheads, the measured rates of a device without a datasheet, the provenance (device,
software, date, settings); and the per-class error table ``ferry calibrate`` prints."""

from __future__ import annotations

import math
from datetime import date
from typing import Any

import pandas as pd

from costmodel.calibration.fit import ClassFit, Overheads
from costmodel.dtypes import PEAK_KEY
from costmodel.hardware import ASSUMPTION, MEASURED, OP_CLASSES, HardwareProfile


def curve(rate: float, fixed_s: float, peak: float, note: str) -> dict[str, Any]:
    rate = min(rate, peak) if math.isfinite(rate) else peak
    return {"max": min(1.0, rate / peak), "half_size": float(fixed_s * rate), "source": MEASURED, "note": note}


def pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:.1f}%"


def profile_data(
    *,
    name: str,
    description: str,
    base: HardwareProfile | None,
    dtype: str,
    raw: pd.DataFrame,
    classes: dict[str, ClassFit],
    fitted_sides: dict[tuple[str, str], int],
    peaks: dict[str, float],
    bandwidth: float,
    copy_bw: float,
    best_gemm: float,
    overheads: Overheads,
    fitted_overheads: list[str],
    overhead_parts: dict[str, dict[str, float]],
    comm: dict[str, Any] | None,
    errors: pd.DataFrame,
    measurements: str,
    settings: dict[str, str] | None,
    notes: list[str],
    inside_iterations: bool = False,
) -> dict[str, Any]:
    """The calibrated profile's fields: the base's device rates (or the measured ones), the fitted curves, overheads
    and provenance. ``inside_iterations``: the fit saw whole iterations only, no kernel timed alone."""
    first = raw.iloc[0]
    device = str(first.get("device", "") or "unknown device")
    software = software_versions(raw)
    day = str(first.get("date", "") or date.today().isoformat())
    act_key = PEAK_KEY[dtype]
    if base is not None:
        data = base.model_dump(mode="json")
        # this fit's curves stand alone: not the base's measured kernel tables, nor its floors (which it does not fit)
        data.pop("kernel_tables", None)
        for c in OP_CLASSES:
            data["efficiency"][c].pop("floor_s", None)
        fitted_to = f"whole {dtype} iterations" if inside_iterations else f"measured {dtype} kernels"
        what = "efficiencies and overheads" if fitted_overheads else "efficiencies"
        kept = "" if fitted_overheads else f" (the overheads are {base.name}'s, not measured here)"
        data["provenance"]["notes"] = (
            f"Calibrated from {measurements}: device rates from the {base.name} {base.kind} profile, {what} "
            f"fitted to {fitted_to}{kept}. " + " ".join(notes)
        ).strip()
    else:
        data = measured_rates(raw, peaks, bandwidth, copy_bw, best_gemm, dtype, device)
        data["provenance"] = {"sources": {}, "notes": " ".join(notes)}
    data["name"] = name
    data["description"] = description or f"{device}, calibrated ({dtype})"
    data["kind"] = "calibrated"
    err = {r["op_class"]: r for r in errors.to_dict(orient="records")}
    for c in OP_CLASSES:
        fit = classes[c]
        peak = peaks["fp32" if c == "elementwise" else act_key]
        for side, limit in (("compute", peak), ("memory", bandwidth)):
            n = fitted_sides.get((c, side), 0)
            s = fit.side(side)
            rate = 1.0 / s.per_unit_s if s.per_unit_s > 0 else math.inf
            if n:
                e = err.get(c, {})
                if inside_iterations:
                    e = err.get("iteration", {})
                    what = f"{n} {dtype} kernel terms of measured whole iterations bound by this side; iteration"
                else:
                    what = f"{n} measured {dtype} kernels bound by this side; class"
                note = (
                    f"fitted to {what} held-out error median "
                    f"{pct(e.get('median', math.nan))}, p90 {pct(e.get('p90', math.nan))}"
                )
                data["efficiency"][c][side] = curve(rate, s.fixed_s, limit, note)
            else:  # no measured kernel is bound here: the prior curve, as the fit used it
                prior = data["efficiency"][c][side]
                note = (prior.get("note", "") + " (no calibrated kernel was bound by this side)").strip()
                data["efficiency"][c][side] = curve(rate, s.fixed_s, limit, note) | {"source": prior["source"]}
    if comm is not None:
        data["efficiency"]["communication"] = {
            "bandwidth": {"max": max(comm["max"], 1e-6), "half_size": 0.0, "source": MEASURED},
            "latency_s": {"value": comm["latency_s"], "source": MEASURED, "note": f"fitted to {comm['n']} all-reduces"},
        }
        data["efficiency"]["communication"]["bandwidth"]["note"] = "ring all-reduce bus bandwidth share, fitted"
    e_it = err.get("iteration", {})
    for key in ("per_iteration_s", "per_layer_s", "per_sequence_s", "per_prefill_s"):
        if key == "per_prefill_s" and key not in fitted_overheads:
            continue  # measured only from tables that count prompt chunks; absent otherwise (0)
        if fitted_overheads:
            fitted = key in fitted_overheads
            note = (
                f"fitted to measured iterations (held-out median error {pct(e_it.get('median', math.nan))})"
                if fitted
                else "not separable from per_iteration_s in these measurements (folded into it)"
            )
            part = overhead_parts.get(key, {})
            if part:
                note += (
                    f": {part.get('host', 0.0) * 1e3:.3g} ms of host work outside the forward pass, "
                    f"{part.get('forward', 0.0) * 1e3:.3g} ms inside it beyond the kernels timed alone"
                )
            data["overheads"][key] = {"value": getattr(overheads, key), "source": MEASURED, "note": note}
    data["provenance"] |= {
        "device": device,
        "software": software,
        "date": day,
        "measurements": measurements,
        "settings": settings or None,
        "held_out_error": {
            r["op_class"]: {"n": float(r["held_out"]), "median": float(r["median"]), "p90": float(r["p90"])}
            for r in errors.to_dict(orient="records")
            if r["held_out"]
        },
    }
    return data


def software_versions(raw: pd.DataFrame) -> dict[str, str]:
    import json

    text = str(raw.iloc[0].get("software", "") or "")
    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError:
        value = {}
    return {str(k): str(v) for k, v in value.items()} or {"unknown": "measurements carry no software versions"}


def measured_rates(
    raw: pd.DataFrame,
    peaks: dict[str, float],
    bandwidth: float,
    copy_bw: float,
    best_gemm: float,
    dtype: str,
    device: str,
) -> dict[str, Any]:
    """Device rates of a device without a datasheet profile, all measured."""
    capacity = raw[raw["op_class"] == "capacity"]
    memory = float(capacity["bytes"].iloc[0]) if len(capacity) else 0.0
    if memory <= 0:
        raise ValueError("without a base profile the measurements need the device's memory (a capacity row)")
    peak_note = f"fastest measured {dtype} rate: GEMM {best_gemm / 1e12:.4g} TFLOP/s best point"
    peak_tflops = {
        k: {
            "value": peaks[k] / 1e12,
            "source": MEASURED,
            "note": peak_note if k == PEAK_KEY[dtype] else f"not measured: the {dtype} rate, copied",
        }
        for k in ("fp32", "bf16", "fp16")
    }
    curve = {"max": 1.0, "half_size": 0.0, "source": ASSUMPTION, "note": "at the measured peak, no fixed cost"}
    return {
        "memory_capacity_gib": {"value": memory / 2**30, "source": MEASURED, "note": "device (host) memory"},
        "memory_bandwidth_gbps": {
            "value": bandwidth / 1e9,
            "source": MEASURED,
            "note": f"large copy: {copy_bw / 1e9:.4g} GB/s (read + write)",
        },
        "peak_tflops": peak_tflops,
        "interconnect": {
            "name": "none (one device)",
            "bandwidth_gbps": {
                "value": bandwidth / 1e9,
                "source": MEASURED,
                "note": "a stand-in (the memory bandwidth): tensor parallelism is not calibrated on this device",
            },
        },
        "efficiency": {
            **{c: {"compute": dict(curve), "memory": dict(curve)} for c in OP_CLASSES},
            "communication": {
                "bandwidth": {"max": 1.0, "half_size": 0.0, "source": ASSUMPTION, "note": "not measured"},
                "latency_s": {"value": 0.0, "source": ASSUMPTION, "note": "not measured"},
            },
        },
        "overheads": {
            k: {"value": 0.0, "source": ASSUMPTION, "note": "not measured"}
            for k in ("per_iteration_s", "per_layer_s", "per_sequence_s")
        },
    }


def format_errors(errors: pd.DataFrame) -> str:
    """The held-out error table, one line per operator class."""
    lines = [f"{'operator class':<18} {'fitted':>6} {'held out':>8} {'median |err|':>12} {'p90 |err|':>10} {'bias':>7}"]
    for r in errors.to_dict(orient="records"):
        bias = "n/a" if not math.isfinite(r["bias"]) else f"{100 * r['bias']:+.1f}%"
        lines.append(
            f"{r['op_class']:<18} {r['fitted']:>6} {r['held_out']:>8} {pct(r['median']):>12} {pct(r['p90']):>10} "
            f"{bias:>7}"
        )
    return "\n".join(lines)
