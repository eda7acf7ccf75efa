"""Old import paths of modules that moved into subpackages, kept working for users' scripts.

``alias({old: new, ...})`` registers a finder so that ``import old`` (or ``from old import x``) gives the module at
``new``, the very same module object, imported once under its new name; nothing is copied or run twice. Each package
registers its own moves in its ``__init__`` (the lowest layer holds the mechanism, so every package may use it).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType


class _Aliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module name and loads it as the module now at its new name."""

    def __init__(self) -> None:
        self.targets: dict[str, str] = {}
        self.specs: dict[str, importlib.machinery.ModuleSpec | None] = {}  # old name -> the module's own spec

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.targets:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.targets[spec.name])
        self.specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system has set the old name's spec on the module: give it back its own, which says where its
        # file is (its name, file and loader were left alone)
        if module.__spec__ is not None and module.__spec__.name in self.specs:
            module.__spec__ = self.specs[module.__spec__.name]


_ALIASES = _Aliases()


def alias(moves: dict[str, str]) -> None:
    """Make each old module name import the module at its new name."""
    _ALIASES.targets.update(moves)
    if _ALIASES not in sys.meta_path:
        sys.meta_path.insert(0, _ALIASES)
