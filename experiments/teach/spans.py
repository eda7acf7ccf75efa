"""What each request was doing over time, read from a run's records: the spans a timeline or a seat drawing colours.

One row per span: ``request_id``, ``kind`` (``waiting``: arrived, not yet computing; ``prefill`` / ``prefill_chunk`` /
``decode``: in an iteration; ``stalled``: seated between two of its iterations but not in this one; ``held``: done,
its seat kept until its batch ends), ``start_ms``, ``end_ms``, ``iteration`` (1-based; 0 for waiting and held),
``tokens`` (computed in the iteration; 0 otherwise).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.teach.runs import PolicyRun

SPAN_COLUMNS = ("request_id", "kind", "start_ms", "end_ms", "iteration", "tokens")


def request_spans(run: PolicyRun) -> pd.DataFrame:
    """Every span of every request of ``run``, requests in arrival order, spans in time order."""
    it = run.iterations
    starts, ends = it.start_ms.to_numpy(), it.end_ms.to_numpy()
    rows: list[tuple[str, str, float, float, int, int]] = []
    by_request = dict(tuple(run.batches.groupby("request_id", sort=False)))
    for rid, req in run.requests.iterrows():
        rides = by_request.get(rid)
        arrival = float(req.arrival_ms)
        if rides is None:  # never ran (rejected)
            continue
        k = rides.iteration.to_numpy()
        rows.append((str(rid), "waiting", arrival, float(starts[k[0]]), 0, 0))
        rode = set(k.tolist())
        for i in range(int(k[0]), int(k[-1]) + 1):
            if i not in rode:
                rows.append((str(rid), "stalled", float(starts[i]), float(ends[i]), i + 1, 0))
        for i, phase, tokens in zip(k, rides.phase, rides.tokens, strict=True):
            rows.append((str(rid), str(phase), float(starts[i]), float(ends[i]), int(i) + 1, int(tokens)))
        finish, released = float(req.finish_ms), float(req.released_ms)
        if np.isfinite(released) and released > finish:
            rows.append((str(rid), "held", finish, released, 0, 0))
    spans = pd.DataFrame(rows, columns=list(SPAN_COLUMNS))
    return spans.sort_values(["start_ms", "end_ms"], kind="stable").reset_index(drop=True)


def seat_assignment(run: PolicyRun) -> dict[str, int]:
    """Which seat (0-based) each request sat in: the lowest seat free when it first computed, kept until it gave
    the seat back (released). Seats are the policy's ``seats``; more requests seated at once is an error."""
    req = run.requests
    first = run.batches.groupby("request_id", sort=False).iteration.min()
    starts = run.iterations.start_ms.to_numpy()
    boarding = sorted(((float(starts[i]), str(rid)) for rid, i in first.items()), key=lambda x: x[0])
    free_at = [-np.inf] * run.seats
    seat_of: dict[str, int] = {}
    for t, rid in boarding:
        seat = next((s for s in range(run.seats) if free_at[s] <= t), None)
        if seat is None:
            raise RuntimeError(f"{run.label}: request {rid} boards at {t:.3f} ms with every seat taken")
        seat_of[rid] = seat
        free_at[seat] = float(req.loc[rid, "released_ms"])
    return seat_of


def dock_queue(run: PolicyRun) -> tuple[np.ndarray, np.ndarray]:
    """The dock (waiting queue) over time: change times (ms) and the number waiting from each on (a step curve)."""
    waits = request_spans(run)
    waits = waits[waits.kind == "waiting"]
    times = np.concatenate([waits.start_ms.to_numpy(), waits.end_ms.to_numpy()])
    steps = np.concatenate([np.ones(len(waits)), -np.ones(len(waits))])
    order = np.lexsort((-steps, times))  # at a tie, arrive before boarding so the step shows both
    times, count = times[order], np.cumsum(steps[order])
    return np.concatenate([[0.0], times]), np.concatenate([[0.0], count])


def gpu_idle_spans(run: PolicyRun) -> list[tuple[float, float]]:
    """Stretches (ms) between the first arrival and the last iteration with no iteration running."""
    it = run.iterations
    if not len(it):
        return []
    out = []
    first = float(run.requests.arrival_ms.min())
    if it.start_ms.iloc[0] > first:
        out.append((first, float(it.start_ms.iloc[0])))
    for a, b in zip(it.end_ms.to_numpy()[:-1], it.start_ms.to_numpy()[1:], strict=True):
        if b > a:
            out.append((float(a), float(b)))
    return out
