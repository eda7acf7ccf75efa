"""Iteration time: what must hold of the roofline (bounds, monotonicity, TP, dtypes) and that explain agrees with it.

The roofline's own laws are checked on the datasheet profiles (``NAME.datasheet``) and on the curves fitted to the
measured database (``tables=False``); the profiles that time kernels from the measured tables are checked in
``tests/test_kernel_tables.py``, and for explain's agreement here."""

from __future__ import annotations

import copy
import math
from functools import cache

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import CostModel, IterationShape, load_hardware, load_model
from costmodel.hardware import PROFILES_DIR, parse_hardware
from costmodel.roofline import KERNELS


@cache
def cost_model(
    model: str = "llama-3-8b", hardware: str = "h100-sxm.datasheet", tp: int = 1, tables: bool = True, **kw: str
) -> CostModel:
    return CostModel(load_model(model), load_hardware(hardware), tp=tp, tables=tables, **kw)


def shape(prefill: list[tuple[int, int]] | None = None, decode: list[tuple[int, int]] | None = None) -> IterationShape:
    return IterationShape.of(prefill=prefill, decode=decode)


# shapes: up to 4 prefill chunks (new, cached) and up to 4 decode groups (count, context)
chunks = st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), max_size=4)
decodes = st.lists(st.tuples(st.integers(1, 64), st.integers(0, 8192)), max_size=4)
ROOFLINES = [
    ("llama-3-8b", "h100-sxm.datasheet", 1, {}),
    ("llama-2-7b", "a100-80g.datasheet", 2, {}),
    ("mixtral-8x7b", "h100-sxm.datasheet", 4, {}),
    ("mistral-7b", "l40s.datasheet", 1, {"kv_cache_dtype": "fp8"}),
    ("qwen2.5-7b", "mi300x", 1, {"quantization": "int4"}),
    ("llama-3-70b", "b200.datasheet", 8, {"quantization": "fp8"}),
    # the curves and floors fitted to the measured database, without its tables
    ("llama-3-8b", "h100-sxm", 2, {"tables": False}),
    ("qwen2.5-7b", "l40s.sglang", 1, {"tables": False, "kv_cache_dtype": "fp8"}),
    ("llama-3-70b", "gb200.trtllm", 4, {"tables": False, "quantization": "fp8"}),
]
setups = st.sampled_from(ROOFLINES)
# the same with the measured tables where the profile has them (and the package is installed)
with_tables = st.sampled_from(ROOFLINES[:6] + [(m, h, tp, {k: v for k, v in kw.items() if k != "tables"})
                                               for m, h, tp, kw in ROOFLINES[6:]])  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------------
# explain and iteration_time: one set of formulas


@settings(max_examples=60, deadline=None)
@given(with_tables, chunks, decodes)
def test_explain_agrees_with_iteration_time(setup, prefill, decode) -> None:
    model, hw, tp, kw = setup
    cm = cost_model(model, hw, tp, **kw)
    s = shape(prefill, decode)
    b = cm.explain(s)
    assert b.time_s == cm.iteration_time(s)  # exactly: the same code computes both
    parts = b.gpu_time_s + b.communication_s + b.overhead_s
    assert parts == pytest.approx(b.time_s, rel=1e-12, abs=1e-15)
    assert {op.bound for op in b.ops} <= {"compute", "memory"}
    ks = cm.kernels(s)
    assert [k.name for k in ks] == [k[0] for k in KERNELS]
    if b.time_s:
        assert sum(k.count * k.time_s for k in ks) == pytest.approx(b.gpu_time_s, rel=1e-12)


def test_empty_iteration_costs_nothing() -> None:
    cm = cost_model()
    assert cm.iteration_time(IterationShape()) == 0.0
    assert cm.explain(IterationShape()).ops == ()


def test_json_contract_of_explain() -> None:
    d = cost_model().explain(shape([(512, 0)], [(32, 1024)])).to_dict()
    assert isinstance(d["time_s"], float)
    names = [op["name"] for op in d["ops"]]
    assert {"qkv_proj", "o_proj", "mlp", "attention_prefill", "attention_decode", "lm_head"} <= set(names)
    for op in d["ops"]:
        assert set(op) == {"name", "time_s", "flops", "bytes", "bound"}
        assert op["bound"] in ("compute", "memory")


# ---------------------------------------------------------------------------------------------------------------------
# the seed's central fact


def test_decode_at_batch_1_is_bandwidth_bound_on_h100() -> None:
    b = cost_model().explain(shape(decode=[(1, 1024)]))
    assert b.bound == "memory"
    assert all(b.op(name).bound == "memory" for name in ("qkv_proj", "o_proj", "mlp", "attention_decode"))
    # nearly all its GPU time is spent streaming the weights: 15 GiB at ~80% of 3.35 TB/s is ~5.6 ms
    assert 5e-3 < b.gpu_time_s < 9e-3


def test_prefill_of_2048_tokens_is_compute_bound_on_h100() -> None:
    b = cost_model().explain(shape(prefill=[(2048, 0)]))
    assert b.bound == "compute"
    assert all(b.op(name).bound == "compute" for name in ("qkv_proj", "o_proj", "mlp", "attention_prefill"))
    # ~2 x 8e9 params x 2048 tokens = 33 TFLOP of GEMMs at ~75% of 989.5 TFLOP/s
    assert 0.035 < b.gpu_time_s < 0.07


def _ideal_profile(name: str = "h100-sxm.datasheet"):
    """A profile whose every curve is flat at 100%: the datasheet roofline itself."""
    data = copy.deepcopy(yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text()))
    for cls in ("gemm", "attention_prefill", "attention_decode", "elementwise"):
        for side in ("compute", "memory"):
            data["efficiency"][cls][side].update(max=1.0, half_size=0.0)
    return parse_hardware(data)


def test_ridge_point_is_where_gemms_turn_compute_bound() -> None:
    hw = _ideal_profile()
    cm = CostModel(load_model("llama-3-8b"), hw)
    assert cm.ridge_point == hw.peak_flops("bfloat16") / hw.bandwidth
    for tokens in (8, 64, 128, 256, 300, 512, 4096):
        k = next(k for k in cm.kernels(shape([(tokens, 0)])) if k.name == "mlp_gate_up")
        intensity = k.flops / k.bytes
        assert k.bound == ("compute" if intensity >= cm.ridge_point else "memory")
        # on the ideal roofline a kernel takes exactly max(FLOPs / peak, bytes / bandwidth)
        assert k.time_s == pytest.approx(max(k.flops / hw.peak_flops(), k.bytes / hw.bandwidth), rel=1e-12)


# ---------------------------------------------------------------------------------------------------------------------
# monotone in tokens, batch and context


@settings(max_examples=60, deadline=None)
@given(setups, chunks, decodes, st.integers(1, 2048), st.integers(1, 4096))
def test_time_is_monotone_in_tokens_batch_and_context(setup, prefill, decode, more, later) -> None:
    model, hw, tp, kw = setup
    cm = cost_model(model, hw, tp, **kw)
    base = cm.iteration_time(shape(prefill, decode))
    assert cm.iteration_time(shape([*prefill, (more, 0)], decode)) >= base  # another prefill chunk
    assert cm.iteration_time(shape(prefill, [*decode, (1, later)])) >= base  # a bigger batch
    if prefill:
        (n, c), rest = prefill[0], prefill[1:]
        assert cm.iteration_time(shape([(n + more, c), *rest], decode)) >= base  # a longer chunk
        assert cm.iteration_time(shape([(n, c + later), *rest], decode)) >= base  # more context before it
    if decode:
        (count, c), rest = decode[0], decode[1:]
        assert cm.iteration_time(shape(prefill, [(count + 1, c), *rest])) >= base
        assert cm.iteration_time(shape(prefill, [(count, c + later), *rest])) >= base  # longer contexts


def test_decode_time_grows_linearly_with_context_once_attention_dominates() -> None:
    cm = cost_model()
    t = [cm.explain(shape(decode=[(64, c)])).op("attention_decode").time_s for c in (4096, 8191)]
    assert t[1] / t[0] == pytest.approx(8192 / 4097, rel=0.02)


# ---------------------------------------------------------------------------------------------------------------------
# formulas against brute force


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 600)), min_size=1, max_size=40))
def test_prefill_attention_flops_count_every_causal_pair(prefill) -> None:
    model = load_model("llama-3-8b")
    cm = cost_model()
    k = next(k for k in cm.kernels(shape(prefill)) if k.name == "attention_prefill")
    pairs = sum(sum(c + i + 1 for i in range(n)) for n, c in prefill)
    # QK^T and PV: 2 FLOPs per multiply-add, head_dim multiply-adds each, per query head and (query, key) pair
    assert k.flops == 2 * 2 * model.head_dim * model.num_attention_heads * pairs


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 9000)), min_size=1, max_size=4),
    st.lists(st.integers(0, 9000), max_size=8),
)
def test_sliding_window_caps_what_attention_reads(prefill, dctx) -> None:
    mistral = load_model("mistral-7b")
    w = mistral.sliding_window
    assert w == 4096
    cm = cost_model("mistral-7b")
    s = shape(prefill, [(1, c) for c in dctx])
    ks = {k.name: k for k in cm.kernels(s)}
    per_pair = 4 * mistral.q_size
    pairs = sum(sum(min(c + i + 1, w) for i in range(n)) for n, c in prefill)
    assert ks["attention_prefill"].flops == per_pair * pairs
    assert ks["attention_decode"].flops == per_pair * sum(min(c + 1, w) for c in dctx)


def test_many_chunks_take_the_numpy_path_with_the_same_sums() -> None:
    cm = cost_model()
    rng = np.random.default_rng(0)
    prefill = [(int(n), int(c)) for n, c in zip(rng.integers(1, 200, 100), rng.integers(0, 2000, 100), strict=True)]
    few = sum(cm.iteration_time(shape(prefill[i : i + 20])) for i in range(0, 100, 20))
    assert few > cm.iteration_time(shape(prefill)) > 0  # one iteration is cheaper than five; both paths run
    k = next(k for k in cm.kernels(shape(prefill)) if k.name == "attention_prefill")
    assert k.flops == 4 * 4096 * sum(n * c + n * (n + 1) // 2 for n, c in prefill)


# ---------------------------------------------------------------------------------------------------------------------
# tensor parallelism


def test_tp2_halves_weight_bytes_and_adds_communication() -> None:
    tp1, tp2 = cost_model(tp=1), cost_model(tp=2)
    assert tp2.weight_bytes_per_gpu() == pytest.approx(tp1.weight_bytes_per_gpu() / 2, rel=1e-3)
    s = shape([(512, 0)], [(32, 1024)])
    b1, b2 = tp1.explain(s), tp2.explain(s)
    assert b1.communication_s == 0.0 and b1.all_reduces == 0
    assert b2.communication_s > 0.0
    assert b2.all_reduces == 2 * 32 + 1  # after attention and MLP in every layer, and after the embedding
    # the per-GPU operators shrink: the weight bytes of each linear layer halve, FLOPs too
    for name in ("qkv_proj", "o_proj", "mlp"):
        assert b2.op(name).flops == pytest.approx(b1.op(name).flops / 2)
    assert b2.gpu_time_s < b1.gpu_time_s
    assert b2.communication_bytes == (2 * 32 + 1) * 544 * 4096 * 2  # each carries T x H activations in bf16


def test_ring_all_reduce_time() -> None:
    cm = cost_model(tp=4)
    hw = cm.hardware
    comm = hw.efficiency.communication
    tokens = 1000
    message = tokens * 4096 * 2
    per_call = comm.latency_s.value + 2 * 3 / 4 * (message + comm.bandwidth.half_size) / (
        hw.link_bandwidth * comm.bandwidth.max
    )
    b = cm.explain(shape([(tokens, 0)]))
    assert b.communication_s == pytest.approx(65 * per_call)


def test_tp_must_split_the_heads() -> None:
    with pytest.raises(ValueError, match="num_attention_heads"):
        cost_model(tp=3)
    # more GPUs than KV heads: KV heads are replicated (16 GPUs in one NVLink domain: NVL72's)
    big = cost_model("llama-3-70b", "gb200.datasheet", tp=16)
    assert big.kv_bytes_per_token() == 2 * 80 * 1 * 128 * 2


@pytest.mark.parametrize(("hardware", "tp"), [("h100-sxm.datasheet", 16), ("b200", 32), ("l40s", 16)])
def test_tp_beyond_the_gpus_one_link_joins_is_refused(hardware: str, tp: int) -> None:
    """An 8-GPU server's NVLink (or PCIe) all-reduces within it; TP 16 would cross the network between servers, which
    ferry does not price (it priced it as NVLink, cheaper than the measured 8-GPU all-reduce): refused, saying why."""
    with pytest.raises(ValueError, match=rf"tensor_parallel_size={tp} spans more than the 8 GPUs .*pipeline"):
        cost_model("llama-3-70b", hardware, tp=tp)
    assert cost_model("llama-3-70b", "gb200.datasheet", tp=32).tp == 32  # NVL72: 72 GPUs on one NVLink


# ---------------------------------------------------------------------------------------------------------------------
# dtypes: compression shows up in serving


def test_fp8_kv_cache_halves_kv_bytes_and_decode_attention_traffic() -> None:
    bf16, fp8 = cost_model(), cost_model(kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token() * 2 == bf16.kv_bytes_per_token() == 128 * 1024
    s = shape(decode=[(64, 4096)])
    a_bf16 = bf16.explain(s).op("attention_decode")
    a_fp8 = fp8.explain(s).op("attention_decode")
    assert a_fp8.bytes < 0.52 * a_bf16.bytes and a_fp8.time_s < a_bf16.time_s


def test_int4_weights_quarter_the_weight_bytes_a_decode_step_reads() -> None:
    bf16, int4 = cost_model(), cost_model(quantization="int4")
    s = shape(decode=[(1, 100)])
    weights = {  # bf16 weight bytes of each linear kernel of Llama-3-8B (H=4096, q=4096, kv=1024, I=14336)
        "qkv_proj": 4096 * (4096 + 2 * 1024) * 2,
        "o_proj": 4096 * 4096 * 2,
        "mlp_gate_up": 4096 * 2 * 14336 * 2,
        "mlp_down": 14336 * 4096 * 2,
    }
    k16 = {k.name: k for k in bf16.kernels(s)}
    k4 = {k.name: k for k in int4.kernels(s)}
    for name, w in weights.items():
        # the activations are the same bf16 tensors; the weights shrink to a quarter
        assert k16[name].bytes - k4[name].bytes == pytest.approx(0.75 * w)
    assert k16["lm_head"].bytes == k4["lm_head"].bytes  # the LM head stays unquantized, as in vLLM
    # a decode step streams ~a quarter of the bytes, so it takes well under half the GPU time
    assert int4.explain(s).gpu_time_s < 0.5 * bf16.explain(s).gpu_time_s


def test_fp8_quantization_computes_in_fp8_only_where_the_device_can() -> None:
    assert cost_model(quantization="fp8").gemm_dtype == "fp8"
    assert cost_model(hardware="a100-80g", quantization="fp8").gemm_dtype == "bfloat16"  # weight-only fallback
    assert cost_model(quantization="int4").gemm_dtype == "bfloat16"  # int4 is weight-only
    fp8 = cost_model(quantization="fp8").iteration_time(shape([(4096, 0)]))
    bf16 = cost_model().iteration_time(shape([(4096, 0)]))
    assert fp8 < 0.75 * bf16  # prefill GEMMs at twice the peak
    s = shape([(4096, 0)])
    head = [next(k for k in cost_model(**kw).kernels(s) if k.name == "lm_head") for kw in ({}, {"quantization": "fp8"})]
    assert head[0] == head[1]  # the LM head stays bf16, at the bf16 rate


def test_dtype_defaults_to_the_checkpoint() -> None:
    assert cost_model("llama-2-7b").dtypes.activation == "float16"
    assert cost_model("llama-3-8b").dtypes.activation == "bfloat16"
    assert cost_model("llama-3-8b", dtype="fp32").dtypes.activation == "float32"
    assert cost_model("llama-3-8b", dtype="fp32").gemm_dtype == "float32"


# ---------------------------------------------------------------------------------------------------------------------
# MoE


def test_moe_decode_reads_only_the_experts_its_tokens_hit() -> None:
    cm = cost_model("mixtral-8x7b")
    one = next(k for k in cm.kernels(shape(decode=[(1, 10)])) if k.name == "moe_experts")
    many = next(k for k in cm.kernels(shape([(4096, 0)])) if k.name == "moe_experts")
    expert_bytes = 3 * 14336 * 4096 * 2  # gate, up and down of one expert, bf16
    assert one.bytes == pytest.approx(2 * expert_bytes, rel=0.01)  # one token: its top-2 experts
    assert many.bytes > 8 * expert_bytes  # many tokens: all 8 experts (plus activations)
    # FLOPs follow the top-k experts per token, not all of them: gate/up, the activation (5 per element), down
    rows = 4096 * 2
    assert many.flops == 2 * rows * 4096 * 2 * 14336 + 5 * rows * 14336 + 2 * rows * 14336 * 4096
    e, k = 8, 2
    t = 3
    three = next(k_ for k_ in cm.kernels(shape(decode=[(t, 10)])) if k_.name == "moe_experts")
    expected_experts = e * (1 - (1 - k / e) ** t)
    # the rows read the token and write gate/up, activation and output: (2 H + 2 I + 3 I) elements, the tokens once
    activations = t * k * (2 * 4096 + 2 * 14336 + 3 * 14336) * 2 + t * 4096 * 2
    assert three.bytes == pytest.approx(expected_experts * expert_bytes + activations)
    assert math.isclose(cm.model.num_active_params() / cm.model.num_params(), 12.9 / 46.7, rel_tol=0.01)
