"""The settings of the two teaching figures that are not scenarios: why batching helps (a model on a GPU) and the
limits of an iteration (three limits and a few requests). The defaults are ``experiments/teach/figures.yaml``; a
teacher passes their own copy with ``ferry teach --figures FILE``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from costmodel import strict_yaml
from experiments.errors import one_line

BUILTIN = Path(str(resources.files("experiments.teach") / "figures.yaml"))


class WhyBatching(BaseModel):
    """6-1, 6-2: a prefill and decodes of each batch size on the roofline."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    hardware: str
    tensor_parallel_size: StrictInt = Field(..., ge=1)
    batches: tuple[StrictInt, ...] = Field(..., min_length=2, description="decode batch sizes (sequences)")
    prompt_tokens: StrictInt = Field(..., ge=1, description="the prefill's prompt (tokens)")
    context_tokens: StrictInt = Field(..., ge=0, description="tokens each decoding sequence has cached")


class Limits(BaseModel):
    """6-5: one iteration under max batch size, max batched tokens and max model length."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_seqs: StrictInt = Field(..., ge=1)
    max_num_batched_tokens: StrictInt = Field(..., ge=1)
    max_model_len: StrictInt = Field(..., ge=1)
    requests: tuple[tuple[StrictInt, StrictInt], ...] = Field(..., min_length=1, description="(prompt, output) tokens")


class FigureSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    why_batching: WhyBatching
    limits: Limits


def load_settings(
    path: str | Path | None = None, model: str | None = None, hardware: str | None = None
) -> FigureSettings:
    """The built-in ``figures.yaml``, with what the file at ``path`` gives laid over it (a file may set one field),
    and ``model`` / ``hardware`` replacing the why-batching figure's when given; errors name the file and field."""
    data = _read(BUILTIN)
    where = "figures.yaml"
    if path is not None:
        where = str(path)
        mine = _read(Path(path))
        for section, fields in mine.items():
            if isinstance(fields, dict) and isinstance(data.get(section), dict):
                data[section] = {**data[section], **fields}
            else:
                data[section] = fields
    for key, value in (("model", model), ("hardware", hardware)):
        if value is not None:
            data["why_batching"][key] = value
    try:
        return FigureSettings.model_validate(data)
    except ValueError as exc:
        raise ValueError(f"{where}: {one_line(exc)}") from None


def _read(path: Path) -> dict[str, Any]:
    try:
        data = strict_yaml.load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with why_batching: and limits: sections")
    return data
