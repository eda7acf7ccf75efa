"""Overloaded points of a sweep: those whose arrivals outran the replica, by the test `ferry run` warns on
(``sim.metrics.overload``, the summary's ``overload``). Their latencies grow with the length of the trace rather than
measure the configuration, so the table marks them (``overloaded``, and ``sustained_rate``: the requests per second
the replica finishes of that workload while busy), the sweep counts them, and the figures keep them off the Pareto
front and mark them elsewhere."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the sweep's workers import this module for ``columns`` alone
    import pandas as pd

COLUMN = "overloaded"  # True where the point's run was overloaded; null where the point has no summary (an error)
RATE = "sustained_rate"  # requests/s the replica sustains on the point's workload; NaN unless overloaded


def columns(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A point's two columns from its run's summary: ``overloaded`` exactly when `ferry run` would warn, and the
    rate the replica sustains (NaN when not overloaded, or when the summary does not say)."""
    info = summary.get("overload")
    rate = info.get("sustained_rate") if isinstance(info, Mapping) else None
    return {COLUMN: bool(info), RATE: float(rate) if bool(info) and rate is not None else math.nan}


def mask(rows: pd.DataFrame) -> pd.Series:
    """Whether each row's run was overloaded; False where the table has no such column (a sweep stored before it)
    or the value is missing."""
    if COLUMN not in rows.columns:
        import pandas as pd

        return pd.Series(False, index=rows.index)
    return rows[COLUMN].eq(True)


def notice(overloaded: int, ok: int, mode: str = "run") -> str:
    """One line for a sweep with overloaded points: how many, and what to do (``max_rate`` mode: the rate found
    overloads the replica, so the SLO bounds no wait)."""
    if mode == "max_rate":
        return (
            f"{overloaded:,} of {ok:,} points overloaded at the highest rate meeting the SLO (arrivals outran the "
            f"replica and the SLO bounds no wait, so that rate is not a capacity): add a limit on TTFT or queueing to "
            f"slo (e.g. queueing_p50_ms: 2000); columns {COLUMN}, {RATE} (the req/s it sustains)"
        )
    return (
        f"{overloaded:,} of {ok:,} points overloaded (arrivals outran the replica: their latencies grow with the "
        f"trace, not the configuration): lower request_rate or raise capacity (replicas, tensor parallelism, a larger "
        f"GPU); columns {COLUMN}, {RATE} (the req/s it sustains)"
    )
