"""Continuous batching with chunked prefill, as vLLM V1 and Sarathi-Serve schedule.

Each iteration has a budget of ``max_num_batched_tokens`` tokens. Running decodes take one token each first, then
running requests with an unfinished prefill take their next chunk, then waiting requests are admitted FCFS with a
first chunk cut to the budget left. ``long_prefill_token_threshold`` (if > 0) caps any one request's chunk.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from policies import compiled
from policies.base import (
    RESERVATIONS,
    BatchBuilder,
    admit_waiting,
    register,
    schedule_decodes,
    schedule_partial_prefills,
)
from policies.config import SchedulerConfig
from sim.state import Batch, SchedulerState, Wait


@register
class ChunkedPrefill:
    name: ClassVar[str] = "chunked"

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        long_prefill_token_threshold: int = 0,
        reservation: str = "paged",
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.reservation = reservation
        # tokens one request may prefill per iteration
        self.chunk_cap = long_prefill_token_threshold if long_prefill_token_threshold > 0 else max_num_batched_tokens

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> ChunkedPrefill:
        return cls(config.max_num_seqs, config.token_budget, config.long_prefill_token_threshold, config.reservation)

    def compiled(self) -> tuple[Any, np.ndarray]:
        """The numba twin of ``schedule`` and its parameters (for the compiled engine)."""
        return compiled.schedule_chunked, compiled.params_array(
            self.max_num_seqs, self.max_num_batched_tokens, self.chunk_cap, RESERVATIONS.index(self.reservation)
        )

    def schedule(self, state: SchedulerState) -> Batch | Wait:
        batch = BatchBuilder(self.max_num_batched_tokens)
        schedule_decodes(state, batch)
        schedule_partial_prefills(state, batch, self.chunk_cap)
        if not batch.preempted:  # as vLLM: no new admissions in a step that had to preempt
            admit_waiting(state, batch, self.max_num_seqs, self.chunk_cap, self.reservation)
        return batch.build() or Wait()
