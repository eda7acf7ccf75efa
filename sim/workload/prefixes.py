"""What requests share: each request's prompt starts with *segments*, runs of tokens identified by an id, that other
requests may start with too (a system prompt, a few-shot preamble, a Mooncake ``hash_id`` block of 512 tokens). Two
requests whose prompts start with the same segments, in the same order and of the same lengths, start with the same
tokens; the tokens after a request's segments are its own.

Stored flat, as the workload's other columns: ``ids`` and ``tokens`` of every segment, request after request, and
``offsets`` (``n + 1``) where each request's segments begin. ``sim.kernels.prefix`` turns them into the KV-cache
block keys ``sim.prefix_cache`` reuses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class Prefixes:
    """The shared segments at the start of each request's prompt (ids, lengths in tokens), flat."""

    ids: IntArray  # segment ids, request after request
    tokens: IntArray  # tokens of each segment (> 0)
    offsets: IntArray  # request i's segments are ids[offsets[i]:offsets[i + 1]] (n + 1 entries, from 0)

    def __post_init__(self) -> None:
        for name in ("ids", "tokens", "offsets"):
            values = np.ascontiguousarray(getattr(self, name), dtype=np.int64)
            view = values.view()
            view.flags.writeable = False
            object.__setattr__(self, name, view)
        if len(self.ids) != len(self.tokens):
            raise ValueError(f"prefixes: {len(self.ids)} segment ids but {len(self.tokens)} segment lengths")
        if len(self.offsets) < 1 or self.offsets[0] != 0 or self.offsets[-1] != len(self.ids):
            raise ValueError("prefixes: offsets must start at 0 and end at the number of segments")
        if (np.diff(self.offsets) < 0).any():
            raise ValueError("prefixes: offsets must not decrease")
        if (self.tokens <= 0).any():
            raise ValueError(f"prefixes: segment {int(np.flatnonzero(self.tokens <= 0)[0])} has no tokens")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def covered(self) -> IntArray:
        """Tokens each request's segments cover."""
        sums = np.concatenate([[0], np.cumsum(self.tokens)])
        return sums[self.offsets[1:]] - sums[self.offsets[:-1]]

    def check(self, prompt_tokens: IntArray, output_tokens: IntArray) -> None:
        """Refuse segments longer than their request's prompt and output (naming the first such request); segments
        past the prompt are its answer's, which a later turn of a conversation starts with."""
        if len(self) != len(prompt_tokens):
            raise ValueError(f"prefixes describe {len(self)} requests, the workload has {len(prompt_tokens)}")
        over = np.flatnonzero(self.covered() > prompt_tokens + output_tokens)
        if over.size:
            i = int(over[0])
            raise ValueError(
                f"request row {i}: its shared segments cover {int(self.covered()[i])} tokens, more than its prompt "
                f"and output ({int(prompt_tokens[i])} + {int(output_tokens[i])})"
            )

    def take(self, rows: IntArray) -> Prefixes:
        """The segments of requests ``rows``, in that order."""
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        counts = ends - starts
        spans = [np.arange(a, b, dtype=np.int64) for a, b in zip(starts, ends, strict=True)]
        picks = np.concatenate(spans) if spans else np.empty(0, dtype=np.int64)
        return Prefixes(self.ids[picks], self.tokens[picks], np.concatenate([[0], np.cumsum(counts)]))


def grouped(num_requests: int, prefix_len: int, num_groups: int, rng: np.random.Generator) -> Prefixes:
    """Every request starts with one of ``num_groups`` shared prompts of ``prefix_len`` tokens (system prompts),
    chosen uniformly at random: vLLM ``bench serve``'s ``prefix_repetition`` dataset, prefixes drawn per request."""
    if prefix_len < 1 or num_groups < 1:
        raise ValueError(f"prefix_len={prefix_len} and num_prefix_groups={num_groups} must be >= 1")
    group = rng.integers(0, num_groups, size=num_requests).astype(np.int64)
    return Prefixes(group, np.full(num_requests, prefix_len, dtype=np.int64), np.arange(num_requests + 1))


def from_hash_ids(hash_ids: list[list[int]], prompt_tokens: IntArray, block_tokens: int = 512) -> Prefixes:
    """Mooncake's ``hash_ids``: one id per ``block_tokens`` tokens of the prompt, the last covering what is left
    (Mooncake's ids already depend on the whole prefix, as the blocks of a radix tree)."""
    ids: list[int] = []
    tokens: list[int] = []
    offsets = [0]
    for i, row in enumerate(hash_ids):
        prompt = int(prompt_tokens[i])
        for k, h in enumerate(row):
            size = min(block_tokens, prompt - k * block_tokens)
            if size <= 0:
                break
            ids.append(int(h))
            tokens.append(size)
        offsets.append(len(ids))
    return Prefixes(np.asarray(ids, dtype=np.int64), np.asarray(tokens, dtype=np.int64), np.asarray(offsets))
