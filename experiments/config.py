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

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policies.config import SchedulerConfig
from policies.vllm_defaults import LATEST, OLDEST, release_in_force
from sim.workload import FORMATS, LengthSpec, parse_length_spec


class WorkloadConfig(BaseModel):
    """Where requests come from: ``trace`` if given, else synthetic."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace: Path | None = Field(None, description="trace file to replay (see trace_format)")
    trace_format: str = Field("auto", description=f"one of {', '.join(FORMATS)}")
    trace_time_scale: float = Field(1.0, gt=0, description="replay speed-up: arrivals are divided by this")
    num_prompts: int | None = Field(
        None, ge=1, description="requests to generate (default 1000), or the first N of the trace (default all)"
    )
    request_rate: float = Field(math.inf, gt=0, description="synthetic: requests per second (inf: all at t=0)")
    burstiness: float = Field(1.0, gt=0, description="synthetic: gamma shape of inter-arrival times (1 = Poisson)")
    lengths_from: Path | None = Field(
        None,
        description="synthetic: resample (prompt, output) pairs jointly from this file (a trace, or a lengths CSV "
        "such as ShareGPT's num_prefill_tokens,num_decode_tokens) instead of input_len/output_len",
    )
    lengths_max_total: int | None = Field(
        None, ge=2, description="with lengths_from: drop rows whose prompt + output exceeds this (tokens)"
    )
    input_len: LengthSpec = Field(default_factory=lambda: parse_length_spec(1024))
    output_len: LengthSpec = Field(default_factory=lambda: parse_length_spec(128))
    seed: int = Field(0, description="seed of the numpy Generator that draws the synthetic workload")

    @field_validator("input_len", "output_len", mode="before")
    @classmethod
    def _length(cls, value: Any) -> Any:
        return parse_length_spec(value)

    @field_validator("trace_format")
    @classmethod
    def _format(cls, value: str) -> str:
        if value not in FORMATS:
            raise ValueError(f"unknown trace format {value!r}; choose one of {', '.join(FORMATS)}")
        return value


class RunConfig(BaseModel):
    """One simulated replica serving one workload under one policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field("llama-3-8b", description="built-in model name or path to a Hugging Face config.json")
    hardware: str = Field("h100-sxm", description="built-in hardware profile name or path to a profile file")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs the replica's tensors are split over")
    dtype: str = Field("auto", description="weights and activations: auto (config's torch_dtype), bf16, fp16, fp32")
    kv_cache_dtype: str = Field("auto", description="KV cache: auto (= dtype) or fp8, ...")
    quantization: str | None = Field(None, description="weight quantization: fp8, int8, int4 (None: dtype)")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="share of GPU memory ferry may use")
    block_size: int = Field(16, ge=1, description="tokens per KV-cache block")
    num_gpu_blocks_override: int | None = Field(None, ge=1, description="KV blocks to use instead of the computed")
    kv_watermark: float | None = Field(
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
    stream: bool | None = Field(
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

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, data: Any) -> Any:
        return nest_flat_fields(data)

    @field_validator("vllm_defaults")
    @classmethod
    def _release(cls, value: str) -> str:
        release_in_force(value)  # refuses what is not a release ferry knows the defaults of
        return value

    @classmethod
    def load(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
        """Read a YAML (or JSON) config file and apply ``overrides`` (flat field names) on top."""
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of field names to values, got {type(data).__name__}")
        if "config" in data and isinstance(data["config"], dict):  # a summary.json: take its resolved config
            data = data["config"]
        data = nest_flat_fields(data)
        for key, value in (overrides or {}).items():
            section = next((s for s, m in _SECTIONS.items() if key in m.model_fields), None)
            if section is None:
                data[key] = value
            else:
                data.setdefault(section, {})
                data[section] = {**data[section], key: value}
        return cls.model_validate(data)

    def to_jsonable(self) -> dict[str, Any]:
        """The config as plain JSON values; an infinite rate is written "inf" (JSON has no infinity), which
        ``load`` reads back."""
        return _finite(self.model_dump(mode="json"))


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
