"""`ferry plan`'s search on a pool of worker processes: every candidate's plan, then the curves of the best of each
GPU kind (the fewest GPUs at other loads), each job started as soon as what it needs is done."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from experiments import workers

CURVE_FACTORS = (0.25, 0.5, 2.0)  # loads (times the target) at which the best candidates are also planned
MAX_CURVES = 3  # GPU kinds whose best candidate plan.png draws


def plan_one(job: tuple[Any, ...]) -> Any:
    from experiments.errors import one_line
    from experiments.plan.search import plan_candidate

    candidate, base, workload, slo, router, seed, max_replicas, single_rate, known = job
    try:
        return plan_candidate(candidate, base, workload, slo, router, seed, max_replicas, single_rate, known)
    except ValueError as exc:  # a setting the candidate refuses (e.g. max_num_batched_tokens < max_num_seqs)
        from experiments.plan.search import CandidateResult

        return CandidateResult(candidate, reason=f"does not run: {one_line(exc)}")


def search(pool: workers.Pool, todo: list[Any], base: Any, workload: Any, common: tuple[Any, ...],
           prices: dict[str, Any], on_done: Callable[[bool], None] | None = None,
           ) -> tuple[list[Any], list[Any], list[tuple[tuple[Any, float], Any]]]:  # fmt: skip
    """On one pool: every candidate's plan, the best candidate of each of the first ``MAX_CURVES`` GPU kinds (in rank
    order), and the points of their curves, as ((best, rate factor), plan at that rate). When every kind is drawn
    (``MAX_CURVES`` kinds or fewer), a kind's points start as soon as its own candidates are planned, else once all
    are; each point reuses the simulations its candidate's search ran (``simulated``). ``on_done(curve)`` is called
    as each job ends (a candidate's: False)."""
    from experiments.plan import report
    from experiments.plan.search import scaled, simulated

    results: list[Any] = [None] * len(todo)
    left = Counter(c.hardware for c in todo)  # candidates of each kind not planned yet
    every_kind = len(left) <= MAX_CURVES
    curve_jobs: list[tuple[Any, float]] = []  # (best, factor) of each job after the candidates'
    points: list[Any] = []

    def curves_of(planned: list[Any]) -> list[tuple[Any, ...]]:
        best = report.best_per_kind(report.ranked(planned, prices))[:MAX_CURVES]
        jobs = sorted(((r, f) for r in best for f in CURVE_FACTORS), key=_largest_first)
        curve_jobs.extend(jobs)
        points.extend([None] * len(jobs))
        return [(r.candidate, base, scaled(workload, f), *common, r.single_replica_rate, simulated(r, workload))
                for r, f in jobs]  # fmt: skip

    def on_result(k: int, result: Any) -> list[tuple[Any, ...]]:
        if on_done is not None:
            on_done(k >= len(todo))
        if k >= len(todo):  # a curve point
            points[k - len(todo)] = result
            return []
        results[k] = result
        kind = result.candidate.hardware
        left[kind] -= 1
        if every_kind and left[kind] == 0:
            return curves_of([r for r in results if r is not None and r.candidate.hardware == kind])
        if not every_kind and not any(left.values()):
            return curves_of(results)
        return []

    pool.for_each(plan_one, [(c, base, workload, *common, None, None) for c in todo], on_result)
    best = report.best_per_kind(report.ranked(results, prices))[:MAX_CURVES]
    return results, best, list(zip(curve_jobs, points, strict=True))


def _largest_first(job: tuple[Any, float]) -> float:
    """A curve job's order: the most replicas its rate needs first (the longest job), so that none starts last."""
    best, factor = job
    return -factor / best.single_replica_rate
