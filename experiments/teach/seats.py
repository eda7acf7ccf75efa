"""The ferry view: each policy's seats over time (who sits in which seat, computing, sitting an iteration out, or
finished and still holding the seat; empty seats outlined), with the dock queue beneath, and the GPU's idle time and
the empty and held seat-time written on it. Every policy of a scenario is stacked on one time axis."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Patch, Rectangle

from experiments.teach import style
from experiments.teach.labels import text
from experiments.teach.runs import PolicyRun
from experiments.teach.scenario import Scenario
from experiments.teach.spans import dock_queue, gpu_idle_spans, request_spans, seat_assignment
from experiments.teach.timeline import policy_name, shared_xmax, shown

SEAT_KINDS = ("prefill", "prefill_chunk", "decode", "stalled", "held")
BOX = 0.8


def empty_seats(run: PolicyRun, seat_of: dict[str, int]) -> list[tuple[int, float, float]]:
    """(seat, start ms, end ms) of every seat nobody held during an iteration."""
    it = run.iterations
    first = run.batches.groupby("request_id", sort=False).iteration.min()
    board = {rid: float(it.start_ms.iloc[i]) for rid, i in first.items()}
    leave = {str(r): float(v) for r, v in run.requests.released_ms.items()}
    out = []
    for start, end in zip(it.start_ms.to_numpy(), it.end_ms.to_numpy(), strict=True):
        taken = {seat_of[r] for r in seat_of if board[r] <= start and leave[r] >= end}
        out += [(s, float(start), float(end)) for s in range(run.seats) if s not in taken]
    return out


def draw_seats(ax: Axes, run: PolicyRun, lang: str, xmax: float) -> None:
    """Seats as rows (seat 1 on top), one box per iteration a passenger spent in the seat."""
    seat_of = seat_assignment(run)
    spans = request_spans(run)
    spans = spans[spans.kind.isin(SEAT_KINDS)]
    for kind in SEAT_KINDS:
        part = spans[spans.kind == kind]
        if len(part):
            ax.barh([seat_of[r] for r in part.request_id], part.end_ms - part.start_ms, left=part.start_ms,
                    height=BOX, color=style.COLORS[kind], edgecolor=style.EDGE, linewidth=0.6,
                    hatch="//" if kind == "stalled" else None)  # fmt: skip
    for seat, a, b in empty_seats(run, seat_of):
        ax.add_patch(Rectangle((a, seat - BOX / 2), b - a, BOX, facecolor="white", edgecolor="#999999",
                               linestyle="--", linewidth=0.8))  # fmt: skip
    first = spans.groupby("request_id", sort=False).start_ms.min()
    for rid, t in first.items():
        ax.text(t + xmax * 0.004, seat_of[str(rid)], str(rid), ha="left", va="center", fontsize=11,
                fontweight="bold", color="white",
                bbox={"boxstyle": "circle,pad=0.2", "facecolor": "#222222", "edgecolor": "none"})  # fmt: skip
    for a, b in gpu_idle_spans(run):
        ax.axvspan(a, b, color=style.COLORS["idle"], alpha=0.12, linewidth=0)
    use = run.seat_ms()
    note = " · ".join(
        [
            text("idle_s", lang, ms=run.gpu_idle_ms()),
            text("empty_s", lang, ms=use["empty"]),
            text("held_s", lang, ms=use["held"]),
        ]
    )
    ax.text(1.0, 1.02, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=11, color="#222222")
    ax.set_yticks(range(run.seats), [f"{text('seat', lang)} {s + 1}" for s in range(run.seats)])
    ax.set_ylim(run.seats - 0.4, -0.6)
    ax.set_xlim(0, xmax)
    ax.spines[["top", "right"]].set_visible(False)


def draw_dock(ax: Axes, run: PolicyRun, lang: str, xmax: float, top: float) -> None:
    """The dock queue: how many have arrived and not yet boarded."""
    times, count = dock_queue(run)
    ax.fill_between(np.append(times, xmax), np.append(count, count[-1]), step="post", color=style.COLORS["waiting"],
                    edgecolor="#666666", linewidth=0.8)  # fmt: skip
    for a, b in gpu_idle_spans(run):
        ax.axvspan(a, b, color=style.COLORS["idle"], alpha=0.12, linewidth=0)
    ax.set_ylim(0, max(top, 1) + 0.3)
    ax.set_yticks([0, int(max(top, 1))])
    ax.set_ylabel(text("dock", lang), rotation=0, ha="right", va="center", fontsize=11)
    ax.set_xlim(0, xmax)
    ax.spines[["top", "right"]].set_visible(False)


def draw_ferry(scenario: Scenario, runs: list[PolicyRun], lang: str, out: Path) -> list[Path]:
    """``{scenario}-ferry``: seats and dock per policy, stacked on one time axis."""
    xmax = shared_xmax(runs)
    top = max(float(dock_queue(r)[1].max()) for r in runs)
    with style.language(lang):
        ratios: list[float] = []
        for r in runs:
            ratios += [r.seats + 0.6, 1.3]
        fig, axes = plt.subplots(len(ratios), 1, figsize=(style.SLIDE[0], 1.6 + 0.42 * sum(ratios)), sharex=True,
                                 gridspec_kw={"height_ratios": ratios}, layout="constrained")  # fmt: skip
        axes = np.atleast_1d(axes)
        for k, run in enumerate(runs):
            seats_ax, dock_ax = axes[2 * k], axes[2 * k + 1]
            draw_seats(seats_ax, run, lang, xmax)
            seats_ax.set_title(policy_name(run.label, lang), loc="left", fontsize=13)
            draw_dock(dock_ax, run, lang, xmax, top)
        axes[-1].set_xlabel(text("time_ms", lang))
        fig.suptitle(f"{scenario.title.get(lang)} — {text('seats', lang)} / {text('dock', lang)}")
        kinds = shown(runs)  # the legend lists only what the figure shows
        handles = [
            Patch(
                facecolor=style.COLORS[k],
                edgecolor=style.EDGE,
                hatch="//" if k == "stalled" else None,
                label=text(k, lang),
            )  # fmt: skip
            for k in SEAT_KINDS
            if k in kinds
        ]
        handles += [
            Patch(facecolor="white", edgecolor="#999999", linestyle="--", label=text("empty", lang)),
            Patch(facecolor=style.COLORS["waiting"], edgecolor="#666666", label=text("dock", lang)),
        ]
        if "idle" in kinds:
            handles.append(Patch(facecolor=style.COLORS["idle"], alpha=0.3, label=text("gpu_idle", lang)))
        fig.legend(handles=handles, loc="outside lower center", ncol=4, frameon=False)
        return style.save(fig, out, f"{scenario.name}-ferry")
