"""Continuous (iteration-level) batching, as vLLM's original scheduler: requests join and leave between iterations.

Every iteration is bounded by ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens; prompts are prefilled
whole. By default prefills have priority and are not mixed with decodes: an iteration that admits prompts runs those
prompts only, and the running requests' decodes wait for the next one (vLLM V0). With ``mix_prefill_decode`` an
iteration gives each running request its decode token first and fills the rest of the budget with whole prompts.
Running requests grow their KV blocks one token at a time; when the cache is full the most recently admitted is
preempted by recompute (``kv_reservation="paged"``, vLLM). With ``output`` or ``max_model_len`` a request is admitted
only when its whole reservation fits, as Orca did before paging: it never grows and never preempts.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from policies import compiled
from policies.base import (
    RESERVATIONS,
    BatchBuilder,
    admit_waiting,
    draft_slots,
    register,
    schedule_decodes,
    schedule_running,
)
from policies.config import SchedulerConfig
from sim.state import Batch, SchedulerState, Wait


@register
class ContinuousBatching:
    name: ClassVar[str] = "continuous"

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        mix_prefill_decode: bool = False,
        reservation: str = "paged",
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.mix_prefill_decode = mix_prefill_decode
        self.reservation = reservation  # "paged", or reserve up front as Orca did ("output", "max_model_len")

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> ContinuousBatching:
        return cls(config.seq_limit, config.token_budget, config.mix_prefill_decode, config.reservation)

    @property
    def seats(self) -> int:
        """Sequences that may hold a seat at once."""
        return self.max_num_seqs

    def compiled(self) -> tuple[Any, np.ndarray]:
        """The numba twin of ``schedule`` and its parameters (for the compiled engine)."""
        return compiled.schedule_continuous, compiled.params_array(
            self.max_num_seqs,
            self.max_num_batched_tokens,
            float(self.mix_prefill_decode),
            RESERVATIONS.index(self.reservation),
        )

    def schedule(self, state: SchedulerState) -> Batch | Wait:
        batch = BatchBuilder(self.max_num_batched_tokens, draft_slots(state))
        if self.mix_prefill_decode and state.spec is not None:
            # vLLM V1 without chunked prefill: its pass over the running requests (all decoding: prompts are admitted
            # whole), each with its drafts, cut by the budget
            schedule_running(state, batch, self.max_num_batched_tokens)
            batch.end_running_pass(state)
            if not batch.preempted:
                admit_waiting(state, batch, self.max_num_seqs, None, self.reservation)
        elif self.mix_prefill_decode:
            schedule_decodes(state, batch)
            if not batch.preempted:  # as vLLM: no new admissions in a step that had to preempt
                admit_waiting(state, batch, self.max_num_seqs, None, self.reservation)
        elif not admit_waiting(state, batch, self.max_num_seqs, None, self.reservation):
            schedule_decodes(state, batch)
        return batch.build() or Wait()
