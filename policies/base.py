"""What a policy is, the registry of policies by name, and the batch-building steps that several policies share.

A policy decides the next iteration from the scheduler state and nothing else: it never computes seconds and never
touches SimPy. That is what lets the same policy object drive a simulated clock or a real model.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from policies.by_name import load_class
from policies.config import SchedulerConfig
from sim.request import Status
from sim.state import Batch, SchedulerState, Wait

IntArray = npt.NDArray[np.int64]


@runtime_checkable
class Policy(Protocol):
    """A batching policy: one decision per iteration."""

    name: ClassVar[str]

    def schedule(self, state: SchedulerState) -> Batch | Wait:
        """Choose the next iteration's batch (admitting, preempting or releasing requests through ``state``), or
        say when to ask again."""
        ...


_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: make a policy available by its ``name``."""
    _REGISTRY[cls.name] = cls  # type: ignore[attr-defined]
    return cls


def names() -> list[str]:
    """Names of the registered policies."""
    return sorted(_REGISTRY)


def get_class(name: str) -> Any:
    """The policy class ``name`` names: a registered name, or ``package.module:Class`` (a class with
    ``from_config`` and ``schedule``)."""
    return load_class(name, "policy", _REGISTRY, ("from_config", "schedule"),
                      "from_config(SchedulerConfig) and schedule(state)")  # fmt: skip


def get(config: SchedulerConfig) -> Policy:
    """Build the policy ``config.policy`` names: a registered name, or ``package.module:Class`` for a user's own
    policy (a class with ``from_config(SchedulerConfig)`` and ``schedule(state)``)."""
    name = config.policy
    cls = get_class(name)
    try:
        policy = cls.from_config(config)
    except TypeError as exc:  # a user's class whose from_config takes something else
        raise ValueError(
            f"policy {name!r}: {name.rpartition(':')[2]}.from_config(SchedulerConfig) failed: {exc}"
        ) from None
    if not isinstance(policy, Policy):
        raise ValueError(f"policy {name!r} has no schedule(state) method")
    return policy


# ---- shared steps ---------------------------------------------------------------------------------------------------


class BatchBuilder:
    """Collects (request, tokens) pairs for one iteration and the token budget left."""

    __slots__ = ("ids", "num_new", "verified", "budget", "slots", "scheduled", "preempted", "cached", "running",
                 "running_prefill")  # fmt: skip

    def __init__(self, budget: int, slots: int = 0) -> None:
        """``slots``: input slots each scheduled request takes beyond its tokens (speculative decoding with a draft
        model: vLLM's ``max_num_new_slots_for_drafting``), charged as vLLM charges them to its input budget."""
        self.ids: list[int] = []
        self.num_new: list[int] = []
        self.verified: list[int] = []  # of each entry's tokens, those not draft tokens (what a prefix cache caches)
        self.budget = budget - slots  # tokens still allowed this iteration (with a draft model, less its slots)
        self.slots = slots
        self.scheduled: set[int] = set()  # requests already in the batch (never chosen as preemption victims)
        self.preempted = False  # whether this step preempted anything
        self.cached = 0  # entries whose blocks a prefix cache has cached already (``admit_waiting``)
        self.running = 0  # entries the pass over the running requests scheduled (speculative decoding's padding)
        self.running_prefill = False  # whether one of those continued a prefill

    def add(self, req: int, tokens: int, verified: int | None = None) -> None:
        self.ids.append(req)
        self.num_new.append(tokens)
        self.verified.append(tokens if verified is None else verified)
        self.scheduled.add(req)
        self.budget -= tokens + self.slots

    def end_running_pass(self, state: SchedulerState) -> None:
        """Note what the pass over the running requests scheduled (vLLM's ``scheduled_running_reqs`` and
        ``prefill_scheduled``, which decide whether an admission is padded with placeholder drafts)."""
        self.running = len(self.ids)
        if self.ids:
            self.running_prefill = bool(state.reqs.is_prefilling(np.array(self.ids, dtype=np.int64)).any())

    def build(self, hold_finished: bool = False) -> Batch | None:
        if not self.ids:
            return None
        return Batch(
            req_ids=np.array(self.ids, dtype=np.int64),
            num_new=np.array(self.num_new, dtype=np.int64),
            hold_finished=hold_finished,
        )


def draft_slots(state: SchedulerState) -> int:
    """Input slots each scheduled request takes beyond its tokens (speculative decoding with a draft model)."""
    return state.spec.draft_slots if state.spec is not None else 0


def allocate_or_preempt(state: SchedulerState, req: int, tokens: int, batch: BatchBuilder) -> bool:
    """Give running request ``req`` room for ``tokens`` tokens in all, preempting by recompute when the cache is full.

    The victim is the most recently admitted running request not already in this batch (vLLM V1 preempts from the
    end of its running list); when only ``req`` itself is left, ``req`` is preempted and ``False`` returned."""
    while not state.kv.allocate(req, tokens):
        victim = next((r for r in reversed(state.running) if r != req and r not in batch.scheduled), None)
        state.preempt(req if victim is None else victim)
        batch.preempted = True
        if victim is None:
            return False
    return True


def schedule_decodes(state: SchedulerState, batch: BatchBuilder) -> None:
    """Give every running request that is decoding its one token, oldest admission first, within the budget."""
    reqs = state.reqs
    running = np.array(state.running, dtype=np.int64)
    if not len(running):
        return
    decoding = running[~reqs.is_prefilling(running)][: max(batch.budget, 0)]
    if not len(decoding):
        return
    if state.kv.allocate_all(decoding, reqs.computed[decoding] + 1):  # the common case: room for everyone
        batch.ids.extend(decoding.tolist())
        batch.num_new.extend([1] * len(decoding))
        batch.verified.extend([1] * len(decoding))
        batch.scheduled.update(batch.ids[-len(decoding) :])
        batch.budget -= len(decoding)
        return
    for req in decoding.tolist():
        if reqs.status[req] != Status.RUNNING:  # preempted as a victim earlier in this loop
            continue
        if allocate_or_preempt(state, req, int(reqs.computed[req]) + 1, batch):
            batch.add(req, 1)


def schedule_running(state: SchedulerState, batch: BatchBuilder, chunk_cap: int) -> None:
    """vLLM V1's first pass (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``, "First, schedule the
    RUNNING requests"; V0's ``_schedule_running`` makes the same pass): the running requests in admission order,
    decodes and unfinished prefills interleaved, each given what it still needs (one decode token, or its next prompt
    or recompute chunk of at most ``chunk_cap``) within the budget left, until the budget is spent. When a request's
    KV does not fit, the last running request is preempted by recompute, until it fits or the request itself was the
    last (which ends the pass)."""
    reqs, kv = state.reqs, state.kv
    running = np.array(state.running, dtype=np.int64)
    if not len(running) or batch.budget <= 0:
        return
    if state.spec is not None:
        _speculative_running(state, batch, running, chunk_cap)
        return
    # the common case first: everyone the budget reaches fits in the cache (all or nothing; same holdings as one by
    # one when all succeed)
    want = np.minimum(reqs.remaining(running), chunk_cap)
    before = np.cumsum(want) - want  # tokens given to those ahead of each request
    reached = int(np.searchsorted(before, batch.budget, side="left"))
    take = np.minimum(want[:reached], batch.budget - before[:reached])
    if kv.allocate_all(running[:reached], reqs.computed[running[:reached]] + take):
        batch.ids.extend(running[:reached].tolist())
        batch.num_new.extend(take.tolist())
        batch.verified.extend(take.tolist())
        batch.scheduled.update(batch.ids[-reached:])
        batch.budget -= int(take.sum())
        return
    _one_by_one(state, batch, chunk_cap, prefills_only=False)


def _speculative_running(state: SchedulerState, batch: BatchBuilder, running: IntArray, chunk_cap: int) -> None:
    """``schedule_running`` with speculative decoding (``sim.speculation``): each request wants what it needs and
    its draft tokens, capped at ``chunk_cap`` and at ``max_model_len - computed - 1``, and takes KV for them and the
    lookahead slots (at most ``max_model_len``); each takes its input slots from the budget too. The same
    all-or-nothing fast path, then one by one."""
    reqs, kv, spec = state.reqs, state.kv, state.spec
    assert spec is not None
    computed = reqs.computed[running]
    need = np.asarray(reqs.remaining(running))
    want = np.minimum(np.minimum(need + reqs.drafts[running], chunk_cap), state.max_model_len - computed - 1)
    step = want + batch.slots
    before = np.cumsum(step) - step  # budget taken by those ahead of each request
    reached = int(np.searchsorted(before, batch.budget, side="left"))
    take = np.minimum(want[:reached], batch.budget - before[:reached])
    if kv.allocate_all(running[:reached], np.minimum(computed[:reached] + take + spec.lookahead, state.max_model_len)):
        batch.ids.extend(running[:reached].tolist())
        batch.num_new.extend(take.tolist())
        batch.verified.extend(np.minimum(take, need[:reached]).tolist())
        batch.scheduled.update(batch.ids[-reached:])
        batch.budget -= int(take.sum()) + batch.slots * reached
        return
    _one_by_one(state, batch, chunk_cap, prefills_only=False)


def schedule_partial_prefills(state: SchedulerState, batch: BatchBuilder, chunk_cap: int) -> None:
    """Continue running requests whose prefill (or recompute) is unfinished, in chunks of at most ``chunk_cap``."""
    _one_by_one(state, batch, chunk_cap, prefills_only=True)


def _one_by_one(state: SchedulerState, batch: BatchBuilder, chunk_cap: int, prefills_only: bool) -> None:
    """Give running requests in admission order what they still need, within the budget and ``chunk_cap``, preempting
    when the cache is full (``prefills_only``: those not yet in the batch whose prefill is unfinished). It stops when
    a request had to preempt itself: everyone else still running is then in the batch already."""
    reqs, spec = state.reqs, state.spec
    for req in list(state.running):
        if batch.budget <= 0:
            return
        if reqs.status[req] != Status.RUNNING:  # preempted as a victim earlier in this pass
            continue
        if prefills_only and (req in batch.scheduled or not reqs.is_prefilling(req)):
            continue
        need, computed = int(reqs.remaining(req)), int(reqs.computed[req])
        if spec is None:
            tokens = min(need, chunk_cap, batch.budget)
            room = computed + tokens
        else:  # its draft tokens too, within max_model_len; KV for them and the lookahead slots
            tokens = min(need + int(reqs.drafts[req]), chunk_cap, batch.budget, state.max_model_len - computed - 1)
            room = min(computed + tokens + spec.lookahead, state.max_model_len)
        if not allocate_or_preempt(state, req, room, batch):
            return
        batch.add(req, tokens, min(tokens, need))


RESERVATIONS = ("paged", "output", "max_model_len")


def reserved_tokens(state: SchedulerState, req: int, tokens: int, reservation: str) -> int:
    """Tokens of KV to hold for ``req`` when it needs room for ``tokens``: just those when paged; its whole prompt +
    output (``output``) or ``max_model_len`` tokens, capped at the cache, when reserving up front."""
    if reservation == "paged":
        return tokens
    whole = int(state.reqs.prompt[req] + state.reqs.output_wanted[req])
    if reservation == "max_model_len":
        whole = max(whole, min(state.max_model_len, state.kv.capacity_tokens))
    return max(tokens, whole)


def admit_waiting(
    state: SchedulerState,
    batch: BatchBuilder,
    max_num_seqs: int,
    chunk_cap: int | None,
    reservation: str = "paged",
    full_prompt: bool = True,
) -> int:
    """Admit waiting requests FCFS while seats, budget and memory allow; returns how many were admitted.

    ``chunk_cap=None`` admits whole prompts only (no chunking: a prompt that does not fit the budget left waits, and
    so does everyone behind it); otherwise the first chunk is cut to the budget left and to ``chunk_cap``. A request
    is admitted only if the KV its ``reservation`` asks for fits and, with ``full_prompt`` (vLLM's
    ``scheduler_reserve_full_isl``, ``KVCacheManager.allocate_slots(full_sequence_must_fit=True)``), if the KV of
    all the tokens it holds (its prompt, plus what it had generated before a preemption) would fit as well, though
    only its first chunk's blocks are allocated now. Without ``full_prompt`` only the first chunk must fit (vLLM V1
    before ``scheduler_reserve_full_isl``). The watermark applies to both checks when something is running. With
    speculative decoding the chunk's KV takes the lookahead slots too, and a request one token short of its sequence
    may be padded with placeholder drafts (``pad_drafts``)."""
    reqs, kv, spec = state.reqs, state.kv, state.spec
    admitted = 0
    while state.waiting and len(state.running) < max_num_seqs and batch.budget > 0:
        req = state.waiting[0]
        total = int(reqs.total_tokens(req))
        # what the cache already holds of it is not computed again: a prefix found cached (vLLM's
        # get_computed_blocks; the blocks this step fills are cached first, as vLLM's allocate_slots caches them when
        # it schedules them), or the KV a prefill replica computed and sent (disaggregation)
        cached, hits, unreferenced = kv.found(req, total, batch.ids, batch.verified, reqs.computed, batch.cached)
        batch.cached = len(batch.ids)
        need = int(reqs.remaining(req)) - cached
        verified = need
        if spec is not None:
            need = pad_drafts(state, batch, int(reqs.computed[req]) + cached, need, cached)
            if need < 0:  # no room for the padded request: nobody else is admitted
                break
        chunk = need if chunk_cap is None else min(need, batch.budget, chunk_cap)
        if chunk > batch.budget:
            break
        tokens = reserved_tokens(state, req, int(reqs.computed[req]) + cached + chunk, reservation)
        if spec is not None:
            tokens = min(tokens + spec.lookahead, state.max_model_len)
        check = max(tokens, total) if full_prompt else tokens
        # the watermark keeps room for running requests to grow; with nothing running there is nobody to protect
        if not kv.fits(req, check, hits, unreferenced, admission=bool(state.running)):
            break
        state.admit_next()
        kv.take(req, hits, total)
        if cached:
            state.cached(req, cached)
        kv.allocate(req, tokens)
        batch.add(req, chunk, min(chunk, verified))
        admitted += 1
    return admitted


def pad_drafts(state: SchedulerState, batch: BatchBuilder, computed: int, need: int, cached: int) -> int:
    """The tokens a request being admitted is scheduled before its cap and the budget cut them: ``need``, or, when
    it needs one (a one-token prompt, or all but one token found cached), ``1 + k`` with ``k`` placeholder drafts,
    as vLLM pads new decodes to a uniform spec-decode size (``Scheduler.schedule``, ``pad_spec_decode``): only with
    a fixed draft count, when no request the running pass scheduled continued a prefill and one was scheduled or
    something was cached, and when ``1 + k`` more tokens and the sample fit ``max_model_len``. -1: the padded request
    does not fit the budget, and vLLM stops admitting."""
    spec = state.spec
    assert spec is not None
    padded = 1 + spec.num_speculative_tokens
    if not (spec.pad and need == 1 and not batch.running_prefill and (batch.running > 0 or cached > 0)):
        return need
    if computed + padded + 1 > state.max_model_len:
        return need
    return padded if padded <= batch.budget else -1
