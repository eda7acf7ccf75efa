"""Multi-turn conversations, compiled: a turn is sent when the turn before it has ended, one think time later, or
never when that turn was rejected. Both engines call these (``sim.state.SchedulerState`` and
``sim.compiled.state``), over the same arrays.

A run's sessions (``Sessions``): for each request, the turns sent after its response (``turn_at`` offsets, one more
than the requests, into ``turns``) and the seconds its client thinks first (``think``); and the turns sent and not
yet arrived, in the order they arrive (``pending``, a ring buffer, with their arrivals in ``pending_at`` and its head
and length in ``ps``). The first turns wait in the replica's inbox, in arrival order: a replica receives from both
streams, a first turn before a later turn arriving at the same time (as if each sent turn had been inserted into the
inbox after everything arriving no later; a sorted inbox would move every first turn still to come, each time).

A closed loop of clients (``vllm bench serve --max-concurrency N``: each request waits for one of N slots, in the
order the requests were made, and a response that ends, or a request that fails, frees its slot) is the same arrays
with ``ps[LOOP]`` set: the first N requests are first turns, and every later one (``after`` = ``CLIENT``), in row
order (``turns``, from ``ps[NEXT]``), is sent when the next response ends, but not before it was due (``think``
holds when it was due: its place in the trace or the rate's schedule).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from sim.kernels.jit import kernel
from sim.request import Reason, Status

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
REJECTED = int(Status.REJECTED)
EARLIER_TURN_REJECTED = int(Reason.EARLIER_TURN_REJECTED)
HEAD, LEN, NEXT, LOOP = range(
    4
)  # of ps: the pending ring's head and length; a closed loop's next request, and its flag
CLIENT = -2  # ``Workload.after`` of a request a closed loop's client sends once a slot is free

# (turn_at, turns, think, pending, pending_at, ps)
Sessions = tuple[IntArray, IntArray, FloatArray, IntArray, FloatArray, IntArray]


def sessions_of(after: IntArray, think: FloatArray) -> Sessions:
    """A run's sessions from ``Workload.after`` (the turn before each request, -1 for none, ``CLIENT`` for a closed
    loop's; the turns after each are kept in row order) and ``think_s``."""
    n = len(after)
    ps = np.zeros(4, dtype=np.int64)
    turn_at = np.zeros(n + 1, dtype=np.int64)
    looped = np.flatnonzero(after == CLIENT).astype(np.int64)
    if len(looped):
        if (after >= 0).any():
            raise ValueError("a closed loop of clients sends requests of their own, not turns of conversations")
        turns = looped
        ps[LOOP] = 1
    else:
        later = np.flatnonzero(after >= 0)
        turns = later[np.argsort(after[later], kind="stable")].astype(np.int64)
        np.cumsum(np.bincount(after[later], minlength=n), out=turn_at[1:])
    room = len(turns) + 1
    pending, pending_at = np.zeros(room, dtype=np.int64), np.zeros(room)
    return turn_at, turns, np.asarray(think, dtype=np.float64), pending, pending_at, ps


def first_turns(after: IntArray) -> IntArray:
    """The requests no turn comes before (row order: arrival order)."""
    return np.flatnonzero(after == -1).astype(np.int64)


@kernel
def release_turns(ss, arrival: FloatArray, req: int, when: float) -> None:  # noqa: ANN001
    """The response of ``req`` ended at ``when`` (s): each turn after it is sent ``think`` seconds later (written into
    ``arrival``), and waits among the pending turns after those arriving no later."""
    turn_at, turns, think, pending, pending_at, ps = ss
    if ps[LOOP]:
        _send_next(ss, arrival, when)
        return
    for k in range(turn_at[req], turn_at[req + 1]):
        turn = turns[k]
        _send(ss, arrival, turn, when + think[turn])


@kernel
def _send_next(ss, arrival: FloatArray, when: float) -> None:  # noqa: ANN001
    """A closed loop's slot is free at ``when``: the next request waiting for one is sent then, or when it is due."""
    turns, think, ps = ss[1], ss[2], ss[5]
    k = ps[NEXT]
    if k < turns.shape[0]:
        turn = turns[k]
        _send(ss, arrival, turn, max(when, think[turn]))
        ps[NEXT] = k + 1


@kernel
def _send(ss, arrival: FloatArray, turn: int, t: float) -> None:  # noqa: ANN001
    """``turn`` is sent at ``t`` (written into ``arrival``): it waits among the pending turns after those arriving
    no later."""
    pending, pending_at, ps = ss[3], ss[4], ss[5]
    room = pending.shape[0]
    arrival[turn] = t
    head, n = ps[HEAD], ps[LEN]
    lo, hi = 0, n  # the first pending turn arriving after t
    while lo < hi:
        mid = (lo + hi) // 2
        if pending_at[(head + mid) % room] <= t:
            lo = mid + 1
        else:
            hi = mid
    for j in range(n, lo, -1):
        pending[(head + j) % room] = pending[(head + j - 1) % room]
        pending_at[(head + j) % room] = pending_at[(head + j - 1) % room]
    pending[(head + lo) % room] = turn
    pending_at[(head + lo) % room] = t
    ps[LEN] = n + 1


@kernel
def next_turn_at(ss) -> float:  # noqa: ANN001
    """When the next pending turn arrives (s; inf when none is pending)."""
    ps = ss[5]
    return ss[4][ps[HEAD]] if ps[LEN] > 0 else math.inf


@kernel
def next_arrived(
    ss,
    inbox: IntArray,
    arrived: int,
    routed: int,
    arrival: FloatArray,
    now: float,  # noqa: ANN001
) -> tuple[int, int]:
    """The next request to receive by ``now``: the first turn at ``inbox[arrived]`` (``routed`` in the inbox) or the
    next pending turn, whichever arrives first (the first turn on a tie); -1 when neither has arrived. Returns it and
    the inbox's new ``arrived`` (a pending turn received leaves the pending ones)."""
    first = arrival[inbox[arrived]] if arrived < routed else math.inf
    turn = next_turn_at(ss)
    if first <= now and first <= turn:
        return inbox[arrived], arrived + 1
    if turn <= now:
        pending, ps = ss[3], ss[5]
        req = pending[ps[HEAD]]
        ps[HEAD] = (ps[HEAD] + 1) % pending.shape[0]
        ps[LEN] -= 1
        return req, arrived
    return -1, arrived


@kernel
def reject_turns(
    ss,  # noqa: ANN001
    status: npt.NDArray[np.integer],
    reason: npt.NDArray[np.integer],
    arrival: FloatArray,
    req: int,
    now: float,
    stack: IntArray,
) -> int:
    """``req`` was rejected, so its client sends none of the turns after it: each (and each after those) ends now,
    rejected (``stack``: room for as many requests). Returns how many. In a closed loop the failed request frees its
    slot, as an ended response does: the next request is sent (none is rejected)."""
    turn_at, turns = ss[0], ss[1]
    if ss[5][LOOP]:
        _send_next(ss, arrival, now)
        return 0
    rejected = 0
    stack[0] = req
    top = 1
    while top > 0:
        top -= 1
        r = stack[top]
        for k in range(turn_at[r], turn_at[r + 1]):
            turn = turns[k]
            arrival[turn] = now
            status[turn] = REJECTED
            reason[turn] = EARLIER_TURN_REJECTED
            rejected += 1
            stack[top] = turn
            top += 1
    return rejected
