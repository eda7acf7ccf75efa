"""`ferry kv-usage`: KV-cache usage over time of one or more `ferry run` results, as a PNG and a small table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd


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


def load_run(folder: Path) -> tuple[str, pd.DataFrame, dict]:
    iterations, summary = folder / "iterations.csv", folder / "summary.json"
    for path in (iterations, summary):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: not found (is {folder} the --out folder of a `ferry run`?)")
    s = json.loads(summary.read_text())
    policy = s["config"]["scheduler"]["policy"]
    label = policy if folder.name == policy else f"{folder.name} ({policy})"
    return label, pd.read_csv(iterations), s


def main(args: argparse.Namespace) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    print(f"{'run':<40}{'peak':>8}{'mean':>8}{'preemptions':>13}")
    for folder in args.runs:
        label, it, s = load_run(folder)
        usage = it.kv_blocks_used.to_numpy() / max(s["kv_cache_blocks"], 1)
        # usage holds from each iteration's start to its end
        ax.plot(np.column_stack([it.start, it.end]).ravel(), np.repeat(usage, 2), label=label, linewidth=1.2)
        print(f"{label:<40}{s['peak_kv_usage']:>8.2f}{s['mean_kv_usage']:>8.2f}{s['total_preemptions']:>13,}")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("KV-cache blocks in use (share of capacity)")
    ax.set_ylim(0, 1.05)
    ax.set_title("KV-cache usage over time")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    plt.close(fig)
    print(f"wrote {args.out}")
    return 0
