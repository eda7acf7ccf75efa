"""Measured kernel tables for one cost model: the database's times at this model's shapes, for ``formulas``.

A profile fitted to NVIDIA's measured kernel database (``HardwareProfile.kernel_tables``) names a system, an engine
and a version of ``aiconfigurator-core``. For one model at one tensor parallelism and one set of formats,
``build`` reads the tables that apply (``costmodel.kerneldb``) and turns each into the grid ``costmodel.formulas``
interpolates, over natural-log axes: at every measured shape, the factor log(measured seconds / the roofline's
seconds for that shape) and the roofline's seconds for this model's kernel there (their sum is the kernel's seconds).
Inside the grid ``formulas`` interpolates the seconds (so that seconds that grow with the shape give a time that
grows with it); outside it, the roofline times the factor at the nearest measured shape (so that past the measured
shapes the time follows the roofline from the last one). The measurements are followed as they are, including the
few shapes where a larger kernel ran faster than a smaller one (another tile size, another kernel): made monotone,
one slow outlier (an H100 decode of 512 sequences of head size 512, 14 times the time of 1,024) would slow every
larger shape. What each table is:

- the four per-layer GEMMs (``T_QKV`` .. ``T_DOWN``), over log m (tokens), for the model's (n, k): bilinear in
  (log n, log k) between the measured sizes around it (held at the nearest outside them), in the weights' measured
  format (bf16 for bf16 and fp16 models; fp8 per-tensor, fp8 block-scaled, NVFP4, and on an A100 TensorRT-LLM's
  int8/int4 weight-only and SmoothQuant kernels, as quantized); the LM head (``T_LM``) likewise, in the activations'
  format, over log S; the routed experts (``T_MOE``) and MLA's attention block, from their own tables
  (``costmodel.moe_tables``);
- prefill attention (``T_PREFILL``) over (log prompts, log prompt length) and decode attention (``T_DECODE``) over
  (log sequences, log tokens attended by them all: the KV cache read, whose size decides whether the measurements
  were served from the L2 cache), at the model's heads per GPU and head size with the KV cache's format (bf16, fp8),
  full attention (a sliding window's counts are already in the roofline's). Where those heads were not measured,
  the nearest measured heads (same head size first) stand in: their factor over their own roofline is applied to
  this model's. Shapes the database skipped (large batches of long prompts) take the nearest measured factor;
- the all-reduce (``T_ALLREDUCE``) over log message bytes, measured at this tensor parallelism.

A table the database lacks is left out (its kernels keep the roofline), and ``Tables.notes`` says so. The factors
carry a measurement from one head count or GEMM size to another; the roofline's seconds are this model's own.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from costmodel import formulas as f
from costmodel import kerneldb, tables_cache
from costmodel.dtypes import DTYPE_BYTES, Dtypes
from costmodel.hardware import KernelTables
from costmodel.model_spec import ModelSpec

if TYPE_CHECKING:
    import pandas as pd

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# ferry's GEMM format (``Dtypes.gemm_compute``, or the quantization as asked) -> the database's ``gemm_dtype``
GEMM_DTYPES = {"bfloat16": "bfloat16", "float16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}
WEIGHT_ONLY = {"int8": "int8_wo", "int4": "int4_wo"}  # weight-only kernels (TensorRT-LLM on an A100)
W8A8_INT8 = "sq"  # SmoothQuant: int8 weights and activations
KV_DTYPES = {"bfloat16": "bfloat16", "float16": "bfloat16", "fp8": "fp8"}
ELEMENT_BYTES = {"bfloat16": 2.0, "float16": 2.0, "half": 2.0, "float32": 4.0}
GEMMS = {f.T_QKV: "qkv_proj", f.T_O: "o_proj", f.T_UP: "mlp_gate_up", f.T_DOWN: "mlp_down", f.T_LM: "lm_head"}
# the row of ``kernel_params`` (``formulas.KERNELS`` order) each table's kernel has
ROW = {name: i for i, (name, _, _, _, _) in enumerate(f.KERNELS)}


@dataclass(frozen=True)
class Tables:
    """The tables of one cost model, in ``formulas``' layout, and what they are in words."""

    toc: IntArray = field(default_factory=lambda: np.zeros((f.NUM_TABLES, f.TOC_COLUMNS), dtype=np.int64))
    tab: FloatArray = field(default_factory=lambda: np.zeros(0))
    notes: tuple[str, ...] = ()

    @property
    def used(self) -> list[int]:
        """The tables present."""
        return [t for t in range(f.NUM_TABLES) if self.toc[t, f.NX] > 0]


Grid = tuple[FloatArray, FloatArray, FloatArray, FloatArray]  # x axis, y axis, factors[x, y], roofline seconds[x, y]


def pack(grids: dict[int, Grid], notes: tuple[str, ...] = ()) -> Tables:
    """Tables from ``{table: (x axis, y axis, factors, roofline seconds)}``, all natural logs, values x-major (a 1-D
    table: a y axis of one point). Tables with the same axes share them in ``tab`` (the GEMMs, measured at the same
    token counts: ``formulas.time_of_sums`` then places an iteration's tokens on them once)."""
    toc = np.zeros((f.NUM_TABLES, f.TOC_COLUMNS), dtype=np.int64)
    parts: list[FloatArray] = []
    packed: list[tuple[FloatArray, FloatArray, int]] = []  # axes stored so far, and where
    at = 0
    for table, (xs, ys, factors, roofs) in sorted(grids.items()):
        xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
        factors = np.asarray(factors, dtype=np.float64).reshape(len(xs), len(ys))
        roofs = np.asarray(roofs, dtype=np.float64).reshape(len(xs), len(ys))
        if not (np.all(np.diff(xs) > 0) and np.all(np.diff(ys) > 0) and np.isfinite(factors + roofs).all()):
            raise ValueError(f"table {table}: axes must rise strictly and values be finite")
        axes = next((o for px, py, o in packed if np.array_equal(px, xs) and np.array_equal(py, ys)), None)
        if axes is None:
            axes = at
            packed.append((xs, ys, axes))
            parts += [xs, ys]
            at += len(xs) + len(ys)
        toc[table] = (len(xs), len(ys), axes, at, at + factors.size)
        parts += [factors.ravel(), roofs.ravel()]
        at += 2 * factors.size
    tab = np.concatenate(parts) if parts else np.zeros(0)
    return Tables(toc, tab, notes)


def roofline_s(row: FloatArray, flops: FloatArray, nbytes: FloatArray) -> FloatArray:
    """One kernel instance's roofline seconds with ``kernel_params`` row ``row`` (``formulas.kernel_time``, floored)."""
    tc = np.where(flops > 0, (flops + row[f.C_HALF]) / row[f.C_RATE], 0.0)
    tm = np.where(nbytes > 0, (nbytes + row[f.M_HALF]) / row[f.M_RATE], 0.0)
    return np.maximum(np.maximum(tc, tm), row[f.FLOOR])


# ---- one table from measured rows (the held-out checks build them from half the rows) --------------------------------


def gemm_factors(
    rows: pd.DataFrame, n: float, k: float, row: FloatArray, w: float, a: float
) -> tuple[FloatArray, FloatArray] | None:
    """(log m, log factor) of a GEMM of ``n`` outputs and ``k`` inputs from the measured ``rows`` (one format:
    ``m, n, k, latency_s``): at each measured m, bilinear in (log n, log k) over the measured sizes around (n, k), held
    at the nearest outside them; ``row`` the kernel's roofline parameters, ``w``/``a`` bytes per weight/activation."""
    if rows.empty:
        return None
    ns, ks = np.unique(rows["n"].to_numpy(float)), np.unique(rows["k"].to_numpy(float))
    n_lo, n_hi, wn = _around(ns, n)
    k_lo, k_hi, wk = _around(ks, k)
    corners = [(n_lo, k_lo, (1 - wn) * (1 - wk)), (n_lo, k_hi, (1 - wn) * wk),
               (n_hi, k_lo, wn * (1 - wk)), (n_hi, k_hi, wn * wk)]  # fmt: skip
    total: dict[float, list[float]] = {}
    for cn, ck, weight in corners:
        if weight <= 0:
            continue
        sel = rows[(rows["n"] == cn) & (rows["k"] == ck)]
        m = sel["m"].to_numpy(float)
        roof = roofline_s(row, 2.0 * m * cn * ck, cn * ck * w + m * (cn + ck) * a)
        for mi, factor in zip(m, np.log(sel["latency_s"].to_numpy() / roof), strict=True):
            acc = total.setdefault(mi, [0.0, 0.0])
            acc[0] += weight * factor
            acc[1] += weight
    if not total:
        return None
    ms = np.array(sorted(total))
    return np.log(ms), np.array([total[m][0] / total[m][1] for m in ms])


def _around(points: FloatArray, x: float) -> tuple[float, float, float]:
    """The measured points either side of x and x's share of the way between them in log space (held at the ends)."""
    if x <= points[0]:
        return points[0], points[0], 0.0
    if x >= points[-1]:
        return points[-1], points[-1], 0.0
    i = int(np.searchsorted(points, x, side="right")) - 1
    lo, hi = points[i], points[i + 1]
    return lo, hi, math.log(x / lo) / math.log(hi / lo)


def heads_of(rows: pd.DataFrame, heads: int, kv_heads: int, head_dim: int) -> tuple[int, int, int] | None:
    """The measured (heads, KV heads, head size) closest to the wanted ones: themselves if measured, else the same
    head size first, then the nearest head counts in log space."""
    combos = rows[["num_heads", "num_key_value_heads", "head_dim"]].drop_duplicates().to_numpy()
    if not len(combos):
        return None
    cost = (combos[:, 2] != head_dim) * 100.0 + np.abs(np.log2(combos[:, 2] / head_dim))
    cost = cost + np.abs(np.log2(combos[:, 0] / heads)) + np.abs(np.log2(combos[:, 1] / kv_heads))
    best = combos[int(np.argmin(cost))]
    return int(best[0]), int(best[1]), int(best[2])


def attention_factors(
    rows: pd.DataFrame, decode: bool, heads: int, kv_heads: int, head_dim: int, row: FloatArray, a: float, c: float
) -> tuple[FloatArray, FloatArray, FloatArray] | None:
    """(log sequences, log tokens, log factor) of prefill (``decode=False``: prompts of ``isl`` tokens, each) or
    decode attention (context ``isl + step``; tokens: all sequences' together) from the measured ``rows`` of exactly
    these heads per GPU and head size, one KV format, full attention; ``row`` the kernel's roofline parameters,
    ``a``/``c`` bytes per activation/KV element. Shapes not measured take their row's factor, interpolated
    (``fill_grid``)."""
    sel = rows[
        (rows["num_heads"] == heads) & (rows["num_key_value_heads"] == kv_heads) & (rows["head_dim"] == head_dim)
    ]
    if sel.empty:
        return None
    b = sel["batch_size"].to_numpy(float)
    length = (sel["isl"] + sel["step"]).to_numpy(float) if decode else sel["isl"].to_numpy(float)
    q, kv = float(heads * head_dim), float(kv_heads * head_dim)
    if decode:  # one query per sequence attends its whole context: 4 q pairs FLOPs; Q, O, new K/V and the cache
        flops, nbytes = 4.0 * q * b * length, 2.0 * b * q * a + 2.0 * kv * c * (b + b * length)
    else:  # b prompts of L tokens, causal: L (L + 1) / 2 pairs each; Q, O, their K/V written and read
        tokens = b * length
        flops = 4.0 * q * b * length * (length + 1) / 2
        nbytes = 2.0 * tokens * q * a + 2.0 * kv * c * (2.0 * tokens)
    factor = np.log(sel["latency_s"].to_numpy() / roofline_s(row, flops, nbytes))
    along = b * length if decode else length  # decode: the tokens all sequences attend (the KV cache read)
    xs, ys = np.unique(b), np.unique(along)
    grid = np.full((len(xs), len(ys)), np.nan)
    grid[np.searchsorted(xs, b), np.searchsorted(ys, along)] = factor
    return np.log(xs), np.log(ys), fill_grid(grid, np.log(ys))


def fill_grid(grid: FloatArray, ys: FloatArray) -> FloatArray:
    """Missing cells of each row: linear in log y between its measured cells, the nearest one's value beyond them;
    rows with none take the nearest row's."""
    out = grid.copy()
    for i in range(len(out)):
        have = np.isfinite(grid[i])
        if have.any():
            out[i] = np.interp(ys, ys[have], grid[i, have])
    full = np.flatnonzero(np.isfinite(out).all(axis=1))
    for i in range(len(out)):
        if not np.isfinite(out[i]).all():
            out[i] = out[full[np.argmin(np.abs(full - i))]]
    return out


def allreduce_factors(rows: pd.DataFrame, tp: int, consts: FloatArray) -> tuple[FloatArray, FloatArray] | None:
    """(log message bytes, log factor) of the all-reduce over ``tp`` GPUs from the measured ``rows`` (message sizes in
    elements of their ``allreduce_dtype``), against the ring all-reduce of ``consts`` (``formulas.allreduce``)."""
    sel = rows[rows["num_gpus"] == tp].sort_values("message_size")
    if sel.empty or consts[f.N_ALLREDUCE] <= 0:
        return None
    size = sel["allreduce_dtype"].map(ELEMENT_BYTES).fillna(2.0).to_numpy() if "allreduce_dtype" in sel else 2.0
    message = sel["message_size"].to_numpy(float) * size
    roof = consts[f.AR_LATENCY] + consts[f.RING] * (message + consts[f.AR_HALF]) / consts[f.AR_RATE]
    keep = np.concatenate(([True], np.diff(message) > 0))
    return np.log(message[keep]), np.log(sel["latency_s"].to_numpy()[keep] / roof[keep])


# ---- every table of one cost model -------------------------------------------------------------------------------


def gemm_format(dtypes: Dtypes, gemm_dtype: str) -> str | None:
    """The database's ``gemm_dtype`` of the layers' GEMMs: the quantized kernel as asked (fp8 per-tensor or block,
    NVFP4; int8 and int4 as TensorRT-LLM's A100 kernels), else the activations' format; None for float32."""
    quant = dtypes.quantization
    if quant in ("fp8_block", "nvfp4"):
        return quant
    if quant == "fp8" and gemm_dtype == "fp8":
        return "fp8"
    if quant == "int8" and gemm_dtype == "int8":
        return W8A8_INT8
    if quant in WEIGHT_ONLY:
        return WEIGHT_ONLY[quant]
    return GEMM_DTYPES.get(dtypes.activation)


def work_of(consts: FloatArray, kernel: str, T: float, P: float, D: float, S: float, pairs: float, pf_kv: float,
          dec_kv: float) -> tuple[float, float]:  # fmt: skip
    """(FLOPs, bytes) of one instance of ``kernel`` in an iteration of these sums (``formulas.kernel_work``; no
    windowed layers)."""
    work = f.kernel_work(consts, T, P, D, S, pairs, pf_kv, dec_kv)
    return float(work[2 * ROW[kernel]]), float(work[2 * ROW[kernel] + 1])


def model_roofs(
    table: int, xs: FloatArray, ys: FloatArray, consts: FloatArray, kernel_params: FloatArray
) -> FloatArray:
    """log roofline seconds of this model's kernel of ``table`` at each grid point (natural-log axes)."""
    out = np.zeros((len(xs), len(ys)))
    for i, x in enumerate(np.exp(xs)):
        for j, y in enumerate(np.exp(ys)):
            if table == f.T_ALLREDUCE:
                out[i, j] = consts[f.AR_LATENCY] + consts[f.RING] * (x + consts[f.AR_HALF]) / consts[f.AR_RATE]
                continue
            if table == f.T_PREFILL:  # x prompts of y tokens each, nothing cached
                name, work = "attention_prefill", work_of(consts, "attention_prefill", x * y, x * y, 0.0, x,
                                                        x * y * (y + 1) / 2, x * y, 0.0)  # fmt: skip
            elif table == f.T_DECODE:  # x sequences attending y tokens in all
                name, work = "attention_decode", work_of(consts, "attention_decode", x, 0.0, x, x, 0.0, 0.0, y)
            elif table == f.T_MOE:  # x tokens into the MoE layer: x / MOE_TOKENS of this rank's
                t = x / consts[f.MOE_TOKENS]
                name, work = "moe_experts", work_of(consts, "moe_experts", t, t, 0.0, t, 0.0, 0.0, 0.0)
            else:
                name = GEMMS[table]
                work = work_of(consts, name, x, x, 0.0, x, 0.0, 0.0, 0.0)
            out[i, j] = roofline_s(kernel_params[ROW[name]], np.array(work[0]), np.array(work[1]))
    return np.log(out)


_BUILT: OrderedDict[str, Tables] = OrderedDict()  # the tables last built, by everything they depend on
BUILT_KEPT = 32  # cost models a process keeps the tables of (a sweep's points share a few)


def build(
    ref: KernelTables,
    spec: ModelSpec,
    tp: int,
    dtypes: Dtypes,
    gemm_dtype: str,
    consts: FloatArray,
    kernel_params: FloatArray,
    root: Path | None = None,
    *,
    part_formats: dict[str, str] | None = None,
    compute_formats: dict[str, str] | None = None,
) -> Tables:
    """``build_tables``, kept for the next cost model of the same inputs, in this process and on disk
    (``costmodel.tables_cache``): reading the database's tables into ferry's grid takes most of a second (pandas,
    Parquet), which every run of the same model and device would pay again. Nothing writes to a built table; the key
    is every input, the package's version included (and, on disk, the code that builds them)."""
    missing = kerneldb.missing(ref) if root is None else None
    if missing:  # asked every time: a kept table is no answer when the package is gone
        raise ValueError(missing)
    key = repr((ref.model_dump_json(), spec, tp, dtypes, gemm_dtype, consts.tobytes(), kernel_params.tobytes(),
                str(root), kerneldb.installed_version(), sorted((part_formats or {}).items()),
                sorted((compute_formats or {}).items())))  # fmt: skip
    if key in _BUILT:
        _BUILT.move_to_end(key)
        return _BUILT[key]
    kept = tables_cache.load(key)
    if kept is not None:
        tables = Tables(*kept)
    else:
        tables = build_tables(ref, spec, tp, dtypes, gemm_dtype, consts, kernel_params, root,
                              part_formats=part_formats, compute_formats=compute_formats)  # fmt: skip
        tables_cache.save(key, tables.toc, tables.tab, tables.notes)
    _BUILT[key] = tables
    while len(_BUILT) > BUILT_KEPT:
        _BUILT.popitem(last=False)
    return tables


def build_tables(
    ref: KernelTables,
    spec: ModelSpec,
    tp: int,
    dtypes: Dtypes,
    gemm_dtype: str,
    consts: FloatArray,
    kernel_params: FloatArray,
    root: Path | None = None,
    *,
    part_formats: dict[str, str] | None = None,
    compute_formats: dict[str, str] | None = None,
) -> Tables:
    """The tables of ``ref`` for ``spec`` on ``tp`` GPUs in these formats (see the module docstring); the GEMMs'
    shapes are this GPU's, as ``consts`` has them (``costmodel.layout``), each in its part's stored format
    (``part_formats``; ``compute_formats``: the format each GEMM kernel multiplies in); ValueError when the package
    cannot be read (the caller falls back to the curves)."""
    from costmodel import moe_tables  # (it reads this module's helpers)

    missing = kerneldb.missing(ref) if root is None else None
    if missing:
        raise ValueError(missing)
    root = root or kerneldb.data_root()
    factors: dict[int, tuple[FloatArray, FloatArray, FloatArray]] = {}
    notes: list[str] = []
    one = np.zeros(1)

    gemm = kerneldb.read(ref.system, "gemm_perf", ref.framework, ref.version, root)
    h, hd = spec.hidden_size, spec.head_dim
    q, kvh = spec.num_attention_heads // tp, max(spec.num_key_value_heads // tp, 1)
    inter = consts[f.MLP]
    shapes = {f.T_QKV: (consts[f.QKV_N], h), f.T_O: (h, consts[f.O_IN]),
              f.T_UP: (2 * inter if spec.gated_mlp else inter, h), f.T_DOWN: (h, inter),
              f.T_LM: (consts[f.V], h)}  # fmt: skip
    part_of = {f.T_QKV: "attention", f.T_O: "attention", f.T_UP: "dense_mlp", f.T_DOWN: "dense_mlp"}
    for table, (n, k) in shapes.items():
        name = GEMMS[table]
        if table == f.T_LM:
            fmt, w = GEMM_DTYPES.get(dtypes.activation), dtypes.activation_bytes
        else:
            part = part_of[table]
            stored = part_formats[part] if part_formats else dtypes.weight
            quant = None if stored == dtypes.activation else stored
            fmt = gemm_format(Dtypes(dtypes.activation, stored, dtypes.kv_cache, quant),
                              compute_formats[name] if compute_formats else gemm_dtype)  # fmt: skip
            w = DTYPE_BYTES[stored]
        if kernel_params[ROW[name], f.COUNT] == 0:
            continue  # no such layers (an MoE model's dense MLP)
        if spec.is_mla and table in (f.T_QKV, f.T_O):  # timed with the attention, by the MLA module tables
            notes.append(f"{name}: MLA's projection, its roofline (the MLA module tables time the block around it)")
            continue
        rows = gemm[gemm["gemm_dtype"] == fmt] if fmt else gemm.iloc[:0]
        got = gemm_factors(rows, float(n), float(k), kernel_params[ROW[name]], w, dtypes.activation_bytes)
        if got is None:
            notes.append(f"{name}: no {fmt or dtypes.activation} GEMM table, timed by the roofline")
        else:
            factors[table] = (got[0], one, got[1][:, None])

    kv_format = KV_DTYPES.get(dtypes.kv_cache)
    for table, name, decode in ((f.T_PREFILL, "context_attention_perf", False),
                                (f.T_DECODE, "generation_attention_perf", True)):  # fmt: skip
        kernel = "attention_decode" if decode else "attention_prefill"
        if spec.is_mla:
            mla = moe_tables.mla_factors(ref, decode, q, dtypes, compute_formats, consts, kernel_params, root)
            if isinstance(mla, str):
                notes.append(f"{kernel}: {mla}, timed by the roofline")
            else:
                factors[table] = mla
            continue
        rows = kerneldb.read(ref.system, name, ref.framework, ref.version, root)
        rows = rows[rows["kv_cache_dtype"] == kv_format] if kv_format else rows.iloc[:0]
        if "window_size" in rows.columns:
            rows = rows[rows["window_size"] == 0]
        stand_in = heads_of(rows, q, kvh, hd)
        if stand_in is None:
            notes.append(f"{kernel}: no {dtypes.kv_cache} KV attention table, timed by the roofline")
            continue
        if stand_in != (q, kvh, hd):
            notes.append(f"{kernel}: {q}/{kvh} heads of {hd} not measured; the factor of {stand_in[0]}/"
                         f"{stand_in[1]} heads of {stand_in[2]} stands in")  # fmt: skip
        got3 = attention_factors(rows, decode, *stand_in, kernel_params[ROW[kernel]], dtypes.activation_bytes,
                                 dtypes.kv_bytes)  # fmt: skip
        if got3 is not None:
            factors[table] = got3

    if spec.is_moe:
        expert_format = part_formats["experts"] if part_formats else dtypes.weight
        moe = moe_tables.moe_factors(ref, spec, consts, kernel_params, expert_format, root)
        if isinstance(moe, str):
            notes.append(f"moe_experts: {moe}, timed by the roofline")
        else:
            factors[f.T_MOE] = (moe[0], one, moe[1][:, None])

    if tp > 1:
        version = ref.comm_version
        rows = kerneldb.read(ref.system, "custom_allreduce_perf", ref.framework, version, root) if version else None
        got = allreduce_factors(rows, tp, consts) if rows is not None else None
        if got is None:
            notes.append(f"all-reduce: not measured over {tp} GPUs, timed by the ring formula")
        else:
            factors[f.T_ALLREDUCE] = (got[0], one, got[1][:, None])
    grids = {t: (xs, ys, fs, model_roofs(t, xs, ys, consts, kernel_params)) for t, (xs, ys, fs) in factors.items()}
    return pack(grids, tuple(notes))
