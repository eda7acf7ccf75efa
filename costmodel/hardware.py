"""Hardware profiles: one YAML (or JSON) file per device with every number's source, validated by a pydantic schema.

A profile holds the device's datasheet rates (dense TFLOP/s per format, memory capacity and bandwidth, the interconnect
tensor parallelism uses) and the parameters the cost model turns into *effective* rates:

- ``efficiency.<class>.compute`` and ``.memory``, for each operator class (``gemm``, ``attention_prefill``,
  ``attention_decode``, ``elementwise``): a saturating curve ``eff(n) = max * n / (n + half_size)`` in the kernel's
  size ``n`` (FLOPs for compute, bytes for memory). A kernel of ``f`` FLOPs then takes
  ``f / (peak * eff(f)) = (f + half_size) / (peak * max)``: ``max`` is the sustained share of the peak on large
  kernels, and ``half_size / (peak * max)`` is the fixed cost (launch, tail, ramp) a small kernel pays;
- ``efficiency.<class>.floor_s`` (optional): the least time one kernel instance takes however small (launch and
  tail), under which the curves do not go: ``max(floor, compute side, memory side)``;
- ``efficiency.communication``: the all-reduce's share of link bandwidth (same curve, in message bytes) and its
  fixed latency per call;
- ``overheads``: host time per iteration, per sequence in it, and per layer (scheduling, input preparation,
  sampling, launches).

These are what the calibration harness fits from measured kernel times. A profile says ``kind: datasheet`` (rates from
the vendor, efficiencies stated as assumptions) or ``kind: calibrated`` (with the device, software versions, date and
raw measurement file in ``provenance``). A profile fitted to NVIDIA's measured kernel database also names it in
``kernel_tables`` (``KernelTables``): the cost model then times kernels from the database's own tables where the
package is installed (``costmodel.kernel_tables``), and from the fitted curves where it is not. Built-ins live in
``hwprofiles/``; ``load_hardware`` also reads a path, and directories listed in ``$FERRY_HWPROFILES``
(``:``-separated) are searched before the built-ins.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

import hwprofiles
from costmodel import strict_yaml
from costmodel.dtypes import PEAK_KEY

PROFILES_DIR = Path(hwprofiles.__file__).parent
_SUFFIXES = (".yaml", ".yml", ".json")
NOT_PROFILES = ("prices", "engines")  # files beside the profiles that are not profiles (costmodel.prices, .engines)
ASSUMPTION = "assumption"  # the ``source`` of a number nobody measured yet
MEASURED = "measured"  # the ``source`` of a number a calibration fitted (see provenance.measurements)

OP_CLASSES = ("gemm", "attention_prefill", "attention_decode", "elementwise")


class _Strict(BaseModel):
    # a profile's numbers are finite: YAML's .inf or .nan in any of them is refused, naming the field
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Quantity(_Strict):
    """One number and where it comes from."""

    value: float = Field(ge=0)
    # a key of ``provenance.sources``, or "assumption", or "measured"
    source: str
    note: str = ""


class Curve(_Strict):
    """Efficiency as a saturating function of a kernel's size n: ``max * n / (n + half_size)``."""

    max: float = Field(gt=0, le=1, description="share of the peak reached by large kernels")
    half_size: float = Field(ge=0, description="size (FLOPs or bytes) at which half of max is reached")
    source: str
    note: str = ""

    def at(self, n: float) -> float:
        """The efficiency of a kernel of size ``n`` (0 for an empty kernel)."""
        return self.max * n / (n + self.half_size) if n > 0 else 0.0


class ClassEfficiency(_Strict):
    """How close one operator class gets to the peaks."""

    compute: Curve  # in the kernel's FLOPs, against the peak FLOP/s of the format it computes in
    memory: Curve  # in the kernel's bytes moved, against the memory bandwidth
    # the least seconds one instance takes (launch and tail): a kernel with work never takes less; absent: no floor
    floor_s: Quantity | None = None

    @property
    def floor(self) -> float:
        """The floor in seconds (0 without one)."""
        return 0.0 if self.floor_s is None else self.floor_s.value


class CommEfficiency(_Strict):
    """Ring all-reduce: ``latency_s + 2 (n-1)/n * bytes / (link bandwidth * bandwidth.at(bytes))``."""

    bandwidth: Curve  # in message bytes, against interconnect.bandwidth_gbps
    latency_s: Quantity  # fixed cost of one all-reduce call (seconds)


class Efficiency(_Strict):
    gemm: ClassEfficiency  # linear layers and the LM head (tensor cores)
    attention_prefill: ClassEfficiency  # FlashAttention over prompt chunks
    attention_decode: ClassEfficiency  # paged attention, one query per sequence
    elementwise: ClassEfficiency  # norms, RoPE, activation, embedding gather (CUDA cores; memory-bound)
    communication: CommEfficiency

    def of(self, op_class: str) -> ClassEfficiency:
        return getattr(self, op_class)


class Overheads(_Strict):
    """Host time the GPU waits for (seconds): what makes a small iteration cost more than its kernels."""

    per_iteration_s: Quantity  # scheduling, preparing inputs, launching, sampler setup
    per_sequence_s: Quantity  # per sequence in the iteration (prefill chunk or decode): metadata, sampling, output
    per_layer_s: Quantity  # per transformer layer (kernel launches not hidden by CUDA graphs)
    # per prompt chunk in the iteration beyond per_sequence_s: a request's prefill inputs prepared on the host (its
    # state added to the batch, its prompt's token ids, positions and block table); None: not measured (0)
    per_prefill_s: Quantity | None = None


class Interconnect(_Strict):
    name: str  # e.g. "NVLink 4 (NVSwitch)"
    bandwidth_gbps: Quantity  # per GPU, per direction (GB/s, 1e9 B/s): what a ring all-reduce streams at
    # GPUs this link joins, all to all: one server's (8 on an HGX board; NVL72's rack: 72). Tensor parallelism beyond
    # them would all-reduce over the network between servers, which ferry does not price, and is refused
    domain_gpus: int = Field(default=8, ge=1)


class Provenance(_Strict):
    """Where the profile's numbers come from."""

    # key -> document title and URL; the keys are what ``Quantity.source`` names
    sources: dict[str, str] = Field(default_factory=dict)
    notes: str = ""
    # calibrated profiles only: what was measured, on what, when, and the raw data
    device: str | None = None  # e.g. "NVIDIA H100 80GB HBM3 (SXM5), driver 550.54"
    software: dict[str, str] | None = None  # e.g. {"torch": "2.4.0", "vllm": "0.6.3", "cuda": "12.4"}
    date: str | None = None  # ISO date of the measurement
    measurements: str | None = None  # path or URL of the raw measurement file the fit used
    # calibrated profiles: how the calibration ran (e.g. {"device": "cpu", "dtype": "float32", "threads": "1",
    # "models": "tiny-llama", "grid": "quick"}), so that a user can rerun it and `ferry validate` can match it
    settings: dict[str, str] | None = None
    # calibrated profiles: the fit's relative error on held-out measurements (points it was not fitted on), per
    # operator class: {"gemm": {"n": 24, "median": 0.03, "p90": 0.08}, ...}
    held_out_error: dict[str, dict[str, float]] | None = None

    @field_validator("held_out_error")
    @classmethod
    def _errors_are_sizes(cls, errors: dict[str, dict[str, float]] | None) -> dict[str, dict[str, float]] | None:
        return _check_errors(errors)


def _check_errors(errors: dict[str, dict[str, float]] | None) -> dict[str, dict[str, float]] | None:
    """Held-out errors are sizes of relative errors (|predicted / measured - 1|) and counts: none below 0."""
    for kind, stats in (errors or {}).items():
        for key, value in stats.items():
            if value < 0:
                raise ValueError(f"held_out_error.{kind}.{key}={value:g}: an error's size or a count is >= 0")
    return errors


class KernelTables(_Strict):
    """The measured kernel database a profile was fitted to, whose tables the cost model interpolates where the
    package is installed (``costmodel.kernel_tables``): NVIDIA's aiconfigurator-core, one system and one engine."""

    package: Literal["aiconfigurator-core"] = "aiconfigurator-core"  # the registry package holding the tables
    package_version: str  # the version the profile was fitted to (the tables are read only from that version)
    system: str  # the database's system, e.g. "h100_sxm"
    framework: Literal["vllm", "sglang", "trtllm"]  # whose kernels
    version: str  # the engine version of the GEMM and attention tables, e.g. "0.24.0"
    comm_version: str | None = None  # the engine version of the all-reduce table (None: the database has none)
    # the interpolation's relative error on held-out shapes, per kernel class (as provenance.held_out_error)
    held_out_error: dict[str, dict[str, float]] | None = None
    note: str = ""

    @field_validator("held_out_error")
    @classmethod
    def _errors_are_sizes(cls, errors: dict[str, dict[str, float]] | None) -> dict[str, dict[str, float]] | None:
        return _check_errors(errors)

    def describe(self) -> str:
        """The tables in words: package, system, engine and version."""
        return f"{self.package} {self.package_version} {self.system} {self.framework} {self.version}"


class HardwareProfile(_Strict):
    """One device: datasheet rates, the efficiencies that turn them into effective rates, and host overheads."""

    name: str
    description: str = ""
    kind: Literal["datasheet", "calibrated"]
    provenance: Provenance
    memory_capacity_gib: Quantity  # device memory (GiB, 2**30 B)
    memory_bandwidth_gbps: Quantity  # device memory bandwidth (GB/s, 1e9 B/s)
    # dense (no sparsity) peak per format (TFLOP/s, or TOP/s for int8): keys fp32 (non-tensor), tf32, bf16, fp16, fp8,
    # int8, fp4 (Blackwell's NVFP4); a format the device lacks is left out
    peak_tflops: dict[Literal["fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4"], Quantity]
    interconnect: Interconnect
    efficiency: Efficiency
    overheads: Overheads
    # a profile fitted to NVIDIA's measured kernel database: the tables its kernels are timed from
    kernel_tables: KernelTables | None = None

    @model_validator(mode="after")
    def _check(self) -> HardwareProfile:
        missing = [k for k in ("fp32", "bf16", "fp16") if k not in self.peak_tflops]
        if missing:
            raise ValueError(f"peak_tflops needs fp32, bf16 and fp16 (missing: {', '.join(missing)})")
        allowed = set(self.provenance.sources) | {ASSUMPTION, MEASURED}
        for where, source in _sources(self.model_dump()):
            if source not in allowed:
                raise ValueError(
                    f"{where}.source={source!r} is neither a key of provenance.sources "
                    f"({', '.join(sorted(self.provenance.sources)) or 'none'}) nor {ASSUMPTION!r}/{MEASURED!r}"
                )
        datasheet = [
            ("memory_capacity_gib", self.memory_capacity_gib),
            ("memory_bandwidth_gbps", self.memory_bandwidth_gbps),
        ]
        datasheet += [(f"peak_tflops.{k}", q) for k, q in self.peak_tflops.items()]
        datasheet += [("interconnect.bandwidth_gbps", self.interconnect.bandwidth_gbps)]
        for where, q in datasheet:
            if q.source == ASSUMPTION:
                raise ValueError(f"{where} is a device rate: its source must name a document, not {ASSUMPTION!r}")
            if q.value <= 0:
                raise ValueError(f"{where}.value must be > 0, got {q.value}")
        if self.kernel_tables is not None:
            from costmodel.kerneldb import SYSTEMS  # (no pandas: the database's names only)

            device, system = self.name.split(".")[0], self.kernel_tables.system
            if device in SYSTEMS.values() and system in SYSTEMS and SYSTEMS[system] != device:
                raise ValueError(
                    f"kernel_tables.system={system!r} holds {SYSTEMS[system]}'s kernels, and this profile "
                    f"({self.name}) is a {device}'s: its kernels would be timed from another GPU's; name {device}'s "
                    "system or drop kernel_tables"
                )
        if self.kind == "calibrated":
            p = self.provenance
            absent = [k for k in ("device", "software", "date", "measurements") if not getattr(p, k)]
            if absent:
                raise ValueError(f"a calibrated profile needs provenance.{', provenance.'.join(absent)}")
        return self

    def origin(self) -> str:
        """Where the numbers come from, in a line: measured kernel tables (interpolated, or their fitted curves where
        the package is absent) with the held-out error; calibrated, by what, with the held-out error; or datasheet
        rates with how many numbers are assumptions."""
        sources = _sources(self.model_dump())
        assumed = sum(source == ASSUMPTION for _, source in sources)
        if self.kind == "datasheet":
            line = f"datasheet rates; {assumed} of {len(sources)} numbers (efficiencies, overheads) assumed"
            device = self.name.split(".")[0]
            sibling = next((d / f"{device}.yaml" for d in _search_dirs() if (d / f"{device}.yaml").is_file()), None)
            if device != self.name and sibling is not None and "kernel_tables:" in sibling.read_text():
                return line + f" (--hardware {device}: fitted to measured kernels)"
            return line + " (no measured kernels of this device)" if device == self.name else line
        p = self.provenance
        if self.kernel_tables is not None:
            from costmodel import kerneldb  # the database's reader (pandas), only for such profiles

            tables = self.kernel_tables
            missing = kerneldb.missing(tables)
            errors = tables.held_out_error if missing is None else p.held_out_error
            line = f"measured: {tables.describe()} kernel tables, " + (
                "interpolated" if missing is None else f"not here ({missing}): the curves fitted to them"
            )
            if errors:
                line += " (held-out median error " + _errors(errors) + ")"
            return line + f"; {_overheads_origin(self)}"
        fitted = sum(source == MEASURED for _, source in sources)
        what = (p.software or {}).get("source") or p.device or "measurements"
        line = f"calibrated: {fitted} numbers fitted to {what}"
        if p.held_out_error:
            line += f" (held-out median error {_errors(p.held_out_error)})"
        return line + (f"; {assumed} assumed" if assumed else "")

    # ----------------------------------------------------------------------------------------------------------------
    # the rates the cost model uses (SI units)

    @property
    def memory_bytes(self) -> int:
        """Device memory (bytes)."""
        return int(self.memory_capacity_gib.value * 2**30)

    @property
    def bandwidth(self) -> float:
        """Peak memory bandwidth (B/s)."""
        return self.memory_bandwidth_gbps.value * 1e9

    @property
    def link_bandwidth(self) -> float:
        """Interconnect bandwidth per GPU per direction (B/s)."""
        return self.interconnect.bandwidth_gbps.value * 1e9

    def peaks(self) -> dict[str, float]:
        """Dense peak per format (FLOP/s), keyed as in ``peak_tflops``."""
        return {k: q.value * 1e12 for k, q in self.peak_tflops.items()}

    def peak_flops(self, dtype: str = "bfloat16") -> float:
        """Dense peak FLOP/s of a canonical format (``costmodel.dtypes``); ValueError if the device lacks it."""
        key = PEAK_KEY.get(dtype, dtype)
        if key not in self.peak_tflops:
            raise ValueError(f"hardware {self.name!r} has no {dtype} rate (it lists {', '.join(self.peak_tflops)})")
        return self.peak_tflops[key].value * 1e12

    def ridge_point(self, dtype: str = "bfloat16") -> float:
        """Arithmetic intensity (FLOP/byte) where the roofline turns: peak FLOP/s / peak B/s."""
        return self.peak_flops(dtype) / self.bandwidth


def _errors(errors: dict[str, dict[str, float]]) -> str:
    return ", ".join(f"{k} {v['median']:.0%}" for k, v in errors.items() if "median" in v)


def _overheads_origin(profile: HardwareProfile) -> str:
    """Where a profile's host overheads come from, in words: measured, an engine preset's, or assumed."""
    quantities = (profile.overheads.per_iteration_s, profile.overheads.per_sequence_s, profile.overheads.per_layer_s)
    sources = {q.source for q in quantities}
    if sources == {MEASURED}:
        return "host overheads measured"
    if all(s.startswith("engine:") for s in sources):
        note = profile.provenance.notes
        preset = note.split("engine preset ", 1)[1].split(" ", 1)[0].strip("'") if "engine preset " in note else ""
        return f"host overheads of engine preset {preset or 'named in the profile'} (public sources, not measured)"
    return "host overheads assumed"


def _sources(data: Any, where: str = "") -> list[tuple[str, str]]:
    """Every (dotted location, source) in a dumped profile."""
    found: list[tuple[str, str]] = []
    if isinstance(data, dict):
        if "source" in data and isinstance(data["source"], str):
            found.append((where, data["source"]))
        for key, value in data.items():
            if key != "provenance":
                found += _sources(value, f"{where}.{key}" if where else str(key))
    return found


# --------------------------------------------------------------------------------------------------------------------
# loading


def _search_dirs() -> list[Path]:
    extra = [Path(p).expanduser() for p in os.environ.get("FERRY_HWPROFILES", "").split(os.pathsep) if p]
    return [*extra, PROFILES_DIR]


def builtin_hardware() -> list[str]:
    """Names of the profiles ``load_hardware`` finds by name."""
    names = {p.stem for d in _search_dirs() if d.is_dir() for p in d.iterdir() if _is_profile(p)}
    return sorted(names)


def _is_profile(path: Path) -> bool:
    return path.suffix in _SUFFIXES and path.stem not in NOT_PROFILES


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text()) if path.suffix == ".json" else strict_yaml.load_file(path)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of profile fields, got {type(data).__name__}")
    return data


def parse_hardware(data: dict[str, Any], origin: str = "profile") -> HardwareProfile:
    """Validate a profile's fields; ValueError listing every bad field with its location and value."""
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "profile"
            msg = err["msg"].removeprefix("Value error, ")
            value = err.get("input")
            shown = "" if isinstance(value, dict) else f" (got {value!r})"
            problems.append(f"{loc}: {msg}{shown}")
        raise ValueError(f"{origin}: invalid hardware profile: " + "; ".join(problems)) from None


def save_hardware(profile: HardwareProfile, path: Path, origin: str) -> None:
    """Write ``profile`` as YAML to ``path`` with a two-line header naming the device and what wrote it (``origin``)."""
    data = profile.model_dump(mode="json", exclude_none=True)
    header = (
        f"# {profile.name}: {profile.description}\n# Written by {origin}; see costmodel/hardware.py for the schema.\n"
    )
    path.write_text(header + yaml.safe_dump(data, sort_keys=False, width=120))


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A profile by built-in name (``h100-sxm``; case-insensitive) or by the path of a YAML/JSON file."""
    path = Path(name_or_path).expanduser()
    if not path.is_file():
        key = name_or_path.strip().lower()
        candidates = [p for d in _search_dirs() if d.is_dir() for p in sorted(d.iterdir()) if _is_profile(p)]
        match = next((p for p in candidates if p.stem.lower() == key), None)
        if match is None:
            if path.suffix in _SUFFIXES:
                raise ValueError(f"hardware profile file {name_or_path!r} does not exist")
            raise ValueError(
                f"unknown hardware {name_or_path!r}; known: {', '.join(builtin_hardware())} "
                "(or pass the path of a profile YAML/JSON file)"
            )
        path = match
    return parse_hardware(_read(path), str(path))
