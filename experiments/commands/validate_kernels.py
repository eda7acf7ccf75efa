"""`ferry validate-kernels`: how far ferry's per-operator predictions are from measured GPU kernel times.

    ferry validate-kernels --data ../shared/data/vidur-profiling [--model Llama-2-7b] [--json]

Reads Vidur's published operator profiles (per-layer linear operators, norms, RoPE and embedding for several models on
A100 80GB and H100 SXM; attention on A100), predicts each with ferry's roofline for the same shape (one layer, fp16,
the measured tensor parallelism, no host overhead), and prints per (model, hardware, operator) the median and 90th
percentile of |predicted / measured - 1| and the median signed error (> 0: ferry too slow). With a datasheet profile
these figures are what the calibration issue must bring down.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pandas as pd

from costmodel.calibration.vidur import errors, load_vidur, predict


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "validate-kernels",
        help="compare per-operator predictions with measured kernel times (Vidur's profiles)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", type=Path, required=True, help="Vidur profiling directory (holds compute/)")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help="only models whose name contains this (case-insensitive; repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.set_defaults(func=handle)


def run(data: Path, models: list[str]) -> tuple[pd.DataFrame, list[str]]:
    df, skipped = load_vidur(data)
    if models:
        wanted = df["model"].str.lower().apply(lambda m: any(s.lower() in m for s in models))
        df = df[wanted].reset_index(drop=True)
        if df.empty:
            raise ValueError(f"no measurements for models matching {', '.join(models)} under {data}")
    return errors(predict(df)), skipped


def handle(args: argparse.Namespace) -> int:
    table, skipped = run(args.data, args.model)
    if args.json:
        print(
            json.dumps(
                {
                    "data": str(args.data),
                    "source": "microsoft/vidur profiling data (MLSys 2024), fp16, ms per layer",
                    "results": table.to_dict(orient="records"),
                    "skipped": skipped,
                }
            )
        )
        return 0
    print(f"ferry vs measured kernel times in {args.data} (Vidur profiles; one layer, fp16, no host overhead)")
    print(f"{'model':<42} {'hardware':<9} {'op':<18} {'n':>5} {'median |err|':>12} {'p90 |err|':>10} {'bias':>7}")
    for row in table.itertuples(index=False):
        print(
            f"{row.model:<42} {row.hardware:<9} {row.op:<18} {row.n:>5} {row.median_abs_rel_error:>12.1%} "
            f"{row.p90_abs_rel_error:>10.1%} {row.median_rel_error:>+7.1%}"
        )
    if skipped:
        print(f"skipped {len(skipped)} file(s): " + "; ".join(skipped))
    return 0
