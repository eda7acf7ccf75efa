"""How one model instance is split over GPUs, as vLLM's flags name it, and what one GPU then holds and computes.

``Parallelism`` is vLLM's ``--tensor-parallel-size`` (tp), ``--pipeline-parallel-size`` (pp),
``--data-parallel-size`` (dp) and ``--enable-expert-parallel``, with vLLM 0.32.0's rules:

- attention, dense MLPs, shared experts, the vocabulary: split over the tp GPUs of a rank (heads, widths; KV heads
  replicated when tp exceeds them; MLA's latent is one head, so every GPU of a rank caches all of it,
  ``vllm/config/model.py`` ``get_num_kv_heads``); MLA's query and latent down-projections are replicated
  (``vllm/model_executor/models/deepseek_v2.py``);
- layers: split over pp stages as ``vllm/distributed/utils.py`` ``get_pp_indices`` does (the remainder to the
  stages before the last), the embedding on the first, the final norm and LM head on the last;
- MoE layers span tp x dp GPUs (``vllm/model_executor/layers/fused_moe/config.py``, ``FusedMoEParallelConfig.make``):
  without expert parallelism each expert's width is split over all of them (tp flattened across dp); with it each
  GPU holds whole experts, E / (tp x dp) of them (the first ranks one more when they do not divide);
- dp ranks are engines of their own, each with its scheduler and KV cache (ferry simulates each as a replica of the
  cluster); with MoE layers they meet in every MoE layer, where each GPU computes the tokens of all ranks.

``Layout`` is what one GPU of a rank holds (its stage's layers, its shares of each matrix, in each part's stored
format) and the per-GPU shapes the formulas read (``consts``, ``costmodel.work``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from costmodel import work as k
from costmodel.dtypes import DTYPE_BYTES, Dtypes
from costmodel.model_spec import ModelSpec

# block-scaled fp8 keeps one scale per 128 x 128 weights: a split must keep whole blocks (vLLM refuses otherwise,
# ``vllm/model_executor/layers/quantization/fp8.py``, "is not divisible by weight quantization block_n")
FP8_BLOCK = 128


@dataclass(frozen=True, slots=True)
class Parallelism:
    """vLLM's parallel layout of one served model."""

    tp: int = 1  # --tensor-parallel-size: GPUs each layer's matrices are split over
    pp: int = 1  # --pipeline-parallel-size: stages the layers are split into
    dp: int = 1  # --data-parallel-size: ranks, each its own engine; MoE layers span them
    expert_parallel: bool = False  # --enable-expert-parallel: MoE layers hold whole experts per GPU

    def __post_init__(self) -> None:
        for field in ("tp", "pp", "dp"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field}={getattr(self, field)} must be >= 1")

    @property
    def moe_gpus(self) -> int:
        """GPUs one MoE layer spans: tp x dp."""
        return self.tp * self.dp

    @property
    def ep(self) -> int:
        """Expert-parallel size: tp x dp with expert parallelism (and more than one GPU), else 1."""
        return self.moe_gpus if self.expert_parallel and self.moe_gpus > 1 else 1

    @property
    def moe_tp(self) -> int:
        """GPUs each expert's width is split over: tp x dp without expert parallelism, else 1."""
        return 1 if self.ep > 1 else self.moe_gpus

    @property
    def gpus_per_rank(self) -> int:
        """GPUs of one data-parallel rank (one engine): tp x pp."""
        return self.tp * self.pp

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def flags(self) -> str:
        """The layout as vLLM's command line writes it (flags at their defaults left out)."""
        parts = [f"--tensor-parallel-size {self.tp}"]
        if self.pp > 1:
            parts.append(f"--pipeline-parallel-size {self.pp}")
        if self.dp > 1:
            parts.append(f"--data-parallel-size {self.dp}")
        if self.expert_parallel:
            parts.append("--enable-expert-parallel")
        return " ".join(parts)

    def describe(self) -> str:
        text = f"tp={self.tp}"
        if self.pp > 1:
            text += f", pp={self.pp}"
        if self.dp > 1:
            text += f", dp={self.dp}"
        if self.ep > 1:
            text += f", ep={self.ep}"
        return text


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """The layers of each pipeline stage, as vLLM splits them (``get_pp_indices``: even, the remainder to the stages
    before the last, the last first)."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:s]) for s in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def check(model: ModelSpec, par: Parallelism, formats: dict[str, str]) -> None:
    """Refuse a layout vLLM refuses, in one line naming the flag and the model's field."""
    name = model.name
    if model.num_attention_heads % par.tp:
        raise ValueError(f"tp={par.tp} does not divide {name}'s num_attention_heads={model.num_attention_heads}")
    nkv = model.num_key_value_heads
    if not model.is_mla and nkv % par.tp and par.tp % nkv:
        raise ValueError(f"tp={par.tp} and {name}'s num_key_value_heads={nkv}: neither divides the other")
    if par.pp > model.num_hidden_layers:
        raise ValueError(
            f"pipeline_parallel_size={par.pp} is more than {name}'s num_hidden_layers={model.num_hidden_layers}"
        )
    if par.expert_parallel and not model.is_moe:
        raise ValueError(f"enable_expert_parallel: {name} has no experts (a dense model); leave it out")
    if par.ep > model.num_local_experts:
        raise ValueError(
            f"enable_expert_parallel over {par.ep} GPUs (tensor x data parallel): more GPUs than {name}'s "
            f"{model.num_local_experts} experts"
        )
    widths = [("intermediate_size", model.intermediate_size, par.tp, "dense_mlp")]
    if model.is_moe:
        widths.append(("moe_intermediate_size", model.expert_size, par.moe_tp, "experts"))
        if model.shared_expert_intermediate_size:
            widths.append(("shared_expert_intermediate_size", model.shared_expert_intermediate_size, par.tp,
                           "shared_experts"))  # fmt: skip
    for field, width, split, part in widths:
        if width % split:
            raise ValueError(f"{name}'s {field}={width} does not split over {split} GPUs ({par.describe()})")
        if formats[part] == "fp8_block" and (width // split) % FP8_BLOCK:
            hint = "; use --enable-expert-parallel" if part == "experts" and not par.expert_parallel else ""
            raise ValueError(
                f"{name}'s {field}={width} split over {split} GPUs ({par.describe()}) is {width // split} wide, not a "
                f"multiple of the fp8 block of {FP8_BLOCK} its block-scaled weights need{hint}"
            )


class Layout:
    """What one GPU of a rank holds and computes: its shares of each matrix, in each part's format."""

    def __init__(self, model: ModelSpec, par: Parallelism, dtypes: Dtypes) -> None:
        self.model, self.par, self.dtypes = model, par, dtypes
        self.formats = model.part_formats(dtypes)
        check(model, par, self.formats)
        m, tp = model, par.tp
        self.heads = m.num_attention_heads // tp  # query heads on this GPU
        self.kv_heads = max(m.num_key_value_heads // tp, 1)  # KV heads (replicated when tp exceeds them)
        if m.is_mla:
            self.q = float(self.heads * m.head_dim)
            self.kv = float(m.latent_size)  # one latent per token, every GPU of the rank (MQA in decode)
            down = (m.q_lora_rank if m.q_lora_rank else self.heads * m.head_dim) + m.latent_size
            self.qkv_n, self.q_up = float(down), float(m.q_lora_rank)
        else:
            self.q = float(self.heads * m.head_dim)
            self.kv = float(self.kv_heads * m.head_dim)
            self.qkv_n, self.q_up = self.q + 2.0 * self.kv, 0.0
        self.o_in = float(self.heads * m.value_head_dim)
        self.mlp = m.intermediate_size / tp  # dense MLP width on this GPU
        self.vocab = float(math.ceil(m.vocab_size / tp))  # vLLM's vocab-parallel embedding and LM head
        self.local_experts = math.ceil(m.num_local_experts / par.ep) if m.is_moe else 0
        self.moe_i = m.expert_size / par.moe_tp if m.is_moe else 0.0
        self.shared_i = m.shared_expert_intermediate_size / tp
        self.stages = stage_layers(m.num_hidden_layers, par.pp)

    # ----------------------------------------------------------------------------------------------------------------
    # what the formulas read

    def consts(self) -> dict[int, float]:
        """The model's and layout's entries of ``consts`` (``costmodel.work``'s indices); the device's are added by
        ``CostModel``."""
        m, par, dt = self.model, self.par, self.dtypes
        b = {p: DTYPE_BYTES[f] for p, f in self.formats.items()}
        windowed = m.hybrid_attention
        out = {
            k.H: float(m.hidden_size), k.Q: self.q, k.KV: self.kv, k.MLP: self.mlp, k.V: self.vocab,
            k.E: float(m.num_local_experts), k.K: float(m.num_experts_per_tok), k.MOE: float(m.is_moe),
            k.GATED: float(m.gated_mlp), k.BIAS: float(m.attention_bias), k.A: dt.activation_bytes,
            k.W: b["attention"], k.C: dt.kv_bytes,
            k.WINDOW: float(m.sliding_window or 0) if m.sliding_window and not windowed else -1.0,
            k.QKV_N: self.qkv_n, k.Q_UP: self.q_up, k.O_IN: self.o_in, k.MLA: float(m.is_mla),
            k.NH: float(self.heads) if m.is_mla else 0.0, k.LAT: float(m.kv_lora_rank),
            k.ROPE: float(m.qk_rope_head_dim), k.NOPE: float(m.qk_nope_head_dim), k.DV: float(m.value_head_dim),
            k.WINDOW2: float(m.sliding_window or 0) if windowed else -1.0, k.CHUNKED: float(m.chunked_attention),
            k.MOE_I: self.moe_i, k.E_LOCAL: float(self.local_experts),
            k.MOE_TOKENS: float(par.dp) if m.is_moe else 0.0, k.SH_I: self.shared_i,
            k.W_MLP: b["dense_mlp"], k.W_EXP: b["experts"], k.W_SH: b["shared_experts"],
            # an all-gather before and a reduce-scatter after each MoE layer, over the dp ranks
            k.N_DP_COMM: 2.0 * len(m.moe_layer_ids) if par.dp > 1 and m.is_moe else 0.0,
            k.DP_RING: (par.dp - 1) / par.dp,
            k.N_P2P: float(par.pp - 1),
            # all-reduces within a rank: after attention and after the MLP in each layer, and after the (vocab-
            # parallel) embedding
            k.N_ALLREDUCE: 2.0 * m.num_hidden_layers + 1.0 if par.tp > 1 else 0.0,
            k.RING: 2.0 * (par.tp - 1) / par.tp,  # each GPU sends and receives 2(n-1)/n of the message
        }  # fmt: skip
        return out

    def kernel_counts(self) -> dict[str, int]:
        """Instances of each kernel per iteration (all stages: a batch passes through every layer)."""
        m = self.model
        n_layers = m.num_hidden_layers
        n_moe = len(m.moe_layer_ids)
        n_win = len(m.window_layer_ids) if m.hybrid_attention else 0
        mla = n_layers if m.is_mla else 0
        return {
            "embedding": 1, "norm": 2 * n_layers, "qkv_proj": n_layers, "rope": n_layers,
            "attention_prefill": n_layers - n_win, "attention_decode": n_layers - n_win,
            "attention_prefill_window": n_win, "attention_decode_window": n_win,
            "mla_kv_up": mla, "mla_absorb": mla, "o_proj": n_layers,
            "mlp_gate_up": n_layers - n_moe, "mlp_act": n_layers - n_moe, "mlp_down": n_layers - n_moe,
            "moe_router": n_moe, "moe_experts": n_moe, "moe_shared": n_moe if m.shared_expert_intermediate_size else 0,
            "final_norm": 1, "lm_head": 1,
            "attention_verify": n_layers - n_win, "attention_verify_window": n_win,
        }  # fmt: skip

    def gemm_formats(self, peaks: dict[str, float]) -> dict[str, str]:
        """The format each GEMM kernel multiplies in on a device with these peaks: its part's weights' format where
        the device has that rate (fp8, NVFP4), else the activations' (weight-only: int4, MXFP4, or no fp8 rate);
        the router, MLA's absorbed batched GEMMs and the LM head in the activation format."""
        act = self.dtypes.activation
        of_part = {p: Dtypes(act, f, act, None if f == act else f).gemm_compute(peaks) for p, f in self.formats.items()}
        return {
            "qkv_proj": of_part["attention"], "o_proj": of_part["attention"], "mla_kv_up": of_part["attention"],
            "mla_absorb": act, "mlp_gate_up": of_part["dense_mlp"], "mlp_down": of_part["dense_mlp"],
            "moe_router": act, "moe_experts": of_part["experts"], "moe_shared": of_part["shared_experts"],
            "lm_head": act,
        }  # fmt: skip

    # ----------------------------------------------------------------------------------------------------------------
    # memory, per GPU

    def layer_weight_bytes(self, layer: int) -> float:
        """Bytes one GPU holds of one layer: its shares of the layer's matrices in their formats, the replicated
        norms, biases, sinks and router in the activation format."""
        m, a = self.model, self.dtypes.activation_bytes
        b = {p: DTYPE_BYTES[f] for p, f in self.formats.items()}
        h = float(m.hidden_size)
        if m.is_mla:  # q_a and kv_a replicated, q_b / kv_b / o split by heads
            per_head = m.head_dim
            q = (h * m.q_lora_rank + m.q_lora_rank * self.heads * per_head) if m.q_lora_rank else h * self.q
            mats = q + h * m.latent_size + m.kv_lora_rank * self.heads * (m.qk_nope_head_dim + m.v_head_dim)
            mats += self.o_in * h
            small = (m.q_lora_rank + m.kv_lora_rank) * a  # the latent norms
        else:
            mats = h * (self.q + 2.0 * self.kv) + self.o_in * h
            small = ((self.q + 2.0 * self.kv) if m.attention_bias else 0.0) + (h if m.o_bias else 0.0)
            small = (small + (2 * m.head_dim if m.qk_norm else 0) + (self.heads if m.attention_sinks else 0)) * a
        total = mats * b["attention"] + small + 2.0 * h * a
        mats_per = 3.0 if m.gated_mlp else 2.0
        if layer in m.moe_layer_ids:
            expert = mats_per * h * self.moe_i * b["experts"]
            if m.expert_bias:
                expert += ((2.0 if m.gated_mlp else 1.0) * self.moe_i + h) * a
            total += self.local_experts * expert + m.router_params() * a
            total += mats_per * h * self.shared_i * b["shared_experts"]
        else:
            total += mats_per * h * self.mlp * b["dense_mlp"]
        return total

    def stage_weight_bytes(self, stage: int) -> float:
        """Bytes one GPU of pipeline stage ``stage`` holds: its layers, and the embedding (first stage), the final
        norm and the LM head (last stage; a tied LM head is a copy there when pp > 1)."""
        m, a = self.model, self.dtypes.activation_bytes
        h = float(m.hidden_size)
        total = sum(self.layer_weight_bytes(i) for i in self.stages[stage])
        first, last = stage == 0, stage == len(self.stages) - 1
        if first:
            total += self.vocab * h * a
        if last:
            total += h * a + (0.0 if m.tie_word_embeddings and self.par.pp == 1 else self.vocab * h * a)
        return total

    def stage_kv_bytes_per_token(self, stage: int) -> int:
        """KV-cache bytes one token occupies on one GPU of stage ``stage``: its charged layers
        (``ModelSpec.kv_charged``) x (MLA: the latent and rotary key; else K and V of this GPU's KV heads) x bytes."""
        m = self.model
        per_layer = self.kv if m.is_mla else 2.0 * self.kv
        layers = sum(m.kv_charged(i) for i in self.stages[stage])
        return int(layers * per_layer * self.dtypes.kv_bytes)
