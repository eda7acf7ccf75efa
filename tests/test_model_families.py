"""The model families planners serve in 2026, read from config.json files the tests write: their KV bytes per token
and weight bytes against numbers worked out by hand from the configs, what ferry refuses (naming the field), and the
per-GPU memory of tensor, pipeline and expert parallelism."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import CostModel, IterationShape, load_hardware, load_model
from costmodel.layout import Layout, Parallelism, stage_layers

# the published config.json fields of each family (the values of the checkpoints named), trimmed to what ferry reads
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
    "max_position_embeddings": 163840, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}  # fmt: skip
GPT_OSS_120B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
    "num_local_experts": 128, "experts_per_token": 4, "num_experts_per_tok": 4, "attention_bias": True,
    "layer_types": ["sliding_attention", "full_attention"] * 18, "sliding_window": 128, "vocab_size": 201088,
    "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
}  # fmt: skip
QWEN3_MOE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 4096, "num_hidden_layers": 94,
    "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 12288,
    "moe_intermediate_size": 1536, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False,
    "sliding_window": None, "use_sliding_window": False, "torch_dtype": "bfloat16",
}  # fmt: skip
LLAMA4_SCOUT: dict[str, Any] = {
    "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
        "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
        "attention_chunk_size": 8192, "use_qk_norm": True, "vocab_size": 202048,
        "max_position_embeddings": 10485760, "torch_dtype": "bfloat16",
    },
}  # fmt: skip
GLM45: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 5120, "num_hidden_layers": 92,
    "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
    "moe_intermediate_size": 1536, "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "attention_bias": True, "use_qk_norm": True, "vocab_size": 151552,
    "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip


def write(tmp_path: Path, name: str, config: dict[str, Any], quant: dict[str, Any] | None = None) -> Path:
    """A model folder with its config.json (and a ModelOpt hf_quant_config.json beside it)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if quant is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(quant))
    return folder


# ---- KV bytes per token ------------------------------------------------------------------------------------------


def test_deepseek_v3_caches_the_mla_latent(tmp_path: Path) -> None:
    m = load_model(str(write(tmp_path, "dsv3", DEEPSEEK_V3)))
    assert m.is_mla and m.latent_size == 512 + 64
    assert m.kv_bytes_per_token() == 61 * (512 + 64) * 2 == 70272  # ~70 KB a token in bf16, not 2 x 128 heads x 192
    assert m.kv_bytes_per_token("fp8") == 61 * 576
    # every GPU of a tensor-parallel rank caches the whole latent (one head): 8 GPUs do not divide it
    h200 = load_hardware("h200")
    assert CostModel(m, h200, parallel=Parallelism(tp=8), tables=False).kv_bytes_per_token() == 70272


def test_gpt_oss_charges_only_its_full_attention_layers(tmp_path: Path) -> None:
    m = load_model(str(write(tmp_path, "gptoss", GPT_OSS_120B)))
    assert m.hybrid_attention and m.sliding_window == 128 and len(m.window_layer_ids) == 18
    assert m.window_layer_ids == tuple(range(0, 36, 2))  # layer_types: sliding first, then full
    # 18 full layers x K and V x 8 KV heads x 64 x bf16 (no torch_dtype in the config: GPT-OSS's weights are bf16)
    assert m.torch_dtype == "bfloat16"
    assert m.kv_bytes_per_token() == 18 * 2 * 8 * 64 * 2 == 36864
    assert m.attention_sinks and m.o_bias and m.expert_bias


QWEN3_DENSE: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120, "num_hidden_layers": 64,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600,
    "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False, "sliding_window": None,
    "use_sliding_window": False, "torch_dtype": "bfloat16",
}  # fmt: skip


def test_qwen3_dense_norms_each_query_and_key_head(tmp_path: Path) -> None:
    m = load_model(str(write(tmp_path, "q32", QWEN3_DENSE)))
    assert m.qk_norm and not m.is_moe and m.sliding_window is None
    assert m.kv_bytes_per_token() == 64 * 2 * 8 * 128 * 2
    h = 5120
    attention = h * (64 * 128 + 2 * 8 * 128) + 64 * 128 * h + 2 * 128  # q, k, v, o and the two head norms
    assert m.num_params() == 64 * (attention + 3 * h * 25600 + 2 * h) + h + 2 * 151936 * h
    assert m.weight_bytes() == m.num_params() * 2  # bf16 throughout


def test_qwen3_moe_and_llama4_kv(tmp_path: Path) -> None:
    assert load_model(str(write(tmp_path, "q", QWEN3_MOE))).kv_bytes_per_token() == 94 * 2 * 4 * 128 * 2
    scout = load_model(str(write(tmp_path, "scout", LLAMA4_SCOUT)))
    assert scout.chunked_attention and scout.sliding_window == 8192
    assert scout.window_layer_ids == tuple(i for i in range(48) if (i + 1) % 4)  # every 4th layer is global
    # a chunk of 8192 tokens is held whole: every layer is charged per token
    assert scout.kv_bytes_per_token() == 48 * 2 * 8 * 128 * 2


# ---- weights -------------------------------------------------------------------------------------------------------


def test_deepseek_v3_weight_bytes_by_hand(tmp_path: Path) -> None:
    m = load_model(str(write(tmp_path, "dsv3", DEEPSEEK_V3)))
    assert m.quantization == "fp8_block" and m.unquantized == ()
    fp8, bf16 = 1, 2
    h = 7168
    attention = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h  # q_a, q_b, kv_a, kv_b, o
    latent_norms = 1536 + 512
    dense = 3 * h * 18432
    moe = 256 * 3 * h * 2048 + 3 * h * 2048  # routed + one shared
    router = h * 256
    expected = (61 * attention * fp8 + 61 * latent_norms * bf16 + 3 * dense * fp8 + 58 * moe * fp8
                + 58 * router * bf16 + (61 * 2 * h + h) * bf16 + 2 * 129280 * h * bf16)  # fmt: skip
    assert m.weight_bytes() == expected
    assert m.num_params() / 1e9 == pytest.approx(671.0, rel=0.001)
    assert m.num_active_params() / 1e9 == pytest.approx(37.5, rel=0.01)


def test_gpt_oss_experts_in_mxfp4_the_rest_in_bf16(tmp_path: Path) -> None:
    m = load_model(str(write(tmp_path, "gptoss", GPT_OSS_120B)))
    assert m.quantization == "mxfp4" and m.unquantized == ("attention",)
    h, n_layers, e = 2880, 36, 128
    mxfp4 = 4.25 / 8  # 4-bit values, one 8-bit scale per 32
    experts = n_layers * e * 3 * h * 2880 * mxfp4
    expert_biases = n_layers * e * (2 * 2880 + h) * 2
    attention = n_layers * (h * (64 * 64 + 2 * 8 * 64) + 64 * 64 * h) * 2
    attention_small = n_layers * ((64 * 64 + 2 * 8 * 64) + h + 64) * 2  # q/k/v and o biases, sinks
    router = n_layers * (h * e + e) * 2
    rest = (n_layers * 2 * h + h) * 2 + 2 * 201088 * h * 2
    assert m.weight_bytes() == pytest.approx(experts + expert_biases + attention + attention_small + router + rest)
    assert m.weight_bytes() / 1e9 == pytest.approx(65.2, abs=0.1)  # the published checkpoint's ~65 GB
    assert m.num_params() / 1e9 == pytest.approx(116.83, rel=0.001)  # OpenAI's model card
    # OpenAI counts 5.13 B active without the embedding table
    assert (m.num_active_params() - 201088 * h) / 1e9 == pytest.approx(5.13, rel=0.01)


def test_nvfp4_from_a_modelopt_quant_config_beside_the_config(tmp_path: Path) -> None:
    quant = {"producer": {"name": "modelopt"},
             "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                              "exclude_modules": ["lm_head", "model.layers.*.self_attn*"]}}  # fmt: skip
    config = {k: v for k, v in DEEPSEEK_V3.items() if k != "quantization_config"}
    m = load_model(str(write(tmp_path, "dsv3fp4", config, quant)))
    assert m.quantization == "nvfp4" and m.unquantized == ("attention",)
    fp4 = 4.5 / 8  # 4-bit values, one fp8 scale per 16
    layout = m.part_params()
    assert m.weight_bytes() == pytest.approx(
        (layout["dense_mlp"] + layout["experts"] + layout["shared_experts"]) * fp4
        + (m.num_params() - layout["dense_mlp"] - layout["experts"] - layout["shared_experts"]) * 2
    )


def test_glm45_reads_as_deepseeks_moe_with_grouped_query_attention(tmp_path: Path) -> None:
    m = load_model(str(write(tmp_path, "glm", GLM45)))
    assert not m.is_mla and m.qk_norm and m.attention_bias
    assert m.moe_layer_ids == tuple(range(3, 92)) and m.shared_expert_intermediate_size == 1536
    assert m.kv_bytes_per_token() == 92 * 2 * 8 * 128 * 2
    assert m.num_params() / 1e9 == pytest.approx(355, rel=0.01)  # Zhipu's "355B total"


def test_a_quantization_flag_must_agree_with_the_checkpoint(tmp_path: Path) -> None:
    m = load_model(str(write(tmp_path, "dsv3", DEEPSEEK_V3)))
    with pytest.raises(ValueError, match=r"quantization='int4'.*quantized as fp8_block"):
        m.dtypes(quantization="int4")
    assert m.dtypes(quantization="fp8_block").weight == "fp8_block"


# ---- what ferry refuses, naming the field ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"layer_types": ["linear_attention", "full_attention"] * 2}, "layer_types"),
     ({"hybrid_override_pattern": "M-M*"}, "hybrid_override_pattern"),
     ({"mamba_num_heads": 64}, "mamba_num_heads"),
     ({"index_topk": 2048}, "index_topk"),
     ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quant_method")],
)  # fmt: skip
def test_unsupported_layers_and_formats_are_refused_naming_the_field(
    tmp_path: Path, extra: dict[str, Any], field: str
) -> None:
    config = {"model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
              "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096} | extra  # fmt: skip
    with pytest.raises(ValueError, match=field) as info:
        load_model(str(write(tmp_path, "x", config)))
    assert "\n" not in str(info.value)


def test_a_field_of_the_wrong_type_is_named(tmp_path: Path) -> None:
    config = {**QWEN3_MOE, "moe_intermediate_size": "wide"}
    with pytest.raises(ValueError, match=r"moe_intermediate_size='wide' is not a whole number"):
        load_model(str(write(tmp_path, "x", config)))


# ---- memory split over GPUs ---------------------------------------------------------------------------------------


def test_pipeline_stages_split_the_layers_as_vllm() -> None:
    assert [len(r) for r in stage_layers(126, 2)] == [63, 63]
    assert [len(r) for r in stage_layers(61, 4)] == [15, 15, 16, 15]  # the remainder to the stage before the last
    assert [len(r) for r in stage_layers(10, 4)] == [2, 3, 3, 2]


def test_pipeline_memory_split_adds_up_to_the_model() -> None:
    m = load_model("llama-3.1-405b")
    dtypes = m.dtypes()
    one = Layout(m, Parallelism(tp=1, pp=2), dtypes)
    assert one.stage_weight_bytes(0) + one.stage_weight_bytes(1) == pytest.approx(m.weight_bytes())
    # tp=8: every GPU holds 1/8 of each matrix and the whole replicated norms
    eight = Layout(m, Parallelism(tp=8, pp=2), dtypes)
    norms = (126 * 2 * 16384 + 16384) * 2
    total = 8 * (eight.stage_weight_bytes(0) + eight.stage_weight_bytes(1))
    assert total == pytest.approx(m.weight_bytes() + 7 * norms)
    per_layer_kv = 2 * 1 * 128 * 2  # 8 KV heads over 8 GPUs: one each
    assert eight.stage_kv_bytes_per_token(0) == 63 * per_layer_kv
    h100 = load_hardware("h100-sxm")
    with pytest.raises(ValueError, match=r"does not fit on h100-sxm at tp=8"):  # 101 GiB a GPU at tp=8 alone
        CostModel(m, h100, parallel=Parallelism(tp=8), tables=False).memory_plan()
    plan = CostModel(m, h100, parallel=Parallelism(tp=8, pp=2), tables=False).memory_plan()
    assert plan.pp == 2 and plan.num_gpu_blocks > 0 and plan.weight_bytes_per_gpu < 50 * 2**30


def test_expert_parallel_memory_holds_an_eighth_of_the_experts() -> None:
    m = load_model("deepseek-v3")
    dtypes = m.dtypes()
    ep = Layout(m, Parallelism(tp=1, dp=8, expert_parallel=True), dtypes)
    assert ep.local_experts == 32
    experts = m.part_params()["experts"] * 1  # fp8 block: a byte each
    assert ep.stage_weight_bytes(0) == pytest.approx(m.weight_bytes() - experts * 7 / 8)
    # without expert parallelism, data parallelism splits every expert's width over tp x dp instead
    flat = Layout(m, Parallelism(tp=1, dp=8), dtypes)
    assert flat.local_experts == 256 and flat.moe_i == 2048 / 8
    assert flat.stage_weight_bytes(0) == pytest.approx(ep.stage_weight_bytes(0))


def test_layouts_vllm_refuses_are_refused() -> None:
    h200 = load_hardware("h200")
    with pytest.raises(ValueError, match=r"not a multiple of the fp8 block of 128.*--enable-expert-parallel"):
        CostModel(load_model("qwen3-235b-a22b-fp8"), h200, parallel=Parallelism(tp=8), tables=False)
    CostModel(load_model("qwen3-235b-a22b-fp8"), h200, parallel=Parallelism(tp=8, expert_parallel=True), tables=False)
    with pytest.raises(ValueError, match=r"enable_expert_parallel: llama-3-8b has no experts"):
        CostModel(load_model("llama-3-8b"), h200, parallel=Parallelism(expert_parallel=True), tables=False)
    with pytest.raises(ValueError, match=r"pipeline_parallel_size=40 is more than"):
        CostModel(load_model("llama-3-8b"), h200, parallel=Parallelism(pp=40), tables=False)


# ---- MoE: the expert weights read ----------------------------------------------------------------------------------


def _expert_bytes(cm: CostModel, decodes: int) -> float:
    """Bytes the routed-experts kernel reads and writes in a decode step of ``decodes`` sequences."""
    k = next(k for k in cm.kernels(IterationShape.of(decode=[(decodes, 100)])) if k.name == "moe_experts")
    return k.bytes


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20_000), st.integers(1, 20_000))
def test_expert_reads_grow_with_the_batch_and_are_capped_at_all_experts(a: int, b: int) -> None:
    cm = _MOE
    lo, hi = sorted((a, b))
    assert _expert_bytes(cm, lo) <= _expert_bytes(cm, hi)
    h, width, w = 4096, 1536 / 4, 2
    all_experts = 128 * 3 * h * width * w
    activations = hi * 8 * (2 * h + 2 * width + 3 * width) * 2 + hi * h * 2
    assert _expert_bytes(cm, hi) <= all_experts + activations + 1e-6 * all_experts
    if hi >= 5000:  # 40,000 routed rows: every expert is hit, all but surely
        assert _expert_bytes(cm, hi) - activations == pytest.approx(all_experts, rel=1e-6)


_MOE = CostModel(load_model("qwen3-235b-a22b"), load_hardware("b200"), parallel=Parallelism(tp=4), tables=False)
