"""Speed of `ferry sweep`: a 1,000-point sweep of 1,000-request runs on every core, and what each point costs
beyond its simulation (process start, imports, numba compilation, storing the point).

    python -m experiments.studies.sweep_bench             # 1,000 points
    python -m experiments.studies.sweep_bench --points 200

The sweep: llama-3-8b on an H100 SXM, chunked prefill, 1,000 ShareGPT-like requests at 8 requests/s per point, over
max_num_seqs x max_num_batched_tokens x seeds. "in points" is the wall time the points report themselves (building
the replica, simulating, summarising); "overhead per point" is the rest of the sweep's wall time, spread over the
points: (processes x wall - sum of points' own time) / points.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import pandas as pd

from experiments.studies.bench import INPUT_LEN, OUTPUT_LEN


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", type=int, default=1000, help="points (a multiple of 50)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    from experiments.cli import main as ferry

    seqs = [16, 32, 64, 128, 256]
    tokens = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
    seeds = max(1, args.points // (len(seqs) * len(tokens)))
    spec = {"base": {"model": "llama-3-8b", "hardware": "h100-sxm", "policy": "chunked", "num_prompts": 1000,
                     "request_rate": 8, "input_len": INPUT_LEN, "output_len": OUTPUT_LEN},
            "grid": {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}, "seeds": seeds}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(json.dumps(spec))
        out = Path(tmp) / "out"
        started = time.perf_counter()
        ferry(["sweep", str(path), "--out", str(out), "--jobs", str(args.jobs)])
        wall = time.perf_counter() - started
        table = pd.read_parquet(out / "results.parquet")
    n = len(table)
    own = float(table.wall_s.sum())
    overhead = (args.jobs * wall - own) / n
    first = table.nlargest(args.jobs, "wall_s").wall_s.tolist()
    print(f"{n:,} points of 1,000 requests on {args.jobs} processes: {wall:.1f} s wall, {n / wall:.1f} points/s; "
          f"in points {own:.1f} s ({own / n * 1000:.0f} ms each); overhead per point {overhead * 1000:.0f} ms "
          f"({overhead / (own / n):.0%} of a point's own time); slowest points (first in each process, compiling "
          f"the loop) {', '.join(f'{x:.1f}' for x in first)} s; {int((table.status != 'ok').sum())} "
          "failed")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
