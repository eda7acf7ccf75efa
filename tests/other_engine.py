"""A deliberately different Llama-style engine, to record iterations that ferry's executor did not make.

Nothing is shared with ``experiments.real``: attention is written out per sequence (scores, softmax, weighted sum: no
SDPA, no fused kernel), the KV cache is a Python list of growing tensors (concatenated at every step, as a naive
implementation does), the gate and up projections are two separate matmuls, RMSNorm and RoPE are spelled out in
elementwise ops. Its iterations cost differently from ferry's (more elementwise glue, attention that does not
flatten), which is the point: ``ferry calibrate --from-iterations`` must fit an engine it does not know.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import torch

from costmodel.model_spec import ModelSpec


class OtherLlama:
    def __init__(self, spec: ModelSpec, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        h, q, kv, i = spec.hidden_size, spec.q_size, spec.kv_size, spec.intermediate_size
        self.spec = spec

        def w(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, generator=g) * 0.02

        self.embed = w(spec.vocab_size, h)
        self.layers = [
            {"q": w(h, q), "k": w(h, kv), "v": w(h, kv), "o": w(q, h), "gate": w(h, i), "up": w(h, i), "down": w(i, h)}
            for _ in range(spec.num_hidden_layers)
        ]
        self.head = w(h, spec.vocab_size)
        self.cache: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    @staticmethod
    def _norm(x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        ang = pos[:, None, None].float() * freq[None, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.cat([x1 * torch.cos(ang) - x2 * torch.sin(ang), x1 * torch.sin(ang) + x2 * torch.cos(ang)], -1)

    def prime(self, seq: int, context: int) -> None:
        """Give sequence ``seq`` a cache of ``context`` tokens (random keys and values)."""
        s = self.spec
        self.cache[seq] = [
            (
                torch.randn(context, s.num_key_value_heads, s.head_dim),
                torch.randn(context, s.num_key_value_heads, s.head_dim),
            )
            for _ in range(s.num_hidden_layers)
        ]

    def step(self, seqs: list[tuple[int, int]]) -> torch.Tensor:
        """One iteration: ``(sequence, new tokens)`` for each sequence (1 = a decode); returns the sampled ids."""
        s = self.spec
        lengths = [n for _, n in seqs]
        tokens = torch.randint(0, s.vocab_size, (sum(lengths),))
        x = self.embed[tokens]
        positions = torch.cat([torch.arange(len(self.cache[q][0][0]), len(self.cache[q][0][0]) + n) for q, n in seqs])
        heads, kv_heads, d = s.num_attention_heads, s.num_key_value_heads, s.head_dim
        for li, layer in enumerate(self.layers):
            y = self._norm(x)
            qs = self._rope((y @ layer["q"]).view(-1, heads, d), positions)
            ks = self._rope((y @ layer["k"]).view(-1, kv_heads, d), positions)
            vs = (y @ layer["v"]).view(-1, kv_heads, d)
            outs, at = [], 0
            for seq, n in seqs:
                k_old, v_old = self.cache[seq][li]
                k_all = torch.cat([k_old, ks[at : at + n]])
                v_all = torch.cat([v_old, vs[at : at + n]])
                self.cache[seq][li] = (k_all, v_all)
                qh = qs[at : at + n].transpose(0, 1)  # heads, n, d
                rep = heads // kv_heads
                kh = k_all.transpose(0, 1).repeat_interleave(rep, 0)
                vh = v_all.transpose(0, 1).repeat_interleave(rep, 0)
                scores = qh @ kh.transpose(1, 2) / d**0.5
                past = len(k_all) - n
                mask = torch.arange(len(k_all))[None, :] > (past + torch.arange(n))[:, None]
                scores = scores.masked_fill(mask, float("-inf"))
                outs.append((torch.softmax(scores, -1) @ vh).transpose(0, 1).reshape(n, heads * d))
                at += n
            x = x + torch.cat(outs) @ layer["o"]
            y = self._norm(x)
            x = x + (torch.nn.functional.silu(y @ layer["gate"]) * (y @ layer["up"])) @ layer["down"]
        ends = np.cumsum(lengths) - 1
        return (self._norm(x[ends]) @ self.head).argmax(-1)


def record_iterations(
    spec: ModelSpec, shapes: list[dict[str, list[tuple[int, int]]]], repeats: int = 5
) -> pd.DataFrame:
    """Time ``OtherLlama`` on each shape (``{"decode": [context, ...], "prefill": [(new, context), ...]}``), median
    of ``repeats`` runs after one untimed; rows in the iteration-table format of ``--from-iterations``."""
    model = OtherLlama(spec)
    rows = []
    model.prime(-1, 8)
    model.step([(-1, 4)])  # first-call costs
    for shape in shapes:
        decode, prefill = shape.get("decode", []), shape.get("prefill", [])
        times = []
        for _ in range(repeats + 1):
            seqs = []
            for j, ctx in enumerate(decode):
                model.prime(j, ctx)
                seqs.append((j, 1))
            for j, (new, ctx) in enumerate(prefill):
                model.prime(1000 + j, ctx)
                seqs.append((1000 + j, new))
            started = time.perf_counter()
            model.step(seqs)
            times.append(time.perf_counter() - started)
        rows.append(
            {
                "duration_s": float(np.median(times[1:])),
                "num_decode_seqs": len(decode),
                "decode_context_tokens": int(sum(decode)),
                "prefill_chunks": "[" + ",".join(f"[{n},{c}]" for n, c in prefill) + "]",
            }
        )
    return pd.DataFrame(rows)
