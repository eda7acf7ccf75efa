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
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from experiments.plan.slo import SLO, parse_slo
from experiments.runner.config import RunConfig
from experiments.runner.config_file import read_mapping

MAX_POINTS = 1_000_000
MAX_WHERE_CHARS = 10_000  # a where expression longer than this is a mistake (and slow to parse)


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
            twice = _repeated(values)
            if twice is not None:
                raise ValueError(f"axis {name!r} lists {twice!r} twice: each value is one point, give it once")
        return axes

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: int | list[int] | None) -> int | list[int] | None:
        if isinstance(seeds, int) and seeds < 1:
            raise ValueError(f"{seeds} replicas of each point; give a count >= 1 (or a list of seeds)")
        if isinstance(seeds, list):
            if not seeds:
                raise ValueError("an empty list; give a count >= 1 or the seeds")
            bad = next((x for x in seeds if x < 0), None)
            if bad is not None:
                raise ValueError(f"{bad} is not a workload seed (seeds are >= 0)")
            twice = _repeated(seeds)
            if twice is not None:
                raise ValueError(f"{twice} is listed twice; each seed is one point, give it once")
        return seeds

    @field_validator("where")
    @classmethod
    def _where(cls, where: str | list[str] | None) -> str | list[str] | None:
        for condition in [where] if isinstance(where, str) else (where or []):
            if len(condition) > MAX_WHERE_CHARS:
                raise ValueError(f"an expression of {len(condition):,} characters; at most {MAX_WHERE_CHARS:,}")
        return where

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
        n = self.count()
        if n > MAX_POINTS:
            raise ValueError(f"{n:,} points before the where filter, more than {MAX_POINTS:,}: split the sweep")
        names = set(self.swept())
        for condition in [self.where] if isinstance(self.where, str) else (self.where or []):
            unknown = sorted(_names(condition) - names)
            if unknown:
                raise ValueError(f"where {condition!r}: {', '.join(unknown)} is not a swept parameter (the names are "
                                 f"{', '.join(sorted(names)) or 'none: nothing is swept'})")  # fmt: skip
        if self.mode == "max_rate":
            self.slo_object()
            if "request_rate" in (set(self.grid) | set(self.zip)):
                raise ValueError("mode max_rate searches the request rate: do not sweep request_rate")
        elif self.slo or self.min_goodput is not None or self.goodput:
            raise ValueError("slo, min_goodput and goodput apply to mode: max_rate")
        return self

    def count(self) -> int:
        """Points before the ``where`` filter: grid combinations x zip rows x seeds (computed, not built)."""
        n = math.prod(len(v) for v in self.grid.values())
        n *= len(next(iter(self.zip.values()))) if self.zip else 1
        n *= self.seeds if isinstance(self.seeds, int) else len(self.seeds) if self.seeds is not None else 1
        return n

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
    data = read_mapping(path)  # YAML whose keys appear once each
    if not data:
        raise ValueError(f"{path}: the sweep file is empty; give at least a base, and grid or zip axes or seeds")
    if isinstance(data.get("config"), str):
        data["config"] = str((path.parent / data["config"]).resolve())
    try:
        return SweepSpec.model_validate(data)
    except ValueError as exc:
        from experiments.errors import one_line

        raise ValueError(f"{path}: {one_line(exc, where='')}") from None


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
            points.append(params)
    conditions = [spec.where] if isinstance(spec.where, str) else (spec.where or [])
    checks = [_compile(c) for c in conditions]
    return [p for p in points if all(_holds(c, code, p) for c, code in zip(conditions, checks, strict=True))]


_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare, ast.Eq,
            ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.BinOp, ast.Add, ast.Sub, ast.Mult,
            ast.Div, ast.FloorDiv, ast.Mod, ast.Name, ast.Load, ast.Constant, ast.List, ast.Tuple)  # fmt: skip


def _repeated(values: list[Any]) -> Any:
    """The first value that appears twice in ``values`` (compared as their JSON), or None."""
    seen: set[str] = set()
    for value in values:
        key = json.dumps(value, sort_keys=True, default=str)
        if key in seen:
            return value
        seen.add(key)
    return None


def _parse(condition: str) -> ast.Expression:
    """A ``where`` expression's tree, allowed only comparisons, arithmetic, and/or/not, names and constants."""
    try:
        tree = ast.parse(condition, mode="eval")
    except SyntaxError:
        raise ValueError(f"where {condition!r}: not an expression") from None
    except (RecursionError, MemoryError):
        raise ValueError(f"where {_short(condition)}: nested too deeply to read") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ValueError(f"where {_short(condition)}: {type(node).__name__} is not allowed (only comparisons, "
                             "arithmetic, and/or/not, swept names and constants)")  # fmt: skip
    return tree


def _names(condition: str) -> set[str]:
    """The names a ``where`` expression reads."""
    return {node.id for node in ast.walk(_parse(condition)) if isinstance(node, ast.Name)}


def _compile(condition: str) -> Any:
    try:
        return compile(_parse(condition), "<where>", "eval")
    except (RecursionError, MemoryError):
        raise ValueError(f"where {_short(condition)}: nested too deeply to evaluate") from None


def _holds(condition: str, code: Any, params: dict[str, Any]) -> bool:
    try:
        return bool(eval(code, {"__builtins__": {}}, dict(params)))  # noqa: S307 (checked: no calls, no attributes)
    except Exception as exc:  # noqa: BLE001 (a comparison of a string with a number, a division by zero, ...)
        at = ", ".join(f"{k}={v!r}" for k, v in params.items())
        message = " ".join(str(exc).split())
        raise ValueError(f"where {_short(condition)}: {type(exc).__name__}: {message} (at {at})") from None


def _short(condition: str) -> str:
    """A ``where`` expression for a message: whole, or its start when long."""
    return repr(condition) if len(condition) <= 80 else repr(condition[:77] + "...")


def expand(spec: SweepSpec) -> list[Point]:
    """The sweep's points with their full configs and hashes (a point whose settings are invalid keeps the error)."""
    base: dict[str, Any] = {}
    if spec.config is not None:
        base = RunConfig.load(spec.config).model_dump(mode="json", exclude_unset=True)
    out: list[Point] = []
    seen: dict[str, int] = {}  # hash -> the first point with it
    for index, params in enumerate(combinations(spec)):
        fields = dict(spec.base) | params
        try:
            config: RunConfig | None = RunConfig.load_dict(base, fields)
            error = ""
        except ValueError as exc:
            from experiments.errors import one_line

            config, error = None, one_line(exc)
        what = config.to_jsonable() if config is not None else {"invalid": fields}
        if spec.mode == "max_rate":
            what = what | {"mode": "max_rate", "slo": spec.slo, "min_goodput": spec.min_goodput,
                           "goodput": spec.goodput, "rate_start": spec.rate_start,
                           "rate_tolerance": spec.rate_tolerance}  # fmt: skip
        digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:20]
        twin = seen.get(digest)
        if twin is not None:
            same = ", ".join(f"{k}={v!r}" for k, v in params.items())
            first = ", ".join(f"{k}={v!r}" for k, v in out[twin].params.items())
            raise ValueError(f"points {twin} ({first}) and {index} ({same}) are the same run: a sweep runs and stores "
                             "each configuration once; drop one")  # fmt: skip
        seen[digest] = index
        out.append(Point(index, params, config, digest, error))
    return out
