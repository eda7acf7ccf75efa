"""The shape of one iteration: what the cost model needs to know about a batch, and nothing else.

An iteration runs one forward pass over
- prefill chunks: ``prefill_new[i]`` new prompt tokens of sequence i, computed on top of ``prefill_ctx[i]`` tokens of
  the same sequence that are already in the KV cache (0 for a whole prompt; >0 for the second and later chunks of a
  chunked prefill, or a recompute after preemption);
- decode steps: one new token for each decoding sequence j, which attends to ``decode_ctx[j]`` tokens already in its
  KV cache plus itself.

``prefill_sampled`` counts the prefill chunks that finish their prompt in this iteration: those, and every decode
step, run the LM head and sample a token. With speculative decoding a sequence may instead be verified: a query of
``verify_new[k]`` tokens (its last token and its draft tokens) on top of ``verify_ctx[k]`` cached ones, every one of
them through the LM head. All counts are tokens; nothing here is time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class IterationShape:
    """One iteration's work, as token counts per sequence (vectors, one entry per sequence)."""

    # new prompt tokens computed this iteration, one entry per prefill chunk (tokens)
    prefill_new: IntArray = field(default_factory=lambda: _EMPTY)
    # tokens of that sequence already in the KV cache before the chunk (tokens)
    prefill_ctx: IntArray = field(default_factory=lambda: _EMPTY)
    # per decoding sequence, tokens already in its KV cache before this step (tokens)
    decode_ctx: IntArray = field(default_factory=lambda: _EMPTY)
    # how many of the prefill chunks complete their prompt and so sample a token (count)
    prefill_sampled: int = 0
    # speculative decoding: per verified sequence, its query tokens (1 + its drafts) and its cached tokens before them
    verify_new: IntArray = field(default_factory=lambda: _EMPTY)
    verify_ctx: IntArray = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        if len(self.prefill_new) != len(self.prefill_ctx):
            raise ValueError(
                f"prefill_new has {len(self.prefill_new)} entries but prefill_ctx has {len(self.prefill_ctx)}"
            )
        if not 0 <= self.prefill_sampled <= len(self.prefill_new):
            raise ValueError(f"prefill_sampled={self.prefill_sampled} must be in [0, {len(self.prefill_new)}]")
        if len(self.verify_new) != len(self.verify_ctx):
            raise ValueError(f"verify_new has {len(self.verify_new)} entries but verify_ctx has {len(self.verify_ctx)}")

    @property
    def num_prefill_tokens(self) -> int:
        """New prompt tokens in this iteration (tokens)."""
        return int(self.prefill_new.sum())

    @property
    def num_decode_seqs(self) -> int:
        """Sequences taking a decode step (count; each contributes one token)."""
        return len(self.decode_ctx)

    @property
    def num_verify_tokens(self) -> int:
        """Query tokens of the verified sequences (tokens)."""
        return int(self.verify_new.sum())

    @property
    def num_tokens(self) -> int:
        """All tokens that go through the linear layers this iteration (tokens)."""
        return self.num_prefill_tokens + self.num_decode_seqs + self.num_verify_tokens

    @property
    def num_seqs(self) -> int:
        """Sequences in the iteration, prefill chunks, decodes and verifications together (count)."""
        return len(self.prefill_new) + len(self.decode_ctx) + len(self.verify_new)

    @property
    def num_sampled(self) -> int:
        """Rows that run the LM head this iteration: a sampling prefill chunk or decode one each, a verification
        each of its query tokens (count)."""
        return self.prefill_sampled + len(self.decode_ctx) + self.num_verify_tokens

    @classmethod
    def of(
        cls,
        prefill: list[tuple[int, int]] | None = None,
        decode: list[tuple[int, int]] | None = None,
        prefill_sampled: int | None = None,
        verify: list[tuple[int, int, int]] | None = None,
    ) -> IterationShape:
        """Build a shape from ``[(new, ctx), ...]`` prefill chunks, ``[(count, ctx), ...]`` decode groups and
        ``[(count, query tokens, ctx), ...]`` groups of verified sequences.

        Every prefill chunk samples unless ``prefill_sampled`` says how many do.
        """
        prefill = prefill or []
        decode = decode or []
        new = np.array([n for n, _ in prefill], dtype=np.int64)
        ctx = np.array([c for _, c in prefill], dtype=np.int64)
        dctx = np.concatenate([np.full(b, c, dtype=np.int64) for b, c in decode]) if decode else _EMPTY
        sampled = len(prefill) if prefill_sampled is None else prefill_sampled
        groups = verify or []
        vnew = np.concatenate([np.full(b, q, dtype=np.int64) for b, q, _ in groups]) if groups else _EMPTY
        vctx = np.concatenate([np.full(b, c, dtype=np.int64) for b, _, c in groups]) if groups else _EMPTY
        return cls(prefill_new=new, prefill_ctx=ctx, decode_ctx=dctx, prefill_sampled=sampled, verify_new=vnew,
                   verify_ctx=vctx)  # fmt: skip
