"""Service-level objectives a plan must meet: latency percentiles of `ferry run`'s summary (``--slo
ttft_p99_ms=2000 tpot_p99_ms=100``), and optionally a share of requests that meet per-request thresholds
(``--min-goodput 0.99 --goodput ttft:2000 tpot:100``, vLLM ``bench serve``'s goodput)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

METRICS = ("ttft", "tpot", "itl", "e2el", "queueing")  # queueing: arrival to first scheduled (Sarathi's delay)
STATS = {"p50": "median", "p90": "p90", "p99": "p99", "mean": "mean"}
GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # what vLLM's --goodput judges per request


@dataclass(frozen=True)
class SLO:
    """Limits on a summary: ``limits`` maps a summary key (``p99_ttft_ms`` ...) to its largest allowed value (ms);
    ``min_goodput`` is the least share of requests that must meet every ``goodput`` threshold (ms)."""

    limits: dict[str, float] = field(default_factory=dict)
    min_goodput: float | None = None
    goodput: dict[str, float] = field(default_factory=dict)

    def thresholds(self) -> dict[str, float]:
        """Per-request thresholds for the summary's ``request_goodput``: the goodput ones, else the percentile
        limits' metrics (ttft, tpot, e2el), so a plan can report goodput per GPU."""
        if self.goodput:
            return dict(self.goodput)
        out: dict[str, float] = {}
        for key, limit in self.limits.items():
            metric = key.split("_")[1]
            if metric in GOODPUT_METRICS:
                out[metric] = min(limit, out.get(metric, limit))
        return out

    def check(self, summary: dict[str, Any]) -> tuple[bool, dict[str, float]]:
        """Whether ``summary`` meets the SLO, and each limit's headroom: achieved / limit (below 1 meets)."""
        ratios: dict[str, float] = {}
        for key, limit in self.limits.items():
            value = summary.get(key)
            ratios[key] = float("inf") if value is None else float(value) / limit
        if self.min_goodput is not None:
            served = summary.get("request_throughput") or 0.0
            share = (summary.get("request_goodput") or 0.0) / served if served else 0.0
            # a share of 1 against a floor of 0.99 is a ratio of 0.99: how far below the floor's complement
            ratios["goodput_share"] = (1 - share) / (1 - self.min_goodput) if self.min_goodput < 1 else (
                0.0 if share >= 1 else float("inf"))  # fmt: skip
        ok = all(r <= 1.0 for r in ratios.values()) and summary.get("failed", 0) == 0
        return ok, ratios

    def describe(self) -> str:
        parts = [f"{k}<={v:g}" for k, v in self.limits.items()]
        if self.min_goodput is not None:
            parts.append(f"goodput>={self.min_goodput:g} ({', '.join(f'{k}:{v:g}' for k, v in self.goodput.items())})")
        return ", ".join(parts)


def parse_slo(items: list[str] | None, min_goodput: float | None = None, goodput: list[str] | None = None) -> SLO:
    """``["ttft_p99_ms=2000", ...]`` (or ``p99_ttft_ms=2000``), ``min_goodput`` and ``["ttft:2000", ...]``."""
    limits: dict[str, float] = {}
    given: dict[str, str] = {}  # each summary key's --slo item, to name both when one is given twice
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--slo {item!r}: expected NAME=MS, e.g. ttft_p99_ms=2000")
        key = summary_key(name)
        if key in limits:
            raise ValueError(f"--slo {item!r}: {key} is limited twice ({given[key]!r} and {item!r}); give it once")
        given[key] = item
        limits[key] = _positive(value, f"--slo {item!r}")
    thresholds: dict[str, float] = {}
    for item in goodput or []:
        name, sep, value = item.partition(":")
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(f"--goodput {item!r}: expected ttft:MS, tpot:MS or e2el:MS")
        if name in thresholds:
            raise ValueError(f"--goodput {item!r}: {name} is given twice; give it once")
        thresholds[name] = _positive(value, f"--goodput {item!r}")
    if min_goodput is not None:
        if not 0 < min_goodput <= 1:
            raise ValueError(f"--min-goodput {min_goodput:g}: a share of requests, in (0, 1]")
        if not thresholds:
            raise ValueError("--min-goodput needs --goodput thresholds (ttft:MS tpot:MS e2el:MS)")
    elif thresholds:
        raise ValueError("--goodput thresholds need --min-goodput (the share of requests that must meet them)")
    if not limits and min_goodput is None:
        raise ValueError("give an SLO: --slo ttft_p99_ms=2000 tpot_p99_ms=100, and/or --min-goodput with --goodput")
    return SLO(limits, min_goodput, thresholds)


def summary_key(name: str) -> str:
    """The summary key an SLO name means: ``ttft_p99_ms`` and ``p99_ttft_ms`` are ``p99_ttft_ms``; p50 is the
    median."""
    parts = name.removesuffix("_ms").split("_")
    if len(parts) == 2:
        a, b = parts
        metric, stat = (a, b) if a in METRICS else (b, a)
        if metric in METRICS and stat in STATS:
            return f"{STATS[stat]}_{metric}_ms"
    keys = ", ".join(f"{m}_{s}_ms" for m in METRICS for s in ("p50", "p90", "p99"))
    raise ValueError(f"unknown SLO {name!r}; use one of {keys} (or mean)")


def _positive(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number of milliseconds") from None
    if not value > 0:
        raise ValueError(f"{what}: the limit must be > 0 ms")
    return value
