"""Fitting a hardware profile to measured times: efficiency curves per operator class, and host overheads.

The model is the cost model's own (``costmodel.roofline``). A kernel of f FLOPs and b bytes in operator class c takes

    t = max(a_c * f + h_c, a_m * b + h_m)

where, per side of the roofline, ``a = 1 / (peak x max)`` is seconds per FLOP (or byte) on large kernels and
``h = half_size / (peak x max)`` the fixed seconds every instance pays: a fixed cost plus a linear term on each side.
A measured row is the sum of its kernels' times (one kernel, or several timed together, as Vidur's "mlp"). A whole
iteration of the real executor adds host time, ``per_iteration + per_layer x layers + per_sequence x sequences``.

Fitting minimises the relative error, sum over rows of (predicted / measured - 1)^2 or of its absolute value, by
alternation: given the side of its roofline each kernel is on, the prediction is linear in the (a, h) of every (class,
side) and in any extra per-row terms (host overheads of whole iterations), so the best non-negative values solve a
non-negative least-squares problem (Lawson and Hanson's active-set method, ``costmodel.calibration.nnls``; the absolute
error by reweighting each row by 1 / |its error|); then every kernel moves to the side that is now slower; repeat until
none moves. The alternation starts from several assignments (the prior profile's, all compute-bound, all memory-bound,
split at the median intensity), then restarts each class alone from each, and keeps the best.

Only numpy: the fit runs anywhere, on measurements taken elsewhere (``ferry calibrate --from-measurements``).
Errors are reported on held-out rows only (``held_out``: alternate points of each series, never fitted on).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from costmodel.calibration.nnls import nnls
from costmodel.hardware import OP_CLASSES, HardwareProfile, load_hardware
from costmodel.model_spec import ModelSpec
from costmodel.roofline import CostModel, KernelCost
from costmodel.shape import IterationShape

FloatArray = npt.NDArray[np.float64]
SIDES = ("compute", "memory")
IRLS_ROUNDS = 8  # reweighting rounds of the l1 fit
IRLS_FLOOR = 0.005  # errors below 0.5% weigh as 0.5% (keeps the weights finite)


# ---- what a measured row is made of --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Term:
    """Kernels of one class and size inside a measured row."""

    op_class: str  # gemm, attention_prefill, attention_decode or elementwise
    flops: float  # FLOPs of one instance (ferry's count)
    bytes: float  # DRAM bytes of one instance (ferry's count)
    count: float = 1.0  # instances in the row


Terms = tuple[Term, ...]


def dump_terms(terms: Iterable[Term]) -> str:
    """A row's terms as compact JSON, ``[[class, flops, bytes, count], ...]`` (the raw CSV's ``kernels`` column)."""
    return json.dumps([[t.op_class, t.flops, t.bytes, t.count] for t in terms], separators=(",", ":"))


def load_terms(text: str) -> Terms:
    try:
        return tuple(Term(str(c), float(f), float(b), float(n)) for c, f, b, n in json.loads(text))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a kernels list [[class, flops, bytes, count], ...]: {text[:80]!r} ({exc})") from None


@lru_cache(maxsize=1)
def _reference_hardware() -> HardwareProfile:
    return load_hardware("h100-sxm")  # any profile: FLOPs and bytes do not depend on the device


class WorkCounter:
    """ferry's FLOPs and bytes for the kernels of a model at a dtype (what the cost model will multiply by rates)."""

    def __init__(self, spec: ModelSpec, dtype: str, tp: int = 1) -> None:
        self.cost = CostModel(spec, _reference_hardware(), tp=tp, dtype=dtype)

    def terms(self, shape: IterationShape, wanted: dict[str, int] | None = None) -> Terms:
        """The iteration's kernels as terms; ``wanted`` keeps only these kernel names, with these instance counts
        (default: every kernel with work, as many instances as the iteration runs)."""
        return terms_of(self.cost.kernels(shape), wanted)


def terms_of(kernels: Sequence[KernelCost], wanted: dict[str, int] | None = None) -> Terms:
    """``CostModel.kernels`` output as terms (see ``WorkCounter.terms``)."""
    out = []
    for k in kernels:
        if k.flops <= 0 and k.bytes <= 0:
            continue
        if wanted is None:
            out.append(Term(k.op_class, k.flops, k.bytes, float(k.count)))
        elif k.name in wanted:
            out.append(Term(k.op_class, k.flops, k.bytes, float(wanted[k.name])))
    return tuple(out)


# ---- the fitted parameters -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a class's roofline: ``time = per_unit_s * size + fixed_s`` (size in FLOPs or bytes)."""

    per_unit_s: float  # seconds per FLOP or byte: 1 / (peak x max)
    fixed_s: float  # seconds each instance pays: half_size / (peak x max)

    def time(self, size: FloatArray) -> FloatArray:
        return np.where(size > 0, self.per_unit_s * size + self.fixed_s, 0.0).astype(np.float64)


@dataclass(frozen=True, slots=True)
class ClassFit:
    compute: Side
    memory: Side

    def side(self, name: str) -> Side:
        return self.compute if name == "compute" else self.memory

    def time(self, flops: FloatArray, nbytes: FloatArray) -> FloatArray:
        return np.maximum(self.compute.time(flops), self.memory.time(nbytes))

    @classmethod
    def of(cls, hardware: HardwareProfile, op_class: str, compute_peak: float) -> ClassFit:
        """A profile's curves as sides: (f + half) / (peak x max) = f / (peak x max) + half / (peak x max)."""
        eff = hardware.efficiency.of(op_class)
        crate = compute_peak * eff.compute.max
        mrate = hardware.bandwidth * eff.memory.max
        return cls(Side(1 / crate, eff.compute.half_size / crate), Side(1 / mrate, eff.memory.half_size / mrate))


@dataclass(frozen=True, slots=True)
class Overheads:
    """Host seconds of an iteration: ``per_iteration + per_layer x layers + per_sequence x sequences`` (+
    ``per_prefill x prompt chunks`` where measured)."""

    per_iteration_s: float = 0.0
    per_layer_s: float = 0.0
    per_sequence_s: float = 0.0
    per_prefill_s: float = 0.0

    def time(self, layers: FloatArray, seqs: FloatArray) -> FloatArray:
        return self.per_iteration_s + self.per_layer_s * layers + self.per_sequence_s * seqs


class Flat:
    """Many rows' terms as flat numpy columns (term -> row), for vectorised predictions and design matrices."""

    def __init__(self, rows: Sequence[Terms]) -> None:
        pairs = [(i, t) for i, terms in enumerate(rows) for t in terms]
        self.n_rows = len(rows)
        self.row = np.array([i for i, _ in pairs], dtype=np.int64)
        op_class = np.array([t.op_class for _, t in pairs], dtype=object)
        self.flops = np.array([t.flops for _, t in pairs], dtype=np.float64)
        self.bytes = np.array([t.bytes for _, t in pairs], dtype=np.float64)
        self.count = np.array([t.count for _, t in pairs], dtype=np.float64)
        unknown = set(op_class.tolist()) - set(OP_CLASSES)
        if unknown:
            raise ValueError(f"unknown operator class(es) {', '.join(sorted(unknown))}; known: {', '.join(OP_CLASSES)}")
        # the terms of each class present, as index arrays
        self.index = {c: np.flatnonzero(op_class == c) for c in OP_CLASSES if (op_class == c).any()}
        self.op_class = op_class

    def classes(self) -> list[str]:
        return list(self.index)

    def times(self, classes: dict[str, ClassFit]) -> FloatArray:
        """Seconds of each term's instances (count x kernel time)."""
        out = np.zeros(len(self.row))
        for c, idx in self.index.items():
            out[idx] = self.count[idx] * classes[c].time(self.flops[idx], self.bytes[idx])
        return out

    def predict(self, classes: dict[str, ClassFit]) -> FloatArray:
        """Seconds of each row: the sum of its terms."""
        return np.bincount(self.row, weights=self.times(classes), minlength=self.n_rows).astype(np.float64)

    def compute_bound(self, classes: dict[str, ClassFit]) -> npt.NDArray[np.bool_]:
        """Per term: is the compute side the slower one (the roofline's max)?"""
        out = np.zeros(len(self.row), dtype=bool)
        for c, idx in self.index.items():
            fit = classes[c]
            out[idx] = fit.compute.time(self.flops[idx]) >= fit.memory.time(self.bytes[idx])
        return out


# ---- non-negative least squares ------------------------------------------------------------------------------------


def fit_classes(
    rows: Sequence[Terms],
    measured: FloatArray,
    prior: dict[str, ClassFit],
    min_per_unit: dict[tuple[str, str], float] | None = None,
    max_rounds: int = 20,
    loss: str = "l2",
    extra: FloatArray | None = None,
    weight: FloatArray | None = None,
    frozen: frozenset[tuple[str, str, str]] = frozenset(),
) -> tuple[dict[str, ClassFit], FloatArray]:
    """Per-class (a, h) on both sides minimising sum((predicted / measured - 1)^2) over ``rows`` (``loss="l1"``:
    sum |predicted / measured - 1|, which favours the typical row over the odd one out, as a median does).

    ``extra`` (rows x features, >= 0) adds time that is not a kernel's, linear in features with non-negative
    seconds per unit fitted jointly: the host overheads of whole iterations (1, layers, sequences; 0 for kernel rows).
    Returns the curves and those seconds per unit. ``weight`` (per row, default 1) scales each row's error.

    ``prior`` gives every class's starting curves (and the curves of a side no row is bound by, which stay as they
    are). ``min_per_unit[(class, side)]`` bounds a from below: 1 / peak keeps ``max <= 1`` against a known peak.
    ``frozen`` names parameters ``(class, side, "a" | "h")`` kept at the prior's value: those the rows cannot tell
    from the ``extra`` overheads (whole iterations of one model: see ``costmodel.calibration.profile``)."""
    measured = np.asarray(measured, dtype=np.float64)
    if len(rows) != len(measured) or not len(rows):
        raise ValueError(f"need as many measured times as rows, and some rows (got {len(rows)} and {len(measured)})")
    if not (measured > 0).all():
        raise ValueError("measured times must be positive")
    flat = Flat(rows)
    bounds = min_per_unit or {}
    starts = [flat.compute_bound(prior), flat.flops > 0, flat.bytes <= 0]
    intensity = np.divide(flat.flops, flat.bytes, out=np.full(len(flat.row), np.inf), where=flat.bytes > 0)
    split = np.zeros(len(flat.row), dtype=bool)
    for idx in flat.index.values():
        split[idx] = intensity[idx] >= np.median(intensity[idx])
    starts.append(split)

    n_extra = 0 if extra is None else extra.shape[1]
    base = np.ones(len(measured)) if weight is None else np.asarray(weight, dtype=np.float64)

    def predict(params: dict[str, ClassFit], coef: FloatArray) -> FloatArray:
        return flat.predict(params) + (extra @ coef if extra is not None else 0.0)

    Fit = tuple[float, dict[str, ClassFit], FloatArray]

    def alternate(bound: npt.NDArray[np.bool_], params: dict[str, ClassFit]) -> Fit:
        bound = bound & (flat.flops > 0) | (flat.bytes <= 0)
        weights = base
        coef = np.zeros(n_extra)
        for _ in range(IRLS_ROUNDS if loss == "l1" else 1):
            seen: set[bytes] = set()
            for _ in range(max_rounds):
                params, coef = _solve(flat, measured, bound, params, bounds, weights, extra, frozen)
                moved = flat.compute_bound(params)
                if (moved == bound).all() or moved.tobytes() in seen:  # converged, or cycling
                    break
                seen.add(bound.tobytes())
                bound = moved
            if loss == "l1":  # iteratively reweighted least squares: weight 1 / |error| makes it least |error|
                weights = base / np.maximum(np.abs(predict(params, coef) / measured - 1.0), IRLS_FLOOR)
        err = predict(params, coef) / measured - 1.0
        return float(np.mean(base * (np.abs(err) if loss == "l1" else err**2))), params, coef

    best = min((alternate(start, dict(prior)) for start in starts), key=lambda r: r[0])
    # classes interact only through rows that time several kernels together; restart one class at a time from each
    # starting assignment, the others kept, so that one class's poor start is not hidden by another's good one
    for sel in flat.index.values():
        tried = {flat.compute_bound(best[1])[sel].tobytes()}
        for start in starts:
            trial = flat.compute_bound(best[1])
            trial[sel] = start[sel]
            if trial[sel].tobytes() in tried:
                continue
            tried.add(trial[sel].tobytes())
            got = alternate(trial, best[1])
            if got[0] < best[0] - 1e-12:
                best = got
    return _unbound_to_prior(flat, best[1], prior), best[2]


def _unbound_to_prior(flat: Flat, params: dict[str, ClassFit], prior: dict[str, ClassFit]) -> dict[str, ClassFit]:
    """A side that bounds no measured kernel keeps whatever an earlier round of the alternation left in it, which no
    measurement supports; put the prior back there, unless that would make it bind somewhere (then the fit stands)."""
    bound = flat.compute_bound(params)
    out = dict(params)
    for c, idx in flat.index.items():
        for side in SIDES:
            users = bound[idx] if side == "compute" else ~bound[idx]
            if users.any():
                continue
            other = "memory" if side == "compute" else "compute"
            sides = {side: prior[c].side(side), other: params[c].side(other)}
            trial = ClassFit(sides["compute"], sides["memory"])
            if (flat.compute_bound(out | {c: trial})[idx] == bound[idx]).all():
                out[c] = trial
    return out


def _solve(
    flat: Flat,
    measured: FloatArray,
    compute_bound: npt.NDArray[np.bool_],
    params: dict[str, ClassFit],
    bounds: dict[tuple[str, str], float],
    row_weight: FloatArray | None = None,
    extra: FloatArray | None = None,
    frozen: frozenset[tuple[str, str, str]] = frozenset(),
) -> tuple[dict[str, ClassFit], FloatArray]:
    """One least-squares step: the (a, h) of each (class, side) that has bound terms, the rest kept, and the
    coefficients of the ``extra`` columns (seconds per unit of each feature, rows x features). Rows count with
    ``row_weight`` (default 1) in the sum of squared relative errors; ``frozen`` parameters keep ``params``'s value
    (their time is taken off the target)."""
    columns: list[FloatArray] = []
    names: list[tuple[str, str, str]] = []
    scale = np.ones(flat.n_rows) if row_weight is None else np.sqrt(row_weight)
    target = scale.copy()
    weight = scale / measured
    for c, idx in flat.index.items():
        for side in SIDES:
            sel = idx[compute_bound[idx] if side == "compute" else ~compute_bound[idx]]
            if not len(sel):
                continue
            size = (flat.flops if side == "compute" else flat.bytes)[sel]
            rows, count = flat.row[sel], flat.count[sel]
            per_unit = np.bincount(rows, weights=count * size, minlength=flat.n_rows)
            fixed = np.bincount(rows, weights=count, minlength=flat.n_rows)
            low = bounds.get((c, side), 0.0)
            kept = params[c].side(side)
            for what, col, value in (("a", per_unit, kept.per_unit_s - low), ("h", fixed, kept.fixed_s)):
                if (c, side, what) in frozen:
                    target -= value * col * weight
                else:
                    columns.append(col * weight)
                    names.append((c, side, what))
            target -= low * per_unit * weight  # a = low + a', a' >= 0
    n_extra = 0 if extra is None else extra.shape[1]
    if extra is not None:
        columns += [extra[:, j] * weight for j in range(n_extra)]
    if not columns:
        return params, np.zeros(n_extra)
    x = nnls(np.column_stack(columns), target)
    found: dict[tuple[str, str], dict[str, float]] = {}
    for (c, side, what), value in zip(names, x[: len(names)], strict=True):
        found.setdefault((c, side), {})[what] = float(value)
    out = dict(params)
    for c in flat.classes():
        sides = {}
        for side in SIDES:
            if (c, side) in found:
                got, kept, low = found[(c, side)], params[c].side(side), bounds.get((c, side), 0.0)
                sides[side] = Side(low + got.get("a", kept.per_unit_s - low), got.get("h", kept.fixed_s))
            else:
                sides[side] = out[c].side(side)
        out[c] = ClassFit(sides["compute"], sides["memory"])
    return out, x[len(names) :]


# ---- scoring -------------------------------------------------------------------------------------------------------


def held_out(keys: Sequence[tuple[object, ...]], order: Sequence[tuple[float, ...]]) -> npt.NDArray[np.bool_]:
    """Which rows to hold out: within each group (rows with equal ``keys``), sorted by ``order``, every other row
    (the 2nd, 4th, ...). The fit sees the rest; held-out rows interleave with fitted ones over the whole range."""
    out = np.zeros(len(keys), dtype=bool)
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        ranked = sorted(members, key=lambda i: (order[i], i))
        out[ranked[1::2]] = True
    return out


def error_summary(predicted: FloatArray, measured: FloatArray) -> dict[str, float]:
    """n, median and p90 of |predicted / measured - 1|, and the median signed error (bias; > 0: predicted slow)."""
    err = np.asarray(predicted) / np.asarray(measured) - 1.0
    if not len(err):
        return {"n": 0, "median": math.nan, "p90": math.nan, "bias": math.nan}
    return {
        "n": int(len(err)),
        "median": float(np.median(np.abs(err))),
        "p90": float(np.percentile(np.abs(err), 90)),
        "bias": float(np.median(err)),
    }
