"""Reading a config file: YAML (or JSON) whose top level is a mapping, a key given twice being an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from costmodel import strict_yaml


def read_mapping(path: Path) -> dict[str, Any]:
    """The mapping in the YAML (or JSON) file ``path``; a clear error naming the file and line otherwise."""
    try:
        data = strict_yaml.load(path.read_text()) or {}
    except yaml.MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark is not None else ""
        raise ValueError(f"{path}: not valid YAML{where}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of field names to values, got {type(data).__name__}")
    return data
