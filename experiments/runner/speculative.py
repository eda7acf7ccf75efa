"""``--speculative-config``: vLLM's speculative decoding settings, under vLLM 0.32.0's key names, and the acceptance
model ferry draws from.

vLLM's keys (``vllm/config/speculative.py``, ``SpeculativeConfig``) that ferry reads: ``method`` (eagle, eagle3, mtp,
ngram, draft_model), ``num_speculative_tokens``, ``model`` (a draft model: a built-in name or a ``config.json``;
an EAGLE head's name), ``prompt_lookup_max`` / ``prompt_lookup_min`` (ngram), ``num_speculative_tokens_per_batch_size``
(dynamic speculation: ``[start, end, k]`` inclusive batch-size ranges), ``rejection_sample_method`` with
``synthetic_acceptance_rates`` or ``synthetic_acceptance_length``, ``disable_eagle_block_drop`` and
``draft_tensor_parallel_size``. One key is ferry's own: ``acceptance``, the name of a preset of ``acceptance.yaml``
(beside this module), each number cited; with ``rejection_sample_method='standard'`` (vLLM's default) the
acceptance is drawn from that preset's rates, else from the synthetic ones, which vLLM reads as unconditional
per-position rates (``p_i``: the chance that the first ``i`` drafts are all accepted).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from costmodel import strict_yaml
from sim.kernels.speculation import conditional
from sim.speculation import Speculation, dense_schedule

PRESETS = Path(__file__).with_name("acceptance.yaml")
METHODS = ("eagle", "eagle3", "mtp", "ngram", "draft_model")
EAGLE_LIKE = ("eagle", "eagle3", "mtp")  # drafters fed the target's hidden states (vLLM's use_eagle)
MAX_DRAFTS = 32  # draft tokens per step ferry accepts (vLLM has no bound; chains beyond ~10 accept next to nothing)


class SpeculativeConfig(BaseModel):
    """vLLM's ``--speculative-config`` (the keys ferry models), with ferry's ``acceptance`` preset."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["eagle", "eagle3", "mtp", "ngram", "draft_model"] | None = Field(
        None, description="the drafter; None: ngram if model is 'ngram', else draft_model (as vLLM infers it)"
    )
    num_speculative_tokens: StrictInt | None = Field(
        None, ge=1, le=MAX_DRAFTS, description="draft tokens per request and step (k); mtp: 1 when not given"
    )
    model: str | None = Field(
        None,
        description="draft_model: the draft's built-in name or config.json path; eagle, eagle3: the head's name "
        "(informative); mtp, ngram: leave it out",
    )
    prompt_lookup_max: StrictInt | None = Field(None, ge=1, description="ngram: the longest n-gram looked up (5)")
    prompt_lookup_min: StrictInt | None = Field(None, ge=1, description="ngram: the shortest n-gram looked up (5)")
    num_speculative_tokens_per_batch_size: list[tuple[StrictInt, StrictInt, StrictInt]] | None = Field(
        None, description="dynamic speculation: [start, end, k] inclusive batch-size ranges, the first from 1"
    )
    rejection_sample_method: Literal["standard", "synthetic"] = Field(
        "standard",
        description="standard: drafts accepted at the acceptance preset's rates; synthetic: at "
        "synthetic_acceptance_rates (or _length), as vLLM's synthetic rejection sampler accepts them",
    )
    synthetic_acceptance_rates: list[float] | None = Field(
        None, description="synthetic: unconditional rate of each position (k entries in [0, 1], non-increasing)"
    )
    synthetic_acceptance_length: float | None = Field(
        None, description="synthetic: the mean acceptance length in [1, k + 1] (vLLM's minimum-variance schedule)"
    )
    disable_eagle_block_drop: StrictBool = Field(
        False, description="eagle, eagle3, mtp: keep the last block of a prefix-cache hit (vLLM drops it)"
    )
    draft_tensor_parallel_size: StrictInt | None = Field(
        None, ge=1, description="draft_model: GPUs the draft is split over (1, or the target's; default the target's)"
    )
    acceptance: str | None = Field(
        None,
        description="ferry's own key: a preset of experiments/runner/acceptance.yaml (default: by method and model)",
    )

    @field_validator("num_speculative_tokens_per_batch_size")
    @classmethod
    def _schedule(cls, schedule: list[tuple[int, int, int]] | None) -> list[tuple[int, int, int]] | None:
        """vLLM's checks (``vllm/v1/spec_decode/dynamic/utils.py``, ``validate_and_normalize_dynamic_sd_schedule``)."""
        if schedule is None:
            return None
        if not schedule:
            raise ValueError("num_speculative_tokens_per_batch_size must not be empty")
        for start, end, k in schedule:
            if start <= 0 or end <= 0:
                raise ValueError(f"batch-size range ({start}, {end}) must be positive")
            if start > end:
                raise ValueError(f"batch-size range start must be <= end for ({start}, {end}, {k})")
            if k < 0:
                raise ValueError(f"({start}, {end}, {k}): num_speculative_tokens values must be >= 0")
        ordered = sorted(schedule)
        previous = 0
        for start, end, _ in ordered:
            if start <= previous:
                raise ValueError("batch-size ranges must be non-overlapping and sorted")
            previous = end
        if ordered[0][0] != 1:
            raise ValueError("the first batch-size range must start at 1 so every batch size has a draft count")
        return ordered

    @model_validator(mode="after")
    def _check(self) -> SpeculativeConfig:
        method = self.resolved_method
        k = self.num_speculative_tokens
        if k is None and method != "mtp":
            raise ValueError(f"method {method}: give num_speculative_tokens (the draft tokens per step)")
        k = self.k
        if method == "draft_model" and not self.model:
            raise ValueError("method draft_model: give model (a built-in model name or a config.json path)")
        if method in ("mtp", "ngram") and self.model not in (None, "ngram"):
            raise ValueError(f"method {method}: model={self.model!r} is not read (the drafter is the target's "
                             "own MTP module, or prompt lookup); leave it out")  # fmt: skip
        lookup = (self.prompt_lookup_max, self.prompt_lookup_min)
        if method != "ngram" and lookup != (None, None):
            raise ValueError(f"prompt_lookup_max / prompt_lookup_min: only method ngram reads them, not {method}")
        if method == "ngram" and self.lookup_window[0] > self.lookup_window[1]:
            raise ValueError(f"prompt_lookup_min={self.lookup_window[0]} must be <= "
                             f"prompt_lookup_max={self.lookup_window[1]}")  # fmt: skip
        if self.disable_eagle_block_drop and method not in EAGLE_LIKE:
            raise ValueError(f"disable_eagle_block_drop: only eagle, eagle3 and mtp drop a cached block, not {method}")
        if self.draft_tensor_parallel_size is not None and method != "draft_model":
            raise ValueError(f"draft_tensor_parallel_size: only method draft_model has a draft to split, not {method}")
        synthetic = (self.synthetic_acceptance_rates, self.synthetic_acceptance_length)
        if self.rejection_sample_method == "synthetic":
            if (synthetic[0] is None) == (synthetic[1] is None):
                raise ValueError("rejection_sample_method='synthetic' requires exactly one of "
                                 "synthetic_acceptance_rates or synthetic_acceptance_length")  # fmt: skip
            if self.acceptance is not None:
                raise ValueError("acceptance names a preset for rejection_sample_method='standard'; with 'synthetic' "
                                 "the synthetic rates are the acceptance")  # fmt: skip
            _synthetic_rates(k, *synthetic)  # checks them
        elif synthetic != (None, None):
            raise ValueError("synthetic_acceptance_rates / synthetic_acceptance_length are only valid with "
                             "rejection_sample_method='synthetic'")  # fmt: skip
        if self.acceptance is not None and self.acceptance not in presets():
            raise ValueError(f"acceptance={self.acceptance!r}: not a preset; choose one of {', '.join(presets())}")
        return self

    @property
    def resolved_method(self) -> str:
        """The method, inferred as vLLM infers it when not given."""
        if self.method is not None:
            return self.method
        return "ngram" if self.model in ("ngram", "[ngram]") else "draft_model"

    @property
    def k(self) -> int:
        """num_speculative_tokens (mtp: 1 when not given, the MTP module's one prediction)."""
        return self.num_speculative_tokens if self.num_speculative_tokens is not None else 1

    @property
    def lookup_window(self) -> tuple[int, int]:
        """ngram's (prompt_lookup_min, prompt_lookup_max), defaulted as vLLM does (5 and 5, or the one given)."""
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            return 5, 5
        return (lo if lo is not None else hi), (hi if hi is not None else lo)  # type: ignore[return-value]

    def describe(self) -> str:
        """One line for a run's header."""
        extra = ""
        schedule = self.num_speculative_tokens_per_batch_size
        if schedule is not None:
            extra = ", k by batch size " + " ".join(f"{a}-{b}:{c}" for a, b, c in schedule)
        model = f" ({self.model})" if self.model and self.resolved_method not in ("ngram", "mtp") else ""
        return f"{self.resolved_method}{model}, k={self.k}{extra}"


def parse(text: str | dict[str, Any]) -> SpeculativeConfig:
    """``--speculative-config``'s JSON (as vLLM takes it), or a mapping."""
    if isinstance(text, dict):
        return SpeculativeConfig.model_validate(text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--speculative-config {text!r}: not JSON ({exc.msg}); e.g. "
                         "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'") from None  # fmt: skip
    if not isinstance(data, dict):
        raise ValueError(f"--speculative-config {text!r}: expected a JSON object of vLLM's keys")
    return SpeculativeConfig.model_validate(data)


def _synthetic_rates(k: int, rates: list[float] | None, length: float | None) -> list[float]:
    """vLLM's ``_resolve_synthetic_acceptance_rates``: the rates checked, or a mean acceptance length as the
    minimum-variance schedule (``_acceptance_length_to_rates``)."""
    if rates is not None:
        if len(rates) != k:
            raise ValueError(f"synthetic_acceptance_rates must have length {k} (num_speculative_tokens), got {rates}")
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"synthetic_acceptance_rates entries must be in [0, 1], got {rates}")
        if any(rates[i] > rates[i - 1] for i in range(1, k)):
            raise ValueError(f"synthetic_acceptance_rates must be non-increasing, got {rates}")
        return list(rates)
    assert length is not None
    if not 1.0 <= length <= k + 1:
        raise ValueError(f"synthetic_acceptance_length must be in [1, {k + 1}], got {length}")
    drafts = length - 1
    full = int(drafts)
    return ([1.0] * full + [drafts - full] + [0.0] * (k - full - 1))[:k]


# ---- acceptance presets ----------------------------------------------------------------------------------------------


def presets() -> dict[str, dict[str, Any]]:
    """The presets of ``acceptance.yaml``, by name."""
    data = strict_yaml.load_file(PRESETS)
    return dict(data["presets"])


def preset_rates(entry: dict[str, Any]) -> list[float]:
    """A preset's unconditional per-position rates, from what its source published (``acceptance.yaml``'s header)."""
    if "unconditional" in entry:
        return [float(x) for x in entry["unconditional"]]
    if "acceptance_length_by_k" in entry:
        lengths = [1.0, *(float(x) for x in entry["acceptance_length_by_k"])]
        return [max(lengths[i] - lengths[i - 1], 0.0) for i in range(1, len(lengths))]
    length, k = float(entry["acceptance_length"]), int(entry["at_k"])
    lo, hi = 0.0, 1.0  # 1 + a + ... + a^k = length, a in [0, 1]
    for _ in range(100):
        a = (lo + hi) / 2
        if sum(a**i for i in range(k + 1)) < length:
            lo = a
        else:
            hi = a
    return [lo**i for i in range(1, k + 1)]


def choose_preset(method: str, model: str) -> str:
    """The preset a run of ``method`` on target ``model`` takes when the config names none."""
    table = presets()
    for name, entry in table.items():
        if method in entry.get("methods", []) and model in entry.get("models", []):
            return name
    return next(name for name, entry in table.items() if method in entry.get("default_for", []))


def unconditional_rates(config: SpeculativeConfig, target: str) -> tuple[list[float], str]:
    """The k unconditional rates a run draws from, and where they come from (one line)."""
    k = config.k
    if config.rejection_sample_method == "synthetic":
        rates = _synthetic_rates(k, config.synthetic_acceptance_rates, config.synthetic_acceptance_length)
        return rates, "synthetic_acceptance_" + ("rates" if config.synthetic_acceptance_rates else "length")
    name = config.acceptance or choose_preset(config.resolved_method, target)
    rates = preset_rates(presets()[name])
    note = f"preset {name}"
    if len(rates) < k:  # the last conditional rate repeated (an assumption the header states)
        cond = conditional(rates)
        rates = rates + [rates[-1] * cond[-1] ** (i + 1) for i in range(k - len(rates))]
        note += f" (its {len(cond)} positions; beyond, the last conditional rate {cond[-1]:.3f} repeated: assumed)"
    return rates[:k], note


def speculation(config: SpeculativeConfig, target: str, max_num_seqs: int, seed: int) -> Speculation:
    """What one replica's scheduler and engine run for ``config`` (target model ``target``, ``max_num_seqs`` seats),
    the acceptance draws seeded by ``seed``."""
    method, k = config.resolved_method, config.k
    rates, source = unconditional_rates(config, target)
    per_batch = None
    if config.num_speculative_tokens_per_batch_size is not None:
        per_batch = dense_schedule(config.num_speculative_tokens_per_batch_size, max_num_seqs, k)
    return Speculation(
        method=method,
        num_speculative_tokens=k,
        rates=np.array(conditional(rates), dtype=np.float64),
        seed=int(seed),
        lookahead=k if method != "ngram" else 0,  # vllm/config/vllm.py, num_lookahead_tokens
        draft_slots=1 if method == "draft_model" else 0,  # vllm/config/speculative.py, max_num_new_slots_for_drafting
        drop_cached_block=method in EAGLE_LIKE and not config.disable_eagle_block_drop,
        per_batch=per_batch,
        acceptance=source,
    )


def mean_acceptance_length(unconditional: list[float]) -> float:
    """1 + the expected accepted drafts of a step of all k positions (the sum of the unconditional rates)."""
    return 1.0 + math.fsum(unconditional)
