"""Continuous batching with chunked prefill, as vLLM V1 schedules it (and Sarathi-Serve, with ``decodes-first``).

Each iteration has a budget of ``max_num_batched_tokens`` tokens. By default (``order="vllm"``) it follows
``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``, vLLM main as of late 2026): one pass over the running
requests in admission order, decodes and unfinished prefills interleaved, each taking its decode token or its next
chunk; when a request's KV does not fit, the last running request is preempted by recompute. Then, if nothing was
preempted, waiting requests are admitted FCFS with a first chunk cut to the budget left. A waiting request is
admitted only if its whole prompt would fit in the free KV cache (``scheduler_reserve_full_isl``, vLLM's default since
it was added); without it, only its first chunk must fit (older V1 releases), which admits more requests under KV
pressure and preempts far more often. ``long_prefill_token_threshold`` (if > 0) caps any one request's chunk, but
from vLLM 0.31.0 only while more than one request is running or waiting (a lone request has nobody to starve;
``cap_lone_prefill`` keeps the older rule), and ``long_prefill_token_threshold_adaptive`` floors the cap at the
budget divided by those requests (``prefill_cap``).

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
    draft_slots,
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
        adaptive: bool = False,
        cap_lone_prefill: bool = False,
    ) -> None:
        if order not in CHUNKED_ORDERS:
            raise ValueError(f"order={order!r}: choose one of {', '.join(CHUNKED_ORDERS)}")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.reservation = reservation
        self.full_prompt = full_prompt  # admission needs room for the whole prompt, not just its first chunk
        self.order = order
        self.threshold = long_prefill_token_threshold  # tokens one request may prefill per iteration (0: no cap)
        self.adaptive = adaptive
        self.cap_lone_prefill = cap_lone_prefill

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> ChunkedPrefill:
        return cls(
            config.seq_limit,
            config.token_budget,
            config.long_prefill_token_threshold,
            config.reservation,
            config.scheduler_reserve_full_isl,
            config.chunked_order,
            config.long_prefill_token_threshold_adaptive,
            bool(config.cap_lone_prefill),
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
            self.threshold,
            RESERVATIONS.index(self.reservation),
            float(self.full_prompt),
            float(CHUNKED_ORDERS.index(self.order)),
            float(self.adaptive),
            float(self.cap_lone_prefill),
        )

    def schedule(self, state: SchedulerState) -> Batch | Wait:
        batch = BatchBuilder(self.max_num_batched_tokens, draft_slots(state))
        requests = len(state.running) + len(state.waiting)
        cap = compiled.lone_aware_prefill_cap(
            self.threshold, self.adaptive, self.cap_lone_prefill, self.max_num_batched_tokens, requests
        )
        if self.order == "vllm":
            schedule_running(state, batch, cap)
        else:
            schedule_decodes(state, batch)
            schedule_partial_prefills(state, batch, cap)
        if state.spec is not None:
            batch.end_running_pass(state)
        if not batch.preempted:  # as vLLM: no new admissions in a step that had to preempt
            admit_waiting(state, batch, self.max_num_seqs, cap, self.reservation, self.full_prompt)
        return batch.build() or Wait()
