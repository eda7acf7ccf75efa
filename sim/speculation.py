"""Speculative decoding as the scheduler and the engine see it: how many draft tokens a request carries, what they
cost in the token budget and the KV cache, and how many of them a step accepts.

vLLM 0.32.0 (``vllm/v1/core/sched/scheduler.py``, ``vllm/config/vllm.py``, ``vllm/config/speculative.py``): after a
step in which a request sampled a token and did not finish, the drafter proposes ``k`` draft tokens for it (``k`` =
``num_speculative_tokens``, or with ``num_speculative_tokens_per_batch_size`` the ``k`` of that step's number of
scheduled requests). The next step schedules ``1 + k`` tokens for it (counted in the token budget, cut by it and by
``long_prefill_token_threshold``, and capped at ``max_model_len - computed - 1``), allocates KV for them plus
``num_lookahead_tokens`` slots (``k`` for EAGLE, EAGLE-3, MTP and draft models, whose drafter writes its own KV
there; 0 for n-gram), and afterwards rolls back the rejected ones (``num_computed_tokens -= rejected``) and appends the
accepted ones and one more (the bonus, or the target's token where a draft was rejected). A draft model's proposer
takes one more input slot per scheduled request (``max_num_new_slots_for_drafting``). A request admitted one token
short of its whole sequence (a one-token prompt, or all but one token found cached) is padded to ``1 + k`` tokens with
placeholder drafts, which are always rejected, when the running requests this step are all decoding (and without
dynamic speculation). EAGLE-like methods drop the last block of a prefix-cache hit (its KV is recomputed for the
drafter's hidden states). Preemption drops a request's drafts.

``Speculation`` is that, resolved for one replica; ``experiments.runner.speculative`` builds it from a run config.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# what a compiled replica's ``sp`` array holds: the scalars, then the draft count by batch size
K, LOOKAHEAD, SLOTS, PAD, SEED, DYNAMIC = range(6)
SP_HEAD = 6
# its counters (``vllm:spec_decode_*``): verification steps with drafts, then the accepted drafts per position
NUM_DRAFTS = 0


@dataclass(frozen=True, eq=False)
class Speculation:
    """One replica's speculative decoding, as its scheduler and engine run it."""

    method: str  # eagle, eagle3, mtp, ngram or draft_model
    num_speculative_tokens: int  # k: drafts proposed per request and step (the most, with dynamic speculation)
    # conditional acceptance rate of each draft position, given the ones before were accepted (k entries)
    rates: npt.NDArray[np.float64]
    seed: int  # of the acceptance draws (``sim.kernels.speculation``)
    lookahead: int = 0  # KV slots allocated past the scheduled tokens (vLLM's num_lookahead_tokens)
    draft_slots: int = 0  # input slots a scheduled request takes beyond its tokens (max_num_new_slots_for_drafting)
    drop_cached_block: bool = False  # a prefix-cache hit loses its last block (EAGLE, EAGLE-3, MTP)
    # drafts proposed after a step of b scheduled requests, at index b (num_speculative_tokens_per_batch_size, dense
    # up to max_num_seqs); None: always num_speculative_tokens
    per_batch: npt.NDArray[np.int64] | None = None
    acceptance: str = ""  # where the rates come from (a preset, or the config's synthetic rates), for the header

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens={self.num_speculative_tokens}: must be >= 1")
        if len(self.rates) != self.num_speculative_tokens:
            raise ValueError(f"{len(self.rates)} acceptance rates for {self.num_speculative_tokens} draft positions")

    @property
    def pad(self) -> bool:
        """Whether a request admitted one token short of its sequence is padded to ``1 + k`` tokens (vLLM pads when
        the draft count is fixed: not with dynamic speculation)."""
        return self.per_batch is None

    def drafts_after(self, scheduled: int) -> int:
        """Drafts proposed for each request after a step of ``scheduled`` requests."""
        if self.per_batch is None:
            return self.num_speculative_tokens
        return int(self.per_batch[min(scheduled, len(self.per_batch) - 1)])

    def array(self, max_batch: int) -> npt.NDArray[np.int64]:
        """The compiled engine's view (``sp``): the scalars (``K`` ...), then the draft count after a step of b
        scheduled requests for b in 0..``max_batch``."""
        out = np.zeros(SP_HEAD + max_batch + 1, dtype=np.int64)
        out[K], out[LOOKAHEAD], out[SLOTS] = self.num_speculative_tokens, self.lookahead, self.draft_slots
        out[PAD], out[SEED], out[DYNAMIC] = int(self.pad), self.seed, int(self.per_batch is not None)
        out[SP_HEAD:] = [self.drafts_after(b) for b in range(max_batch + 1)]
        return out

    def counters(self) -> npt.NDArray[np.int64]:
        """Fresh counters: verification steps with drafts, then the accepted drafts at each position."""
        return np.zeros(1 + self.num_speculative_tokens, dtype=np.int64)


def dense_schedule(schedule: list[tuple[int, int, int]], max_num_seqs: int, k: int) -> npt.NDArray[np.int64]:
    """``num_speculative_tokens_per_batch_size`` (inclusive batch-size ranges and their draft counts) as a lookup by
    batch size 0..max_num_seqs, as vLLM builds it (``vllm/v1/spec_decode/dynamic/utils.py``,
    ``build_dynamic_sd_schedule_lookup``): a gap between ranges and the tail take the last range's count, every count
    capped at ``k``; index 0 is unused."""
    dense = np.zeros(max_num_seqs + 1, dtype=np.int64)
    nxt, last = 1, None
    for start, end, count in sorted(schedule):
        if start > nxt and last is not None:
            dense[nxt : min(start, max_num_seqs + 1)] = min(k, last)
        lo, hi = max(start, nxt), min(end, max_num_seqs)
        if hi >= lo:
            dense[lo : hi + 1] = min(k, count)
        nxt, last = max(nxt, end + 1), count
        if nxt > max_num_seqs:
            break
    if last is not None and nxt <= max_num_seqs:
        dense[nxt:] = min(k, last)
    return dense
