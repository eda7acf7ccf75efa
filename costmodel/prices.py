"""GPU rental prices: US dollars per GPU-hour for each hardware profile, with where and when each price was published.

The built-in prices are ``hwprofiles/prices.yaml``: on-demand list prices of public GPU clouds at the month each entry
gives, i.e. assumptions a user replaces with their own. A user's file (``ferry plan --prices FILE``) has the same
format and may list only some profiles: ``load_prices(path)`` is the built-in prices with the file's entries
replacing or adding to them. A profile without an entry of its own takes its device's (the name before its first
dot). The format, one entry per hardware name (a profile's ``name``, case-insensitive)::

    h100-sxm:
      usd_per_gpu_hour: 3.99              # > 0
      source: https://lambda.ai/pricing   # where it is published
      date: "2026-09"                     # YYYY-MM of the price
      note: 8x instance, per GPU          # optional: how it was derived
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from costmodel import strict_yaml

PRICES_FILE = "prices.yaml"  # in the ``hwprofiles`` package, beside the profiles
_MONTH = re.compile(r"\d{4}-(0[1-9]|1[0-2])")
_FORMAT = "usd_per_gpu_hour, source, date (YYYY-MM) and optionally note"


class Price(BaseModel):
    """The rental price of one GPU of a hardware profile, and its provenance."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    usd_per_gpu_hour: float = Field(gt=0, allow_inf_nan=False)  # US dollars per GPU per hour
    source: str = Field(min_length=1)  # where the price is published: a pricing page's URL, or e.g. a contract
    date: str  # YYYY-MM the price was published or read
    note: str = ""  # how it was derived (instance, region, instance price / GPUs)

    @field_validator("usd_per_gpu_hour", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("must be a number of US dollars per GPU-hour")
        return value

    @field_validator("date", mode="before")
    @classmethod
    def _year_month(cls, value: Any) -> Any:
        if not isinstance(value, str) or not _MONTH.fullmatch(value):
            raise ValueError('must be a year and month, "YYYY-MM" (quoted)')
        return value


def builtin_prices_path() -> Path:
    """The built-in prices file, ``hwprofiles/prices.yaml``."""
    return Path(str(resources.files("hwprofiles") / PRICES_FILE))


def load_prices(path: str | Path | None = None) -> dict[str, Price]:
    """Prices by lower-case hardware name: the built-in ones, with the entries of the file at ``path`` (if given)
    replacing or adding to them. ValueError naming the file and the entry for a bad file."""
    prices = _parse(builtin_prices_path())
    if path is not None:
        prices.update(_parse(Path(path).expanduser()))
    return prices


def price_of(prices: dict[str, Price], hardware_name: str) -> Price:
    """The price of one GPU of ``hardware_name`` (case-insensitive), or of its device (the name before its first
    dot: ``h100-sxm.sglang`` and ``h100-sxm.datasheet`` are ``h100-sxm``'s profiles) when it has no entry of its own;
    ValueError saying how to add a missing one."""
    price = prices.get(hardware_name.strip().lower()) or prices.get(hardware_name.strip().lower().split(".")[0])
    if price is None:
        key = hardware_name.strip().lower()
        raise ValueError(
            f"no GPU price for hardware {hardware_name!r} (priced: {', '.join(sorted(prices)) or 'none'}); add it with "
            f'--prices FILE, a YAML file with e.g. `{key}: {{usd_per_gpu_hour: 2.5, source: URL, date: "YYYY-MM"}}`'
        )
    return price


def _parse(path: Path) -> dict[str, Price]:
    """One prices file's entries, each validated; ValueError naming the file, the entry and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"prices file {path} does not exist") from None
    except OSError as exc:
        raise ValueError(f"prices file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        data = strict_yaml.load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:  # empty, or only comments: no entries
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: expected a mapping of hardware name to price entry ({_FORMAT}), got {type(data).__name__}"
        )
    prices: dict[str, Price] = {}
    for name, entry in data.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{path}: entry {name!r}: a hardware name must be a non-empty string")
        key = name.strip().lower()
        if key in prices:
            raise ValueError(f"{path}: entry {name!r}: hardware {key!r} is listed twice")
        if not isinstance(entry, dict):
            raise ValueError(
                f"{path}: entry {name!r}: expected a mapping with {_FORMAT}, got {type(entry).__name__} {entry!r}"
            )
        prices[key] = _validate(entry, f"{path}: entry {name!r}")
    return prices


def _validate(entry: dict[str, Any], where: str) -> Price:
    try:
        return Price.model_validate(entry)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "entry"
            if err["type"] == "missing":
                problems.append(f"{field}: missing")
            elif err["type"] == "extra_forbidden":
                problems.append(f"{field}: unknown field (allowed: {', '.join(Price.model_fields)})")
            else:
                problems.append(f"{field}: {err['msg'].removeprefix('Value error, ')} (got {err.get('input')!r})")
        raise ValueError(f"{where}: " + "; ".join(problems)) from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: the problem and where it is."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())
