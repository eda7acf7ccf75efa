"""NVIDIA's measured kernel database, the ``aiconfigurator-core`` package's Parquet tables, as frames in seconds.

``aiconfigurator-core`` (Apache-2.0; ``pip install 'ferry[measured]'``) ships per-kernel latencies measured on each
GPU for each serving engine, under ``aiconfigurator_core/systems/data/<system>/<family>/<framework>/<version>/``. Each
row is one call of one kernel for one layer on one GPU, its ``latency`` in milliseconds (the package's own loader, and
a GEMM's speed-of-light bound ``2mnk / flops x 1000``, both say so); attention head counts are per GPU (after tensor
parallelism); an all-reduce's ``message_size`` counts elements of its ``allreduce_dtype`` (the package factors "an
element count" into tokens x hidden size to query it). The tables read here:

- ``gemm/gemm_perf``: ``gemm_dtype, m, n, k`` (tokens x output features x input features);
- ``attention/context_attention_perf``: prefill attention of ``batch_size`` prompts of ``isl`` tokens, nothing cached
  (``step`` 0), ``num_heads``, ``num_key_value_heads``, ``head_dim``, ``kv_cache_dtype``, ``window_size``;
- ``attention/generation_attention_perf``: one decode step of ``batch_size`` sequences whose context, the new token
  included, is ``isl + step`` tokens;
- ``comm/custom_allreduce_perf``: the engine's all-reduce of ``message_size`` elements over ``num_gpus`` GPUs;
- ``moe/moe_perf``: one MoE layer's routed experts (vLLM's ``fused_experts``) on one GPU, ``num_tokens`` tokens
  routed over ``num_experts`` experts of ``hidden_size`` x ``inter_size``, top-``topk``, of which this GPU holds
  ``num_experts / moe_ep_size``, each ``inter_size / moe_tp_size`` wide, with the routing ``distribution`` (balanced
  or power-law) the collector drew;
- ``mla/mla_context_module_perf`` and ``mla_generation_module_perf``: DeepSeek-V3's whole MLA attention block on
  one GPU (projections, RoPE, the latent's expansion or absorption, attention, output projection), ``num_heads``
  per GPU, prefill of ``batch_size`` prompts of ``isl`` tokens, or decode at context ``step``, with its
  ``kv_cache_dtype`` and the projections' ``gemm_type``.

Where a shape was measured by several kernels (FlashAttention 3 and 4 on an H100; an all-reduce inside and outside a
CUDA graph), the engine's usual one is kept: for each dtype the kernel with the most rows (for all-reduces, the
CUDA-graph one, which decode steps replay), and any other only for shapes that one lacks. The package is found
without importing it (its compiled engine is never loaded) and only at the version a profile was fitted to.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from packaging.version import InvalidVersion, Version

if TYPE_CHECKING:
    import pandas as pd

    from costmodel.hardware import KernelTables

PACKAGE = "aiconfigurator_core"  # the import name
DISTRIBUTION = "aiconfigurator-core"  # the registry name
FRAMEWORKS = ("vllm", "sglang", "trtllm")
INSTALL = "pip install 'ferry[measured]'"
# the database's systems -> ferry's device: its profile fitted to them is the device's name (vLLM's kernels),
# NAME.sglang and NAME.trtllm; its datasheet profile NAME.datasheet
SYSTEMS = {
    "a100_sxm": "a100-80g",
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200",
    "b200_sxm": "b200",
    "b300_sxm": "b300",
    "gb200": "gb200",
    "gb300": "gb300",
    "l40s": "l40s",
    "rtx_pro_6000_server": "rtx-pro-6000",
}

# (family, table) -> the columns that name a shape (a row per shape is kept), and the column whose values each have
# their usual kernel
_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "gemm_perf": (("gemm_dtype", "m", "n", "k"), "gemm_dtype"),
    "context_attention_perf": (
        ("kv_cache_dtype", "batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim", "window_size"),
        "kv_cache_dtype",
    ),
    "generation_attention_perf": (
        ("kv_cache_dtype", "batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim", "window_size"),
        "kv_cache_dtype",
    ),
    "custom_allreduce_perf": (("allreduce_dtype", "num_gpus", "message_size"), "num_gpus"),
    "moe_perf": (
        (
            "moe_dtype",
            "num_tokens",
            "hidden_size",
            "inter_size",
            "topk",
            "num_experts",
            "moe_tp_size",
            "moe_ep_size",
            "distribution",
        ),
        "moe_dtype",
    ),  # fmt: skip
    "mla_context_module_perf": (
        ("kv_cache_dtype", "gemm_type", "num_heads", "batch_size", "isl", "step"),
        "kv_cache_dtype",
    ),
    "mla_generation_module_perf": (
        ("kv_cache_dtype", "gemm_type", "num_heads", "batch_size", "isl", "step"),
        "kv_cache_dtype",
    ),
}
FAMILY = {
    "gemm_perf": "gemm",
    "context_attention_perf": "attention",
    "generation_attention_perf": "attention",
    "custom_allreduce_perf": "comm",
    "moe_perf": "moe",
    "mla_context_module_perf": "mla",
    "mla_generation_module_perf": "mla",
}


def installed_version() -> str | None:
    """The installed package's version, or None when it is not installed."""
    if importlib.util.find_spec(PACKAGE) is None:
        return None
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def unavailable(version: str) -> str | None:
    """Why the tables of package ``version`` cannot be read here (one phrase), or None when they can."""
    have = installed_version()
    if have is None:
        return f"{DISTRIBUTION} is not installed; {INSTALL}"
    if have != version:
        return f"{DISTRIBUTION} {have} is installed, not {version}"
    return None


def missing(ref: KernelTables) -> str | None:
    """Why a profile's ``kernel_tables`` cannot be read here (one phrase), or None when every table it names is in
    the installed database: the package at its version, its system, the GEMM and attention tables at its engine
    version and, where it names one, the all-reduce table at its comm_version."""
    why = unavailable(ref.package_version)
    if why is not None:
        return why
    root = data_root()
    if not (root / "data" / ref.system).is_dir():
        return f"{DISTRIBUTION} {ref.package_version} has no system {ref.system!r} ({', '.join(systems(root))})"
    wanted = [(name, ref.version) for name in ("gemm_perf", "context_attention_perf", "generation_attention_perf")]
    wanted += [("custom_allreduce_perf", ref.comm_version)] if ref.comm_version is not None else []
    for name, version in wanted:
        path = root / "data" / ref.system / FAMILY[name] / ref.framework / version / f"{name}.parquet"
        if not path.is_file():
            return f"{DISTRIBUTION} {ref.package_version} has no {ref.system} {ref.framework} {version} {name} table"
    return None


def data_root() -> Path:
    """The installed package's ``systems`` folder; ValueError saying how to install it when it is absent."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"{DISTRIBUTION} is not installed: {INSTALL} ({DISTRIBUTION}==0.12.0, NVIDIA's measured kernel tables)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "systems"


def systems(root: Path | None = None) -> list[str]:
    """The systems the database holds measurements of."""
    data = (root or data_root()) / "data"
    return sorted(p.name for p in data.iterdir() if any(p.rglob("*.parquet")))


def current_version(system: str, framework: str, root: Path | None = None) -> str:
    """The version the package queries by default for ``system`` and ``framework`` (``query_versions.yaml``)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework={framework!r}: choose one of {', '.join(FRAMEWORKS)}")
    versions = yaml.safe_load(((root or data_root()) / "query_versions.yaml").read_text())
    entry = (versions.get("overrides") or {}).get(system, {}).get(framework) or versions["defaults"][framework]
    return str(entry["current"])


def _order(version: str) -> tuple[int, Version | str]:
    try:
        return (1, Version(version))
    except InvalidVersion:
        return (0, version)


def table_version(system: str, name: str, framework: str, version: str, root: Path | None = None) -> str | None:
    """The version whose ``name`` table serves ``framework`` ``version`` on ``system``: that version's, or the newest
    older one that has it (the package's own backward fill); None when no version up to it has the table."""
    folder = (root or data_root()) / "data" / system / FAMILY[name] / framework
    if not folder.is_dir():
        return None
    have = [p.name for p in folder.iterdir() if (p / f"{name}.parquet").is_file()]
    older = [v for v in have if _order(v) <= _order(version)]
    return max(older, key=_order) if older else None


def read(system: str, name: str, framework: str, version: str, root: Path | None = None) -> pd.DataFrame:
    """One table (``name``: a key of ``FAMILY``) with ``latency_s`` in seconds, one row per shape, the usual kernel's
    (see the module docstring; cached: do not modify it); ValueError naming the file when it is not in the database."""
    return _read(system, name, framework, version, root or data_root())


@lru_cache(maxsize=64)
def _read(system: str, name: str, framework: str, version: str, root: Path) -> pd.DataFrame:
    path = root / "data" / system / FAMILY[name] / framework / version / f"{name}.parquet"
    if not path.is_file():
        raise ValueError(f"{system} {framework} {version}: no {FAMILY[name]}/{name}.parquet in the database ({path})")
    import pandas as pd  # (a second's import, for the runs that read the database)

    frame = pd.read_parquet(path)
    frame = frame[frame["latency"] > 0]
    keys, by = _KEYS[name]
    keys = tuple(k for k in keys if k in frame.columns)  # older tables lack window_size: all full attention
    if "kernel_source" in frame.columns and len(frame):
        counts = frame.groupby([by, "kernel_source"]).size().rename("rows").reset_index()
        if name == "custom_allreduce_perf":  # the CUDA-graph kernel first: what decode steps replay
            counts["rows"] += counts["kernel_source"].str.contains("graph", case=False) * (1 << 40)
        counts["rank"] = counts.groupby(by)["rows"].rank(ascending=False, method="first")
        frame = frame.merge(counts[[by, "kernel_source", "rank"]], on=[by, "kernel_source"])
        frame = frame.sort_values("rank", kind="stable").drop_duplicates(list(keys)).drop(columns="rank")
    frame = frame.assign(latency_s=frame["latency"] * 1e-3)  # the database's milliseconds
    return frame.reset_index(drop=True)
