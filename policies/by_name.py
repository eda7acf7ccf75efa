"""A class by the name a user gives on the command line or in a config file: a built-in's registered name, or
``package.module:Class`` for the user's own (its module imported: its top-level code runs). The one loader of the
policies (``policies.base.get_class``) and the routers (``policies.routing.router_class``)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def load_class(name: str, kind: str, registry: Mapping[str, type], methods: tuple[str, ...], shape: str) -> Any:
    """The class ``name`` names among ``registry``'s, or imported from ``package.module:Class``; ValueError, one line
    naming the ``kind`` and the name, when there is none or it lacks one of ``methods`` (``shape`` says what a
    ``kind`` must look like)."""
    if name in registry:
        return registry[name]
    if ":" not in name:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {', '.join(sorted(registry))} or give module:Class")
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{kind} {name!r}: expected package.module:Class")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"{kind} {name!r} could not be loaded: {exc}") from None
    missing = [m for m in methods if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        what = type(cls).__name__ if not isinstance(cls, type) else f"class without {' and '.join(missing)}"
        raise ValueError(f"{kind} {name!r} is a {what}, not a {kind}: give a class with {shape}")
    return cls
