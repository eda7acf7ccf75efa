"""The boats, animated: two policies side by side on the same arrivals (dynamic against continuous batching in the
built-in ``dock`` scenario), one frame per iteration start of either. Each frame shows the dock queue, the boat's
seats (who sits where, and what they are doing), and who has reached home (their whole response delivered)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.animation import PillowWriter
from matplotlib.axes import Axes
from matplotlib.patches import Circle, FancyBboxPatch, Rectangle

from experiments.teach import style
from experiments.teach.labels import text
from experiments.teach.runs import PolicyRun
from experiments.teach.scenario import Scenario
from experiments.teach.spans import request_spans, seat_assignment
from experiments.teach.timeline import policy_name

FPS = 2
DOCK_X, BOAT_X, HOME_X = 0.0, 4.2, 9.2  # layout of one panel, in its own units


def frame_times(runs: list[PolicyRun]) -> list[float]:
    """Frame clock (ms): every iteration start of the runs, then the last response."""
    starts = np.unique(np.concatenate([r.iterations.start_ms.to_numpy() for r in runs]))
    return [*starts.tolist(), max(r.end_ms for r in runs)]


@dataclass(frozen=True)
class Frame:
    """Where everyone is at one moment."""

    dock: list[str]  # arrived, not yet boarded, in arrival order
    seats: dict[int, tuple[str, str]]  # seat -> (request, what it does: a span kind)
    home: list[str]  # whole response delivered
    iteration: int | None  # the iteration running (1-based), None while the GPU idles


def state_at(run: PolicyRun, t: float, spans: pd.DataFrame | None = None) -> Frame:
    """Who is where at ``t`` (ms): the dock (arrived, not boarded), each seat's passenger and what they do, home.
    ``spans``: ``request_spans(run)``, if already at hand."""
    spans = request_spans(run) if spans is None else spans
    now = spans[(spans.start_ms <= t) & (spans.end_ms > t)]
    seat_of = seat_assignment(run)
    seats: dict[int, tuple[str, str]] = {}
    dock: list[str] = []
    for rid, kind in zip(now.request_id, now.kind, strict=True):
        if kind == "waiting":
            dock.append(rid)
        else:
            seats[seat_of[rid]] = (rid, kind)
    req = run.requests
    home = [str(r) for r, v in req.response_ms.items() if v <= t]
    running = run.iterations[(run.iterations.start_ms <= t) & (run.iterations.end_ms > t)]
    iteration = int(running.number.iloc[0]) if len(running) else None
    return Frame(dock, seats, home, iteration)


def draw_panel(ax: Axes, run: PolicyRun, t: float, lang: str, spans: pd.DataFrame) -> None:
    ax.clear()
    ax.set_xlim(-0.6, 12.2)
    ax.set_ylim(-1.2, run.seats + 1.9)
    ax.set_aspect("equal")
    ax.axis("off")
    state = state_at(run, t, spans)
    it = state.iteration
    status = f"{text('iteration', lang)} {it}" if it is not None else text("gpu_idle", lang)
    ax.text(0.0, 1.02, f"{policy_name(run.label, lang)} — {status}", transform=ax.transAxes, fontsize=14)
    ax.add_patch(Rectangle((DOCK_X - 0.4, -0.9), 3.4, run.seats + 1.8, facecolor="#EFE6D8", edgecolor="none"))
    ax.text(DOCK_X + 1.3, run.seats + 1.1, text("dock", lang), ha="center", fontsize=12)
    for k, rid in enumerate(state.dock):
        x, y = DOCK_X + 0.3 + (k % 3) * 1.0, run.seats - 0.3 - (k // 3) * 1.0
        ax.add_patch(Circle((x, y), 0.36, facecolor=style.COLORS["waiting"], edgecolor=style.EDGE))
        ax.text(x, y, rid, ha="center", va="center", fontsize=12, fontweight="bold")
    sailing = it is not None
    hull_color = "#5B7DB1" if sailing else "#9AA5B1"
    ax.add_patch(FancyBboxPatch((BOAT_X - 0.3, -0.6), 3.6, run.seats + 0.9, boxstyle="round,pad=0.1,rounding_size=0.5",
                                facecolor=hull_color, edgecolor="#2F3E55", linewidth=1.5))  # fmt: skip
    seats = state.seats
    for s in range(run.seats):
        y = run.seats - 1 - s
        rid, kind = seats.get(s, ("", "empty"))
        seat = Rectangle((BOAT_X + 0.2, y - 0.1), 2.6, 0.8, facecolor=style.COLORS[kind], edgecolor=style.EDGE,
                         hatch="//" if kind == "stalled" else None, linestyle="--" if not rid else "-")  # fmt: skip
        ax.add_patch(seat)
        label = f"{rid}: {text('seat_' + kind, lang)}" if rid else text("empty", lang)
        ax.text(BOAT_X + 1.5, y + 0.3, label, ha="center", va="center", fontsize=12,
                color="white" if kind == "prefill" else "black",
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1} if kind == "stalled" else None)  # fmt: skip
    ax.add_patch(Rectangle((HOME_X - 0.4, -0.9), 3.4, run.seats + 1.8, facecolor="#E3EFE0", edgecolor="none"))
    ax.text(HOME_X + 1.3, run.seats + 1.1, text("home", lang), ha="center", fontsize=12)
    for k, rid in enumerate(state.home):
        x, y = HOME_X + 0.3 + (k % 3) * 1.0, run.seats - 0.3 - (k // 3) * 1.0
        ax.add_patch(Circle((x, y), 0.36, facecolor="#B7D7A8", edgecolor=style.EDGE))
        ax.text(x, y, rid, ha="center", va="center", fontsize=12, fontweight="bold")


def draw_boats(scenario: Scenario, runs: list[PolicyRun], lang: str, out: Path) -> list[Path]:
    """``{scenario}-boats.gif``: the two animated policies' boats, one frame per iteration start."""
    if scenario.animate is None:
        return []
    pair = [next(r for r in runs if r.label == label) for label in scenario.animate]
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{scenario.name}-boats.gif"
    with style.language(lang):
        fig, axes = plt.subplots(1, 2, figsize=(14, 4.2), dpi=90)
        fig.subplots_adjust(left=0.01, right=0.99, top=0.84, bottom=0.02, wspace=0.06)  # fixed: no layout per frame
        writer = PillowWriter(fps=FPS)
        spans = [request_spans(run) for run in pair]
        with writer.saving(fig, str(path), dpi=90):
            for t in frame_times(pair):
                for ax, run, sp in zip(axes, pair, spans, strict=True):
                    draw_panel(ax, run, t, lang, sp)
                fig.suptitle(text("frame_time", lang, ms=t), fontsize=15)
                writer.grab_frame()
        plt.close(fig)
    return [path]
