"""The measured tables of MoE and MLA layers for one cost model (``costmodel.kernel_tables.build`` reads them):

- the routed experts (``formulas.T_MOE``), over log tokens into the MoE layer, from the database's ``moe_perf`` rows of
  exactly the model's experts (hidden size, expert width, top-k, experts), split as the layout splits them, in their
  stored format, at the routing ``MOE_DISTRIBUTION``;
- MLA's attention (``formulas.T_PREFILL`` and ``T_DECODE`` of an MLA model), from the MLA module tables, which time
  DeepSeek-V3's whole attention block on one GPU: the attention kernel is given the module's time less its other
  kernels' rooflines.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from costmodel import formulas as f
from costmodel import kerneldb
from costmodel.dtypes import Dtypes
from costmodel.hardware import KernelTables
from costmodel.kernel_tables import GEMM_DTYPES, KV_DTYPES, ROW, FloatArray, fill_grid, roofline_s, work_of
from costmodel.model_spec import ModelSpec

# ferry's stored format of the routed experts -> the database's ``moe_dtype`` (vLLM's fused MoE kernels)
MOE_DTYPES = {"bfloat16": "bfloat16", "float16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block",
              "nvfp4": "nvfp4", "mxfp4": "w4a16_mxfp4", "int4": "int4_wo"}  # fmt: skip
# the routing whose measurements time the routed experts: the database's power-law rows with alpha 1.01, the skew
# NVIDIA's planner assumes of a real router (aiconfigurator-core 0.12.0, ``sdk/models/*.py``: ``power_law_alpha``
# 1.01), slower than its balanced rows on large batches (GPT-OSS-120B on an H100 at 8192 tokens: 3.97 ms against
# 2.93) and faster on small ones (fewer experts hit); outside the measured tokens the roofline's expected-expert count
# (uniform routing) carries the factor on
MOE_DISTRIBUTION = "power_law_1.01"


def moe_factors(
    ref: KernelTables,
    spec: ModelSpec,
    consts: FloatArray,
    kernel_params: FloatArray,
    expert_format: str,
    root: Path,
) -> tuple[FloatArray, FloatArray] | str:
    """(log tokens into the MoE layer, log factor) of the routed experts (vLLM's ``fused_experts``: gate/up, activation
    and down over the rows routed to this GPU's experts), from the database's ``moe_perf`` rows of exactly this model's
    shape (hidden size, expert width, top-k, experts) split as this layout splits it (``moe_tp_size``,
    ``moe_ep_size``), stored format and routing (``MOE_DISTRIBUTION``); why not, as a phrase, when there are none."""
    fmt = MOE_DTYPES.get(expert_format)
    version = kerneldb.table_version(ref.system, "moe_perf", ref.framework, ref.version, root)
    if fmt is None or version is None:
        return f"no {expert_format} MoE table"
    rows = kerneldb.read(ref.system, "moe_perf", ref.framework, version, root)
    moe_tp = round(spec.expert_size / consts[f.MOE_I])
    ep = round(spec.num_local_experts / consts[f.E_LOCAL]) if consts[f.E_LOCAL] < spec.num_local_experts else 1
    sel = rows[(rows["moe_dtype"] == fmt) & (rows["hidden_size"] == spec.hidden_size)
               & (rows["inter_size"] == spec.expert_size) & (rows["topk"] == spec.num_experts_per_tok)
               & (rows["num_experts"] == spec.num_local_experts) & (rows["moe_tp_size"] == moe_tp)
               & (rows["moe_ep_size"] == ep) & (rows["distribution"] == MOE_DISTRIBUTION)]  # fmt: skip
    if sel.empty:
        return (f"{spec.hidden_size}x{spec.expert_size} x{spec.num_local_experts} top-{spec.num_experts_per_tok} "
                f"{fmt} at moe_tp={moe_tp}, ep={ep} not measured")  # fmt: skip
    sel = sel.sort_values("num_tokens")
    tokens = sel["num_tokens"].to_numpy(float)
    t = tokens / consts[f.MOE_TOKENS]
    roof = np.array([roofline_s(kernel_params[ROW["moe_experts"]], *map(np.array, work_of(
        consts, "moe_experts", x, x, 0.0, x, 0.0, 0.0, 0.0))) for x in t])  # fmt: skip
    return np.log(tokens), np.log(sel["latency_s"].to_numpy() / roof)


# the other kernels of MLA's attention block (``costmodel.work``), which the database's MLA module tables time with it
MLA_MODULE = {False: ("qkv_proj", "rope", "mla_kv_up", "o_proj"), True: ("qkv_proj", "rope", "mla_absorb", "o_proj")}
MLA_MODULE_TABLES = {False: "mla_context_module_perf", True: "mla_generation_module_perf"}
# the least share of a module's measured time its attention kernel is given when the other kernels' rooflines take
# (nearly) all of it
MLA_FLOOR_SHARE = 0.2


def mla_factors(
    ref: KernelTables,
    decode: bool,
    heads: int,
    dtypes: Dtypes,
    compute_formats: dict[str, str] | None,
    consts: FloatArray,
    kernel_params: FloatArray,
    root: Path,
) -> tuple[FloatArray, FloatArray, FloatArray] | str:
    """(log sequences, log tokens, log factor) of MLA's prefill (``decode=False``) or decode attention from the
    database's MLA module tables (``mla/mla_context_module_perf``: ``batch_size`` prompts of ``isl`` tokens;
    ``mla_generation_module_perf``: ``batch_size`` sequences at context ``step``), which time the whole attention
    block of DeepSeek-V3's shape on one GPU (``num_heads`` per GPU): its projections, RoPE, the latent's expansion
    (prefill) or absorption (decode), the attention and the output projection. The attention kernel is given what
    the module measured less the other kernels' rooflines (at least ``MLA_FLOOR_SHARE`` of its own roofline), as a
    factor over its roofline; the rows are those of this GPU's heads (the nearest measured otherwise), the KV cache's
    format and the attention weights' GEMM format. Why not, as a phrase, when there are none."""
    name = MLA_MODULE_TABLES[decode]
    version = kerneldb.table_version(ref.system, name, ref.framework, ref.version, root)
    if version is None:
        return "no MLA module table"
    rows = kerneldb.read(ref.system, name, ref.framework, version, root)
    gemm = GEMM_DTYPES.get((compute_formats or {}).get("qkv_proj", dtypes.activation), "bfloat16")
    kv = KV_DTYPES.get(dtypes.kv_cache)
    rows = rows[(rows["kv_cache_dtype"] == kv) & (rows["gemm_type"] == gemm)]
    if rows.empty:
        return f"no MLA module table for a {dtypes.kv_cache} KV cache and {gemm} GEMMs"
    measured = np.unique(rows["num_heads"].to_numpy())
    nearest = int(measured[np.argmin(np.abs(np.log2(measured / heads)))])
    sel = rows[rows["num_heads"] == nearest]
    b = sel["batch_size"].to_numpy(float)
    length = sel["step"].to_numpy(float) + 1.0 if decode else sel["isl"].to_numpy(float)
    kernel = "attention_decode" if decode else "attention_prefill"
    factor = np.empty(len(sel))
    for i, (seqs, tokens) in enumerate(zip(b, length, strict=True)):
        if decode:  # seqs sequences attending ``tokens`` each
            sums = (seqs, 0.0, seqs, seqs, 0.0, 0.0, seqs * tokens)
        else:  # seqs prompts of ``tokens`` each, nothing cached
            sums = (seqs * tokens, seqs * tokens, 0.0, seqs, seqs * tokens * (tokens + 1) / 2, seqs * tokens, 0.0)
        work = f.kernel_work(consts, *sums)
        roof = {}
        for k in (kernel, *MLA_MODULE[decode]):
            row = ROW[k]
            roof[k] = float(roofline_s(kernel_params[row], np.array(work[2 * row]), np.array(work[2 * row + 1])))
        other = sum(roof[k] for k in MLA_MODULE[decode])
        own = max(float(sel["latency_s"].iloc[i]) - other, MLA_FLOOR_SHARE * roof[kernel])
        factor[i] = math.log(own / roof[kernel])
    along = b * length if decode else length  # decode: the tokens all sequences attend (as the attention tables)
    xs, ys = np.unique(b), np.unique(along)
    grid = np.full((len(xs), len(ys)), np.nan)
    grid[np.searchsorted(xs, b), np.searchsorted(ys, along)] = factor
    return np.log(xs), np.log(ys), fill_grid(grid, np.log(ys))
