"""Simulator speed against its goals: requests, iterations, wall seconds, iterations per second and peak memory, and
the cost of each feature per iteration against the plain case.

    python -m experiments.studies.bench                       # the goals: 1M light and busy, each feature's cost
    python -m experiments.studies.bench --sizes 10000 100000 --workloads light --policies continuous chunked
    python -m experiments.studies.bench --sizes 20000 --engines reference --features prefix-caching disaggregated

Workloads, all llama-3-8b on h100-sxm (``--hardware``) with the limits a default ``vllm serve`` picks there,
Poisson arrivals at 20 requests/s (busy without ever idling, below saturation):
- ``light``: ShareGPT-like lengths (lognormal with the vLLM paper's ShareGPT means: 161 prompt and 338 output
  tokens): with the device profile of December 2026, about 60 sequences per iteration, 5.4 iterations per request;
- ``busy``: the same prompts with longer answers (mean 512 output tokens): about 110 sequences per iteration, 4.4
  iterations per request.

Features, each on the light lengths at ``--feature-size`` requests (chunked prefill), against the plain light case
of that size: ``prefix-caching`` (every prompt starts with one of 8 shared system prompts of 400 tokens; 20
requests/s), ``conversations`` (sessions of 4 turns, 5 s of thinking, each turn's prompt the conversation so far,
prefix caching on; 4 sessions/s, whose batches are the plain case's size: at 5 a turn's longer prompts make them a
third larger), ``disaggregated`` (one prefill and one decode replica over NVLink; 20 requests/s). Their cost is wall
time per iteration against the plain case's, and per sequence scheduled (an iteration of more sequences costs more).

Each case runs in a fresh process, after a small warm-up run that loads the compiled code, so its peak RSS and wall
time are its own; "wall" is the simulation call alone (engine and SimPy), "total" adds generating the workload and
the summary (which the peak RSS includes). The goals (issue 27), printed under the table: 1M requests of each
workload within 10 s of wall time and 1 GB peak RSS, and each feature within 2x the plain case's time per iteration.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

INPUT_LEN = "lognormal:mean=161,sigma=1.0,max=2048"
OUTPUT_LEN = "lognormal:mean=338,sigma=0.8,max=2048"
WORKLOADS = {
    "light": {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "request_rate": 20.0},
    "busy": {"input_len": INPUT_LEN, "output_len": "lognormal:mean=512,sigma=0.8,max=2048", "request_rate": 20.0},
}
FEATURES: dict[str, dict[str, Any]] = {
    # every request starts with one of 8 system prompts of 400 tokens, and the KV cache reuses them
    "prefix-caching": {"enable_prefix_caching": True, "prefix_len": 400, "num_prefix_groups": 8},
    # sessions of 4 turns, each turn's prompt the conversation so far
    "conversations": {"enable_prefix_caching": True, "turns": 4, "think_time_s": 5.0, "request_rate": 4.0},
    # one prefill replica and one decode replica (two GPUs) over NVLink
    "disaggregated": {"disaggregation": {"prefill": {"count": 1}, "decode": {"count": 1}}},
}
GOAL_WALL_S, GOAL_RSS_MB, GOAL_SIZE, GOAL_FEATURE_RATIO = 10.0, 1024.0, 1_000_000, 2.0
HARDWARE = "h100-sxm"  # the device profile of every case (--hardware): kernels timed from its measured tables


def case_config(
    policy: str, size: int, engine: str, workload: str, feature: str | None, seed: int, hardware: str = HARDWARE,
    **extra: Any,
) -> Any:  # fmt: skip
    """The run config of one case (``extra``: run config fields that replace the case's)."""
    from experiments.config import RunConfig

    fields: dict[str, Any] = {"model": "llama-3-8b", "hardware": hardware, "policy": policy, "engine": engine,
                              "num_prompts": size, "seed": seed} | WORKLOADS[workload]  # fmt: skip
    if feature is not None:
        fields |= FEATURES[feature]
        if "turns" in fields:
            fields["num_prompts"] = size // fields["turns"]
    return RunConfig.model_validate(fields | extra)


def one_case(
    policy: str, size: int, engine: str, workload: str = "light", feature: str | None = None, seed: int = 0,
    hardware: str = HARDWARE,
) -> dict[str, Any]:  # fmt: skip
    """Run one case in this process and measure it."""
    from experiments.simulation import build_workload, run_simulation

    t = time.perf_counter()
    run_simulation(case_config(policy, 200, engine, workload, feature, seed, hardware))  # warm-up: load the code
    warmup = time.perf_counter() - t
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    cfg = case_config(policy, size, engine, workload, feature, seed, hardware)
    workload_ = build_workload(cfg)
    t1 = time.perf_counter()
    timings: dict[str, float] = {}
    result = run_simulation(cfg, workload_, on_progress=None, timings=timings)
    t2 = time.perf_counter()
    s = result.summary
    return {
        "policy": policy,
        "workload": workload,
        "feature": feature or "",
        "engine": s["engine"],
        "requests": len(workload_),
        "iterations": s["num_iterations"],
        "wall_s": timings["simulate_s"],
        "total_s": (t1 - t0) + (t2 - t1),
        "warmup_s": warmup,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mb": rss_before,
        "mean_batch_size": s.get("mean_batch_size"),
        "gpu_idle_fraction": s["gpu_idle_fraction"],
        "completed": s["completed"],
        "itl_kept": s["itl_kept"],
    }


def bare_simpy(timeouts: int) -> float:
    """Wall seconds of a SimPy loop that only yields ``timeouts`` timeouts."""
    import simpy

    def proc(env: simpy.Environment):  # noqa: ANN202
        for _ in range(timeouts):
            yield env.timeout(0.001)

    env = simpy.Environment()
    env.process(proc(env))
    t = time.perf_counter()
    env.run()
    return time.perf_counter() - t


def run_case(
    policy: str, size: int, engine: str, workload: str, feature: str | None, seed: int, hardware: str = HARDWARE
) -> dict[str, Any]:
    """``one_case`` in a fresh process."""
    cmd = [sys.executable, "-m", "experiments.studies.bench", "--one", policy, str(size), engine, workload,
           feature or "-", "--seed", str(seed), "--hardware", hardware]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    row: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return row


HEADER = (f"{'policy':<11}{'workload':<9}{'feature':<15}{'engine':<10}{'requests':>10}{'iterations':>11}{'batch':>6}"
          f"{'wall s':>8}{'total s':>8}{'iter/s':>10}{'peak MB':>8}{'SimPy s':>8}{'ratio':>6}")  # fmt: skip


def show(row: dict[str, Any]) -> str:
    return (f"{row['policy']:<11}{row['workload']:<9}{row['feature'] or '-':<15}{row['engine']:<10}"
            f"{row['requests']:>10,}{row['iterations']:>11,}{row['mean_batch_size'] or 0:>6.1f}{row['wall_s']:>8.2f}"
            f"{row['total_s']:>8.2f}{row['iterations'] / row['wall_s']:>10,.0f}{row['peak_rss_mb']:>8,.0f}"
            f"{row['simpy_s']:>8.2f}{row['ratio']:>6.2f}")  # fmt: skip


def goals(rows: list[dict[str, Any]]) -> list[str]:
    """One line per goal the rows measure: the 1M cases' wall time and memory, and each feature's time per iteration
    against the plain case of its size, policy and engine."""
    lines = []
    for row in rows:
        if row["requests"] == GOAL_SIZE and not row["feature"] and row["engine"] == "compiled":
            ok = row["wall_s"] <= GOAL_WALL_S and row["peak_rss_mb"] <= GOAL_RSS_MB
            lines.append(f"{'met' if ok else 'MISSED':<7}{row['policy']} {row['workload']} 1M: {row['wall_s']:.2f} s "
                         f"(goal {GOAL_WALL_S:g}), {row['peak_rss_mb']:,.0f} MB (goal {GOAL_RSS_MB:,.0f})")  # fmt: skip
    plain = {(r["engine"], r["requests"]): r for r in rows if not r["feature"] and r["workload"] == "light"
             and r["policy"] == "chunked"}  # fmt: skip
    for row in rows:
        base = plain.get((row["engine"], row["requests"]))
        if row["feature"] and base is not None:
            ratio = (row["wall_s"] / row["iterations"]) / (base["wall_s"] / base["iterations"])
            per_seq = ratio * (base["mean_batch_size"] or 1) / (row["mean_batch_size"] or 1)
            batches = f"{row['mean_batch_size']:.0f} a batch against {base['mean_batch_size']:.0f}"
            lines.append(f"{'met' if ratio <= GOAL_FEATURE_RATIO else 'MISSED':<7}{row['feature']}: {ratio:.2f}x the "
                         f"plain case's time per iteration (goal {GOAL_FEATURE_RATIO:g}x), {per_seq:.2f}x per "
                         f"sequence scheduled ({batches})")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--policies", nargs="+", default=["continuous", "chunked"])
    p.add_argument("--engines", nargs="+", default=["compiled"], choices=("compiled", "reference"))
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--features", nargs="*", default=list(FEATURES), choices=list(FEATURES),
                   help="features to time against the plain case (none: --features with no value)")  # fmt: skip
    p.add_argument("--feature-size", type=int, default=100_000, help="requests of each feature's case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hardware", default=HARDWARE,
                   help=f"device profile of every case (default {HARDWARE}; e.g. h100-sxm.datasheet: the roofline "
                        "alone, no measured tables)")  # fmt: skip
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument("--one", nargs=5, help=argparse.SUPPRESS)  # POLICY SIZE ENGINE WORKLOAD FEATURE: one case, as JSON
    args = p.parse_args(argv)
    if args.one:
        policy, size, engine, workload, feature = args.one
        row = one_case(policy, int(size), engine, workload, None if feature == "-" else feature, args.seed,
                       args.hardware)  # fmt: skip
        print(json.dumps(row))
        return 0

    cases: list[tuple[str, int, str, str, str | None]] = []
    for engine in args.engines:
        for workload in args.workloads:
            for policy in args.policies:
                cases += [(policy, size, engine, workload, None) for size in args.sizes]
        if args.features:
            if (engine, "light", "chunked", args.feature_size) not in {(c[2], c[3], c[0], c[1]) for c in cases}:
                cases.append(("chunked", args.feature_size, engine, "light", None))
            cases += [("chunked", args.feature_size, engine, "light", f) for f in args.features]
    print(HEADER, flush=True)
    rows = []
    for policy, size, engine, workload, feature in cases:
        row = run_case(policy, size, engine, workload, feature, args.seed, args.hardware)
        row["simpy_s"] = bare_simpy(row["iterations"])
        row["ratio"] = row["wall_s"] / row["simpy_s"]
        rows.append(row)
        print(show(row), flush=True)
    print()
    for line in goals(rows):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
