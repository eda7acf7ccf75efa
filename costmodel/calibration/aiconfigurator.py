"""NVIDIA's measured kernel database (the ``aiconfigurator-core`` package), read as ferry's measured-kernel rows.

The tables themselves, their units and which kernel of each shape is kept are ``costmodel.kerneldb``'s. Here:
``read_tables`` gathers one system's GEMM and attention tables for one engine version, and ``load_measured`` turns
the rows that ferry's built-in models run (their exact GEMM shapes and head counts at each tensor parallelism) into
the rows of ``costmodel.calibration.vidur`` (``COLUMNS``), so ``predict`` and ``errors`` score a profile against them
as against Vidur's profiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from costmodel import kerneldb
from costmodel.calibration.vidur import COLUMNS
from costmodel.kerneldb import FRAMEWORKS, SYSTEMS, current_version, data_root
from costmodel.model_spec import ModelSpec, load_model

__all__ = ["FRAMEWORKS", "SYSTEMS", "Tables", "current_version", "data_root", "load_measured", "read_tables"]

PACKAGE = kerneldb.PACKAGE
# the shapes the rows are taken for: ferry's built-in dense models, each at the tensor parallelisms its heads allow
MODELS = ("llama-3-8b", "llama-2-7b", "qwen2.5-7b", "llama-3-70b")
TPS = (1, 2, 4, 8)


def profile_name(system: str, framework: str) -> str:
    """The name of ferry's profile of ``system`` fitted to ``framework``'s kernels."""
    device = SYSTEMS.get(system, system.replace("_", "-"))
    return device if framework == "vllm" else f"{device}.{framework}"


@dataclass(frozen=True)
class Tables:
    """The measured tables of one system and framework version, latencies in seconds."""

    system: str
    framework: str
    version: str
    gemm: pd.DataFrame
    context: pd.DataFrame
    generation: pd.DataFrame


def read_tables(system: str, framework: str = "vllm", version: str | None = None, root: Path | None = None) -> Tables:
    """``system``'s GEMM and attention tables for ``framework`` at ``version`` (default: the package's current)."""
    root = root or data_root()
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework={framework!r}: choose one of {', '.join(FRAMEWORKS)}")
    if not (root / "data" / system).is_dir():
        raise ValueError(
            f"system={system!r}: the database has no such system (it has: {', '.join(kerneldb.systems(root))})"
        )
    version = version or current_version(system, framework, root)
    return Tables(
        system,
        framework,
        version,
        kerneldb.read(system, "gemm_perf", framework, version, root),
        kerneldb.read(system, "context_attention_perf", framework, version, root),
        kerneldb.read(system, "generation_attention_perf", framework, version, root),
    )


def model_shapes(
    models: tuple[str, ...] = MODELS, tps: tuple[int, ...] = TPS
) -> tuple[set[tuple[int, int]], set[tuple[int, int, int]]]:
    """The (n, k) of the GEMMs and the (heads, KV heads, head size) per GPU that ``models`` run at ``tps``."""
    gemms, heads = set(), set()
    for name in models:
        spec = load_model(name)
        for tp in tps:
            if spec.num_attention_heads % tp or spec.num_key_value_heads % tp or spec.intermediate_size % tp:
                continue
            gemms |= set(_gemms(spec, tp).values())
            heads.add((spec.num_attention_heads // tp, spec.num_key_value_heads // tp, spec.head_dim))
    return gemms, heads


def _gemms(spec: ModelSpec, tp: int) -> dict[str, tuple[int, int]]:
    """ferry's linear kernels of one layer -> (n, k) of their GEMM on one of ``tp`` GPUs."""
    hd = spec.head_dim
    q, kv = spec.num_attention_heads // tp, spec.num_key_value_heads // tp
    return {
        "qkv_proj": ((q + 2 * kv) * hd, spec.hidden_size),
        "o_proj": (spec.hidden_size, q * hd),
        "mlp_gate_up": (2 * spec.intermediate_size // tp, spec.hidden_size),
        "mlp_down": (spec.hidden_size, spec.intermediate_size // tp),
    }


def _rows(spec: ModelSpec, hardware: str, tp: int, op: str, frame: pd.DataFrame, tokens: np.ndarray,
          batch: np.ndarray, chunk: np.ndarray, ctx: np.ndarray) -> pd.DataFrame:  # fmt: skip
    return pd.DataFrame(
        {
            "model": spec.name,
            "hardware": hardware,
            "tp": tp,
            "op": op,
            "num_tokens": tokens,
            "batch_size": batch,
            "prefill_chunk_size": chunk,
            "kv_cache_size": ctx,
            "measured_s": frame["latency_s"].to_numpy(),
            "n_embd": spec.hidden_size,
            "n_head": spec.num_attention_heads,
            "n_kv_head": spec.num_key_value_heads,
            "n_expanded_embd": spec.intermediate_size,
            "vocab_size": spec.vocab_size,
            "use_gated_mlp": True,
        }
    )[COLUMNS]


def _attention(frame: pd.DataFrame, heads: int, kv_heads: int, head_dim: int) -> pd.DataFrame:
    """The rows of an attention table with these per-GPU head counts, bf16 KV cache and full attention."""
    keep = (frame["num_heads"] == heads) & (frame["num_key_value_heads"] == kv_heads)
    keep &= (frame["head_dim"] == head_dim) & (frame["kv_cache_dtype"] == "bfloat16")
    if "window_size" in frame.columns:  # absent from older tables: all full attention
        keep &= frame["window_size"] == 0
    return frame[keep]


def load_measured(
    tables: Tables, hardware: str | None = None, models: tuple[str, ...] = MODELS, tps: tuple[int, ...] = TPS
) -> pd.DataFrame:
    """The measured rows of ``tables`` for the shapes ``models`` run at each of ``tps``, in ``vidur.COLUMNS``
    (bf16 weights and KV cache, full attention): GEMMs whose exact (n, k) was measured, attention whose exact
    per-GPU head counts and head size were. ``hardware``: the profile the rows are for (default: ``SYSTEMS``)."""
    hw = hardware or SYSTEMS.get(tables.system)
    if hw is None:
        raise ValueError(f"system={tables.system!r}: ferry has no profile for it; give the profile to score")
    gemm = tables.gemm[tables.gemm["gemm_dtype"] == "bfloat16"]
    frames = []
    for name in models:
        spec = load_model(name)
        for tp in tps:
            if spec.num_attention_heads % tp or spec.num_key_value_heads % tp or spec.intermediate_size % tp:
                continue
            for op, (n, k) in _gemms(spec, tp).items():
                sel = gemm[(gemm["n"] == n) & (gemm["k"] == k)]
                m = sel["m"].to_numpy()
                frames.append(_rows(spec, hw, tp, op, sel, m, m, m, np.zeros_like(m)))
            q, kv = spec.num_attention_heads // tp, spec.num_key_value_heads // tp
            ctx = _attention(tables.context, q, kv, spec.head_dim)
            b, isl = ctx["batch_size"].to_numpy(), ctx["isl"].to_numpy()
            frames.append(_rows(spec, hw, tp, "attention_prefill", ctx, b * isl, b, isl, np.zeros_like(isl)))
            gen = _attention(tables.generation, q, kv, spec.head_dim)
            b, s = gen["batch_size"].to_numpy(), (gen["isl"] + gen["step"]).to_numpy()
            frames.append(_rows(spec, hw, tp, "attention_decode", gen, b, b, np.zeros_like(b), s - 1))
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    if rows.empty:
        raise ValueError(
            f"{tables.system} {tables.framework} {tables.version}: no measured rows for {', '.join(models)}"
        )
    return rows
