"""ferry against published end-to-end measurements of serving engines, per source: the end-to-end table of
docs/checks/published.md.

    python -m experiments.studies.end_to_end                 # every source (about 2 minutes on 2 cores)
    python -m experiments.studies.end_to_end --quick         # every 4th setting of each source
    python -m experiments.studies.end_to_end --hardware-suffix .datasheet   # the same runs on the datasheet profiles
    python -m experiments.studies.end_to_end --clients open  # fixed concurrency as evenly spaced arrivals (~35 min)

The sources, their settings and their citations are in ``experiments/studies/published.yaml``: NVIDIA TensorRT-LLM's
throughput tables (output tokens/s at an infinite rate, simulated with every request queued at once), and NVIDIA's
measured serving runs shipped in aiconfigurator-core 0.12.0 (``systems/silicon_sample.csv``, read from the installed
package: mean TTFT and TPOT at a fixed concurrency, simulated as that many clients in a closed loop, each sending its
next request when the last has ended, ten requests each). The profiles are fitted to NVIDIA's kernel tables only;
none of these numbers was fitted on. Each point is simulated with ``ferry run``'s code
(``experiments.runner.simulation.run_simulation``); the summary is, per source and metric, the median and p90 of
|ferry / published - 1| and the median signed error (< 0: ferry predicts less).

A fixed-concurrency TTFT depends on how the benchmark's clients send: a closed loop whose clients all start at once,
with requests of one length, stays in step (each round's requests arrive together and queue behind each other's
prefills), while clients whose lengths differ drift apart, and evenly spaced arrivals (``--clients open``) never
coincide. The silicon rows do not say how they were sent; where their benchmark is known (published.yaml's
``clients``: the InferenceMAX rows), ferry draws the lengths as its client drew them, over ``SEEDS`` workloads.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodel import kerneldb, strict_yaml
from sim.workload import Workload
from sim.workload.lengths import FixedLength, UniformLength, parse_length_spec

PUBLISHED = Path(__file__).with_name("published.yaml")
# silicon_sample.csv's model paths -> ferry's models; its systems -> ferry's devices
SILICON_MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
}
DEVICES = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
ENGINES = {"vllm": "", "sglang": ".sglang", "trtllm": ".trtllm"}
QUANTIZATION = {"fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}


# NVIDIA's NVFP4 export of each model with NVFP4 rows: Llama 3.1 70B and 3.3 70B have one shape, and 3.3's export is
# the one NVIDIA publishes (costmodel/models/README.md)
NVFP4_CHECKPOINTS = {"llama-3.1-70b": "llama-3.3-70b-nvfp4", "llama-3.3-70b": "llama-3.3-70b-nvfp4"}


def checkpoint(model: str, quant: str | None) -> tuple[str, str | None]:
    """(model, --quantization) of a row: NVFP4 weights come only from a checkpoint quantized offline (vLLM and
    TensorRT-LLM make none at load), so an nvfp4 row runs that checkpoint's config (``NVFP4_CHECKPOINTS``) with no
    --quantization; the others quantize the model's own at load."""
    if quant == "nvfp4":
        return NVFP4_CHECKPOINTS[model], None
    return model, quant


# TensorRT-LLM's throughput runs: its documented defaults (published.yaml, settings)
ROUNDS = 10  # requests each client of a fixed-concurrency run sends (the silicon runs' count is not published)
SEEDS = 3  # workloads drawn per point whose lengths are random: the prediction is their mean (the expected value)
TRTLLM_THROUGHPUT = {"policy": "chunked", "max_num_batched_tokens": 8192, "max_num_seqs": 2048,
                     "kv_reservation": "output", "gpu_memory_utilization": 0.95, "kv_cache_dtype": "fp8"}  # fmt: skip


@dataclass
class Point:
    """One published measurement and the run that reproduces its setting."""

    source: str
    metric: str  # a key of ferry's summary
    published: float
    config: dict[str, Any]  # RunConfig fields
    concurrency: int | None = None  # clients in a closed loop (None: the config's own arrivals)
    label: str = ""
    predicted: float = math.nan
    extra: dict[str, float] = field(default_factory=dict)
    seeds: int = 1  # workloads drawn (seeds 0, 1, ...); the prediction is the mean of their values


def trtllm_points(source: dict[str, Any]) -> list[Point]:
    out = []
    for model, profile, tp, quant, isl, osl, requests, value in source["points"]:
        ckpt, flag = checkpoint(model, quant)
        config = TRTLLM_THROUGHPUT | {"model": ckpt, "hardware": profile, "tensor_parallel_size": tp,
                                      "quantization": flag, "num_prompts": requests, "input_len": isl,
                                      "output_len": osl, "request_rate": math.inf}  # fmt: skip
        out.append(Point("trtllm-perf-overview", "output_throughput", float(value), config,
                         label=f"{model} {profile} tp{tp} {quant} {isl}/{osl}"))  # fmt: skip
    return out


def silicon_points(source: dict[str, Any] | None = None) -> list[Point]:
    """The rows of silicon_sample.csv ferry can run (dense Llama models, aggregated serving, devices it has), each
    with the client and server settings of the benchmark that measured it where ``source["clients"]`` (published.yaml)
    knows it by the row's ``silicon_data_source``: lengths drawn as its client draws them (``random_range_ratio``:
    uniform over int(r x L)..L, as vLLM's benchmark did until vllm-project/vllm PR #16126 of April 2025), its
    server flags per engine; otherwise fixed lengths and the engine's defaults."""
    if source is None:
        source = strict_yaml.load(PUBLISHED.read_text())["sources"]["nvidia-silicon"]
    known = source.get("clients", {})
    path = kerneldb.data_root() / "silicon_sample.csv"
    rows = pd.read_csv(path)
    rows = rows[rows["model_path"].isin(list(SILICON_MODELS)) & (rows["mode"] == "agg")]
    rows = rows[rows["system"].isin(list(DEVICES)) & (rows["pp_size"].fillna(1) == 1)]
    out = []
    for r in rows.itertuples(index=False):
        quant = QUANTIZATION.get(str(r.gemm_quant_mode)) if isinstance(r.gemm_quant_mode, str) else None
        concurrency = int(r.batch_size)
        ckpt, flag = checkpoint(SILICON_MODELS[r.model_path], quant)
        config: dict[str, Any] = {"model": ckpt,
                                  "hardware": DEVICES[r.system] + ENGINES[r.backend],
                                  "tensor_parallel_size": int(r.tp_size), "quantization": flag, "policy": "chunked",
                                  "input_len": int(r.isl), "output_len": int(r.osl)}  # fmt: skip
        if r.backend == "trtllm" and quant is not None:  # a ModelOpt checkpoint: its KV cache is FP8
            config["kv_cache_dtype"] = "fp8"
        bench = next((b for prefix, b in known.items() if str(r.silicon_data_source).startswith(prefix)), None)
        seeds = 1
        if bench is not None:
            ratio = float(bench["random_range_ratio"])
            if ratio < 1.0:
                config["input_len"] = f"uniform:{int(r.isl * ratio)}:{int(r.isl)}"
                config["output_len"] = f"uniform:{int(r.osl * ratio)}:{int(r.osl)}"
                seeds = SEEDS
            config.update(bench.get("server", {}).get(r.backend, {}))
            if r.backend in bench.get("max_num_seqs_is_concurrency", []):
                config["max_num_seqs"] = concurrency
        label = (f"{r.backend} {r.backend_version if isinstance(r.backend_version, str) else ''} "
                 f"{config['model']} {r.system} tp{int(r.tp_size)} {quant or 'bf16'} {int(r.isl)}/{int(r.osl)} "
                 f"c{concurrency}")  # fmt: skip
        name = f"nvidia-silicon ({r.backend}, {bench['name']})" if bench else f"nvidia-silicon ({r.backend})"
        for metric, value in (("mean_ttft_ms", r.silicon_ttft_ms), ("mean_tpot_ms", r.silicon_tpot_ms)):
            out.append(Point(name, metric, float(value), dict(config), concurrency, label, seeds=seeds))
    return out


def _summary(config: dict[str, Any]) -> dict[str, Any]:
    from experiments.runner.config import RunConfig
    from experiments.runner.simulation import run_simulation

    return run_simulation(RunConfig.model_validate(config), detail=False).summary


def clients(workload: Workload, concurrency: int) -> Workload:
    """``workload``'s requests sent by a closed loop of ``concurrency`` clients: each sends its first request at 0 and
    each next one the moment the response to its last has ended (client ``i`` sends rows ``i``, ``i + c``, ``i + 2c``,
    ...: sessions of independent requests, no think time), as a benchmark at a fixed concurrency runs (genai-perf's
    and aiperf's ``--concurrency``; ``vllm bench serve --max-concurrency`` with every request due at once gives the
    next free slot the next request: the same thing when all requests have one length, and the same in distribution
    when their lengths are drawn independently, since either way each ending response is followed at once by a
    request whose lengths nothing that came before decides)."""
    rows = np.arange(len(workload))
    after = np.where(rows >= concurrency, rows - concurrency, -1)
    arrival = np.where(after < 0, 0.0, np.nan)
    return Workload(arrival, np.asarray(workload.prompt_tokens), np.asarray(workload.output_tokens),
                    source=f"{workload.source}, closed loop of {concurrency} clients", after=after,
                    think_s=np.zeros(len(rows)))  # fmt: skip


def closed_loop(config: dict[str, Any], concurrency: int, rounds: int = ROUNDS) -> dict[str, Any]:
    """The summary of ``rounds`` requests from each of ``concurrency`` clients in a closed loop (``clients``): the
    first round arrives at once, as a benchmark starts, and the means are over every request, as it reports them."""
    from experiments.runner.config import RunConfig
    from experiments.runner.simulation import build_workload, run_simulation

    run = RunConfig.model_validate(config | {"num_prompts": rounds * concurrency, "request_rate": math.inf})
    return run_simulation(run, clients(build_workload(run), concurrency), detail=False).summary


def open_loop(config: dict[str, Any], concurrency: int, rounds: int = 8) -> dict[str, Any]:
    """The summary of a run that keeps ``concurrency`` requests in flight on average (Little's law: arrival rate x
    mean end-to-end latency = concurrency), the rate found by bisection in log space (the in-flight count grows with
    the rate; a rate past the replica's capacity builds a queue and is too high), within 3%: arrivals that never wait
    for a response (nearly evenly spaced: burstiness 100), so no request arrives with others at once."""
    config = config | {"burstiness": 100.0}
    n = max(10 * concurrency, 40)
    alone = _summary(config | {"num_prompts": 1, "request_rate": math.inf})["mean_e2el_ms"] / 1e3
    low, high = math.log(1e-3 / alone), math.log(2.0 * concurrency / alone)
    best: tuple[float, dict[str, Any]] | None = None
    for _ in range(rounds):
        rate = math.exp(0.5 * (low + high))
        summary = _summary(config | {"num_prompts": n, "request_rate": rate, "seed": config.get("seed", 1)})
        in_flight = rate * summary["mean_e2el_ms"] / 1e3
        miss = abs(math.log(in_flight / concurrency))
        if best is None or miss < best[0]:
            best = (miss, summary)
        if miss < 0.03:
            break
        low, high = (math.log(rate), high) if in_flight < concurrency else (low, math.log(rate))
    assert best is not None
    return best[1]


def _on_profile(config: dict[str, Any], suffix: str) -> dict[str, Any]:
    """``config`` on its device's profile ``DEVICE + suffix`` (``.datasheet``), or as it is without a suffix."""
    return config | {"hardware": config["hardware"].split(".")[0] + suffix} if suffix else config


def predict(points: list[Point], suffix: str = "", clients_: str = "closed") -> None:
    """Fill each point's prediction (runs shared by the points of one setting); a fixed-concurrency point runs as a
    closed loop of clients (``closed_loop``) or as arrivals at the rate that keeps as many in flight (``open_loop``)."""
    cache: dict[str, list[dict[str, Any]]] = {}
    loop = closed_loop if clients_ == "closed" else open_loop
    for p in points:
        config = _on_profile(p.config, suffix)
        key = repr(sorted(config.items())) + repr((p.concurrency, p.seeds))
        if key not in cache:
            runs = [config | {"seed": seed} if p.seeds > 1 else config for seed in range(p.seeds)]
            cache[key] = [loop(c, p.concurrency) if p.concurrency else _summary(c) for c in runs]
        p.predicted = float(np.mean([summary[p.metric] for summary in cache[key]]))


def _length_range(spec: int | str) -> tuple[int, int]:
    """The shortest and longest of a length the study writes (a count, or ``uniform:LOW:HIGH``)."""
    length = parse_length_spec(spec)
    if isinstance(length, FixedLength):
        return length.value, length.value
    if isinstance(length, UniformLength):
        return length.low, length.high
    raise ValueError(f"{spec!r}: the study writes fixed or uniform lengths only")


def prefill_demand(points: list[Point], suffix: str = "") -> None:
    """For every fixed-concurrency row with both metrics, ``extra["prefill_demand"]``: the prompt tokens per second
    its published numbers imply (Little's law: concurrency x mean prompt / (TTFT + (mean output - 1) x TPOT)) over
    the most ferry's kernels can prefill on that replica with nothing else to do (prompts of the row's longest
    length, as many as fill 8,192 tokens, one iteration's worth, each with a one-token answer). Above 1, the run
    served more prompt tokens than the measured kernels compute at full speed: its prompts must have been served
    in part from a prefix cache (a benchmark that reuses its prompts), or its kernels outran the tables."""
    published = {(p.source, p.label, p.metric): p.published for p in points if p.concurrency}
    capacity: dict[str, float] = {}
    for p in points:
        ttft, tpot = (
            published.get((p.source, p.label, "mean_ttft_ms")),
            published.get((p.source, p.label, "mean_tpot_ms")),
        )
        if p.concurrency is None or ttft is None or tpot is None:
            continue
        (shortest, longest), output = _length_range(p.config["input_len"]), _length_range(p.config["output_len"])
        prompt, answer = 0.5 * (shortest + longest), 0.5 * sum(output)
        demand = p.concurrency * prompt / ((ttft + (answer - 1.0) * tpot) / 1e3)
        one_iteration = {"input_len": longest, "output_len": 1, "num_prompts": max(1, 8192 // longest),
                         "request_rate": math.inf}  # fmt: skip
        prefill = _on_profile(p.config, suffix) | one_iteration
        key = repr(sorted(prefill.items()))
        if key not in capacity:
            summary = _summary(prefill)
            capacity[key] = summary["total_input_tokens"] / summary["duration"]
        p.extra["prefill_demand"] = demand / capacity[key]


def table(points: list[Point]) -> pd.DataFrame:
    """Per source and metric: points, median and p90 |error|, median signed error, and how many rows ask for more
    prefill than the kernels can do (``prefill_demand`` above 1)."""
    rows = []
    for (source, metric), group in pd.DataFrame([vars(p) for p in points]).groupby(["source", "metric"]):
        err = (group["predicted"] / group["published"] - 1.0).dropna()
        if err.empty:
            continue
        over = sum(e.get("prefill_demand", 0.0) > 1.0 for e in group["extra"])
        rows.append({"source": source, "metric": metric, "points": len(err),
                     "median_abs_error": float(err.abs().median()), "p90_abs_error": float(err.abs().quantile(0.9)),
                     "median_error": float(err.median()), "over_capacity": int(over)})  # fmt: skip
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="every 4th setting of each source")
    p.add_argument("--sources", nargs="+", default=["trtllm-perf-overview", "nvidia-silicon"])
    p.add_argument("--hardware-suffix", default="", help="run every point on DEVICE+SUFFIX (e.g. .datasheet)")
    p.add_argument("--points", type=Path, default=None, help="write every point (CSV)")
    p.add_argument("--clients", choices=("closed", "open"), default="closed",
                   help="a fixed-concurrency run as a closed loop of that many clients (default), or as arrivals at "
                        "the rate that keeps as many requests in flight")  # fmt: skip
    args = p.parse_args(argv)
    published = strict_yaml.load(PUBLISHED.read_text())["sources"]
    points: list[Point] = []
    if "trtllm-perf-overview" in args.sources:
        points += trtllm_points(published["trtllm-perf-overview"])
    if "nvidia-silicon" in args.sources:
        points += silicon_points(published["nvidia-silicon"])
    if args.quick:  # every 4th setting of each source (both metrics of a silicon row)
        settings = sorted({(p.source, p.label) for p in points})
        kept = set(settings[::4])
        points = [p for p in points if (p.source, p.label) in kept]
    predict(points, args.hardware_suffix, args.clients)
    prefill_demand(points, args.hardware_suffix)
    if args.points:
        pd.DataFrame([vars(p) for p in points]).to_csv(args.points, index=False)
    result = table(points)
    shown = result.assign(**{c: result[c].map("{:+.1%}".format if c == "median_error" else "{:.1%}".format)
                             for c in ("median_abs_error", "p90_abs_error", "median_error")})  # fmt: skip
    print(shown.to_string(index=False))
    all_errors = [abs(x.predicted / x.published - 1) for x in points if math.isfinite(x.predicted)]
    print(f"all {len(all_errors)} points: median |ferry / published - 1| {statistics.median(all_errors):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
