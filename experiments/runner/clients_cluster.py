"""A closed loop of clients (``--max-concurrency``) on a cluster: each client stays with one replica.

``vllm bench serve --max-concurrency N`` in front of a cluster sends each request, when one of its N slots frees up,
to whichever replica the router then picks, so a response ending on one replica sends the next request anywhere.
ferry models the clients as sticky instead, as a router with session affinity keeps them: the slots are spread over
the replicas in turn (replica j of R takes N // R of them, one more for j < N % R; with fewer slots than replicas,
only N replicas serve), and so are the requests, in order (request k to replica k mod R). Each replica is then a
closed loop of its own slots over its own requests, simulated as one replica (``sim.workload.clients``), and the
cluster's records are theirs side by side. The router is not asked. The semantics table says so
(docs/concepts/semantics.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

import policies
from sim.cluster import ClusterRecords
from sim.engine import simulate
from sim.request import RequestTable
from sim.workload import Workload
from sim.workload.clients import closed_loop, open_loop

if TYPE_CHECKING:
    from experiments.runner.config import RunConfig
    from experiments.runner.replica import Replica

# the per-request columns a replica's run writes (its inputs aside), put back at the request's row of the cluster's
WRITTEN = ("arrival", "computed", "generated", "status", "reason", "preemptions", "recomputed", "cached", "admit_order",
           "first_scheduled", "first_token", "last_token", "finish", "released", "drafts", "draft_tokens",
           "accepted_tokens")  # fmt: skip


def is_closed_loop(workload: Workload) -> bool:
    """Whether ``workload``'s requests are sent by a closed loop of clients (``sim.workload.clients``)."""
    return workload.clients is not None


def simulate_clients(
    config: RunConfig,
    each: list[Replica],
    requests: RequestTable,
    workload: Workload,
    engine: str,
    exact: bool | None,
    report: Callable[[float, int], None] | None = None,
) -> ClusterRecords:  # (``report`` is not called: the replicas run one after the other, each to its end)
    """The closed loop ``workload`` on the replicas ``each`` (one entry per replica), clients sticky (see the module
    docstring); ``requests`` (the whole workload's table) receives every request's columns."""
    assert workload.clients is not None
    slots = workload.clients
    due = open_loop(workload).arrival_s
    serving = min(len(each), slots)
    replica_of = np.arange(len(workload)) % serving
    requests.arrival = np.array(requests.arrival)  # (the workload's, read-only): each request's send time goes here
    records = []
    for j, member in enumerate(each):
        rows = np.flatnonzero(replica_of == j)
        mine = slots // serving + (1 if j < slots % serving else 0)
        own = Workload(
            due[rows],
            workload.prompt_tokens[rows],
            workload.output_tokens[rows],
            None if workload.request_id is None else workload.request_id[rows],
            workload.source,
            None if workload.prefixes is None else workload.prefixes.take(rows),
        )
        table, kv = member.new_requests(closed_loop(own, mine) if mine else own)
        run = simulate(table, policies.get(member.config.scheduler), member.cost, kv,
                       member.config.scheduler.max_model_len, engine, exact, None, config.stream,
                       config.record_batches, member.spec)  # fmt: skip
        for name in WRITTEN:
            getattr(requests, name)[rows] = getattr(table, name)
        if run.batches is not None:
            run.batches.rows[: run.batches.n, 1] = rows[run.batches.rows[: run.batches.n, 1]]
        records.append(run)
    return ClusterRecords(
        requests=requests,
        replica_of=replica_of.astype(np.int64),
        replicas=records,
        engine=records[0].engine,
        engine_choice=records[0].engine_choice,
        stream=records[0].stream,
        seats=[int(getattr(policies.get(m.config.scheduler), "seats", 0) or 0) for m in each],
    )
