"""`ferry sweep`: run every point of a sweep file (in parallel, resumable) into one Parquet table."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from experiments.runner import outputs, user_code

SWEEP_OUTPUTS = ("points", "results.parquet", "results.csv", "sweep.json")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a sweep file's points in parallel into one Parquet table (resumable)",
        description="Expand a sweep file (base config, grid and zip axes, seeds, a where filter; mode run or "
        "max_rate) and run every point on all cores (or a Dask scheduler), storing each as it finishes. Running it "
        "again skips the points already stored; a point that fails is stored with its error. The table is "
        "DIR/results.parquet, one row per point.",
    )
    p.add_argument("spec", type=Path, help="the sweep file (YAML)")
    p.add_argument("--out", type=Path, default=Path("sweep"), help="folder of the results (sweep/)")
    p.add_argument("--dry-run", action="store_true", help="print the points and their count, run nothing")
    p.add_argument("--jobs", type=int, default=None, help="processes (default: every core; 1: in this process)")
    p.add_argument(
        "--dask",
        default=os.environ.get("FERRY_DASK_SCHEDULER"),
        metavar="ADDRESS",
        help="send the points to this Dask distributed scheduler (default $FERRY_DASK_SCHEDULER) instead of a pool",
    )
    p.add_argument("--csv", action="store_true", help="also write results.csv")
    p.add_argument("--force", action="store_true", help="write into --out even if it holds another command's outputs")
    user_code.add_flag(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from experiments.progress import Bar
    from experiments.sweep import overload
    from experiments.sweep.run import execute
    from experiments.sweep.spec import expand, load_spec
    from experiments.sweep.store import Store

    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: the number of processes, at least 1")
    spec = load_spec(args.spec)
    points = expand(spec)
    swept = spec.swept()
    named = [n for p in points if p.config is not None for n in user_code.named_in(p.config)]
    user_code.admit(named, "sweep", str(args.spec), args.allow_import)
    if args.dry_run:
        for p in points:
            status = f"  invalid: {p.error}" if p.error else ""
            print(f"{p.index:>6}  {p.hash}  " + "  ".join(f"{k}={v}" for k, v in p.params.items()) + status)
        print(f"{len(points):,} points")
        return 0
    outputs.check(args.out, SWEEP_OUTPUTS, "sweep", args.force)
    args.out.mkdir(parents=True, exist_ok=True)
    store = Store(args.out)
    done = store.done()
    todo = [p for p in points if p.hash not in done]
    skipped = len(points) - len(todo)
    jobs = 1 if args.jobs == 1 else (args.jobs or os.cpu_count() or 1)
    where = f"Dask scheduler {args.dask}" if args.dask else f"{jobs} process{'es' if jobs > 1 else ''}"
    print(f"ferry sweep: {len(points):,} points, {skipped:,} already stored (skipped), {len(todo):,} to run on "
          f"{where}", file=sys.stderr)  # fmt: skip
    bar = Bar(len(todo), "points")
    failed = 0

    def on_done(row: dict) -> None:
        nonlocal failed
        store.put(row)
        failed += row["status"] != "ok"
        bar.step()

    try:
        execute(todo, spec, jobs, args.dask, on_done)
    finally:
        bar.close()
        table = store.write_table(swept, [p.hash for p in points], args.csv)
        ok = table[table["status"] == "ok"] if len(table) else table
        overloaded = int(overload.mask(ok).sum())
        sidecar = {"spec": spec.model_dump(mode="json"), "points": len(points), "skipped": skipped,
                   "ran": bar.done, "failed_now": failed, "swept": swept, "overloaded": overloaded}  # fmt: skip
        outputs.write_text(args.out / "sweep.json", json.dumps(sidecar, indent=2) + "\n")
    print(f"ran {bar.done:,} points ({failed:,} failed), skipped {skipped:,}; wrote {store.table}")
    if overloaded:
        print(f"ferry sweep: {overload.notice(overloaded, len(ok), spec.mode)}", file=sys.stderr)
    if points and not len(ok):  # stored, but nothing ran: a script must not read the table as results
        print(f"ferry sweep: no point ran (every one failed: see the table's error column); exit status {NO_RESULT}",
              file=sys.stderr)  # fmt: skip
        return NO_RESULT
    return 0


NO_RESULT = 3  # the exit status of a sweep whose every point failed (its table is written), as `ferry run`'s
