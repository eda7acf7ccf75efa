"""The replica: a SimPy process that replays arrivals through a policy and times each iteration with a cost model.

The engine owns time. Each turn it shows the policy the requests that have arrived by now, and either runs the batch
the policy returns for as long as the cost model says, or sleeps until the policy's wake-up time or the next arrival.
Arrivals are not events of their own: requests become visible when the clock passes their arrival time, so a run
costs one SimPy event per iteration or idle wait, not one per request.
"""

from __future__ import annotations

from typing import Protocol

import simpy

from costmodel.shape import IterationShape
from sim.kvcache import KVCacheManager
from sim.records import RunRecords
from sim.request import Reason, RequestTable, Status
from sim.state import Batch, SchedulerState, Wait


class IterationTimer(Protocol):
    """Anything that says how long an iteration takes: the roofline cost model, or a stand-in in tests."""

    def iteration_time(self, shape: IterationShape) -> float:
        """Seconds the iteration of this shape takes on the replica."""
        ...


class Scheduler(Protocol):
    def schedule(self, state: SchedulerState) -> Batch | Wait: ...


def replica(env: simpy.Environment, state: SchedulerState, policy: Scheduler, timer: IterationTimer):  # noqa: ANN201
    """The replica process: decide, run, account; or wait."""
    while state.unfinished:
        now = env.now
        state.now = now
        state.receive_arrivals(now)
        decision = policy.schedule(state)
        if isinstance(decision, Batch):
            shape = state.shape_of(decision)
            duration = timer.iteration_time(shape)
            if not duration > 0:
                raise RuntimeError(f"the cost model gave a non-positive iteration time {duration!r} for {shape}")
            yield env.timeout(duration)
            state.complete(decision, shape, now, env.now)
            continue
        if not state.unfinished:  # the policy's last act was to release the final batch
            break
        wake = min(decision.until if decision.until is not None else float("inf"), state.next_arrival)
        if wake == float("inf"):
            _reject_stalled(state)  # the policy will never act again: end what is left, with a reason
            break
        if wake <= now:
            if decision.until is not None and decision.until <= now:
                raise RuntimeError(f"{type(policy).__name__} asked to wait until {decision.until} at time {now}")
            continue  # an arrival is due now
        yield env.timeout(wake - now)


def _reject_stalled(state: SchedulerState) -> None:
    for req in list(state.running) + list(state.waiting):
        state.reject(req, Reason.STALLED)


def simulate(
    requests: RequestTable,
    policy: Scheduler,
    timer: IterationTimer,
    kv: KVCacheManager,
    max_model_len: int,
) -> RunRecords:
    """Replay ``requests`` (arrival order) through ``policy`` on one replica; returns the run's records.

    The request table is the run's state and ends up in its records: give each run a new one."""
    if (requests.status != Status.PENDING).any() or requests.computed.any():
        raise ValueError("this RequestTable has already been simulated; build a new one for each run")
    state = SchedulerState(requests, kv, max_model_len)
    env = simpy.Environment()
    env.process(replica(env, state, policy, timer))
    env.run()
    return state.records
