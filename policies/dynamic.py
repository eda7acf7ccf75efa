"""Dynamic batching as Triton's dynamic batcher forms batches: static batching with preferred sizes and a deadline.

Follows ``DynamicBatchScheduler::GetDynamicBatch`` (triton-inference-server/core ``src/dynamic_batch_scheduler.cc``,
unchanged from release r25.09 through r26.06) for one model instance whose batch runs to completion, every request a
batch of one. Triton normalises an empty ``preferred_batch_size`` to ``[max_batch_size]``. When the replica is free
and requests are queued, with ``fill = min(queued, max_batch_size)``:
- before the oldest queued request has waited ``max_delay_ms`` (``max_queue_delay_microseconds``), the largest
  preferred size that ``fill`` reaches leaves at once; if none is reached, the batch waits (until the deadline, or
  until arrivals complete a preferred size);
- once the oldest has waited ``max_delay_ms``, everything queued leaves, up to ``max_batch_size``, whatever the
  preferred sizes;
- with ``max_delay_ms = 0`` (the default, as the field's default in Triton's ``model_config.proto``) a batch leaves
  at once: the largest preferred size reached, else everything queued up to ``max_batch_size``.
Unlike static batching there is no flush at the end of the trace: the batcher cannot know no one else is coming.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from policies import compiled
from policies.base import RESERVATIONS, register
from policies.config import SchedulerConfig
from policies.static import StaticBatching
from sim.state import SchedulerState, Wait


@register
class DynamicBatching(StaticBatching):
    name: ClassVar[str] = "dynamic"

    def __init__(
        self,
        max_batch_size: int,
        max_delay_s: float = 0.0,
        preferred_batch_sizes: tuple[int, ...] = (),
        reservation: str = "output",
    ) -> None:
        super().__init__(max_batch_size, reservation)
        self.max_delay_s = max_delay_s  # seconds the oldest queued request may wait
        # largest first; Triton's normalisation: no preferred sizes means [max_batch_size]
        self.preferred = sorted(set(preferred_batch_sizes) or {max_batch_size}, reverse=True)

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> DynamicBatching:
        return cls(config.max_batch_size, config.max_delay_ms / 1e3, config.preferred_batch_sizes, config.reservation)

    def compiled(self) -> tuple[Any, np.ndarray]:
        """The numba twin of ``schedule`` and its parameters (for the compiled engine)."""
        reservation = RESERVATIONS.index(self.reservation)
        return compiled.schedule_static, compiled.params_array(
            self.max_batch_size, reservation, 1.0, self.max_delay_s, *self.preferred
        )

    def deadline(self, state: SchedulerState) -> float:
        """When the oldest queued request will have waited ``max_delay`` (s)."""
        return float(state.reqs.arrival[state.waiting[0]]) + self.max_delay_s

    def departure_size(self, state: SchedulerState) -> int | None:
        queued = len(state.waiting)
        if not queued:
            return None
        fill = min(queued, self.max_batch_size)
        expired = self.max_delay_s > 0 and state.now >= self.deadline(state)
        if not expired:
            best = next((size for size in self.preferred if size <= fill), 0)
            if best:
                return best
        if expired or self.max_delay_s == 0:
            return fill
        return None

    def wait(self, state: SchedulerState) -> Wait:
        return Wait(until=self.deadline(state)) if state.waiting else Wait()
