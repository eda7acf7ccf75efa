"""The two kinds of replica a cluster (``sim.cluster``) drives through one interface (``advance``, ``next_event``,
``route``, ``route_many``, ``close``, ``load``, ``run_records``): the reference engine's policy object over a
``SchedulerState``, and the compiled engine's arrays with its policy kernel and timer."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sim.compiled.engine import DONE, IDLE, PAUSED, CompiledReplica
from sim.engine import IterationTimer, Scheduler, decide
from sim.kvcache import KVCacheManager
from sim.prefix_cache import PrefixCachingKV
from sim.records import ItlLog, RunRecords
from sim.request import RequestTable
from sim.speculation import Speculation
from sim.state import Batch, SchedulerState

IntArray = npt.NDArray[np.int64]


@dataclass
class ReplicaSetup:
    """One replica of a cluster: its policy, its iteration timer (cost model), its KV cache, its max_model_len."""

    policy: Scheduler
    timer: IterationTimer
    kv: KVCacheManager
    max_model_len: int
    spec: Speculation | None = None  # speculative decoding (``sim.speculation``)


class ReferenceReplica:
    """A replica on the reference engine: the policy object over a ``SchedulerState`` that receives the requests
    routed to it; the same steps as the compiled loop (``sim.compiled.engine.run_segment``)."""

    def __init__(self, requests: RequestTable, setup: ReplicaSetup, exact: bool, record_batches: bool) -> None:
        self.setup = setup
        self.state = SchedulerState(requests, setup.kv, setup.max_model_len, exact, record_batches, routed=True,
                                    spec=setup.spec)  # fmt: skip
        self.now = 0.0
        self.flight: tuple[Batch, Any, float, float] | None = None  # the iteration decided and not accounted for
        self.wake: float | None = None  # asleep until then (inf: until routed to)

    def advance(self, stop_at: float) -> int:
        state = self.state
        while True:
            if self.flight is not None:
                batch, shape, start, end = self.flight
                if end >= stop_at:
                    return PAUSED
                state.complete(batch, shape, start, end)
                self.flight = None
                self.now = end
                continue
            if self.wake is not None:
                if self.wake == math.inf and not state.more:
                    self.wake = None  # its router has closed: nothing will wake it; decide once more, now
                elif self.wake >= stop_at:
                    return IDLE if self.wake == math.inf else PAUSED
                else:
                    self.now = self.now + (self.wake - self.now)
                    self.wake = None
            action = decide(state, self.setup.policy, self.now)
            if action is None:
                if state.more:
                    self.wake = math.inf
                    return IDLE
                return DONE
            if isinstance(action, Batch):
                shape = state.shape_of(action)
                duration = self.setup.timer.iteration_time(shape)
                if not duration > 0:
                    raise RuntimeError(f"the cost model gave a non-positive iteration time {duration!r} for {shape}")
                self.flight = (action, shape, self.now, self.now + duration)
            else:
                self.wake = action

    def next_event(self) -> float:
        if self.flight is not None:
            return self.flight[3]
        return self.wake if self.wake is not None else self.now

    def route(self, req: int) -> None:
        self.state.route(req)
        if self.wake is not None:
            self.wake = min(self.wake, float(self.state.reqs.arrival[req]))

    def route_many(self, reqs: IntArray) -> None:
        """``route`` each of ``reqs`` (in arrival order), before the replica has run."""
        for req in reqs.tolist():
            self.route(req)

    def close(self) -> None:
        self.state.more = False

    def load(self, reads: tuple[str, ...]) -> tuple[int, int, int]:
        work = self.state.work_left() if "work_left" in reads else 0
        return self.state.unfinished, work, self.state.kv.used

    def run_records(self, requests: RequestTable) -> RunRecords:
        kv = self.setup.kv
        if isinstance(kv, PrefixCachingKV):
            self.state.records.prefix_cache = kv.counters()
        return self.state.records


class CompiledReplicaRunner:
    """A replica on the compiled engine: ``CompiledReplica``'s arrays with its policy kernel and timer."""

    def __init__(self, ri: np.ndarray, rf: np.ndarray, setup: ReplicaSetup, exact: bool, record_batches: bool,
                 capacity: int) -> None:  # fmt: skip
        self.setup = setup
        self.kernel = setup.policy.compiled()  # type: ignore[attr-defined]
        self.timing = setup.timer.compiled()  # type: ignore[attr-defined]
        self.replica = CompiledReplica(ri, rf, setup.kv, setup.max_model_len, ItlLog(0, exact), record_batches,
                                       routed=True, capacity=capacity, spec=setup.spec)  # fmt: skip

    def advance(self, stop_at: float) -> int:
        return self.replica.advance(self.kernel, self.timing, stop_at)

    def next_event(self) -> float:
        return self.replica.next_event()

    def route(self, req: int) -> None:
        self.replica.route(req)

    def route_many(self, reqs: IntArray) -> None:
        self.replica.route_many(reqs)

    def close(self) -> None:
        self.replica.close()

    def load(self, reads: tuple[str, ...]) -> tuple[int, int, int]:
        return self.replica.load(reads)

    def run_records(self, requests: RequestTable) -> RunRecords:
        return self.replica.run_records(requests)
