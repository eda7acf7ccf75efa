"""YAML as ferry reads every file a user writes (run configs, sweep files, prices, hardware profiles, scenarios):
PyYAML's safe loader, except that a key given twice in one mapping is an error. PyYAML keeps the last of them
silently, so a setting written twice would run with whichever came last without a word."""

from __future__ import annotations

from typing import Any

import yaml


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the constructor below says so
            continue
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice (lines {first} and {line})", key_node.start_mark
            )
        seen[key] = line
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load(text: str) -> Any:
    """The document in ``text`` (``yaml.YAMLError`` if it is not valid YAML or repeats a key in one mapping)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)
