"""Speed of clusters and capacity plans, against their goals (printed as ratios: below 1 meets the goal).

    python -m experiments.studies.cluster_bench                  # both cases
    python -m experiments.studies.cluster_bench --case cluster   # 16 replicas, 1M requests, least_tokens
    python -m experiments.studies.cluster_bench --case plan      # the docs' plan (3 GPU kinds x 4 TP x 2 settings)

cluster: llama-3-8b on 16 H100 SXM replicas (chunked prefill, `vllm serve` defaults) behind least_tokens, 1M requests
with ShareGPT-like lengths (as ``experiments.studies.bench``) at 320 requests/s (20 per replica); goal: under 120 s
and 3 GB. "wall" is the simulation call (routing and every replica's loop); "total" adds generating the workload and
the summary (not writing the CSVs). plan: `ferry plan` for llama-3-70b on h100-sxm, a100-80g and h200 at TP 1, 2, 4
and 8 with max_num_seqs 128 and 256, 5,000 requests of the Azure conversation trace (``../shared/data/traces``; a
ShareGPT-like synthetic workload at the same rate where that folder is absent), SLO p99 TTFT 2 s and p99 TPOT 100 ms;
goal: under 60 s. Each case runs in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from experiments.studies.bench import INPUT_LEN, OUTPUT_LEN

TRACE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "traces" / "splitwise_conv.csv"
GOALS = {"cluster": (120.0, 3072.0), "plan": (60.0, None)}


def cluster_case(size: int) -> dict[str, Any]:
    from experiments.runner.config import RunConfig
    from experiments.runner.simulation import build_workload, run_simulation

    def config(n: int) -> RunConfig:
        return RunConfig.model_validate(
            {"model": "llama-3-8b", "hardware": "h100-sxm", "policy": "chunked", "replicas": 16,
             "router": "least_tokens", "num_prompts": n, "request_rate": 320.0, "input_len": INPUT_LEN,
             "output_len": OUTPUT_LEN}
        )  # fmt: skip

    run_simulation(config(500))  # warm-up: compile the loop
    t0 = time.perf_counter()
    cfg = config(size)
    workload = build_workload(cfg)
    timings: dict[str, float] = {}
    summary = run_simulation(cfg, workload, timings=timings).summary
    return {
        "case": "cluster",
        "requests": size,
        "iterations": summary["num_iterations"],
        "completed": summary["completed"],
        "wall_s": timings["simulate_s"],
        "total_s": time.perf_counter() - t0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def plan_case(out: Path) -> dict[str, Any]:
    from experiments.cli import main

    workload = (["--trace", str(TRACE)] if TRACE.is_file() else
                ["--request-rate", "5.4", "--input-len", INPUT_LEN, "--output-len", OUTPUT_LEN])  # fmt: skip
    args = ["plan", "--model", "llama-3-70b", *workload, "--num-prompts", "5000", "--slo", "ttft_p99_ms=2000",
            "tpot_p99_ms=100", "--hardware", "h100-sxm,a100-80g,h200", "--tensor-parallel-size", "1,2,4,8",
            "--max-num-seqs", "128,256", "--router", "least_tokens", "--out", str(out), "--force"]  # fmt: skip
    t0 = time.perf_counter()
    main(args)
    wall = time.perf_counter() - t0
    plan = json.loads((out / "plan.json").read_text())
    return {"case": "plan", "requests": plan["requests"], "candidates": len(plan["candidates"]), "wall_s": wall,
            "total_s": wall, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "best": plan["ranked"][:1]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=("cluster", "plan", "both"), default="both")
    p.add_argument("--size", type=int, default=1_000_000, help="cluster: requests (1M)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        row = cluster_case(args.size) if args.one == "cluster" else plan_case(Path("/tmp/ferry-plan-bench"))
        print(json.dumps(row))
        return 0
    for case in ("cluster", "plan") if args.case == "both" else (args.case,):
        cmd = [sys.executable, "-m", "experiments.studies.cluster_bench", "--one", case, "--size", str(args.size)]
        row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
        seconds, megabytes = GOALS[case]
        peak = row["peak_rss_mb"]
        memory = f", peak {peak:,.0f} MB (goal {megabytes:,.0f}: ratio {peak / megabytes:.2f})" if megabytes else ""
        print(f"{case}: {row['requests']:,} requests, wall {row['wall_s']:.1f} s, total {row['total_s']:.1f} s "
              f"(goal {seconds:.0f} s: ratio {row['wall_s'] / seconds:.2f}){memory}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
