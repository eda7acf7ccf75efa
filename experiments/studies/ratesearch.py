"""The highest request rate a configuration sustains under a latency criterion (bisection over rates).

Load-latency curves of a serving system are flat, then bend up sharply once the replica saturates; the sustainable
rate is where the curve crosses the criterion. ``max_rate`` finds that crossing by bracketing it with doubling steps
and bisecting the bracket in log space, assuming latency does not fall as the rate grows (true of the policies here,
up to noise near the knee, which the tolerance absorbs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Summary = dict[str, Any]


@dataclass
class RateSearch:
    """The outcome of a search: the sustainable rate and every rate tried with its summary."""

    rate: float  # highest rate found to meet the criterion (requests/s); 0 if even the lowest tried fails
    tried: list[tuple[float, Summary]] = field(default_factory=list)  # (rate, summary) in the order evaluated

    def curve(self) -> list[tuple[float, Summary]]:
        """The evaluations sorted by rate: the load-latency curve the search drew on."""
        return sorted(self.tried, key=lambda item: item[0])


def max_rate(
    evaluate: Callable[[float], Summary],
    meets: Callable[[Summary], bool],
    start: float = 1.0,
    rel_tol: float = 0.03,
    max_evaluations: int = 30,
    lower: Callable[[float, Summary], float] | None = None,
) -> RateSearch:
    """Highest rate (requests/s) whose ``evaluate(rate)`` summary ``meets`` the criterion, within ``rel_tol``.

    Starts at ``start``, doubles (or halves) to bracket the crossing, then bisects the bracket geometrically.
    ``lower(rate, summary)``: the rate to try next below a ``rate`` that failed (default, and at most, half of it;
    e.g. what an overloaded run's throughput says the configuration can carry)."""
    if not start > 0 or not 0 < rel_tol < 1:
        raise ValueError(f"start={start} must be > 0 and rel_tol={rel_tol} in (0, 1)")
    search = RateSearch(rate=0.0)

    def ok(rate: float) -> bool:
        summary = evaluate(rate)
        search.tried.append((rate, summary))
        return meets(summary)

    lo, hi = start, start
    if ok(start):
        while len(search.tried) < max_evaluations:
            hi = lo * 2
            if not ok(hi):
                break
            lo = hi
        else:
            search.rate = lo
            return search
    else:
        while len(search.tried) < max_evaluations:
            hint = lower(hi, search.tried[-1][1]) if lower is not None else hi / 2
            lo = hint if 0 < hint < hi / 2 else hi / 2
            if ok(lo):
                break
            hi = lo
        else:
            return search
    while hi / lo > 1 + rel_tol and len(search.tried) < max_evaluations:
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    search.rate = lo
    return search
