"""One simulation from a ``RunConfig``: wire the cost model, the KV cache, the workload and the policy to the engine.

This is what `ferry run` calls and what sweeps will call many times; it returns values and writes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import policies
from experiments.runner import outputs
from experiments.runner.clients_cluster import is_closed_loop, simulate_clients
from experiments.runner.config import RunConfig
from experiments.runner.disagg_run import disagg_columns, run_disaggregated
from experiments.runner.replica import (
    DEFAULT_NUM_PROMPTS,
    Replica,
    RunResult,
    build_replica,
    build_workload,
    check_max_model_len_fits,
    memory_summary,
    override_blocks,
    resolve,
)
from policies.routing import get_router
from sim.cluster import ClusterRecords, ReplicaSetup, simulate_cluster
from sim.engine import simulate
from sim.metrics import batch_columns, request_columns
from sim.records import spec_columns_last
from sim.request import RequestTable
from sim.workload import Workload

# what runs on one replica or a cluster is built by ``experiments.runner.replica`` (its names stay importable from here)
__all__ = ["DEFAULT_NUM_PROMPTS", "RUN_OUTPUTS", "Replica", "RunResult", "build_replica", "build_workload",
           "check_max_model_len_fits", "memory_summary", "override_blocks", "resolve", "run_simulation",
           "write_outputs"]  # fmt: skip


def run_simulation(
    config: RunConfig,
    workload: Workload | None = None,
    on_progress: Callable[[float, int, int], None] | None = None,
    timings: dict[str, float] | None = None,
    detail: bool = True,
    token_gaps: bool = True,
) -> RunResult:
    """Simulate one replica under ``config``; returns the records and the summary. ``workload`` replaces the one
    ``config.workload`` describes (sweeps build it once and reuse it); ``on_progress(now, unfinished, total)`` is called
    now and then during the run with the simulated clock and the requests not yet ended; ``timings``, if given,
    receives the wall seconds of the simulation call (``simulate_s``); ``detail=False`` leaves a cluster's
    per-replica summaries out (``sim.cluster_metrics.summarize_cluster``), ``token_gaps=False`` the token gaps'
    statistics (``sim.metrics.summarize``)."""
    given = config  # as the user wrote it: each replica group resolves its own defaults from it
    if config.disaggregation is not None:
        return run_disaggregated(config, workload, timings)
    replica = build_replica(config)
    config = replica.config
    policy = policies.get(config.scheduler)
    if workload is None:
        workload = build_workload(config)
    requests, kv = replica.new_requests(workload)
    if config.record_batches:
        check_batch_rows(workload)
    exact = {"auto": None, "exact": True, "histogram": False}[config.itl]
    engine = config.engine
    total = len(requests)
    report = None if on_progress is None else (lambda now, left: on_progress(now, left, total))
    started = time.perf_counter()
    cluster = None
    members = cluster_members(given, replica)
    if sum(count for _, count in members) > 1:
        cluster = simulate_replicas(config, members, requests, workload, engine, exact, report)
        records = cluster.merged()
    else:
        records = simulate(
            requests,
            policy,
            replica.cost,
            kv,
            config.scheduler.max_model_len,
            engine,
            exact,
            report,
            config.stream,
            config.record_batches,
            replica.spec,
        )
    if timings is not None:
        timings["simulate_s"] = time.perf_counter() - started
    each = [m for m, count in members for _ in range(count)]  # the replicas in order
    gpus = [m.config.parallelism.gpus_per_rank for m in each]  # a data-parallel rank is a replica of its own
    result = replica.result(workload, records, cluster=cluster, detail=detail, gpus=gpus, token_gaps=token_gaps)
    if cluster is not None:
        result.summary["hardware"] = " + ".join(f"{m.hardware.name} x{count}" for m, count in members)
        if config.replica_groups:
            result.summary["replica_groups"] = [group_summary(m, count) for m, count in members]
            # each group as it was resolved, so that `--config summary.json` reproduces the run
            result.summary["config"]["replica_groups"] = [
                {"count": count, "hardware": m.config.hardware, "tensor_parallel_size": m.config.tensor_parallel_size,
                 "kv_watermark": m.config.kv_watermark}
                | m.config.scheduler.model_dump(mode="json", exclude_defaults=False)
                for m, count in members
            ]  # fmt: skip
        entries = result.summary.get("replicas")  # absent from a brief summary (``detail=False``)
        for entry, m in zip(entries or [], each if entries else [], strict=True):
            entry |= {"hardware": m.hardware.name, "tensor_parallel_size": m.config.tensor_parallel_size,
                      "policy": m.config.scheduler.policy}  # fmt: skip
    return result


def cluster_members(config: RunConfig, replica: Replica) -> list[tuple[Replica, int]]:
    """The replicas of a run and how many of each: ``config.replicas`` of ``replica``, or one built per group."""
    if not config.replica_groups:
        return [(replica, config.replicas * config.data_parallel_size)]  # each data-parallel rank a replica
    return [
        (build_replica(config.group_config(k)), int(g.get("count", 1))) for k, g in enumerate(config.replica_groups)
    ]


def group_summary(member: Replica, count: int) -> dict[str, Any]:
    """What ``summary.json`` says of one replica group: its count, device, parallelism, resolved scheduler and
    memory plan."""
    cfg = member.config
    return {"count": count, "hardware": member.hardware.name, "tensor_parallel_size": cfg.tensor_parallel_size,
            "scheduler": cfg.scheduler.model_dump(mode="json"), "memory": memory_summary(member.memory)}  # fmt: skip


def simulate_replicas(
    config: RunConfig,
    members: list[tuple[Replica, int]],
    requests: RequestTable,
    workload: Workload,
    engine: str,
    exact: bool | None,
    report: Callable[[float, int], None] | None = None,
) -> ClusterRecords:
    """Each member replica (its own policy and KV cache), as many times as its count, behind ``config.router``; a
    closed loop of clients keeps each client on one replica instead (``runner.clients_cluster``)."""
    if is_closed_loop(workload):
        each = [m for m, count in members for _ in range(count)]
        return simulate_clients(config, each, requests, workload, engine, exact, report)
    setups = [
        ReplicaSetup(
            policies.get(m.config.scheduler), m.cost, m.new_kv(workload), m.config.scheduler.max_model_len, m.spec
        )
        for m, count in members
        for _ in range(count)
    ]
    router = get_router(config.router, len(setups), np.random.default_rng(config.router_seed))
    return simulate_cluster(
        requests, setups, router, engine, exact, config.record_batches, config.stream, on_progress=report
    )


MAX_BATCH_ROWS = 50_000_000  # rows of batches.csv one run may keep: 2 GB in memory, several GB of CSV


def check_batch_rows(workload: Workload) -> None:
    """Refuse ``record_batches`` for a run that would keep more than ``MAX_BATCH_ROWS`` rows (at least one per output
    token made), before it runs."""
    rows = int(workload.output_tokens.sum())
    if rows > MAX_BATCH_ROWS:
        raise ValueError(
            f"record_batches: this workload makes {rows:,} output tokens, a batches.csv row each "
            f"(~{rows * 40 / 1e9:.0f} GB in memory, more as CSV); ferry keeps at most {MAX_BATCH_ROWS:,}: record a "
            "shorter run (--num-prompts) or leave --record-batches out"
        )


RUN_OUTPUTS = ("summary.json", "requests.csv", "iterations.csv", "batches.csv", "requests.parquet",
               "iterations.parquet", "batches.parquet")  # fmt: skip


def write_outputs(result: RunResult, out: Path, force: bool = False, command: str = "run",
                  fmt: str = "csv") -> list[Path]:  # fmt: skip
    """Write ``summary.json``, ``requests.csv``, ``iterations.csv`` and (when the run kept them) ``batches.csv``
    into ``out`` (``fmt`` "parquet": ``requests.parquet`` and so on, the same columns; see ``runner.outputs``:
    an earlier run's files there are replaced, other files refused unless ``force``; the summary is written last);
    returns their paths."""
    summary = json.dumps(result.summary, indent=2, allow_nan=False) + "\n"  # fails before anything is written
    outputs.prepare(out, RUN_OUTPUTS, command, force)
    records, cluster = result.records, result.cluster
    if result.disagg is not None:
        requests, iterations = disagg_columns(result.disagg)
        written = [outputs.write_table(out / "requests.csv", spec_columns_last(requests), fmt)]
    else:  # each table built when it is written (a million-request run's columns are 150 MB each)
        requests = request_columns(records)
        requests["replica"] = cluster.replica_of if cluster is not None else np.zeros(records.requests.n, np.int64)
        written = [outputs.write_table(out / "requests.csv", spec_columns_last(requests), fmt)]
        del requests
        iterations = records.iterations.columns()
        replica = cluster.iteration_replica() if cluster is not None else np.zeros(len(records.iterations), np.int64)
        iterations["replica"] = replica
    written.append(outputs.write_table(out / "iterations.csv", spec_columns_last(iterations), fmt))
    del iterations
    if cluster is not None and cluster.replicas[0].batches is not None:
        parts = [batch_columns(replica, request_ids=records.request_ids) for replica in cluster.replicas]
        batches = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        batches["replica"] = np.repeat(np.arange(len(parts)), [len(p["iteration"]) for p in parts])
        written.append(outputs.write_table(out / "batches.csv", spec_columns_last(batches), fmt))
    elif records.batches is not None:
        batches = batch_columns(records)
        batches["replica"] = np.zeros(len(batches["iteration"]), np.int64)
        written.append(outputs.write_table(out / "batches.csv", spec_columns_last(batches), fmt))
    return [outputs.write_text(out / "summary.json", summary), *written]
