"""`ferry teach`: the teaching figures of the ferry analogy, drawn from ferry's own simulations of small scenarios."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.runner import user_code
from experiments.teach.labels import LANGS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "teach",
        help="draw the teaching figures (timelines, seats, scoreboards, boats) from small simulated scenarios",
        description="Run small scenarios (a handful of requests, max batch size 3, as in the chapter) through every "
        "batching policy and draw, as PNG and SVG: why batching helps (roofline, tokens/s against batch size), the "
        "limits of an iteration, and per scenario each policy's timeline, the stacked comparison on one time axis, "
        "the seats over time with the dock queue, the scoreboard, and an animated GIF of the boats. The built-in "
        "scenarios are YAML files you can copy (--list shows where).",
    )
    p.add_argument("--out", type=Path, default=Path("figures"), help="folder for the figures (figures/)")
    p.add_argument(
        "--scenario",
        action="append",
        default=None,
        metavar="NAME|FILE",
        help="a built-in scenario's name or a scenario YAML file (repeatable; default: every built-in one)",
    )
    p.add_argument("--lang", choices=LANGS, default="en", help="label language: en (default) or ko (Korean)")
    p.add_argument("--model", default=None, help="model of every scenario and of the roofline (default: each its own)")
    p.add_argument("--hardware", default=None, help="GPU profile, likewise (default: each its own)")
    p.add_argument(
        "--figures",
        type=Path,
        default=None,
        metavar="FILE",
        help="settings of the why-batching and limits figures (YAML; default: the built-in figures.yaml)",
    )
    p.add_argument("--list", action="store_true", help="list the built-in scenarios and their files, then stop")
    p.add_argument("--force", action="store_true", help="write into --out even if it holds another command's outputs")
    user_code.add_flag(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from experiments.teach.book import make_book
    from experiments.teach.scenario import builtin_paths, pick_scenarios
    from experiments.teach.settings import BUILTIN, load_settings

    if args.list:
        for path in [*builtin_paths(), BUILTIN]:
            print(path)
        return 0
    scenarios = pick_scenarios(args.scenario, args.model, args.hardware)
    for scenario in scenarios:  # a scenario file's policy written module:Class is imported only when allowed
        named = [n for label in scenario.labels() for n in user_code.named_in(scenario.run_config(label))]
        user_code.admit(named, "teach", f"scenario {scenario.name}", args.allow_import)
    settings = load_settings(args.figures, args.model, args.hardware)
    index = make_book(
        scenarios,
        args.out,
        args.lang,
        settings,
        args.force,
        say=lambda what: print(f"ferry teach: {what}", file=sys.stderr),
    )
    figures = sum(1 for f in index["files"] if not f.startswith("records/"))
    print(
        f"wrote {figures} figure files and the records behind them into {args.out} (index: {args.out / 'teach.json'})"
    )
    return 0
