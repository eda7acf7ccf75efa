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
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import policies
from costmodel import load_hardware
from costmodel.calibration import kernels as K
from experiments.commands.run import add_run_arguments, config_from_args
from experiments.real.client import REQUEST_TIMEOUT_S
from experiments.real.executor import Executor, replay
from experiments.real.llama import Llama
from experiments.runner import outputs, user_code
from experiments.runner.config import RunConfig
from experiments.runner.simulation import build_replica, build_workload
from experiments.runner.validation import (
    VALIDATE_OUTPUTS,
    Validation,
    calibration_setting,
    compare,
    format_comparison,
    write_validation,
)
from sim.engine import simulate

S = argparse.SUPPRESS


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
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:INDEX (default cpu; not with --url)")
    p.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: the profile's calibration's; not with --url)"
    )
    p.add_argument("--model-seed", type=int, default=0, help="seed of the model's random weights and prompts")
    p.add_argument("--json", action="store_true", help="print comparison.json instead of the table")
    g = p.add_argument_group("a live server instead of ferry's executor")
    g.add_argument(
        "--url",
        default=None,
        help="replay the workload against this OpenAI-compatible server (http://HOST:PORT/v1), streamed, open loop",
    )
    g.add_argument("--served-model-name", default=None, help="--url: the model's name on the server (default --model)")
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


_OWN_FLAGS = frozenset({"device", "threads", "model_seed", "force", "url", "served_model_name", "timeout"})


def _check_flags(args: argparse.Namespace) -> None:
    """A flag of the side that does not run is refused, not ignored: ferry's executor's (``--device``,
    ``--threads``) with ``--url``, a live server's without it."""
    if args.url is not None:
        for flag, value in (("--device", args.device), ("--threads", args.threads)):
            if value is not None:
                raise ValueError(
                    f"{flag} {value}: it sets ferry's own executor, which --url does not run (the server runs its "
                    "model where it was started); drop it"
                )
        return
    if args.timeout is not None:
        raise ValueError(f"--timeout {args.timeout:g}: it bounds a live server's requests; give --url, or drop it")
    for flag, value in (("--served-model-name", args.served_model_name),
                        ("--max-concurrency", getattr(args, "max_concurrency", None))):  # fmt: skip
        if value is not None:
            raise ValueError(f"{flag} {value}: it is for a live server's requests; give --url, or drop it")


def handle(args: argparse.Namespace) -> int:
    config = config_from_args(args, _OWN_FLAGS)
    outputs.check(args.out, VALIDATE_OUTPUTS, "validate", args.force)
    _check_flags(args)
    if args.url is not None:
        from experiments.commands.validate_url import validate_url

        name = args.served_model_name or config.model
        timeout = REQUEST_TIMEOUT_S if args.timeout is None else args.timeout
        result = validate_url(config, args.url, name, seed=args.model_seed, timeout_s=timeout)
    else:
        result = validate(config, device=args.device or "cpu", threads=args.threads, seed=args.model_seed)
    paths = write_validation(result, args.out, args.force)
    if args.json:
        print(json.dumps(result.comparison, indent=2))
    else:
        print(format_comparison(result.comparison))
        print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def validate(config: RunConfig, *, device: str = "cpu", threads: int | None = None, seed: int = 0) -> Validation:
    """Serve ``config``'s workload for real and in simulation with one policy object; compare."""
    torch = K.require_torch()
    hardware = load_hardware(config.hardware)
    dtype = config.dtype if config.dtype != "auto" else calibration_setting(hardware, "dtype") or "float32"
    if config.enable_prefix_caching:
        raise ValueError("the real executor keeps each sequence's own KV: no --enable-prefix-caching")
    if config.workload.max_concurrency is not None:
        raise ValueError(
            f"--max-concurrency {config.workload.max_concurrency}: ferry's executor replays the arrivals as they are; "
            "give --url to replay with slots against a live server"
        )
    # the real executor caches no prefixes, so neither does its simulation (`vllm serve` would by default)
    config = config.model_copy(update={"dtype": dtype, "enable_prefix_caching": False})
    if threads is None and calibration_setting(hardware, "threads"):
        threads = int(calibration_setting(hardware, "threads") or 0)
    if threads:
        torch.set_num_threads(threads)
    if config.tensor_parallel_size != 1 or config.pipeline_parallel_size != 1:
        raise ValueError("the real executor runs on one device: use --tensor-parallel-size 1, no pipeline stages")
    if config.quantization is not None or config.kv_cache_dtype != "auto":
        raise ValueError("the real executor keeps weights and KV cache in --dtype: no quantization or kv_cache_dtype")
    if config.disaggregation is not None or config.num_replicas != 1:
        raise ValueError("the real executor is one replica: no disaggregation or replicas")
    if config.speculative_config is not None:
        raise ValueError("the real executor has no drafter: no speculative_config (ferry validate --url measures a "
                         "vllm serve that has one)")  # fmt: skip
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
