"""YAML as ferry reads every file a user writes (run configs, sweep files, prices, hardware profiles, scenarios):
PyYAML's safe loader, except that a key given twice in one mapping is an error. PyYAML keeps the last of them
silently, so a setting written twice would run with whichever came last without a word."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error."""


# libyaml's parser where PyYAML was built with it (ten times faster: a hardware profile takes 2 ms, not 20, and a plan
# or sweep loads one per point), with the same constructors; a document it refuses is read again by the Python parser,
# whose message shows the line at fault
_FastLoader: type[yaml.CSafeLoader] | None = None
if getattr(yaml, "__with_libyaml__", False):

    class _FastUniqueKeyLoader(yaml.CSafeLoader):
        """``_UniqueKeyLoader`` on libyaml."""

    _FastLoader = _FastUniqueKeyLoader


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
if _FastLoader is not None:
    _FastLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def load(text: str) -> Any:
    """The document in ``text`` (``yaml.YAMLError`` if it is not valid YAML or repeats a key in one mapping)."""
    if _FastLoader is not None:
        try:
            return yaml.load(text, Loader=_FastLoader)
        except yaml.YAMLError:
            pass  # the Python parser's message, below
    return yaml.load(text, Loader=_UniqueKeyLoader)


_FILES: dict[tuple[str, int, int], Any] = {}  # documents read, by (path, modification time, size)


def load_file(path: Path) -> Any:
    """``load`` of a file's text, parsed once per process while the file is unchanged (a plan or sweep reads the same
    hardware profile for every simulation); each caller gets its own copy."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _FILES:
        _FILES[key] = load(path.read_text())
    return copy.deepcopy(_FILES[key])
