"""`ferry kv-usage`: KV-cache usage over time of one or more `ferry run` results, as a PNG and a small table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.runner.outputs import figure_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "kv-usage",
        help="plot KV-cache usage over time of `ferry run` results",
        description="Plot the share of KV-cache blocks in use during each iteration, for one or more `ferry run` "
        "output folders (each with iterations.csv and summary.json), and print peak/mean usage and preemptions.",
    )
    p.add_argument("runs", type=Path, nargs="+", help="output folders of `ferry run --out DIR`")
    p.add_argument("--out", type=Path, default=Path("kv_usage.png"), help="PNG to write (kv_usage.png)")
    p.set_defaults(func=main)


SUMMARY_KEYS = ("kv_cache_blocks", "peak_kv_usage", "mean_kv_usage", "total_preemptions")
ITERATION_COLUMNS = ("start", "end", "kv_blocks_used")


def load_run(folder: Path) -> tuple[str, pd.DataFrame, dict]:
    """A run's label, iterations and summary; ValueError naming the file and what is wrong with it."""
    iterations, summary = folder / "iterations.csv", folder / "summary.json"
    for path in (iterations, summary):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found (is {folder} the --out folder of a `ferry run`?)")
    try:
        s = json.loads(summary.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{summary}: not a summary.json of `ferry run` ({exc})") from None
    try:
        policy = str(s["config"]["scheduler"]["policy"])
        numbers = {k: float(s[k]) for k in SUMMARY_KEYS}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{summary}: not a summary.json of `ferry run` (no usable {exc})") from None
    try:
        it = pd.read_csv(iterations)
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ValueError(f"{iterations}: not a readable CSV file ({exc})") from None
    missing = [c for c in ITERATION_COLUMNS if c not in it.columns]
    if missing:
        raise ValueError(f"{iterations}: missing column(s) {', '.join(missing)}; is it a `ferry run` iterations.csv?")
    for col in ITERATION_COLUMNS:
        values = pd.to_numeric(it[col], errors="coerce")
        if values.isna().any():
            row = int(values.isna().to_numpy().argmax())
            raise ValueError(f"{iterations}: row {row}: column {col!r} is {it[col].iloc[row]!r}, not a number")
        it[col] = values
    if numbers["kv_cache_blocks"] < 1:
        raise ValueError(f"{summary}: kv_cache_blocks is {numbers['kv_cache_blocks']:g}, expected >= 1")
    label = policy if folder.name == policy else f"{folder.name} ({policy})"
    return label, it, s | numbers


def main(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [load_run(folder) for folder in args.runs]  # every input checked before anything is drawn or printed
    fig, ax = plt.subplots(figsize=(9, 4.5))
    print(f"{'run':<40}{'peak':>8}{'mean':>8}{'preemptions':>13}")
    for label, it, s in runs:
        usage = it.kv_blocks_used.to_numpy() / max(s["kv_cache_blocks"], 1)
        # usage holds from each iteration's start to its end
        ax.plot(np.column_stack([it.start, it.end]).ravel(), np.repeat(usage, 2), label=label, linewidth=1.2)
        print(f"{label:<40}{s['peak_kv_usage']:>8.2f}{s['mean_kv_usage']:>8.2f}{int(s['total_preemptions']):>13,}")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV-cache blocks in use (share of capacity)")
    ax.set_ylim(0, 1.05)
    ax.set_title("KV-cache usage over time")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = figure_path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    print(f"wrote {out}")
    return 0
