"""Token-length distributions of synthetic requests.

A ``LengthSpec`` is a pydantic model that a YAML config writes as a dict (``{dist: uniform, low: 128, high: 2048}``)
and the command line as a compact string (``uniform:128:2048``); ``parse_length_spec`` reads either. Sampling uses
only the ``numpy.random.Generator`` passed in. Every length is at most ``MAX_TOKENS`` (2**31 - 1), the bound the
trace readers put on a file's token counts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, model_validator

from sim.workload import traces

IntArray = npt.NDArray[np.int64]
MAX_TOKENS = traces.MAX_TOKENS


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        """``n`` token counts (int64), drawn with ``rng`` only."""
        raise NotImplementedError

    def text(self) -> str:
        """The compact form, which ``parse_length_spec`` reads back to an equal spec."""
        raise NotImplementedError


class FixedLength(_Spec):
    """Every request has ``value`` tokens."""

    dist: Literal["fixed"] = "fixed"
    value: int = Field(ge=0, le=MAX_TOKENS)

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        return np.full(n, self.value, dtype=np.int64)

    def text(self) -> str:
        return str(self.value)


class UniformLength(_Spec):
    """Uniform on the integers ``low..high``, both included."""

    dist: Literal["uniform"] = "uniform"
    low: int = Field(ge=0, le=MAX_TOKENS)
    high: int = Field(ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _check(self) -> UniformLength:
        if self.low > self.high:
            raise ValueError(f"low={self.low} must be <= high={self.high}")
        return self

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)

    def text(self) -> str:
        return f"uniform:{self.low}:{self.high}"


class LognormalLength(_Spec):
    """Lognormal with the given ``median`` (= exp(mu)) or ``mean`` (= exp(mu + sigma^2/2)) and log-space
    ``sigma``, rounded to the nearest integer and clipped to ``[min, max]`` (clipped, not redrawn: the tails
    pile up at the bounds; ``max=None`` clips at ``MAX_TOKENS``)."""

    dist: Literal["lognormal"] = "lognormal"
    median: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    mean: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    sigma: float = Field(ge=0, le=10, allow_inf_nan=False)
    min: int = Field(default=1, ge=0, le=MAX_TOKENS)
    max: int | None = Field(default=None, ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _check(self) -> LognormalLength:
        if (self.median is None) == (self.mean is None):
            raise ValueError(f"give exactly one of median and mean (got median={self.median}, mean={self.mean})")
        if self.max is not None and self.min > self.max:
            raise ValueError(f"min={self.min} must be <= max={self.max}")
        return self

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        if self.median is not None:
            mu = math.log(self.median)
        else:
            assert self.mean is not None
            mu = math.log(self.mean) - self.sigma**2 / 2
        upper = float(self.max) if self.max is not None else float(MAX_TOKENS)
        return np.clip(np.rint(rng.lognormal(mu, self.sigma, size=n)), self.min, upper).astype(np.int64)

    def text(self) -> str:
        center = f"median={self.median!r}" if self.median is not None else f"mean={self.mean!r}"
        bound = f",max={self.max}" if self.max is not None else ""
        return f"lognormal:{center},sigma={self.sigma!r},min={self.min}{bound}"


class ZipfLength(_Spec):
    """Bounded Zipf (power law): P(k) proportional to k^-a for integers k in ``[min, max]``, sampled exactly
    by inverting the cumulative distribution (numpy's ``zipf`` is unbounded and would need redraws)."""

    dist: Literal["zipf"] = "zipf"
    a: float = Field(gt=1, le=100, allow_inf_nan=False)
    min: int = Field(default=1, ge=1, le=MAX_TOKENS)
    max: int = Field(ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _check(self) -> ZipfLength:
        if self.min > self.max:
            raise ValueError(f"min={self.min} must be <= max={self.max}")
        if self.max - self.min >= 10_000_000:
            raise ValueError(f"max - min = {self.max - self.min} must be < 10,000,000 (the table is one float each)")
        return self

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        support = np.arange(self.min, self.max + 1, dtype=np.int64)
        cdf = np.cumsum(support.astype(np.float64) ** -self.a)
        cdf /= cdf[-1]
        index = np.searchsorted(cdf, rng.random(n), side="right")
        return support[np.minimum(index, len(support) - 1)]

    def text(self) -> str:
        return f"zipf:a={self.a!r},min={self.min},max={self.max}"


class EmpiricalLength(_Spec):
    """Resample, with replacement, a token-count ``column`` of a file: a length-only CSV (the ShareGPT stats
    file's ``num_prefill_tokens``), any trace's own column, or a trace's ``prompt_tokens`` /
    ``output_tokens``. The file is read when sampling, so a config can be written before the file exists."""

    dist: Literal["empirical"] = "empirical"
    path: str = Field(min_length=1)
    column: str = Field(min_length=1)

    def sample(self, n: int, rng: np.random.Generator) -> IntArray:
        values = traces.read_length_column(self.path, self.column)
        return values[rng.integers(0, len(values), size=n)]

    def text(self) -> str:
        return f"empirical:{self.path}:{self.column}"


_FORMS = (
    "a token length is one of: N (fixed); fixed:N; uniform:LOW:HIGH (inclusive); "
    "lognormal:median=M,sigma=S[,min=1,max=X] (or mean=M); zipf:a=A,min=1,max=X (a > 1); "
    "empirical:PATH:COLUMN (resample a file's column)"
)
_KINDS = ("fixed", "uniform", "lognormal", "zipf", "empirical")


def _compact_to_dict(value: Any) -> Any:
    """A compact string (or a bare int) -> the dict form; anything else is passed on to pydantic unchanged."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    if not isinstance(value, str):
        return value
    text = value.strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return {"dist": "fixed", "value": text}
    kind, sep, rest = text.partition(":")
    kind = kind.strip().lower()
    if not sep or kind not in _KINDS or not rest.strip():
        raise ValueError(f"cannot read {value!r} as a token length; {_FORMS}")
    if kind == "empirical":
        path, sep, column = rest.rpartition(":")
        if not sep or not path or not column:
            raise ValueError(f"cannot read {value!r}: expected empirical:PATH:COLUMN; {_FORMS}")
        return {"dist": kind, "path": path, "column": column}
    if "=" not in rest:  # positional: fixed:N, uniform:LOW:HIGH
        parts = rest.split(":")
        names = {"fixed": ["value"], "uniform": ["low", "high"]}.get(kind)
        if names is None or len(parts) != len(names):
            raise ValueError(f"cannot read {value!r} as a {kind} length; {_FORMS}")
        return {"dist": kind, **{k: p.strip() for k, p in zip(names, parts, strict=True)}}
    fields: dict[str, str] = {"dist": kind}
    for item in rest.split(","):
        key, sep, val = item.partition("=")
        if not sep or not key.strip() or key.strip() in fields:
            raise ValueError(f"cannot read {item!r} in {value!r}: expected distinct KEY=VALUE pairs; {_FORMS}")
        fields[key.strip()] = val.strip()
    return fields


# The spec a config field holds: a dict tagged by ``dist``, a compact string, or a bare int (fixed).
LengthSpec = Annotated[
    FixedLength | UniformLength | LognormalLength | ZipfLength | EmpiricalLength,
    Field(discriminator="dist"),
    BeforeValidator(_compact_to_dict),
]
_ADAPTER: TypeAdapter[LengthSpec] = TypeAdapter(LengthSpec, config=ConfigDict(title="LengthSpec"))


def parse_length_spec(value: str | int | Mapping[str, Any] | LengthSpec) -> LengthSpec:
    """A length spec from its compact string (``"1024"``, ``"uniform:128:2048"``,
    ``"lognormal:median=512,sigma=1.0,max=8192"``, ``"zipf:a=1.2,min=1,max=4096"``,
    ``"empirical:PATH:COLUMN"``), a dict from YAML, or a spec (returned as is).

    A string that fits none of the forms raises ``ValueError`` listing them; a bad value raises pydantic's
    ``ValidationError`` (a ``ValueError``) naming the field, e.g. ``uniform.high``, and the value. A
    ``LengthSpec`` field of a pydantic config accepts the same three inputs."""
    if isinstance(value, _Spec):
        return value
    return _ADAPTER.validate_python(_compact_to_dict(value))  # a malformed string fails here, unwrapped


# (prompt, output) column names of a lengths-only file, tried in order after a trace's own token columns
_PAIR_COLUMNS = (("num_prefill_tokens", "num_decode_tokens"), ("input_len", "output_len"), ("prompt_len", "output_len"))


def read_length_pairs(path: str | Path, max_total: int | None = None) -> tuple[IntArray, IntArray]:
    """(prompt, output) token counts of every row of a file, kept together: a trace of any supported format, or a
    lengths-only CSV such as the ShareGPT statistics (``num_prefill_tokens, num_decode_tokens``). With
    ``max_total``, rows whose prompt + output exceeds it are dropped (as vLLM's ShareGPT sampler drops conversations
    longer than the model's context)."""
    header = traces.csv_header(path)
    lowered = {h.strip().lower() for h in header}
    names = next(((p, o) for p, o in _PAIR_COLUMNS if p in lowered and o in lowered), None)
    prompt_col, output_col = names if names is not None else ("prompt_tokens", "output_tokens")
    prompt = traces.read_length_column(path, prompt_col)
    output = traces.read_length_column(path, output_col)
    if max_total is not None:
        keep = prompt + output <= max_total
        if not keep.any():
            raise ValueError(f"{path}: no row has prompt + output <= {max_total} tokens")
        prompt, output = prompt[keep], output[keep]
    return prompt, output
