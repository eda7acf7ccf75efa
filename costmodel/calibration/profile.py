"""From measurements to a calibrated hardware profile: split, fit, score on held-out rows, write the profile.

Input is a table of measured rows in the raw format ``ferry calibrate`` writes
(``costmodel.calibration.harness.ROW_COLUMNS`` plus ``software`` and ``date``): kernel rows (``op_class`` one of the
cost model's classes), whole executor iterations (``op_class == "iteration"``), the device's copy bandwidth
(``"bandwidth"``), its memory (``"capacity"``), the empty step (``"launch"``) and all-reduces (``"communication"``).
``fit_profile`` holds out every other point of each series, fits the efficiency curves and the host overheads to the
rest (``costmodel.calibration.fit``: the kernel rows and the whole iterations together, an iteration being its kernels
plus overheads), and scores them on the held-out rows only. The profile it returns is the one it scored.

Peaks: with a datasheet ``base`` profile (a GPU ferry knows), the device rates stay the vendor's and the fit keeps
every ``max <= 1`` against them. Without one (a CPU, an unknown GPU) the rates are measured: bandwidth is the copy's
(or the fastest fitted memory rate, if faster), the peak the fastest GEMM rate seen (or the fastest fitted compute
rate), the same for every float format (only the calibrated dtype's is measured, which the profile notes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from costmodel.calibration import profile_data
from costmodel.calibration.fit import (
    IRLS_FLOOR,
    IRLS_ROUNDS,
    SIDES,
    ClassFit,
    Flat,
    Overheads,
    Side,
    error_summary,
    fit_classes,
    held_out,
    load_terms,
    nnls,
)
from costmodel.dtypes import PEAK_KEY
from costmodel.hardware import OP_CLASSES, HardwareProfile, parse_hardware

CLIENT = "client_s"  # the overhead feature of a client's wait for its first token beyond the iteration
# Parameters that whole iterations of one model cannot separate from the host overheads, kept at the base's value:
# every kernel's fixed cost (its instances per iteration are constant, or per sequence: per_iteration_s and
# per_sequence_s have the same columns), and the GEMMs' seconds per byte (their bytes are the weights, the same in
# every iteration). Fitted freely, a step's host time leaks into them (a CPU server's 3 ms decode step became weights
# streamed at 0.1% of the bandwidth, and per_iteration_s 0), and the profile then scales that time with the model.
ONE_MODEL_CONSTANTS = frozenset({(c, s, "h") for c in OP_CLASSES for s in SIDES} | {("gemm", "memory", "a")})
NON_KERNEL = ("iteration", "bandwidth", "capacity", "launch", "communication")
# the order in which a series' points are ranked for the held-out split
_ORDER = ("num_tokens", "batch_size", "chunk", "context", "seqs")


@dataclass
class FitResult:
    """A calibrated profile and how well it predicts what it was not fitted on."""

    profile: HardwareProfile
    # per operator class (and "iteration" for whole executor iterations): n fitted, n held out, and the held-out
    # median and p90 of |predicted / measured - 1| and the median signed error
    errors: pd.DataFrame
    # every measured row with its prediction by the profile and whether it was held out
    rows: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    # seconds a client waits beyond the iteration for a first token (request handling, tokenization, the network):
    # fitted when rows carry ``client_requests`` (a probe's TTFTs), else 0; not part of the profile
    client_s: float = 0.0


def split(raw: pd.DataFrame) -> np.ndarray:
    """Held-out rows: every other point of each series (same model, depth, kernel and, for attention, context),
    in size order; iterations alternate in the order they ran."""
    context = raw["context"].where(raw["op"] != "iteration", -1)
    keys = list(zip(raw["model"], raw["layers"], raw["op"], context, strict=True))
    order = [tuple(float(v) for v in r) for r in raw[list(_ORDER)].to_numpy()]
    order = [o if op != "iteration" else (float(i),) for i, (o, op) in enumerate(zip(order, raw["op"], strict=True))]
    return held_out(keys, order)


def _prior(
    base: HardwareProfile | None, peaks: dict[str, float], bandwidth: float, act_key: str
) -> dict[str, ClassFit]:
    """Starting curves: the base profile's, or (no base) every class at the measured peaks with no fixed cost."""
    out = {}
    for c in OP_CLASSES:
        peak = peaks["fp32" if c == "elementwise" else act_key]
        if base is not None:
            out[c] = ClassFit.of(base, c, peak)
        else:
            out[c] = ClassFit(Side(1.0 / peak, 0.0), Side(1.0 / bandwidth, 0.0))
    return out


def fit_profile(
    raw: pd.DataFrame,
    *,
    name: str,
    base: HardwareProfile | None,
    measurements: str,
    settings: dict[str, str] | None = None,
    description: str = "",
    loss: str = "l1",
    joint: bool = True,
    balance: bool = True,
    held: np.ndarray | None = None,
) -> FitResult:
    """Fit a calibrated profile to ``raw`` (rows in the raw format, see the module docstring).

    ``loss="l1"`` (the default) minimises the sum of |predicted / measured - 1|: the median-minded fit, which follows
    the typical kernel rather than the odd regime out (a CPU's matrix-vector path at one token, say) and shrugs off
    timing spikes; ``"l2"`` minimises the sum of squares.

    ``joint=True`` (the default) fits the curves to the kernel rows and the whole iterations together (an iteration
    is its kernels plus the host overheads): kernels inside a forward pass run a little slower than alone (caches
    shared with their neighbours, glue between them), ~10-15% on a CPU, and the iterations are what the simulator
    predicts. ``joint=False`` fits the curves to the kernels alone, then the overheads to what they leave.

    ``held`` (one bool per row) chooses the rows held out instead of ``split``: a probe holds out whole requests."""
    raw = raw.reset_index(drop=True)
    kernel = raw["op_class"].isin(OP_CLASSES).to_numpy()
    iteration = (raw["op_class"] == "iteration").to_numpy()
    # whole iterations alone (another engine's, measured from outside) are fitted as their kernels plus overheads
    iterations_only = not kernel.any() and iteration.any()
    if not kernel.any() and not iterations_only:
        raise ValueError("no kernel measurements to fit (rows with op_class gemm, attention_*, elementwise)")
    if iterations_only and base is None:
        raise ValueError(
            "fitting whole iterations alone needs a base profile for the device's peak rates (a datasheet profile "
            "such as h100-sxm, or a calibrated one): give --base"
        )
    dtypes = sorted(set(raw.loc[kernel | (iteration & iterations_only), "dtype"].astype(str)))
    if len(dtypes) != 1:
        raise ValueError(f"measurements in {len(dtypes)} dtypes ({', '.join(dtypes)}): fit one dtype at a time")
    dtype = dtypes[0]
    act_key = PEAK_KEY[dtype]
    measured = raw["median_s"].to_numpy(dtype=float)
    terms = [load_terms(k) if k else () for k in raw["kernels"].fillna("[]")]
    held = split(raw) if held is None else np.asarray(held, dtype=bool)
    if len(held) != len(raw):
        raise ValueError(f"held marks {len(held)} rows, the measurements have {len(raw)}")
    notes: list[str] = []

    # device rates: the base's, or measured
    copy = raw[raw["op_class"] == "bandwidth"]
    copy_bw = float((copy["bytes"] / copy["median_s"]).max()) if len(copy) else math.nan
    row_flops = np.array([sum(t.count * t.flops for t in ts) for ts in terms])
    gemm = (raw["op_class"] == "gemm").to_numpy() & (row_flops > 0)
    best_gemm = float((row_flops[gemm] / measured[gemm]).max()) if gemm.any() else math.nan
    if base is not None:
        peaks = base.peaks()
        bandwidth = base.bandwidth
        bounds = {(c, "compute"): 1.0 / peaks["fp32" if c == "elementwise" else act_key] for c in OP_CLASSES}
        bounds |= {(c, "memory"): 1.0 / bandwidth for c in OP_CLASSES}
    else:
        if math.isnan(copy_bw) or math.isnan(best_gemm):
            raise ValueError("without a base profile the measurements need a copy row and GEMM rows (measured rates)")
        peaks = {k: best_gemm for k in ("fp32", "bf16", "fp16")}
        bandwidth = copy_bw
        bounds = {}
    prior = _prior(base, peaks, bandwidth, act_key)

    features, fitted_overheads = _overhead_features(raw, iteration)
    timed = kernel | iteration
    host = np.nan_to_num(raw["host_s"].to_numpy(dtype=float)) if "host_s" in raw.columns else np.zeros(len(raw))
    coef = np.zeros(len(fitted_overheads))
    column = {name: j for j, name in enumerate(fitted_overheads)}
    weight = _balance(raw, iteration) if balance else np.ones(len(raw))
    parts: dict[str, dict[str, float]] = {}  # overhead -> seconds outside ("host") and inside ("forward") the forward
    if joint and iteration.any() and (host[iteration] > 0).all():
        # the host's work outside the forward pass (the policy, bookkeeping, inputs) is timed apart: its per-iteration
        # and per-sequence costs are fitted to it directly; the forward passes are fitted with the kernels, as their
        # kernels plus per-layer (and per-iteration) glue
        train = iteration & ~held
        host_names = [n for n in ("per_iteration_s", "per_sequence_s") if n in column]
        host_cols = [column[n] for n in host_names]
        host_coef = _fit_overheads(
            np.zeros(int(train.sum())), features[train][:, host_cols], host[train], loss, weight[train]
        )
        forward = measured - np.where(iteration, host, 0.0)
        fwd_names = [n for n in ("per_iteration_s", "per_layer_s") if n in column]
        fwd_cols = [column[n] for n in fwd_names]
        fit_rows = timed & ~held
        classes, fwd_coef = fit_classes(
            [terms[i] for i in np.flatnonzero(fit_rows)],
            forward[fit_rows],
            prior,
            bounds,
            loss=loss,
            extra=features[fit_rows][:, fwd_cols],
            weight=weight[fit_rows],
        )
        for where, names, values in (("host", host_names, host_coef), ("forward", fwd_names, fwd_coef)):
            for n, v in zip(names, values, strict=True):
                coef[column[n]] += v
                parts.setdefault(n, {})[where] = float(v)
    elif joint and fitted_overheads:
        fit_rows = timed & ~held
        frozen = ONE_MODEL_CONSTANTS if iterations_only else frozenset()
        classes, coef = fit_classes(
            [terms[i] for i in np.flatnonzero(fit_rows)],
            measured[fit_rows],
            prior,
            bounds,
            loss=loss,
            extra=features[fit_rows],
            weight=weight[fit_rows],
            frozen=frozen,
        )
        if frozen:
            notes.append(
                f"Whole iterations cannot tell the kernels' fixed costs and the weights' streaming time from the "
                f"host's time per step: those stay {base.name if base else 'the prior'}'s, and what is constant per "
                "iteration or per sequence beyond them is fitted as per_iteration_s and per_sequence_s."
            )
    else:
        fit_rows = kernel & ~held
        classes, _ = fit_classes(
            [terms[i] for i in np.flatnonzero(fit_rows)], measured[fit_rows], prior, bounds, loss=loss
        )
    predicted = np.full(len(raw), np.nan)
    tflat = Flat([terms[i] for i in np.flatnonzero(timed)])
    kernel_s = np.zeros(len(raw))
    kernel_s[timed] = tflat.predict(classes)
    if fitted_overheads and not joint:
        train = iteration & ~held
        coef = _fit_overheads(kernel_s[train], features[train], measured[train], loss, weight[train])
    fitted = dict(zip(fitted_overheads, (float(c) for c in coef), strict=True))
    client_s = fitted.pop(CLIENT, 0.0)
    overheads = Overheads(**fitted)
    fitted_overheads = [n for n in fitted_overheads if n != CLIENT]
    predicted[timed] = kernel_s[timed] + (features[timed] @ coef if fitted_overheads else 0.0)
    # the kernels whose sides the fit saw: the kernel rows', or those inside the iterations when there are none
    seen = iteration if iterations_only else kernel
    kflat = Flat([terms[i] for i in np.flatnonzero(seen)])

    comm = _fit_communication(raw, base)

    # errors on held-out rows, per class
    table = []
    for c in [*OP_CLASSES, "iteration"]:
        sel = (raw["op_class"] == c).to_numpy()
        if not sel.any():
            continue
        summary = error_summary(predicted[sel & held], measured[sel & held])
        table.append({"op_class": c, "fitted": int((sel & ~held).sum()), "held_out": summary["n"]} | summary)
    errors = pd.DataFrame(table).drop(columns=["n"])

    # the rates: raised to the fastest fitted rate when measured (a max above 1 is not allowed)
    rates = _rates(classes)
    if base is None:
        fastest_compute = max([r for (c, s), r in rates.items() if s == "compute" and math.isfinite(r)], default=0.0)
        fastest_memory = max([r for (c, s), r in rates.items() if s == "memory" and math.isfinite(r)], default=0.0)
        if fastest_compute > best_gemm:
            notes.append(
                f"peak raised from the best measured GEMM rate {best_gemm / 1e12:.3g} TFLOP/s to the fastest "
                "fitted rate"
            )
        if fastest_memory > copy_bw:
            notes.append(
                f"bandwidth raised from the copy's {copy_bw / 1e9:.3g} GB/s to the fastest fitted memory rate (caches)"
            )
        peak = max(best_gemm, fastest_compute)
        peaks = {k: peak for k in ("fp32", "bf16", "fp16")}
        bandwidth = max(copy_bw, fastest_memory)

    data = profile_data.profile_data(
        name=name,
        description=description,
        base=base,
        dtype=dtype,
        raw=raw,
        classes=classes,
        fitted_sides=_fitted_sides(kflat, classes, fit_rows[seen]),
        inside_iterations=iterations_only,
        peaks=peaks,
        bandwidth=bandwidth,
        copy_bw=copy_bw,
        best_gemm=best_gemm,
        overheads=overheads,
        fitted_overheads=fitted_overheads,
        overhead_parts=parts,
        comm=comm,
        errors=errors,
        measurements=measurements,
        settings=settings,
        notes=notes,
    )
    profile = parse_hardware(data, f"calibrated profile {name!r}")
    out = raw.assign(predicted_s=predicted, held_out=held)
    return FitResult(profile, errors, out, notes, client_s)


def _fit_overheads(
    kernel_s: np.ndarray, features: np.ndarray, measured: np.ndarray, loss: str, weight: np.ndarray | None = None
) -> np.ndarray:
    """Non-negative seconds per unit of each feature minimising the relative error of kernels + overheads (l1 by
    iteratively reweighted least squares, as the kernel fit); ``weight`` scales each row's error."""
    base = np.ones(len(measured)) if weight is None else weight
    weights = base
    for _ in range(IRLS_ROUNDS if loss == "l1" else 1):
        w = np.sqrt(weights) / measured
        coef = nnls(features * w[:, None], np.sqrt(weights) - kernel_s * w)
        if loss == "l1":
            err = (kernel_s + features @ coef) / measured - 1.0
            weights = base / np.maximum(np.abs(err), IRLS_FLOOR)
    return coef


def _balance(raw: pd.DataFrame, iteration: np.ndarray) -> np.ndarray:
    """Row weights: 1 for kernels; iterations weighted so that those with prompt tokens (which decide TTFT) and the
    decode-only ones (ITL) count alike whatever their numbers (serving runs have many more decodes)."""
    weight = np.ones(len(raw))
    prefill = iteration & (raw["chunk"].to_numpy() > 0)
    decode = iteration & ~prefill
    for part in (prefill, decode):
        if part.any():
            weight[part] = 0.5 * iteration.sum() / part.sum()
    return weight


def _overhead_features(raw: pd.DataFrame, iteration: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Host-overhead features of each row (0 for kernel rows): 1, layers and sequences for whole iterations, and
    prompt chunks where the table counts them (``prefills``); a feature constant over the iterations (one depth
    measured, say) is left out (folded into per_iteration). Rows
    timed from a client's side (a probe's TTFT) add the client's wait per request (``client_requests``: 1 for those
    rows, 0 for token gaps), fitted as ``CLIENT``."""
    if not iteration.any():
        return np.zeros((len(raw), 0)), []
    layers = raw["layers"].to_numpy(dtype=float)
    seqs = raw["seqs"].to_numpy(dtype=float)
    candidates = {"per_iteration_s": np.ones(len(raw)), "per_layer_s": layers, "per_sequence_s": seqs}
    if "prefills" in raw.columns:  # prompt chunks per iteration: an iteration table that counts them
        candidates["per_prefill_s"] = raw["prefills"].fillna(0.0).to_numpy(dtype=float)
    if "client_requests" in raw.columns:
        candidates[CLIENT] = raw["client_requests"].fillna(0.0).to_numpy(dtype=float)
    names = [name for name, f in candidates.items() if name == "per_iteration_s" or len(np.unique(f[iteration])) > 1]
    return np.column_stack([np.where(iteration, candidates[n], 0.0) for n in names]), names


def _rates(classes: dict[str, ClassFit]) -> dict[tuple[str, str], float]:
    return {
        (c, s): (1.0 / f.side(s).per_unit_s if f.side(s).per_unit_s > 0 else math.inf)
        for c, f in classes.items()
        for s in SIDES
    }


def _fitted_sides(flat: Flat, classes: dict[str, ClassFit], fitted: np.ndarray) -> dict[tuple[str, str], int]:
    """(class, side) -> how many fitted terms are bound by that side (the sides the measurements determine)."""
    bound = flat.compute_bound(classes)
    in_fit = fitted[flat.row]
    out: dict[tuple[str, str], int] = {}
    for c in OP_CLASSES:
        for side, mask in (("compute", bound), ("memory", ~bound)):
            n = int(((flat.op_class == c) & mask & in_fit).sum())
            if n:
                out[(c, side)] = n
    return out


def _fit_communication(raw: pd.DataFrame, base: HardwareProfile | None) -> dict[str, Any] | None:
    """latency and bandwidth share of a ring all-reduce from measured all-reduces: t = latency + ring x bytes / rate,
    a non-negative least-squares line (the curve's half size is folded into the latency)."""
    rows = raw[raw["op_class"] == "communication"]
    if rows.empty or base is None:
        return None
    world = rows["seqs"].to_numpy(dtype=float)
    ring = 2.0 * (world - 1.0) / world
    t = rows["median_s"].to_numpy(dtype=float)
    x = nnls(np.column_stack([np.ones_like(t) / t, ring * rows["bytes"].to_numpy(dtype=float) / t]), np.ones_like(t))
    latency, per_byte = float(x[0]), float(x[1])
    share = min(1.0, 1.0 / (per_byte * base.link_bandwidth)) if per_byte > 0 else 1.0
    return {"latency_s": latency, "max": share, "n": len(rows)}


format_errors = profile_data.format_errors  # the error table, printed by ``ferry calibrate``
