"""Prefix caching on multi-turn conversations: how much it cuts TTFT, and where it stops helping as the cache fills.

Each conversation's turn is the conversation so far plus a new message, sent a think time after the answer; with
prefix caching a turn recomputes only its new message, if the blocks of the turn before are still cached. They are
not always: while a client thinks, its conversation's blocks are free to evict, and the other conversations' new
blocks push them out, least recently freed first. This study runs the same conversations with caching off and on,
on KV caches of decreasing size (``num_gpu_blocks_override``; the full cache of the device first), and prints the
mean TTFT of each, the hit rate and the evictions:

    python -m experiments.studies.prefix_caching [--sessions 200] [--turns 8] [--think-time 10] [--json out.json]

On a large cache every later turn finds its whole conversation so far cached; as the cache shrinks below the
conversations' working set (every thinking conversation's context), hits fall and the saving goes with them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from experiments.runner.config import RunConfig
from experiments.runner.simulation import build_replica, run_simulation

DEFAULT = {
    "model": "llama-3-8b",
    "hardware": "h100-sxm",
    "policy": "chunked",
    "max_num_batched_tokens": 2048,
    "max_num_seqs": 128,
    "max_model_len": 8192,
    "request_rate": 1.0,  # conversations started per second
    "input_len": "lognormal:median=200,sigma=0.6,max=1000",
    "output_len": "lognormal:median=200,sigma=0.6,max=800",
    "prefix_len": 400,  # a system prompt shared by every conversation
    "seed": 0,
}
FRACTIONS = (1.0, 0.5, 0.25, 0.15, 0.1)  # of the device's KV cache


def run(sessions: int, turns: int, think_time_s: float) -> list[dict[str, Any]]:
    base = DEFAULT | {"num_prompts": sessions, "turns": turns, "think_time_s": think_time_s}
    full = build_replica(RunConfig.model_validate(base | {"enable_prefix_caching": True})).memory.num_gpu_blocks
    rows = []
    for fraction in FRACTIONS:
        blocks = int(full * fraction)
        row: dict[str, Any] = {"kv_blocks": blocks, "kv_fraction": fraction}
        for caching in (False, True):
            given = base | {"enable_prefix_caching": caching, "num_gpu_blocks_override": blocks}
            s = run_simulation(RunConfig.model_validate(given)).summary
            key = "on" if caching else "off"
            row[f"mean_ttft_ms_{key}"] = s["mean_ttft_ms"]
            row[f"p90_ttft_ms_{key}"] = s["p90_ttft_ms"]
            row[f"preemptions_{key}"] = s["total_preemptions"]
            if caching:
                row["hit_rate"] = s["prefix_cache_hit_rate"]
                row["evictions"] = s["prefix_cache_evictions"]
                row["prefill_tokens_saved"] = s["prefill_tokens_saved"]
        row["ttft_cut"] = 1.0 - row["mean_ttft_ms_on"] / row["mean_ttft_ms_off"]
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'KV blocks':>10} {'share':>6} {'TTFT off':>9} {'TTFT on':>8} {'cut':>6} {'hit rate':>9} {'evictions':>10}"
    lines = [head]
    for r in rows:
        ttft = f"{r['mean_ttft_ms_off']:>8.1f}ms {r['mean_ttft_ms_on']:>6.1f}ms"
        lines.append(
            f"{r['kv_blocks']:>10,} {r['kv_fraction']:>6.0%} {ttft} {r['ttft_cut']:>6.0%} {r['hit_rate']:>9.1%}"
            f" {r['evictions']:>10,}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=200, help="conversations (one starts each second)")
    p.add_argument("--turns", type=int, default=8, help="turns per conversation")
    p.add_argument("--think-time", type=float, default=10.0, help="mean seconds between an answer and the next turn")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = p.parse_args(argv)
    rows = run(args.sessions, args.turns, args.think_time)
    what = f"{args.sessions} conversations of {args.turns} turns, think {args.think_time:g} s"
    print(f"{what}, {DEFAULT['model']} on {DEFAULT['hardware']}, chunked prefill; mean TTFT, prefix caching off/on")
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
