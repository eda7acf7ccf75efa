"""The run configuration users write: `ferry run` flags or a YAML file with the same field names.

Sections: the replica (model, hardware, parallelism, dtypes, memory), the scheduler (``policies.SchedulerConfig``) and
the workload (a trace file, or synthetic requests with vLLM ``bench serve`` conventions). A YAML file may nest the
scheduler and workload fields under ``scheduler:`` / ``workload:`` or write them flat at the top; ``summary.json``
carries the resolved config in the nested form, which ``--config`` reads back to reproduce the run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from costmodel.engines import get_engine
from costmodel.layout import Parallelism
from experiments.runner.config_file import read_mapping
from experiments.runner.disagg_config import Disaggregation, check_disaggregation
from experiments.runner.speculative import SpeculativeConfig, parse
from experiments.runner.workload_config import (  # noqa: F401  (importable from here, as before)
    MAX_HORIZON_S,
    MAX_NUM_PROMPTS,
    SYNTHETIC_ONLY,
    TRACE_ONLY,
    WorkloadConfig,
    changed_fields,
    show,
)
from policies.config import APPLIES_TO, BUILTIN_POLICIES, Number, SchedulerConfig
from policies.vllm_defaults import LATEST, OLDEST, release_in_force

RUN_SETTINGS_READ_BY_POLICY = ("kv_watermark", "vllm_defaults", "enable_prefix_caching")


class RunConfig(BaseModel):
    """One simulated replica serving one workload under one policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field("llama-3-8b", description="built-in model name or path to a Hugging Face config.json")
    hardware: str = Field("h100-sxm", description="built-in hardware profile name or path to a profile file")
    engine_overheads: str | None = Field(
        None,
        description="a serving engine's host overheads in place of the hardware profile's: a preset of "
        "hwprofiles/engines.yaml (vllm-v1, trt-llm, vllm-v0, eager); None: the profile's own",
    )
    tensor_parallel_size: StrictInt = Field(1, ge=1, description="GPUs the replica's tensors are split over")
    pipeline_parallel_size: StrictInt = Field(
        1, ge=1, le=64, description="pipeline stages the replica's layers are split over (vLLM's -pp)"
    )
    data_parallel_size: StrictInt = Field(
        1,
        ge=1,
        le=4096,
        description="data-parallel ranks of each replica (vLLM's -dp): engines of their own, each a replica of the "
        "cluster behind the router; an MoE model's MoE layers span all of them",
    )
    enable_expert_parallel: StrictBool = Field(
        False, description="MoE layers hold whole experts, spread over tensor x data-parallel GPUs (vLLM's flag)"
    )
    dtype: str = Field("auto", description="weights and activations: auto (config's torch_dtype), bf16, fp16, fp32")
    kv_cache_dtype: str = Field("auto", description="KV cache: auto (= dtype) or fp8, ...")
    quantization: str | None = Field(None, description="weight quantization: fp8, int8, int4 (None: dtype)")
    gpu_memory_utilization: Number = Field(0.9, gt=0, le=1, description="share of GPU memory ferry may use")
    block_size: StrictInt = Field(16, ge=1, description="tokens per KV-cache block")
    num_gpu_blocks_override: StrictInt | None = Field(
        None, ge=1, description="KV blocks to use instead of the computed"
    )
    enable_prefix_caching: StrictBool | None = Field(
        None,
        description="reuse the KV blocks of a prefix already computed (vLLM's automatic prefix caching; continuous, "
        "chunked); the workload's shared prefixes say what requests share. None: `vllm serve`'s default of the "
        "release (on in V1, off in V0; off for the policies that do not read it)",
    )
    kv_watermark: Number | None = Field(
        None,
        ge=0,
        lt=1,
        description="share of KV blocks admission keeps free while something runs (vLLM's watermark); default the "
        "modelled engine's: 0.01 for continuous without mixing (vLLM V0), else 0 (V1)",
    )
    vllm_defaults: str = Field(
        LATEST,
        description="vLLM release whose `vllm serve` defaults (for the hardware profile) fill max_num_seqs, "
        "max_num_batched_tokens, scheduler_reserve_full_isl and kv_watermark when they are not given "
        f"(continuous, chunked); {OLDEST} or later",
    )
    stream: StrictBool | None = Field(
        None,
        description="clients receive tokens as they are made (streaming); false: each response arrives whole when "
        "its request gives back its seat. Default: streamed, except static and dynamic batching (whose members' "
        "responses arrive when the batch ends)",
    )
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    workload: WorkloadConfig = Field(default_factory=WorkloadConfig)
    goodput: dict[str, float] = Field(default_factory=dict, description="SLOs in ms: ttft, tpot, e2el")
    engine: Literal["auto", "compiled", "reference"] = Field(
        "auto",
        description="compiled: the numba engine (built-in policies); reference: the policy objects on SimPy; auto: "
        "compiled where it can. Both give the same records",
    )
    itl: Literal["auto", "exact", "histogram"] = Field(
        "auto", description="keep every inter-token gap, or a 0.5%-error histogram (auto: exact up to 20M gaps)"
    )
    replicas: StrictInt = Field(
        1, ge=1, le=4096, description="replicas of this configuration behind a router (a cluster); 1: one replica"
    )
    router: str = Field(
        "round_robin",
        description="which replica serves each request: round_robin, random, least_requests, least_tokens, "
        "least_kv, power_of_two, prefix_affinity, or module:Class (clusters only)",
    )
    router_seed: StrictInt = Field(0, ge=0, description="seed of the random and power_of_two routers")
    replica_groups: tuple[dict[str, Any], ...] = Field(
        (),
        description="a cluster of different replicas: groups of `count` replicas, each group's fields (hardware, "
        "tensor_parallel_size, any scheduler or memory field) replacing this config's; replaces --replicas",
    )
    disaggregation: Disaggregation | None = Field(
        None, description="prefill and decode on separate pools of replicas (experiments.runner.disagg_config)"
    )
    record_batches: StrictBool = Field(
        False,
        description="keep who took part in each iteration, with their tokens (batches.csv: one row per request and "
        "iteration)",
    )
    speculative_config: SpeculativeConfig | None = Field(
        None,
        description="speculative decoding, vLLM's --speculative-config (its JSON and keys: method, "
        "num_speculative_tokens, ...; experiments.runner.speculative); chunked, or continuous with "
        "mix_prefill_decode",
    )

    @field_validator("speculative_config", mode="before")
    @classmethod
    def _speculative_json(cls, value: Any) -> Any:
        """The flag's JSON, as `vllm serve --speculative-config` takes it."""
        return parse(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _speculative(self) -> RunConfig:
        """Speculative decoding where ferry schedules it as vLLM V1 does, and refused elsewhere, in one line."""
        spec = self.speculative_config
        if spec is None:
            return self
        sched = self.scheduler
        v1 = sched.policy == "chunked" and sched.chunked_order == "vllm"
        v1 |= sched.policy == "continuous" and sched.mix_prefill_decode
        if not v1:
            raise ValueError(
                f"speculative_config: ferry schedules speculative decoding as vLLM V1 does (--policy chunked, or "
                f"continuous --mix-prefill-decode), not --policy {sched.policy}"
                + (f" --chunked-order {sched.chunked_order}" if sched.policy == "chunked" else "")
            )
        if sched.reservation != "paged":
            raise ValueError(f"speculative_config with kv_reservation={sched.kv_reservation}: only paged KV is "
                             "modelled")  # fmt: skip
        if self.disaggregation is not None:
            raise ValueError("speculative_config with disaggregation: not modelled yet (the decode pool's first step "
                             "after the transfer)")  # fmt: skip
        tp = spec.draft_tensor_parallel_size
        if tp is not None and tp not in (1, self.tensor_parallel_size):
            raise ValueError(f"draft_tensor_parallel_size={tp}: 1 or the target's tensor_parallel_size "
                             f"({self.tensor_parallel_size}), as vLLM allows")  # fmt: skip
        return self

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, data: Any) -> Any:
        return nest_flat_fields(data)

    @field_validator("engine_overheads")
    @classmethod
    def _engine(cls, value: str | None) -> str | None:
        if value is None:
            return None
        get_engine(value)  # refuses a name that is not a preset, listing the presets
        return value.strip().lower()

    @field_validator("vllm_defaults")
    @classmethod
    def _release(cls, value: str) -> str:
        release_in_force(value)  # refuses what is not a release ferry knows the defaults of
        return value

    @model_validator(mode="after")
    def _applies(self) -> RunConfig:
        """Refuse a setting the policy would ignore (a built-in policy; a user's own may read anything)."""
        policy = self.scheduler.policy
        if policy not in BUILTIN_POLICIES:
            return self
        given = {k: getattr(self.scheduler, k) for k in changed_fields(self.scheduler)}
        given |= {k: getattr(self, k) for k in changed_fields(self) if k in RUN_SETTINGS_READ_BY_POLICY}
        for field, value in sorted(given.items()):
            readers = APPLIES_TO.get(field)
            if readers is not None and policy not in readers:
                who = ", ".join(readers[:-1]) + (" and " if len(readers) > 1 else "") + readers[-1]
                raise ValueError(
                    f"{field}={show(value)} does not apply to --policy {policy}: only {who} read it; leave it out"
                )
        return self

    @model_validator(mode="after")
    def _parallel(self) -> RunConfig:
        """Refuse a data-parallel layout ferry does not model with clusters of other kinds, and expert parallelism
        over one GPU (vLLM ignores it there: ``FusedMoEParallelConfig.make`` needs tp x dp > 1)."""
        if self.data_parallel_size > 1 and (self.replica_groups or self.disaggregation is not None):
            kind = "replica_groups" if self.replica_groups else "disaggregation"
            raise ValueError(
                f"data_parallel_size={self.data_parallel_size} with {kind}: not modelled; give data-parallel ranks to "
                "a cluster of one kind of replica (--replicas)"
            )
        if self.pipeline_parallel_size > 1 and self.disaggregation is not None:
            raise ValueError(
                f"pipeline_parallel_size={self.pipeline_parallel_size} with disaggregation: not modelled (the pools' "
                "KV transfers and GPUs count tensor parallelism only)"
            )
        if self.enable_expert_parallel and self.tensor_parallel_size * self.data_parallel_size == 1:
            raise ValueError(
                "enable_expert_parallel spreads the experts over tensor x data-parallel GPUs, and there is one; give "
                "--tensor-parallel-size or --data-parallel-size above 1, or leave it out"
            )
        return self

    @model_validator(mode="after")
    def _cluster(self) -> RunConfig:
        """A router, or its seed, set for one replica would be ignored: refuse it; an unknown router's name fails
        here, before any work."""
        if self.replica_groups:
            if self.replicas != 1:
                raise ValueError(f"replicas={self.replicas} and replica_groups: give one or the other")
            for k, group in enumerate(self.replica_groups):
                try:
                    self.group_config(k)
                except ValueError as exc:
                    raise ValueError(f"replica_groups[{k}] ({group}): {exc}") from None
        if self.router == "prefix_affinity" and self.enable_prefix_caching is False and self.num_replicas > 1:
            raise ValueError(
                "router='prefix_affinity' routes by what each replica's prefix cache holds; give "
                "--enable-prefix-caching (without it every replica's cache is empty and it is least_requests)"
            )
        if self.disaggregation is not None:
            check_disaggregation(self)
        elif self.num_replicas == 1:
            ignored = [k for k in changed_fields(self) if k in ("router", "router_seed")]
            if ignored:
                raise ValueError(f"{', '.join(ignored)}: a router only acts with two replicas or more")
        elif ":" not in self.router:
            from policies.routing import router_names

            if self.router not in router_names():
                raise ValueError(f"unknown router {self.router!r}; choose one of {', '.join(router_names())}")
        return self

    @property
    def num_replicas(self) -> int:
        """Replicas of the run: ``replicas``, or the groups' counts added up; each data-parallel rank is one."""
        if self.replica_groups:
            return sum(int(g.get("count", 1)) for g in self.replica_groups) * self.data_parallel_size
        return self.replicas * self.data_parallel_size

    @property
    def parallelism(self) -> Parallelism:
        """The replica's parallel layout, as vLLM's flags set it."""
        return Parallelism(
            tp=self.tensor_parallel_size,
            pp=self.pipeline_parallel_size,
            dp=self.data_parallel_size,
            expert_parallel=self.enable_expert_parallel,
        )

    def pool_config(self, role: str) -> RunConfig:
        """The config of one replica of the disaggregated pool ``role`` (prefill or decode): without prefix caching,
        which ferry does not model with disaggregation (where `vllm serve` would turn it on by default)."""
        assert self.disaggregation is not None
        pool = self.overlay(getattr(self.disaggregation, role))
        return (
            pool if pool.enable_prefix_caching is not None else pool.model_copy(update={"enable_prefix_caching": False})
        )

    def group_config(self, k: int) -> RunConfig:
        """The config of one replica of group ``k``: this config with the group's fields (``count`` aside)."""
        return self.overlay(self.replica_groups[k])

    def overlay(self, given: dict[str, Any]) -> RunConfig:
        """This config with a replica group's fields (``count`` aside) in place of its own."""
        group = dict(given)
        count = group.pop("count", 1)
        if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
            raise ValueError(f"count={count!r}: the group's number of replicas, an integer >= 1")
        unknown = [f for f in group if f not in RunConfig.model_fields and f not in SchedulerConfig.model_fields]
        banned = [f for f in group if f in _NOT_PER_REPLICA]
        if unknown or banned:
            raise ValueError(f"{', '.join(unknown + banned)}: not a field a replica group may set")
        data = self.model_dump(exclude_unset=True)
        for key in ("replica_groups", "disaggregation", "router", "router_seed"):
            data.pop(key, None)
        scheduler = dict(data.pop("scheduler", {}))
        for key, value in group.items():
            if key in SchedulerConfig.model_fields and key not in RunConfig.model_fields:
                scheduler[key] = value
            else:
                data[key] = value
        return RunConfig.model_validate(data | {"scheduler": scheduler})

    @classmethod
    def load_dict(cls, data: dict[str, Any], overrides: dict[str, Any] | None = None) -> RunConfig:
        """A config from a mapping (nested or flat) with ``overrides`` (flat field names) on top."""
        data = nest_flat_fields(dict(data))
        for key, value in (overrides or {}).items():
            section = next((s for s, m in _SECTIONS.items() if key in m.model_fields), None)
            if section is None:
                data[key] = value
            else:
                data.setdefault(section, {})
                data[section] = {**data[section], key: value}
        return cls.model_validate(data)

    @classmethod
    def load(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
        """Read a YAML (or JSON) config file and apply ``overrides`` (flat field names) on top."""
        path = Path(path)
        data = read_mapping(path)
        if "config" in data and isinstance(data["config"], dict):  # a summary.json: take its resolved config
            data = data["config"]
        return cls.load_dict(data, overrides)

    def to_jsonable(self) -> dict[str, Any]:
        """The config as plain JSON values; an infinite rate is written "inf" (JSON has no infinity), which
        ``load`` reads back; file paths are made absolute, so the config reproduces the run from any folder."""
        data = _finite(self.model_dump(mode="json"))
        workload = data["workload"]
        for key in ("trace", "lengths_from"):
            if workload.get(key) is not None:
                workload[key] = str(Path(workload[key]).resolve())
        for key in ("input_len", "output_len"):
            if isinstance(workload.get(key), dict) and workload[key].get("path"):
                workload[key]["path"] = str(Path(workload[key]["path"]).resolve())
        for key in ("engine_overheads", "speculative_config"):  # written when set: older configs (and sweep hashes)
            if data.get(key) is None:  # stay as they were
                data.pop(key, None)
        if self.speculative_config is not None:  # its keys as given (vLLM's JSON, no defaults added)
            data["speculative_config"] = self.speculative_config.model_dump(mode="json", exclude_unset=True)
        layout_defaults = (("pipeline_parallel_size", 1), ("data_parallel_size", 1), ("enable_expert_parallel", False))
        for key, default in layout_defaults:
            if data.get(key) == default:  # the same: written only when set
                data.pop(key, None)
        for key in ("model", "hardware"):  # a path to a config.json or a profile, not a built-in name
            if Path(data[key]).suffix in (".json", ".yaml", ".yml") and Path(data[key]).exists():
                data[key] = str(Path(data[key]).resolve())
        return data


# run-wide fields a replica group may not set (the model, the workload and the run's own settings)
_NOT_PER_REPLICA = ("model", "workload", "replicas", "router", "router_seed", "replica_groups", "goodput", "engine",
                    "itl", "record_batches", "stream", "disaggregation", "data_parallel_size",
                    "speculative_config")  # fmt: skip


def _finite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


_SECTIONS: dict[str, type[BaseModel]] = {"scheduler": SchedulerConfig, "workload": WorkloadConfig}


def nest_flat_fields(data: Any) -> Any:
    """Move scheduler and workload fields written at the top level (as the command line does) into their sections."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for section, model in _SECTIONS.items():
        nested = dict(data.get(section) or {})
        for key in list(data):
            if key in model.model_fields and key not in RunConfig.model_fields:
                nested[key] = data.pop(key)
        if nested:
            data[section] = nested
    return data
