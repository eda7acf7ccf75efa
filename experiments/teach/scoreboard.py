"""The scoreboard: each policy's TTFT, ITL and end-to-end latency (means over the scenario's requests, as the
client sees them; ITL between tokens as they are made, since static and dynamic batching return whole responses
and give the client no gaps), output throughput, GPU idle time and last response, as a table figure; the best of
each column in bold. Every number comes from the run's summary (``summary.json``) or its iteration records."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from experiments.teach import style
from experiments.teach.labels import text
from experiments.teach.runs import PolicyRun
from experiments.teach.scenario import Scenario
from experiments.teach.timeline import policy_name

# column: (how it is read, whether lower is better)
COLUMNS = {
    "ttft": (lambda r: r.summary["mean_ttft_ms"], True),
    "itl": (lambda r: r.summary["mean_server_itl_ms"], True),
    "e2el": (lambda r: r.summary["mean_e2el_ms"], True),
    "throughput": (lambda r: r.summary["output_throughput"], False),
    "idle": (lambda r: r.gpu_idle_ms(), True),
    "makespan": (lambda r: r.end_ms, True),
}


def score_table(runs: list[PolicyRun]) -> pd.DataFrame:
    """One row per policy label, the scoreboard's columns (ms, or output tokens per second)."""
    return pd.DataFrame(
        {key: [float(read(r)) if read(r) is not None else float("nan") for r in runs] for key, (read, _) in
         COLUMNS.items()},
        index=[r.label for r in runs],
    )  # fmt: skip


def header(words: str) -> str:
    """A column header on two lines, the unit on the second: narrow columns that fit a slide."""
    head, sep, unit = words.rpartition(" (")
    return f"{head}\n({unit}" if sep else words


def draw_scoreboard(scenario: Scenario, runs: list[PolicyRun], lang: str, out: Path) -> list[Path]:
    """``{scenario}-scoreboard``: the table as a figure."""
    table = score_table(runs)
    with style.language(lang):
        fig, ax = plt.subplots(figsize=(style.SLIDE[0], 0.8 + 0.5 * (len(runs) + 1)))
        ax.axis("off")
        cells = [[f"{v:,.0f}" if key == "throughput" else f"{v:,.1f}" for key, v in row.items()]
                 for _, row in table.iterrows()]  # fmt: skip
        grid = ax.table(
            cellText=cells,
            rowLabels=[policy_name(label, lang) for label in table.index],
            colLabels=[header(text(key, lang)) for key in table.columns],
            loc="center",
            cellLoc="center",
        )
        grid.auto_set_font_size(False)
        grid.set_fontsize(13)
        grid.scale(1.0, 2.0)
        for j in range(len(table.columns)):
            grid[0, j].set_height(grid[0, j].get_height() * 1.6)  # two-line headers
        for j, key in enumerate(table.columns):
            lower = COLUMNS[key][1]
            column = table[key]
            best = column.min() if lower else column.max()
            for i, value in enumerate(column):
                if value == best:
                    grid[i + 1, j].set_text_props(fontweight="bold")
                    grid[i + 1, j].set_facecolor("#E8F4EA")
        fig.suptitle(f"{text('scoreboard', lang)}: {scenario.title.get(lang)}", x=0.02, ha="left")
        if any(not r.summary["stream"] for r in runs):
            ax.text(0, 0, text("whole_note", lang), transform=ax.transAxes, fontsize=10, color="#444444")
        return style.save(fig, out, f"{scenario.name}-scoreboard")
