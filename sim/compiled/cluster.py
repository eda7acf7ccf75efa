"""A cluster's arrivals routed in compiled code: ``sim.cluster``'s loop over arrivals (advance every replica to the
arrival, show the router their loads, hand the request to the one it picks), for replicas on the compiled engine that
share one policy kernel and one timer, behind a router with a kernel (``sim.kernels.routing``).

It makes the very calls the Python loop makes, in the same order, on the same arrays: each replica's segments are the
compiled loop (``sim.compiled.engine.run_segment``, bound to the pair), its loads are those ``CompiledReplica.load``
reads, and the router's choice is the kernel its class calls. What only Python can do (grow a replica's queues or
logs, raise an error) ends a call with a code, the arrival it stopped at and the replica; the caller does it and calls
again from that arrival, where nothing done is done twice. A cluster of many replicas so costs about one segment per
iteration and a few array reads per request, not a call from Python per replica and request.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, typed

from sim.compiled.engine import (
    DONE,
    IDLE,
    PAUSED,
    SEGMENT_ITERATIONS,
    CompiledReplica,
    bound,
    cacheable,
    segment_runner,
)
from sim.compiled.state import ARRIVAL, FLIGHT_END, IN_FLIGHT, INBOX, OUTPUT, ROUTED, SLEEPING, UNFINISHED, WAKE
from sim.compiled.state import work_left as work_left_kernel
from sim.kernels.jit import WITH_REFCOUNTS, kernel
from sim.kernels.kvstate import USED
from sim.kernels.routing import pick

ROOM = 100  # a call ended before routing: the chosen replica's inbox or token-gap log needs room (its index returned)

run: Any = None  # the segment runner of the replicas' pair, bound by ``arrivals_runner``


def route_arrivals(
    states: Any,
    nows: np.ndarray,
    ri: np.ndarray,
    rf: np.ndarray,
    start: int,
    stop: int,
    router: int,
    draws: np.ndarray,
    loads: np.ndarray,
    blocks: np.ndarray,
    stale: np.ndarray,
    next_at: np.ndarray,
    replica_of: np.ndarray,
    reserved: np.ndarray,
    gap_room: np.ndarray,
    read_work: bool,
) -> tuple[int, int, int]:
    """Route requests ``start`` to ``stop`` (arrival order) as ``sim.cluster``'s loop does: before each, every
    replica whose next event comes before its arrival runs its events before it (``nows``: the replicas' clocks;
    ``next_at``: their next events), the loads of those that ran or were routed to (``stale``) are read into
    ``loads`` (rows: unfinished, work left if ``read_work``, KV blocks used), the router (``pick``'s ``router``)
    picks one, and the request joins that replica's inbox (its token gaps counted into ``reserved``, which must stay
    within ``gap_room``, unless that is negative: a histogram). ``states[j]`` is replica j's
    ``CompiledReplica.state()``. Returns (DONE, stop, -1), or (a code the caller must act on, the request it stopped
    at, the replica): a segment's LOG_FULL, BATCH_LOG_FULL, BAD_WAIT or BAD_DURATION, or ROOM."""
    n_rep = len(states)
    for i in range(start, stop):
        a = rf[ARRIVAL, i]
        for j in range(n_rep):
            if next_at[j] < a:
                wk, sc, kv, ss, sp, clock, logs, params, timer_args = states[j]
                while True:
                    code, now = run(ri, rf, wk, sc, kv, ss, sp, clock, logs, params, timer_args, nows[j], a,
                                    SEGMENT_ITERATIONS)  # fmt: skip
                    nows[j] = now
                    if code != DONE and code != PAUSED and code != IDLE:
                        return code, i, j
                    nxt = _next_event(sc, clock, now)
                    if not nxt < a:
                        break
                next_at[j] = nxt
                stale[j] = 1
        for j in range(n_rep):
            if stale[j]:
                wk, sc, kv, ss, sp, clock, logs, params, timer_args = states[j]
                loads[0, j] = sc[UNFINISHED]
                loads[1, j] = work_left_kernel(ri, wk, sc) if read_work else 0
                loads[2, j] = kv[1][USED]
                stale[j] = 0
        k = pick(router, loads[0], loads[1], loads[2], blocks, draws, i)
        wk, sc, kv, ss, sp, clock, logs, params, timer_args = states[k]
        gaps = max(ri[OUTPUT, i] - 1, 0)
        if sc[ROUTED] == wk.shape[1] or (gap_room[k] >= 0 and reserved[k] + gaps > gap_room[k]):
            return ROOM, i, k
        replica_of[i] = k
        wk[INBOX, sc[ROUTED]] = i
        sc[ROUTED] += 1
        sc[UNFINISHED] += 1
        reserved[k] += gaps
        if sc[SLEEPING]:
            clock[WAKE] = min(clock[WAKE], rf[ARRIVAL, i])
        next_at[k] = _next_event(sc, clock, nows[k])
        stale[k] = 1
    return DONE, stop, -1


@kernel
def _next_event(sc: np.ndarray, clock: np.ndarray, now: float) -> float:
    """``CompiledReplica.next_event``: the end of the iteration in flight, the wake-up, or now."""
    if sc[IN_FLIGHT]:
        return clock[FLIGHT_END]
    if sc[SLEEPING]:
        return clock[WAKE]
    return now


@njit(cache=True)
def new_states(first: Any) -> Any:
    """A typed list of replica states holding ``first``. (Made, filled and changed by compiled functions, which numba
    keeps on disk: from Python, a typed list's methods are compiled anew in every process, ~1.5 s.)"""
    states = typed.List()
    states.append(first)
    return states


@njit(cache=True)
def add_state(states: Any, state: Any) -> None:
    states.append(state)


@njit(cache=True)
def set_state(states: Any, j: int, state: Any) -> None:
    states[j] = state


_RUNNERS: dict[tuple[Any, Any], Any] = {}


def arrivals_runner(policy_kernel: Any, cost_timer: Any) -> Any:
    """``route_arrivals`` compiled with the segment runner of (policy kernel, timer) bound (``segment_runner``);
    compiled once per pair and machine, loaded once per pair and process."""
    key = (policy_kernel, cost_timer)
    if key not in _RUNNERS:
        segments = segment_runner(policy_kernel, cost_timer)
        loop = bound(route_arrivals, segments.py_func.__name__.removeprefix("run_segment__"), run=segments)
        # reference counted: it takes a typed list of the replicas' arrays
        _RUNNERS[key] = njit(cache=cacheable(policy_kernel, cost_timer), **WITH_REFCOUNTS)(loop)
    return _RUNNERS[key]


class CompiledCluster:
    """The replicas' arrays as the compiled loop takes them, and the calls that route a span of arrivals."""

    def __init__(self, replicas: list[CompiledReplica], policies: list[tuple[Any, np.ndarray]],
                 timers: list[tuple[Any, Any]], router: tuple[int, np.ndarray], read_work: bool,
                 blocks: np.ndarray) -> None:  # fmt: skip
        """``policies`` and ``timers``: each replica's compiled policy and timer, of one kernel and one timer."""
        self.replicas = replicas
        self.run = arrivals_runner(policies[0][0], timers[0][0])
        self.policies, self.timers = policies, timers
        self.router, self.draws = router
        self.read_work = read_work
        self.blocks = blocks
        n = len(replicas)
        given = [rep.state(policy, timer) for rep, policy, timer in zip(replicas, policies, timers, strict=True)]
        self.states = new_states(given[0])
        for state in given[1:]:
            add_state(self.states, state)
        self.nows = np.array([rep.now for rep in replicas])
        self.loads = np.zeros((3, n), dtype=np.int64)
        self.stale = np.ones(n, dtype=np.int64)
        self.next_at = np.array([rep.next_event() for rep in replicas])
        self.reserved = np.array([rep.itl.reserved for rep in replicas], dtype=np.int64)
        self.gap_room = np.array([len(rep.itl.gaps) if rep.itl.exact else -1 for rep in replicas], dtype=np.int64)

    def route(self, start: int, stop: int, replica_of: np.ndarray) -> None:
        """Route arrivals ``start`` to ``stop``, doing what only Python can whenever the loop asks."""
        ri, rf = self.replicas[0].ri, self.replicas[0].rf
        while True:
            code, at, j = self.run(self.states, self.nows, ri, rf, start, stop, self.router, self.draws, self.loads,
                                   self.blocks, self.stale, self.next_at, replica_of, self.reserved, self.gap_room,
                                   self.read_work)  # fmt: skip
            if code == DONE:
                break
            rep = self.replicas[j]
            rep.now = float(self.nows[j])
            if code == ROOM:
                if int(rep.sc[ROUTED]) == rep.wk.shape[1]:
                    rep.grow()
                rep.itl.reserved = int(self.reserved[j])
                rep.itl.make_room(max(int(rep.ri[OUTPUT, at]) - 1, 0))
                self.gap_room[j] = len(rep.itl.gaps) if rep.itl.exact else -1
            else:
                rep.handle(code)
            set_state(self.states, j, rep.state(self.policies[j], self.timers[j]))
            start = at
        self.sync()

    def sync(self) -> None:
        """Hand each replica back its clock and the token gaps routed to it (for ``CompiledReplica``'s own calls)."""
        for j, rep in enumerate(self.replicas):
            rep.now = float(self.nows[j])
            rep.itl.reserved = int(self.reserved[j])
