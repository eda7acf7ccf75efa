"""Fitting a profile to NVIDIA's measured kernel database, and scoring its curves and its tables on held-out shapes.

For one system and one engine (``costmodel.kerneldb``), every measured shape of three kernel classes, bf16 with a bf16
KV cache and full attention: GEMMs (m, n, k), prefill attention (prompts x length, every head count and head size),
decode attention (sequences x context), and the all-reduce (message size over 2-8 GPUs). Each class's shapes form
series along one size (m; prompt length; context; message size) for each of the others; every other point of each
series is held out (``fit.held_out``), the rest fitted on, and both of ferry's ways of timing a kernel are scored on
the held-out points:

- the curves: per class, ``t = max(floor, a_c FLOPs + h_c, a_m bytes + h_m)`` (the profile's two efficiency curves
  and a per-kernel floor), fitted by alternation (each point bound by the piece that is now slowest; each piece a
  non-negative least-squares fit of the relative error of its points, reweighted towards the median; ``a`` kept at or
  above 1 / peak and 1 / bandwidth); the all-reduce as ``latency + 2 (n-1)/n bytes / (link x share)``;
- the tables (``costmodel.kernel_tables``): built from the fitted points only, the held-out points' times read from
  them exactly as the simulator reads them (``formulas.table_factor``), times the fitted curves' roofline.

``fit_database`` writes the fitted profile: ``base``'s device rates (a datasheet profile), the fitted curves and
floors with their held-out errors, an engine preset's host overheads, and ``kernel_tables`` naming the database with
the tables' held-out errors. Elementwise kernels (norms, RoPE, activation, embedding) are not in the database: their
curves stay ``base``'s, assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from costmodel import formulas as f
from costmodel import kernel_tables as kt
from costmodel import kerneldb
from costmodel.calibration.aiconfigurator import model_shapes
from costmodel.calibration.fit import error_summary, held_out, nnls
from costmodel.calibration.profile_data import curve, pct
from costmodel.engines import apply_engine
from costmodel.hardware import MEASURED, HardwareProfile, parse_hardware

FloatArray = npt.NDArray[np.float64]
CLASSES = ("gemm", "attention_prefill", "attention_decode", "all_reduce")
# each framework's engine-overhead preset (hwprofiles/engines.yaml): the host time its kernels are served with
PRESETS = {"vllm": "vllm-v1", "sglang": "sglang", "trtllm": "trt-llm"}
IRLS_ROUNDS, IRLS_FLOOR = 6, 0.005


@dataclass(frozen=True)
class Piecewise:
    """One class's fitted time: ``max(floor, a_c FLOPs + h_c, a_m bytes + h_m)`` (seconds)."""

    a_c: float  # seconds per FLOP
    h_c: float  # seconds per instance on the compute side
    a_m: float  # seconds per byte
    h_m: float  # seconds per instance on the memory side
    floor: float  # the least seconds of one instance

    def pieces(self, flops: FloatArray, nbytes: FloatArray) -> FloatArray:
        """Each point's time on each piece: columns floor, compute, memory."""
        return np.column_stack(
            [np.full(len(flops), self.floor), self.a_c * flops + self.h_c, self.a_m * nbytes + self.h_m]
        )

    def time(self, flops: FloatArray, nbytes: FloatArray) -> FloatArray:
        return np.asarray(self.pieces(flops, nbytes).max(axis=1), dtype=np.float64)

    def row(self) -> FloatArray:
        """As a row of ``kernel_params`` (one instance)."""
        out = np.zeros(f.NUM_PARAMS)
        out[[f.COUNT, f.C_RATE, f.C_HALF, f.M_RATE, f.M_HALF, f.FLOOR]] = (
            1.0, 1.0 / self.a_c, self.h_c / self.a_c, 1.0 / self.a_m, self.h_m / self.a_m, self.floor
        )  # fmt: skip
        return out


def fit_piecewise(flops: FloatArray, nbytes: FloatArray, t: FloatArray, low_c: float, low_m: float) -> Piecewise:
    """The ``Piecewise`` of least relative error over points (FLOPs, bytes, seconds), by alternation from several
    starting assignments (see the module docstring); ``low_c``/``low_m``: the least seconds per FLOP and per byte."""
    starts = [
        np.where(flops * low_c >= nbytes * low_m, 1, 2),  # the peaks' roofline
        np.where(t <= np.quantile(t, 0.1), 0, np.where(flops * low_c >= nbytes * low_m, 1, 2)),
        np.full(len(t), 2),
        np.full(len(t), 1),
    ]
    best: tuple[float, Piecewise] | None = None
    for start in starts:
        got = _alternate(flops, nbytes, t, start, low_c, low_m)
        err = float(np.median(np.abs(got.time(flops, nbytes) / t - 1.0)))
        if best is None or err < best[0]:
            best = (err, got)
    assert best is not None
    return best[1]


def _alternate(flops: FloatArray, nbytes: FloatArray, t: FloatArray, bound: np.ndarray, low_c: float,
               low_m: float) -> Piecewise:  # fmt: skip
    weights = np.ones(len(t))
    fit = Piecewise(low_c, 0.0, low_m, 0.0, 0.0)
    for _ in range(IRLS_ROUNDS):
        seen: set[bytes] = set()
        for _ in range(30):
            fit = _solve(flops, nbytes, t, bound, weights, low_c, low_m, fit)
            moved = np.argmax(fit.pieces(flops, nbytes), axis=1)
            if (moved == bound).all() or moved.tobytes() in seen:
                break
            seen.add(bound.tobytes())
            bound = moved
        weights = 1.0 / np.maximum(np.abs(fit.time(flops, nbytes) / t - 1.0), IRLS_FLOOR)
    return fit


def _solve(flops: FloatArray, nbytes: FloatArray, t: FloatArray, bound: np.ndarray, weights: FloatArray,
           low_c: float, low_m: float, prior: Piecewise) -> Piecewise:  # fmt: skip
    """Each piece's least weighted squared relative error over the points it bounds (a piece bounding none keeps
    ``prior``'s values)."""
    w = np.sqrt(weights)
    floor = prior.floor
    sel = bound == 0
    if sel.any():
        floor = float(np.sum(weights[sel] / t[sel]) / np.sum(weights[sel] / t[sel] ** 2))
    sides = []
    for piece, size, low, (a0, h0) in ((1, flops, low_c, (prior.a_c, prior.h_c)),
                                       (2, nbytes, low_m, (prior.a_m, prior.h_m))):  # fmt: skip
        sel = bound == piece
        if not sel.any():
            sides.append((a0, h0))
            continue
        scale = w[sel] / t[sel]
        x = nnls(np.column_stack([size[sel] * scale, scale]), w[sel] - low * size[sel] * scale)
        sides.append((low + float(x[0]), float(x[1])))
    return Piecewise(sides[0][0], sides[0][1], sides[1][0], sides[1][1], floor)


# ---- the measured points of each class -------------------------------------------------------------------------------


def class_points(system: str, framework: str, version: str, comm_version: str | None,
                 root: Path | None = None) -> dict[str, pd.DataFrame]:  # fmt: skip
    """Per class, every bf16 measured shape with ferry's ``flops`` and ``bytes`` for it (one layer, one GPU), the
    measured seconds (``latency_s``), its ``series`` and place along it (``size``), whether it is ``held`` out, and
    whether it is a kernel of ferry's built-in dense models at tensor parallelism 1-8 (``models``)."""
    out = {}
    model_gemms, model_heads = model_shapes()
    gemm = kerneldb.read(system, "gemm_perf", framework, version, root)
    g = gemm[gemm["gemm_dtype"] == "bfloat16"]
    m, n, k = (g[c].to_numpy(float) for c in ("m", "n", "k"))
    out["gemm"] = g.assign(flops=2.0 * m * n * k, bytes=2.0 * (n * k + m * (n + k)), size=m,
                           series=list(zip(g["n"], g["k"], strict=True)))  # fmt: skip
    for cls, name in (
        ("attention_prefill", "context_attention_perf"),
        ("attention_decode", "generation_attention_perf"),
    ):
        rows = kerneldb.read(system, name, framework, version, root)
        rows = rows[(rows["kv_cache_dtype"] == "bfloat16") & (rows.get("window_size", 0) == 0)]
        b = rows["batch_size"].to_numpy(float)
        q = (rows["num_heads"] * rows["head_dim"]).to_numpy(float)
        kv = (rows["num_key_value_heads"] * rows["head_dim"]).to_numpy(float)
        if cls == "attention_decode":
            length = (rows["isl"] + rows["step"]).to_numpy(float)
            flops, nbytes = 4.0 * q * b * length, 4.0 * b * q + 4.0 * kv * (b + b * length)
        else:
            length = rows["isl"].to_numpy(float)
            flops, nbytes = 2.0 * q * b * length * (length + 1), 4.0 * b * length * q + 8.0 * kv * b * length
        series = list(zip(rows["num_heads"], rows["num_key_value_heads"], rows["head_dim"], rows["batch_size"],
                          strict=True))  # fmt: skip
        out[cls] = rows.assign(flops=flops, bytes=nbytes, size=length, series=series)
    if comm_version is not None:
        rows = kerneldb.read(system, "custom_allreduce_perf", framework, comm_version, root)
        size = rows["allreduce_dtype"].map(kt.ELEMENT_BYTES).fillna(2.0) if "allreduce_dtype" in rows else 2.0
        message = rows["message_size"] * size
        out["all_reduce"] = rows.assign(bytes=message, flops=0.0, size=message, series=list(rows["num_gpus"]))
    for cls, rows in out.items():
        held = held_out([(s,) for s in rows["series"]], [(float(v),) for v in rows["size"]])
        if cls == "gemm":
            models = [(int(n), int(k)) in model_gemms for n, k in zip(rows["n"], rows["k"], strict=True)]
        elif cls == "all_reduce":
            models = [True] * len(rows)
        else:
            combos = zip(rows["num_heads"], rows["num_key_value_heads"], rows["head_dim"], strict=True)
            models = [(int(a), int(b), int(c)) in model_heads for a, b, c in combos]
        out[cls] = rows.assign(held=held, models=models).reset_index(drop=True)
    return out


def neighbour_spread(gemm: pd.DataFrame) -> dict[str, float]:
    """How far the database agrees with itself: over every bf16 GEMM measured at both m and m + 1 (the same n and
    k; 1-3% more work at most), the median and p90 of |t(m + 1) / t(m) - 1| and how many pairs. No interpolation
    can predict a held-out shape closer than its measured neighbours agree: kernel choices, tile and wave steps and
    timing noise in the measurements show here."""
    g = gemm[gemm["gemm_dtype"] == "bfloat16"].drop_duplicates(["n", "k", "m"]).set_index(["n", "k", "m"])
    t = g["latency_s"]
    nxt = pd.MultiIndex.from_arrays([t.index.get_level_values(0), t.index.get_level_values(1),
                                     t.index.get_level_values(2) + 1])  # fmt: skip
    have = nxt.isin(t.index)
    if not have.any():
        return {"n": 0, "median": float("nan"), "p90": float("nan")}
    e = np.abs(t.loc[nxt[have]].to_numpy() / t.to_numpy()[have] - 1.0)
    return {"n": int(len(e)), "median": float(np.median(e)), "p90": float(np.quantile(e, 0.9))}


# ---- held-out predictions ------------------------------------------------------------------------------------------


def curve_predictions(points: pd.DataFrame, fit: Piecewise) -> FloatArray:
    return fit.time(points["flops"].to_numpy(float), points["bytes"].to_numpy(float))


def _roofs(cls: str, key: tuple[Any, ...], xs: FloatArray, ys: FloatArray, fit: Piecewise | None,
           ring: tuple[float, float, float] | None) -> FloatArray:  # fmt: skip
    """log roofline seconds of one series' kernel at the points of its grid (natural-log axes, as ``kernel_tables``)."""
    x, y = np.meshgrid(np.exp(xs), np.exp(ys), indexing="ij")
    if cls == "all_reduce":
        assert ring is not None
        return np.log(ring[0] + 2.0 * (key[0] - 1) / key[0] * x * ring[1])
    assert fit is not None
    if cls == "gemm":
        n, k = float(key[0]), float(key[1])
        flops, nbytes = 2.0 * x * n * k, 2.0 * (n * k + x * (n + k))
    else:
        q, kv = float(key[0] * key[2]), float(key[1] * key[2])
        if cls == "attention_decode":  # x sequences attending y tokens in all
            flops, nbytes = 4.0 * q * y, 4.0 * x * q + 4.0 * kv * (x + y)
        else:  # x prompts of y tokens
            flops, nbytes = 2.0 * q * x * y * (y + 1), 4.0 * x * y * q + 8.0 * kv * x * y
    return np.log(fit.time(flops.ravel(), nbytes.ravel()).reshape(x.shape))


def table_predictions(cls: str, points: pd.DataFrame, fit: Piecewise | None,
                      ring: tuple[float, float, float] | None) -> FloatArray:  # fmt: skip
    """The held-out points' seconds as the simulator reads them from tables built from the fitted points alone: each
    series' (for attention, each head count's) table (``kernel_tables``: factors over the fitted roofline and the
    roofline's seconds), read at the point by ``formulas.table_time``."""
    out = np.full(len(points), np.nan)
    fitted = points[~points["held"]]
    groups = ["n", "k"] if cls == "gemm" else ["num_gpus"] if cls == "all_reduce" else \
        ["num_heads", "num_key_value_heads", "head_dim"]  # fmt: skip
    one = np.zeros(1)
    for key, held in points[points["held"]].groupby(groups):
        key = key if isinstance(key, tuple) else (key,)
        train = fitted[(fitted[groups] == pd.Series(key, index=groups)).all(axis=1)]
        if cls == "all_reduce":
            assert ring is not None
            consts = np.zeros(f.NUM_CONSTS)
            consts[[f.N_ALLREDUCE, f.RING, f.AR_RATE, f.AR_LATENCY]] = (1.0, 2.0 * (key[0] - 1) / key[0],
                                                                        1.0 / ring[1], ring[0])  # fmt: skip
            got = kt.allreduce_factors(train, int(key[0]), consts)
            factors = None if got is None else (got[0], one, got[1][:, None])
            roof = ring[0] + consts[f.RING] * held["bytes"].to_numpy(float) * ring[1]
            x, y = np.log(held["bytes"].to_numpy(float)), np.zeros(len(held))
        else:
            assert fit is not None
            roof = fit.time(held["flops"].to_numpy(float), held["bytes"].to_numpy(float))
            if cls == "gemm":
                got = kt.gemm_factors(train, float(key[0]), float(key[1]), fit.row(), 2.0, 2.0)
                factors = None if got is None else (got[0], one, got[1][:, None])
                x, y = np.log(held["m"].to_numpy(float)), np.zeros(len(held))
            else:
                decode = cls == "attention_decode"
                heads, kv_heads, head_dim = (int(v) for v in key)
                factors = kt.attention_factors(train, decode, heads, kv_heads, head_dim, fit.row(), 2.0, 2.0)
                x = np.log(held["batch_size"].to_numpy(float))
                y = np.log(held["size"].to_numpy(float)) + (x if decode else 0.0)  # decode: tokens of all sequences
        if factors is None:
            continue
        xs, ys, fs = factors
        tables = kt.pack({0: (xs, ys, fs, _roofs(cls, key, xs, ys, fit, ring))})
        out[held.index.to_numpy()] = [f.table_time(tables.toc, tables.tab, 0, a, b, r)
                                      for a, b, r in zip(x, y, roof, strict=True)]  # fmt: skip
    return out


def fit_ring(points: pd.DataFrame) -> tuple[float, float, float]:
    """(latency s, seconds per ring byte, link share unused) of ``latency + 2 (n-1)/n bytes x per_byte`` over the
    fitted all-reduces, least relative squared error (non-negative)."""
    n = points["num_gpus"].to_numpy(float)
    ring = 2.0 * (n - 1.0) / n * points["bytes"].to_numpy(float)
    t = points["latency_s"].to_numpy(float)
    x = nnls(np.column_stack([1.0 / t, ring / t]), np.ones(len(t)))
    return float(x[0]), float(max(x[1], 1e-18)), 0.0


# ---- the profile ---------------------------------------------------------------------------------------------------


@dataclass
class MeasuredFit:
    profile: HardwareProfile
    # per class: points fitted and held out, held-out median and p90 |error| of the curves and of the tables
    errors: pd.DataFrame


def fit_database(
    system: str,
    framework: str,
    base: HardwareProfile,
    *,
    name: str,
    version: str | None = None,
    engine_overheads: str | None = None,
    root: Path | None = None,
) -> MeasuredFit:
    """Fit ``base`` (a datasheet profile of the same GPU) to the database's ``system`` as ``framework`` runs it."""
    package = kerneldb.installed_version() if root is None else "test"
    if package is None:
        raise ValueError(kerneldb.unavailable("0.12.0"))
    version = version or kerneldb.current_version(system, framework, root)
    comm = kerneldb.table_version(system, "custom_allreduce_perf", framework, version, root)
    points = class_points(system, framework, version, comm, root)
    peak, bandwidth = base.peak_flops("bfloat16"), base.bandwidth
    fits: dict[str, Piecewise] = {}
    table = []
    ring = None
    for cls in CLASSES:
        if cls not in points:
            continue
        rows = points[cls]
        train, held = rows[~rows["held"]], rows["held"].to_numpy()
        if cls == "all_reduce":
            ring = fit_ring(train)
            nn = rows["num_gpus"].to_numpy(float)
            curve_s = ring[0] + 2.0 * (nn - 1.0) / nn * rows["bytes"].to_numpy(float) * ring[1]
            table_s = table_predictions(cls, rows, None, ring)
        else:
            fit = fit_piecewise(train["flops"].to_numpy(float), train["bytes"].to_numpy(float),
                                train["latency_s"].to_numpy(float), 1.0 / peak, 1.0 / bandwidth)  # fmt: skip
            fits[cls] = fit
            curve_s = curve_predictions(rows, fit)
            table_s = table_predictions(cls, rows, fit, None)
        measured = rows["latency_s"].to_numpy(float)
        curves, tables = error_summary(curve_s[held], measured[held]), error_summary(table_s[held], measured[held])
        ours = held & rows["models"].to_numpy()  # the kernels of ferry's built-in models
        mine = error_summary(table_s[ours], measured[ours])
        table.append(
            {"op_class": cls, "fitted": int((~held).sum()), "held_out": int(held.sum())}
            | {f"curve_{k}": curves[k] for k in ("median", "p90", "bias")}
            | {f"table_{k}": tables[k] for k in ("median", "p90", "bias")}
            | {"models_held_out": mine["n"], "models_median": mine["median"], "models_p90": mine["p90"]}
        )
    errors = pd.DataFrame(table)
    data = _profile_data(base, fits, ring, errors, name, system, framework, version, comm, str(package),
                         engine_overheads or PRESETS[framework])  # fmt: skip
    return MeasuredFit(parse_hardware(data, f"profile {name!r} fitted to {system} {framework}"), errors)


def _profile_data(base: HardwareProfile, fits: dict[str, Piecewise], ring: tuple[float, float, float] | None,
                  errors: pd.DataFrame, name: str, system: str, framework: str, version: str, comm: str | None,
                  package: str, preset: str) -> dict[str, Any]:  # fmt: skip
    data = apply_engine(base, preset).model_dump(mode="json")
    err = {r["op_class"]: r for r in errors.to_dict(orient="records")}
    peak, bandwidth = base.peak_flops("bfloat16"), base.bandwidth
    for cls, fit in fits.items():
        e = err[cls]
        note = (f"fitted to {e['fitted']} measured bf16 shapes of {system} ({framework} {version}); held-out error "
                f"median {pct(e['curve_median'])}, p90 {pct(e['curve_p90'])} over {e['held_out']} shapes")  # fmt: skip
        data["efficiency"][cls] = {
            "compute": curve(1.0 / fit.a_c, fit.h_c, peak, note),
            "memory": curve(1.0 / fit.a_m, fit.h_m, bandwidth, note),
            "floor_s": {"value": fit.floor, "source": MEASURED, "note": "the least time of one kernel: " + note},
        }
    if ring is not None:
        e = err["all_reduce"]
        share = min(1.0, 1.0 / (ring[1] * base.link_bandwidth))
        note = (f"fitted to {e['fitted']} measured all-reduces over 2-8 GPUs ({framework} {comm}); held-out error "
                f"median {pct(e['curve_median'])}, p90 {pct(e['curve_p90'])}")  # fmt: skip
        data["efficiency"]["communication"] = {
            "bandwidth": {"max": max(share, 1e-6), "half_size": 0.0, "source": MEASURED, "note": note},
            "latency_s": {"value": ring[0], "source": MEASURED, "note": note},
        }
    held = {r["op_class"]: {"n": float(r["held_out"]), "median": float(r["curve_median"]), "p90": float(r["curve_p90"])}
            for r in err.values()}  # fmt: skip
    tables = {r["op_class"]: {"n": float(r["held_out"]), "median": float(r["table_median"]),
                              "p90": float(r["table_p90"])} for r in err.values()}  # fmt: skip
    where = f"{kerneldb.DISTRIBUTION}=={package}: systems/data/{system}/{{gemm,attention,comm}}/{framework}/{version}"
    data["name"], data["kind"] = name, "calibrated"
    data["provenance"] |= {
        "device": f"{base.description} ({system} in {kerneldb.DISTRIBUTION} {package})",
        "software": {
            kerneldb.DISTRIBUTION: package,
            framework: version,
            "source": f"NVIDIA's measured kernel database ({system}, {framework} {version})",
        },  # fmt: skip
        "date": date.today().isoformat(),
        "measurements": where + (f" (all-reduce: {comm})" if comm and comm != version else ""),
        "settings": {
            "system": system,
            "framework": framework,
            "version": version,
            "dtype": "bfloat16",
            "held_out": "every other shape of each series",
        },  # fmt: skip
        "held_out_error": held,
    }
    data["provenance"]["notes"] = (
        f"Device rates from {base.name} ({base.kind}); the GEMM and attention curves, their floors and the "
        f"all-reduce fitted to {kerneldb.DISTRIBUTION} {package}'s measured {system} kernels as {framework} {version} "
        f"runs them (ferry calibrate --from-aiconfigurator {system} --framework {framework}); elementwise kernels are "
        f"not in the database and keep {base.name}'s assumed curves. {data['provenance']['notes']}"
    ).strip()
    data["kernel_tables"] = {
        "package": kerneldb.DISTRIBUTION, "package_version": package, "system": system, "framework": framework,
        "version": version, "comm_version": comm, "held_out_error": tables,
        "note": "kernels are timed from these tables where the package is installed (costmodel/kernel_tables.py)",
    }  # fmt: skip
    return data


def format_errors(errors: pd.DataFrame) -> str:
    """The held-out table ``ferry calibrate --from-aiconfigurator`` prints."""
    lines = [f"{'kernel class':<18} {'fitted':>6} {'held out':>8}   {'curves: median':>14} {'p90':>6}   "
             f"{'tables: median':>14} {'p90':>6}   {'ferry models: n':>15} {'median':>7} {'p90':>6}"]  # fmt: skip
    for r in errors.to_dict(orient="records"):
        lines.append(f"{r['op_class']:<18} {r['fitted']:>6} {r['held_out']:>8}   {pct(r['curve_median']):>14} "
                     f"{pct(r['curve_p90']):>6}   {pct(r['table_median']):>14} {pct(r['table_p90']):>6}   "
                     f"{r['models_held_out']:>15} {pct(r['models_median']):>7} {pct(r['models_p90']):>6}")  # fmt: skip
    return "\n".join(lines)
