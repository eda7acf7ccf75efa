"""Reading a Hugging Face ``config.json`` into ``ModelSpec``'s fields, family by family, and refusing what ferry does
not model, in one line naming the config field.

The fields each family publishes (read as vLLM 0.32.0's model code reads them, ``vllm/model_executor/models/``):

- Llama, Mistral, Qwen2/2.5/3, Mixtral: ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
  ``head_dim``, ``intermediate_size``, ``num_local_experts`` / ``num_experts``, ``sliding_window`` (with Qwen's
  ``use_sliding_window``); Qwen3 normalises each q and k head (``q_norm``/``k_norm``, ``qwen3.py``);
- Qwen2-MoE/Qwen3-MoE (``qwen3_moe.py``): ``num_experts``, ``moe_intermediate_size``, ``decoder_sparse_step`` and
  ``mlp_only_layers`` (dense layers), ``shared_expert_intermediate_size`` (Qwen2-MoE);
- DeepSeek-V2/V3/R1, Kimi-K2 (``deepseek_v2.py``): MLA's ``kv_lora_rank``, ``q_lora_rank``, ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``; ``n_routed_experts``, ``n_shared_experts`` (each ``moe_intermediate_size``
  wide), ``first_k_dense_replace`` and ``moe_layer_freq``; the multi-token-prediction layers
  (``num_nextn_predict_layers``) are read, but loaded (and counted) only as an MTP drafter (``--speculative-config``);
- GLM-4.5/4.6 (``glm4_moe.py``): as DeepSeek's MoE fields, with grouped-query attention and ``use_qk_norm``;
- GPT-OSS (``gpt_oss.py``): ``layer_types`` (``sliding_attention`` / ``full_attention``), ``sliding_window``, a sink
  per head, biases on the q/k/v/o projections, the experts and the router, ``experts_per_token``;
- Llama-4 (``llama4.py``, the language model inside ``text_config``): ``interleave_moe_layer_step`` (MoE every n-th
  layer, the others dense of ``intermediate_size_mlp``), a shared expert of ``intermediate_size``, chunked local
  attention of ``attention_chunk_size`` in the layers with RoPE (``no_rope_layers``; by default every 4th layer is
  global);
- the stored weight format, ``quantization_config`` (``quant_method`` fp8 with ``weight_block_size`` -> fp8_block,
  mxfp4, modelopt's NVFP4/FP8, compressed-tensors' 4-bit floats (NVFP4), 4-bit ints and 8-bit floats, awq, gptq) or a
  ``hf_quant_config.json`` beside it (ModelOpt), and the parts it leaves alone (``modules_to_not_convert``,
  ``ignore``, ``exclude_modules``).

Refused, naming the field: linear-attention, Mamba and other non-attention layers (``layer_types`` entries other than
full, sliding or chunked attention; ``hybrid_override_pattern``, ``mamba_*``, ``linear_*``), DeepSeek's sparse
attention indexer (``index_topk``: DeepSeek-V3.2, GLM-5), DeepSeek-V4's compressed attention (``compress_ratios``),
per-layer block configs (``block_configs``: Nemotron-NAS), and weight formats ferry has no bytes for.
"""

from __future__ import annotations

import fnmatch
import math
import re
from typing import Any

from costmodel.dtypes import canonical

# model types whose MLP is a plain up/activation/down (no gate); everything else is treated as gated (SwiGLU-style)
_UNGATED_TYPES = frozenset({"gpt2", "gpt_neox", "gptj", "phi", "opt", "falcon", "bloom", "gpt_bigcode", "starcoder2"})
# model types with q/k/v biases when the config does not say (Qwen2 has them without an ``attention_bias`` field)
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe"})
# model types whose q and k heads are RMS-normalised with weights (Qwen3's q_norm/k_norm; GLM's use_qk_norm says so)
_QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe"})
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
# fields of layers ferry does not model: (field, what it is)
_REFUSED_FIELDS = (
    ("hybrid_override_pattern", "Mamba and attention layers mixed (Nemotron-H)"),
    ("index_topk", "DeepSeek sparse attention's indexer (DeepSeek-V3.2, GLM-5)"),
    ("compress_ratios", "DeepSeek-V4's compressed attention"),
    ("block_configs", "per-layer block configs (Nemotron-NAS)"),
    ("linear_attn_config", "linear-attention layers (Kimi-Linear)"),
    ("full_attention_interval", "linear-attention layers between the full ones (Qwen3.5/3-Next)"),
    ("attn_type_list", "per-layer attention types (MiniMax)"),
)
_REFUSED_PREFIXES = ("mamba_", "ssm_", "linear_")
# what ferry's dtypes call each stored format
_FP4 = "nvfp4"


class _Fields(dict[str, Any]):
    """A config whose numbers are read by name, so that a value of the wrong type names its field."""

    model = ""

    def num(self, key: str, default: Any = None, minimum: int = 1) -> int:
        """The whole number ``key`` holds (``default`` when it is absent or null), at least ``minimum``."""
        value = self.get(key)
        if value is None:
            if default is None:
                raise ValueError(f"model {self.model!r}: config.json has no {key!r}")
            return int(default)
        return _whole(self.model, key, value, minimum)

    def layer_list(self, key: str, layers: int) -> list[int]:
        """A list of one whole number per layer (``num_hidden_layers`` of them)."""
        values = self[key]
        if not isinstance(values, list) or len(values) != layers:
            raise ValueError(f"model {self.model!r}: config.json's {key} must list num_hidden_layers={layers} entries")
        return [_whole(self.model, f"{key}[{i}]", v, 0) for i, v in enumerate(values)]


def _whole(model: str, key: str, value: Any, minimum: int) -> int:
    """``value`` as a whole number >= ``minimum``; ValueError naming the field and the value."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value != int(value):
        raise ValueError(f"model {model!r}: config.json's {key}={value!r} is not a whole number")
    if value < minimum:
        raise ValueError(f"model {model!r}: config.json's {key}={value!r} must be >= {minimum}")
    return int(value)


def _refuse(name: str, field: str, what: str) -> ValueError:
    return ValueError(
        f"model {name!r}: config.json's {field!r} describes {what}, which ferry does not model (it models full, "
        "sliding-window and chunked attention, MLA, dense and MoE MLPs)"
    )


def spec_fields(config: dict[str, Any], name: str, quant_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """``ModelSpec``'s fields from a parsed ``config.json``; ValueError naming a missing or unsupported field."""
    try:
        return _spec_fields(config, name, quant_config)
    except (TypeError, KeyError, AttributeError, IndexError, OverflowError, ZeroDivisionError) as exc:
        # a field of a shape the checks below did not foresee: name what Python says of it, in one line
        field = exc.args[0] if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"model {name!r}: config.json has a field ferry cannot read ({field})") from None


def _spec_fields(config: dict[str, Any], name: str, quant_config: dict[str, Any] | None) -> dict[str, Any]:
    outer = config
    if isinstance(config.get("text_config"), dict) and "hidden_size" not in config:  # multimodal: the LM inside
        config = {**config["text_config"], **{k: v for k, v in outer.items() if k == "quantization_config"}}
        if "torch_dtype" not in config and "dtype" not in config:
            config["torch_dtype"] = outer.get("torch_dtype") or outer.get("dtype")
    config = _Fields(config)
    config.model = name

    for field, what in _REFUSED_FIELDS:
        if config.get(field) is not None:
            raise _refuse(name, field, what)
    for key in config:
        if key.startswith(_REFUSED_PREFIXES) and config[key] not in (None, 0, [], False):
            raise _refuse(name, key, "layers other than attention (state-space or linear attention)")

    model_type = str(config.get("model_type", "llama"))
    hidden = config.num("hidden_size")
    heads = config.num("num_attention_heads")
    layers = config.num("num_hidden_layers")
    fields: dict[str, Any] = {
        "name": name,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": config.num("num_key_value_heads", heads),
        "head_dim": config.num("head_dim", hidden // heads),
        "intermediate_size": config.num("intermediate_size"),
        "num_nextn_predict_layers": config.num("num_nextn_predict_layers", 0, 0),
        "vocab_size": config.num("vocab_size"),
        "max_position_embeddings": config.num("max_position_embeddings"),
        # LlamaConfig's default; configs of tied models (e.g. small Qwen2.5) say true explicitly
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        "torch_dtype": _dtype(config, model_type),
        "attention_bias": bool(config.get("attention_bias", model_type in _QKV_BIAS_TYPES)),
        "gated_mlp": model_type not in _UNGATED_TYPES,
        "model_type": model_type,
        "qk_norm": model_type in _QK_NORM_TYPES or (model_type.startswith("glm") and bool(config.get("use_qk_norm"))),
    }
    fields |= _attention(config, name, layers)
    fields |= _windows(config, name, layers, model_type)
    fields |= _experts(config, name, layers, model_type)
    if model_type == "gpt_oss":  # gpt_oss.py: biases on q/k/v/o, the experts and the router; a sink per head
        fields |= {"o_bias": True, "expert_bias": True, "attention_sinks": True}
    fields |= _quantization(config, quant_config, name, fields)
    return fields


def _dtype(config: _Fields, model_type: str) -> str:
    """The checkpoint's dtype, a name (``torch_dtype``, or transformers' newer ``dtype``); a config without one: vLLM
    reads the weights' (safetensors); GPT-OSS's are bf16 beside the MXFP4 experts."""
    key = "torch_dtype" if config.get("torch_dtype") is not None else "dtype"
    value = config.get(key)
    if value is None:
        return canonical("bfloat16" if model_type == "gpt_oss" else "float32")
    if not isinstance(value, str):
        raise ValueError(f"model {config.model!r}: config.json's {key}={value!r} must be a dtype's name (bfloat16...)")
    try:
        return canonical(value)
    except ValueError as exc:
        raise ValueError(f"model {config.model!r}: config.json's {key}={value!r}: {exc}") from None


def _attention(config: _Fields, name: str, layers: int) -> dict[str, Any]:
    """MLA's fields (DeepSeek-V2/V3, Kimi-K2), or nothing for grouped-query attention."""
    if config.get("kv_lora_rank") is None:
        return {}
    # deepseek_v2.py: a latent of kv_lora_rank; a query through a q_lora_rank bottleneck, or full rank when null
    nope, rope = config.num("qk_nope_head_dim", minimum=0), config.num("qk_rope_head_dim", minimum=0)
    v, heads = config.num("v_head_dim"), config.num("num_attention_heads")
    if nope + rope < 1:
        raise ValueError(f"model {name!r}: config.json's qk_nope_head_dim + qk_rope_head_dim must be >= 1")
    return {
        "kv_lora_rank": config.num("kv_lora_rank"),
        "q_lora_rank": config.num("q_lora_rank", 0),
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v,
        "head_dim": nope + rope,
        "num_key_value_heads": heads,  # the expanded heads; the cache holds one latent (vLLM: 1 KV head)
    }


def _windows(config: _Fields, name: str, layers: int, model_type: str) -> dict[str, Any]:
    """Which layers attend within a window, and how far."""
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise ValueError(f"model {name!r}: layer_types must list num_hidden_layers={layers} entries")
        other = sorted({str(t) for t in types} - set(ATTENTION_LAYER_TYPES))
        if other:
            raise _refuse(name, "layer_types", f"{', '.join(other)} layers")
        windowed = tuple(i for i, t in enumerate(types) if t != "full_attention")
        if not windowed:
            return {}
        key = "sliding_window" if config.get("sliding_window") else "attention_chunk_size"
        if not config.get(key):
            raise ValueError(f"model {name!r}: layer_types has windowed layers but config.json has no sliding_window")
        return {"sliding_window": config.num(key), "window_layers": windowed,
                "chunked_attention": "chunked_attention" in types}  # fmt: skip
    if model_type.startswith("llama4") and config.get("attention_chunk_size"):
        # llama4.py: a layer with RoPE attends within its chunk; no_rope_layers[i] == 0 marks the global (NoPE) ones,
        # by default every 4th (transformers' Llama4TextConfig)
        nope = config.layer_list("no_rope_layers", layers) if config.get("no_rope_layers") else None
        nope = nope or [int((i + 1) % 4 != 0) for i in range(layers)]
        windowed = tuple(i for i in range(layers) if nope[i] != 0)
        return {"sliding_window": config.num("attention_chunk_size"), "window_layers": windowed,
                "chunked_attention": True}  # fmt: skip
    window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
    if window is None or window is False or window == 0:  # null (or 0): every layer attends to everything
        return {}
    return {"sliding_window": config.num("sliding_window")}


def _experts(config: _Fields, name: str, layers: int, model_type: str) -> dict[str, Any]:
    """The MoE fields: routed experts, their width, the shared expert(s) and which layers are MoE."""
    key = next((k for k in ("n_routed_experts", "num_local_experts", "num_experts") if config.get(k) is not None), None)
    experts = config.num(key, minimum=0) if key else 1
    if experts <= 1:  # 0 or 1 routed experts: a dense MLP
        return {}
    k_key = "num_experts_per_tok" if config.get("num_experts_per_tok") is not None else "experts_per_token"
    out: dict[str, Any] = {"num_local_experts": experts, "num_experts_per_tok": config.num(k_key, 1)}
    if config.get("moe_intermediate_size") is not None:
        out["moe_intermediate_size"] = config.num("moe_intermediate_size")

    shared = config.num("n_shared_experts", 0, minimum=0)
    if shared:  # DeepSeek, GLM: n shared experts of the routed width
        out["shared_expert_intermediate_size"] = shared * config.num("moe_intermediate_size")
    elif config.get("shared_expert_intermediate_size") is not None:  # Qwen2-MoE
        out["shared_expert_intermediate_size"] = config.num("shared_expert_intermediate_size", minimum=0)
    if model_type.startswith("llama4"):
        # llama4.py: MoE every interleave_moe_layer_step-th layer; routed and shared experts of intermediate_size,
        # the dense layers of intermediate_size_mlp
        step = config.num("interleave_moe_layer_step", 1)
        if step < 1:
            raise ValueError(f"model {name!r}: interleave_moe_layer_step={step} must be >= 1")
        width = config.num("intermediate_size")
        out |= {"moe_intermediate_size": width, "shared_expert_intermediate_size": width,
                "intermediate_size": config.num("intermediate_size_mlp", width)}  # fmt: skip
        out["moe_layers"] = tuple(i for i in range(layers) if (i + 1) % step == 0)
    elif isinstance(config.get("moe_layer_freq"), list):  # a 0/1 per layer
        mask = config.layer_list("moe_layer_freq", layers)
        if any(m > 1 for m in mask):
            raise ValueError(f"model {name!r}: config.json's moe_layer_freq as a list holds a 0 or 1 per layer")
        out["moe_layers"] = tuple(i for i in range(layers) if mask[i])
    elif config.get("first_k_dense_replace") is not None or config.get("moe_layer_freq") is not None:
        first, freq = config.num("first_k_dense_replace", 0, minimum=0), config.num("moe_layer_freq", 1)
        out["moe_layers"] = tuple(i for i in range(layers) if i >= first and i % freq == 0)  # deepseek_v2.py
    elif config.get("decoder_sparse_step") is not None or config.get("mlp_only_layers"):
        step, dense = config.num("decoder_sparse_step", 1), set(_layer_ids(config, "mlp_only_layers", layers))
        out["moe_layers"] = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)  # qwen3_moe.py
    if "moe_layers" in out and not out["moe_layers"]:
        out |= {"num_local_experts": 1, "num_experts_per_tok": 1, "moe_layers": None}
        out.pop("shared_expert_intermediate_size", None)
    return out


def _layer_ids(config: _Fields, key: str, layers: int) -> list[int]:
    """A list of layer indices (``mlp_only_layers``), each in 0..layers-1."""
    values = config.get(key) or []
    if not isinstance(values, list):
        raise ValueError(f"model {config.model!r}: config.json's {key} must be a list of layer indices")
    ids = [_whole(config.model, f"{key}[{i}]", v, 0) for i, v in enumerate(values)]
    if any(i >= layers for i in ids):
        raise ValueError(f"model {config.model!r}: config.json's {key} names a layer outside 0..{layers - 1}")
    return ids


# ---- the stored weight format -----------------------------------------------------------------------------------


def _quantization(
    config: dict[str, Any], quant_config: dict[str, Any] | None, name: str, fields: dict[str, Any]
) -> dict[str, Any]:
    """``quantization`` and ``unquantized`` from ``quantization_config`` (or ModelOpt's ``hf_quant_config.json``)."""
    qc = config.get("quantization_config")
    if quant_config is not None and isinstance(quant_config.get("quantization"), dict):
        qc = {"quant_method": "modelopt", **quant_config["quantization"]}
    if not qc:
        return {}
    if not isinstance(qc, dict):
        raise ValueError(f"model {name!r}: quantization_config must be an object")
    method = str(qc.get("quant_method", "")).lower()
    fmt = _format(qc, method, name)
    if fmt is None:
        raise ValueError(
            f"model {name!r}: quantization_config's quant_method={method!r} is not a format ferry has bytes for "
            "(fp8, fp8 block-scaled, mxfp4, NVFP4, int4: awq, gptq, compressed-tensors)"
        )
    skipped = []
    for key in ("modules_to_not_convert", "ignore", "exclude_modules", "ignored_layers"):
        patterns = qc.get(key) or []
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise ValueError(
                f"model {name!r}: config.json's quantization_config.{key} must be a list of module names or patterns"
            )
        skipped += patterns
    return {"quantization": fmt, "unquantized": _unquantized_parts(skipped, fields)}


def _format(qc: dict[str, Any], method: str, name: str) -> str | None:
    """ferry's name of a ``quantization_config``'s weight format, or None when ferry has none; ValueError naming a
    field of the wrong type."""
    if method == "fp8":
        return "fp8_block" if qc.get("weight_block_size") else "fp8"
    if method == "mxfp4":
        return "mxfp4"
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        return "int4" if _whole(name, "quantization_config.bits", qc.get("bits", 4), 1) == 4 else None
    if method in ("modelopt", "modelopt_fp4"):
        algo = str(qc.get("quant_algo", "")).upper()
        return {"NVFP4": _FP4, "FP8": "fp8", "FP8_BLOCK": "fp8_block"}.get(algo)
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
            raise ValueError(
                f"model {name!r}: config.json's quantization_config.config_groups must map group names to objects"
            )
        weights = [g.get("weights") or {} for g in groups.values()]
        if not all(isinstance(w, dict) for w in weights):
            raise ValueError(
                f"model {name!r}: config.json's quantization_config.config_groups' weights must be objects"
            )
        if not weights:
            return None
        bits = _whole(name, "quantization_config.config_groups.weights.num_bits", weights[0].get("num_bits", 0), 0)
        kind = str(weights[0].get("type", ""))
        if bits == 4:
            return _FP4 if kind == "float" else "int4"
        if bits == 8 and kind == "float":
            return "fp8_block" if weights[0].get("strategy") == "block" else "fp8"
        if bits == 8:
            return "int8"
    return None


def _matches(module: str, pattern: str) -> bool:
    """vLLM's skip rule for one pattern: a regex (``re:``), a glob, or the module itself or one of its parents;
    patterns may carry a multimodal wrapper's prefix (``language_model.``)."""
    if pattern.startswith("re:"):
        return re.search(pattern[3:], module) is not None
    pattern = pattern.removeprefix("language_model.")
    return fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(module, pattern + ".*")


def _unquantized_parts(skipped: list[str], fields: dict[str, Any]) -> tuple[str, ...]:
    """The parts whose linear layers a checkpoint leaves in its dtype: those whose modules, in a representative layer
    (the last MoE layer; the first dense one), a skip pattern names."""
    if not skipped:
        return ()
    layers = fields["num_hidden_layers"]
    moe = fields.get("moe_layers")
    moe_layer = (moe[-1] if moe else layers - 1) if fields.get("num_local_experts", 1) > 1 else layers - 1
    dense = [i for i in range(layers) if moe is None or i not in moe] if fields.get("num_local_experts", 1) > 1 else [0]
    dense_layer = dense[0] if dense else 0
    attn = "q_b_proj" if fields.get("kv_lora_rank") else "q_proj"
    modules = {
        "attention": [f"model.layers.{moe_layer}.self_attn.{attn}", f"model.layers.{moe_layer}.self_attn.o_proj"],
        "dense_mlp": [f"model.layers.{dense_layer}.mlp.gate_proj", f"model.layers.{dense_layer}.mlp.down_proj"],
        "experts": [f"model.layers.{moe_layer}.mlp.experts.0.gate_proj", f"model.layers.{moe_layer}.mlp.experts"],
        "shared_experts": [
            f"model.layers.{moe_layer}.mlp.shared_experts.gate_proj",
            f"model.layers.{moe_layer}.mlp.shared_expert.gate_proj",
        ],  # fmt: skip
    }
    return tuple(part for part, names in modules.items() if any(_matches(m, p) for m in names for p in skipped))
