"""`ferry run`: simulate one replica serving a workload under a batching policy, print and write the results."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import policies
from experiments import outputs, user_code
from experiments.commands.disagg_cli import add_disagg_flags, disagg_overrides, disagg_rows
from experiments.config import RunConfig
from experiments.progress import Progress
from experiments.simulation import RUN_OUTPUTS, run_simulation, write_outputs
from policies.config import CHUNKED_ORDERS, ITERATION_LIMITED, WHOLE_BATCHES
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
    p.add_argument("--json", action="store_true", help="print summary.json to stdout instead of the table")
    p.add_argument("--force", action="store_true", help="write into --out even if it holds files that are not a run's")
    user_code.add_flag(p)

    add_run_arguments(p)
    p.set_defaults(func=main)


def add_run_arguments(p: argparse.ArgumentParser, simulator: bool = True) -> None:
    """The fields of a run config as flags (vLLM's names), in groups; flags not given override nothing. ``simulator``
    adds the simulator's own (engine, ITL keeping, goodput SLOs)."""
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
    g.add_argument("--dtype", default=S, help="auto (the config's torch_dtype), bfloat16, float16, float32")
    g.add_argument("--kv-cache-dtype", default=S, help="auto (= dtype) or fp8")
    g.add_argument("--quantization", default=S, help="weight quantization: fp8, int8, int4")
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
        action="store_true",
        default=S,
        help="continuous, chunked: reuse the KV blocks of a prefix already computed (vLLM's automatic prefix caching)",
    )

    g = p.add_argument_group("cluster")
    g.add_argument("--replicas", type=int, default=S, help="replicas of this configuration behind a router (1)")
    g.add_argument(
        "--router",
        default=S,
        help="round_robin (default), random, least_requests, least_tokens, least_kv, power_of_two, prefix_affinity, "
        "or module:Class",
    )
    g.add_argument("--router-seed", type=int, default=S, help="seed of the random and power_of_two routers (0)")
    if simulator:
        add_disagg_flags(p)
    g = p.add_argument_group("scheduler")
    g.add_argument("--policy", default=S, help=f"{', '.join(policies.names())} or module:Class (continuous)")
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
    g.add_argument("--request-rate", type=float, default=S, help="requests/s, inf = all at once (inf)")
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


_NOT_FIELDS = {"command", "func", "config", "out", "json", "debug", "force", "allow_import"}


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
    paths = write_outputs(result, args.out, args.force)
    if result.summary.get("overload"):
        print(f"ferry run: {overload_notice(result.summary['overload'])}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.summary, indent=2))
    else:
        print(format_summary(result.summary))
        print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        return f"{value:,.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def scheduler_rows(s: dict[str, Any]) -> list[tuple[str, Any]]:
    """The header lines that say what the policy ran with: its limits (and whose defaults they are), the KV
    admission rule and watermark, and how responses reach the client."""
    cfg = s["config"]
    sched = cfg["scheduler"]
    policy = sched["policy"]
    vllm = s.get("vllm_defaults") or {}
    applied = set(vllm.get("applied", ()))

    def mark(field: str) -> str:
        return f" (vLLM {vllm['release']})" if field in applied else ""

    rows: list[tuple[str, Any]] = []
    if policy in ITERATION_LIMITED:
        if applied:
            rows.append(("`vllm serve` defaults", f"{vllm['release']} {vllm['engine']}, {vllm['tier']}"))
        rows.append(("Max num seqs", f"{sched['max_num_seqs']:,}{mark('max_num_seqs')}"))
        rows.append(("Max num batched tokens", f"{sched['max_num_batched_tokens']:,}{mark('max_num_batched_tokens')}"))
        if policy == "chunked":
            admission = "whole prompt fits" if sched["scheduler_reserve_full_isl"] else "first chunk fits"
            rows.append(("KV admission", f"{admission}{mark('scheduler_reserve_full_isl')}"))
            rows.append(("Order of running requests", sched["chunked_order"]))
    elif policy in WHOLE_BATCHES:
        rows.append(("Max batch size", sched["max_batch_size"]))
        if policy == "dynamic":
            preferred = sched["preferred_batch_sizes"] or [sched["max_batch_size"]]
            rows.append(
                ("Max delay (ms) / preferred sizes", f"{sched['max_delay_ms']:g} / {','.join(map(str, preferred))}")
            )
    if cfg.get("kv_watermark") is not None:
        rows.append(("KV watermark", f"{cfg['kv_watermark']:g}{mark('kv_watermark')}"))
    whole = "whole, when the batch ends" if policy in WHOLE_BATCHES else "whole, at the last token"
    rows.append(("Responses", "streamed" if cfg["stream"] else whole))
    return rows


def cluster_rows(s: dict[str, Any]) -> list[tuple[str, Any]]:
    """A cluster's header lines: replicas and router, then each replica's share (none for a single replica); a
    disaggregated run's pools and KV transfers."""
    if "pools" in s:
        return disagg_rows(s)
    if "replicas" not in s:
        return []
    cfg = s["config"]
    rows: list[tuple[str, Any]] = [
        ("Replicas / router", f"{s['num_replicas']} ({s['num_gpus']} GPUs), {cfg['router']}")
    ]
    for r in s["replicas"]:
        p99 = r["p99_ttft_ms"]
        rows.append(
            (
                f"  replica {r['replica']} ({r.get('hardware', '')} x{r['gpus']})",
                f"{r['completed']:,} requests, busy {r['utilization']:.0%}, p99 TTFT "
                f"{'-' if p99 is None else f'{p99:,.0f}'} ms, peak KV {r['peak_kv_usage']:.0%}",
            )
        )
    return rows


def _kv_cache(mem: dict[str, Any]) -> str:
    tokens = mem["num_gpu_blocks"] * mem["block_size"]
    return (f"{mem['num_gpu_blocks']:,} blocks x {mem['block_size']} = {tokens:,} tokens "
            f"({mem['kv_cache_bytes'] / 2**30:.1f} GiB/GPU)")  # fmt: skip


def _placement(s: dict[str, Any], engine: str) -> str:
    """What ran where: the model, the device, tensor parallelism and, for a cluster, its replicas and GPUs."""
    cfg = s["config"]
    if "pools" in s:  # disaggregated: each pool is described below
        return f"{s['model']} on {s['hardware']}"
    replicas, tp = int(s.get("num_replicas", 1)), cfg["tensor_parallel_size"]
    if replicas == 1:
        return f"{s['model']} on {s['hardware']}, TP {tp}{engine}"
    gpus = s.get("num_gpus", replicas * tp)
    if s.get("replica_groups"):  # each group says its device and TP below
        return f"{s['model']} on {replicas} replicas ({s['hardware']}), {gpus} GPUs{engine}"
    device = str(s["hardware"]).rsplit(" x", 1)[0]
    return f"{s['model']} on {replicas} replicas of {device}, TP {tp} each ({gpus} GPUs){engine}"


def format_summary(s: dict[str, Any]) -> str:
    """A readable table of the summary, in sections, like `vllm bench serve` prints."""
    cfg = s["config"]
    sched = cfg["scheduler"]
    mem = s["memory"]
    groups = s.get("replica_groups")
    engine = f" ({cfg['engine_overheads']} overheads)" if cfg.get("engine_overheads") else ""
    replica_rows: list[tuple[str, Any]] = [
        ("Model / hardware", _placement(s, engine)),
        ("Policy", sched["policy"]),
        *scheduler_rows(s),
        ("Workload", s["workload"]),
        ("KV cache per replica", _kv_cache(mem)),
        ("Weights per GPU (GiB)", mem["weight_bytes_per_gpu"] / 2**30),
    ]
    if groups:  # each group says its own device and limits
        replica_rows = [("Model / hardware", f"{s['model']} on {s['hardware']}"), ("Workload", s["workload"])]
        for k, g in enumerate(groups):
            gs = g["scheduler"]
            limits = f", max_num_seqs {gs['max_num_seqs']}, tokens {gs['max_num_batched_tokens']}" \
                if gs.get("max_num_seqs") else ""  # fmt: skip
            replica_rows.append((f"Group {k}: {g['count']} x {g['hardware']} tp{g['tensor_parallel_size']}",
                                 f"{gs['policy']}{limits}; KV {_kv_cache(g['memory'])}"))  # fmt: skip
    rows: list[tuple[str, Any] | str] = [
        "ferry run",
        *replica_rows,
        ("Engine", f"{s['engine']}, ITL {s['itl_kept']}"),
        *cluster_rows(s),
        "Serving",
        ("Successful requests", s["completed"]),
        ("Failed (rejected) requests", s["failed"]),
    ]
    rows += [(f"  rejected: {k}", v) for k, v in s["rejected_by_reason"].items()]
    rows += [
        ("Benchmark duration (s)", s["duration"]),
        ("Total input tokens", s["total_input_tokens"]),
        ("Total generated tokens", s["total_output_tokens"]),
        ("Request throughput (req/s)", s["request_throughput"]),
        ("Output token throughput (tok/s)", s["output_throughput"]),
        ("Total token throughput (tok/s)", s["total_token_throughput"]),
    ]
    if "request_goodput" in s:
        rows.append(("Request goodput (req/s)", s["request_goodput"]))
    for name, title in (
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st)"),
        ("itl", "Inter-token Latency"),
        ("e2el", "End-to-end Latency"),
        ("queueing", "Queueing delay"),
    ):
        rows.append(title)
        rows += [
            (f"{stat.capitalize()} {name.upper()} (ms)", s[f"{stat}_{name}_ms"])
            for stat in ("mean", "median", "p90", "p99")
        ]
    if not s.get("stream", True):  # what the server made, which the client received only with the whole response
        rows.append("Server side (when tokens were made)")
        rows += [
            (f"{stat.capitalize()} server {name.upper()} (ms)", s[f"{stat}_server_{name}_ms"])
            for name in ("ttft", "tpot")
            for stat in ("mean", "median", "p99")
        ]
    rows += [
        "Batching",
        ("Iterations", s["num_iterations"]),
        ("Mean batch size (seqs)", s["mean_batch_size"]),
        ("Mean tokens per iteration", s["mean_tokens_per_iteration"]),
        ("GPU idle (s)", s["gpu_idle_s"]),
        ("GPU idle fraction", s["gpu_idle_fraction"]),
        ("Idle while requests wait (s)", s["idle_while_waiting_s"]),
        ("Seat utilization", s["seat_utilization"]),
        ("Held seats (done, waiting for batch)", s["held_seat_fraction"]),
        ("Peak / mean KV usage", f"{_fmt(s['peak_kv_usage'])} / {_fmt(s['mean_kv_usage'])}"),
        ("Preemptions", s["total_preemptions"]),
        ("Recomputed tokens", s["recomputed_tokens"]),
    ]
    width, label_width = 60, 36
    lines = []
    for row in rows:
        if isinstance(row, str):
            lines.append(f"{' ' + row + ' ':=^{width}}")
        else:
            label, value = row
            text = _fmt(value)
            lines.append(f"{label + ':':<{label_width}}{text:>{max(width - label_width, len(text) + 1)}}")
    lines.append("=" * width)
    return "\n".join(lines)
