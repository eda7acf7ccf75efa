"""One simulation from a ``RunConfig``: wire the cost model, the KV cache, the workload and the policy to the engine.

This is what `ferry run` calls and what sweeps will call many times; it returns values and writes nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import policies
from costmodel import CostModel, HardwareProfile, MemoryPlan, ModelSpec, load_hardware, load_model
from experiments.config import RunConfig
from sim.engine import simulate
from sim.kvcache import KVCacheManager
from sim.lengths import read_length_pairs
from sim.metrics import request_frame, summarize
from sim.records import RunRecords
from sim.request import RequestTable
from sim.workload import Workload, load_trace, synthetic

DEFAULT_NUM_PROMPTS = 1000


@dataclass
class RunResult:
    config: RunConfig  # the resolved config (max_model_len and token budget filled in)
    memory: MemoryPlan
    workload: Workload
    records: RunRecords
    summary: dict[str, Any]


def build_workload(config: RunConfig) -> Workload:
    w = config.workload
    if w.trace is not None:
        return load_trace(w.trace, w.trace_format, limit=w.num_prompts, time_scale=w.trace_time_scale)
    rng = np.random.default_rng(w.seed)
    num = w.num_prompts if w.num_prompts is not None else DEFAULT_NUM_PROMPTS
    pairs = read_length_pairs(w.lengths_from, w.lengths_max_total) if w.lengths_from is not None else None
    return synthetic(num, w.request_rate, w.burstiness, w.input_len, w.output_len, rng, pairs=pairs)


def resolve(config: RunConfig, max_position_embeddings: int) -> RunConfig:
    """Fill in what depends on the model: ``max_model_len`` defaults to the model's context length (as vLLM), and
    may not exceed it; the token budget default follows from it."""
    sched = config.scheduler
    explicit = "max_model_len" in sched.model_fields_set
    max_len = sched.max_model_len if explicit else max_position_embeddings
    if max_len > max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_len} exceeds the model's max_position_embeddings={max_position_embeddings}"
        )
    fields = sched.model_dump(exclude_unset=True) | {"max_model_len": max_len}
    fields["max_num_batched_tokens"] = policies.SchedulerConfig(**fields).token_budget
    return config.model_copy(update={"scheduler": policies.SchedulerConfig(**fields)})


@dataclass
class Replica:
    """What a config makes of one replica: the resolved config, the model, the device, the cost model, the memory."""

    config: RunConfig  # resolved (max_model_len and the token budget filled in)
    model: ModelSpec
    hardware: HardwareProfile
    cost: CostModel
    memory: MemoryPlan

    def new_requests(self, workload: Workload) -> tuple[RequestTable, KVCacheManager]:
        """A fresh request table and KV cache for one run of ``workload`` on this replica."""
        requests = RequestTable(workload.arrival_s, workload.prompt_tokens, workload.output_tokens)
        kv = KVCacheManager(
            self.memory.num_gpu_blocks, self.memory.block_size, len(requests), watermark=self.config.kv_watermark
        )
        return requests, kv

    def result(self, workload: Workload, records: RunRecords, hardware: str | None = None) -> RunResult:
        """Summarise a run's records (a simulation's, or a real run's with ``hardware`` naming the device)."""
        records.request_ids = workload.request_id
        summary = summarize(records, self.config.goodput)
        summary["model"] = self.model.name
        summary["hardware"] = hardware or self.hardware.name
        summary["workload"] = workload.source
        summary["memory"] = memory_summary(self.memory)
        summary["config"] = self.config.to_jsonable()
        return RunResult(self.config, self.memory, workload, records, summary)


def build_replica(config: RunConfig) -> Replica:
    """Load the model and the hardware profile, build the cost model, resolve the config, plan the memory."""
    model = load_model(config.model)
    hardware = load_hardware(config.hardware)
    cost = CostModel(
        model,
        hardware,
        tp=config.tensor_parallel_size,
        dtype=None if config.dtype == "auto" else config.dtype,
        kv_cache_dtype=None if config.kv_cache_dtype == "auto" else config.kv_cache_dtype,
        quantization=config.quantization,
    )
    config = resolve(config, model.max_position_embeddings)
    memory = cost.memory_plan(
        config.gpu_memory_utilization,
        config.block_size,
        max_num_batched_tokens=config.scheduler.token_budget,
        max_num_seqs=config.scheduler.max_num_seqs,
    )
    if config.num_gpu_blocks_override is not None:
        memory = dataclasses.replace(memory, num_gpu_blocks=config.num_gpu_blocks_override)
    return Replica(config, model, hardware, cost, memory)


def run_simulation(
    config: RunConfig,
    workload: Workload | None = None,
    on_progress: Callable[[float, int, int], None] | None = None,
    timings: dict[str, float] | None = None,
) -> RunResult:
    """Simulate one replica under ``config``; returns the records and the summary. ``workload`` replaces the one
    ``config.workload`` describes (sweeps build it once and reuse it); ``on_progress(now, unfinished, total)`` is called
    now and then during the run with the simulated clock and the requests not yet ended; ``timings``, if given,
    receives the wall seconds of the simulation call (``simulate_s``)."""
    replica = build_replica(config)
    config = replica.config
    policy = policies.get(config.scheduler)
    if workload is None:
        workload = build_workload(config)
    requests, kv = replica.new_requests(workload)
    exact = {"auto": None, "exact": True, "histogram": False}[config.itl]
    total = len(requests)
    report = None if on_progress is None else (lambda now, left: on_progress(now, left, total))
    started = time.perf_counter()
    records = simulate(requests, policy, replica.cost, kv, config.scheduler.max_model_len, config.engine, exact, report)
    if timings is not None:
        timings["simulate_s"] = time.perf_counter() - started
    return replica.result(workload, records)


def memory_summary(memory: MemoryPlan) -> dict[str, Any]:
    return {k: (float(v) if isinstance(v, np.floating) else v) for k, v in dataclasses.asdict(memory).items()}


def write_outputs(result: RunResult, out: Path) -> list[Path]:
    """Write ``summary.json``, ``requests.csv`` and ``iterations.csv`` into ``out``; returns their paths."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.json", out / "requests.csv", out / "iterations.csv"]
    paths[0].write_text(json.dumps(result.summary, indent=2, allow_nan=False) + "\n")
    request_frame(result.records).to_csv(paths[1], index=False)
    result.records.iterations.to_frame().to_csv(paths[2], index=False)
    return paths
