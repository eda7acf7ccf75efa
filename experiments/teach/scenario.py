"""A teaching scenario: a handful of requests (arrival, prompt and output tokens) and the policies to run them through,
written as a small YAML file a teacher can copy and change (``experiments/teach/scenarios/*.yaml`` are the built-in
ones, one per figure of the chapter's argument).

Example::

    name: refill
    figures: ["6-3", "6-4"]          # the chapter's figures this scenario draws
    title: {en: "...", ko: "..."}
    model: llama-3-8b                # any `ferry run` model and hardware
    hardware: h100-sxm
    settings: {max_model_len: 4096}  # `ferry run` fields every policy shares
    requests:                        # arrival (ms from the start), prompt and output tokens; ids 1, 2, ...
      - {arrival_ms: 0, prompt: 200, output: 3}
    policies:                        # each: `ferry run` scheduler fields; `label` names it (default: the policy)
      - {policy: static, max_batch_size: 3}
      - {policy: continuous, max_num_seqs: 3}
    animate: [dynamic, continuous]   # optional: labels of two policies for the boats' GIF
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from costmodel import strict_yaml
from experiments.errors import one_line
from experiments.runner.config import RunConfig
from policies.config import Number
from sim.workload import Workload

BUILTIN_DIR = "scenarios"


class TeachRequest(BaseModel):
    """One passenger: when it reaches the dock and how long its trip is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    arrival_ms: Number = Field(..., ge=0, description="arrival, ms from the start of the scenario")
    prompt: StrictInt = Field(..., ge=1, description="prompt tokens")
    output: StrictInt = Field(..., ge=1, description="output tokens wanted")


class Words(BaseModel):
    """A text in each language the figures speak."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    en: str
    ko: str

    def get(self, lang: str) -> str:
        return self.ko if lang == "ko" else self.en


class Scenario(BaseModel):
    """What `ferry teach` runs and draws for one picture of the chapter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9-]*$", description="file stem of its figures")
    figures: tuple[str, ...] = Field((), description="the chapter's figures (6-3, ...) this scenario draws")
    title: Words
    point: Words | None = Field(None, description="what to look at, one sentence per language")
    model: str = "llama-3-8b"
    hardware: str = "h100-sxm"
    settings: dict[str, Any] = Field(default_factory=dict, description="`ferry run` fields all policies share")
    requests: tuple[TeachRequest, ...] = Field(..., min_length=1, max_length=64)
    policies: tuple[dict[str, Any], ...] = Field(..., min_length=1, max_length=8)
    animate: tuple[str, str] | None = Field(None, description="two policy labels drawn as boats in a GIF")

    @field_validator("requests")
    @classmethod
    def _ordered(cls, value: tuple[TeachRequest, ...]) -> tuple[TeachRequest, ...]:
        times = [r.arrival_ms for r in value]
        if times != sorted(times):
            raise ValueError("requests must be listed in arrival order (arrival_ms non-decreasing)")
        return value

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        labels = self.labels()
        if len(set(labels)) != len(labels):
            raise ValueError(f"policies: two share a label ({', '.join(labels)}); give each a distinct `label`")
        if self.animate is not None:
            missing = [a for a in self.animate if a not in labels]
            if missing:
                raise ValueError(f"animate: {', '.join(missing)} is not a policy label here ({', '.join(labels)})")
        for label in labels:
            self.run_config(label)  # every policy's settings are a valid run config, checked now
        return self

    def labels(self) -> list[str]:
        """Each policy's label: its ``label`` field, else its policy name."""
        return [str(p.get("label", p.get("policy", "continuous"))) for p in self.policies]

    def entry(self, label: str) -> dict[str, Any]:
        return self.policies[self.labels().index(label)]

    def run_config(self, label: str) -> RunConfig:
        """The `ferry run` config of one policy of this scenario (records its batches; the reference engine, which
        gives the compiled engine's records and starts at once on a handful of requests)."""
        fields = {k: v for k, v in self.entry(label).items() if k != "label"}
        data = {"model": self.model, "hardware": self.hardware, "engine": "reference"} | self.settings | fields
        data["record_batches"] = True
        try:
            return RunConfig.model_validate(data)
        except ValueError as exc:
            raise ValueError(f"policy {label!r}: {one_line(exc)}") from None

    def workload(self) -> Workload:
        """The requests as a workload, ids "1", "2", ... as the chapter numbers them."""
        n = len(self.requests)
        return Workload.from_arrays(
            np.array([r.arrival_ms for r in self.requests]) / 1000.0,
            [r.prompt for r in self.requests],
            [r.output for r in self.requests],
            request_id=[str(i + 1) for i in range(n)],
            source=f"teach:{self.name}",
        )


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario YAML file; errors name the file and the field."""
    path = Path(path)
    try:
        data = strict_yaml.load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping (name, title, requests, policies ...)")
    try:
        return Scenario.model_validate(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {one_line(exc)}") from None


def builtin_paths() -> list[Path]:
    """The built-in scenario files, in the order of the chapter's argument (their names start with a number)."""
    folder = resources.files("experiments.teach") / BUILTIN_DIR
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml"))


def builtin_scenarios() -> list[Scenario]:
    return [load_scenario(p) for p in builtin_paths()]


def pick_scenarios(names: list[str] | None, model: str | None = None, hardware: str | None = None) -> list[Scenario]:
    """Scenarios by built-in name or file path (None: every built-in one), with ``model`` / ``hardware`` replacing
    each one's own when given."""
    builtin = {load_scenario(p).name: p for p in builtin_paths()}
    chosen = []
    for name in names or list(builtin):
        if name in builtin:
            chosen.append(load_scenario(builtin[name]))
        elif Path(name).suffix in (".yaml", ".yml") or Path(name).exists():
            chosen.append(load_scenario(name))
        else:
            raise ValueError(f"--scenario {name!r}: not a built-in scenario ({', '.join(builtin)}) nor a YAML file")
    update = {k: v for k, v in (("model", model), ("hardware", hardware)) if v is not None}
    if update:
        chosen = [Scenario.model_validate(s.model_dump() | update) for s in chosen]
    return chosen
