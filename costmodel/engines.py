"""Engine-overhead presets: the host time a serving engine adds to each iteration, by engine name.

A hardware profile's ``overheads`` (``costmodel.hardware.Overheads``) are the seconds the GPU waits for besides its
kernels: per iteration, per sequence in it, per layer. They belong to the serving engine more than to the device: the
datasheet profiles assume a Python engine with synchronous scheduling (~1 ms + 40 us per sequence, Vidur's profile),
which vLLM V1 with async scheduling, SGLang or TensorRT-LLM's C++ runtime do not pay, and which an engine without CUDA
graphs exceeds by a launch cost per layer. The presets live in ``hwprofiles/engines.yaml``, every value with the
public source it comes from; ``apply_engine(hardware, "vllm-v1")`` returns a copy of a datasheet profile with a
preset's overheads (``ferry run --engine-overheads vllm-v1``).

A calibrated profile whose overheads were measured on its device and software is refused: a preset would replace a
measurement with an estimate. One whose overheads are still its base's assumptions (efficiencies fitted to kernels
alone, as ``h100-sxm.vidur``) takes a preset like a datasheet profile.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from costmodel import strict_yaml
from costmodel.hardware import MEASURED, PROFILES_DIR, HardwareProfile, Overheads, Quantity

ENGINES_FILE = PROFILES_DIR / "engines.yaml"
SOURCE_PREFIX = "engine:"  # an applied preset's source keys, in the profile's provenance.sources: "engine:<key>"


class EnginePreset(BaseModel):
    """One engine's host overheads (seconds), each with its source."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str
    per_iteration_s: Quantity  # once per iteration: scheduling, input preparation, launch, sampler setup
    per_sequence_s: Quantity  # per sequence in the iteration: metadata, sampling, output processing
    per_layer_s: Quantity  # per transformer layer: kernel launches the GPU waits for (no CUDA graphs)
    # a fixed GPU cost per iteration that the roofline's kernels do not count; added to per_iteration_s when applied
    per_step_gpu_s: Quantity | None = None

    def quantities(self) -> dict[str, Quantity]:
        """The preset's values by field name (``per_step_gpu_s`` only when given)."""
        fields = ("per_iteration_s", "per_sequence_s", "per_layer_s", "per_step_gpu_s")
        return {f: getattr(self, f) for f in fields if getattr(self, f) is not None}


class EngineBook(BaseModel):
    """What ``hwprofiles/engines.yaml`` holds: the sources (key -> title and URL) and the presets by name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provenance: dict[str, Any]  # sources: {key: "title, URL"}, notes: str
    engines: dict[str, EnginePreset]

    @model_validator(mode="after")
    def _check(self) -> EngineBook:
        extra = sorted(set(self.provenance) - {"sources", "notes"})
        if extra:
            raise ValueError(f"provenance: unknown field(s) {', '.join(extra)} (allowed: sources, notes)")
        sources = self.sources
        for key, text in sources.items():
            if not isinstance(text, str) or "http" not in text:
                raise ValueError(f"provenance.sources.{key}: give the document's title and its public URL")
        if not self.engines:
            raise ValueError("engines: no presets")
        for name, preset in self.engines.items():
            if name != name.strip().lower() or not name:
                raise ValueError(f"engines.{name!r}: a preset's name is lower case, without spaces around it")
            for field, q in preset.quantities().items():
                if q.source not in sources:
                    raise ValueError(
                        f"engines.{name}.{field}.source={q.source!r} is not a key of provenance.sources "
                        f"({', '.join(sorted(sources))}): every value cites a public page"
                    )
                if not q.note.strip():
                    raise ValueError(f"engines.{name}.{field}.note: say how the number was derived")
        return self

    @property
    def sources(self) -> dict[str, str]:
        return dict(self.provenance.get("sources") or {})


def parse_engines(data: Any, origin: str = "engine presets") -> EngineBook:
    """Validate a presets mapping; ValueError listing every bad field with its location (and value)."""
    if not isinstance(data, dict):
        raise ValueError(f"{origin}: expected a mapping with provenance and engines, got {type(data).__name__}")
    try:
        return EngineBook.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "presets"
            msg = err["msg"].removeprefix("Value error, ")
            value = err.get("input")
            shown = "" if isinstance(value, dict) else f" (got {value!r})"
            problems.append(f"{loc}: {msg}{shown}")
        raise ValueError(f"{origin}: invalid engine presets: " + "; ".join(problems)) from None


def load_engines(path: str | Path | None = None) -> EngineBook:
    """The presets of ``path`` (default: the built-in ``hwprofiles/engines.yaml``)."""
    if path is None:
        return _builtin()
    return _read(Path(path).expanduser())


@lru_cache(maxsize=1)
def _builtin() -> EngineBook:
    return _read(ENGINES_FILE)


def _read(path: Path) -> EngineBook:
    try:
        data = strict_yaml.load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"engine presets file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    return parse_engines(data, str(path))


def list_engines() -> list[str]:
    """The names of the built-in presets, sorted."""
    return sorted(load_engines().engines)


def get_engine(name: str) -> EnginePreset:
    """A built-in preset by name (case-insensitive); ValueError listing the known ones."""
    engines = load_engines().engines
    preset = engines.get(str(name).strip().lower())
    if preset is None:
        raise ValueError(f"unknown engine overhead preset {name!r}; known: {', '.join(sorted(engines))}")
    return preset


def apply_engine(hardware: HardwareProfile, name: str) -> HardwareProfile:
    """A copy of ``hardware`` whose ``overheads`` are preset ``name``'s (its sources added to the provenance, which
    notes the preset); everything else unchanged. ValueError for an unknown preset or a calibrated profile."""
    key = str(name).strip().lower()
    preset = get_engine(key)
    measured = [q for q in (hardware.overheads.per_iteration_s, hardware.overheads.per_sequence_s,
                            hardware.overheads.per_layer_s) if q.source == MEASURED]  # fmt: skip
    if hardware.kind == "calibrated" and measured:
        raise ValueError(
            f"engine_overheads={name!r}: {hardware.name} is a calibrated profile whose overheads were measured on "
            "its device and software; a preset would replace them with estimates. Leave engine_overheads out, or "
            "apply it to a datasheet profile"
        )
    book = load_engines()

    def cited(q: Quantity) -> Quantity:
        return q.model_copy(update={"source": SOURCE_PREFIX + q.source})

    per_iteration = cited(preset.per_iteration_s)
    gpu = preset.per_step_gpu_s
    if gpu is not None and gpu.value > 0:  # the roofline has one fixed term per iteration: host and GPU together
        note = f"{per_iteration.note} Plus a fixed GPU cost of {gpu.value:g} s per step ({gpu.source}: {gpu.note})"
        per_iteration = per_iteration.model_copy(update={"value": per_iteration.value + gpu.value, "note": note})
    overheads = Overheads(
        per_iteration_s=per_iteration,
        per_sequence_s=cited(preset.per_sequence_s),
        per_layer_s=cited(preset.per_layer_s),
    )
    # the sources the values cite, and those their notes name
    said_in = [q.source + " " + q.note for q in preset.quantities().values()]
    used = {k for k in book.sources if any(k in text for text in said_in)}
    sources = hardware.provenance.sources | {SOURCE_PREFIX + k: book.sources[k] for k in sorted(used)}
    said = f"Overheads: engine preset {key!r} ({ENGINES_FILE.name}: {preset.description}) in place of the profile's."
    notes = f"{hardware.provenance.notes} {said}".strip()
    provenance = hardware.provenance.model_copy(update={"sources": sources, "notes": notes})
    data = hardware.model_dump() | {"overheads": overheads.model_dump(), "provenance": provenance.model_dump()}
    return HardwareProfile.model_validate(data)
