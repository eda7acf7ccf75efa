"""Static batching: the boat waits until it is full, then carries everyone to the end.

A batch leaves when ``max_batch_size`` requests are queued (or, once the trace has ended, with whoever is left). Its
members prefill together, then decode together until the last of them is done; a member that finishes early keeps its
seat and its memory until then, and by default every response arrives when the batch ends (``returns_at_batch_end``;
a run with ``stream`` delivers tokens as they are made instead). Memory is reserved up front for
each member, as engines without paging did: its prompt and whole output (``kv_reservation="output"``, an oracle that
knows the output length) or ``max_model_len`` tokens (an engine that must plan for the longest answer); a batch that
would not fit is cut to what fits.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from policies import compiled
from policies.base import RESERVATIONS, BatchBuilder, register, reserved_tokens
from policies.config import SchedulerConfig
from sim.request import Status
from sim.state import Batch, SchedulerState, Wait


@register
class StaticBatching:
    name: ClassVar[str] = "static"
    returns_at_batch_end: ClassVar[bool] = True  # by default every member's response arrives when the batch ends

    def __init__(self, max_batch_size: int, reservation: str = "output") -> None:
        self.max_batch_size = max_batch_size
        self.reservation = reservation  # "output": prompt + output tokens per member; "max_model_len": that many

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> StaticBatching:
        return cls(max_batch_size=config.max_batch_size, reservation=config.reservation)

    @property
    def seats(self) -> int:
        """Requests one batch carries."""
        return self.max_batch_size

    def compiled(self) -> tuple[Any, np.ndarray]:
        """The numba twin of ``schedule`` and its parameters (for the compiled engine)."""
        return compiled.schedule_static, compiled.params_array(
            self.max_batch_size, RESERVATIONS.index(self.reservation), 0.0, 0.0
        )

    def schedule(self, state: SchedulerState) -> Batch | Wait:
        if state.running and not any(state.reqs.status[r] == Status.RUNNING for r in state.running):
            state.release(list(state.running))  # the whole batch is done: free every seat now
        if not state.running:
            size = self.departure_size(state)
            if size is None:
                return self.wait(state)
            self.board(state, size)
        return self.step(state)

    def departure_size(self, state: SchedulerState) -> int | None:
        """How many queued requests leave now, or None to keep waiting."""
        if len(state.waiting) >= self.max_batch_size:
            return self.max_batch_size
        if state.waiting and not state.more_arrivals:  # the trace has ended: flush
            return len(state.waiting)
        return None

    def wait(self, state: SchedulerState) -> Wait:
        return Wait()  # until the next arrival

    def board(self, state: SchedulerState, size: int) -> None:
        """Seat up to ``size`` requests FCFS, reserving each one's KV up front; stop at the first that won't fit.

        The first always fits: it passed the arrival check and the cache is empty (with the ``max_model_len``
        reservation, a request the cache cannot reserve that much for gets what it needs, as engines cap the
        reservation at the cache size)."""
        reqs = state.reqs
        for seated in range(size):
            req = state.waiting[0]
            if not state.kv.allocate(req, reserved_tokens(state, req, int(reqs.prompt[req]), self.reservation)):
                if seated == 0:
                    raise RuntimeError(f"request {req} does not fit in an empty KV cache")
                break
            state.admit_next()

    def step(self, state: SchedulerState) -> Batch:
        """The seated members still generating: all prefill together, then decode one token each."""
        reqs = state.reqs
        active = [r for r in state.running if reqs.status[r] == Status.RUNNING]
        batch = BatchBuilder(budget=0)
        for req in active:
            batch.add(req, int(reqs.remaining(req)))
        return batch.build(hold_finished=True)  # type: ignore[return-value]
