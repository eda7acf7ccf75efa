"""Everything `ferry teach` makes, in the order of the chapter's argument: why batching helps (6-1, 6-2), the
limits of an iteration (6-5), then each scenario's timelines, ferry view, scoreboard and boats; plus each run's
records (the CSVs the figures are drawn from) and ``teach.json``, the index of files and the numbers to point at."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.runner import outputs
from experiments.teach.animate import draw_boats
from experiments.teach.batching import draw_why_batching
from experiments.teach.limits import draw_limits
from experiments.teach.runs import PolicyRun, run_scenario
from experiments.teach.scenario import Scenario
from experiments.teach.scoreboard import draw_scoreboard
from experiments.teach.seats import draw_ferry
from experiments.teach.settings import FigureSettings
from experiments.teach.timeline import draw_timelines

INDEX = "teach.json"
RECORDS = "records"


def earlier_files(out: Path) -> tuple[str, ...]:
    """The figures an earlier `ferry teach` listed in ``out/teach.json`` (replaced, so none is left stale)."""
    try:
        files = json.loads((out / INDEX).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return ()
    return tuple(f for f in files if isinstance(f, str) and "/" not in f and not f.startswith("."))


def scenario_facts(scenario: Scenario, runs: list[PolicyRun]) -> dict[str, Any]:
    """The numbers a teacher points at, per policy: the iteration that first ran each request, GPU idle and
    seat-time, when the last response arrived, and the scoreboard's means."""
    facts: dict[str, Any] = {"figures": list(scenario.figures), "title": scenario.title.en, "policies": {}}
    for run in runs:
        s = run.summary
        facts["policies"][run.label] = {
            "policy": run.policy,
            "seats": run.seats,
            "first_iteration": {str(r): run.admitted_in(str(r)) for r in run.requests.index},
            "iterations": len(run.iterations),
            "gpu_idle_ms": run.gpu_idle_ms(),
            "seat_ms": run.seat_ms(),
            "last_response_ms": run.end_ms,
            "mean_ttft_ms": s["mean_ttft_ms"],
            "mean_server_itl_ms": s["mean_server_itl_ms"],
            "mean_e2el_ms": s["mean_e2el_ms"],
            "output_throughput": s["output_throughput"],
        }
    return facts


def write_records(runs: list[PolicyRun], folder: Path) -> list[Path]:
    """Each policy's records as `ferry run` writes them (times in seconds), under ``folder/<label>/``."""
    paths = []
    for run in runs:
        where = folder / run.label
        where.mkdir(parents=True, exist_ok=True)
        requests = run.requests[[c for c in run.requests.columns if not c.endswith("_ms")]].reset_index()
        iterations = run.iterations[[c for c in run.iterations.columns if not c.endswith("_ms") and c != "number"]]
        paths.append(outputs.write_frame(where / "requests.csv", requests))
        paths.append(outputs.write_frame(where / "iterations.csv", iterations))
        paths.append(outputs.write_frame(where / "batches.csv", run.batches))
    return paths


def make_book(
    scenarios: list[Scenario],
    out: Path,
    lang: str,
    settings: FigureSettings,
    force: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Write every figure into ``out``; returns the index (also written as ``teach.json``). ``settings`` are those of
    the why-batching and limits figures (each scenario names its own model and hardware)."""
    outputs.prepare(out, (INDEX, RECORDS, *earlier_files(out)), "teach", force)
    index: dict[str, Any] = {"lang": lang, "figures": settings.model_dump(mode="json"), "files": [], "scenarios": {}}
    files: list[Path] = []
    why, limits = settings.why_batching, settings.limits
    say("why batching helps (6-1, 6-2)")
    files += draw_why_batching(why.model, why.hardware, lang, out, batches=why.batches, prompt_tokens=why.prompt_tokens,
                               context_tokens=why.context_tokens, tp=why.tensor_parallel_size)  # fmt: skip
    say("the limits of an iteration (6-5)")
    files += draw_limits(lang, out, limits.max_num_seqs, limits.max_num_batched_tokens, limits.max_model_len,
                         limits.requests)  # fmt: skip
    for scenario in scenarios:
        say(f"scenario {scenario.name} ({', '.join(scenario.figures) or 'the ferry'})")
        runs = run_scenario(scenario)
        files += draw_timelines(scenario, runs, lang, out)
        files += draw_ferry(scenario, runs, lang, out)
        files += draw_scoreboard(scenario, runs, lang, out)
        files += draw_boats(scenario, runs, lang, out)
        files += write_records(runs, out / RECORDS / scenario.name)
        index["scenarios"][scenario.name] = scenario_facts(scenario, runs)
    index["files"] = [str(p.relative_to(out)) for p in files]
    outputs.write_text(out / INDEX, json.dumps(index, indent=2, ensure_ascii=False) + "\n")
    return index
