"""Model specs: a Hugging Face ``config.json`` reduced to the shapes the cost model needs, and what follows from them.

A decoder-only transformer of ``L`` layers, hidden size ``H``, ``n_q`` query heads and ``n_kv`` KV heads (GQA) of size
``d``, MLP intermediate size ``I`` (per expert for MoE) and vocabulary ``V``. Per layer it holds
- attention: Q ``H x n_q d``, K and V ``H x n_kv d`` each, O ``n_q d x H`` (+ q/k/v biases for Qwen2);
- MLP: gate and up ``H x I`` and down ``I x H`` when gated (SwiGLU), else up and down; MoE: ``E`` such experts and a
  router ``H x E``;
- two RMSNorm weight vectors of ``H``;
and once: the embedding ``V x H``, the final norm ``H`` and the LM head ``H x V`` (shared with the embedding if tied).
Counts are parameters (elements); bytes follow from the dtypes (``costmodel.dtypes``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costmodel.dtypes import DTYPE_BYTES, Dtypes, auto_dtype, canonical

MODELS_DIR = Path(__file__).with_name("models")

# model types whose MLP is a plain up/activation/down (no gate); everything else is treated as gated (SwiGLU-style)
_UNGATED_TYPES = frozenset({"gpt2", "gpt_neox", "gptj", "phi", "opt", "falcon", "bloom", "gpt_bigcode", "starcoder2"})
# model types with q/k/v biases when the config does not say (Qwen2 has them without an ``attention_bias`` field)
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe"})


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The shapes of a decoder-only transformer, as Hugging Face ``config.json`` names them."""

    name: str
    hidden_size: int  # H
    num_hidden_layers: int  # L
    num_attention_heads: int  # n_q, query heads
    num_key_value_heads: int  # n_kv, KV heads (== n_q for MHA, fewer for GQA)
    head_dim: int  # d, per head
    intermediate_size: int  # I, MLP width (per expert for MoE)
    vocab_size: int  # V
    max_position_embeddings: int  # longest sequence the model was built for (tokens)
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    torch_dtype: str = "bfloat16"  # the checkpoint's dtype (what ``--dtype auto`` uses)
    num_local_experts: int = 1  # E; 1 for a dense MLP
    num_experts_per_tok: int = 1  # k, experts each token is routed to
    attention_bias: bool = False  # q/k/v projections carry biases
    gated_mlp: bool = True  # gate*up (SwiGLU) rather than a plain up projection
    sliding_window: int | None = None  # attention sees at most this many tokens back (Mistral-7B-v0.1: 4096)
    model_type: str = "llama"

    def __post_init__(self) -> None:
        for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"):
            if getattr(self, field) < 1:
                raise ValueError(f"model {self.name!r}: {field} must be >= 1, got {getattr(self, field)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"model {self.name!r}: num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError(
                f"model {self.name!r}: num_experts_per_tok={self.num_experts_per_tok} must be in "
                f"[1, num_local_experts={self.num_local_experts}]"
            )

    # ----------------------------------------------------------------------------------------------------------------
    # shapes

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 1

    @property
    def q_size(self) -> int:
        """Width of the query projection, n_q * d (elements per token)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (or the value) projection, n_kv * d (elements per token)."""
        return self.num_key_value_heads * self.head_dim

    # ----------------------------------------------------------------------------------------------------------------
    # parameters (elements)

    def param_counts(self) -> dict[str, int]:
        """Parameters by part, whole model (all layers, all experts): the parts ``num_params`` adds up."""
        h, n_layers = self.hidden_size, self.num_hidden_layers
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h  # Q, K, V, O matrices
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        mlp_mats = 3 if self.gated_mlp else 2  # gate, up, down (or up, down)
        expert = mlp_mats * h * self.intermediate_size
        mlp = self.num_local_experts * expert + (h * self.num_local_experts if self.is_moe else 0)  # + router
        return {
            "embedding": self.vocab_size * h,
            "attention": n_layers * attn,
            "mlp": n_layers * mlp,
            "norms": n_layers * 2 * h + h,  # two RMSNorms per layer and the final one
            "lm_head": 0 if self.tie_word_embeddings else self.vocab_size * h,
        }

    def num_params(self) -> int:
        """Parameters of the whole model (elements), as model cards count them."""
        return sum(self.param_counts().values())

    def num_active_params(self) -> int:
        """Parameters a token passes through: for MoE, the top-k experts only (elements)."""
        if not self.is_moe:
            return self.num_params()
        counts = self.param_counts()
        per_expert = (counts["mlp"] - self.num_hidden_layers * self.hidden_size * self.num_local_experts) // (
            self.num_local_experts
        )
        unused = per_expert * (self.num_local_experts - self.num_experts_per_tok)
        return self.num_params() - unused

    def quantizable_params(self) -> int:
        """Weight-matrix elements of the transformer blocks' linear layers (q/k/v/o, MLP or experts): what weight
        quantization compresses. Biases, norms, the MoE router, the embedding and the LM head stay unquantized, as in
        vLLM's fp8/int8/AWQ/GPTQ paths."""
        h, n_layers = self.hidden_size, self.num_hidden_layers
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        mlp = self.num_local_experts * (3 if self.gated_mlp else 2) * h * self.intermediate_size
        return n_layers * (attn + mlp)

    # ----------------------------------------------------------------------------------------------------------------
    # bytes

    def weight_bytes(self, dtypes: Dtypes | None = None) -> float:
        """Bytes of all weights, whole model (B): the quantizable matrices in the weight format, the rest (embedding, LM
        head, norms, biases, router) in the activation format."""
        dtypes = dtypes or Dtypes.resolve(self.torch_dtype)
        quantizable = self.quantizable_params()
        rest = self.num_params() - quantizable
        return quantizable * dtypes.weight_bytes + rest * dtypes.activation_bytes

    def kv_bytes_per_token(self, kv_dtype: str = "auto") -> float:
        """KV-cache bytes one token occupies, whole model: 2 (K and V) x L x n_kv x d x bytes per element.

        Llama-3-8B in bf16: 2 x 32 x 8 x 128 x 2 = 131072 B = 128 KiB; Llama-2-7B (MHA, 32 KV heads): 512 KiB.
        """
        dt = auto_dtype(self.torch_dtype) if kv_dtype == "auto" else canonical(kv_dtype)
        return 2 * self.num_hidden_layers * self.kv_size * DTYPE_BYTES[dt]

    # ----------------------------------------------------------------------------------------------------------------
    # construction

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str) -> ModelSpec:
        """Read the fields of a Hugging Face ``config.json`` (already parsed); ValueError naming a missing field."""
        if "text_config" in config and "hidden_size" not in config:  # multimodal wrappers keep the LM inside
            config = config["text_config"]

        def need(key: str) -> Any:
            if key not in config:
                raise ValueError(f"model {name!r}: config.json has no {key!r}")
            return config[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        model_type = str(config.get("model_type", "llama"))
        window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
        experts = config.get("num_local_experts") or config.get("num_experts") or 1
        return cls(
            name=name,
            hidden_size=hidden,
            num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(need("intermediate_size")),
            vocab_size=int(need("vocab_size")),
            max_position_embeddings=int(need("max_position_embeddings")),
            # LlamaConfig's default; configs of tied models (e.g. small Qwen2.5) say true explicitly
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            torch_dtype=canonical(config.get("torch_dtype") or config.get("dtype") or "float32"),
            num_local_experts=int(experts),
            num_experts_per_tok=int(config.get("num_experts_per_tok", 1)) if experts > 1 else 1,
            attention_bias=bool(config.get("attention_bias", model_type in _QKV_BIAS_TYPES)),
            gated_mlp=model_type not in _UNGATED_TYPES,
            sliding_window=int(window) if window else None,
            model_type=model_type,
        )


def builtin_models() -> list[str]:
    """Names of the built-in model configs (``costmodel/models/*.json``)."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def _builtin_path(name: str) -> Path | None:
    key = name.strip().lower()
    for path in MODELS_DIR.glob("*.json"):
        if path.stem.lower() == key:
            return path
    for path in MODELS_DIR.glob("*.json"):  # a Hugging Face id: "meta-llama/Meta-Llama-3-8B"
        hf_id = str(json.loads(path.read_text()).get("_name_or_path", "")).lower()
        if key in (hf_id, hf_id.rsplit("/", 1)[-1]):
            return path
    return None


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in model by name (case-insensitive, or its Hugging Face id) or a ``config.json`` by path."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        name = path.parent.name if path.name == "config.json" else path.stem
    else:
        found = _builtin_path(name_or_path)
        if found is None:
            raise ValueError(
                f"unknown model {name_or_path!r}: not a file, and not a built-in "
                f"(built-ins: {', '.join(builtin_models())}); pass the path of a Hugging Face config.json"
            )
        path, name = found, found.stem
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return ModelSpec.from_hf_config(config, name)
