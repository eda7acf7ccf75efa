"""The measured MoE and MLA tables (``costmodel.kernel_tables``: ``moe_factors``, ``mla_factors``): on small tables this
test writes itself in the package's layout, and on the real package where it is installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from costmodel import CostModel, IterationShape, kerneldb, load_hardware, load_model
from costmodel.hardware import HardwareProfile, KernelTables
from costmodel.layout import Parallelism

installed = importlib.util.find_spec("aiconfigurator_core") is not None
needs_package = pytest.mark.skipif(not installed, reason="aiconfigurator-core is not installed (ferry[measured])")

TOKENS = (1, 4, 16, 64, 256, 1024, 4096)
MOE_S = lambda tokens, ep: 20e-6 + tokens * 3e-7 / ep  # noqa: E731  (the synthetic fused MoE's seconds)
PREFILL_S = lambda b, isl: 30e-6 + b * isl * 2e-7 + b * isl * isl * 1e-10  # noqa: E731  (MLA module, prefill)
DECODE_S = lambda b, ctx: 80e-6 + b * ctx * 1e-9  # noqa: E731  (MLA module, decode)


def _write(root: Path, family: str, name: str, frame: pd.DataFrame) -> None:
    folder = root / "data" / "h100_sxm" / family / "vllm" / "0.24.0"
    folder.mkdir(parents=True, exist_ok=True)
    frame.assign(latency=frame["latency"] * 1e3).to_parquet(folder / f"{name}.parquet")  # stored in ms


@pytest.fixture
def measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HardwareProfile:
    """h100-sxm's datasheet profile naming a database of: the fused MoE of qwen3-30b-a3b's experts (2048 x 768, 128
    experts, top 8; bf16) at ep 1 and 2 (power-law routing, and a balanced table twice as slow that must not be
    read), and DeepSeek-V3's MLA module at 16 heads per GPU (bf16 KV, fp8 block-scaled GEMMs); GEMM and attention
    tables empty."""
    root = tmp_path / "systems"
    root.mkdir()
    (root / "query_versions.yaml").write_text("defaults:\n  vllm: {current: '0.24.0'}\n")
    moe = []
    for ep in (1, 2):
        for distribution, slower in (("power_law_1.01", 1.0), ("balanced", 2.0)):
            moe += [{"moe_dtype": "bfloat16", "num_tokens": t, "hidden_size": 2048, "inter_size": 768, "topk": 8,
                     "num_experts": 128, "moe_tp_size": 1, "moe_ep_size": ep, "distribution": distribution,
                     "latency": slower * MOE_S(t, ep), "kernel_source": "fused"} for t in TOKENS]  # fmt: skip
    _write(root, "moe", "moe_perf", pd.DataFrame(moe))
    base = {"kv_cache_dtype": "bfloat16", "gemm_type": "fp8_block", "num_heads": 16, "kernel_source": "FLASH_ATTN"}
    context = [{"batch_size": b, "isl": isl, "step": 0, "latency": PREFILL_S(b, isl)} for b in (1, 4, 16)
               for isl in (128, 1024, 4096)]  # fmt: skip
    _write(root, "mla", "mla_context_module_perf", pd.DataFrame(context).assign(**base))
    generation = [{"batch_size": b, "isl": 1, "step": s, "latency": DECODE_S(b, s + 1)} for b in (1, 16, 64)
                  for s in (127, 1023, 8191)]  # fmt: skip
    _write(root, "mla", "mla_generation_module_perf", pd.DataFrame(generation).assign(**base))
    _write(root, "gemm", "gemm_perf", pd.DataFrame(columns=["gemm_dtype", "m", "n", "k", "latency"]))
    empty = pd.DataFrame(columns=["kv_cache_dtype", "batch_size", "isl", "step", "num_heads", "num_key_value_heads",
                                  "head_dim", "window_size", "latency"])  # fmt: skip
    _write(root, "attention", "context_attention_perf", empty)
    _write(root, "attention", "generation_attention_perf", empty)
    monkeypatch.setattr(kerneldb, "data_root", lambda: root)
    monkeypatch.setattr(kerneldb, "unavailable", lambda version: None)
    ref = KernelTables(package_version="test", system="h100_sxm", framework="vllm", version="0.24.0",
                       comm_version=None)  # fmt: skip
    return load_hardware("h100-sxm.datasheet").model_copy(update={"kernel_tables": ref})


def experts_s(cm: CostModel, decodes: int) -> float:
    shape = IterationShape.of(decode=[(decodes, 100)])
    return next(k.time_s for k in cm.kernels(shape) if k.name == "moe_experts")


@pytest.mark.parametrize("tokens", TOKENS)
def test_routed_experts_take_the_measured_power_law_time(measured: HardwareProfile, tokens: int) -> None:
    cm = CostModel(load_model("qwen3-30b-a3b"), measured)
    assert experts_s(cm, tokens) == pytest.approx(MOE_S(tokens, 1), rel=1e-9)


def test_with_data_parallel_ranks_the_moe_layer_takes_every_ranks_tokens(measured: HardwareProfile) -> None:
    # two ranks with expert parallelism: each GPU holds 64 experts (the ep 2 rows) and takes both ranks' tokens
    cm = CostModel(load_model("qwen3-30b-a3b"), measured, parallel=Parallelism(dp=2, expert_parallel=True))
    assert experts_s(cm, 32) == pytest.approx(MOE_S(64, 2), rel=1e-9)
    # no table for this layout (ep 4): the roofline, and the note says so
    four = CostModel(load_model("qwen3-30b-a3b"), measured, parallel=Parallelism(dp=4, expert_parallel=True))
    assert any("moe_experts" in n and "not measured" in n for n in four.tables.notes)


MODULE = {False: ("qkv_proj", "rope", "attention_prefill", "mla_kv_up", "o_proj"),
          True: ("qkv_proj", "rope", "attention_decode", "mla_absorb", "o_proj")}  # fmt: skip


def module_s(cm: CostModel, shape: IterationShape, decode: bool) -> float:
    return sum(k.count and k.time_s for k in cm.kernels(shape) if k.name in MODULE[decode])


@pytest.mark.parametrize(("b", "isl"), [(1, 128), (4, 1024), (16, 4096), (1, 4096)])
def test_mla_prefill_takes_the_measured_module_time(measured: HardwareProfile, b: int, isl: int) -> None:
    cm = CostModel(load_model("deepseek-v3"), measured, parallel=Parallelism(tp=8))  # 16 heads a GPU
    assert module_s(cm, IterationShape.of(prefill=[(isl, 0)] * b), False) == pytest.approx(PREFILL_S(b, isl), rel=1e-9)


@pytest.mark.parametrize(("b", "ctx"), [(1, 128), (16, 1024), (64, 8192)])
def test_mla_decode_takes_the_measured_module_time(measured: HardwareProfile, b: int, ctx: int) -> None:
    cm = CostModel(load_model("deepseek-v3"), measured, parallel=Parallelism(tp=8))
    shape = IterationShape.of(decode=[(b, ctx - 1)])  # ctx - 1 cached tokens and the new one
    assert module_s(cm, shape, True) == pytest.approx(DECODE_S(b, ctx), rel=1e-9)


@needs_package
def test_the_real_database_times_deepseeks_mla_and_experts_as_measured() -> None:
    cm = CostModel(load_model("deepseek-r1"), load_hardware("h200"), parallel=Parallelism(tp=8))
    assert not any(n.startswith(("attention", "moe_experts")) for n in cm.tables.notes), cm.tables.notes
    ctx = kerneldb.read("h200_sxm", "mla_context_module_perf", "vllm", "0.24.0")
    row = ctx[(ctx.num_heads == 16) & (ctx.batch_size == 4) & (ctx.isl == 2048) & (ctx.kv_cache_dtype == "bfloat16")
              & (ctx.gemm_type == "fp8_block")].iloc[0]  # fmt: skip
    assert module_s(cm, IterationShape.of(prefill=[(2048, 0)] * 4), False) == pytest.approx(row.latency_s, rel=1e-6)
    moe = kerneldb.read("h200_sxm", "moe_perf", "vllm", "0.24.0")
    row = moe[(moe.moe_dtype == "fp8_block") & (moe.hidden_size == 7168) & (moe.num_experts == 256)
              & (moe.moe_tp_size == 8) & (moe.moe_ep_size == 1) & (moe.num_tokens == 64)
              & (moe.distribution == "power_law_1.01")].iloc[0]  # fmt: skip
    assert experts_s(cm, 64) == pytest.approx(row.latency_s, rel=1e-6)
