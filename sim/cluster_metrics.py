"""A cluster's summary: the request-level metrics over every request (as one replica's are: the client does not see
replicas), the GPU-time ones summed over the replicas, and each replica's own summary beside them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sim.cluster import ClusterRecords
from sim.metrics import overload, summarize

# what each replica's entry of ``replicas`` keeps of its own summary
REPLICA_KEYS = (
    "completed",
    "failed",
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "p99_tpot_ms",
    "p99_itl_ms",
    "p99_e2el_ms",
    "num_iterations",
    "gpu_busy_s",
    "seat_utilization",
    "mean_batch_size",
    "peak_kv_usage",
    "mean_kv_usage",
    "total_preemptions",
    "kv_cache_blocks",
)


def summarize_cluster(
    cluster: ClusterRecords,
    goodput: Mapping[str, float] | None = None,
    gpus_per_replica: list[int] | None = None,
    detail: bool = True,
    token_gaps: bool = True,
) -> dict[str, Any]:
    """The cluster's summary (``sim.metrics.summarize``'s keys, ``gpu_*`` and seat and KV keys over all replicas'
    GPU time) plus ``replicas``: one entry per replica (its requests, utilisation over the cluster's duration, p99s,
    peak KV ...) and ``num_replicas``. ``gpus_per_replica`` (default 1 each) weighs GPU time by the GPUs a replica
    spans (tensor parallelism). ``detail=False`` leaves out ``replicas`` and the seat, batch and KV keys that need
    each replica's own summary (a capacity search runs many clusters and reads the request-level keys); ``token_gaps``
    as ``summarize``'s."""
    merged = cluster.merged()
    out: dict[str, Any] = dict(summarize(merged, goodput, token_gaps))
    if not detail:
        busy_s = float((merged.iterations.column("end") - merged.iterations.column("start")).sum())
        replica_time = len(cluster.replicas) * float(out["duration"])
        out["num_replicas"] = len(cluster.replicas)
        out["gpu_busy_s"] = busy_s
        out["gpu_idle_s"] = max(replica_time - busy_s, 0.0)
        out["gpu_idle_fraction"] = out["gpu_idle_s"] / replica_time if replica_time > 0 else 0.0
        return out
    duration = float(out["duration"])
    n_rep = len(cluster.replicas)
    gpus = gpus_per_replica or [1] * n_rep
    parts: list[dict[str, Any]] = [dict(summarize(cluster.replica_records(k), goodput)) for k in range(n_rep)]
    busy = np.array([float(p["gpu_busy_s"]) for p in parts])
    iterations = np.array([int(p["num_iterations"]) for p in parts])
    replica_time = n_rep * duration
    out["num_replicas"] = n_rep
    out["num_gpus"] = int(sum(gpus))
    out["gpu_busy_s"] = float(busy.sum())
    out["gpu_idle_s"] = max(replica_time - float(busy.sum()), 0.0)
    out["gpu_idle_fraction"] = out["gpu_idle_s"] / replica_time if replica_time > 0 else 0.0
    out["idle_while_waiting_s"] = float(sum(float(p["idle_while_waiting_s"]) for p in parts))
    out["seats_offered"] = int(sum(int(p["seats_offered"] or 0) for p in parts)) or None
    out["seat_utilization"] = _weighted(parts, "seat_utilization", busy * [s or 0 for s in cluster.seats])
    out["held_seat_fraction"] = _weighted(parts, "held_seat_fraction", busy * [s or 0 for s in cluster.seats])
    out["mean_batch_size"] = _weighted(parts, "mean_batch_size", iterations)
    out["mean_tokens_per_iteration"] = _weighted(parts, "mean_tokens_per_iteration", iterations)
    out["peak_kv_usage"] = max(float(p["peak_kv_usage"]) for p in parts)
    out["mean_kv_usage"] = _weighted(parts, "mean_kv_usage", busy) or 0.0
    out["overload"] = overload(merged, replicas=n_rep)
    out["replicas"] = [
        {"replica": k, "gpus": gpus[k], "utilization": busy[k] / duration if duration > 0 else 0.0}
        | {key: parts[k].get(key) for key in REPLICA_KEYS}
        for k in range(n_rep)
    ]
    return out


def _weighted(parts: list[dict[str, Any]], key: str, weights: Any) -> float | None:
    """The replicas' ``key`` averaged with ``weights`` (those without a value left out); None if none has one."""
    pairs = [(float(p[key]), float(w)) for p, w in zip(parts, weights, strict=True) if p.get(key) is not None]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total > 0 else None
