"""A cluster: replicas on one SimPy clock, fed by a router that sees each request when it arrives.

Each replica has its own policy, KV cache and iteration timer (replicas may differ: GPU kind, parallelism, settings)
and runs the single replica's loop (``sim.engine.decide``, or its compiled twin) in segments: when a request arrives
at time t, every replica first runs its events before t (an iteration ending at t or later stays in flight, so the
router sees each replica as it is at t), then the router picks a replica from their loads, and the request joins
that replica's inbox, waking it at t if it sleeps. Replicas that have nothing before t are not touched, so a cluster
costs about one segment per iteration plus one routing decision per request.

Both engines drive replicas through the same interface (``advance``, ``next_event``, ``route``, ``close``,
``load``), and the router is the same object, so the reference replicas (policy objects, ``SchedulerState``) and the
compiled ones give the same records to the last bit; a one-replica cluster gives the single replica's records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt
import simpy

from sim.compiled.engine import DONE, IDLE, PAUSED, SEGMENT_ITERATIONS, CompiledReplica
from sim.compiled.state import pack, unpack
from sim.engine import IterationTimer, Scheduler, decide, default_stream
from sim.kvcache import KVCacheManager
from sim.prefix_cache import PrefixCachingKV
from sim.records import COUNT, EXACT_GAPS_LIMIT, IterationLog, ItlLog, RunRecords
from sim.request import RequestTable
from sim.state import Batch, SchedulerState, max_gaps

IntArray = npt.NDArray[np.int64]
LOADS = ("unfinished", "work_left", "kv_used", "cached")


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """What a router sees of the replicas when a request arrives, one entry per replica (all zeros for a router that
    reads none; ``work_left`` zeros unless the router reads it, since it walks each replica's queues)."""

    # requests routed to the replica and not yet finished or rejected (count)
    unfinished: IntArray
    # tokens the replica still has to compute: prompt left to prefill plus output left to decode (tokens)
    work_left: IntArray
    # KV-cache blocks in use (blocks)
    kv_used: IntArray
    # KV-cache blocks the replica has (blocks)
    kv_blocks: IntArray
    # prompt tokens of the arriving request the replica has in its prefix cache (tokens; zeros without prefix caching
    # or for a router that does not read "cached")
    cached: IntArray | None = None


class Router(Protocol):
    """Picks the replica for each arriving request (``policies.routing`` has the built-in ones)."""

    reads: ClassVar[tuple[str, ...]]  # the loads it reads, of LOADS

    def route(self, load: ReplicaLoad, prompt: int, output: int) -> int: ...


@dataclass
class ReplicaSetup:
    """One replica of a cluster: its policy, its iteration timer (cost model), its KV cache, its max_model_len."""

    policy: Scheduler
    timer: IterationTimer
    kv: KVCacheManager
    max_model_len: int


class ReferenceReplica:
    """A replica on the reference engine: the policy object over a ``SchedulerState`` that receives the requests
    routed to it; the same steps as the compiled loop (``sim.compiled.engine.run_segment``)."""

    def __init__(self, requests: RequestTable, setup: ReplicaSetup, exact: bool, record_batches: bool) -> None:
        self.setup = setup
        self.state = SchedulerState(requests, setup.kv, setup.max_model_len, exact, record_batches, routed=True)
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
                                       routed=True, capacity=capacity)  # fmt: skip

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


@dataclass
class ClusterRecords:
    """What a cluster run recorded: the requests (all of them), which replica served each, and each replica's
    records (iterations, token gaps, batches) over the same request table."""

    requests: RequestTable
    replica_of: IntArray  # the replica each request was routed to
    replicas: list[RunRecords]
    engine: str
    stream: bool = True
    seats: list[int] = field(default_factory=list)  # seats each replica's policy offers
    request_ids: npt.NDArray[np.object_] | None = None

    def replica_records(self, k: int) -> RunRecords:
        """Replica ``k``'s records over only the requests it served (for its own summary)."""
        rows = np.flatnonzero(self.replica_of == k)
        own = self.replicas[k]
        ids = self.request_ids[rows] if self.request_ids is not None else rows.astype(str).astype(object)
        return RunRecords(
            requests=self.requests.take(rows),
            itl=own.itl,
            iterations=own.iterations,
            request_ids=ids,
            kv_num_blocks=own.kv_num_blocks,
            kv_block_size=own.kv_block_size,
            engine=self.engine,
            stream=self.stream,
            seats=self.seats[k] if self.seats else 0,
            batches=own.batches,
        )

    def merged(self) -> RunRecords:
        """The whole cluster as one set of records: every request, every replica's iterations one replica after
        the other, and their token gaps likewise (what request-level metrics are computed from)."""
        iterations = IterationLog.concat([r.iterations for r in self.replicas])
        return RunRecords(
            requests=self.requests,
            itl=merge_itl([r.itl for r in self.replicas]),
            iterations=iterations,
            request_ids=self.request_ids,
            kv_num_blocks=sum(r.kv_num_blocks for r in self.replicas),
            kv_block_size=self.replicas[0].kv_block_size,
            engine=self.engine,
            stream=self.stream,
            seats=sum(self.seats),
            prefix_cache=_summed([r.prefix_cache for r in self.replicas]),
        )

    def iteration_replica(self) -> IntArray:
        """The replica of each row of ``merged().iterations``."""
        return np.repeat(np.arange(len(self.replicas)), [len(r.iterations) for r in self.replicas])


def _cached(setups: list[ReplicaSetup], req: int, prompt: int) -> IntArray:
    """Tokens of request ``req``'s prompt each replica's prefix cache holds (its leading blocks found there)."""
    out = np.zeros(len(setups), dtype=np.int64)
    for j, setup in enumerate(setups):
        if isinstance(setup.kv, PrefixCachingKV):
            out[j] = setup.kv.lookup(req, prompt)[0] * setup.kv.block_size
    return out


def _summed(counters: list[dict[str, int] | None]) -> dict[str, int] | None:
    """The replicas' prefix-cache counters added up (None without prefix caching)."""
    kept = [c for c in counters if c is not None]
    return {k: sum(c[k] for c in kept) for k in kept[0]} if kept else None


def merge_itl(logs: list[ItlLog]) -> ItlLog:
    """One gap log from the replicas' (in replica order): sums added, histograms added, exact gaps concatenated."""
    exact = all(log.exact for log in logs)
    out = ItlLog(0, exact)
    for log in logs:
        out.sums[: COUNT + 1] += log.sums[: COUNT + 1]  # the running sums (the rest is a cache)
        if not log.exact:
            out.hist = out.hist + log.hist if len(out.hist) else log.hist.copy()
    if exact:
        out.gaps = np.concatenate([log.values() for log in logs]) if logs else np.zeros(0)
    elif any(log.exact for log in logs):
        raise ValueError("the replicas kept their token gaps differently")
    return out


ENGINES = ("auto", "compiled", "reference")


def simulate_cluster(
    requests: RequestTable,
    setups: list[ReplicaSetup],
    router: Router,
    engine: str = "auto",
    exact_itl: bool | None = None,
    record_batches: bool = False,
    stream: bool | None = None,
    on_progress: Callable[[float, int], None] | None = None,
) -> ClusterRecords:
    """Replay ``requests`` (arrival order) through a cluster of ``setups`` behind ``router``.

    ``engine``: ``compiled`` needs every replica's policy and timer to offer a compiled twin; ``auto`` takes it when
    they all do; ``reference`` runs the policy objects. ``exact_itl``: keep every token gap (default: unless the
    run could make more than ``EXACT_GAPS_LIMIT``). ``stream``: None takes the first replica's policy's default.
    ``on_progress(now, routed)`` is called now and then with the clock and the requests routed so far."""
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: choose one of {', '.join(ENGINES)}")
    if not setups:
        raise ValueError("a cluster needs at least one replica")
    if requests.after is not None:
        raise ValueError("multi-turn sessions run on one replica (a cluster routes each request as it arrives)")
    compiled_ok = all(
        getattr(s.policy, "compiled", None) is not None and getattr(s.timer, "compiled", None) is not None
        for s in setups
    )
    if engine == "compiled" and not compiled_ok:
        raise ValueError("the compiled engine needs built-in policies and the roofline cost model on every replica")
    use_compiled = engine != "reference" and compiled_ok
    exact = exact_itl if exact_itl is not None else max_gaps(requests) <= EXACT_GAPS_LIMIT
    n = len(requests)
    replicas: list[Any]
    if use_compiled:
        ri, rf = pack(requests)
        capacity = max(64, 2 * n // len(setups))
        replicas = [CompiledReplicaRunner(ri, rf, s, exact, record_batches, capacity) for s in setups]
    else:
        replicas = [ReferenceReplica(requests, s, exact, record_batches) for s in setups]
    replica_of = np.full(n, -1, dtype=np.int64)
    reads = tuple(getattr(router, "reads", LOADS))
    blocks = np.array([s.kv.num_blocks for s in setups], dtype=np.int64)
    zeros = np.zeros(len(setups), dtype=np.int64)
    env = simpy.Environment()

    # the replicas' next event times, and their loads (rows: unfinished, work left, KV used), kept up to date: a
    # replica's load changes only when it runs events or is routed a request, so only those are asked again
    next_at = np.array([rep.next_event() for rep in replicas])
    loads = np.zeros((3, len(replicas)), dtype=np.int64)
    stale = np.ones(len(replicas), dtype=bool)

    def route_all() -> None:
        """A router that reads no load routes every request before any replica runs: what it sees does not change
        (a replica receives its requests when they arrive, whenever they were routed)."""
        load = ReplicaLoad(zeros, zeros, zeros, blocks)
        arrival, prompt, output = requests.arrival, requests.prompt.tolist(), requests.output_wanted.tolist()
        for i in range(n):
            k = router.route(load, prompt[i], output[i])
            if not (isinstance(k, (int, np.integer)) and 0 <= k < len(replicas)):
                raise ValueError(f"the router chose replica {k!r} for request {i}; expected 0..{len(replicas) - 1}")
            replica_of[i] = k
            if on_progress is not None and i % SEGMENT_ITERATIONS == 0:
                on_progress(float(arrival[i]), i)
        for j, rep in enumerate(replicas):
            rep.route_many(np.flatnonzero(replica_of == j))
            rep.close()
            while rep.advance(math.inf) != DONE:
                pass

    def cluster() -> Generator[simpy.Event, Any, None]:
        arrival, prompt, output = requests.arrival, requests.prompt, requests.output_wanted
        for i in range(n):
            a = float(arrival[i])
            if a > env.now:
                yield env.timeout(a - env.now)
            load = ReplicaLoad(zeros, zeros, zeros, blocks)
            if reads:  # a router that reads loads sees every replica as it is at a; others need not wait
                for j in (next_at < a).nonzero()[0].tolist():
                    rep = replicas[j]
                    rep.advance(a)
                    while rep.next_event() < a:  # it stopped after a number of iterations: go on
                        rep.advance(a)
                    next_at[j] = rep.next_event()
                    stale[j] = True
                for j in stale.nonzero()[0].tolist():
                    loads[:, j] = replicas[j].load(reads)
                stale[:] = False
                now_loads = loads.copy()  # the router may keep what it is shown
                cached = _cached(setups, i, int(prompt[i])) if "cached" in reads else zeros
                load = ReplicaLoad(now_loads[0], now_loads[1], now_loads[2], blocks, cached)
            k = router.route(load, int(prompt[i]), int(output[i]))
            if not (isinstance(k, (int, np.integer)) and 0 <= k < len(replicas)):
                raise ValueError(f"the router chose replica {k!r} for request {i}; expected 0..{len(replicas) - 1}")
            replica_of[i] = k
            replicas[int(k)].route(i)
            next_at[k] = replicas[int(k)].next_event()
            stale[k] = True
            if on_progress is not None and i % SEGMENT_ITERATIONS == 0:
                on_progress(a, i)
        for rep in replicas:
            rep.close()
        for rep in replicas:
            while rep.advance(math.inf) != DONE:
                pass

    if reads:
        env.process(cluster())
        env.run()
    else:
        route_all()
    if use_compiled:
        unpack(ri, rf, requests)
    records = [rep.run_records(requests) for rep in replicas]
    return ClusterRecords(
        requests=requests,
        replica_of=replica_of,
        replicas=records,
        engine="compiled" if use_compiled else "reference",
        stream=default_stream(setups[0].policy) if stream is None else bool(stream),
        seats=[int(getattr(s.policy, "seats", 0) or 0) for s in setups],
    )
