"""Run a teaching scenario through each of its policies and keep what the figures are drawn from: the records as
frames (requests, iterations, batches) and the summary, per policy. Times here are milliseconds from the start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from experiments.runner.config import RunConfig
from experiments.runner.simulation import run_simulation
from experiments.teach.scenario import Scenario
from sim.metrics import batch_frame, request_frame
from sim.workload import Workload


@dataclass(frozen=True)
class PolicyRun:
    """One policy's run of a scenario, as the figures read it."""

    label: str  # the policy's label in the scenario (a key of ``labels.LABELS`` for the built-in ones)
    policy: str  # the policy's name
    seats: int  # seats the policy offers (max batch size, max_num_seqs; 1 without batching)
    requests: pd.DataFrame  # requests.csv's columns, times in ms (``*_ms``), indexed by request id
    iterations: pd.DataFrame  # iterations.csv's columns plus ``number`` (1-based) and ``start_ms``/``end_ms``
    batches: pd.DataFrame  # batches.csv's columns: who rode in each iteration
    summary: dict[str, Any]  # summary.json

    @property
    def end_ms(self) -> float:
        """When the last response reached its client (ms)."""
        return float(np.nanmax(self.requests["response_ms"])) if len(self.requests) else 0.0

    def admitted_in(self, request_id: str) -> int:
        """The iteration number (1-based, as the chapter counts) in which ``request_id`` first computed."""
        rows = self.batches[self.batches.request_id == request_id]
        return int(rows.iteration.min()) + 1

    def iterations_of(self, request_id: str, phase: str | None = None) -> list[int]:
        """Iteration numbers (1-based) in which ``request_id`` took part (``phase``: only those of that phase)."""
        rows = self.batches[self.batches.request_id == request_id]
        if phase is not None:
            rows = rows[rows.phase == phase]
        return [int(i) + 1 for i in rows.iteration]

    def gpu_idle_ms(self) -> float:
        """Milliseconds the GPU ran no iteration between the first arrival and the last iteration's end."""
        it = self.iterations
        if not len(it):
            return 0.0
        first = float(self.requests["arrival_ms"].min())
        gaps = it.start_ms.to_numpy()[1:] - it.end_ms.to_numpy()[:-1]
        return float(it.start_ms.iloc[0] - first + gaps.sum())

    def seat_ms(self) -> dict[str, float]:
        """Seat-milliseconds over the iterations: ``computing`` (seated and in the iteration), ``stalled`` (seated,
        not in it), ``held`` (done, seat kept for the batch), ``empty`` (seats offered, nobody in them)."""
        it = self.iterations
        dur = (it.end_ms - it.start_ms).to_numpy()
        members = self.batches.groupby("iteration").size().reindex(range(len(it)), fill_value=0).to_numpy()
        seated = it.seats.to_numpy()
        held = it.held.to_numpy()
        return {
            "computing": float((members * dur).sum()),
            "stalled": float(((seated - held - members) * dur).sum()),
            "held": float((held * dur).sum()),
            "empty": float(((self.seats - seated) * dur).sum()),
        }


def run_scenario(scenario: Scenario) -> list[PolicyRun]:
    """Each policy of ``scenario`` on the same requests, in the scenario's order."""
    workload = scenario.workload()
    return [_run(scenario, label, workload) for label in scenario.labels()]


def _run(scenario: Scenario, label: str, workload: Any) -> PolicyRun:
    return policy_run(scenario.run_config(label), workload, label)


def policy_run(config: RunConfig, workload: Workload, label: str) -> PolicyRun:
    """Simulate ``workload`` under ``config`` (which must record its batches) and keep it as the figures read it."""
    result = run_simulation(config, workload=workload)
    records = result.records
    requests = request_frame(records).set_index("request_id")
    for column in [c for c in requests.columns if c.endswith("_s")]:
        requests[column.removesuffix("_s") + "_ms"] = requests[column] * 1000.0
    iterations = records.iterations.to_frame()
    iterations.insert(0, "number", np.arange(1, len(iterations) + 1))
    iterations["start_ms"] = iterations.start * 1000.0
    iterations["end_ms"] = iterations.end * 1000.0
    seats = int(records.seats) if records.seats else 1
    return PolicyRun(label, config.scheduler.policy, seats, requests, iterations, batch_frame(records), result.summary)
