"""Simulator speed: requests, iterations, wall seconds, iterations per second and peak memory, against a bare SimPy
loop that yields as many timeouts as the run had iterations (the event loop's own ceiling).

    python -m experiments.studies.bench                       # continuous and chunked at 10k, 100k and 1M requests
    python -m experiments.studies.bench --sizes 10000 --engines compiled reference
    python -m experiments.studies.bench --sizes 20000 --engines reference --prefix-caching   # the feature's cost
    python -m experiments.studies.bench --sizes 20000 --engines reference --disaggregated    # 1 prefill + 1 decode

Workload: llama-3-8b on h100-sxm, ShareGPT-like lengths (lognormal with the vLLM paper's ShareGPT means: 161 prompt and
338 output tokens), Poisson arrivals at 20 requests/s, which keeps the replica busy (no idle time) but stable (it
saturates near 24 req/s). Each case runs in a fresh process, after a small warm-up run that loads the compiled code,
so its peak RSS and wall time are its own; "wall" is the simulation call alone (engine and SimPy), "total" adds
generating the workload and the summary.
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


# ``--prefix-caching``: every request starts with one of 8 system prompts of 400 tokens, and the KV cache reuses them
PREFIX_CACHING = {"enable_prefix_caching": True, "prefix_len": 400, "num_prefix_groups": 8}
# ``--disaggregated``: one prefill replica and one decode replica (two GPUs) over NVLink
DISAGGREGATED = {"disaggregation": {"prefill": {"count": 1}, "decode": {"count": 1}}}


def one_case(
    policy: str, size: int, engine: str, rate: float, seed: int, caching: bool = False, disagg: bool = False
) -> dict[str, Any]:
    """Run one case in this process and measure it."""
    from experiments.config import RunConfig
    from experiments.simulation import build_workload, run_simulation

    def config(n: int) -> RunConfig:
        return RunConfig.model_validate(
            {"model": "llama-3-8b", "hardware": "h100-sxm", "policy": policy, "engine": engine,
             "num_prompts": n, "request_rate": rate, "input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "seed": seed}
            | (PREFIX_CACHING if caching else {}) | (DISAGGREGATED if disagg else {})
        )  # fmt: skip

    t = time.perf_counter()
    run_simulation(config(200))  # warm-up: load (or compile) the engine's code
    warmup = time.perf_counter() - t
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    cfg = config(size)
    workload = build_workload(cfg)
    t1 = time.perf_counter()
    timings: dict[str, float] = {}
    result = run_simulation(cfg, workload, on_progress=None, timings=timings)
    t2 = time.perf_counter()
    s = result.summary
    return {
        "policy": policy + (" +prefix caching" if caching else "") + (" 1P:1D" if disagg else ""),
        "engine": s["engine"],
        "requests": size,
        "iterations": s["num_iterations"],
        "wall_s": timings["simulate_s"],
        "total_s": (t1 - t0) + (t2 - t1),
        "warmup_s": warmup,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mb": rss_before,
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--policies", nargs="+", default=["continuous", "chunked"])
    p.add_argument("--engines", nargs="+", default=["compiled"], choices=("compiled", "reference"))
    p.add_argument("--rate", type=float, default=20.0, help="requests per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument(
        "--prefix-caching", action="store_true", help="with 8 shared 400-token system prompts and prefix caching"
    )
    p.add_argument("--disaggregated", action="store_true", help="one prefill and one decode replica")
    p.add_argument("--one", nargs=3, metavar=("POLICY", "SIZE", "ENGINE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        policy, size, engine = args.one
        print(
            json.dumps(
                one_case(policy, int(size), engine, args.rate, args.seed, args.prefix_caching, args.disaggregated)
            )
        )
        return 0

    header = (f"{'policy':<24}{'engine':<10}{'requests':>10}{'iterations':>12}{'wall s':>9}{'total s':>9}"
              f"{'iter/s':>11}{'peak MB':>9}{'SimPy s':>9}{'ratio':>7}")  # fmt: skip
    print(header)
    rows = []
    for engine in args.engines:
        for policy in args.policies:
            for size in args.sizes:
                cmd = [sys.executable, "-m", "experiments.studies.bench", "--one", policy, str(size), engine,
                       "--rate", str(args.rate), "--seed", str(args.seed)]  # fmt: skip
                cmd += ["--prefix-caching"] if args.prefix_caching else []
                cmd += ["--disaggregated"] if args.disaggregated else []
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                row = json.loads(out.strip().splitlines()[-1])
                row["simpy_s"] = bare_simpy(row["iterations"])
                row["ratio"] = row["wall_s"] / row["simpy_s"]
                rows.append(row)
                print(
                    f"{row['policy']:<24}{row['engine']:<10}{size:>10,}{row['iterations']:>12,}{row['wall_s']:>9.2f}"
                    f"{row['total_s']:>9.2f}{row['iterations'] / row['wall_s']:>11,.0f}{row['peak_rss_mb']:>9,.0f}"
                    f"{row['simpy_s']:>9.2f}{row['ratio']:>7.2f}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
