"""Dynamic batching (Triton's dynamic batcher): static batching with a deadline.

A batch leaves when ``max_batch_size`` requests are queued, or when the oldest queued request has waited
``max_delay_ms`` (``max_queue_delay_microseconds``), with whoever is there. With ``preferred_batch_sizes``, a batch of
the largest preferred size that can be formed leaves at once.
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
        max_delay_s: float,
        preferred_batch_sizes: tuple[int, ...] = (),
        reservation: str = "output",
    ) -> None:
        super().__init__(max_batch_size, reservation)
        self.max_delay_s = max_delay_s  # seconds the oldest queued request may wait
        self.preferred = sorted(preferred_batch_sizes, reverse=True)

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
        size = super().departure_size(state)
        if size is not None:
            return size
        queued = len(state.waiting)
        for preferred in self.preferred:
            if preferred <= queued:
                return preferred
        if queued and state.now >= self.deadline(state):
            return min(queued, self.max_batch_size)
        return None

    def wait(self, state: SchedulerState) -> Wait:
        return Wait(until=self.deadline(state)) if state.waiting else Wait()
