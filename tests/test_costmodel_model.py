"""Model specs: built-in configs against their published sizes, KV bytes, dtypes, loading and its errors."""

from __future__ import annotations

import json

import pytest

from costmodel import Dtypes, ModelSpec, builtin_models, load_model

# published parameter counts (model cards / papers), in billions
PUBLISHED_B = {
    "llama-2-7b": 6.74,
    "llama-2-13b": 13.02,
    "llama-3-8b": 8.03,
    "llama-3.1-8b": 8.03,
    "llama-3-70b": 70.6,
    "llama-3.1-70b": 70.6,
    "qwen2.5-7b": 7.62,
    "mistral-7b": 7.24,
    "mixtral-8x7b": 46.7,
    "llama-3.3-70b": 70.6,
    "llama-3.3-70b-nvfp4": 70.6,  # the same weights as NVIDIA's NVFP4 export (counted as parameters, not bytes)
    "llama-3.1-405b": 405.0,
    "qwen3-8b": 8.2,
    "qwen3-32b": 32.8,
    "qwen3-30b-a3b": 30.5,
    "qwen3-235b-a22b": 235.0,
    "qwen3-235b-a22b-fp8": 235.0,
    "deepseek-v3": 671.0,  # the main model; the checkpoint's 14B multi-token-prediction layer is not served
    "deepseek-r1": 671.0,
    "deepseek-v3.1-nvfp4": 671.0,
    "kimi-k2": 1026.0,  # Moonshot's card says "1T"; 1.026T is the count of its published shapes
    "gpt-oss-120b": 116.83,  # OpenAI's model card
    "gpt-oss-20b": 20.91,
    "llama-4-scout": 109.0,  # Meta's count includes the vision encoder ferry does not model (~1%)
    "llama-4-maverick": 400.0,
}
# how far from the published count a model may be (default 1%)
TOLERANCE = {"llama-4-scout": 0.015}
KiB = 1024
# ferry's own configs, no published checkpoint: the CPU validation model (random weights)
OWN = {"tiny-llama"}


def test_the_built_ins_are_the_ones_the_issue_names() -> None:
    assert set(builtin_models()) == set(PUBLISHED_B) | OWN


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_parameter_count_within_one_percent_of_published(name: str) -> None:
    params = load_model(name).num_params()
    assert params / 1e9 == pytest.approx(PUBLISHED_B[name], rel=TOLERANCE.get(name, 0.01))


def test_mixtral_active_parameters_are_top2_of_8() -> None:
    m = load_model("mixtral-8x7b")
    assert m.is_moe and m.num_local_experts == 8 and m.num_experts_per_tok == 2
    assert m.num_active_params() / 1e9 == pytest.approx(12.9, rel=0.01)  # Mistral AI's "12.9B active"


def test_kv_bytes_per_token() -> None:
    # 2 (K, V) x layers x kv heads x head_dim x bytes
    assert load_model("llama-3-8b").kv_bytes_per_token("bfloat16") == 128 * KiB
    assert load_model("llama-3-8b").kv_bytes_per_token() == 128 * KiB  # auto: the checkpoint's bf16
    assert load_model("llama-2-7b").kv_bytes_per_token("fp16") == 512 * KiB
    assert load_model("llama-3-8b").kv_bytes_per_token("fp8") == 64 * KiB


def test_published_fields_of_the_built_ins() -> None:
    m = load_model("llama-3-8b")
    assert (m.hidden_size, m.num_hidden_layers, m.num_attention_heads, m.num_key_value_heads) == (4096, 32, 32, 8)
    assert (m.intermediate_size, m.vocab_size, m.max_position_embeddings, m.head_dim) == (14336, 128256, 8192, 128)
    assert m.torch_dtype == "bfloat16" and not m.tie_word_embeddings
    assert load_model("llama-3.1-8b").max_position_embeddings == 131072
    q = load_model("qwen2.5-7b")
    assert (q.hidden_size, q.num_key_value_heads, q.vocab_size, q.max_position_embeddings) == (3584, 4, 152064, 32768)
    assert q.attention_bias and q.sliding_window is None
    assert load_model("mistral-7b").sliding_window == 4096
    assert load_model("llama-2-7b").torch_dtype == "float16"


@pytest.mark.parametrize("name", ["LLAMA-3-8B", "Llama-3-8b", "meta-llama/Meta-Llama-3-8B", "Meta-Llama-3-8B"])
def test_names_are_case_insensitive_and_hf_ids_work(name: str) -> None:
    assert load_model(name).name == "llama-3-8b"


def test_unknown_model_names_the_built_ins() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'gpt-5'.*llama-3-8b"):
        load_model("gpt-5")


def test_load_a_config_json_by_path(tmp_path) -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "vocab_size": 1000,
        "max_position_embeddings": 2048,
        "torch_dtype": "float32",
    }
    d = tmp_path / "tiny-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(d / "config.json"))
    assert m.name == "tiny-llama" and m.head_dim == 64 and m.kv_size == 128
    assert load_model(str(d)) == m  # a directory holding config.json works too
    # embedding + lm head + 2 layers (attention 256*(256+2*128) + 256*256, mlp 3*256*512, norms) + final norm
    assert m.num_params() == 2 * 1000 * 256 + 2 * (256 * 512 + 256 * 256 + 3 * 256 * 512 + 2 * 256) + 256


def test_config_missing_a_field_names_it(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        load_model(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model(str(path))


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="num_key_value_heads"):
        ModelSpec("x", 64, 1, 6, 4, 16, 128, 100, 512)
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelSpec("x", 64, 1, 4, 4, 16, 128, 100, 512, num_local_experts=2, num_experts_per_tok=3)


# ---------------------------------------------------------------------------------------------------------------------
# dtypes


def test_auto_dtype_follows_the_checkpoint_like_vllm() -> None:
    assert Dtypes.resolve("bfloat16").activation == "bfloat16"
    assert Dtypes.resolve("float16", "auto").activation == "float16"
    assert Dtypes.resolve("float32").activation == "float16"  # vLLM runs fp32 checkpoints in fp16 under auto
    assert Dtypes.resolve("bfloat16", "fp16").activation == "float16"
    assert Dtypes.resolve("bfloat16", "float32").activation == "float32"
    d = Dtypes.resolve("bfloat16", kv_cache_dtype="fp8_e4m3", quantization="awq")
    assert (d.weight, d.kv_cache, d.quantization) == ("int4", "fp8", "int4")


def test_bad_dtypes_say_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="use quantization"):
        Dtypes.resolve("bfloat16", "fp8")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        Dtypes.resolve("bfloat16", kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="unknown dtype 'bf17'"):
        Dtypes.resolve("bfloat16", "bf17")
    with pytest.raises(ValueError, match="quantization"):
        Dtypes.resolve("bfloat16", quantization="float16")


def test_int4_weights_take_a_quarter_of_bf16_bytes() -> None:
    m = load_model("llama-3-8b")
    bf16 = m.weight_bytes(Dtypes.resolve("bfloat16"))
    int4 = m.weight_bytes(Dtypes.resolve("bfloat16", quantization="int4"))
    fp8 = m.weight_bytes(Dtypes.resolve("bfloat16", quantization="fp8"))
    q = m.quantizable_params()
    assert bf16 - int4 == pytest.approx(q * (2.0 - 0.5))  # the quantized matrices shrink 4x ...
    assert bf16 - fp8 == pytest.approx(q * (2.0 - 1.0))
    assert int4 / bf16 == pytest.approx((0.25 * q + (m.num_params() - q)) / m.num_params())  # ... the rest stays
    assert bf16 / 2**30 == pytest.approx(14.96, abs=0.01)  # what vLLM reports loading Llama-3-8B in bf16
