"""What `ferry explore`'s page asks for and what it gets back: the settings (a query string's keys, each one control
on the page), their check with errors that name the control, and one simulation as the JSON the page draws.

A run here is `ferry run` with the same settings: the settings become a ``RunConfig`` (``Explorer.run_config``) that
records its batches, and the JSON is read from that run's records (``experiments.teach.runs.PolicyRun``, the frames
`ferry teach` draws from). Times are milliseconds from the start of the workload.

Before it simulates, a run is planned (``Explorer.plan``): its requests are drawn and their work counted, requests x
(prompt + output) tokens, against the server's limit (``--max-run-tokens``, ``experiments.http_limits``). The drawn
lengths are the run's own (the same seed), so the count is exact where the length specs' upper bounds would refuse
cheap runs (a lognormal whose ``max=`` is far above its median) and their means would miss a heavy tail.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from costmodel.hardware import builtin_hardware
from costmodel.model_spec import builtin_models
from experiments.explore.drawing import run_json
from experiments.http_limits import DEFAULT_MAX_RUN_TOKENS
from experiments.runner.config import RunConfig
from experiments.runner.simulation import build_workload
from experiments.teach.runs import policy_run
from experiments.teach.scenario import Scenario, one_line
from policies.config import APPLIES_TO, BUILTIN_POLICIES, Number
from sim.workload import Workload
from sim.workload.lengths import LognormalLength, parse_length_spec

MAX_PROMPTS = 2000  # requests one page run may simulate (a few seconds at most on a laptop)
MAX_LENGTH = 32768  # tokens: the page's longest prompt or output a length spec may ask for (a lognormal is cut there)

Policy = Literal["none", "static", "dynamic", "continuous", "chunked"]
assert set(Policy.__args__) == set(BUILTIN_POLICIES)  # type: ignore[attr-defined]


class Settings(BaseModel):
    """Every control of the page, by its key (the query string's and the element id's). Units: ms, tokens, req/s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: Literal["synthetic", "scenario"] = Field("synthetic", description="requests drawn, or the scenario's")
    policy: Policy = "dynamic"
    max_batch_size: int = Field(4, ge=1, le=1024, description="static, dynamic: requests per boat")
    max_delay_ms: Number = Field(0.0, ge=0, le=60_000, description="dynamic: longest the first passenger waits (ms)")
    max_num_seqs: int = Field(4, ge=1, le=1024, description="continuous, chunked: sequences per iteration")
    max_num_batched_tokens: int = Field(4096, ge=1, le=1_048_576, description="tokens per iteration")
    long_prefill_token_threshold: int = Field(0, ge=0, le=1_048_576, description="chunked: cap on one chunk")
    mix_prefill_decode: StrictBool = Field(False, description="continuous: prefills and decodes in one iteration")
    request_rate: Number = Field(40.0, gt=0, description="requests per second (inf: all at once)")
    num_prompts: int = Field(12, ge=1, le=MAX_PROMPTS, description="requests")
    input_len: str = Field("uniform:64:512", description="prompt tokens: a length spec")
    output_len: str = Field("uniform:8:32", description="output tokens: a length spec")
    seed: int = Field(0, ge=0, le=2**31, description="seed of the drawn requests")
    model: str = "llama-3-8b"
    hardware: str = "h100-sxm"
    max_model_len: int = Field(4096, ge=1, description="max prompt + output tokens of one request")


KEYS = tuple(Settings.model_fields)
# the controls a policy reads (the others are greyed out on the page and left out of its run)
READ_BY: dict[str, tuple[str, ...]] = {
    key: APPLIES_TO[key] for key in ("max_batch_size", "max_delay_ms", "max_num_seqs", "max_num_batched_tokens")
} | {key: APPLIES_TO[key] for key in ("long_prefill_token_threshold", "mix_prefill_decode")}
SYNTHETIC_ONLY = ("request_rate", "num_prompts", "input_len", "output_len", "seed")  # unused with a scenario's requests
SCHEDULER_KEYS = (*READ_BY, "max_model_len")
WORKLOAD_KEYS = SYNTHETIC_ONLY


class SettingError(ValueError):
    """A setting the page cannot run, with the control it belongs to (``field``; None: not one control's)."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message

    def to_json(self) -> dict[str, Any]:
        return {"error": {"field": self.field, "message": self.message}}


@dataclass(frozen=True)
class Explorer:
    """The page's defaults and what every run shares: the built-in ones, or those of a teaching scenario (its model,
    hardware and shared settings, its first policy and that policy's limits, and its requests as the ``scenario``
    workload)."""

    defaults: Settings = field(default_factory=Settings)
    scenario: Scenario | None = None
    models: tuple[str, ...] = field(default_factory=lambda: tuple(builtin_models()))
    hardware: tuple[str, ...] = field(default_factory=lambda: tuple(builtin_hardware()))
    # the most work one run may be: its requests' prompt and output tokens summed (tokens)
    max_run_tokens: int = DEFAULT_MAX_RUN_TOKENS

    @classmethod
    def of_scenario(cls, scenario: Scenario) -> Explorer:
        given: dict[str, Any] = {"workload": "scenario", "model": scenario.model, "hardware": scenario.hardware}
        first = scenario.policies[0].get("policy", "continuous")
        for entry in scenario.policies:  # the first policy's, then what later ones add that the first does not read
            for key, value in entry.items():
                later = entry is not scenario.policies[0]
                if key in KEYS and key not in given and not (later and first in READ_BY.get(key, ())):
                    given[key] = value
        given.setdefault("policy", first)
        if "max_model_len" in scenario.settings:
            given["max_model_len"] = scenario.settings["max_model_len"]
        try:
            defaults = Settings.model_validate(given)
        except ValidationError as exc:
            raise ValueError(f"scenario {scenario.name}: {_first(exc)[1]}") from None
        models = tuple(dict.fromkeys([*builtin_models(), scenario.model]))
        hardware = tuple(dict.fromkeys([*builtin_hardware(), scenario.hardware]))
        return cls(defaults, scenario, models, hardware)

    def parse(self, query: Mapping[str, str]) -> Settings:
        """The settings a query string gives, over the defaults; a bad key or value raises ``SettingError``."""
        unknown = [k for k in query if k not in KEYS and k != "lang"]
        if unknown:
            raise SettingError(None, f"{unknown[0]!r} is not a setting (settings: {', '.join(KEYS)})")
        given = {k: _from_text(k, v) for k, v in query.items() if k in KEYS}
        try:
            settings = Settings.model_validate(self.defaults.model_dump() | given)
        except ValidationError as exc:
            raise SettingError(*_first(exc)) from None
        if settings.model not in self.models:
            raise SettingError("model", f"model {settings.model!r}: choose one of {', '.join(self.models)}")
        if settings.hardware not in self.hardware:
            raise SettingError("hardware", f"hardware {settings.hardware!r}: choose one of {', '.join(self.hardware)}")
        if settings.workload == "scenario" and self.scenario is None:
            raise SettingError("workload", "there is no scenario here: start ferry explore with --scenario")
        for key in ("input_len", "output_len"):
            _check_length(key, getattr(settings, key))
        return settings

    def query(self, settings: Settings) -> str:
        """The settings that differ from the defaults, as the page's query string (in control order)."""
        from urllib.parse import urlencode

        pairs = [(k, _to_text(getattr(settings, k))) for k in KEYS if getattr(settings, k) != getattr(self.defaults, k)]
        return urlencode(pairs)

    def run_config(self, settings: Settings) -> RunConfig:
        """The `ferry run` config of these settings: the policy's own limits only, its batches recorded."""
        policy = settings.policy
        scheduler = {k: getattr(settings, k) for k in SCHEDULER_KEYS if policy in READ_BY.get(k, (policy,))}
        if self.scenario is not None:  # a limit left at the page's default is the scenario's for this policy, or none
            own = self._entry(policy)
            untouched = [
                k for k in scheduler if k != "max_model_len" and getattr(settings, k) == getattr(self.defaults, k)
            ]
            scheduler |= {k: own.get(k, Settings.model_fields[k].default) for k in untouched}
        data: dict[str, Any] = {"model": settings.model, "hardware": settings.hardware, "policy": policy}
        if self.scenario is not None:
            data |= self.scenario.settings
            data |= {k: v for k, v in self._entry(policy).items() if k not in KEYS and k != "label"}
        data |= scheduler | {"record_batches": True}
        if settings.workload == "synthetic":
            data |= {k: getattr(settings, k) for k in WORKLOAD_KEYS}
            data |= {k: page_length(getattr(settings, k)) for k in ("input_len", "output_len")}
        try:
            return RunConfig.model_validate(data)
        except ValidationError as exc:
            raise SettingError(*_first(exc)) from None
        except ValueError as exc:
            raise SettingError(field_named(str(exc)), str(exc)) from None

    def workload(self, settings: Settings, config: RunConfig) -> Workload:
        if settings.workload == "scenario" and self.scenario is not None:
            return self.scenario.workload()
        return build_workload(config)

    def _entry(self, policy: str) -> dict[str, Any]:
        assert self.scenario is not None
        return next((p for p in self.scenario.policies if p.get("policy", "continuous") == policy), {})

    def plan(self, settings: Settings) -> Plan:
        """The run of the settings, its requests drawn, before it simulates; ``SettingError`` if its work is more than
        ``max_run_tokens`` (naming the length whose tokens are the most of it; with a scenario's requests, none)."""
        config = self.run_config(settings)
        try:
            workload = self.workload(settings, config)
        except (ValueError, OSError) as exc:
            message = " ".join(str(exc).split())
            raise SettingError(field_named(message), message) from None
        prompt, output = int(workload.prompt_tokens.sum()), int(workload.output_tokens.sum())
        tokens, n = prompt + output, len(workload.prompt_tokens)
        if tokens > self.max_run_tokens:
            key = None if settings.workload == "scenario" else "output_len" if output >= prompt else "input_len"
            raise SettingError(
                key,
                f"{key or 'workload'}: {n:,} requests of {tokens / max(n, 1):,.0f} prompt + output tokens on average "
                f"are {tokens:,} tokens to simulate, more than a run here may be ({self.max_run_tokens:,}: ferry "
                "explore --max-run-tokens)",
            )
        return Plan(config, workload, tokens)

    def run(self, settings: Settings, plan: Plan | None = None) -> dict[str, Any]:
        """Simulate the settings (as ``plan``ned, or planned now); the page's JSON (see ``run_json``). A run the
        simulator refuses (a model that does not fit the GPU, a prompt longer than max_model_len) raises
        ``SettingError`` naming the control."""
        plan = plan or self.plan(settings)
        try:
            run = policy_run(plan.config, plan.workload, settings.policy)
        except (ValueError, OSError) as exc:
            message = " ".join(str(exc).split())
            raise SettingError(field_named(message), message) from None
        if not run.summary["completed"]:  # nothing to draw: say why beside the control to change
            reasons = ", ".join(run.summary.get("rejected_by_reason") or {}) or "none finished"
            key = "max_model_len" if "max_model_len" in reasons else "model" if "kv_cache" in reasons else None
            raise SettingError(key, f"every request was rejected ({reasons.replace('_', ' ')})")
        return run_json(run, settings, self.query(settings))


@dataclass(frozen=True, slots=True)
class Plan:
    """A run the page may start: what it simulates, and how much."""

    config: RunConfig  # the `ferry run` config
    workload: Workload  # its requests, drawn
    tokens: int  # its work: the requests' prompt and output tokens summed (tokens)


def _first(exc: ValidationError) -> tuple[str | None, str]:
    """The control and the message of a validation error's first problem."""
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    key = next((p for p in reversed(loc) if p in KEYS), None)
    message = err["msg"].removeprefix("Value error, ")
    if key is None or key == "workload":  # a run config's "workload" is its section of workload settings
        key = field_named(message) or key
    given = err.get("input")
    if key is not None and not isinstance(given, dict) and key in loc:
        message = f"{key}: {message} (got {given!r})"
    return key, message


# words of the simulator's messages that point at a control when they name none by its key
_HINTS = (
    ("max_model_len", "max_model_len"),
    ("max-model-len", "max_model_len"),
    ("max_position_embeddings", "max_model_len"),
    ("does not fit", "model"),
    ("weights", "model"),
    ("KV cache", "model"),
    ("length spec", "input_len"),
)


def field_named(message: str) -> str | None:
    """The setting a message is about: the first setting key or ``--flag`` it names, else a known phrase's."""
    found = [(m.start(), key) for key in KEYS for m in re.finditer(rf"\b{key}\b|--{key.replace('_', '-')}", message)]
    if found:
        return min(found)[1]
    return next((key for phrase, key in _HINTS if phrase in message), None)


def _from_text(key: str, text: str) -> Any:
    """A query string value as the setting's type (pydantic checks it next); ``true``/``false`` for the checkbox."""
    if key == "mix_prefill_decode":
        lowered = text.strip().lower()
        if lowered in ("true", "1", "on", "yes"):
            return True
        if lowered in ("false", "0", "off", "no", ""):
            return False
        raise SettingError(key, f"{key}: expected true or false (got {text!r})")
    annotation = Settings.model_fields[key].annotation
    if annotation is int:
        try:
            return int(text)
        except ValueError:
            raise SettingError(key, f"{key}: expected a whole number (got {text!r})") from None
    if key in ("max_delay_ms", "request_rate"):
        try:
            value = float(text)
        except ValueError:
            raise SettingError(key, f"{key}: expected a number (got {text!r})") from None
        if math.isnan(value):
            raise SettingError(key, f"{key}: expected a number (got {text!r})")
        return value
    return text


def _to_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _check_length(key: str, text: str) -> None:
    """A length spec the page may draw from: any `ferry run` form but a file's (the page reads no server paths)."""
    if text.strip().startswith("empirical"):
        raise SettingError(key, f"{key}: the page draws lengths from a distribution, not a file (empirical:)")
    try:
        spec = parse_length_spec(text)
    except ValueError as exc:
        raise SettingError(key, f"{key}: {one_line(exc)}") from None
    bounds = [
        int(v) for k, v in spec.model_dump().items() if k in ("value", "low", "high", "min", "max") and v is not None
    ]
    high = max(bounds, default=0)
    if high > MAX_LENGTH:
        raise SettingError(key, f"{key}: {high:,} tokens is longer than the page draws (at most {MAX_LENGTH:,})")


def page_length(text: str) -> str:
    """The length spec a page run draws from: ``text``, but a lognormal without ``max=`` (which `ferry run` cuts at
    2**31 - 1 tokens) is cut at ``MAX_LENGTH``, the page's longest."""
    spec = parse_length_spec(text)
    if isinstance(spec, LognormalLength) and spec.max is None:
        return spec.model_copy(update={"max": MAX_LENGTH}).text()
    return text
