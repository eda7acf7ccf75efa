"""No batching: one request at a time, first come first served, run to completion (a boat that carries one)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from policies import compiled
from policies.base import BatchBuilder, register
from policies.config import SchedulerConfig
from sim.state import Batch, SchedulerState, Wait


@register
class NoBatching:
    name: ClassVar[str] = "none"
    seats: ClassVar[int] = 1  # one request at a time

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> NoBatching:
        return cls()

    def compiled(self) -> tuple[Any, np.ndarray]:
        """The numba twin of ``schedule`` and its parameters (for the compiled engine)."""
        return compiled.schedule_none, compiled.params_array()

    def schedule(self, state: SchedulerState) -> Batch | Wait:
        if not state.running:
            if not state.waiting:
                return Wait()
            state.admit_next()
        req = state.running[0]
        tokens = int(state.reqs.remaining(req))  # the whole prompt at once, then one token per step
        # alone in the cache, a request that passed the arrival check always fits
        if not state.kv.allocate(req, int(state.reqs.computed[req]) + tokens):
            raise RuntimeError(f"request {req} does not fit in an empty KV cache")
        batch = BatchBuilder(budget=tokens)
        batch.add(req, tokens)
        return batch.build()  # type: ignore[return-value]
