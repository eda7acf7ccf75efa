"""Scheduler state: the queues a policy decides over, and the bookkeeping that follows each iteration.

The split follows vLLM's ``schedule()`` / ``update_from_output()``: a policy moves requests between the waiting queue
and the running set (admit, preempt, release) and returns a batch; after the batch has run, whoever ran it (the
simulated engine, or a real executor) calls ``complete`` to advance the counters and write the records. Nothing here
knows about SimPy or about how long anything takes: times come in from the caller.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from costmodel.shape import IterationShape
from sim.kernels.sessions import (
    LEN,
    Sessions,
    first_turns,
    next_arrived,
    next_turn_at,
    reject_turns,
    release_turns,
    sessions_of,
)
from sim.kernels.speculation import accepted
from sim.kvcache import KVCacheManager
from sim.records import BatchLog, ItlLog, RunRecords
from sim.request import Reason, RequestTable, Status
from sim.speculation import NUM_DRAFTS, Speculation

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Batch:
    """One iteration's work, as a policy decides it."""

    # requests that take part, in the order they were scheduled
    req_ids: IntArray
    # tokens each one computes this iteration: a prompt chunk (or recompute), or 1 for a decode step; with speculative
    # decoding, beyond the tokens it needs before its next sample (``RequestTable.remaining``), its draft tokens (or
    # placeholders padding it to 1 + k, never accepted, where it had none: ``sim.speculation``)
    num_new: IntArray
    # True: a request that makes its last token keeps its seat and memory until the policy releases its whole batch
    # (static batching); False: it leaves and frees its memory at once
    hold_finished: bool = False

    def __post_init__(self) -> None:
        if len(self.req_ids) != len(self.num_new):
            raise ValueError("req_ids and num_new must have the same length")

    def __len__(self) -> int:
        return len(self.req_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.num_new.sum())


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to run now: wake the policy at ``until`` (seconds on the engine clock) or at the next arrival,
    whichever is first. ``until=None`` means at the next arrival only."""

    until: float | None = None


def max_gaps(requests: RequestTable) -> int:
    """The most inter-token gaps a run can make: each request's output tokens but its first."""
    return int(np.maximum(requests.output_wanted - 1, 0).sum())


class SchedulerState:
    """The replica's queues and requests, as a policy sees them."""

    def __init__(
        self,
        requests: RequestTable,
        kv: KVCacheManager,
        max_model_len: int,
        exact_itl: bool | None = None,
        record_batches: bool = False,
        routed: bool = False,
        spec: Speculation | None = None,
    ) -> None:
        """``routed``: a replica of a cluster, which receives the requests a router hands it (``route``) rather
        than every request of the table. ``spec``: speculative decoding, which the policy schedules and ``complete``
        verifies."""
        self.reqs = requests
        self.kv = kv
        self.max_model_len = int(max_model_len)
        self.spec = spec
        self.now = 0.0  # seconds, set by the caller before each decision
        self.waiting: deque[int] = deque()  # FCFS; preempted requests go back to the front
        self.running: list[int] = []  # seated requests, in admission order (the last is preempted first)
        self.records = RunRecords(
            requests=requests,
            itl=ItlLog(0 if routed else max_gaps(requests), exact_itl),
            kv_num_blocks=kv.num_blocks,
            kv_block_size=kv.block_size,
            batches=BatchLog() if record_batches else None,
            speculation=spec.counters() if spec is not None else None,
        )
        # the inbox: the requests this replica serves, in arrival order, and their arrivals (s); [0, routed) are
        # valid. A single replica's are all the requests; a cluster's router adds them one by one (``route``).
        self.inbox = np.arange(0 if routed else requests.n, dtype=np.int64)
        self.inbox_arrival = requests.arrival[: len(self.inbox)]
        self.routed = len(self.inbox)
        self.more = routed  # whether a router may still route requests here
        self._arrived = 0  # inbox[0, _arrived) have arrived
        self._admissions = 0
        self._preempted_since_batch = 0
        self.unfinished = self.routed  # requests (routed here) not yet finished or rejected
        self.num_held = 0  # seated requests that are done and wait for their batch to end
        self.sessions: Sessions | None = None  # multi-turn sessions (``sim.kernels.sessions``)
        if requests.after is not None:
            self._sessions(requests.after, routed)

    def _sessions(self, after: npt.NDArray[np.int64], routed: bool) -> None:
        """Only first turns are in the inbox at the start; each later turn is sent when the turn before ends."""
        if routed:
            raise ValueError("multi-turn sessions run on one replica (a cluster routes each request as it arrives)")
        assert self.reqs.think is not None
        self.reqs.arrival = self.reqs.arrival.copy()  # later turns' arrivals are written as they are sent
        self.inbox = first_turns(after)
        self.inbox_arrival = self.reqs.arrival[self.inbox]
        self.routed = len(self.inbox)
        self.sessions = sessions_of(after, self.reqs.think)

    # ---- arrivals -------------------------------------------------------------------------------------------------
    @property
    def next_arrival(self) -> float:
        """Arrival time of the next request in the inbox (or turn sent) not yet arrived (s); inf when there is none
        (for now)."""
        first = float(self.inbox_arrival[self._arrived]) if self._arrived < self.routed else float("inf")
        return first if self.sessions is None else min(first, float(next_turn_at(self.sessions)))

    @property
    def more_arrivals(self) -> bool:
        """Whether any request is still to arrive here: in the inbox, sent, or from a router still routing."""
        pending = self.sessions is not None and self.sessions[5][LEN] > 0
        return self._arrived < self.routed or pending or self.more

    def route(self, req: int) -> None:
        """A router hands this replica request ``req`` (arriving no earlier than those before it)."""
        self._grow_inbox()
        self.inbox[self.routed] = req
        self.inbox_arrival[self.routed] = self.reqs.arrival[req]
        self.routed += 1
        self.unfinished += 1
        self.records.itl.reserve(max(int(self.reqs.output_wanted[req]) - 1, 0))

    def _grow_inbox(self) -> None:
        if self.routed == len(self.inbox):
            size = max(64, 2 * len(self.inbox))
            self.inbox = np.concatenate([self.inbox, np.zeros(size - len(self.inbox), dtype=np.int64)])
            self.inbox_arrival = np.concatenate([self.inbox_arrival, np.zeros(size - len(self.inbox_arrival))])

    def _turn_ended(self, req: int, when: float) -> None:
        """Sessions: the response of ``req`` ended at ``when`` (s); each turn after it is sent a think time later
        (``sim.kernels.sessions``, which the compiled engine runs too)."""
        assert self.sessions is not None
        release_turns(self.sessions, self.reqs.arrival, req, when)

    def _turn_rejected(self, req: int) -> None:
        """Sessions: ``req`` was rejected, so its client sends none of the turns after it: each ends now, rejected."""
        assert self.sessions is not None
        stack = np.zeros(len(self.sessions[1]) + 1, dtype=np.int64)
        r = self.reqs
        self.unfinished -= int(reject_turns(self.sessions, r.status, r.reason, r.arrival, req, self.now, stack))

    def work_left(self) -> int:
        """Tokens still to compute for the unfinished requests here: prompt left to prefill plus output left to
        decode (running, waiting, and routed here but not yet received): a router's ``least_tokens`` load."""
        r = self.reqs
        queued = np.array(list(self.running) + list(self.waiting), dtype=np.int64)
        pending = self.inbox[self._arrived : self.routed]
        left = np.maximum(r.prompt[queued] - r.computed[queued], 0) + r.output_wanted[queued] - r.generated[queued]
        return int(left.sum() + r.prompt[pending].sum() + r.output_wanted[pending].sum())

    def receive_arrivals(self, now: float) -> None:
        """Queue every request that has arrived by ``now``, rejecting those that can never run."""
        reqs = self.reqs
        if self.sessions is not None:
            ids = self._arrived_turns(now)
            if not len(ids):
                return
        else:
            end = self._arrived + int(
                np.searchsorted(self.inbox_arrival[self._arrived : self.routed], now, side="right")
            )
            if end <= self._arrived:
                return
            ids = self.inbox[self._arrived : end]
            self._arrived = end
        total = reqs.prompt[ids] + reqs.output_wanted[ids]
        reason = np.zeros(len(ids), dtype=np.int8)
        reason[total > self.max_model_len] = Reason.EXCEEDS_MAX_MODEL_LEN
        reason[(reason == 0) & (self.kv.blocks_for(total) > self.kv.num_blocks)] = Reason.EXCEEDS_KV_CACHE
        reason[(reqs.prompt[ids] <= 0) | (reqs.output_wanted[ids] <= 0)] = Reason.EMPTY
        ok = reason == 0
        for i, why in zip(ids[~ok].tolist(), reason[~ok].tolist(), strict=True):
            self.reject(i, Reason(why))
        reqs.status[ids[ok]] = Status.WAITING
        self.waiting.extend(ids[ok].tolist())

    def _arrived_turns(self, now: float) -> npt.NDArray[np.int64]:
        """Sessions: the first turns and sent turns arrived by ``now``, in the order they arrive (a first turn before
        a sent one arriving at the same time)."""
        assert self.sessions is not None
        ids: list[int] = []
        while True:
            req, self._arrived = next_arrived(self.sessions, self.inbox, self._arrived, self.routed, self.reqs.arrival,
                                              now)  # fmt: skip
            if req < 0:
                return np.array(ids, dtype=np.int64)
            ids.append(req)

    def reject(self, req: int, reason: Reason) -> None:
        """End ``req`` for good without running it (or stop it, freeing what it holds)."""
        if self.reqs.status[req] in (Status.RUNNING, Status.HELD):
            self.running.remove(req)
        elif self.reqs.status[req] == Status.WAITING:
            self.waiting.remove(req)
        self.kv.free_request(req)
        self.reqs.status[req] = Status.REJECTED
        self.reqs.reason[req] = reason
        self.unfinished -= 1
        if self.sessions is not None:
            self._turn_rejected(req)

    # ---- what policies do -----------------------------------------------------------------------------------------
    def admit_next(self) -> int:
        """Move the request at the front of the waiting queue into the running set; returns its id."""
        req = self.waiting.popleft()
        self.reqs.status[req] = Status.RUNNING
        self.reqs.admit_order[req] = self._admissions
        self._admissions += 1
        self.running.append(req)
        return req

    def cached(self, req: int, tokens: int) -> None:
        """``req``, just admitted, found its first ``tokens`` tokens in the prefix cache: they count as computed."""
        reqs = self.reqs
        reqs.computed[req] += tokens
        if reqs.preemptions[req] == 0:
            reqs.cached[req] = tokens

    def preempt(self, req: int) -> None:
        """Preempt a running request by recompute: drop its KV, put it back at the front of the waiting queue."""
        reqs = self.reqs
        self.running.remove(req)
        self.kv.free_request(req)
        reqs.recomputed[req] += reqs.computed[req]
        reqs.computed[req] = 0
        reqs.drafts[req] = 0  # vLLM drops a preempted request's drafts
        reqs.preemptions[req] += 1
        reqs.status[req] = Status.WAITING
        self.waiting.appendleft(req)
        self._preempted_since_batch += 1

    def release(self, reqs: list[int]) -> None:
        """End held requests (their batch has ended): free their seats and memory."""
        gone = set(reqs)
        for req in reqs:
            if self.reqs.status[req] != Status.HELD:
                raise ValueError(f"request {req} is not held (status {Status(self.reqs.status[req]).name})")
            self.kv.free_request(req)
            self.reqs.status[req] = Status.FINISHED
            self.reqs.released[req] = self.now
            if self.sessions is not None:
                self._turn_ended(req, self.now)
        self.num_held -= len(reqs)
        self.running = [r for r in self.running if r not in gone]
        self.unfinished -= len(reqs)

    # ---- what the executor does ---------------------------------------------------------------------------------
    def shape_of(self, batch: Batch) -> IterationShape:
        """The cost model's view of a batch: prefill chunks and decode steps with their cached context, and the
        requests verified with draft tokens (a query of all their tokens)."""
        reqs = self.reqs
        ids = batch.req_ids
        ctx = reqs.computed[ids]
        prefill = reqs.is_prefilling(ids)
        samples = ctx + batch.num_new == reqs.total_tokens(ids)
        verify = batch.num_new > reqs.remaining(ids)
        if not verify.any():
            return IterationShape(
                prefill_new=batch.num_new[prefill],
                prefill_ctx=ctx[prefill],
                decode_ctx=ctx[~prefill],
                prefill_sampled=int(np.count_nonzero(samples & prefill)),
            )
        plain = prefill & ~verify
        return IterationShape(
            prefill_new=batch.num_new[plain],
            prefill_ctx=ctx[plain],
            decode_ctx=ctx[~prefill & ~verify],
            prefill_sampled=int(np.count_nonzero(samples & plain)),
            verify_new=batch.num_new[verify],
            verify_ctx=ctx[verify],
        )

    def _verify(self, ids: IntArray, drafts: IntArray) -> IntArray:
        """The drafts each of ``ids`` accepts of ``drafts`` scheduled (``sim.kernels.speculation``); placeholders,
        scheduled to a request that had no drafts, none."""
        spec, reqs = self.spec, self.reqs
        out = np.zeros(len(ids), dtype=np.int64)
        if spec is None:
            return out
        for j in np.flatnonzero((drafts > 0) & (reqs.drafts[ids] > 0)).tolist():
            req = int(ids[j])
            out[j] = accepted(spec.rates, spec.seed, req, int(reqs.generated[req]), int(drafts[j]))
        return out

    def complete(self, batch: Batch, shape: IterationShape, start: float, end: float) -> None:
        """Account for a batch that ran from ``start`` to ``end`` (s): advance counters, sample tokens, finish
        requests, and append the iteration's record."""
        reqs = self.reqs
        ids = batch.req_ids
        total = reqs.total_tokens(ids)  # before this step's samples
        prefilling = reqs.is_prefilling(ids)
        drafts = np.maximum(batch.num_new - (total - reqs.computed[ids]), 0)  # draft tokens verified (or placeholders)
        took = self._verify(ids, drafts)
        if self.records.batches is not None:
            iteration = len(self.records.iterations)
            self.records.batches.append(iteration, ids, batch.num_new, reqs.computed[ids], prefilling, drafts, took)
        counts = (int(np.count_nonzero(prefilling)), int((batch.num_new - drafts)[prefilling].sum()),
                  int(np.count_nonzero(~prefilling)), int(reqs.computed[ids].sum()))  # fmt: skip
        new_first = ids[np.isnan(reqs.first_scheduled[ids])]
        reqs.first_scheduled[new_first] = start
        reqs.computed[ids] += batch.num_new
        self.kv.computed(ids, np.minimum(reqs.computed[ids], total))  # the verified tokens only (vLLM caches no draft)
        short = self.kv.blocks_for(reqs.computed[ids]) > self.kv.held[ids]
        if short.any():
            req = int(ids[short][0])
            raise RuntimeError(
                f"request {req} computed {reqs.computed[req]} tokens but holds only {self.kv.held[req]} KV blocks "
                f"of {self.kv.block_size}: the policy scheduled tokens without allocating room for them"
            )
        sampling = reqs.computed[ids] >= total
        sampled = ids[sampling]
        first = reqs.generated[sampled] == 0
        reqs.first_token[sampled[first]] = end
        later = sampled[~first]
        self.records.itl.add(end - reqs.last_token[later])  # one gap a step (the tokens of a step come as one chunk)
        if self.spec is None:
            reqs.generated[sampled] += 1
        else:  # the rejected drafts rolled back; the accepted ones and one more (bonus or correction) appended
            self.roll_back(ids, drafts - took)
            made = np.minimum(took[sampling] + 1, reqs.output_wanted[sampled] - reqs.generated[sampled])
            reqs.generated[sampled] += made
            reqs.draft_tokens[ids] += drafts
            reqs.accepted_tokens[ids] += took
            self._count_drafts(drafts, took)
        reqs.last_token[sampled] = end
        done = sampled[reqs.generated[sampled] >= reqs.output_wanted[sampled]]
        if self.spec is not None:  # proposed by the drafter for the requests that sampled and go on
            reqs.drafts[ids] = 0
            reqs.drafts[np.setdiff1d(sampled, done)] = self.spec.drafts_after(len(ids))
        reqs.finish[done] = end
        seats, held = len(self.running), self.num_held
        kv_used = self.kv.used
        if len(done):
            if batch.hold_finished:
                reqs.status[done] = Status.HELD
                self.num_held += len(done)
            else:
                reqs.status[done] = Status.FINISHED
                reqs.released[done] = end
                for req in done.tolist():
                    self.kv.free_request(req)
                    if self.sessions is not None:
                        self._turn_ended(req, end)
                gone = set(done.tolist())
                self.running = [r for r in self.running if r not in gone]
                self.unfinished -= len(done)
        self.records.iterations.append(
            start,
            end,
            (
                *counts,
                kv_used,
                seats,
                held,
                len(self.waiting),
                self._preempted_since_batch,
                len(done),
                int(drafts.sum()),
                int(took.sum()),
            ),
        )
        self._preempted_since_batch = 0

    def roll_back(self, ids: IntArray, rejected: IntArray) -> None:
        """The rejected drafts of a step leave the computed tokens (vLLM's ``num_computed_tokens -= num_rejected``)."""
        self.reqs.computed[ids] -= rejected

    def _count_drafts(self, drafts: IntArray, took: IntArray) -> None:
        """vLLM's spec-decode counters: verification steps with drafts, and the drafts accepted at each position."""
        counters = self.records.speculation
        assert counters is not None
        counters[NUM_DRAFTS] += int(np.count_nonzero(drafts))
        for a in took[took > 0].tolist():
            counters[1 : 1 + a] += 1
