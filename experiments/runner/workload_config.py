"""The workload section of a run configuration: a trace file, or synthetic requests with vLLM ``bench serve``
conventions (``runner.config`` holds the rest and names it ``workload``), and the helpers the sections share.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from policies.config import Number
from sim.workload import FORMATS, LengthSpec, parse_length_spec

MAX_NUM_PROMPTS = 20_000_000  # requests in one run: ~20 GB of request columns and records; split larger workloads
MAX_HORIZON_S = 1e9  # the last arrival of a workload (s, ~32 years): beyond it clocks lose their resolution


class WorkloadConfig(BaseModel):
    """Where requests come from: ``trace`` if given, else synthetic."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace: Path | None = Field(None, description="trace file to replay (see trace_format)")
    trace_format: str = Field("auto", description=f"one of {', '.join(FORMATS)}")
    trace_time_scale: Number = Field(1.0, gt=0, description="replay speed-up: arrivals are divided by this")
    num_prompts: StrictInt | None = Field(
        None, ge=1, description="requests to generate (default 1000), or the first N of the trace (default all)"
    )
    sort_trace: StrictBool = Field(False, description="sort the trace by arrival time (stable) instead of refusing it")
    request_rate: Number = Field(math.inf, gt=0, description="synthetic: requests per second (inf: all at t=0)")
    burstiness: Number = Field(1.0, gt=0, description="synthetic: gamma shape of inter-arrival times (1 = Poisson)")
    lengths_from: Path | None = Field(
        None,
        description="synthetic: resample (prompt, output) pairs jointly from this file (a trace, or a lengths CSV "
        "such as ShareGPT's num_prefill_tokens,num_decode_tokens) instead of input_len/output_len",
    )
    lengths_max_total: StrictInt | None = Field(
        None, ge=2, description="with lengths_from: drop rows whose prompt + output exceeds this (tokens)"
    )
    input_len: LengthSpec = Field(default_factory=lambda: parse_length_spec(1024))
    output_len: LengthSpec = Field(default_factory=lambda: parse_length_spec(128))
    seed: StrictInt = Field(0, ge=0, description="seed of the numpy Generator that draws the synthetic workload")
    prefix_len: StrictInt = Field(
        0, ge=0, description="synthetic: tokens of a shared prompt each request starts with (added to input_len)"
    )
    num_prefix_groups: StrictInt = Field(
        1, ge=1, description="synthetic: distinct shared prompts of prefix_len tokens, one drawn per request"
    )
    turns: StrictInt = Field(
        1,
        ge=1,
        le=1000,
        description="synthetic: turns of each conversation (num_prompts conversations); a turn's prompt is the "
        "conversation so far plus a new message of input_len tokens",
    )
    think_time_s: Number = Field(
        0.0, ge=0, description="synthetic, turns > 1: mean seconds (exponential) between an answer and the next turn"
    )
    max_concurrency: StrictInt | None = Field(
        None,
        ge=1,
        description="requests in flight at most, as `vllm bench serve --max-concurrency`: a request is sent when it "
        "is due or when one of those in flight ends, whichever is later (with request_rate inf: a closed loop of "
        "this many clients)",
    )

    @field_validator("input_len", "output_len", mode="before")
    @classmethod
    def _length(cls, value: Any) -> Any:
        return parse_length_spec(value)

    @field_validator("num_prompts")
    @classmethod
    def _num_prompts(cls, value: int | None) -> int | None:
        if value is not None and value > MAX_NUM_PROMPTS:
            raise ValueError(
                f"{value:,} requests are more than ferry simulates in one run (at most {MAX_NUM_PROMPTS:,}, about 20 "
                "GB of request columns and records); split the workload"
            )
        return value

    @field_validator("trace_format")
    @classmethod
    def _format(cls, value: str) -> str:
        if value not in FORMATS:
            raise ValueError(f"unknown trace format {value!r}; choose one of {', '.join(FORMATS)}")
        return value

    @model_validator(mode="after")
    def _check(self) -> WorkloadConfig:
        changed = changed_fields(self)
        if self.max_concurrency is not None and self.turns > 1:
            raise ValueError(
                f"max_concurrency={self.max_concurrency} with turns={self.turns}: a closed loop of clients sends "
                "requests of its own; conversations send each turn after the last (not modelled together)"
            )
        if self.trace is not None:
            ignored = sorted(k for k in changed if k in SYNTHETIC_ONLY)
            if ignored:
                raise ValueError(
                    f"{', '.join(f'{k}={show(getattr(self, k))}' for k in ignored)}: synthetic-workload "
                    "setting(s) that --trace ignores (a trace brings its arrivals and lengths; --trace-time-scale "
                    "speeds it up, --num-prompts takes its first N)"
                )
        else:
            ignored = sorted(k for k in changed if k in TRACE_ONLY)
            if ignored:
                raise ValueError(f"{', '.join(ignored)}: setting(s) of a trace replay, given without --trace")
            if "think_time_s" in changed and self.turns == 1:
                raise ValueError(
                    f"think_time_s={show(self.think_time_s)} is the pause between the turns of a conversation; give "
                    "--turns 2 or more (each request is one turn without it)"
                )
            if "num_prefix_groups" in changed and self.prefix_len == 0:
                raise ValueError(
                    f"num_prefix_groups={self.num_prefix_groups} counts shared prompts of --prefix-len tokens; give "
                    "--prefix-len (no request shares a prefix without it)"
                )
            if self.lengths_max_total is not None and self.lengths_from is None:
                raise ValueError(
                    f"lengths_max_total={self.lengths_max_total} filters the rows of --lengths-from, which is not given"
                )
            if math.isfinite(self.request_rate):
                n = self.num_prompts if self.num_prompts is not None else 1000
                if n / self.request_rate > MAX_HORIZON_S:
                    raise ValueError(
                        f"request_rate={self.request_rate:g} spreads {n:,} requests over {n / self.request_rate:.3g} "
                        f"s, past what ferry simulates ({MAX_HORIZON_S:.0e} s, about 32 years); raise --request-rate"
                    )
        return self


def show(value: Any) -> str:
    """A setting as a user writes it: a length spec as its text, a number plainly, anything else as repr."""
    if hasattr(value, "text"):  # a length spec
        return str(value.text())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:g}"
    if isinstance(value, Path):
        return str(value)
    return repr(value)


def changed_fields(model: BaseModel) -> list[str]:
    """Fields given to ``model`` with a value other than their default (a resolved config written back, as
    ``summary.json`` holds it, gives every field, most of them at their defaults)."""
    fields = type(model).model_fields
    return [k for k in model.model_fields_set if getattr(model, k) != fields[k].get_default(call_default_factory=True)]


SYNTHETIC_ONLY = ("request_rate", "burstiness", "lengths_from", "lengths_max_total", "input_len", "output_len", "seed",
                  "prefix_len", "num_prefix_groups", "turns", "think_time_s")  # fmt: skip
TRACE_ONLY = ("trace_format", "trace_time_scale", "sort_trace")
