"""Serving metrics derived from a run's records, with vLLM ``bench serve`` key names where vLLM has them.

Per request (seconds): TTFT = first token - arrival; TPOT = (last token - first token) / (output tokens - 1) for
requests with more than one output token; ITL = each gap between consecutive tokens of a request; E2E latency
(``e2el``) = response - arrival, where the response is returned when the last token is made, or, under static
batching, when the request's whole batch ends; queueing delay = first scheduled - arrival.

Summary times are in milliseconds (``*_ms``), as vLLM prints them; throughputs per second. A statistic of an empty set
is ``None`` (null in JSON).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
import pandas as pd

from sim.records import RunRecords
from sim.request import Reason, Status

FloatArray = npt.NDArray[np.float64]
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


_STATUS_NAMES = np.array([s.name.lower() for s in Status], dtype=object)
_REASON_LABELS = np.array(["" if x == Reason.NONE else x.label for x in Reason], dtype=object)


def request_frame(records: RunRecords) -> pd.DataFrame:
    """One row per request (the content of ``requests.csv``); times in seconds."""
    r = records.requests
    ids = records.request_ids if records.request_ids is not None else np.arange(r.n).astype(str)
    made = r.generated
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(made > 1, (r.finish - r.first_token) / (made - 1), np.nan)
    return pd.DataFrame(
        {
            "request_id": ids,
            "arrival_s": r.arrival,
            "first_scheduled_s": r.first_scheduled,
            "first_token_s": r.first_token,
            "finish_s": r.finish,
            "response_s": r.response,
            "prompt_tokens": r.prompt,
            "output_tokens": made,
            "output_tokens_wanted": r.output_wanted,
            "queueing_s": r.first_scheduled - r.arrival,
            "ttft_s": r.first_token - r.arrival,
            "tpot_s": tpot,
            "e2el_s": r.response - r.arrival,
            "preemptions": r.preemptions,
            "recomputed_tokens": r.recomputed,
            "status": _STATUS_NAMES[r.status],
            "reason": _REASON_LABELS[r.reason],
        }
    )


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
        slos[name] = ms
    return slos


def idle_while_waiting(records: RunRecords) -> float:
    """Seconds with no iteration running while an admitted-to-queue request waits (a boat at the dock with
    passengers). Between iterations only arrivals happen, so within a gap the queue only grows."""
    it = records.iterations
    r = records.requests
    valid = np.sort(r.arrival[~((r.status == Status.REJECTED) & (r.reason != Reason.STALLED))])
    if not len(it) or not len(valid):
        return 0.0
    start, end, waiting = it.column("start"), it.column("end"), it.column("waiting")
    gap_a = np.concatenate([[valid[0]], end[:-1]])
    gap_b = start
    queued = np.concatenate([[1.0], waiting[:-1]]) > 0
    idx = np.searchsorted(valid, gap_a, side="left")
    first_arrival = np.where(idx < len(valid), valid[np.minimum(idx, len(valid) - 1)], np.inf)
    from_t = np.where(queued, gap_a, np.maximum(gap_a, first_arrival))
    return float(np.clip(gap_b - from_t, 0.0, None).sum())


def summarize(records: RunRecords, goodput: Mapping[str, float] | None = None) -> dict[str, object]:
    """The run's summary: vLLM ``bench serve`` keys, then what batching is about (idle, seats, batch size, KV)."""
    r = records.requests
    it = records.iterations
    frame = request_frame(records)
    done = r.status == Status.FINISHED
    ends = np.concatenate([r.response[done], it.column("end")])
    t0 = float(r.arrival.min()) if r.n else 0.0
    t1 = float(ends.max()) if len(ends) else t0
    duration = max(t1 - t0, 0.0)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)

    completed = int(done.sum())
    input_tokens = int(r.prompt[done].sum())
    output_tokens = int(r.generated[done].sum())
    ttft = frame["ttft_s"].to_numpy()[done]
    tpot = frame["tpot_s"].to_numpy()[done]
    e2el = frame["e2el_s"].to_numpy()[done]
    reasons = pd.Series(_REASON_LABELS[r.reason[r.status == Status.REJECTED]], dtype=object)

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
            vals = frame[f"{name}_s"].to_numpy() * 1e3
            good &= ~(vals > ms)  # a one-token request has no TPOT and cannot miss a TPOT SLO
        out["request_goodput"] = per_s(int(good.sum()))
        out["goodput_slos_ms"] = dict(goodput)
    out.update(_stats("ttft", ttft))
    out.update(_stats("tpot", tpot))
    out.update(_named("itl", records.itl.stats((50, 90, 99))))
    out.update(_stats("e2el", e2el))
    out.update(_stats("queueing", frame["queueing_s"].to_numpy()[done]))
    # the vLLM paper's normalized latency: each request's end-to-end latency divided by its output tokens
    made = np.maximum(r.generated[done], 1)
    out["mean_normalized_latency_ms"] = float((e2el / made).mean() * 1e3) if completed else None

    busy_each = it.column("end") - it.column("start")
    busy = float(busy_each.sum())
    # idle: the gaps between iterations, summed (not duration - busy, which leaves rounding dust)
    starts, ends_it = it.column("start"), it.column("end")
    if len(it):
        idle = float(starts[0] - t0) + float((starts[1:] - ends_it[:-1]).sum()) + float(t1 - ends_it[-1])
    else:
        idle = duration
    seqs = it.column("prefill_seqs") + it.column("decode_seqs")
    seats = it.column("seats")
    seated_time = float((seats * busy_each).sum())
    kv_frac = it.column("kv_blocks_used") / max(records.kv_num_blocks, 1)
    out.update(
        {
            "rejected_by_reason": {str(k): int(v) for k, v in reasons.value_counts().sort_index().items()},
            "num_iterations": len(it),
            "gpu_busy_s": busy,
            "gpu_idle_s": idle,
            "gpu_idle_fraction": idle / duration if duration > 0 else 0.0,
            "idle_while_waiting_s": idle_while_waiting(records),
            # share of seat-time not held by finished requests waiting for their batch to end
            "seat_utilization": 1.0 - float((it.column("held") * busy_each).sum()) / seated_time
            if seated_time > 0
            else None,
            "mean_batch_size": float(seqs.mean()) if len(it) else None,
            "mean_tokens_per_iteration": float((it.column("prefill_tokens") + it.column("decode_seqs")).mean())
            if len(it)
            else None,
            "kv_cache_blocks": records.kv_num_blocks,
            "kv_block_size": records.kv_block_size,
            "peak_kv_usage": float(kv_frac.max()) if len(it) else 0.0,
            "mean_kv_usage": float((kv_frac * busy_each).sum() / busy) if busy > 0 else 0.0,
            "total_preemptions": int(r.preemptions.sum()),
            "preempted_requests": int((r.preemptions > 0).sum()),
            "recomputed_tokens": int(r.recomputed.sum()),
            "itl_kept": records.itl.describe(),
            "engine": records.engine,
        }
    )
    return out
