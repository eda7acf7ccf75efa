"""Reading a config file: YAML (or JSON) whose top level is a mapping, a key given twice being an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error (PyYAML keeps the last silently)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice (lines {seen[key]} and {line})", key_node.start_mark
            )
        seen[key] = line
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_mapping(path: Path) -> dict[str, Any]:
    """The mapping in the YAML (or JSON) file ``path``; a clear error naming the file and line otherwise."""
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}
    except yaml.MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark is not None else ""
        raise ValueError(f"{path}: not valid YAML{where}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of field names to values, got {type(data).__name__}")
    return data
