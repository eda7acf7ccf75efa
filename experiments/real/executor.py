"""The real executor: a trace replayed in real time through a ferry policy, each batch run on a real model.

The loop is the simulator's turn (``sim.engine.decide``) against the wall clock instead of SimPy's: a request becomes
visible only once its arrival time has passed; the policy chooses a batch, or says when to ask again (the loop then
sleeps); the model runs the batch (``experiments.real.llama``); ``SchedulerState.complete`` writes the same records a
simulation writes, with real times. The same policy objects drive both, because a policy knows nothing of time.

An iteration is timed from the moment its turn began (the policy's decision, the previous iteration's bookkeeping and
the model's input preparation are host work of the iteration, as the cost model's overheads count them) to the moment
its sampled tokens are back on the host.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from costmodel.shape import IterationShape
from experiments.real.llama import Llama
from sim.engine import Scheduler, decide, describe_run
from sim.kvcache import KVCacheManager
from sim.records import RunRecords
from sim.request import RequestTable, Status
from sim.state import Batch, SchedulerState


class Executor:
    """Runs ferry batches on a model: keeps each request's token ids and the KV cache slot it owns."""

    def __init__(self, model: Llama, requests: RequestTable, rng: np.random.Generator, slots: int = 8) -> None:
        """``slots``: sequences the model's KV cache holds at once at first (it grows when more are seated)."""
        self.model = model
        vocab = model.spec.vocab_size
        # each request's tokens: its random prompt, then what it samples (what a recompute after preemption re-reads)
        self.tokens: list[list[int]] = [rng.integers(0, vocab, size=int(p)).tolist() for p in requests.prompt]
        self.slot_of: dict[int, int] = {}
        self.last_forward_s = 0.0  # seconds the latest iteration spent in the model's forward pass (device work)
        model.reserve_slots(max(slots, 1))
        self.free = list(range(model.slots - 1, -1, -1))

    def _slot(self, req: int) -> int:
        slot = self.slot_of.get(req)
        if slot is None:
            if not self.free:  # more sequences at once than reserved: grow the cache
                old = self.model.slots
                self.model.reserve_slots(2 * old)
                self.free = list(range(self.model.slots - 1, old - 1, -1))
            slot = self.slot_of[req] = self.free.pop()
        return slot

    def run(self, state: SchedulerState, batch: Batch) -> None:
        """Execute ``batch`` (one forward pass) and append the tokens it samples. Call before ``state.complete``:
        request i computes ``num_new[i]`` tokens on top of its ``computed`` cached ones."""
        reqs = state.reqs
        ids = batch.req_ids
        ctx = reqs.computed[ids]
        samples = np.asarray(ctx + batch.num_new == reqs.total_tokens(ids))
        prefilling = np.asarray(reqs.is_prefilling(ids))
        decodes: list[tuple[int, int, int]] = []
        prefills: list[tuple[int, int, list[int]]] = []
        dec_ids, pf_ids, dec_sample, pf_sample = [], [], [], []
        for req, c, n, pf, s in zip(
            ids.tolist(), ctx.tolist(), batch.num_new.tolist(), prefilling.tolist(), samples.tolist(), strict=True
        ):
            slot = self._slot(req)
            toks = self.tokens[req]
            if pf:
                prefills.append((slot, c, toks[c : c + n]))
                pf_ids.append(req)
                pf_sample.append(s)
            else:
                decodes.append((slot, c, toks[c]))
                dec_ids.append(req)
                dec_sample.append(s)
        order = dec_ids + pf_ids
        flags = dec_sample + pf_sample
        step = self.model.step(decodes, prefills, flags)
        started = time.perf_counter()
        out = self.model.forward(step).tolist()  # .tolist() waits for the device
        self.last_forward_s = time.perf_counter() - started
        sampled = [req for req, s in zip(order, flags, strict=True) if s]
        for req, token in zip(sampled, out, strict=True):
            self.tokens[req].append(int(token))

    def release(self, state: SchedulerState) -> None:
        """Free the cache slots of requests that are done (finished, held or rejected) or were preempted (their KV is
        dropped: a recompute starts again from token 0)."""
        reqs = state.reqs
        for req, slot in list(self.slot_of.items()):
            if reqs.status[req] >= Status.HELD or reqs.computed[req] == 0:
                del self.slot_of[req]
                self.free.append(slot)

    def warmup(self, rounds: int = 2) -> None:
        """Run throwaway iterations on every path an iteration can take (first calls pay for allocations, kernel
        selection and lazy initialisation): a prompt, a chunk on cached context, decodes, and all of them mixed."""
        model = self.model
        model.reserve_slots(2)
        n = max(1, min(32, (model.max_len - 2) // 2))
        for _ in range(rounds):
            model.forward(model.step([], [(0, 0, [1] * n), (1, 0, [2] * n)], [False, True])).tolist()
            model.forward(model.step([], [(0, n, [3] * n)], [True])).tolist()
            model.forward(model.step([(0, 2 * n, 4), (1, n, 5)], [], [True, True])).tolist()
            model.forward(model.step([(1, n + 1, 6)], [(0, 0, [7] * n)], [True, True])).tolist()


@dataclass
class RealRun:
    """What a real replay leaves: the records (as a simulation's) and each iteration's shape."""

    records: RunRecords
    shapes: list[IterationShape] = field(default_factory=list)
    # seconds of each iteration spent in the model's forward pass; the rest of the iteration is host work (the
    # policy's decision, bookkeeping, input preparation)
    forward_s: list[float] = field(default_factory=list)

    def durations(self) -> np.ndarray:
        """Measured seconds of each iteration, in order."""
        it = self.records.iterations
        return it.column("end") - it.column("start")


def wait_until(deadline: float, clock: Callable[[], float] = time.perf_counter) -> None:
    """Wait for ``deadline`` (on ``clock``) by polling, as an engine's busy loop does, not by sleeping: a CPU that
    sleeps is clocked down and runs the next iteration slower (~40% for its first kernels on the machine CI runs on),
    a cost of the idle machine that no model of the batch predicts. Waits longer than a second sleep most of it."""
    while (left := deadline - clock()) > 1.0:
        time.sleep(left - 1.0)
    while clock() < deadline:
        pass


def _warm_up_policy(policy: Scheduler, model: Llama, max_model_len: int) -> None:
    """Serve two tiny requests through ``policy`` untimed, so that whatever the policy initialises on first use
    (compiled helpers, caches) is done before the clock starts. Policies keep no state between runs."""
    requests = RequestTable(np.zeros(2), np.full(2, 4), np.full(2, 2))
    kv = KVCacheManager(64, 16, 2)
    state = SchedulerState(requests, kv, max_model_len)
    executor = Executor(model, requests, np.random.default_rng(0), slots=2)
    while (action := decide(state, policy, 0.0)) is not None:
        if not isinstance(action, Batch):
            break
        shape = state.shape_of(action)
        executor.run(state, action)
        state.complete(action, shape, 0.0, 0.0)
        executor.release(state)


def replay(
    requests: RequestTable,
    policy: Scheduler,
    executor: Executor,
    kv: KVCacheManager,
    max_model_len: int,
    clock: Callable[[], float] = time.perf_counter,
    stream: bool | None = None,
) -> RealRun:
    """Serve ``requests`` (arrival times in seconds from now) through ``policy`` on ``executor``'s model, in real
    time; returns the records with real times (``stream``: how clients receive tokens, None for the policy's
    default). The request table is the run's state: give each run a new one."""
    if (requests.status != Status.PENDING).any() or requests.computed.any():
        raise ValueError("this RequestTable has already been run; build a new one for each run")
    executor.warmup()
    _warm_up_policy(policy, executor.model, max_model_len)
    state = SchedulerState(requests, kv, max_model_len)
    run = RealRun(describe_run(state.records, policy, stream))
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()  # no collector pauses inside timed iterations (the run is short; memory is freed after)
    try:
        t0 = clock()
        carried: float | None = None  # end of the previous iteration when the next turn follows it at once
        while True:
            now = clock() - t0
            action = decide(state, policy, now)
            if action is None:
                break
            if isinstance(action, Batch):
                start = now if carried is None else carried
                # never before the arrival of a request in the batch (its turn began when it arrived)
                start = max(start, float(requests.arrival[action.req_ids].max()))
                shape = state.shape_of(action)
                executor.run(state, action)
                end = clock() - t0
                state.complete(action, shape, start, end)
                executor.release(state)
                run.shapes.append(shape)
                run.forward_s.append(executor.last_forward_s)
                carried = end
            else:
                carried = None
                wait_until(t0 + action, clock)
    finally:
        if was_enabled:
            gc.enable()
    return run
