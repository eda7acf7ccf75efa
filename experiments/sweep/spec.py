"""The sweep file: a base run config, the axes to vary, seeds, a filter, and the mode (one run per point, or the
highest request rate that meets an SLO). Expanding it gives the points, each a full `ferry run` config with a content
hash of everything that decides its result.

Example::

    base: {model: llama-3-8b, hardware: a100-80g, num_prompts: 1000, input_len: 1024, output_len: 128}
    # or: config: run.yaml (a `ferry run` config file; base fields override it)
    grid:                       # every combination
      policy: [continuous, chunked]
      max_num_batched_tokens: [512, 2048, 8192]
    zip:                        # varied together (equal lengths)
      request_rate: [2, 4, 8]
      seed: [0, 1, 2]
    seeds: 2                    # replicas of each point: workload seeds 0, 1 (or a list)
    where: "policy == 'chunked' or max_num_batched_tokens >= 4096"
    mode: run                   # or max_rate, with slo: {tpot_p99_ms: 100} (and/or min_goodput, goodput)
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from experiments.config import RunConfig
from experiments.plan.slo import SLO, parse_slo

MAX_POINTS = 1_000_000


class SweepSpec(BaseModel):
    """What a sweep file holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: dict[str, Any] = Field(default_factory=dict, description="`ferry run` fields shared by every point")
    config: Path | None = Field(None, description="a `ferry run` config file under the base fields")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="axes whose every combination is run")
    zip: dict[str, list[Any]] = Field(default_factory=dict, description="axes varied together (equal lengths)")
    seeds: StrictInt | list[StrictInt] | None = Field(None, description="workload seeds per point: a count or a list")
    where: str | list[str] | None = Field(None, description="keep only points where these expressions are true")
    mode: Literal["run", "max_rate"] = "run"
    slo: dict[str, float] = Field(default_factory=dict, description="max_rate: limits such as tpot_p99_ms: 100")
    min_goodput: float | None = None
    goodput: dict[str, float] = Field(default_factory=dict, description="max_rate: per-request thresholds (ms)")
    rate_start: float = Field(4.0, gt=0, description="max_rate: the first rate tried (requests/s)")
    rate_tolerance: float = Field(0.05, gt=0, lt=1, description="max_rate: relative width the search stops at")

    @field_validator("grid", "zip")
    @classmethod
    def _lists(cls, axes: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, values in axes.items():
            if not values:
                raise ValueError(f"axis {name!r} has no values")
        return axes

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        lengths = {len(v) for v in self.zip.values()}
        if len(lengths) > 1:
            raise ValueError(f"zip axes must have equal lengths, got {sorted(lengths)}")
        both = set(self.grid) & set(self.zip)
        if both:
            raise ValueError(f"{', '.join(sorted(both))}: in both grid and zip")
        if "seed" in (set(self.grid) | set(self.zip)) and self.seeds is not None:
            raise ValueError("seed is swept as an axis and by seeds: give one")
        if self.mode == "max_rate":
            self.slo_object()
            if "request_rate" in (set(self.grid) | set(self.zip)):
                raise ValueError("mode max_rate searches the request rate: do not sweep request_rate")
        elif self.slo or self.min_goodput is not None or self.goodput:
            raise ValueError("slo, min_goodput and goodput apply to mode: max_rate")
        return self

    def slo_object(self) -> SLO:
        return parse_slo([f"{k}={v}" for k, v in self.slo.items()] or None, self.min_goodput,
                         [f"{k}:{v}" for k, v in self.goodput.items()] or None)  # fmt: skip

    def swept(self) -> list[str]:
        """The names of the swept parameters, in file order (the seed last)."""
        names = [*self.grid, *self.zip]
        return names + (["seed"] if self.seeds is not None and "seed" not in names else [])


@dataclass
class Point:
    """One run of a sweep."""

    index: int  # its place in the expansion
    params: dict[str, Any]  # the swept values
    config: RunConfig | None  # the full run config (None when its settings are invalid)
    hash: str  # content hash of what decides its result
    error: str = ""  # why the config is invalid
    extra: dict[str, Any] = field(default_factory=dict)


def load_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping (base, grid, zip, seeds, where, mode ...)")
    if isinstance(data.get("config"), str):
        data["config"] = str((path.parent / data["config"]).resolve())
    try:
        return SweepSpec.model_validate(data)
    except ValueError as exc:
        from experiments.teach.scenario import one_line

        raise ValueError(f"{path}: {one_line(exc)}") from None


def combinations(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every point's swept values: the grid's product, times the zip's rows, times the seeds; then the filter."""
    grid = [dict(zip(spec.grid, values, strict=True)) for values in itertools.product(*spec.grid.values())]
    n_zip = len(next(iter(spec.zip.values()))) if spec.zip else 1
    zipped = [{k: v[i] for k, v in spec.zip.items()} for i in range(n_zip)]
    seeds = list(range(spec.seeds)) if isinstance(spec.seeds, int) else spec.seeds
    points: list[dict[str, Any]] = []
    for g, z in itertools.product(grid, zipped):
        for seed in seeds if seeds is not None else [None]:
            params = g | z | ({"seed": seed} if seed is not None else {})
            if len(points) > MAX_POINTS:
                raise ValueError(f"more than {MAX_POINTS:,} points: split the sweep")
            points.append(params)
    conditions = [spec.where] if isinstance(spec.where, str) else (spec.where or [])
    checks = [_compile(c) for c in conditions]
    return [p for p in points if all(_holds(c, code, p) for c, code in zip(conditions, checks, strict=True))]


_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare, ast.Eq,
            ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.BinOp, ast.Add, ast.Sub, ast.Mult,
            ast.Div, ast.FloorDiv, ast.Mod, ast.Name, ast.Load, ast.Constant, ast.List, ast.Tuple)  # fmt: skip


def _compile(condition: str) -> Any:
    """A ``where`` expression, allowed only comparisons, arithmetic, and/or/not, names and constants."""
    try:
        tree = ast.parse(condition, mode="eval")
    except SyntaxError:
        raise ValueError(f"where {condition!r}: not an expression") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ValueError(f"where {condition!r}: {type(node).__name__} is not allowed (only comparisons, "
                             "arithmetic, and/or/not, swept names and constants)")  # fmt: skip
    return compile(tree, "<where>", "eval")


def _holds(condition: str, code: Any, params: dict[str, Any]) -> bool:
    try:
        return bool(eval(code, {"__builtins__": {}}, dict(params)))  # noqa: S307 (checked: no calls, no attributes)
    except NameError as exc:
        raise ValueError(f"where {condition!r}: {exc} (names are the swept parameters)") from None


def expand(spec: SweepSpec) -> list[Point]:
    """The sweep's points with their full configs and hashes (a point whose settings are invalid keeps the error)."""
    base: dict[str, Any] = {}
    if spec.config is not None:
        base = RunConfig.load(spec.config).model_dump(mode="json", exclude_unset=True)
    out = []
    for index, params in enumerate(combinations(spec)):
        fields = dict(spec.base) | params
        try:
            config: RunConfig | None = RunConfig.load_dict(base, fields)
            error = ""
        except ValueError as exc:
            from experiments.teach.scenario import one_line

            config, error = None, one_line(exc)
        what = config.to_jsonable() if config is not None else {"invalid": fields}
        if spec.mode == "max_rate":
            what = what | {"mode": "max_rate", "slo": spec.slo, "min_goodput": spec.min_goodput,
                           "goodput": spec.goodput, "rate_start": spec.rate_start,
                           "rate_tolerance": spec.rate_tolerance}  # fmt: skip
        digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:20]
        out.append(Point(index, params, config, digest, error))
    return out
