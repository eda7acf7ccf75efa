"""Continuous batching with chunked prefill, as vLLM V1 schedules it (and Sarathi-Serve, with ``decodes-first``).

Each iteration has a budget of ``max_num_batched_tokens`` tokens. By default (``order="vllm"``) it follows
``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``, vLLM main as of late 2026): one pass over the running
requests in admission order, decodes and unfinished prefills interleaved, each taking its decode token or its next
chunk; when a request's KV does not fit, the last running request is preempted by recompute. Then, if nothing was
preempted, waiting requests are admitted FCFS with a first chunk cut to the budget left. A waiting request is
admitted only if its whole prompt would fit in the free KV cache (``scheduler_reserve_full_isl``, vLLM's default since
it was added); without it, only its first chunk must fit (older V1 releases), which admits more requests under KV
pressure and preempts far more often. ``long_prefill_token_threshold`` (if > 0) caps any one request's chunk.

``order="decodes-first"`` is Sarathi-Serve's stall-free batching (Agrawal et al., OSDI 2024, section 4.2): every
running decode first, then the unfinished prefills, then new requests. It is also the order the docstring of vLLM
V0's ``_schedule_chunked_prefill`` describes, though V0's ``_schedule_running`` makes one pass as V1 does.
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
    schedule_running,
)
from policies.config import CHUNKED_ORDERS, SchedulerConfig
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
        full_prompt: bool = True,
        order: str = "vllm",
    ) -> None:
        if order not in CHUNKED_ORDERS:
            raise ValueError(f"order={order!r}: choose one of {', '.join(CHUNKED_ORDERS)}")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.reservation = reservation
        self.full_prompt = full_prompt  # admission needs room for the whole prompt, not just its first chunk
        self.order = order
        # tokens one request may prefill per iteration
        self.chunk_cap = long_prefill_token_threshold if long_prefill_token_threshold > 0 else max_num_batched_tokens

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> ChunkedPrefill:
        return cls(
            config.seq_limit,
            config.token_budget,
            config.long_prefill_token_threshold,
            config.reservation,
            config.scheduler_reserve_full_isl,
            config.chunked_order,
        )

    @property
    def seats(self) -> int:
        """Sequences that may hold a seat at once."""
        return self.max_num_seqs

    def compiled(self) -> tuple[Any, np.ndarray]:
        """The numba twin of ``schedule`` and its parameters (for the compiled engine)."""
        return compiled.schedule_chunked, compiled.params_array(
            self.max_num_seqs,
            self.max_num_batched_tokens,
            self.chunk_cap,
            RESERVATIONS.index(self.reservation),
            float(self.full_prompt),
            float(CHUNKED_ORDERS.index(self.order)),
        )

    def schedule(self, state: SchedulerState) -> Batch | Wait:
        batch = BatchBuilder(self.max_num_batched_tokens)
        if self.order == "vllm":
            schedule_running(state, batch, self.chunk_cap)
        else:
            schedule_decodes(state, batch)
            schedule_partial_prefills(state, batch, self.chunk_cap)
        if not batch.preempted:  # as vLLM: no new admissions in a step that had to preempt
            admit_waiting(state, batch, self.max_num_seqs, self.chunk_cap, self.reservation, self.full_prompt)
        return batch.build() or Wait()
