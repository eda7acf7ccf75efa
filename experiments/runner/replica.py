"""What a run config makes: the workload it describes, and each replica's model, device, cost model, resolved settings
and memory plan (``build_replica``); and a run's result (``RunResult``), which a replica summarises.

``runner.simulation`` runs these on one replica or a cluster, ``experiments.runner.disagg_run`` on two pools; both build
from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

import policies
from costmodel import CostModel, HardwareProfile, MemoryPlan, ModelSpec, load_hardware, load_model
from costmodel.drafting import Drafter, drafter_for
from costmodel.engines import apply_engine
from experiments.runner.config import RunConfig
from experiments.runner.speculative import SpeculativeConfig, speculation
from policies.config import ITERATION_LIMITED
from policies.vllm_defaults import EngineDefaults, engine_defaults
from sim.cluster import ClusterRecords
from sim.cluster_metrics import summarize_cluster
from sim.disagg import DisaggRecords
from sim.engine import default_stream
from sim.kvcache import KVCacheManager
from sim.metrics import summarize
from sim.prefix_cache import PrefixCachingKV
from sim.records import RunRecords
from sim.request import RequestTable
from sim.speculation import Speculation
from sim.workload import Workload, load_trace, synthetic
from sim.workload.clients import closed_loop
from sim.workload.lengths import read_length_pairs
from sim.workload.prefixes import grouped
from sim.workload.sessions import multi_turn

DEFAULT_NUM_PROMPTS = 1000


@dataclass
class RunResult:
    config: RunConfig  # the resolved config (max_model_len and token budget filled in)
    memory: MemoryPlan
    workload: Workload
    records: RunRecords  # a cluster's: every replica's iterations one after the other (``cluster.merged()``)
    summary: dict[str, Any]
    cluster: ClusterRecords | None = None  # a cluster's records, replica by replica
    disagg: DisaggRecords | None = None  # a disaggregated run's: each pool's records and each request's path


def build_workload(config: RunConfig) -> Workload:
    w = config.workload
    if w.trace is not None:
        trace = load_trace(
            w.trace, w.trace_format, limit=w.num_prompts, time_scale=w.trace_time_scale, sort=w.sort_trace
        )
        return trace if w.max_concurrency is None else closed_loop(trace, w.max_concurrency)
    rng = np.random.default_rng(w.seed)
    num = w.num_prompts if w.num_prompts is not None else DEFAULT_NUM_PROMPTS
    pairs = read_length_pairs(w.lengths_from, w.lengths_max_total) if w.lengths_from is not None else None
    workload = synthetic(num, w.request_rate, w.burstiness, w.input_len, w.output_len, rng, pairs=pairs)
    if w.prefix_len > 0:
        shared = grouped(num, w.prefix_len, w.num_prefix_groups, rng)  # drawn after the requests: they stay the same
        workload = dataclasses.replace(
            workload,
            prompt_tokens=workload.prompt_tokens + w.prefix_len,
            source=f"{workload.source} prefix={w.prefix_len}x{w.num_prefix_groups}",
            prefixes=shared,
        )
    if w.turns > 1:
        workload = multi_turn(workload, w.turns, w.think_time_s, w.input_len, w.output_len, rng)
    return workload if w.max_concurrency is None else closed_loop(workload, w.max_concurrency)


def resolve(config: RunConfig, model: ModelSpec, hardware: HardwareProfile) -> tuple[RunConfig, EngineDefaults | None]:
    """Fill in what the user left to the model, the device and the modelled engine: ``max_model_len`` defaults to the
    model's context length (as vLLM), and may not exceed it; for continuous and chunked batching, the limits, the
    admission rule and the watermark a default ``vllm serve`` of ``config.vllm_defaults`` picks on this device
    (returned too); the token budget and seat limit otherwise follow ``SchedulerConfig``'s fallbacks; the delivery
    (``stream``) defaults to the policy's."""
    sched = config.scheduler
    given = sched.model_fields_set
    max_position_embeddings = model.max_position_embeddings
    max_len = sched.max_model_len if "max_model_len" in given else max_position_embeddings
    if max_len > max_position_embeddings:
        raise ValueError(
            f"max_model_len={max_len} exceeds the model's max_position_embeddings={max_position_embeddings}"
        )
    fields = sched.model_dump(exclude_unset=True) | {"max_model_len": max_len}
    vllm = None
    if sched.policy in ITERATION_LIMITED:
        settings = hardware.provenance.settings or {}
        vllm = engine_defaults(
            config.vllm_defaults,
            sched.policy,
            memory_gib=hardware.memory_capacity_gib.value,
            device_name=f"{hardware.name} {hardware.description}",
            max_model_len=max_len,
            world_size=config.tensor_parallel_size * config.pipeline_parallel_size,
            cpu=settings.get("device", "").startswith("cpu"),
            mix_prefill_decode=sched.mix_prefill_decode,
        )
        chunked = sched.policy == "chunked"
        limits = ("max_num_batched_tokens", "max_num_seqs") + (("scheduler_reserve_full_isl",) if chunked else ())
        applied = [k for k in limits if k not in fields] + (["kv_watermark"] if config.kv_watermark is None else [])
        applied += ["enable_prefix_caching"] if config.enable_prefix_caching is None else []
        applied += ["policy"] if "policy" not in given else []
        fields.setdefault("max_num_batched_tokens", vllm.max_num_batched_tokens)
        fields.setdefault("max_num_seqs", min(vllm.max_num_seqs, fields["max_num_batched_tokens"]))
        if chunked:
            fields.setdefault("scheduler_reserve_full_isl", vllm.scheduler_reserve_full_isl)
            fields.setdefault("cap_lone_prefill", vllm.cap_lone_prefill)
            if fields.get("long_prefill_token_threshold_adaptive") and vllm.cap_lone_prefill:
                raise ValueError(
                    f"long_prefill_token_threshold_adaptive: vLLM has it from 0.31.0, but --vllm-defaults is "
                    f"{config.vllm_defaults}; leave it out or give a later release"
                )
        vllm = dataclasses.replace(vllm, applied=tuple(applied))
    # the other policies keep their limits unset: they do not read them (the memory plan takes the fallbacks)
    update: dict[str, Any] = {"scheduler": policies.SchedulerConfig(**fields)}
    if config.kv_watermark is None and vllm is not None:
        update["kv_watermark"] = vllm.watermark
    if config.enable_prefix_caching is None and vllm is not None:  # (the other policies read none: it stays unset)
        update["enable_prefix_caching"] = vllm.enable_prefix_caching
    if config.stream is None:
        update["stream"] = default_stream(policies.get_class(sched.policy))
    return config.model_copy(update=update), vllm


@dataclass
class Replica:
    """What a config makes of one replica: the resolved config, the model, the device, the cost model, the memory."""

    config: RunConfig  # resolved (max_model_len, the limits, the watermark and the delivery filled in)
    model: ModelSpec
    hardware: HardwareProfile
    cost: CostModel
    memory: MemoryPlan
    vllm: EngineDefaults | None = None  # the `vllm serve` defaults the config took (continuous, chunked)
    spec: Speculation | None = None  # speculative decoding, as this replica schedules it

    def new_requests(self, workload: Workload) -> tuple[RequestTable, KVCacheManager]:
        """A fresh request table and KV cache for one run of ``workload`` on this replica."""
        requests = RequestTable(workload.arrival_s, workload.prompt_tokens, workload.output_tokens)
        requests.after, requests.think = workload.after, workload.think_s
        return requests, self.new_kv(workload)

    def new_kv(self, workload: Workload) -> KVCacheManager:
        """A fresh KV cache for one run of ``workload`` on this replica: with prefix caching, one that knows what
        the workload's requests share."""
        blocks, size, n = self.memory.usable_blocks, self.memory.block_size, len(workload)
        watermark = self.config.kv_watermark or 0.0
        if not self.config.enable_prefix_caching:
            return KVCacheManager(blocks, size, n, watermark=watermark)
        drop = self.spec is not None and self.spec.drop_cached_block
        return PrefixCachingKV(blocks, size, workload, watermark=watermark, drop_last_block=drop)

    def result(
        self,
        workload: Workload,
        records: RunRecords,
        hardware: str | None = None,
        cluster: ClusterRecords | None = None,
        detail: bool = True,
        gpus: list[int] | None = None,
        token_gaps: bool = True,
    ) -> RunResult:
        """Summarise a run's records (a simulation's, or a real run's with ``hardware`` naming the device; a
        cluster's with ``cluster``, of which ``records`` is the merged view; ``detail=False``: without each
        replica's own summary; ``gpus``: each replica's GPUs, default this config's tensor parallelism;
        ``token_gaps=False``: without the token gaps' statistics, ``sim.metrics.summarize``)."""
        records.request_ids = workload.request_id
        if cluster is not None:
            cluster.request_ids = workload.request_id
            gpus = gpus or [self.config.parallelism.gpus_per_rank] * len(cluster.replicas)
            summary = summarize_cluster(cluster, self.config.goodput, gpus, detail, token_gaps)
        else:
            summary = summarize(records, self.config.goodput, token_gaps)
        summary["model"] = self.model.name
        summary["hardware"] = hardware or self.hardware.name
        summary["hardware_profile"] = {"name": self.hardware.name, "kind": self.hardware.kind,
                                       "origin": self.hardware.origin()}  # fmt: skip
        summary["workload"] = workload.source
        summary["memory"] = memory_summary(self.memory)
        if self.vllm is not None:
            summary["vllm_defaults"] = dataclasses.asdict(self.vllm)
        if self.spec is not None:
            summary["speculative_decoding"] = speculation_summary(self.spec)
        summary["config"] = self.config.to_jsonable()
        return RunResult(self.config, self.memory, workload, records, summary, cluster)


def build_replica(config: RunConfig) -> Replica:
    """Load the model and the hardware profile, build the cost model, resolve the config, plan the memory."""
    model = load_model(config.model)
    hardware = load_hardware(config.hardware)
    if config.engine_overheads is not None:
        hardware = apply_engine(hardware, config.engine_overheads)
    cost = CostModel(
        model,
        hardware,
        parallel=config.parallelism,
        dtype=None if config.dtype == "auto" else config.dtype,
        kv_cache_dtype=None if config.kv_cache_dtype == "auto" else config.kv_cache_dtype,
        quantization=config.quantization,
    )
    given_budget = config.scheduler.max_num_batched_tokens is not None
    config, vllm = resolve(config, model, hardware)
    spec = None
    if config.speculative_config is not None:  # its drafter's work and memory in the cost model
        spec = replica_speculation(config.speculative_config, model, config)
        cost.speculate(replica_drafter(config.speculative_config, model, config, spec))
    try:
        memory = cost.memory_plan(
            config.gpu_memory_utilization,
            config.block_size,
            max_num_batched_tokens=config.scheduler.token_budget,
            max_num_seqs=config.scheduler.seq_limit,
        )
        if config.num_gpu_blocks_override is not None:
            memory = override_blocks(memory, config.num_gpu_blocks_override)
        check_max_model_len_fits(config.scheduler.max_model_len, memory)
    except ValueError as exc:
        if config.scheduler.policy != "continuous" or given_budget:
            raise
        raise ValueError(f"{exc}; {UNCHUNKED_HINT}") from None
    return Replica(config, model, hardware, cost, memory, vllm, spec)


def replica_drafter(given: SpeculativeConfig, model: ModelSpec, config: RunConfig, spec: Speculation) -> Drafter:
    """The drafter the cost model times: ``given``'s method over ``model`` (a draft model loaded from ``model`` of the
    config: a built-in name or a config.json), at ``draft_tensor_parallel_size`` (default the target's)."""
    draft = load_model(given.model) if given.resolved_method == "draft_model" and given.model else None
    if draft is not None and draft.vocab_size != model.vocab_size:  # vLLM's verify_equal_vocab_size_if_draft_model
        raise ValueError(f"speculative_config model {given.model!r}: its vocab_size={draft.vocab_size} is not "
                         f"{model.name}'s {model.vocab_size} (vLLM refuses a draft of another vocabulary)")  # fmt: skip
    tp = given.draft_tensor_parallel_size or config.tensor_parallel_size
    return drafter_for(given.resolved_method, given.k, model, draft, tp, spec.per_batch)


def speculation_summary(spec: Speculation) -> dict[str, Any]:
    """What ``summary.json`` says of a replica's speculative decoding: the drafter, where its acceptance comes from,
    the per-position rates (unconditional, as vLLM's synthetic_acceptance_rates) and the mean acceptance length they
    give when every position is drafted."""
    rates = np.cumprod(spec.rates)
    return {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens,
            "acceptance": spec.acceptance, "acceptance_rates": [float(x) for x in rates],
            "expected_acceptance_length": 1.0 + float(rates.sum()), "lookahead_slots": spec.lookahead,
            "dynamic": spec.per_batch is not None}  # fmt: skip


def replica_speculation(given: SpeculativeConfig, model: ModelSpec, config: RunConfig) -> Speculation:
    """What this replica's scheduler runs of ``given``, refused where vLLM would refuse it or ferry does not model it:
    MTP needs the model's MTP module, and several of them chained (``use_multi_module_mtp``) hold back the end of a
    prefill chunk, which ferry does not model; a draft model's input slot must leave room in the budget."""
    method, k = given.resolved_method, given.k
    if method == "mtp":
        layers = model.num_nextn_predict_layers
        if layers < 1:
            raise ValueError(f"speculative_config method mtp: {model.name} has no MTP module (config.json's "
                             "num_nextn_predict_layers is 0)")  # fmt: skip
        if min(layers, k) > 1:
            raise ValueError(f"speculative_config method mtp: {model.name}'s {layers} MTP modules chained for k={k} "
                             "(vLLM's multi-module MTP) are not modelled; give num_speculative_tokens 1")  # fmt: skip
    s = config.scheduler
    spec = speculation(given, model.name, s.seq_limit, config.workload.seed)
    if s.token_budget <= spec.draft_slots:
        raise ValueError(f"max_num_batched_tokens={s.token_budget} leaves no room for a token and the draft "
                         "model's slot (vLLM refuses to start)")  # fmt: skip
    return spec


# what a memory refusal under ``continuous`` adds when its budget (and so its activation reserve) came from
# max_model_len: vLLM without chunked prefill needs max_num_batched_tokens >= max_model_len
# (``SchedulerConfig.verify_max_model_len``), and V1 serves with chunked prefill by default
UNCHUNKED_HINT = (
    "--policy continuous runs without chunked prefill, so its token budget, and the activation reserve sized for it, "
    "is at least max_model_len, as in vLLM; --policy chunked (vllm serve's default) budgets a few thousand tokens "
    "per iteration, or give a shorter --max-model-len"
)


def override_blocks(memory: MemoryPlan, blocks: int) -> MemoryPlan:
    """The plan with ``blocks`` KV blocks (vLLM's ``num_gpu_blocks_override``, for experiments with a small cache);
    refused when the device could not hold them."""
    block_bytes = memory.block_size * memory.kv_bytes_per_token
    if blocks > memory.num_gpu_blocks:
        raise ValueError(
            f"num_gpu_blocks_override={blocks:,} needs {blocks * block_bytes / 2**30:,.1f} GiB of KV cache per GPU, "
            f"but {memory.hardware} has {memory.kv_cache_bytes / 2**30:.1f} GiB left after weights and activations "
            f"(at most {memory.num_gpu_blocks:,} blocks of {memory.block_size} tokens); lower it"
        )
    return dataclasses.replace(memory, num_gpu_blocks=blocks, kv_cache_bytes=blocks * block_bytes)


def check_max_model_len_fits(max_model_len: int, memory: MemoryPlan) -> None:
    """Refuse to start when one request of ``max_model_len`` tokens cannot fit the KV cache, as vLLM does
    (``check_enough_kv_cache_memory``, ``vllm/v1/core/kv_cache_utils.py``; ``kv_cache_planning.py`` in 0.33.0)."""
    need = -(-max_model_len // memory.block_size)
    if need > memory.num_gpu_blocks:
        fits = memory.num_gpu_blocks * memory.block_size
        raise ValueError(
            f"max_model_len={max_model_len}: one request that long needs {need:,} KV blocks of {memory.block_size} "
            f"tokens, but the cache has {memory.num_gpu_blocks:,} ({fits:,} tokens); lower --max-model-len to at most "
            f"{fits:,}, or give the cache more room (--gpu-memory-utilization, --tensor-parallel-size, "
            "--kv-cache-dtype, --num-gpu-blocks-override)"
        )


def memory_summary(memory: MemoryPlan) -> dict[str, Any]:
    return {k: (float(v) if isinstance(v, np.floating) else v) for k, v in dataclasses.asdict(memory).items()}
