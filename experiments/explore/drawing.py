"""The page's JSON of one run (``run_json``): its requests, iterations, the boxes of the first requests with their
seats, the GPU's idle stretches and the metric panel, read from the run's records (``experiments.teach.runs``).
Times are milliseconds from the start of the workload; what JSON cannot hold (an infinite rate, a metric with no
value) is ``"inf"`` or null."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from experiments.teach.runs import PolicyRun
from experiments.teach.spans import request_spans, seat_assignment

if TYPE_CHECKING:
    from experiments.explore.payload import Settings

MAX_DRAWN_REQUESTS = 300  # requests whose spans the page draws; the metrics count every request
MAX_DRAWN_SPANS = 12_000  # boxes the page draws (fewer requests are drawn when theirs are more)


def settings_json(settings: Settings) -> dict[str, Any]:
    """The settings as JSON values: an infinite request rate as ``"inf"``, as the query string writes it (JSON has no
    infinity)."""
    return {k: "inf" if isinstance(v, float) and math.isinf(v) else v for k, v in settings.model_dump().items()}


def _ms(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


METRICS = (  # (key of the page, key of summary.json); the summary's are vLLM bench serve's
    ("ttft_mean_ms", "mean_ttft_ms"),
    ("ttft_p50_ms", "median_ttft_ms"),
    ("ttft_p90_ms", "p90_ttft_ms"),
    ("ttft_p99_ms", "p99_ttft_ms"),
    ("tpot_mean_ms", "mean_tpot_ms"),
    ("tpot_p90_ms", "p90_tpot_ms"),
    ("itl_mean_ms", "mean_server_itl_ms"),
    ("itl_p90_ms", "p90_server_itl_ms"),
    ("itl_p99_ms", "p99_server_itl_ms"),
    ("e2el_mean_ms", "mean_e2el_ms"),
    ("e2el_p50_ms", "median_e2el_ms"),
    ("e2el_p90_ms", "p90_e2el_ms"),
    ("e2el_p99_ms", "p99_e2el_ms"),
    ("output_throughput", "output_throughput"),
    ("request_throughput", "request_throughput"),
    ("gpu_idle_ms", "gpu_idle_s"),
    ("gpu_idle_percent", "gpu_idle_fraction"),
    ("seat_utilization_percent", "seat_utilization"),
    ("mean_batch_size", "mean_batch_size"),
    ("peak_kv_usage_percent", "peak_kv_usage"),
    ("mean_kv_usage_percent", "mean_kv_usage"),
    ("completed", "completed"),
    ("rejected", "failed"),
)


def metrics_of(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """The metric panel's numbers from a run's summary (ms, %, tokens/s, requests/s)."""
    out: dict[str, float | None] = {}
    for key, source in METRICS:
        value = summary.get(source)
        if value is not None:
            value = float(value) * (1000.0 if key.endswith("_ms") and source.endswith("_s") else 1.0)
            value *= 100.0 if key.endswith("_percent") else 1.0
        out[key] = value if value is None or math.isfinite(value) else None  # JSON has no inf or nan
    return out


def run_json(run: PolicyRun, settings: Settings, query: str) -> dict[str, Any]:
    """The page's JSON for one run: requests, iterations, spans (with seats) of the first ``MAX_DRAWN_REQUESTS``
    requests, GPU idle stretches and the metrics of all. Every time is the run's own (records in ms)."""
    req = run.requests
    drawn_ids = [str(i) for i in req.index[:MAX_DRAWN_REQUESTS]]
    seat_of = seat_assignment(run)
    spans = request_spans(_only(run, drawn_ids))
    per_request = spans.groupby("request_id", sort=False).size().reindex(drawn_ids, fill_value=0)
    fits = int(np.searchsorted(per_request.cumsum().to_numpy(), MAX_DRAWN_SPANS, side="right"))
    if fits < len(drawn_ids):  # long outputs: as many requests as MAX_DRAWN_SPANS boxes hold (at least one)
        drawn_ids = drawn_ids[: max(fits, 1)]
        spans = spans[spans.request_id.isin(drawn_ids)]
    last = float(spans.end_ms.max()) if len(spans) else 0.0
    it = run.iterations[run.iterations.start_ms <= last] if len(drawn_ids) < len(req) else run.iterations
    blocks = max(int(run.summary.get("kv_cache_blocks") or 1), 1)
    return {
        "settings": settings_json(settings),
        "query": query,
        "title": f"{settings.policy} - {settings.model} on {settings.hardware}",
        "seats": run.seats,
        "end_ms": _ms(run.end_ms) or 0.0,
        "requests": [
            {
                "id": str(rid),
                "arrival_ms": float(r.arrival_ms),
                "first_token_ms": _ms(r.first_token_ms),
                "finish_ms": _ms(r.finish_ms),
                "response_ms": _ms(r.response_ms),
                "prompt": int(r.prompt_tokens),
                "output": int(r.output_tokens_wanted),
                "status": str(r.status),
                "reason": None if not isinstance(r.reason, str) or not r.reason else r.reason,
            }
            for rid, r in req.iloc[: len(drawn_ids)].iterrows()
        ],
        "iterations": [
            {
                "number": int(i.number),
                "start_ms": float(i.start_ms),
                "end_ms": float(i.end_ms),
                "num_seqs": int(i.prefill_seqs + i.decode_seqs),
                "prefill_tokens": int(i.prefill_tokens),
                "decode_tokens": int(i.decode_seqs),
                "kv_usage": float(i.kv_blocks_used) / blocks,
            }
            for i in it.itertuples()
        ],
        "spans": [
            {
                "request": s.request_id,
                "kind": s.kind,
                "start_ms": float(s.start_ms),
                "end_ms": float(s.end_ms),
                "iteration": int(s.iteration),
                "tokens": int(s.tokens),
                "seat": None if s.kind == "waiting" else seat_of.get(s.request_id),
            }
            for s in spans.itertuples()
        ],
        "idle": [[a, b] for a, b in idle_stretches(run) if a <= last],
        "metrics": metrics_of(run.summary),
        "drawn": {"requests": len(drawn_ids), "of": len(req)},
    }


def idle_stretches(run: PolicyRun) -> list[tuple[float, float]]:
    """Stretches (ms) with no iteration running, from the workload's start to the run's end (the summary's
    ``duration``): what ``gpu_idle_s`` sums."""
    starts, ends = run.iterations.start_ms.to_numpy(), run.iterations.end_ms.to_numpy()
    end = float(run.summary["duration"]) * 1000.0
    last = max(end, float(ends[-1]) if len(ends) else 0.0)
    edges = zip(np.concatenate([[0.0], ends]), np.concatenate([starts, [last]]), strict=True)
    return [(float(a), float(b)) for a, b in edges if b > a]


def _only(run: PolicyRun, ids: list[str]) -> PolicyRun:
    """``run`` with only the requests ``ids`` (the spans' loop then walks only those)."""
    if len(ids) == len(run.requests):
        return run
    keep = pd.Index(ids)
    requests = run.requests.loc[keep]
    batches = run.batches[run.batches.request_id.isin(keep)]
    return PolicyRun(run.label, run.policy, run.seats, requests, run.iterations, batches, run.summary)
