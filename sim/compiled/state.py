"""The scheduler state as flat arrays, and its operations compiled with numba: the compiled engine's twin of
``sim.state`` and ``sim.kvcache`` (the batch and the accounting after it are in ``sim.compiled.batch``).

Every function here mirrors a method of ``SchedulerState`` or ``KVCacheManager`` step for step (same order, same
tie-breaks), so that a compiled policy (``policies.compiled``) on this state makes the very decisions its Python class
makes on ``SchedulerState``; tests run both and compare the records to the last bit.

The state is four arrays, passed to every function as ``ri, rf, wk, sc`` (numba pays a reference count per array for
a tuple argument, so they travel separately):
- ``ri`` int64 ``[row, request]``: the request counters and the KV blocks each holds (rows ``PROMPT`` ...);
- ``rf`` float64 ``[row, request]``: arrival and the timestamps (rows ``ARRIVAL`` ...);
- ``wk`` int64 ``[row, slot]``: the waiting queue (a ring buffer, FCFS, preempted requests back at the front), the
  running set (admission order), the batch being built, scratch space and the iteration's shape;
- ``sc`` int64: scalars (``USED`` ...).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numba import njit

from sim.request import Reason, RequestTable, Status

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# rows of ri
PROMPT, OUTPUT, COMPUTED, GENERATED, STATUS, REASON, PREEMPTIONS, RECOMPUTED, ADMIT_ORDER, HELD, STAMP = range(11)
NUM_RI = 11
# rows of rf
ARRIVAL, FIRST_SCHEDULED, FIRST_TOKEN, LAST_TOKEN, FINISH, RELEASED = range(6)
NUM_RF = 6
# rows of wk (INBOX: the requests routed to this replica, in arrival order; a single replica's are all of them)
WAITING_Q, RUNNING_Q, BATCH_IDS, BATCH_NEW, SCRATCH, PF_NEW, PF_CTX, DEC_CTX, INBOX = range(9)
NUM_WK = 9
# indices of sc
USED, NUM_BLOCKS, BLOCK_SIZE, WATERMARK, W_HEAD, W_LEN, R_LEN, ARRIVED = range(8)
ADMISSIONS, UNFINISHED, NUM_HELD, PREEMPTED_SINCE, B_LEN, B_HOLD, BATCH_NO, MAX_MODEL_LEN, N_ITERS = range(8, 17)
N_BATCH_ROWS = 17  # rows written to the batch log (``sim.records.BatchLog``), when the run keeps one
# ROUTED: requests in the inbox; MORE: 1 while a router may still route more (a replica of a cluster); IN_FLIGHT:
# an iteration has been decided and not yet accounted for (its shape has N_PF prefill chunks and N_DEC decodes);
# SLEEPING: waiting until ``clock[WAKE]`` (inf: until something is routed to it)
ROUTED, MORE, IN_FLIGHT, N_PF, N_DEC, SLEEPING = range(18, 24)
NUM_SCALARS = 24
# the float scalars of a run (``clock``): the iteration in flight, and the wake-up time of a sleeping replica
FLIGHT_START, FLIGHT_END, WAKE = range(3)

PENDING, WAITING, RUNNING, HELD_DONE, FINISHED, REJECTED = (int(s) for s in Status)
EMPTY = int(Reason.EMPTY)
EXCEEDS_MAX_MODEL_LEN = int(Reason.EXCEEDS_MAX_MODEL_LEN)
EXCEEDS_KV_CACHE = int(Reason.EXCEEDS_KV_CACHE)
STALLED = int(Reason.STALLED)

_RI_COLUMNS = ("prompt", "output_wanted", "computed", "generated", "status", "reason", "preemptions", "recomputed",
               "admit_order")  # fmt: skip
_RF_COLUMNS = ("arrival", "first_scheduled", "first_token", "last_token", "finish", "released")


def pack(requests: RequestTable, held: IntArray) -> tuple[IntArray, FloatArray]:
    """The request table (and the KV blocks each request holds) as the ``ri`` and ``rf`` blocks."""
    n = len(requests)
    ri = np.zeros((NUM_RI, n), dtype=np.int64)
    for row, name in enumerate(_RI_COLUMNS):
        ri[row] = getattr(requests, name)
    ri[HELD] = held
    ri[STAMP] = -1
    rf = np.zeros((NUM_RF, n))
    for row, name in enumerate(_RF_COLUMNS):
        rf[row] = getattr(requests, name)
    return ri, rf


def unpack(ri: IntArray, rf: FloatArray, requests: RequestTable, held: IntArray) -> None:
    """Write the blocks back into the request table's own arrays (and the KV manager's); the inputs (lengths and
    arrivals) are not written, they did not change."""
    for row, name in enumerate(_RI_COLUMNS):
        if row not in (PROMPT, OUTPUT):
            getattr(requests, name)[:] = ri[row]
    for row, name in enumerate(_RF_COLUMNS):
        if row != ARRIVAL:
            getattr(requests, name)[:] = rf[row]
    held[:] = ri[HELD]


# ---- KV cache (KVCacheManager) -------------------------------------------------------------------------------------


@njit(cache=True)
def blocks_for(sc: IntArray, tokens: int) -> int:
    return -(-tokens // sc[BLOCK_SIZE])


@njit(cache=True)
def kv_extra(ri: IntArray, sc: IntArray, req: int, tokens: int) -> int:
    return max(0, blocks_for(sc, tokens) - ri[HELD, req])


@njit(cache=True)
def kv_can_allocate(ri: IntArray, sc: IntArray, req: int, tokens: int, admission: bool) -> bool:
    reserve = sc[WATERMARK] if admission else 0
    return kv_extra(ri, sc, req, tokens) <= sc[NUM_BLOCKS] - sc[USED] - reserve


@njit(cache=True)
def kv_allocate(ri: IntArray, sc: IntArray, req: int, tokens: int, admission: bool) -> bool:
    extra = kv_extra(ri, sc, req, tokens)
    reserve = sc[WATERMARK] if admission else 0
    if extra > sc[NUM_BLOCKS] - sc[USED] - reserve:
        return False
    ri[HELD, req] += extra
    sc[USED] += extra
    return True


@njit(cache=True)
def kv_allocate_all(ri: IntArray, sc: IntArray, reqs: IntArray, count: int) -> bool:
    """Grow ``reqs[:count]`` by one token each (the decode fast path), all or nothing."""
    total = 0
    for k in range(count):
        r = reqs[k]
        total += max(blocks_for(sc, ri[COMPUTED, r] + 1) - ri[HELD, r], 0)
    if total > sc[NUM_BLOCKS] - sc[USED]:
        return False
    for k in range(count):
        r = reqs[k]
        ri[HELD, r] += max(blocks_for(sc, ri[COMPUTED, r] + 1) - ri[HELD, r], 0)
    sc[USED] += total
    return True


@njit(cache=True)
def kv_free(ri: IntArray, sc: IntArray, req: int) -> None:
    sc[USED] -= ri[HELD, req]
    ri[HELD, req] = 0


# ---- queues ----------------------------------------------------------------------------------------------------------


@njit(cache=True)
def waiting_at(wk: IntArray, sc: IntArray, k: int) -> int:
    """The k-th request of the waiting queue (0 = front)."""
    return wk[WAITING_Q, (sc[W_HEAD] + k) % wk.shape[1]]


@njit(cache=True)
def push_back(wk: IntArray, sc: IntArray, req: int) -> None:
    wk[WAITING_Q, (sc[W_HEAD] + sc[W_LEN]) % wk.shape[1]] = req
    sc[W_LEN] += 1


@njit(cache=True)
def push_front(wk: IntArray, sc: IntArray, req: int) -> None:
    sc[W_HEAD] = (sc[W_HEAD] - 1) % wk.shape[1]
    wk[WAITING_Q, sc[W_HEAD]] = req
    sc[W_LEN] += 1


@njit(cache=True)
def pop_front(wk: IntArray, sc: IntArray) -> int:
    req = wk[WAITING_Q, sc[W_HEAD]]
    sc[W_HEAD] = (sc[W_HEAD] + 1) % wk.shape[1]
    sc[W_LEN] -= 1
    return req


@njit(cache=True)
def remove_running(wk: IntArray, sc: IntArray, req: int) -> None:
    """Take ``req`` out of the running set, keeping the others' order."""
    k = 0
    for j in range(sc[R_LEN]):
        r = wk[RUNNING_Q, j]
        if r != req:
            wk[RUNNING_Q, k] = r
            k += 1
    sc[R_LEN] = k


# ---- requests (SchedulerState) ---------------------------------------------------------------------------------------


@njit(cache=True)
def remaining(ri: IntArray, req: int) -> int:
    return ri[PROMPT, req] + ri[GENERATED, req] - ri[COMPUTED, req]


@njit(cache=True)
def is_prefilling(ri: IntArray, req: int) -> bool:
    return ri[GENERATED, req] == 0 or remaining(ri, req) > 1


@njit(cache=True)
def next_arrival(rf: FloatArray, wk: IntArray, sc: IntArray) -> float:
    """Arrival time of the next request in the inbox not yet received; inf when there is none (for now)."""
    a = sc[ARRIVED]
    return rf[ARRIVAL, wk[INBOX, a]] if a < sc[ROUTED] else math.inf


@njit(cache=True)
def more_arrivals(sc: IntArray) -> bool:
    """Whether any request is still to arrive here: in the inbox, or from a router that is still routing."""
    return sc[ARRIVED] < sc[ROUTED] or sc[MORE] != 0


@njit(cache=True)
def receive_arrivals(ri: IntArray, rf: FloatArray, wk: IntArray, sc: IntArray, now: float) -> None:
    j = sc[ARRIVED]
    while j < sc[ROUTED] and rf[ARRIVAL, wk[INBOX, j]] <= now:
        i = wk[INBOX, j]
        total = ri[PROMPT, i] + ri[OUTPUT, i]
        reason = 0
        if total > sc[MAX_MODEL_LEN]:
            reason = EXCEEDS_MAX_MODEL_LEN
        elif blocks_for(sc, total) > sc[NUM_BLOCKS]:
            reason = EXCEEDS_KV_CACHE
        if ri[PROMPT, i] <= 0 or ri[OUTPUT, i] <= 0:
            reason = EMPTY
        if reason:
            ri[STATUS, i] = REJECTED
            ri[REASON, i] = reason
            sc[UNFINISHED] -= 1
        else:
            ri[STATUS, i] = WAITING
            push_back(wk, sc, i)
        j += 1
    sc[ARRIVED] = j


@njit(cache=True)
def work_left(ri: IntArray, wk: IntArray, sc: IntArray) -> int:
    """Tokens this replica still has to compute for its unfinished requests: prompt left to prefill plus output left
    to decode, over the running and waiting requests and those routed here and not yet received (a router's
    ``least_tokens`` load)."""
    total = 0
    for j in range(sc[R_LEN]):
        r = wk[RUNNING_Q, j]
        total += max(ri[PROMPT, r] - ri[COMPUTED, r], 0) + ri[OUTPUT, r] - ri[GENERATED, r]
    for k in range(sc[W_LEN]):
        r = waiting_at(wk, sc, k)
        total += max(ri[PROMPT, r] - ri[COMPUTED, r], 0) + ri[OUTPUT, r] - ri[GENERATED, r]
    for j in range(sc[ARRIVED], sc[ROUTED]):
        r = wk[INBOX, j]
        total += ri[PROMPT, r] + ri[OUTPUT, r]
    return total


@njit(cache=True)
def admit_next(ri: IntArray, wk: IntArray, sc: IntArray) -> int:
    req = pop_front(wk, sc)
    ri[STATUS, req] = RUNNING
    ri[ADMIT_ORDER, req] = sc[ADMISSIONS]
    sc[ADMISSIONS] += 1
    wk[RUNNING_Q, sc[R_LEN]] = req
    sc[R_LEN] += 1
    return req


@njit(cache=True)
def preempt(ri: IntArray, wk: IntArray, sc: IntArray, req: int) -> None:
    remove_running(wk, sc, req)
    kv_free(ri, sc, req)
    ri[RECOMPUTED, req] += ri[COMPUTED, req]
    ri[COMPUTED, req] = 0
    ri[PREEMPTIONS, req] += 1
    ri[STATUS, req] = WAITING
    push_front(wk, sc, req)
    sc[PREEMPTED_SINCE] += 1


@njit(cache=True)
def release_running(ri: IntArray, rf: FloatArray, wk: IntArray, sc: IntArray, now: float) -> None:
    """End every seated request (all held: their batch has ended), freeing seats and memory."""
    n = sc[R_LEN]
    for j in range(n):
        req = wk[RUNNING_Q, j]
        kv_free(ri, sc, req)
        ri[STATUS, req] = FINISHED
        rf[RELEASED, req] = now
    sc[NUM_HELD] -= n
    sc[R_LEN] = 0
    sc[UNFINISHED] -= n


@njit(cache=True)
def reject_stalled(ri: IntArray, wk: IntArray, sc: IntArray) -> None:
    """The policy will never act again: end the running, then the waiting requests, with the reason STALLED."""
    for j in range(sc[R_LEN]):
        _reject(ri, sc, wk[RUNNING_Q, j])
    sc[R_LEN] = 0
    while sc[W_LEN] > 0:
        _reject(ri, sc, pop_front(wk, sc))


@njit(cache=True)
def _reject(ri: IntArray, sc: IntArray, req: int) -> None:
    kv_free(ri, sc, req)
    ri[STATUS, req] = REJECTED
    ri[REASON, req] = STALLED
    sc[UNFINISHED] -= 1
