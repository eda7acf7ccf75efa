"""Model specs: a Hugging Face ``config.json`` reduced to the shapes the cost model needs, and what follows from them.

A decoder-only transformer of ``L`` layers, hidden size ``H`` and vocabulary ``V``. Each layer has an attention block
and an MLP block:

- attention, either grouped-query (GQA/MHA: ``n_q`` query heads and ``n_kv`` KV heads of size ``d``; Q ``H x n_q d``,
  K and V ``H x n_kv d`` each, O ``n_q d x H``, + q/k/v biases for Qwen2 and GPT-OSS, + a per-head RMSNorm of q and k
  for Qwen3 and Llama-4, + one learned sink logit per head for GPT-OSS) or multi-head latent attention (MLA,
  DeepSeek-V2/V3, Kimi-K2: the query through a rank-``q_lora`` bottleneck ``H x q_lora``, ``q_lora x n_q (d_nope +
  d_rope)``; keys and values through one latent ``H x (kv_lora + d_rope)``, expanded by ``kv_lora x n_q (d_nope +
  d_v)``; O ``n_q d_v x H``; the KV cache holds the latent and the rotary key, ``kv_lora + d_rope`` elements per token
  per layer, shared by all heads);
- an MLP, either dense (gate and up ``H x I`` and down ``I x H`` when gated (SwiGLU), else up and down) or a mixture
  of experts (MoE): ``E`` routed experts of width ``I_e`` of which each token takes ``k``, a router ``H x E``, and
  optionally shared experts every token passes through (DeepSeek's ``n_shared_experts``, Llama-4's shared expert).
  DeepSeek keeps its first ``first_k_dense_replace`` layers dense, Llama-4 Maverick every other one
  (``interleave_moe_layer_step``), Qwen3-MoE those in ``mlp_only_layers``;
- two RMSNorm weight vectors of ``H``;
and once: the embedding ``V x H``, the final norm ``H`` and the LM head ``H x V`` (shared with the embedding if tied).

Some layers may attend within a window: Mistral-7B's every layer (4096 tokens back), GPT-OSS's every other layer
(``layer_types``: 128 tokens back), Llama-4's three of every four layers (within chunks of ``attention_chunk_size``
tokens). Counts are parameters (elements); bytes follow from the dtypes (``costmodel.dtypes``), each part in its
stored format (``quantization``: a checkpoint's ``quantization_config``, and the parts it leaves unquantized).
Reading a config, and what ferry refuses, is ``costmodel.hf_config``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from costmodel.dtypes import DTYPE_BYTES, Dtypes, auto_dtype, canonical

MODELS_DIR = Path(__file__).with_name("models")

# weight formats vLLM does not make from an unquantized checkpoint at load (it has no scales for them): only a
# checkpoint quantized offline holds them (``vllm/model_executor/layers/quantization/modelopt.py``, ``mxfp4.py``)
OFFLINE_ONLY = ("nvfp4", "mxfp4")
# the parts of a layer a checkpoint may store in different formats (``ModelSpec.unquantized`` names them)
PARTS = ("attention", "dense_mlp", "experts", "shared_experts")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The shapes of a decoder-only transformer, as Hugging Face ``config.json`` names them."""

    name: str
    hidden_size: int  # H
    num_hidden_layers: int  # L
    num_attention_heads: int  # n_q, query heads
    num_key_value_heads: int  # n_kv, KV heads (== n_q for MHA, fewer for GQA; MLA: n_q, the expanded heads)
    head_dim: int  # d, per head (MLA: the query/key head, d_nope + d_rope)
    intermediate_size: int  # I, the dense MLP's width (and each expert's, unless moe_intermediate_size says)
    vocab_size: int  # V
    max_position_embeddings: int  # longest sequence the model was built for (tokens)
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    torch_dtype: str = "bfloat16"  # the checkpoint's dtype (what ``--dtype auto`` uses)
    num_local_experts: int = 1  # E, routed experts per MoE layer; 1 for a dense MLP
    num_experts_per_tok: int = 1  # k, routed experts each token goes to
    attention_bias: bool = False  # q/k/v projections carry biases
    gated_mlp: bool = True  # gate*up (SwiGLU) rather than a plain up projection
    sliding_window: int | None = None  # windowed layers see at most this many tokens back (Mistral-7B-v0.1: 4096)
    model_type: str = "llama"
    # multi-head latent attention (0: grouped-query attention)
    kv_lora_rank: int = 0  # width of the latent the KV cache holds (DeepSeek-V3: 512)
    q_lora_rank: int = 0  # width of the query's bottleneck (DeepSeek-V3: 1536; 0: a full-rank query projection)
    qk_rope_head_dim: int = 0  # rotary part of each query/key head, cached beside the latent (64)
    qk_nope_head_dim: int = 0  # non-rotary part of each query/key head (128)
    v_head_dim: int = 0  # value head size (128; 0: head_dim)
    # attention details
    qk_norm: bool = False  # RMSNorm of each query and key head (head_dim weights each; Qwen3, Llama-4)
    attention_sinks: bool = False  # one learned logit per query head in the softmax (GPT-OSS); no KV, ~no FLOPs
    o_bias: bool = False  # the output projection has a bias too (GPT-OSS)
    window_layers: tuple[int, ...] | None = None  # layers attending within sliding_window (None: all when it is set)
    chunked_attention: bool = False  # the window is a fixed chunk (Llama-4's attention_chunk_size), not sliding
    # mixture of experts
    moe_intermediate_size: int = 0  # I_e, one routed expert's width (0: intermediate_size, as Mixtral)
    moe_layers: tuple[int, ...] | None = None  # layers whose MLP is MoE (None: all of them when E > 1)
    shared_expert_intermediate_size: int = 0  # width of the shared expert(s) of each MoE layer, all together (0: none)
    expert_bias: bool = False  # experts and router carry biases (GPT-OSS)
    # multi-token-prediction modules the checkpoint ships (DeepSeek-V3: 1); loaded only as a speculative drafter
    num_nextn_predict_layers: int = 0
    # weights as the checkpoint stores them
    quantization: str | None = None  # the checkpoint's weight format (fp8_block, fp8, mxfp4, nvfp4, int4); None: dtype
    unquantized: tuple[str, ...] = ()  # parts (``PARTS``) the checkpoint keeps in torch_dtype

    def __post_init__(self) -> None:
        for field in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                      "intermediate_size", "vocab_size", "max_position_embeddings", "num_local_experts"):  # fmt: skip
            if getattr(self, field) < 1:
                raise ValueError(f"model {self.name!r}: {field} must be >= 1, got {getattr(self, field)}")
        for field in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                      "moe_intermediate_size", "shared_expert_intermediate_size"):  # fmt: skip
            if getattr(self, field) < 0:
                raise ValueError(f"model {self.name!r}: {field} must be >= 0, got {getattr(self, field)}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"model {self.name!r}: sliding_window must be >= 1 (None: no window), got "
                             f"{self.sliding_window}")  # fmt: skip
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
        for field, layers in (("window_layers", self.window_layers), ("moe_layers", self.moe_layers)):
            if layers is not None and any(not 0 <= i < self.num_hidden_layers for i in layers):
                raise ValueError(f"model {self.name!r}: {field} names a layer outside 0..{self.num_hidden_layers - 1}")
        if self.window_layers and not self.sliding_window:
            raise ValueError(f"model {self.name!r}: window_layers given without a sliding_window")
        bad = [p for p in self.unquantized if p not in PARTS]
        if bad:
            raise ValueError(f"model {self.name!r}: unquantized names unknown parts {bad}; parts: {', '.join(PARTS)}")

    # ----------------------------------------------------------------------------------------------------------------
    # shapes

    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 1

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2)."""
        return self.kv_lora_rank > 0

    @property
    def q_size(self) -> int:
        """Width of the query projection, n_q * d (elements per token)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (or the value) projection, n_kv * d (elements per token; GQA)."""
        return self.num_key_value_heads * self.head_dim

    @property
    def value_head_dim(self) -> int:
        """Size of one value head (MLA's v_head_dim; head_dim otherwise)."""
        return self.v_head_dim or self.head_dim

    @property
    def o_size(self) -> int:
        """Width of the output projection's input, n_q * d_v (elements per token)."""
        return self.num_attention_heads * self.value_head_dim

    @property
    def latent_size(self) -> int:
        """MLA: what the KV cache holds per token per layer, the latent and the rotary key (elements)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def expert_size(self) -> int:
        """Width of one routed expert, I_e."""
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def moe_layer_ids(self) -> tuple[int, ...]:
        """The layers whose MLP is a mixture of experts."""
        if not self.is_moe:
            return ()
        return tuple(range(self.num_hidden_layers)) if self.moe_layers is None else self.moe_layers

    @property
    def window_layer_ids(self) -> tuple[int, ...]:
        """The layers that attend within ``sliding_window`` tokens."""
        if not self.sliding_window:
            return ()
        return tuple(range(self.num_hidden_layers)) if self.window_layers is None else self.window_layers

    @property
    def hybrid_attention(self) -> bool:
        """Some layers attend within a window and others to everything (GPT-OSS, Llama-4)."""
        return 0 < len(self.window_layer_ids) < self.num_hidden_layers

    def kv_charged(self, layer: int) -> bool:
        """Whether a layer's KV is charged per token in the KV cache: every layer, except in a model of sliding
        windows and full layers, where vLLM's hybrid KV cache manager keeps a sliding layer's blocks only within its
        window (``vllm/v1/core/single_type_kv_cache_manager.py``, ``SlidingWindowManager``), at most
        ``ceil((window - 1) / block) + 1`` blocks a request, which ferry leaves uncharged (docs/concepts/kv-cache.md
        section). Llama-4's chunked layers hold a whole chunk (8192 tokens): charged like full ones."""
        return not (self.hybrid_attention and not self.chunked_attention and layer in self.window_layer_ids)

    # ----------------------------------------------------------------------------------------------------------------
    # parameters (elements)

    def attention_params(self) -> int:
        """Parameters of one layer's attention block: its projections, their biases, its q/k norms and sinks."""
        h, n = self.hidden_size, self.num_attention_heads
        if self.is_mla:
            qk = self.head_dim  # d_nope + d_rope
            q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * n * qk if self.q_lora_rank else h * n * qk
            up = self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
            kv = h * self.latent_size + self.kv_lora_rank + up
            return q + kv + self.o_size * h
        params = h * (self.q_size + 2 * self.kv_size) + self.o_size * h
        if self.attention_bias:
            params += self.q_size + 2 * self.kv_size
        if self.o_bias:
            params += h
        if self.qk_norm:
            params += 2 * self.head_dim
        if self.attention_sinks:
            params += n
        return params

    def dense_mlp_params(self) -> int:
        """Parameters of one dense MLP block."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size

    def expert_params(self) -> int:
        """Parameters of one routed expert (its biases too)."""
        mats = (3 if self.gated_mlp else 2) * self.hidden_size * self.expert_size
        bias = (2 * self.expert_size + self.hidden_size) if self.expert_bias else 0
        return mats + bias

    def router_params(self) -> int:
        """Parameters of one MoE layer's router, H x E (+ E biases)."""
        return self.hidden_size * self.num_local_experts + (self.num_local_experts if self.expert_bias else 0)

    def shared_expert_params(self) -> int:
        """Parameters of one MoE layer's shared expert(s)."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.shared_expert_intermediate_size

    def param_counts(self) -> dict[str, int]:
        """Parameters by part, whole model (all layers, all experts): the parts ``num_params`` adds up."""
        h, n_layers = self.hidden_size, self.num_hidden_layers
        n_moe = len(self.moe_layer_ids)
        moe = self.num_local_experts * self.expert_params() + self.router_params() + self.shared_expert_params()
        return {
            "embedding": self.vocab_size * h,
            "attention": n_layers * self.attention_params(),
            "mlp": (n_layers - n_moe) * self.dense_mlp_params() + n_moe * moe,
            "norms": n_layers * 2 * h + h,  # two RMSNorms per layer and the final one
            "lm_head": 0 if self.tie_word_embeddings else self.vocab_size * h,
        }

    def num_params(self) -> int:
        """Parameters of the whole model (elements), as model cards count them."""
        return sum(self.param_counts().values())

    def num_active_params(self) -> int:
        """Parameters a token passes through: for MoE, the top-k routed experts only (elements)."""
        unused = self.expert_params() * (self.num_local_experts - self.num_experts_per_tok)
        return self.num_params() - len(self.moe_layer_ids) * unused

    def part_params(self) -> dict[str, int]:
        """Weight-matrix elements of the transformer blocks' linear layers by part (``PARTS``), whole model: what
        weight quantization compresses. Biases, norms, sinks, the MoE router, the embedding and the LM head stay
        unquantized, as in vLLM's fp8/int8/AWQ/GPTQ/MXFP4 paths (GPT-OSS's expert biases stay bf16)."""
        h, n_layers = self.hidden_size, self.num_hidden_layers
        n_moe = len(self.moe_layer_ids)
        if self.is_mla:
            n, qk = self.num_attention_heads, self.head_dim
            q = h * self.q_lora_rank + self.q_lora_rank * n * qk if self.q_lora_rank else h * n * qk
            attn = q + h * self.latent_size + self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
            attn += self.o_size * h
        else:
            attn = h * (self.q_size + 2 * self.kv_size) + self.o_size * h
        expert = (3 if self.gated_mlp else 2) * h * self.expert_size
        return {
            "attention": n_layers * attn,
            "dense_mlp": (n_layers - n_moe) * self.dense_mlp_params(),
            "experts": n_moe * self.num_local_experts * expert,
            "shared_experts": n_moe * self.shared_expert_params(),
        }

    def quantizable_params(self) -> int:
        """Weight-matrix elements of the transformer blocks' linear layers, all parts (``part_params``)."""
        return sum(self.part_params().values())

    # ----------------------------------------------------------------------------------------------------------------
    # formats and bytes

    def part_formats(self, dtypes: Dtypes) -> dict[str, str]:
        """The format each part's weights are held in: the quantization's (the checkpoint's or ``--quantization``)
        for the parts it covers, the activation format for the parts the checkpoint leaves unquantized."""
        if dtypes.quantization is None:
            return dict.fromkeys(PARTS, dtypes.activation)
        return {p: dtypes.activation if p in self.unquantized else dtypes.weight for p in PARTS}

    def weight_bytes(self, dtypes: Dtypes | None = None) -> float:
        """Bytes of all weights, whole model (B): each part's linear layers in its format (``part_formats``), the rest
        (embedding, LM head, norms, biases, sinks, router) in the activation format."""
        dtypes = dtypes or self.dtypes()
        parts = self.part_params()
        formats = self.part_formats(dtypes)
        rest = self.num_params() - sum(parts.values())
        return sum(n * DTYPE_BYTES[formats[p]] for p, n in parts.items()) + rest * dtypes.activation_bytes

    def dtypes(
        self, dtype: str | None = None, kv_cache_dtype: str | None = None, quantization: str | None = None
    ) -> Dtypes:
        """The formats of a deployment of this model: vLLM's flags against the config (``--quantization`` must agree
        with a quantized checkpoint's own format, as vLLM checks: ``vllm/config/model.py``,
        ``_verify_quantization``)."""
        if quantization is not None and quantization.strip().lower() in ("", "none"):
            quantization = None
        if quantization is not None and self.quantization is None and canonical(quantization) in OFFLINE_ONLY:
            raise ValueError(
                f"quantization={quantization!r}: vLLM loads {canonical(quantization)} weights only from a checkpoint "
                f"quantized offline (its config.json's quantization_config), and {self.name}'s holds "
                f"{self.torch_dtype}; give such a checkpoint's config.json, or --quantization fp8 (quantized online)"
            )
        if quantization is not None and self.quantization is not None:
            if canonical(quantization) != self.quantization:
                raise ValueError(
                    f"quantization={quantization!r}: {self.name}'s checkpoint is quantized as {self.quantization} "
                    "(its config's quantization_config); leave --quantization out or give that"
                )
        return Dtypes.resolve(self.torch_dtype, dtype, kv_cache_dtype, quantization or self.quantization)

    def kv_layers(self) -> int:
        """Layers whose KV cache grows with every token (``kv_charged``)."""
        return sum(self.kv_charged(i) for i in range(self.num_hidden_layers))

    def kv_elements_per_layer(self) -> int:
        """KV-cache elements one token adds to one layer: MLA's latent and rotary key (one copy, shared by all heads),
        else K and V of every KV head."""
        return self.latent_size if self.is_mla else 2 * self.kv_size

    def kv_bytes_per_token(self, kv_dtype: str = "auto") -> float:
        """KV-cache bytes one token occupies, whole model: the charged layers (``kv_charged``) x elements per layer x
        bytes per element.

        Llama-3-8B in bf16: 2 x 32 x 8 x 128 x 2 = 131072 B = 128 KiB; Llama-2-7B (MHA, 32 KV heads): 512 KiB;
        DeepSeek-V3 (MLA): 61 x (512 + 64) x 2 = 70272 B; GPT-OSS-120B: its 18 full layers, 18 x 2 x 8 x 64 x 2 =
        36864 B.
        """
        dt = auto_dtype(self.torch_dtype) if kv_dtype == "auto" else canonical(kv_dtype)
        return self.kv_layers() * self.kv_elements_per_layer() * DTYPE_BYTES[dt]

    # ----------------------------------------------------------------------------------------------------------------
    # construction

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str, quant_config: dict[str, Any] | None = None) -> ModelSpec:
        """Read a Hugging Face ``config.json`` (already parsed; ``quant_config``: a ``hf_quant_config.json`` beside
        it, NVIDIA ModelOpt's); ValueError naming a missing or unsupported field (``costmodel.hf_config``)."""
        from costmodel.hf_config import spec_fields

        return cls(**spec_fields(config, name, quant_config))


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


def _read_json(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in model by name (case-insensitive, or its Hugging Face id) or a ``config.json`` by path (a folder's
    ``hf_quant_config.json`` beside it is read too, as vLLM reads ModelOpt's)."""
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
    config = _read_json(path)
    quant_path = path.with_name("hf_quant_config.json")
    quant = _read_json(quant_path) if path.name == "config.json" and quant_path.is_file() else None
    return ModelSpec.from_hf_config(config, name, quant)
