"""Timelines: one row per request, each iteration a box coloured by what the request did in it (prefill, prefill
chunk, decode), the queue before it, the iterations it sat out, the seat it held after finishing; arrivals and first
tokens marked, iterations numbered on top, the GPU's busy and idle stretches beneath. One figure per policy, and one
with every policy of a scenario stacked on the same time axis."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from experiments.teach import style
from experiments.teach.labels import text
from experiments.teach.runs import PolicyRun
from experiments.teach.scenario import Scenario
from experiments.teach.spans import gpu_idle_spans, request_spans

KINDS = ("waiting", "prefill", "prefill_chunk", "decode", "stalled", "held")
BOX = 0.7  # box height, in rows
NUMBER_MIN_IN = 0.16  # an iteration narrower than this (inches) gets no number unless it is a multiple of 5
TOKENS_MIN_IN = 0.42  # a prefill box narrower than this gets no token count


def policy_name(label: str, lang: str) -> str:
    """A policy label in words (a scenario's own label is shown as it is)."""
    try:
        return text(label, lang)
    except KeyError:
        return label


def draw_rows(ax: Axes, run: PolicyRun, lang: str, xmax: float, width_in: float) -> None:
    """Draw ``run``'s timeline into ``ax``: rows top to bottom in arrival order, then the GPU row."""
    spans = request_spans(run)
    ids = [str(i) for i in run.requests.index]
    row = {rid: k for k, rid in enumerate(ids)}
    gpu = len(ids) + 0.4
    for kind in KINDS:
        part = spans[spans.kind == kind]
        if not len(part):
            continue
        ys = [row[r] for r in part.request_id]
        hatch = "//" if kind == "stalled" else None
        ax.barh(ys, part.end_ms - part.start_ms, left=part.start_ms, height=BOX if kind != "waiting" else BOX * 0.5,
                color=style.COLORS[kind], edgecolor=style.EDGE if kind != "waiting" else "none", linewidth=0.6,
                hatch=hatch)  # fmt: skip
    ms_per_in = xmax / width_in
    boxes = spans[spans.kind.isin(("prefill", "prefill_chunk"))]
    for _, s in boxes.iterrows():
        if (s.end_ms - s.start_ms) / ms_per_in >= TOKENS_MIN_IN:
            color = "white" if s.kind == "prefill" else "black"
            ax.text((s.start_ms + s.end_ms) / 2, row[s.request_id], f"{s.tokens}", ha="center", va="center",
                    fontsize=9, color=color)  # fmt: skip
    req = run.requests
    ys = [row[str(r)] for r in req.index]
    ax.scatter(req.arrival_ms, [y - BOX / 2 - 0.05 for y in ys], marker="v", s=60, color="black", zorder=5,
               clip_on=False)  # fmt: skip
    ax.scatter(req.first_token_ms, ys, marker="*", s=110, color="white", edgecolor="black", linewidth=0.8, zorder=6)
    it = run.iterations
    ax.barh([gpu] * len(it), it.end_ms - it.start_ms, left=it.start_ms, height=0.5, color="#555555",
            edgecolor="white", linewidth=0.6)  # fmt: skip
    for a, b in gpu_idle_spans(run):
        ax.barh([gpu], [b - a], left=[a], height=0.5, color=style.COLORS["idle"], alpha=0.85)
    for number, start, end in zip(it.number.to_numpy(), it.start_ms.to_numpy(), it.end_ms.to_numpy(), strict=True):
        wide = (end - start) / ms_per_in >= NUMBER_MIN_IN
        if wide or number % 5 == 0 or number == 1:
            ax.text((start + end) / 2, -0.62, str(int(number)), ha="center", va="bottom", fontsize=8.5,
                    color="#333333")  # fmt: skip
        ax.axvline(start, color="#BBBBBB", linewidth=0.4, zorder=0)
    ax.text(0, -0.62, text("iteration", lang) + " ", transform=ax.get_yaxis_transform(), ha="right", va="bottom",
            fontsize=8.5, color="#333333")  # fmt: skip
    ax.set_yticks([*range(len(ids)), gpu], [*(f"{text('request', lang)} {r}" for r in ids), "GPU"])
    ax.set_ylim(gpu + 0.6, -1.0)
    ax.set_xlim(0, xmax)
    ax.spines[["top", "right"]].set_visible(False)


def shown(runs: list[PolicyRun]) -> set[str]:
    """The kinds of span the runs' drawings contain (and ``idle`` when the GPU idles): what their legend lists."""
    kinds: set[str] = set()
    for run in runs:
        kinds |= set(request_spans(run).kind)
        if gpu_idle_spans(run):
            kinds.add("idle")
    return kinds


def legend_items(lang: str, kinds: set[str]) -> list[Patch | Line2D]:
    """Legend entries for the ``kinds`` drawn (a legend that lists only what the figure shows), then the markers."""
    items: list[Patch | Line2D] = [
        Patch(
            facecolor=style.COLORS[k], edgecolor=style.EDGE, hatch="//" if k == "stalled" else None, label=text(k, lang)
        )  # fmt: skip
        for k in KINDS
        if k in kinds
    ]
    if "idle" in kinds:
        items.append(Patch(facecolor=style.COLORS["idle"], label=text("gpu_idle", lang)))
    items.append(Line2D([], [], marker="v", color="black", linestyle="none", label=text("arrival", lang)))
    items.append(Line2D([], [], marker="*", markersize=11, markerfacecolor="white", markeredgecolor="black",
                        linestyle="none", label=text("first_token", lang)))  # fmt: skip
    return items


def shared_xmax(runs: list[PolicyRun]) -> float:
    """One time axis for every policy of a scenario: a little past the last response of the slowest."""
    return max(r.end_ms for r in runs) * 1.02


def draw_policy(scenario: Scenario, run: PolicyRun, lang: str, xmax: float, out: Path) -> list[Path]:
    """``{scenario}-timeline-{label}``: one policy's timeline on the scenario's shared axis."""
    n = len(run.requests)
    width = style.SLIDE[0]
    fig, ax = plt.subplots(figsize=(width, max(3.6, 1.7 + 0.55 * (n + 1))), layout="constrained")
    draw_rows(ax, run, lang, xmax, width * 0.85)
    ax.set_xlabel(text("time_ms", lang))
    ax.set_title(f"{policy_name(run.label, lang)} — {scenario.title.get(lang)}", loc="left")
    fig.legend(handles=legend_items(lang, shown([run])), loc="outside lower center", ncol=5, frameon=False)
    return style.save(fig, out, f"{scenario.name}-timeline-{run.label}")


def draw_comparison(scenario: Scenario, runs: list[PolicyRun], lang: str, xmax: float, out: Path) -> list[Path]:
    """``{scenario}-timelines``: every policy stacked, one time axis."""
    n = len(runs[0].requests)
    heights = [n + 1.6] * len(runs)
    width = style.SLIDE[0]
    fig, axes = plt.subplots(len(runs), 1, figsize=(width, 1.4 + 0.36 * sum(heights)), sharex=True,
                             gridspec_kw={"height_ratios": heights}, layout="constrained", squeeze=False)  # fmt: skip
    for ax, run in zip(axes[:, 0], runs, strict=True):
        draw_rows(ax, run, lang, xmax, width * 0.85)
        ax.set_title(policy_name(run.label, lang), loc="left", fontsize=13)
    axes[-1, 0].set_xlabel(text("time_ms", lang))
    fig.suptitle(f"{scenario.title.get(lang)} ({text('same_axis', lang)})")
    fig.legend(handles=legend_items(lang, shown(runs)), loc="outside lower center", ncol=5, frameon=False)
    return style.save(fig, out, f"{scenario.name}-timelines")


def draw_timelines(scenario: Scenario, runs: list[PolicyRun], lang: str, out: Path) -> list[Path]:
    """Every timeline figure of a scenario: one per policy, then the stacked comparison."""
    xmax = shared_xmax(runs)
    paths: list[Path] = []
    with style.language(lang):
        for run in runs:
            paths += draw_policy(scenario, run, lang, xmax, out)
        paths += draw_comparison(scenario, runs, lang, xmax, out)
    return paths
