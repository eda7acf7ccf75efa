"""Serving metrics derived from a run's records, with vLLM ``bench serve`` key names where vLLM has them.

Client-side metrics follow ``vllm/benchmarks/serve.py`` (``calculate_metrics``, vLLM main, late 2026) and are
computed from when the client *receives* tokens, for every policy:
- a streamed response (``records.stream``) delivers each token when the iteration that made it ends;
- a response that is not streamed arrives whole when the request gives back its seat: at its last token, or, under
  static and dynamic batching (whose default this is), when its whole batch ends.
Per request (seconds): TTFT = first token received - arrival; E2E latency (``e2el``) = whole response received -
arrival; TPOT = (E2EL - TTFT) / (output tokens - 1), for requests with more than one output token (0 for a response
that arrives whole); ITL = each gap between consecutive tokens the client receives (none for a response that arrives
whole); queueing delay = first scheduled - arrival. The server's side (when tokens were *made*) is kept apart:
``server_ttft`` = first token made - arrival, ``server_tpot`` = (last token made - first token made) / (output - 1),
``server_itl`` = gaps between tokens made.

``duration`` runs from the benchmark's start (t = 0, the workload's time origin, before the first arrival) to the
last response or iteration, as ``vllm bench serve`` measures it. Goodput counts a finished request whose every
given SLO holds (value <= SLO, vLLM's rule; a one-token request's TPOT is 0, as in vLLM's ``all_tpots``).

Summary times are in milliseconds (``*_ms``), as vLLM prints them; throughputs per second. A statistic of an empty set
is ``None`` (null in JSON; vLLM writes 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from sim.records import RunRecords
from sim.request import Reason, Status
from sim.tables import (  # noqa: F401  (the run's tables, once here: their names stay importable from this module)
    REASON_LABELS,
    batch_columns,
    batch_frame,
    client_times,
    latencies,
    request_columns,
    request_frame,
)

FloatArray = npt.NDArray[np.float64]
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def _stats(prefix: str, values_s: FloatArray) -> dict[str, float | None]:
    """mean/median/std/p90/p99 of ``values_s`` (seconds) as ``{stat}_{prefix}_ms``."""
    v = values_s[~np.isnan(values_s)]
    if not len(v):
        return _named(prefix, None)
    return _named(prefix, (float(v.mean()), float(v.std()), [float(x) for x in np.percentile(v, [50, 90, 99])]))


def _named(prefix: str, stats: tuple[float, float, list[float]] | None) -> dict[str, float | None]:
    if stats is None:
        return {f"{k}_{prefix}_ms": None for k in ("mean", "median", "std", "p90", "p99")}
    mean, std, (p50, p90, p99) = stats
    return {
        f"mean_{prefix}_ms": mean * 1e3,
        f"median_{prefix}_ms": p50 * 1e3,
        f"std_{prefix}_ms": std * 1e3,
        f"p90_{prefix}_ms": p90 * 1e3,
        f"p99_{prefix}_ms": p99 * 1e3,
    }


def parse_goodput(specs: list[str] | None) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` -> ``{"ttft": 200.0, "tpot": 50.0}`` (milliseconds), as vLLM's ``--goodput``."""
    slos: dict[str, float] = {}
    for spec in specs or []:
        name, sep, value = spec.partition(":")
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(f"--goodput {spec!r}: expected NAME:MS with NAME one of {', '.join(GOODPUT_METRICS)}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"--goodput {spec!r}: {value!r} is not a number of milliseconds") from None
        if not ms > 0 or math.isinf(ms):
            raise ValueError(f"--goodput {spec!r}: the SLO must be a positive number of milliseconds")
        if name in slos:
            raise ValueError(f"--goodput {spec!r}: {name} is given twice; give it once")
        slos[name] = ms
    return slos


CHUNK = 1 << 16  # iterations a temporary array spans (a long run has millions): see ``per_iteration``


def per_iteration(n: int, f: Callable[[slice], npt.NDArray[Any]]) -> FloatArray:
    """The array ``f`` gives over ``n`` iterations, built one chunk of rows at a time (``f(rows)``), so that the
    temporaries of its expression span a chunk, not the run; the values are those of ``f(slice(0, n))``."""
    out = np.empty(n)
    for a in range(0, n, CHUNK):
        rows = slice(a, min(a + CHUNK, n))
        out[rows] = f(rows)
    return out


def idle_while_waiting(records: RunRecords) -> float:
    """Seconds with no iteration running while an admitted-to-queue request waits (a boat at the dock with
    passengers). Between iterations only arrivals happen, so within a gap the queue only grows."""
    it = records.iterations
    r = records.requests
    valid = np.sort(r.arrival[~((r.status == Status.REJECTED) & (r.reason != Reason.STALLED))])
    if not len(it) or not len(valid):
        return 0.0
    start, end, waiting = it.column("start"), it.column("end"), it.column("waiting")

    def idle(rows: slice) -> FloatArray:  # each gap between iterations is (gap_a, its iteration's start)
        before = slice(max(rows.start - 1, 0), rows.stop - 1)
        first = rows.start == 0  # the first gap runs from the first arrival
        gap_a = np.concatenate([valid[:1] if first else valid[:0], end[before]])
        queued = np.concatenate([np.ones(int(first), dtype=bool), waiting[before] > 0])
        # from when someone waited in it: its start if someone was queued, else the first arrival in it
        idx = np.searchsorted(valid, gap_a, side="left")
        first_arrival = np.where(idx < len(valid), valid[np.minimum(idx, len(valid) - 1)], np.inf)
        from_t = np.where(queued, gap_a, np.maximum(gap_a, first_arrival))
        return np.clip(start[rows] - from_t, 0.0, None)

    return float(per_iteration(len(it), idle).sum())


def seat_use(records: RunRecords) -> dict[str, float | int | None]:
    """How the seats the policy offers (``records.seats``: max batch size or max_num_seqs) were used, averaged over
    busy time: ``seat_utilization`` = seats held by requests still generating / seats offered; ``held_seat_fraction``
    = seats held by finished requests waiting for their batch to end / seats offered (static and dynamic batching).
    One request alone in an 8-seat batch is 1/8. ``None`` without iterations or when the policy offers no count."""
    it = records.iterations
    start, end, held, seats = it.column("start"), it.column("end"), it.column("held"), it.column("seats")
    offered = float(records.seats) * float(per_iteration(len(it), lambda k: end[k] - start[k]).sum())
    if offered <= 0:
        return {"seats_offered": records.seats or None, "seat_utilization": None, "held_seat_fraction": None}

    def active(k: slice) -> npt.NDArray[Any]:  # seats of requests still generating, times how long
        return (seats[k] - held[k].astype(np.float64)) * (end[k] - start[k])

    def holding(k: slice) -> npt.NDArray[Any]:  # seats held by finished requests, times how long
        return held[k].astype(np.float64) * (end[k] - start[k])

    return {
        "seats_offered": records.seats,
        "seat_utilization": float(per_iteration(len(it), active).sum()) / offered,
        "held_seat_fraction": float(per_iteration(len(it), holding).sum()) / offered,
    }


def overload(records: RunRecords, replicas: int = 1) -> dict[str, float] | None:
    """Whether arrivals outran the replica, judged over the second half of the arrival period (the first half lets
    the queue fill): the backlog (requests arrived and not yet done) grew by more than a tenth of the arrival rate,
    to more than 10 requests, with the GPU busy over 90% of that time. Returns the rates (per second) and the
    backlog, or None. ``sustained_rate``, the requests finished per busy second, estimates
    what the replica sustains on this workload. ``replicas``: the iterations are those of that many replicas of a
    cluster (busy means all of them busy; the sustained rate is the cluster's)."""
    r = records.requests
    valid = ~((r.status == Status.REJECTED) & (r.reason != Reason.STALLED))
    arrivals = np.sort(r.arrival[valid])
    if len(arrivals) < 20 or not arrivals[-1] > 0:
        return None
    end = float(arrivals[-1])
    half = end / 2
    window = end - half
    done = np.sort(r.released[valid & (r.status == Status.FINISHED)])

    def backlog(t: float) -> int:
        return int(np.searchsorted(arrivals, t, side="right") - np.searchsorted(done, t, side="right"))

    arrived = int(np.searchsorted(arrivals, end, side="right") - np.searchsorted(arrivals, half, side="right"))
    finished = int(np.searchsorted(done, end, side="right") - np.searchsorted(done, half, side="right"))
    it = records.iterations
    start_it, end_it = it.column("start"), it.column("end")
    busy = float(
        per_iteration(
            len(it), lambda k: np.clip(np.minimum(end_it[k], end) - np.maximum(start_it[k], half), 0.0, None)
        ).sum()
    )
    growth = (backlog(end) - backlog(half)) / window
    rate = arrived / window
    if not (growth > 0.1 * rate and backlog(end) > 10 and busy > 0.9 * window * replicas):
        return None
    total_busy = float(per_iteration(len(it), lambda k: end_it[k] - start_it[k]).sum())
    return {
        "arrival_rate": rate,
        "finished_rate": finished / window,  # requests finished per second in the second half of the arrivals
        "backlog_growth_per_s": growth,
        "backlog_at_last_arrival": float(backlog(end)),
        # requests finished per busy second over the whole run: what the replica sustains on this workload
        "sustained_rate": len(done) * replicas / total_busy if total_busy > 0 else 0.0,
    }


def overload_notice(info: Mapping[str, float]) -> str:
    """One line for a run whose arrivals outran the replica."""
    return (
        f"overloaded: requests arrived at {info['arrival_rate']:,.3g}/s and the backlog grew by "
        f"{info['backlog_growth_per_s']:,.3g}/s over the second half of the arrivals (to "
        f"{int(info['backlog_at_last_arrival']):,} requests); busy, the replica finishes about "
        f"{info['sustained_rate']:,.3g} req/s of this workload, so these latencies grow with the length of the trace"
    )


def summarize(
    records: RunRecords, goodput: Mapping[str, float] | None = None, token_gaps: bool = True
) -> dict[str, object]:
    """The run's summary: vLLM ``bench serve`` keys, then what batching is about (idle, seats, batch size, KV).
    ``token_gaps=False``: the token gaps' statistics (``*_itl_ms``) are None, not computed (a search that never reads
    them spares sorting every gap of every run)."""
    r = records.requests
    it = records.iterations
    lat = latencies(records)
    done = r.status == Status.FINISHED
    response = lat["response_s"]
    ends = [x for x in (response[done], it.column("end")) if len(x)]  # the last response or iteration
    t0 = 0.0  # the benchmark's start: the workload's time origin
    t1 = max(max(float(x.max()) for x in ends), t0) if ends else t0
    duration = t1 - t0
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)

    completed = int(done.sum())
    input_tokens = int(r.prompt[done].sum())
    output_tokens = int(r.generated[done].sum())
    ttft = lat["ttft_s"][done]
    tpot = lat["tpot_s"][done]
    e2el = lat["e2el_s"][done]
    reasons, counts = np.unique(r.reason[r.status == Status.REJECTED], return_counts=True)
    by_reason = dict(sorted((str(REASON_LABELS[k]), int(v)) for k, v in zip(reasons, counts, strict=True)))

    out: dict[str, object] = {
        "duration": duration,
        "completed": completed,
        "failed": int((r.status == Status.REJECTED).sum()),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": per_s(completed),
        "output_throughput": per_s(output_tokens),
        "total_token_throughput": per_s(input_tokens + output_tokens),
    }
    if goodput:
        good = done.copy()
        for name, ms in goodput.items():
            vals = lat[f"{name}_s"] * 1e3
            if name == "tpot":  # vLLM's all_tpots: a one-token response's TPOT is 0
                vals = np.where(np.isnan(vals), 0.0, vals)
            good &= vals <= ms
        out["request_goodput"] = per_s(int(good.sum()))
        out["goodput_slos_ms"] = dict(goodput)
    out.update(_stats("ttft", ttft))
    out.update(_stats("tpot", tpot))
    # the client sees token gaps only when the response is streamed; then they are the gaps between tokens made
    # once: the client's gaps (when streamed) and the server's are the same
    itl = records.itl.stats((50, 90, 99)) if token_gaps else None
    out.update(_named("itl", itl if records.stream else None))
    out.update(_stats("e2el", e2el))
    out.update(_stats("queueing", lat["queueing_s"][done]))
    out.update(_stats("server_ttft", lat["server_ttft_s"][done]))
    out.update(_stats("server_tpot", lat["server_tpot_s"][done]))
    del lat
    out.update(_named("server_itl", itl))
    # the vLLM paper's normalized latency: each request's end-to-end latency divided by its output tokens
    made = np.maximum(r.generated[done], 1)
    out["mean_normalized_latency_ms"] = float((e2el / made).mean() * 1e3) if completed else None
    del ends, made
    # what walks every iteration, one at a time (a long run has millions)
    waiting_idle, seats, overloaded = idle_while_waiting(records), seat_use(records), overload(records)

    start, end, blocks = it.column("start"), it.column("end"), it.column("kv_blocks_used")
    busy = float(per_iteration(len(it), lambda k: end[k] - start[k]).sum())
    # idle: the gaps between iterations, summed (not duration - busy, which leaves rounding dust)
    starts, ends_it = it.column("start"), it.column("end")
    if len(it):
        gaps = per_iteration(len(it) - 1, lambda k: starts[k.start + 1 : k.stop + 1] - ends_it[k])
        idle = float(starts[0] - t0) + float(gaps.sum()) + float(t1 - ends_it[-1])
        del gaps
    else:
        idle = duration
    mean_batch = mean_tokens = None  # each array gone as soon as it is summed
    if len(it):
        mean_batch = float((it.column("prefill_seqs") + it.column("decode_seqs")).mean())
        drafts = it.column("draft_tokens")
        mean_tokens = float((it.column("prefill_tokens") + it.column("decode_seqs") + drafts).mean())
        del drafts
    capacity = max(records.kv_num_blocks, 1)
    # the KV cache's use, weighted by each iteration's time
    kv_time = float(per_iteration(len(it), lambda k: blocks[k] / capacity * (end[k] - start[k])).sum())
    out.update(
        {
            "rejected_by_reason": by_reason,
            "num_iterations": len(it),
            "gpu_busy_s": busy,
            "gpu_idle_s": idle,
            "gpu_idle_fraction": idle / duration if duration > 0 else 0.0,
            "idle_while_waiting_s": waiting_idle,
            **seats,
            "mean_batch_size": mean_batch,
            "mean_tokens_per_iteration": mean_tokens,
            "kv_cache_blocks": records.kv_num_blocks,
            "kv_block_size": records.kv_block_size,
            "peak_kv_usage": float(blocks.max() / capacity) if len(it) else 0.0,
            "mean_kv_usage": kv_time / busy if busy > 0 else 0.0,
            "total_preemptions": int(r.preemptions.sum()),
            "preempted_requests": int((r.preemptions > 0).sum()),
            "recomputed_tokens": int(r.recomputed.sum()),
            "overload": overloaded,
            "itl_kept": records.itl.describe(),
            "stream": records.stream,
            "engine": records.engine,
            "engine_choice": records.engine_choice,
        }
    )
    if records.prefix_cache is not None:
        out.update(prefix_cache_summary(records.prefix_cache, r.cached[done] > 0, ttft))
    if records.speculation is not None:
        out.update(speculation_summary(records.speculation, int(r.draft_tokens.sum()), int(r.accepted_tokens.sum())))
    return out


def speculation_summary(counters: npt.NDArray[np.int64], drafted: int, accepted: int) -> dict[str, Any]:
    """Speculative decoding's outcome under `vllm bench serve`'s keys (``vllm/benchmarks/serve.py``, from the
    server's ``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``, ``_num_accepted_tokens`` and
    ``_num_accepted_tokens_per_pos`` counters): the acceptance rate (accepted / draft tokens, in percent), the mean
    acceptance length (1 + accepted per verification step with drafts), the steps, draft tokens (placeholders
    included, as vLLM counts them), accepted tokens, and each position's acceptance (accepted there per step)."""
    steps = int(counters[0])
    return {
        "spec_decode_acceptance_rate": 100.0 * accepted / drafted if drafted else None,
        "spec_decode_acceptance_length": 1.0 + accepted / steps if steps else None,
        "spec_decode_num_drafts": steps,
        "spec_decode_draft_tokens": drafted,
        "spec_decode_accepted_tokens": accepted,
        "spec_decode_per_position_acceptance_rates": [int(x) / steps for x in counters[1:]] if steps else [],
    }


def prefix_cache_summary(counters: Mapping[str, int], hit: npt.NDArray[np.bool_], ttft_s: FloatArray) -> dict[str, Any]:
    """Prefix caching's share of the work: vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits`` (prompt tokens
    looked up and found at admissions), their ratio and the block hit rate, the prefill tokens not computed, the
    evictions, and TTFT (client, ms) of the completed requests that found part of their prompt cached at their first
    admission against those that found none."""
    queries, hits = counters["prefix_cache_queries"], counters["prefix_cache_hits"]
    blocks = counters["prefix_cache_query_blocks"]
    out: dict[str, Any] = dict(counters)
    out["prefix_cache_hit_rate"] = hits / queries if queries else 0.0
    out["prefix_cache_block_hit_rate"] = counters["prefix_cache_hit_blocks"] / blocks if blocks else 0.0
    out["prefill_tokens_saved"] = hits
    out["requests_with_cache_hit"] = int(hit.sum())
    for name, rows in (("hit", hit), ("miss", ~hit)):
        out.update({k.replace("_ttft_", f"_ttft_{name}_"): v for k, v in _stats("ttft", ttft_s[rows]).items()})
    return out
