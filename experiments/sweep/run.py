"""Running a sweep's points: serially, on a process pool (every core, the default), or on an existing Dask
distributed scheduler; each finished point is stored at once (``experiments.sweep.store``), so a sweep resumes where
it stopped. A point that raises is stored with its error and the sweep goes on."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from functools import lru_cache, partial
from importlib import metadata
from typing import Any

from experiments import workers
from experiments.sweep import overload
from experiments.sweep.spec import Point, SweepSpec


@lru_cache(maxsize=1)
def version() -> str:
    """ferry's installed version (read once per process: each point's row carries it)."""
    try:
        return metadata.version("ferry")
    except metadata.PackageNotFoundError:
        return "unknown"


def run_point(point: Point, spec: SweepSpec) -> dict[str, Any]:
    """One point's row: the swept values, the status (``ok`` / ``error`` with the message), wall seconds, every
    scalar of the run's summary and whether it was overloaded (``experiments.sweep.overload``; ``max_rate`` mode: of
    the run at the highest rate that met the SLO, with ``max_rate`` and the ``evaluations`` behind it)."""
    started = time.perf_counter()
    row: dict[str, Any] = {"point": point.index, "hash": point.hash, "status": "ok", "error": "",
                           "seed": point.params.get("seed", point.config.workload.seed if point.config else None),
                           "ferry_version": version(), "mode": spec.mode} | dict(point.params)  # fmt: skip
    try:
        if point.config is None:
            raise ValueError(point.error)
        if spec.mode == "max_rate":
            metrics = capacity(point, spec)
        else:
            from experiments.runner.simulation import run_simulation

            summary = run_simulation(point.config).summary
            metrics = scalars(summary) | overload.columns(summary)
        # a swept value stays as the sweep file gave it (the summary names a model or device its own way)
        row |= {k: v for k, v in metrics.items() if k not in point.params}
    except Exception as exc:  # noqa: BLE001 (a point's failure is recorded, not raised: the sweep goes on)
        from experiments.errors import one_line

        row["status"] = "error"
        row["error"] = (" ".join(one_line(exc).split()) if isinstance(exc, ValueError) else str(exc)) or type(
            exc).__name__  # fmt: skip
        if not isinstance(exc, (ValueError, OSError)):
            row["error"] += " | " + traceback.format_exc(limit=3).splitlines()[-1]
    row["wall_s"] = time.perf_counter() - started
    return row


def scalars(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's scalar keys (numbers, strings, booleans; nested parts left out)."""
    return {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}


def capacity(point: Point, spec: SweepSpec) -> dict[str, Any]:
    """The highest request rate meeting the sweep's SLO (bisection over rates on the point's workload, its arrivals
    scaled), and the summary at that rate."""
    from experiments.plan.search import scaled, workload_rate
    from experiments.runner.simulation import build_workload, run_simulation
    from experiments.studies.ratesearch import max_rate

    assert point.config is not None
    slo = spec.slo_object()
    config = point.config.model_copy(update={"goodput": slo.thresholds()})
    workload = build_workload(config)
    base_rate = workload_rate(workload)
    if base_rate == float("inf"):
        raise ValueError("mode max_rate needs arrivals spread in time: give the base a finite request_rate")
    tried: list[dict[str, Any]] = []

    def evaluate(rate: float) -> dict[str, Any]:
        summary = run_simulation(config, workload=scaled(workload, rate / base_rate)).summary
        ok, ratios = slo.check(summary)
        tried.append({"rate": rate, "meets": ok, **{k: summary.get(k) for k in slo.limits}})
        return summary | {"_meets": ok}

    search = max_rate(evaluate, lambda s: bool(s["_meets"]), start=spec.rate_start, rel_tol=spec.rate_tolerance)
    best = next((s for r, s in reversed(search.tried) if r == search.rate and s["_meets"]), None)
    out = (scalars(best) | overload.columns(best)) if best is not None else {}
    out.pop("_meets", None)
    return out | {"max_rate": search.rate, "evaluations": json.dumps(tried)}


def execute(points: list[Point], spec: SweepSpec, jobs: int, dask: str | None,
            on_done: Callable[[dict[str, Any]], None]) -> None:  # fmt: skip
    """Run ``points``, calling ``on_done(row)`` in this process as each finishes. On Ctrl-C the queued points are
    cancelled and the running ones abandoned at once, and every point that had finished is handed to ``on_done``
    before the ``KeyboardInterrupt`` propagates (``experiments.workers``)."""
    if not points:
        return
    if dask:
        _on_dask(points, spec, dask, on_done)
    elif jobs <= 1:
        for point in points:
            on_done(run_point(point, spec))
    else:  # each worker warmed once (imports, the compiled engine of every policy swept), then given points
        swept = [p.config.scheduler.policy for p in points if p.config is not None and p.config.engine != "reference"]
        warm = partial(workers.warm_engine, swept)
        workers.for_each(partial(run_point, spec=spec), points, min(jobs, len(points)),
                         lambda _k, row: on_done(row), warm)  # fmt: skip


def _on_dask(points: list[Point], spec: SweepSpec, address: str, on_done: Callable[[dict[str, Any]], None]) -> None:
    try:
        from distributed import Client
        from distributed import as_completed as dask_completed
    except ImportError:
        raise ValueError("--dask needs Dask's distributed scheduler: pip install 'ferry[dask]'") from None
    with Client(address) as client:
        futures = client.map(run_point, points, spec=spec, pure=False)
        handed: set[str] = set()
        try:
            for future in dask_completed(futures):
                on_done(future.result())
                handed.add(future.key)
        except BaseException:
            client.cancel([f for f in futures if f.status != "finished"])
            for future in futures:
                if future.key not in handed and future.status == "finished":
                    on_done(future.result())
            raise
