"""`ferry run`: simulate one replica serving a workload under a batching policy, print and write the results."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import policies
from costmodel.dtypes import QUANTIZATION_HELP
from experiments.commands.disagg_cli import add_disagg_flags, disagg_overrides
from experiments.commands.summary_table import format_summary
from experiments.progress import Progress
from experiments.runner import outputs, user_code
from experiments.runner.config import RunConfig
from experiments.runner.simulation import RUN_OUTPUTS, run_simulation, write_outputs
from policies.config import CHUNKED_ORDERS
from policies.vllm_defaults import LATEST
from sim.metrics import overload_notice, parse_goodput
from sim.workload import FORMATS

S = argparse.SUPPRESS  # flags not given do not override the config file or the defaults


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="simulate a workload under a batching policy",
        description="Simulate one model replica serving a trace or synthetic workload under a batching policy. "
        "Flags follow vLLM's names; every flag can also be set in --config FILE.yaml (same names, '_' for '-').",
    )
    p.add_argument("--config", type=Path, default=None, help="YAML file with the same fields as these flags")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("results"),
        help="folder for summary.json, requests.csv, iterations.csv (default: results/)",
    )
    p.add_argument(
        "--format",
        choices=outputs.TABLE_FORMATS,
        default="csv",
        help="the tables' format: csv (default), or parquet (requests.parquet, ...: the same columns, for pandas, "
        "polars or DuckDB)",
    )
    p.add_argument("--json", action="store_true", help="print summary.json to stdout instead of the table")
    p.add_argument("--force", action="store_true", help="write into --out even if it holds files that are not a run's")
    user_code.add_flag(p)

    add_run_arguments(p)
    p.set_defaults(func=main)


def add_run_arguments(p: argparse.ArgumentParser, simulator: bool = True, cluster: bool = True) -> None:
    """The fields of a run config as flags (vLLM's names), in groups; flags not given override nothing. ``simulator``
    adds the simulator's own (engine, ITL keeping, goodput SLOs); ``cluster`` the replicas and router (a command
    that searches the count leaves them out)."""
    g = p.add_argument_group("replica")
    g.add_argument("--model", default=S, help="built-in model (llama-3-8b, ...) or path to a HF config.json")
    g.add_argument("--hardware", default=S, help="built-in hardware profile (h100-sxm, ...) or path to a profile")
    g.add_argument(
        "--engine-overheads",
        metavar="NAME",
        default=S,
        help="a serving engine's host overheads in place of the profile's: vllm-v1, trt-llm, vllm-v0, eager "
        "(hwprofiles/engines.yaml)",
    )
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=S, help="GPUs per replica (default 1)")
    g.add_argument(
        "--pipeline-parallel-size", "-pp", type=int, default=S, help="pipeline stages per replica (default 1)"
    )
    g.add_argument(
        "--data-parallel-size",
        "-dp",
        type=int,
        default=S,
        help="data-parallel ranks, each an engine of its own behind the router; MoE layers span them (default 1)",
    )
    g.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        default=S,
        help="MoE: whole experts per GPU over tensor x data-parallel GPUs, not each expert split",
    )
    g.add_argument("--dtype", default=S, help="auto (the config's torch_dtype), bfloat16, float16, float32")
    g.add_argument("--kv-cache-dtype", default=S, help="auto (= dtype) or fp8")
    g.add_argument("--quantization", default=S, help=QUANTIZATION_HELP)
    g.add_argument("--gpu-memory-utilization", type=float, default=S, help="share of GPU memory used (0.9)")
    g.add_argument("--block-size", type=int, default=S, help="tokens per KV-cache block (16)")
    g.add_argument("--num-gpu-blocks-override", type=int, default=S, help="use this many KV blocks")
    g.add_argument(
        "--kv-watermark",
        "--watermark",
        dest="kv_watermark",
        type=float,
        default=S,
        help="share of KV blocks admission leaves free while something runs (the engine's: 0.01 V0, 0 V1)",
    )

    g.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=S,
        help="continuous, chunked: reuse the KV blocks of a prefix already computed (vLLM's automatic prefix caching; "
        "default as `vllm serve` of --vllm-defaults: on in V1)",
    )

    if cluster:
        g = p.add_argument_group("cluster")
        g.add_argument("--replicas", type=int, default=S, help="replicas of this configuration behind a router (1)")
        g.add_argument(
            "--router",
            default=S,
            help="round_robin (default), random, least_requests, least_tokens, least_kv, power_of_two, "
            "prefix_affinity, or module:Class",
        )
        g.add_argument("--router-seed", type=int, default=S, help="seed of the random and power_of_two routers (0)")
    if simulator and cluster:
        add_disagg_flags(p)
    g = p.add_argument_group("scheduler")
    g.add_argument(
        "--policy", default=S, help=f"{', '.join(policies.names())} or module:Class (chunked: what `vllm serve` runs)"
    )
    g.add_argument("--max-model-len", type=int, default=S, help="max prompt+output tokens (model's context)")
    g.add_argument(
        "--vllm-defaults",
        metavar="VERSION",
        default=S,
        help=f"vLLM release whose `vllm serve` defaults for the device fill the limits not given ({LATEST})",
    )
    g.add_argument("--max-num-seqs", type=int, default=S, help="max sequences per iteration (vLLM's for the device)")
    g.add_argument(
        "--max-num-batched-tokens", type=int, default=S, help="max tokens per iteration (vLLM's for the device)"
    )
    g.add_argument("--long-prefill-token-threshold", type=int, default=S, help="chunked: max chunk per request")
    g.add_argument(
        "--long-prefill-token-threshold-adaptive",
        action="store_true",
        default=S,
        help="chunked: floor the threshold at the budget / requests running and waiting (vLLM >= 0.31)",
    )
    g.add_argument(
        "--scheduler-reserve-full-isl",
        action=argparse.BooleanOptionalAction,
        default=S,
        help="chunked: admit a request only if its whole prompt fits the free KV cache (vLLM >= 0.19), or only its "
        "first chunk (--no-...)",
    )
    g.add_argument(
        "--chunked-order",
        choices=CHUNKED_ORDERS,
        default=S,
        help="chunked: vllm (one pass over running requests, V1) or decodes-first (Sarathi-Serve) (vllm)",
    )
    g.add_argument("--mix-prefill-decode", action="store_true", default=S, help="continuous: mix in one iteration")
    g.add_argument("--max-batch-size", type=int, default=S, help="static, dynamic: requests per batch (8)")
    g.add_argument(
        "--max-delay-ms", type=float, default=S, help="dynamic: longest wait of the oldest request (0, Triton's)"
    )
    g.add_argument(
        "--preferred-batch-sizes", type=int, nargs="+", default=S, help="dynamic: sizes sent at once (Triton)"
    )
    g.add_argument(
        "--speculative-config",
        metavar="JSON",
        default=S,
        help='speculative decoding, as vllm serve takes it: \'{"method": "eagle3", "num_speculative_tokens": 3}\' '
        "(eagle, eagle3, mtp, ngram, draft_model with its model; synthetic_acceptance_rates; chunked, or continuous "
        "--mix-prefill-decode)",
    )
    g.add_argument(
        "--kv-reservation",
        choices=("paged", "output", "max_model_len"),
        default=S,
        help="KV per request at admission: paged (grow, preempt when full), or reserve prompt+output (an oracle) or "
        "max_model_len up front (default: paged; output for static and dynamic)",
    )

    g = p.add_argument_group("workload")
    g.add_argument("--trace", type=Path, default=S, help="trace file to replay instead of synthetic requests")
    g.add_argument("--trace-format", choices=FORMATS, default=S, help="trace file format (auto)")
    g.add_argument("--trace-time-scale", type=float, default=S, help="replay speed-up factor (1)")
    g.add_argument(
        "--sort-trace", action="store_true", default=S, help="sort a trace by arrival (stable) instead of refusing it"
    )
    g.add_argument("--num-prompts", type=int, default=S, help="requests (synthetic: 1000; trace: first N)")
    g.add_argument(
        "--request-rate", type=float, default=S, help="requests/s, inf = all at once (inf, as `vllm bench serve`)"
    )
    g.add_argument(
        "--max-concurrency",
        type=int,
        default=S,
        help="requests in flight at most (`vllm bench serve`'s flag): each waits for one of N slots; with no "
        "--request-rate, N clients in a closed loop",
    )
    g.add_argument("--burstiness", type=float, default=S, help="gamma shape of inter-arrivals, 1 = Poisson")
    g.add_argument(
        "--input-len",
        default=S,
        help="prompt tokens: N, uniform:LO:HI, lognormal:median=M,sigma=S, "
        "zipf:a=A,max=X, empirical:PATH:COLUMN (1024)",
    )
    g.add_argument("--output-len", default=S, help="output tokens, same forms (128)")
    g.add_argument(
        "--lengths-from",
        type=Path,
        default=S,
        help="resample (prompt, output) pairs from a trace or lengths CSV instead of --input-len/--output-len",
    )
    g.add_argument("--lengths-max-total", type=int, default=S, help="with --lengths-from: drop longer rows")
    g.add_argument("--seed", type=int, default=S, help="seed of the synthetic workload (0)")
    g.add_argument(
        "--prefix-len", type=int, default=S, help="synthetic: tokens of a shared prompt before each --input-len (0)"
    )
    g.add_argument(
        "--num-prefix-groups", type=int, default=S, help="synthetic: distinct shared prompts, one drawn per request (1)"
    )
    g.add_argument(
        "--turns",
        type=int,
        default=S,
        help="synthetic: turns per conversation (each of --num-prompts starts one; a turn's prompt is the "
        "conversation so far plus a new --input-len message) (1)",
    )
    g.add_argument(
        "--think-time", dest="think_time_s", type=float, default=S, help="with --turns: mean s between turns (0)"
    )
    g.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=S,
        help="clients receive tokens as made; --no-stream: whole responses when a request gives back its seat "
        "(default: stream, except static and dynamic)",
    )
    if not simulator:
        return
    g = p.add_argument_group("simulator")
    g.add_argument(
        "--engine",
        choices=("auto", "compiled", "reference"),
        default=S,
        help="compiled (numba, built-in policies), reference (policy objects on SimPy); same records",
    )
    g.add_argument(
        "--itl",
        choices=("auto", "exact", "histogram"),
        default=S,
        help="keep every inter-token gap, or a 0.5%%-error histogram (auto: exact up to 20M gaps)",
    )
    g.add_argument(
        "--goodput", nargs="+", default=S, metavar="NAME:MS", help="SLOs for request_goodput: ttft:MS tpot:MS e2el:MS"
    )
    g.add_argument(
        "--record-batches",
        action="store_true",
        default=S,
        help="also write batches.csv: who took part in each iteration, with their tokens (one row per token made)",
    )


_NOT_FIELDS = {"command", "func", "config", "out", "json", "debug", "force", "allow_import", "format"}


def config_from_args(args: argparse.Namespace, not_fields: frozenset[str] = frozenset()) -> RunConfig:
    """The run config the flags (and ``--config FILE``) describe; ``not_fields`` are a command's own flags."""
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if k not in _NOT_FIELDS | not_fields}
    if "goodput" in overrides:
        overrides["goodput"] = parse_goodput(overrides["goodput"])
    from_flags = [v for v in overrides.values() if user_code.is_user_code(v)]
    overrides = disagg_overrides(overrides)
    if args.config is not None:
        config = RunConfig.load(args.config, overrides)
    else:
        config = RunConfig.model_validate(overrides)
    source = str(args.config) if args.config is not None else None
    user_code.admit(user_code.named_in(config), args.command, source, getattr(args, "allow_import", False), from_flags)
    return config


def main(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    outputs.check(args.out, RUN_OUTPUTS, "run", args.force)
    progress = Progress()
    try:
        result = run_simulation(config, on_progress=progress)
    finally:
        progress.close()
    paths = write_outputs(result, args.out, args.force, fmt=args.format)
    if result.summary.get("overload"):
        print(f"ferry run: {overload_notice(result.summary['overload'])}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.summary, indent=2))
    else:
        print(format_summary(result.summary))
        print(f"wrote {', '.join(str(p) for p in paths)}")
    if not result.summary.get("completed"):  # written, but nothing was served: a script must not read it as a result
        why = ", ".join(f"{n:,} {k}" for k, n in (result.summary.get("rejected_by_reason") or {}).items())
        print(f"ferry run: no request completed (rejected: {why or 'none arrived'}); exit status {NOTHING_COMPLETED}",
              file=sys.stderr)  # fmt: skip
        return NOTHING_COMPLETED
    return 0


NOTHING_COMPLETED = 3  # the exit status of a run whose every request was rejected (its outputs are written)
