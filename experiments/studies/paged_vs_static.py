"""Paged continuous batching against static reservation: the vLLM paper's claim, on ferry.

Kwon et al. (SOSP 2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention") show that
paging the KV cache lets a 13B model on one A100-40GB sustain several times the request rate of engines that reserve
each request's whole KV up front, at the same normalized latency (mean over requests of end-to-end latency / output
tokens). This experiment replays a ShareGPT-like length mix (prompt and output resampled together from a length file,
conversations longer than the model's context dropped, Poisson arrivals) through:

- paged continuous batching (vLLM): iteration-level batching, KV blocks allocated as requests grow, preemption by
  recompute;
- continuous batching with up-front reservation (Orca): iteration-level too, but a request is admitted only when its
  whole reservation fits: ``max_model_len`` tokens (Orca "Max": the engine must plan for the longest answer) or its own
  prompt + output (Orca "Oracle": it knows when each answer stops);
- static and dynamic batching with up-front reservation (FasterTransformer-like), at several batch sizes, keeping the
  best;

and reports the highest request rate each sustains under the normalized-latency bound, and the ratios.

    python -m experiments.studies.paged_vs_static \
        --lengths ../shared/data/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments.runner.config import RunConfig
from experiments.runner.simulation import run_simulation
from experiments.studies.ratesearch import RateSearch, max_rate
from sim.workload import synthetic
from sim.workload.lengths import read_length_pairs

DEFAULT_LENGTHS = Path("../shared/data/traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv")


@dataclass
class System:
    label: str
    fields: dict[str, Any]  # RunConfig fields that make this system


PAGED = "paged continuous (vLLM)"
ORCA_MAX = "continuous, reserve max_model_len (Orca Max)"
ORCA_ORACLE = "continuous, reserve output (Orca Oracle)"


def systems(batch_sizes: list[int]) -> list[System]:
    out = [
        System(PAGED, {"policy": "continuous", "kv_reservation": "paged"}),
        System(ORCA_MAX, {"policy": "continuous", "kv_reservation": "max_model_len"}),
        System(ORCA_ORACLE, {"policy": "continuous", "kv_reservation": "output"}),
    ]
    for policy in ("static", "dynamic"):
        for b in batch_sizes:
            fields: dict[str, Any] = {"policy": policy, "kv_reservation": "max_model_len", "max_batch_size": b}
            if policy == "dynamic":
                fields["max_delay_ms"] = 1000.0
            out.append(System(f"{policy}, reserve max_model_len, batch {b}", fields))
    return out


def search(system: System, base: dict[str, Any], pairs: tuple, args: argparse.Namespace) -> RateSearch:
    config = RunConfig.model_validate(base | system.fields)

    def evaluate(rate: float) -> dict[str, Any]:
        w = synthetic(args.num_prompts, rate, 1.0, 1, 1, np.random.default_rng(args.seed), pairs=pairs)
        return run_simulation(config, w).summary

    def meets(summary: dict[str, Any]) -> bool:
        latency = summary["mean_normalized_latency_ms"]
        return summary["failed"] == 0 and latency is not None and latency <= args.max_normalized_latency_ms

    return max_rate(evaluate, meets, start=args.start_rate, rel_tol=args.rel_tol, max_evaluations=14)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=Path, default=DEFAULT_LENGTHS, help="ShareGPT-like lengths CSV or any trace")
    p.add_argument("--model", default="llama-2-13b")
    p.add_argument("--hardware", default="a100-40g")
    p.add_argument("--max-model-len", type=int, default=2048, help="context; longer conversations are dropped")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-normalized-latency-ms", type=float, default=100.0, help="the latency bound (ms/token)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    p.add_argument("--start-rate", type=float, default=0.5)
    p.add_argument("--rel-tol", type=float, default=0.03)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    if not args.lengths.is_file():
        p.error(f"--lengths {args.lengths}: no such file (pass a ShareGPT-like lengths CSV or a trace)")

    pairs = read_length_pairs(args.lengths, max_total=args.max_model_len)
    base = {"model": args.model, "hardware": args.hardware, "max_model_len": args.max_model_len}
    print(
        f"{args.model} on {args.hardware}, {args.num_prompts} requests, Poisson arrivals, lengths resampled from "
        f"{args.lengths.name} ({len(pairs[0])} rows with prompt + output <= {args.max_model_len}; mean prompt "
        f"{pairs[0].mean():.0f}, mean output {pairs[1].mean():.0f} tokens); bound: mean normalized latency <= "
        f"{args.max_normalized_latency_ms:g} ms/token"
    )
    results: dict[str, float] = {}
    curves: dict[str, list[tuple[float, float | None]]] = {}
    for system in systems(args.batch_sizes):
        found = search(system, base, pairs, args)
        results[system.label] = found.rate
        curves[system.label] = [(r, s["mean_normalized_latency_ms"]) for r, s in found.curve()]
        print(f"  {system.label:<42} {found.rate:8.3f} req/s   ({len(found.tried)} runs)")

    paged = results[PAGED]
    batched = max((k for k in results if k.startswith(("static", "dynamic"))), key=lambda k: results[k])
    print()
    for label in (ORCA_MAX, ORCA_ORACLE, batched):
        rate = results[label]
        ratio = f"{paged / rate:.2f}x" if rate > 0 else "inf (it never meets the bound)"
        print(f"paged continuous / {label}: {paged:.3f} / {rate:.3f} req/s = {ratio}")
    if args.json:
        args.json.write_text(json.dumps({"max_rate": results, "curves": curves, "args": vars(args)}, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
