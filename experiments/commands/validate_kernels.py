"""`ferry validate-kernels`: how far ferry's per-operator predictions are from measured GPU kernel times.

    ferry validate-kernels --data ../shared/data/vidur-profiling [--model Llama-2-7b] [--json]
    ferry validate-kernels --aiconfigurator h100_sxm [--framework vllm] [--version V] [--hardware PROFILE] [--json]

``--data`` reads Vidur's published operator profiles (per-layer linear operators, norms, RoPE and embedding for
several models on A100 80GB and H100 SXM; attention on A100), predicts each with ferry's roofline for the same shape
(one layer, fp16, the measured tensor parallelism, no host overhead), and prints per (model, hardware, operator) the
median and 90th percentile of |predicted / measured - 1| and the median signed error (> 0: ferry too slow). With a
datasheet profile these figures are what calibration must bring down.

``--aiconfigurator SYSTEM`` reads NVIDIA's measured kernel database instead (``aiconfigurator-core``, ``pip install
'ferry[measured]'``; ``costmodel.calibration.aiconfigurator``): the GEMMs and attention kernels of ferry's built-in
dense models at tensor parallelism 1-8 on that system, bf16, as the ``--framework`` engine (vllm, sglang or trtllm)
ran them, scored against ``--hardware`` (default: ferry's profile of that GPU). ``--model`` names ferry models here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pandas as pd

from costmodel.calibration.aiconfigurator import FRAMEWORKS, MODELS, SYSTEMS, load_measured, read_tables
from costmodel.calibration.vidur import errors, load_vidur, predict
from costmodel.hardware import load_hardware


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "validate-kernels",
        help="compare per-operator predictions with measured kernel times (Vidur's profiles)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, help="Vidur profiling directory (holds compute/)")
    source.add_argument(
        "--aiconfigurator",
        metavar="SYSTEM",
        help="a system of NVIDIA's measured kernel database (aiconfigurator-core): " + ", ".join(sorted(SYSTEMS)),
    )
    parser.add_argument("--framework", choices=FRAMEWORKS, default="vllm", help="--aiconfigurator: whose kernels")
    parser.add_argument("--version", help="--aiconfigurator: the engine version's tables (default: the package's)")
    parser.add_argument("--hardware", help="--aiconfigurator: the profile to score (default: ferry's for the GPU)")
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


def run_database(args: argparse.Namespace) -> tuple[pd.DataFrame, str]:
    """The error table against the measured database, and a line saying what was compared."""
    tables = read_tables(args.aiconfigurator, args.framework, args.version)
    profile = load_hardware(args.hardware or SYSTEMS.get(args.aiconfigurator, "") or args.aiconfigurator)
    rows = load_measured(tables, profile.name, tuple(args.model) or MODELS)
    source = (f"aiconfigurator-core {args.aiconfigurator} {args.framework} {tables.version} "
              f"(bf16, one layer on one GPU, no host overhead), against profile {profile.name}")  # fmt: skip
    return errors(predict(rows, {profile.name: profile})), source


def handle(args: argparse.Namespace) -> int:
    if args.aiconfigurator:
        table, source = run_database(args)
        skipped: list[str] = []
    else:
        table, skipped = run(args.data, args.model)
        source = f"{args.data} (Vidur profiles; one layer, fp16, no host overhead)"
    if args.json:
        print(
            json.dumps(
                {
                    "data": str(args.data or args.aiconfigurator),
                    "source": source,
                    "results": table.to_dict(orient="records"),
                    "skipped": skipped,
                }
            )
        )
        return 0
    print(f"ferry vs measured kernel times in {source}")
    print(f"{'model':<42} {'hardware':<9} {'op':<18} {'n':>5} {'median |err|':>12} {'p90 |err|':>10} {'bias':>7}")
    for row in table.itertuples(index=False):
        print(
            f"{row.model:<42} {row.hardware:<9} {row.op:<18} {row.n:>5} {row.median_abs_rel_error:>12.1%} "
            f"{row.p90_abs_rel_error:>10.1%} {row.median_rel_error:>+7.1%}"
        )
    if skipped:
        print(f"skipped {len(skipped)} file(s): " + "; ".join(skipped))
    return 0
