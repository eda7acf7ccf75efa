"""NVIDIA's measured kernel database (the ``aiconfigurator-core`` package), read as ferry's measured-kernel rows.

``aiconfigurator-core`` (Apache-2.0; ``pip install 'ferry[measured]'``) ships per-kernel latencies measured on each
GPU for each serving engine, as Parquet under ``aiconfigurator_core/systems/data/<system>/<family>/<framework>/
<version>/``. Each row is one call of one kernel for one layer on one GPU, its ``latency`` in milliseconds (the
package's own loader, and a GEMM's speed-of-light bound ``2mnk / flops x 1000``, both say so); attention head counts
are per GPU (after tensor parallelism). The tables read here:

- ``gemm/.../gemm_perf``: ``gemm_dtype, m, n, k`` (tokens x output features x input features);
- ``attention/.../context_attention_perf``: prefill attention of ``batch_size`` prompts of ``isl`` tokens, nothing
  cached (``step`` 0), ``num_heads``, ``num_key_value_heads``, ``head_dim``, ``kv_cache_dtype``, ``window_size``;
- ``attention/.../generation_attention_perf``: one decode step of ``batch_size`` sequences whose context, the new
  token included, is ``isl + step`` tokens.

A table may hold several kernels for the same key (``kernel_source``: FlashAttention 3 and 4 on an H100); for each
dtype the one with the most rows, the engine's usual kernel, is kept. ``load_measured`` turns the rows that ferry's
built-in models run (their exact GEMM shapes and head counts at each tensor parallelism) into the rows of
``costmodel.calibration.vidur`` (``COLUMNS``), so ``predict`` and ``errors`` score a profile against them as against
Vidur's profiles.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from costmodel.calibration.vidur import COLUMNS
from costmodel.model_spec import ModelSpec, load_model

PACKAGE = "aiconfigurator_core"
# the database's systems ferry has a profile for -> that profile
SYSTEMS = {"a100_sxm": "a100-80g", "h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "l40s": "l40s"}
FRAMEWORKS = ("vllm", "sglang", "trtllm")
# the shapes the rows are taken for: ferry's built-in dense models, each at the tensor parallelisms its heads allow
MODELS = ("llama-3-8b", "llama-2-7b", "qwen2.5-7b", "llama-3-70b")
TPS = (1, 2, 4, 8)


def data_root() -> Path:
    """The installed package's ``systems`` folder (found without importing the package's compiled engine)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "aiconfigurator-core is not installed: pip install 'ferry[measured]' (aiconfigurator-core==0.12.0, "
            "NVIDIA's measured kernel tables)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "systems"


def current_version(system: str, framework: str, root: Path | None = None) -> str:
    """The version the package queries by default for ``system`` and ``framework`` (``query_versions.yaml``)."""
    versions = yaml.safe_load(((root or data_root()) / "query_versions.yaml").read_text())
    entry = (versions.get("overrides") or {}).get(system, {}).get(framework) or versions["defaults"][framework]
    return str(entry["current"])


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
    data = root / "data" / system
    if not data.is_dir():
        known = sorted(p.name for p in (root / "data").iterdir() if any(p.rglob("*.parquet")))
        raise ValueError(f"system={system!r}: the database has no such system (it has: {', '.join(known)})")
    version = version or current_version(system, framework, root)

    def table(family: str, name: str) -> pd.DataFrame:
        path = data / family / framework / version / f"{name}.parquet"
        if not path.is_file():
            raise ValueError(f"{system} {framework} {version}: no {family}/{name}.parquet in the database ({path})")
        frame = pd.read_parquet(path)
        if "kernel_source" in frame.columns:  # per dtype, the kernel with the most rows
            by = "gemm_dtype" if "gemm_dtype" in frame.columns else "kv_cache_dtype"
            usual = frame.groupby(by)["kernel_source"].agg(lambda k: k.value_counts().idxmax())
            frame = frame[frame["kernel_source"].to_numpy() == usual.loc[frame[by]].to_numpy()]
        frame = frame[frame["latency"] > 0].copy()
        frame["latency_s"] = frame["latency"] * 1e-3  # the database's milliseconds
        return frame.reset_index(drop=True)

    return Tables(
        system,
        framework,
        version,
        table("gemm", "gemm_perf"),
        table("attention", "context_attention_perf"),
        table("attention", "generation_attention_perf"),
    )


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
