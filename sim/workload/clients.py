"""A closed loop of clients: ``vllm bench serve --max-concurrency N`` (``vllm/benchmarks/serve.py``, vLLM 0.32: each
request, made when its time in the arrival schedule comes, first takes one of N slots of an ``asyncio.Semaphore``,
which wakes its waiters in the order they came, and gives it back when its response has ended or failed). So a
request is sent when it is due or, with N requests in flight, when the next one ends, whichever is later: the first N
at their own times, every later one, in order, as slots free up (``sim.kernels.sessions``, which both engines run).
Without a rate (every request due at 0) that is N clients that each send their next request the moment their last
response ends."""

from __future__ import annotations

import dataclasses

import numpy as np

from sim.kernels.sessions import CLIENT
from sim.workload.base import Workload


def closed_loop(workload: Workload, clients: int) -> Workload:
    """``workload``'s requests sent by at most ``clients`` at a time: rows from ``clients`` on wait for a slot
    (``after`` ``CLIENT``; their due times kept as ``think_s``, their arrivals set by the simulation)."""
    if clients < 1:
        raise ValueError(f"max_concurrency={clients}: the requests in flight at most, an integer >= 1")
    if workload.after is not None:
        raise ValueError("max_concurrency: a closed loop of clients sends requests of its own, not conversation turns")
    rows = np.arange(len(workload))
    waits = rows >= clients
    if not waits.any():  # every request has a slot of its own: sent at its time, nothing waits
        return dataclasses.replace(workload, source=f"{workload.source}, at most {clients} in flight (closed loop)",
                                   clients=clients)  # fmt: skip
    due = np.asarray(workload.arrival_s, dtype=np.float64)
    return dataclasses.replace(
        workload,
        arrival_s=np.where(waits, np.nan, due),
        after=np.where(waits, CLIENT, -1).astype(np.int64),
        think_s=np.where(waits, due, 0.0),
        source=f"{workload.source}, at most {clients} in flight (closed loop)",  # (``open_loop`` strips it)
        clients=clients,
    )


def clients_of(workload: Workload) -> int | None:
    """How many slots a closed loop has (``closed_loop``'s clients, as many as or more than its requests may be);
    None for an open loop."""
    return workload.clients


def open_loop(workload: Workload) -> Workload:
    """The requests of a closed loop as they were due, every one at its own time (the workload ``closed_loop`` was
    given); an open loop as it is."""
    if clients_of(workload) is None:
        return workload
    if workload.after is None:
        return dataclasses.replace(workload, clients=None, source=workload.source.rsplit(", at most ", 1)[0])
    after = np.asarray(workload.after)
    due = np.where(after == -1, workload.arrival_s, np.asarray(workload.think_s))
    return Workload(due, workload.prompt_tokens, workload.output_tokens, workload.request_id,
                    workload.source.rsplit(", at most ", 1)[0], workload.prefixes)  # fmt: skip
