"""Fitting a profile to Vidur's published kernel measurements, and scoring it on the measurements it did not see.

Vidur (microsoft/vidur, MLSys 2024, MIT licence) publishes per-operator GPU times of one layer for several models on
A100 80GB and H100 SXM (``costmodel.calibration.vidur`` reads them). ``fit_vidur`` turns the rows of the chosen models
on one device into ferry's raw format (each row the kernels it timed, e.g. "mlp" = gate/up GEMM + activation + down
GEMM), fits a calibrated profile on every other point of each series (``costmodel.calibration.profile``), and then
predicts every other row of the data before and after:
- rows of other models on the same device: the datasheet profile, then the fitted one;
- rows on another device: that device's datasheet profile, then the same profile with the fitted efficiencies
  (the same share of its peaks, the same fixed seconds per kernel): does the fit transfer?
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from costmodel.calibration.fit import ClassFit, Flat, WorkCounter, dump_terms, error_summary, load_terms, terms_of
from costmodel.calibration.profile import FitResult, fit_profile
from costmodel.calibration.vidur import load_vidur, row_keys, row_shape, spec_of
from costmodel.hardware import HardwareProfile, load_hardware, parse_hardware
from costmodel.roofline import KernelCost

# ferry operator (as measurements.py names Vidur's columns) -> the operator class it is scored under
OP_CLASS = {
    "qkv_proj": "gemm",
    "o_proj": "gemm",
    "mlp": "gemm",  # gate/up and down GEMMs with the activation between: GEMM time dominates
    "norms": "elementwise",
    "rope": "elementwise",
    "embedding": "elementwise",
    "attention_prefill": "attention_prefill",
    "attention_decode": "attention_decode",
}
_SHAPE = ["model", "tp", "n_embd", "n_head", "n_kv_head", "n_expanded_embd", "vocab_size", "use_gated_mlp"]


@dataclass
class VidurReport:
    fit: FitResult  # the fitted profile and its held-out errors
    hardware: str  # the device fitted
    fitted: int  # measurements the fit used (the held-out half of the chosen series excluded)
    # before (datasheet) and after (fitted) errors per operator class: on the fitted series' held-out half, on the
    # other models measured on the fitted device, and on every model of the other devices (efficiencies transferred)
    transfer: pd.DataFrame


def to_raw(df: pd.DataFrame) -> pd.DataFrame:
    """Vidur rows (``load_vidur``) in ferry's raw measurement format, fp16, one layer."""
    df = df.reset_index(drop=True)
    kernels = [""] * len(df)
    for _, group in df.groupby(_SHAPE, sort=False):
        first = group.iloc[0]
        work = WorkCounter(spec_of(first), "float16", tp=int(first["tp"]))
        cache: dict[tuple[str, int, int, int, int], str] = {}
        shapes: dict[tuple[str, int, int, int, int], list[KernelCost]] = {}  # the linear ops share one shape per count
        for i, key in row_keys(group):
            if key not in cache:
                shape, wanted = row_shape(*key)
                kind = key[0] if key[0].startswith("attention") else "linear"
                where = (kind, *key[1:]) if kind != "linear" else (kind, key[1], 0, 0, 0)
                if where not in shapes:
                    shapes[where] = work.cost.kernels(shape)
                cache[key] = dump_terms(terms_of(shapes[where], wanted))
            kernels[i] = cache[key]
    return pd.DataFrame(
        {
            "device": df["hardware"].map(lambda h: f"Vidur profile, {h}"),
            "dtype": "float16",
            "model": df["model"] + " tp=" + df["tp"].astype(str),
            "layers": 1,
            "op": df["op"],
            "op_class": df["op"].map(OP_CLASS),
            "num_tokens": df["num_tokens"],
            "batch_size": df["batch_size"],
            "chunk": df["prefill_chunk_size"],
            "context": df["kv_cache_size"],
            "seqs": np.where(df["op"] == "attention_decode", df["batch_size"], 1),
            "shape": "",
            "flops": 0.0,
            "bytes": 0.0,
            "median_s": df["measured_s"],
            "min_s": df["measured_s"],
            "max_s": df["measured_s"],
            "repeats": 1,
            "sets": 1,
            "kernels": kernels,
            "software": json.dumps({"source": "microsoft/vidur profiling data (MIT licence)"}),
            "date": "",
        }
    )


def profile_classes(profile: HardwareProfile, dtype: str = "float16") -> dict[str, ClassFit]:
    """A profile's curves as the fit's sides, in fp16 (Vidur's format): what the cost model computes per kernel."""
    peak, fp32 = profile.peak_flops(dtype), profile.peak_flops("float32")
    return {c: ClassFit.of(profile, c, fp32 if c == "elementwise" else peak) for c in OP_CLASS.values()}


def transferred(fitted: HardwareProfile, target: HardwareProfile) -> HardwareProfile:
    """``target``'s device rates with ``fitted``'s efficiencies: the same share of the peaks, and the same fixed
    seconds per kernel (so half sizes scale with the rates)."""
    data = target.model_dump(mode="json")
    src = fitted.model_dump(mode="json")
    scale = {"compute": target.peak_flops("float16") / fitted.peak_flops("float16")}
    scale["memory"] = target.bandwidth / fitted.bandwidth
    for op_class in ("gemm", "attention_prefill", "attention_decode", "elementwise"):
        for side in ("compute", "memory"):
            curve = dict(src["efficiency"][op_class][side])
            curve["half_size"] *= scale[side]
            curve["note"] = f"transferred from {fitted.name}"
            data["efficiency"][op_class][side] = curve
    data["name"] = f"{target.name} with {fitted.name}'s efficiencies"
    return parse_hardware(data, data["name"])


def fit_vidur(data_dir: str | Path, *, hardware: str | None, models: list[str], name: str) -> VidurReport:
    """Fit the rows of ``models`` (case-insensitive substrings of Vidur's model names, e.g. "Llama-2-7b", or
    "attention" for the attention file's rows; all if empty) measured on ``hardware``, with the attention rows whose
    head shape is one of those models'. Score the fit on its held-out half, and every other row before and after."""
    df, _ = load_vidur(data_dir)
    devices = sorted(df["hardware"].unique())
    if hardware is not None and hardware not in devices and f"{hardware}.datasheet" in devices:
        hardware = f"{hardware}.datasheet"  # the device's name: the datasheet profile its measurements are fitted from
    if hardware is None:
        if len(devices) != 1:
            raise ValueError(f"the data covers {', '.join(devices)}: choose the device to fit with --hardware")
        hardware = devices[0]
    if hardware not in devices:
        raise ValueError(f"--hardware {hardware!r}: the data covers {', '.join(devices)}")
    on_device = df["hardware"] == hardware
    chosen = on_device.copy()
    if models:
        named = on_device & df["model"].str.lower().apply(lambda m: any(s.lower() in m for s in models))
        if not named.any():
            raise ValueError(f"no {hardware} measurements of models matching {', '.join(models)}")
        linear = named & ~df["op"].str.startswith("attention")
        heads = set(map(tuple, df.loc[linear, ["n_embd", "n_head", "n_kv_head"]].to_numpy().tolist()))
        same_heads = np.array([tuple(r) in heads for r in df[["n_embd", "n_head", "n_kv_head"]].to_numpy().tolist()])
        chosen = named | (on_device & df["op"].str.startswith("attention") & same_heads)
    raw = to_raw(df[chosen])
    base = load_hardware(hardware)
    settings = {"source": str(data_dir), "hardware": hardware, "models": ",".join(models) or "all"}
    fit = fit_profile(raw, name=name, base=base, measurements=str(data_dir), settings=settings)
    rest = df[~chosen].reset_index(drop=True)
    rest_terms = [load_terms(k) for k in to_raw(rest)["kernels"]]
    frames = []
    # the fitted series' held-out half, before (datasheet) and after
    held = fit.rows[fit.rows["held_out"]]
    flat = Flat([load_terms(k) for k in held["kernels"]])
    before_held = flat.predict(profile_classes(base))
    for op_class in sorted(set(held["op_class"])):
        sel = (held["op_class"] == op_class).to_numpy()
        b = error_summary(before_held[sel], held["median_s"].to_numpy()[sel])
        a = error_summary(held["predicted_s"].to_numpy()[sel], held["median_s"].to_numpy()[sel])
        frames.append(_transfer_row(f"{hardware} (fitted series, held out)", op_class, b, a, held[sel]["model"]))
    for device in sorted(rest["hardware"].unique()):
        sel_device = (rest["hardware"] == device).to_numpy()
        rows = rest[sel_device]
        flat = Flat([t for t, keep in zip(rest_terms, sel_device, strict=True) if keep])
        target = load_hardware(str(device))
        after_profile = fit.profile if device == hardware else transferred(fit.profile, target)
        before = flat.predict(profile_classes(target))
        after = flat.predict(profile_classes(after_profile))
        measured = rows["measured_s"].to_numpy()
        classes = rows["op"].map(OP_CLASS).to_numpy()
        for op_class in sorted(set(classes)):
            sel = classes == op_class
            b = error_summary(before[sel], measured[sel])
            a = error_summary(after[sel], measured[sel])
            where = str(device) if device == hardware else f"{device} (transferred)"
            frames.append(_transfer_row(where, op_class, b, a, rows.loc[sel, "model"]))
    transfer = pd.DataFrame(frames)
    return VidurReport(fit, hardware, int((~fit.rows["held_out"]).sum()), transfer)


def _transfer_row(where: str, op_class: str, before: dict, after: dict, models: pd.Series) -> dict[str, object]:
    return {
        "rows": where,
        "op_class": op_class,
        "n": before["n"],
        "models": int(models.str.replace(r" tp=\d+$", "", regex=True).nunique()),
        "before_median": before["median"],
        "before_p90": before["p90"],
        "after_median": after["median"],
        "after_p90": after["p90"],
    }


def format_transfer(table: pd.DataFrame) -> str:
    head = f"{'measurements':<38} {'operator class':<18} {'rows':>6} {'models':>6}"
    lines = [f"{head}   {'before median / p90':>20}   {'after median / p90':>19}"]
    for r in table.to_dict(orient="records"):
        lines.append(
            f"{r['rows']:<38} {r['op_class']:<18} {r['n']:>6} {r['models']:>6}   "
            f"{100 * r['before_median']:>9.1f}% / {100 * r['before_p90']:>5.1f}%   "
            f"{100 * r['after_median']:>8.1f}% / {100 * r['after_p90']:>5.1f}%"
        )
    return "\n".join(lines)
