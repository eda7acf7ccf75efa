"""A Llama-style model with random weights, built from a ``config.json``, that runs one iteration of a ferry batch.

RMSNorm, RoPE, grouped-query attention, a SwiGLU MLP and greedy sampling, from the kernels in
``costmodel.calibration.kernels`` (the ones calibration times). The weights are random (normal, std 0.02; norms 1): the
time of a forward pass does not depend on their values, and no checkpoint needs downloading.

One ``forward`` is one iteration: the new tokens of every sequence in the batch are concatenated for the token-parallel
layers (decode tokens first, then the prefill chunks), and attention runs per sequence against that sequence's own KV
cache slot. Dense, gated (SwiGLU) models only: MoE and ungated MLPs are refused, and a sliding window is ignored.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from costmodel.calibration import kernels as K
from costmodel.model_spec import MODELS_DIR, ModelSpec, load_model

if TYPE_CHECKING:
    import torch

DEFAULT_ROPE_THETA = 10000.0
DEFAULT_RMS_NORM_EPS = 1e-5


def config_extras(name_or_path: str) -> tuple[float, float]:
    """(rope_theta, rms_norm_eps) from the model's ``config.json`` (what ``ModelSpec`` leaves out); the Llama
    defaults when the file has none."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        key = name_or_path.strip().lower()
        path = next((p for p in MODELS_DIR.glob("*.json") if p.stem.lower() == key), Path())
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        config = {}
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    return float(config.get("rope_theta") or DEFAULT_ROPE_THETA), float(
        config.get("rms_norm_eps") or DEFAULT_RMS_NORM_EPS
    )


@dataclass(frozen=True, slots=True)
class Step:
    """What one iteration computes, in the order of the concatenated tokens: decode tokens, then prefill chunks."""

    # token ids [T] (int64, on the device)
    tokens: torch.Tensor
    # position of each token in its sequence [T] (int64, on the device)
    positions: torch.Tensor
    # decode steps: cache slots [B] and positions [B] (= tokens already cached), on the device, and max(positions)
    decode_slots: torch.Tensor
    decode_positions: torch.Tensor
    decode_max_position: int
    # prefill chunks: (slot, cached tokens, new tokens), in token order after the decodes
    prefill: tuple[tuple[int, int, int], ...]
    # rows of the T tokens whose logits are sampled [S] (int64, on the device)
    sample_rows: torch.Tensor


class Layer:
    """One transformer block's weights."""

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype, gen: torch.Generator) -> None:
        th = K.require_torch()
        h, q, kv, i = spec.hidden_size, spec.q_size, spec.kv_size, spec.intermediate_size

        def w(rows: int, cols: int) -> torch.Tensor:
            return th.randn(rows, cols, generator=gen, device=device, dtype=dtype).mul_(0.02)

        self.input_norm = th.ones(h, device=device, dtype=dtype)
        self.qkv = w(q + 2 * kv, h)
        self.qkv_bias = w(1, q + 2 * kv)[0] if spec.attention_bias else None
        self.o = w(h, q)
        self.post_norm = th.ones(h, device=device, dtype=dtype)
        self.gate_up = w(2 * i, h)
        self.down = w(h, i)


class Llama:
    """The model, its KV cache slots, and one forward pass per iteration."""

    def __init__(
        self,
        spec: ModelSpec,
        device: torch.device,
        dtype: torch.dtype,
        *,
        max_len: int,
        rope_theta: float = DEFAULT_ROPE_THETA,
        eps: float = DEFAULT_RMS_NORM_EPS,
        seed: int = 0,
    ) -> None:
        if spec.is_moe or not spec.gated_mlp:
            raise ValueError(f"model {spec.name!r}: the real executor runs dense gated (SwiGLU) models only")
        th = K.require_torch()
        gen = th.Generator(device=device).manual_seed(seed)  # weights drawn where they live
        self.spec, self.device, self.dtype, self.eps = spec, device, dtype, eps
        self.max_len = int(max_len)
        h, v = spec.hidden_size, spec.vocab_size
        self.embed = th.randn(v, h, generator=gen, device=device, dtype=dtype).mul_(0.02)
        self.layers = [Layer(spec, device, dtype, gen) for _ in range(spec.num_hidden_layers)]
        self.final_norm = th.ones(h, device=device, dtype=dtype)
        self.lm_head = (
            self.embed
            if spec.tie_word_embeddings
            else th.randn(v, h, generator=gen, device=device, dtype=dtype).mul_(0.02)
        )
        self.rotation = K.rope_tables(self.max_len, spec.head_dim, rope_theta, device)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.slots = 0

    @classmethod
    def build(
        cls, model: str, device: str, dtype: str, *, max_len: int, layers: int | None = None, seed: int = 0
    ) -> Llama:
        """The model named (built-in or config.json path) with random weights; ``layers`` keeps only that many."""
        spec = load_model(model)
        if layers is not None:
            spec = dataclasses.replace(spec, num_hidden_layers=layers)
        theta, eps = config_extras(model)
        return cls(
            spec, K.device_of(device), K.torch_dtype(dtype), max_len=max_len, rope_theta=theta, eps=eps, seed=seed
        )

    def weight_bytes(self) -> int:
        """Bytes of all weights."""
        tensors: list[Any] = [self.embed, self.final_norm]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def reserve_slots(self, slots: int) -> None:
        """Make room in the KV cache for at least ``slots`` sequences at once (keeps what is cached)."""
        if slots <= self.slots:
            return
        spec = self.spec
        grown_k, grown_v = [], []
        for layer in range(spec.num_hidden_layers):
            k, v = K.kv_cache(slots, spec.num_key_value_heads, self.max_len, spec.head_dim, self.device, self.dtype)
            if self.slots:
                k[: self.slots] = self.k_cache[layer]
                v[: self.slots] = self.v_cache[layer]
            grown_k.append(k)
            grown_v.append(v)
        self.k_cache, self.v_cache, self.slots = grown_k, grown_v, slots

    def step(
        self,
        decodes: list[tuple[int, int, int]],
        prefills: list[tuple[int, int, list[int]]],
        sample: list[bool],
    ) -> Step:
        """Build the device inputs of one iteration: ``decodes`` as (slot, position, token), ``prefills`` as (slot,
        cached tokens, new token ids), ``sample`` per sequence in that order (decodes, then prefills)."""
        th = K.require_torch()
        tokens = [t for _, _, t in decodes]
        positions = [p for _, p, _ in decodes]
        chunks = []
        for slot, ctx, ids in prefills:
            tokens += ids
            positions += range(ctx, ctx + len(ids))
            chunks.append((slot, ctx, len(ids)))
        rows, end = [], 0
        lengths = [1] * len(decodes) + [n for _, _, n in chunks]
        for n, wanted in zip(lengths, sample, strict=True):
            end += n
            if wanted:
                rows.append(end - 1)
        dev = self.device
        if max(positions, default=0) + 1 > self.max_len:
            raise ValueError(f"a sequence reaches position {max(positions)}, beyond the cache's {self.max_len} tokens")
        return Step(
            tokens=th.tensor(tokens, dtype=th.int64, device=dev),
            positions=th.tensor(positions, dtype=th.int64, device=dev),
            decode_slots=th.tensor([s for s, _, _ in decodes], dtype=th.int64, device=dev),
            decode_positions=th.tensor([p for _, p, _ in decodes], dtype=th.int64, device=dev),
            decode_max_position=max((p for _, p, _ in decodes), default=0),
            prefill=tuple(chunks),
            sample_rows=th.tensor(rows, dtype=th.int64, device=dev),
        )

    def forward(self, step: Step, logits: bool = False) -> torch.Tensor:
        """One iteration: every new token through every layer, attention per sequence against its cache slot; returns
        the greedy next token of each sampled row ([S], on the device), or with ``logits`` their logits ([S, V])."""
        th = K.require_torch()
        spec = self.spec
        n_tok = step.tokens.shape[0]
        hq, hkv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
        n_dec = step.decode_slots.shape[0]
        rotation = self.rotation[step.positions]
        x = K.embedding(step.tokens, self.embed)
        residual = None
        for i, layer in enumerate(self.layers):
            h, residual = K.add_rms_norm(x, residual, layer.input_norm, self.eps)
            qkv = K.linear(h, layer.qkv, layer.qkv_bias).view(n_tok, hq + 2 * hkv, d)
            qk = K.rope(qkv[:, : hq + hkv], rotation)
            q, k, v = qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv :]
            kc, vc = self.k_cache[i], self.v_cache[i]
            outs = []
            if n_dec:
                outs.append(
                    K.decode_attention(
                        q[:n_dec],
                        k[:n_dec],
                        v[:n_dec],
                        kc,
                        vc,
                        step.decode_slots,
                        step.decode_positions,
                        step.decode_max_position,
                    )
                )
            start = n_dec
            for slot, ctx, n in step.prefill:
                end = start + n
                outs.append(K.prefill_attention(q[start:end], k[start:end], v[start:end], kc, vc, slot, ctx))
                start = end
            attn = outs[0] if len(outs) == 1 else th.cat(outs)
            x = K.linear(attn.reshape(n_tok, spec.q_size), layer.o)
            h, residual = K.add_rms_norm(x, residual, layer.post_norm, self.eps)
            x = K.linear(K.silu_mul(K.linear(h, layer.gate_up)), layer.down)
        h, _ = K.add_rms_norm(x, residual, self.final_norm, self.eps)
        out = K.linear(h[step.sample_rows], self.lm_head)
        return out if logits else K.greedy(out)
