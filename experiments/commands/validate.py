"""`ferry validate`: serve a trace for real on a model, simulate the same trace and policy, and compare.

    ferry validate --model tiny-llama --hardware PROFILE.yaml [--device cpu] [--threads 1] --policy chunked \\
        --max-num-seqs 16 --max-num-batched-tokens 256 --num-prompts 24 --request-rate 6 \\
        --input-len uniform:32:192 --output-len uniform:8:48 --out validate/

The real run builds the model from its config.json with random weights (``experiments.real.llama``) on ``--device`` and
replays the workload in real time (``experiments.real.executor``): every batch the policy chooses is executed, and the
records are written as ``ferry run`` writes them, with measured times. The simulated run replays the same requests
through the same policy object, each iteration timed by the cost model with the profile: the same turn
(``sim.engine.decide``, then ``SchedulerState.complete``), a simulated clock instead of a real one. Both are
summarised alike; the command prints them side by side with the relative error (simulated / real - 1), and the error
of the cost model on each iteration the real run executed (its shape predicted, against its measured time).

Writes ``OUT/real/`` and ``OUT/sim/`` (``summary.json``, ``requests.csv``, ``iterations.csv`` as ``ferry run``),
``OUT/iterations.csv`` (each real iteration's shape, measured and predicted seconds) and ``OUT/comparison.json``.
The profile should come from ``ferry calibrate`` on the same device with the same threads and dtype.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import policies
from costmodel import load_hardware
from costmodel.calibration import kernels as K
from costmodel.hardware import HardwareProfile
from experiments import outputs, user_code
from experiments.commands.run import add_run_arguments, config_from_args
from experiments.config import RunConfig
from experiments.real.client import REQUEST_TIMEOUT_S
from experiments.real.executor import Executor, replay
from experiments.real.llama import Llama
from experiments.simulation import RunResult, build_replica, build_workload, write_outputs
from sim.engine import simulate

S = argparse.SUPPRESS

# what is compared: (summary key, label)
COMPARED = (
    ("median_ttft_ms", "Median TTFT (ms)"),
    ("p90_ttft_ms", "P90 TTFT (ms)"),
    ("median_tpot_ms", "Median TPOT (ms)"),
    ("p90_tpot_ms", "P90 TPOT (ms)"),
    ("median_itl_ms", "Median ITL (ms)"),
    ("p90_itl_ms", "P90 ITL (ms)"),
    ("median_e2el_ms", "Median E2E latency (ms)"),
    ("p90_e2el_ms", "P90 E2E latency (ms)"),
    ("duration", "Duration (s)"),
    ("request_throughput", "Request throughput (req/s)"),
    ("output_throughput", "Output throughput (tok/s)"),
    ("gpu_idle_fraction", "Idle fraction"),
    ("num_iterations", "Iterations"),
    ("mean_batch_size", "Mean batch size (seqs)"),
)


ABSOLUTE = ("gpu_idle_fraction",)  # compared by difference (sim - real), not ratio


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "validate",
        help="serve a workload on a real model and compare with its simulation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, default=None, help="YAML run config (the fields of `ferry run`)")
    p.add_argument("--out", type=Path, default=Path("validate"), help="folder for real/, sim/ and the comparison")
    p.add_argument("--force", action="store_true", help="write into --out even if it holds other files")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:INDEX (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: the profile's calibration's)")
    p.add_argument("--model-seed", type=int, default=0, help="seed of the model's random weights and prompts")
    p.add_argument("--json", action="store_true", help="print comparison.json instead of the table")
    g = p.add_argument_group("a live server instead of ferry's executor")
    g.add_argument(
        "--url",
        default=None,
        help="replay the workload against this OpenAI-compatible server (http://HOST:PORT/v1), streamed, open loop",
    )
    g.add_argument("--served-model-name", default=None, help="--url: the model's name on the server (default --model)")
    g.add_argument("--max-concurrency", type=int, default=None, help="--url: requests open at once (default: no cap)")
    g.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="--url: seconds a request waits for its response, then for each next token, before it fails "
        f"(default {REQUEST_TIMEOUT_S:g})",
    )
    add_run_arguments(p, simulator=False)
    user_code.add_flag(p)
    p.set_defaults(func=handle)


_OWN_FLAGS = frozenset({"device", "threads", "model_seed", "force", "url", "served_model_name", "max_concurrency",
                        "timeout"})  # fmt: skip


@dataclass
class Validation:
    """A real run and its simulation, with the cost model's error on each real iteration."""

    real: RunResult
    sim: RunResult
    comparison: dict[str, Any]  # per compared key: real, simulated, relative error; and the iteration errors
    iterations: pd.DataFrame  # each real iteration: shape, measured and predicted seconds


def handle(args: argparse.Namespace) -> int:
    config = config_from_args(args, _OWN_FLAGS)
    outputs.check(args.out, VALIDATE_OUTPUTS, "validate", args.force)
    if args.url is not None:
        from experiments.commands.validate_url import validate_url

        name = args.served_model_name or config.model
        timeout = REQUEST_TIMEOUT_S if args.timeout is None else args.timeout
        result = validate_url(config, args.url, name, seed=args.model_seed, concurrency=args.max_concurrency,
                              timeout_s=timeout)  # fmt: skip
    elif args.timeout is not None:
        raise ValueError(f"--timeout {args.timeout:g}: it bounds a live server's requests; give --url, or drop it")
    else:
        result = validate(config, device=args.device, threads=args.threads, seed=args.model_seed)
    paths = write_validation(result, args.out, args.force)
    if args.json:
        print(json.dumps(result.comparison, indent=2))
    else:
        print(format_comparison(result.comparison))
        print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def calibration_setting(hardware: HardwareProfile, key: str) -> str | None:
    settings = hardware.provenance.settings or {}
    return settings.get(key) or None


def validate(config: RunConfig, *, device: str = "cpu", threads: int | None = None, seed: int = 0) -> Validation:
    """Serve ``config``'s workload for real and in simulation with one policy object; compare."""
    torch = K.require_torch()
    hardware = load_hardware(config.hardware)
    dtype = config.dtype if config.dtype != "auto" else calibration_setting(hardware, "dtype") or "float32"
    config = config.model_copy(update={"dtype": dtype})
    if threads is None and calibration_setting(hardware, "threads"):
        threads = int(calibration_setting(hardware, "threads") or 0)
    if threads:
        torch.set_num_threads(threads)
    if config.tensor_parallel_size != 1:
        raise ValueError("the real executor runs on one device: use --tensor-parallel-size 1")
    if config.quantization is not None or config.kv_cache_dtype != "auto":
        raise ValueError("the real executor keeps weights and KV cache in --dtype: no quantization or kv_cache_dtype")
    if config.disaggregation is not None or config.num_replicas != 1:
        raise ValueError("the real executor is one replica: no disaggregation or replicas")
    replica = build_replica(config)
    config, cost = replica.config, replica.cost
    workload = build_workload(config)
    policy = policies.get(config.scheduler)  # the one policy object both runs use

    # the real run
    longest = int((workload.prompt_tokens + workload.output_tokens).max()) if len(workload.arrival_s) else 1
    max_len = min(longest, config.scheduler.max_model_len) + 1
    llama = Llama.build(config.model, device, dtype, max_len=max_len, seed=seed)
    requests, kv = replica.new_requests(workload)
    seats = min(len(requests), max(config.scheduler.seq_limit, config.scheduler.max_batch_size))
    executor = Executor(llama, requests, np.random.default_rng(seed), slots=seats)
    real_run = replay(requests, policy, executor, kv, config.scheduler.max_model_len, stream=config.stream)
    real = replica.result(workload, real_run.records, f"real: {K.device_of(device).type}, {replica.model.name}")
    real.summary["device"] = _device_words(device)

    # the simulated run: the same policy object on the reference engine (the compiled one runs a numba twin)
    requests, kv = replica.new_requests(workload)
    simulated = simulate(requests, policy, cost, kv, config.scheduler.max_model_len, "reference", stream=config.stream)
    sim = replica.result(workload, simulated)

    measured = real_run.durations()
    predicted = np.array([cost.iteration_time(s) for s in real_run.shapes])
    iterations = pd.DataFrame(
        {
            "prefill_seqs": [len(s.prefill_new) for s in real_run.shapes],
            "prefill_tokens": [s.num_prefill_tokens for s in real_run.shapes],
            "decode_seqs": [s.num_decode_seqs for s in real_run.shapes],
            "context_tokens": [int(s.prefill_ctx.sum() + s.decode_ctx.sum()) for s in real_run.shapes],
            "measured_s": measured,
            "forward_s": real_run.forward_s,
            "predicted_s": predicted,
        }
    )
    comparison = compare(real.summary, sim.summary, measured, predicted)
    comparison["profile"] = hardware.name
    if hardware.kind != "calibrated":
        comparison["note"] = (
            f"{hardware.name} is a {hardware.kind} profile: calibrate this device for a fair comparison"
        )
    comparison["policy"] = config.scheduler.policy
    comparison["workload"] = workload.source
    return Validation(real, sim, comparison, iterations)


def _device_words(device: str) -> str:
    from costmodel.calibration.device import describe

    return describe(K.device_of(device))[0]


def compare(real: dict[str, Any], sim: dict[str, Any], measured: np.ndarray, predicted: np.ndarray) -> dict[str, Any]:
    """Side by side: each compared summary value real and simulated with the relative error (sim / real - 1); and the
    cost model's error on the real iterations (predicted / measured - 1)."""
    rows = {}
    for key, label in COMPARED:
        r, s = real.get(key), sim.get(key)
        both = isinstance(r, (int, float)) and isinstance(s, (int, float))
        rf, sf = (float(r), float(s)) if both else (math.nan, math.nan)  # type: ignore[arg-type]
        if key in ABSOLUTE:  # a share near 0: its difference says more than its ratio
            rows[key] = {"label": label, "real": r, "sim": s, "abs_error": (sf - rf) if both else None}
        else:
            rows[key] = {"label": label, "real": r, "sim": s, "rel_error": (sf / rf - 1.0) if both and rf else None}
    err = predicted / measured - 1.0 if len(measured) else np.zeros(0)
    iteration = {
        "n": int(len(err)),
        "median_abs_rel_error": float(np.median(np.abs(err))) if len(err) else None,
        "p90_abs_rel_error": float(np.percentile(np.abs(err), 90)) if len(err) else None,
        "median_rel_error": float(np.median(err)) if len(err) else None,
        "total_rel_error": float(predicted.sum() / measured.sum() - 1.0) if len(err) else None,
    }
    return {"metrics": rows, "iterations": iteration}


def format_comparison(c: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        return f"{v:,}"

    lines = [
        f"ferry validate: {c['policy']} on {c['workload']}"
        + (f" against {c['url']}" if "url" in c else "")
        + f"; simulated with {c['profile']}",
        *([f"note: {c['note']}"] if "note" in c else []),
        *([f"failed: {c['failed']['n']} requests ({c['failed']['first']})"] if "failed" in c else []),
        f"{'':<30} {'real':>12} {'simulated':>12} {'sim/real-1':>11}  (idle fraction: sim - real)",
    ]
    for row in c["metrics"].values():
        if "abs_error" in row:
            diff = row["abs_error"]
            e = "-" if diff is None else f"{diff:+.3f}"
        else:
            err = row["rel_error"]
            e = "-" if err is None or not math.isfinite(err) else f"{100 * err:+.1f}%"
        lines.append(f"{row['label']:<30} {fmt(row['real']):>12} {fmt(row['sim']):>12} {e:>11}")
    it = c["iterations"]
    if it["n"]:
        lines.append(
            f"cost model on the {it['n']} real iterations: median |err| {100 * it['median_abs_rel_error']:.1f}%, "
            f"p90 {100 * it['p90_abs_rel_error']:.1f}%, median {100 * it['median_rel_error']:+.1f}%, "
            f"total time {100 * it['total_rel_error']:+.1f}%"
        )
    return "\n".join(lines)


VALIDATE_OUTPUTS = ("real", "sim", "iterations.csv", "comparison.json")


def write_validation(v: Validation, out: Path, force: bool = False) -> list[Path]:
    """Write ``real/`` and ``sim/`` (the files `ferry run` writes), ``iterations.csv`` and, last,
    ``comparison.json`` into ``out``."""
    comparison = json.dumps(v.comparison, indent=2) + "\n"
    outputs.prepare(out, VALIDATE_OUTPUTS, "validate", force)
    paths = write_outputs(v.real, out / "real", command="validate") + write_outputs(
        v.sim, out / "sim", command="validate"
    )
    if not v.iterations.empty:  # a live server's iterations are not seen (``--url``)
        paths.append(outputs.write_frame(out / "iterations.csv", v.iterations))
    paths.append(outputs.write_text(out / "comparison.json", comparison))
    return paths
