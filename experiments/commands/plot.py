"""`ferry plot`: figures of a `ferry sweep`'s results.parquet (Pareto front, heatmap, capacity, latency against rate),
each as PNG and SVG."""

from __future__ import annotations

import argparse
from pathlib import Path

KINDS = ("pareto", "heatmap", "capacity", "latency")
# the flags each kind reads; any other plotting flag given is an error rather than silently ignored
FLAGS = {
    "pareto": ("x", "y", "color"),
    "heatmap": ("metric", "axes"),
    "capacity": ("by",),
    "latency": ("latency", "by"),
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="plot a `ferry sweep`'s results (Pareto front, heatmap, capacity, latency against rate)",
        description="Draw the ok runs of a `ferry sweep` output folder (its results.parquet) as PNG and SVG: "
        "pareto (throughput against a latency percentile, the Pareto front outlined), heatmap (a metric over two "
        "swept columns), capacity (max_rate per configuration; needs a sweep with `mode: max_rate`) or latency "
        "(a latency against request_rate, one line per configuration). Runs that were overloaded (arrivals outran "
        "the replica) are marked in each and never on the Pareto front. Prints the paths written.",
    )
    p.add_argument("dir", type=Path, metavar="DIR", help="output folder of `ferry sweep` (or its results.parquet)")
    p.add_argument("--kind", choices=KINDS, required=True, help="which figure")
    p.add_argument("--x", default=None, help="pareto: latency column (p99_tpot_ms)")
    p.add_argument("--y", default=None, help="pareto: throughput column (output_throughput)")
    p.add_argument("--color", default=None, help="pareto: column to colour by (the first swept column that varies)")
    p.add_argument("--metric", default=None, help="heatmap: the metric in the cells (output_throughput)")
    p.add_argument("--axes", nargs=2, default=None, metavar=("A", "B"),
                   help="heatmap: columns on the x and y axes (the first two swept columns that vary)")  # fmt: skip
    p.add_argument("--by", nargs="*", default=None, metavar="COL",
                   help="capacity, latency: columns that make a configuration (the swept columns but seed and "
                   "request_rate; an empty --by puts every run in one group)")  # fmt: skip
    p.add_argument("--latency", default=None, help="latency: the latency column (p99_ttft_ms)")
    p.add_argument("--out", type=Path, default=None, help="path of the figures without suffix (DIR/plot-KIND)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from experiments.sweep import overload
    from experiments.sweep import plots as sweep_plots

    stray = [f for f in ("x", "y", "color", "metric", "axes", "by", "latency") if getattr(args, f, None) is not None]
    stray = [f for f in stray if f not in FLAGS[args.kind]]
    if stray:
        used = ", ".join(f"--{f}" for f in FLAGS[args.kind])
        raise ValueError(f"--kind {args.kind} does not use {', '.join('--' + f for f in stray)} (it reads {used})")
    table = sweep_plots.load_results(args.dir)
    folder = args.dir if args.dir.is_dir() else args.dir.parent
    out = args.out if args.out is not None else folder / f"plot-{args.kind}"
    if args.kind == "pareto":
        x, y = args.x or "p99_tpot_ms", args.y or "output_throughput"
        paths = sweep_plots.pareto(table, x, y, args.color, out)
        front = sweep_plots.pareto_front(table, x, y)
        shown = [c for c in sweep_plots.swept_columns(table) if c in front.columns] + [x, y]
        hot = int(overload.mask(sweep_plots.ok_rows(table, (x, y))).sum())
        left_out = f"; {hot} overloaded runs left out, crossed out in the figure" if hot else ""
        print(f"Pareto front ({len(front)} runs{left_out}):")
        print(front[list(dict.fromkeys(shown))].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    elif args.kind == "heatmap":
        a, b = args.axes or (None, None)
        paths = sweep_plots.heatmap(table, args.metric or "output_throughput", a, b, out)
    elif args.kind == "capacity":
        paths = sweep_plots.capacity(table, args.by, out)
        stats = sweep_plots.capacity_table(table, args.by)
        shown = stats[["configuration", "mean", "min", "max", "count"]].rename(columns={"mean": "max_rate"})
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    else:
        paths = sweep_plots.latency_rate(table, args.latency or "p99_ttft_ms", args.by, out)
    for path in paths:
        print(f"wrote {path}")
    return 0
