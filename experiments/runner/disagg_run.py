"""A disaggregated run (``RunConfig.disaggregation``): build each pool's replicas from its config, pick the KV link,
simulate (``sim.disagg``), and summarise: the request-level metrics over every request as one replica's are, the
GPU-time ones over both pools, each pool's own utilisation, and the KV transfers."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

import policies
from experiments.runner.config import RunConfig
from experiments.runner.disagg_config import GPUS_PER_NODE, ROLES
from experiments.runner.replica import RunResult, build_replica, build_workload
from policies.routing import get_router
from sim.cluster import ReplicaSetup
from sim.cluster_metrics import summarize_cluster
from sim.disagg import DisaggRecords, KVLink, Pool, simulate_disaggregated
from sim.metrics import request_columns
from sim.request import RequestTable
from sim.workload import Workload

# what each pool's entry of ``pools`` keeps of its own cluster summary
POOL_KEYS = ("num_iterations", "gpu_busy_s", "mean_batch_size", "mean_tokens_per_iteration", "seat_utilization",
             "peak_kv_usage", "mean_kv_usage", "total_preemptions", "kv_cache_blocks")  # fmt: skip


def kv_link(config: RunConfig, members: dict[str, Any]) -> KVLink:
    """The link between the pools: NVLink (the slower pool's device's interconnect) when ``kv_link`` says so, or on
    ``auto`` when both pools are one device kind and fit in one node; the network otherwise."""
    assert config.disaggregation is not None
    d = config.disaggregation
    tp = {role: members[role].config.tensor_parallel_size for role in ROLES}
    gpus = sum(d.count(role) * tp[role] for role in ROLES)
    same_kind = members["prefill"].hardware.name == members["decode"].hardware.name
    name = d.kv_link if d.kv_link != "auto" else ("nvlink" if same_kind and gpus <= GPUS_PER_NODE else "network")
    lanes = min(tp.values())
    if name == "nvlink":
        hardware = [members[role].hardware for role in ROLES]
        bandwidth = min(h.link_bandwidth for h in hardware)
        latency = max(float(h.efficiency.communication.latency_s.value) for h in hardware)
        return KVLink("nvlink", bandwidth, latency, lanes)
    return KVLink("network", float(d.network_bandwidth_gbps) * 1e9, float(d.network_latency_us) * 1e-6, lanes)


def simulate_pools(config: RunConfig, members: dict[str, Any], workload: Workload, engine: str,
                   exact: bool | None) -> DisaggRecords:  # fmt: skip
    """Each pool's replicas (their own policy and KV cache), as many as its count, behind ``config.router``."""
    assert config.disaggregation is not None
    pools = {}
    for role in ROLES:
        m, count = members[role], config.disaggregation.count(role)
        setups = [
            ReplicaSetup(policies.get(m.config.scheduler), m.cost, m.new_kv(workload), m.config.scheduler.max_model_len)
            for _ in range(count)
        ]
        pools[role] = Pool(setups, get_router(config.router, count, np.random.default_rng(config.router_seed)))
    requests = RequestTable(workload.arrival_s, workload.prompt_tokens, workload.output_tokens)
    prefill = members["prefill"]
    per_token = prefill.memory.kv_bytes_per_token * prefill.config.tensor_parallel_size  # the whole model's
    link = kv_link(config, members)
    return simulate_disaggregated(
        requests, pools["prefill"], pools["decode"], link, per_token, engine, exact, stream=config.stream
    )


def disagg_summary(config: RunConfig, members: dict[str, Any], d: DisaggRecords, summary: dict[str, Any]) -> None:
    """Replace ``summary``'s GPU-time keys (computed over both pools' iterations as if one replica's) with the
    pools' and add ``pools``, ``kv_transfer`` and goodput per GPU."""
    assert config.disaggregation is not None
    duration = float(summary["duration"])
    pools: dict[str, Any] = {}
    busy = replica_time = 0.0
    gpus = 0
    for role, cluster in (("prefill", d.prefill), ("decode", d.decode)):
        m, count = members[role], config.disaggregation.count(role)
        tp = m.config.tensor_parallel_size
        part = summarize_cluster(cluster, None, [tp] * count)
        used = float(part["gpu_busy_s"]) / (count * duration) if duration > 0 else 0.0
        pools[role] = {"replicas": count, "gpus": count * tp, "hardware": m.hardware.name, "tensor_parallel_size": tp,
                       "policy": m.config.scheduler.policy, "requests": int((cluster.replica_of >= 0).sum()),
                       "utilization": used}  # fmt: skip
        pools[role] |= {key: part.get(key) for key in POOL_KEYS}
        pools[role]["overload"] = part.get("overload")
        busy += float(part["gpu_busy_s"])
        replica_time += count * duration
        gpus += count * tp
    summary["num_replicas"] = d.num_replicas
    summary["num_gpus"] = gpus
    summary["gpu_busy_s"] = busy
    summary["gpu_idle_s"] = max(replica_time - busy, 0.0)
    summary["gpu_idle_fraction"] = summary["gpu_idle_s"] / replica_time if replica_time > 0 else 0.0
    summary["peak_kv_usage"] = max(float(p["peak_kv_usage"]) for p in pools.values())
    summary["mean_kv_usage"] = None  # each pool's, in ``pools``: their caches hold different things
    summary["seat_utilization"] = summary["held_seat_fraction"] = None
    summary["idle_while_waiting_s"] = None
    summary["overload"] = pools["prefill"]["overload"] or pools["decode"]["overload"]
    summary["pools"] = pools
    summary["kv_transfer"] = transfer_summary(d)
    # the same as scalars, for tables that keep a summary's scalar keys only (``ferry sweep``'s)
    for role in ROLES:
        summary[f"{role}_pool_utilization"] = pools[role]["utilization"]
    for key in ("mean_transfer_ms", "p99_transfer_ms", "total_bytes"):
        summary[f"kv_{key}"] = summary["kv_transfer"][key]
    if summary.get("request_goodput") is not None:
        summary["request_goodput_per_gpu"] = float(summary["request_goodput"]) / gpus
    summary["hardware"] = " + ".join(f"{p['hardware']} x{p['replicas']} ({role})" for role, p in pools.items())


def transfer_summary(d: DisaggRecords) -> dict[str, Any]:
    """The KV transfers: the link, how many, bytes, and their time (ms) from the prefill's end (waiting for the link
    included) and on the link alone."""
    sent = ~np.isnan(d.transfer_end)
    total = (d.transfer_end - d.prefill_end)[sent] * 1e3
    wire = (d.transfer_end - d.transfer_start)[sent] * 1e3
    nbytes = d.transfer_bytes[sent]

    def stats(ms: np.ndarray, name: str) -> dict[str, float | None]:
        if not len(ms):
            return {f"mean_{name}_ms": None, f"p50_{name}_ms": None, f"p99_{name}_ms": None}
        return {f"mean_{name}_ms": float(ms.mean()), f"p50_{name}_ms": float(np.percentile(ms, 50)),
                f"p99_{name}_ms": float(np.percentile(ms, 99))}  # fmt: skip

    link = d.link
    return {
        "link": link.name,
        "bandwidth_gbps": None if math.isinf(link.bandwidth) else link.bandwidth / 1e9,
        "latency_us": link.latency_s * 1e6,
        "lanes": link.lanes,
        "transfers": int(sent.sum()),
        "total_bytes": float(nbytes.sum()),
        "mean_bytes": float(nbytes.mean()) if len(nbytes) else None,
        **stats(total, "transfer"),
        **stats(wire, "wire"),
    }


def disagg_columns(d: DisaggRecords) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The columns of ``requests.csv`` and ``iterations.csv`` of a disaggregated run: each request's prefill replica
    (``replica``) and decode replica (numbered after the prefill replicas; -1: it never reached one) and its
    transfer; each iteration's replica and pool."""
    records = d.merged()
    requests = request_columns(records)
    prefills = len(d.prefill.replicas)
    requests["replica"] = d.prefill_replica
    requests["decode_replica"] = np.where(d.decode_replica >= 0, d.decode_replica + prefills, -1)
    requests["prefill_end_s"] = d.prefill_end
    requests["kv_transfer_start_s"] = d.transfer_start
    requests["kv_transfer_end_s"] = d.transfer_end
    requests["kv_transfer_bytes"] = d.transfer_bytes
    iterations = records.iterations.columns()
    iterations["replica"] = d.iteration_replica()
    iterations["pool"] = np.where(iterations["replica"] < prefills, "prefill", "decode").astype(object)
    return requests, iterations


def run_disaggregated(given: RunConfig, workload: Workload | None, timings: dict[str, float] | None) -> RunResult:
    """A disaggregated run (``runner.disagg_run``): each pool built from its config, simulated, summarised."""
    members = {role: build_replica(given.pool_config(role)) for role in ROLES}
    decode = members["decode"]
    workload = workload if workload is not None else build_workload(decode.config)
    exact = {"auto": None, "exact": True, "histogram": False}[given.itl]
    started = time.perf_counter()
    records = simulate_pools(given, members, workload, given.engine, exact)
    if timings is not None:
        timings["simulate_s"] = time.perf_counter() - started
    records.request_ids = workload.request_id  # requests.csv is written from another merged() view
    result = decode.result(workload, records.merged())
    disagg_summary(given, members, records, result.summary)
    # the decode pool's resolved scheduler, and the pools as given, so that `--config summary.json` reproduces the run
    result.summary["config"] = decode.config.to_jsonable() | {"disaggregation": given.to_jsonable()["disaggregation"]}
    result.disagg = records
    return result
