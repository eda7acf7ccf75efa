"""The scheduler state as flat arrays, and its operations compiled with numba: the compiled engine's twin of
``sim.state`` (the batch and the accounting after it are in ``sim.compiled.batch``; the KV cache, which both engines
share, is ``sim.kernels.kv``).

Every function here mirrors a method of ``SchedulerState`` step for step (same order, same tie-breaks), so that a
compiled policy (``policies.compiled``) on this state makes the very decisions its Python class makes on
``SchedulerState``; tests run both and compare the records to the last bit.

The state is four arrays, passed to every function as ``ri, rf, wk, sc``, beside the KV cache's (``kv``,
``sim.kernels.kvstate``) and the conversations' (``ss``: ``turn_at, turns, think``, ``sim.kernels.sessions``):
- ``ri`` int64 ``[row, request]``: the request counters (rows ``PROMPT`` ...);
- ``rf`` float64 ``[row, request]``: arrival and the timestamps (rows ``ARRIVAL`` ...);
- ``wk`` int64 ``[row, slot]``: the waiting queue (a ring buffer, FCFS, preempted requests back at the front), the
  running set (admission order), the batch being built, scratch space and the iteration's shape;
- ``sc`` int64: scalars (``W_HEAD`` ...).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from sim.kernels import kv as kvc
from sim.kernels.jit import kernel
from sim.kernels.kvstate import BLOCK_SIZE, NUM_BLOCKS
from sim.kernels.sessions import LEN, next_arrived, next_turn_at, reject_turns, release_turns
from sim.request import Reason, RequestTable, Status

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# rows of ri (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS: speculative decoding's, ``RequestTable``'s columns of the names)
PROMPT, OUTPUT, COMPUTED, GENERATED, STATUS, REASON, PREEMPTIONS, RECOMPUTED, ADMIT_ORDER, CACHED, STAMP = range(11)
DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS = range(11, 14)
NUM_RI = 14
# rows of rf
ARRIVAL, FIRST_SCHEDULED, FIRST_TOKEN, LAST_TOKEN, FINISH, RELEASED = range(6)
NUM_RF = 6
# rows of wk (INBOX: the requests routed to this replica, in arrival order; a single replica's are all of them;
# SCRATCH and TOKENS: room for a list of requests and their tokens; BATCH_VERIFIED: of each batch entry's tokens, those
# not draft tokens; VF_NEW, VF_CTX: the shape's verified sequences)
WAITING_Q, RUNNING_Q, BATCH_IDS, BATCH_NEW, SCRATCH, TOKENS, PF_NEW, PF_CTX, DEC_CTX, INBOX = range(10)
BATCH_VERIFIED, VF_NEW, VF_CTX = range(10, 13)
NUM_WK = 13
# indices of sc
W_HEAD, W_LEN, R_LEN, ARRIVED, ADMISSIONS, UNFINISHED, NUM_HELD, PREEMPTED_SINCE = range(8)
B_LEN, B_HOLD, BATCH_NO, MAX_MODEL_LEN, N_ITERS, N_BATCH_ROWS = range(8, 14)  # N_BATCH_ROWS: rows of the batch log
# B_CACHED: entries of the batch whose blocks a prefix cache has cached (``sim.kernels.kv.found``); ROUTED: requests
# in the inbox; MORE: 1 while a router may still route more (a replica of a cluster); IN_FLIGHT:
# an iteration has been decided and not yet accounted for (its shape has N_PF prefill chunks and N_DEC decodes);
# SLEEPING: waiting until ``clock[WAKE]`` (inf: until something is routed to it); SESSIONS: 1 with conversations;
# LOG_BASE: iterations in the iteration log's full chunks (``sim.records.IterationLog``); SHAPE_CTX and
# SHAPE_PF_TOKENS: the iteration in flight's context and prefill tokens
ROUTED, MORE, IN_FLIGHT, N_PF, N_DEC, SLEEPING, SESSIONS, LOG_BASE, B_CACHED, SHAPE_CTX, SHAPE_PF_TOKENS = range(14, 25)
# speculative decoding (``sim.speculation``): the replica's draft count, lookahead slots, input slots a request takes
# and whether admissions are padded (0 without it); the batch's entries from the pass over the running requests and
# whether one continued a prefill; the in-flight iteration's verified sequences, prefill entries and decodes (as the
# log counts them: a padded prompt of one token is verified and a prefill)
SPEC_K, SPEC_LOOKAHEAD, SPEC_SLOTS, SPEC_PAD, B_RUNNING, B_RUNNING_PREFILL, N_VF, LOG_PF, LOG_DEC = range(25, 34)
NUM_SCALARS = 34
# the float scalars of a run (``clock``): the iteration in flight, and the wake-up time of a sleeping replica
FLIGHT_START, FLIGHT_END, WAKE = range(3)

PENDING, WAITING, RUNNING, HELD_DONE, FINISHED, REJECTED = (int(s) for s in Status)
EMPTY = int(Reason.EMPTY)
EXCEEDS_MAX_MODEL_LEN = int(Reason.EXCEEDS_MAX_MODEL_LEN)
EXCEEDS_KV_CACHE = int(Reason.EXCEEDS_KV_CACHE)
STALLED = int(Reason.STALLED)

# the request table's columns in ri, by row
_RI_COLUMNS = ((PROMPT, "prompt"), (OUTPUT, "output_wanted"), (COMPUTED, "computed"), (GENERATED, "generated"),
               (STATUS, "status"), (REASON, "reason"), (PREEMPTIONS, "preemptions"), (RECOMPUTED, "recomputed"),
               (ADMIT_ORDER, "admit_order"), (CACHED, "cached"), (DRAFTS, "drafts"), (DRAFT_TOKENS, "draft_tokens"),
               (ACCEPTED_TOKENS, "accepted_tokens"))  # fmt: skip
_RF_COLUMNS = tuple(enumerate(("arrival", "first_scheduled", "first_token", "last_token", "finish", "released")))
_INPUTS = ("prompt", "output_wanted", "arrival")  # never written back (a conversation's arrivals are shared)


def pack(requests: RequestTable) -> tuple[IntArray, FloatArray]:
    """The request table as the ``ri`` and ``rf`` blocks. The table's columns of the blocks' type become the blocks'
    rows (no copy: a long run's request table is one of its largest records); ``unpack`` writes back the others. The
    lengths and arrivals stay the table's own, but a conversation's arrivals, which the run writes."""
    n = len(requests)
    ri = np.zeros((NUM_RI, n), dtype=np.int64)
    for row, name in _RI_COLUMNS:
        column = getattr(requests, name)
        if column.any():  # the zeros are there already (and untouched: np.zeros takes memory as it is written)
            ri[row] = column
        if row not in (PROMPT, OUTPUT):
            _share(requests, name, ri[row])
    ri[STAMP] = -1
    rf = np.zeros((NUM_RF, n))
    for row, name in _RF_COLUMNS:
        rf[row] = getattr(requests, name)
        if row != ARRIVAL:
            _share(requests, name, rf[row])
    if requests.after is not None:
        requests.arrival = rf[ARRIVAL]  # later turns' arrivals are written as they are sent (the table's own copy)
    return ri, rf


def _share(requests: RequestTable, name: str, row: npt.NDArray[np.generic]) -> None:
    """The table's column ``name`` becomes ``row``, if of its type (and not a view of a growing table's buffer)."""
    column = getattr(requests, name)
    if column.dtype == row.dtype and column.base is None:
        setattr(requests, name, row)


def unpack(ri: IntArray, rf: FloatArray, requests: RequestTable) -> None:
    """Write back into the request table the columns ``pack`` could not hand over (of smaller types)."""
    for block, columns in ((ri, _RI_COLUMNS), (rf, _RF_COLUMNS)):
        for row, name in columns:
            column = getattr(requests, name)
            if name not in _INPUTS and not np.may_share_memory(column, block):
                column[:] = block[row]


# ---- queues ----------------------------------------------------------------------------------------------------------


@kernel
def waiting_at(wk: IntArray, sc: IntArray, k: int) -> int:
    """The k-th request of the waiting queue (0 = front)."""
    return wk[WAITING_Q, (sc[W_HEAD] + k) % wk.shape[1]]


@kernel
def push_back(wk: IntArray, sc: IntArray, req: int) -> None:
    wk[WAITING_Q, (sc[W_HEAD] + sc[W_LEN]) % wk.shape[1]] = req
    sc[W_LEN] += 1


@kernel
def push_front(wk: IntArray, sc: IntArray, req: int) -> None:
    sc[W_HEAD] = (sc[W_HEAD] - 1) % wk.shape[1]
    wk[WAITING_Q, sc[W_HEAD]] = req
    sc[W_LEN] += 1


@kernel
def pop_front(wk: IntArray, sc: IntArray) -> int:
    req = wk[WAITING_Q, sc[W_HEAD]]
    sc[W_HEAD] = (sc[W_HEAD] + 1) % wk.shape[1]
    sc[W_LEN] -= 1
    return req


@kernel
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


@kernel
def remaining(ri: IntArray, req: int) -> int:
    return ri[PROMPT, req] + ri[GENERATED, req] - ri[COMPUTED, req]


@kernel
def is_prefilling(ri: IntArray, req: int) -> bool:
    return ri[GENERATED, req] == 0 or remaining(ri, req) > 1


@kernel
def next_arrival(rf: FloatArray, wk: IntArray, sc: IntArray, ss) -> float:  # noqa: ANN001
    """Arrival time of the next request in the inbox (or turn sent) not yet received; inf when there is none (for
    now)."""
    a = sc[ARRIVED]
    first = rf[ARRIVAL, wk[INBOX, a]] if a < sc[ROUTED] else math.inf
    return min(first, next_turn_at(ss)) if sc[SESSIONS] else first


@kernel
def more_arrivals(sc: IntArray, ss) -> bool:  # noqa: ANN001
    """Whether any request is still to arrive here: in the inbox, sent, or from a router that is still routing."""
    return sc[ARRIVED] < sc[ROUTED] or sc[MORE] != 0 or (sc[SESSIONS] != 0 and ss[5][LEN] > 0)


@kernel
def receive_arrivals(ri: IntArray, rf: FloatArray, wk: IntArray, sc: IntArray, kv, ss, now: float) -> None:  # noqa: ANN001
    if sc[SESSIONS]:
        while True:
            i, sc[ARRIVED] = next_arrived(ss, wk[INBOX], sc[ARRIVED], sc[ROUTED], rf[ARRIVAL], now)
            if i < 0:
                return
            receive(ri, rf, wk, sc, kv, ss, i, now)
    j = sc[ARRIVED]
    while j < sc[ROUTED] and rf[ARRIVAL, wk[INBOX, j]] <= now:
        receive(ri, rf, wk, sc, kv, ss, wk[INBOX, j], now)
        j += 1
    sc[ARRIVED] = j


@kernel
def receive(ri: IntArray, rf: FloatArray, wk: IntArray, sc: IntArray, kv, ss, i: int, now: float) -> None:  # noqa: ANN001
    """Request ``i`` has arrived: it joins the waiting queue, or is rejected if it can never run."""
    ks = kv[1]
    total = ri[PROMPT, i] + ri[OUTPUT, i]
    reason = 0
    if total > sc[MAX_MODEL_LEN]:
        reason = EXCEEDS_MAX_MODEL_LEN
    elif -(-total // ks[BLOCK_SIZE]) > ks[NUM_BLOCKS]:
        reason = EXCEEDS_KV_CACHE
    if ri[PROMPT, i] <= 0 or ri[OUTPUT, i] <= 0:
        reason = EMPTY
    if reason:
        ri[STATUS, i] = REJECTED
        ri[REASON, i] = reason
        sc[UNFINISHED] -= 1
        if sc[SESSIONS]:
            turns_rejected(ri, rf, wk, sc, ss, i, now)
    else:
        ri[STATUS, i] = WAITING
        push_back(wk, sc, i)


@kernel
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


@kernel
def admit_next(ri: IntArray, wk: IntArray, sc: IntArray) -> int:
    req = pop_front(wk, sc)
    ri[STATUS, req] = RUNNING
    ri[ADMIT_ORDER, req] = sc[ADMISSIONS]
    sc[ADMISSIONS] += 1
    wk[RUNNING_Q, sc[R_LEN]] = req
    sc[R_LEN] += 1
    return req


@kernel
def cached(ri: IntArray, req: int, tokens: int) -> None:
    """``req``, just admitted, found its first ``tokens`` tokens present (the prefix cache, or sent): computed."""
    ri[COMPUTED, req] += tokens
    if ri[PREEMPTIONS, req] == 0:
        ri[CACHED, req] = tokens


@kernel
def preempt(ri: IntArray, wk: IntArray, sc: IntArray, kv, req: int) -> None:  # noqa: ANN001
    remove_running(wk, sc, req)
    kvc.free(kv, req)
    ri[RECOMPUTED, req] += ri[COMPUTED, req]
    ri[COMPUTED, req] = 0
    ri[DRAFTS, req] = 0  # vLLM drops a preempted request's drafts
    ri[PREEMPTIONS, req] += 1
    ri[STATUS, req] = WAITING
    push_front(wk, sc, req)
    sc[PREEMPTED_SINCE] += 1


@kernel
def release_running(ri: IntArray, rf: FloatArray, wk: IntArray, sc: IntArray, kv, ss, now: float) -> None:  # noqa: ANN001
    """End every seated request (all held: their batch has ended), freeing seats and memory."""
    n = sc[R_LEN]
    for j in range(n):
        req = wk[RUNNING_Q, j]
        kvc.free(kv, req)
        ri[STATUS, req] = FINISHED
        rf[RELEASED, req] = now
        if sc[SESSIONS]:
            release_turns(ss, rf[ARRIVAL], req, now)
    sc[NUM_HELD] -= n
    sc[R_LEN] = 0
    sc[UNFINISHED] -= n


@kernel
def reject_stalled(ri: IntArray, rf: FloatArray, wk: IntArray, sc: IntArray, kv, ss, now: float) -> None:  # noqa: ANN001
    """The policy will never act again: end the running, then the waiting requests, with the reason STALLED."""
    for j in range(sc[R_LEN]):
        _reject(ri, rf, wk, sc, kv, ss, wk[RUNNING_Q, j], now)
    sc[R_LEN] = 0
    while sc[W_LEN] > 0:
        _reject(ri, rf, wk, sc, kv, ss, pop_front(wk, sc), now)


@kernel
def _reject(ri: IntArray, rf: FloatArray, wk: IntArray, sc: IntArray, kv, ss, req: int, now: float) -> None:  # noqa: ANN001
    kvc.free(kv, req)
    ri[STATUS, req] = REJECTED
    ri[REASON, req] = STALLED
    sc[UNFINISHED] -= 1
    if sc[SESSIONS]:
        turns_rejected(ri, rf, wk, sc, ss, req, now)


# ---- conversations (SchedulerState._turn_ended, _turn_rejected) -----------------------------------------------------


@kernel
def turns_rejected(ri: IntArray, rf: FloatArray, wk: IntArray, sc: IntArray, ss, req: int, now: float) -> None:  # noqa: ANN001
    """``req`` was rejected: the turns after it are too (``wk[SCRATCH]`` is free whenever a request is rejected)."""
    sc[UNFINISHED] -= reject_turns(ss, ri[STATUS], ri[REASON], rf[ARRIVAL], req, now, wk[SCRATCH])
