"""A cluster: replicas on one SimPy clock, fed by a router that sees each request when it arrives.

Each replica has its own policy, KV cache and iteration timer (replicas may differ: GPU kind, parallelism, settings)
and runs the single replica's loop (``sim.engine.decide``, or its compiled twin) in segments: when a request arrives
at time t, every replica first runs its events before t (an iteration ending at t or later stays in flight, so the
router sees each replica as it is at t), then the router picks a replica from their loads, and the request joins
that replica's inbox, waking it at t if it sleeps. Replicas that have nothing before t are not touched, so a cluster
costs about one segment per iteration plus one routing decision per request. On the compiled engine, replicas of one
policy kernel and timer behind a built-in router that reads loads are routed by the same loop in compiled code
(``sim.compiled.cluster``), a span of arrivals per call.

Both engines drive replicas through the same interface (``advance``, ``next_event``, ``route``, ``close``,
``load``), and the router is the same object, so the reference replicas (policy objects, ``SchedulerState``) and the
compiled ones give the same records to the last bit; a one-replica cluster gives the single replica's records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt
import simpy

from sim.cluster_replicas import CompiledReplicaRunner, ReferenceReplica, ReplicaSetup
from sim.compiled.cluster import CompiledCluster, arrivals_runner
from sim.compiled.engine import DONE, SEGMENT_ITERATIONS, loop_on_disk, on_disk
from sim.compiled.state import pack, unpack
from sim.engine import choose_engine, default_stream
from sim.prefix_cache import PrefixCachingKV
from sim.records import COUNT, EXACT_GAPS_LIMIT, IterationLog, ItlLog, RunRecords
from sim.request import RequestTable
from sim.state import max_gaps

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
class ClusterRecords:
    """What a cluster run recorded: the requests (all of them), which replica served each, and each replica's
    records (iterations, token gaps, batches) over the same request table."""

    requests: RequestTable
    replica_of: IntArray  # the replica each request was routed to
    replicas: list[RunRecords]
    engine: str
    stream: bool = True
    seats: list[int] = field(default_factory=list)  # seats each replica's policy offers
    engine_choice: str = ""  # why that engine ran (``sim.engine.choose_engine``)
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
            engine_choice=self.engine_choice,
            stream=self.stream,
            seats=self.seats[k] if self.seats else 0,
            batches=own.batches,
            speculation=own.speculation,
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
            engine_choice=self.engine_choice,
            stream=self.stream,
            seats=sum(self.seats),
            prefix_cache=_summed([r.prefix_cache for r in self.replicas]),
            speculation=_summed_counts([r.speculation for r in self.replicas]),
        )

    def iteration_replica(self) -> IntArray:
        """The replica of each row of ``merged().iterations``."""
        return np.repeat(np.arange(len(self.replicas)), [len(r.iterations) for r in self.replicas])


def inbox_capacity(requests: int, replicas: int) -> int:
    """Requests a compiled replica has room for before its queues grow (twice its even share)."""
    return max(64, 2 * requests // replicas)


def compiled_cluster_of(replicas: list[Any], router: Router, reads: tuple[str, ...], blocks: IntArray,
                        n: int) -> CompiledCluster | None:  # fmt: skip
    """The arrivals routed in compiled code, where the replicas run one policy kernel and one timer and the router
    has a kernel (``compiled``) and reads no prefix cache; None where the loop in Python must route them."""
    compiled = getattr(router, "compiled", None)
    if compiled is None or not routes_compiled(router, reads, {(r.kernel[0], r.timing[0]) for r in replicas}):
        return None
    return CompiledCluster([r.replica for r in replicas], [r.kernel for r in replicas], [r.timing for r in replicas],
                           compiled(n), "work_left" in reads, blocks)  # fmt: skip


def routes_compiled(router: Router, reads: tuple[str, ...], pairs: set[tuple[Any, Any]]) -> bool:
    """Whether a compiled cluster routes its arrivals in compiled code (``arrivals_runner``): a router with a kernel
    that reads no prefix cache, in front of replicas of one (policy kernel, timer) pair (``pairs``: theirs)."""
    return getattr(router, "compiled", None) is not None and "cached" not in reads and len(pairs) == 1


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


def _summed_counts(counters: list[npt.NDArray[np.int64] | None]) -> npt.NDArray[np.int64] | None:
    """The replicas' speculative-decoding counters added up, position by position (None without it)."""
    kept = [c for c in counters if c is not None]
    if not kept:
        return None
    out = np.zeros(max(len(c) for c in kept), dtype=np.int64)
    for c in kept:
        out[: len(c)] += c
    return out


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


def loops_on_disk(setups: Sequence[ReplicaSetup], router: Router) -> bool:
    """Whether numba's disk cache holds every compiled loop the cluster would load: each replica's (policy, timer)
    pair's, and the loop that routes the arrivals where ``router`` routes in compiled code (``routes_compiled``)."""
    pairs = {(s.policy.compiled()[0], s.timer.compiled()[0]) for s in setups}  # type: ignore[attr-defined]
    if not all(loop_on_disk(*pair) for pair in pairs):
        return False
    reads = tuple(getattr(router, "reads", LOADS))
    return not routes_compiled(router, reads, pairs) or on_disk(arrivals_runner(*next(iter(pairs))))


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
    they all do and the job repays loading it (``sim.engine.choose_engine``); ``reference`` runs the policy objects.
    ``exact_itl``: keep every token gap (default: unless the run could make more than ``EXACT_GAPS_LIMIT``).
    ``stream``: None takes the first replica's policy's default.
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
    chosen, why = choose_engine(engine, compiled_ok, requests, partial(loops_on_disk, setups, router))
    use_compiled = chosen == "compiled"
    exact = exact_itl if exact_itl is not None else max_gaps(requests) <= EXACT_GAPS_LIMIT
    n = len(requests)
    replicas: list[Any]
    if use_compiled:
        ri, rf = pack(requests)
        capacity = inbox_capacity(n, len(setups))
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

    def compiled_cluster() -> Generator[simpy.Event, Any, None]:
        """The loop below, each span of arrivals routed in compiled code (``sim.compiled.cluster``)."""
        assert fast is not None
        arrival = requests.arrival
        for start in range(0, n, SEGMENT_ITERATIONS):
            stop = min(start + SEGMENT_ITERATIONS, n)
            fast.route(start, stop, replica_of)
            a = float(arrival[stop - 1])
            if a > env.now:
                yield env.timeout(a - env.now)
            if on_progress is not None:
                on_progress(float(arrival[start]), start)
        for rep in replicas:
            rep.close()
        for rep in replicas:
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

    fast = compiled_cluster_of(replicas, router, reads, blocks, n) if use_compiled and reads else None
    if fast is not None:
        env.process(compiled_cluster())
        env.run()
    elif reads:
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
        engine_choice=why,
        stream=default_stream(setups[0].policy) if stream is None else bool(stream),
        seats=[int(getattr(s.policy, "seats", 0) or 0) for s in setups],
    )
