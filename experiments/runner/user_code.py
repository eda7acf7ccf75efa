"""Code a user names: a policy or router written ``package.module:Class``.

Naming such a class imports its module, which runs the module's top-level code. That is the user's choice when they
type it on the command line (``--policy mypkg.fifo:Fifo``, ``--router mypkg.pick:Pick``); it is not when it comes in
a file (a run config, a sweep file, a scenario, or a ``summary.json`` replayed with ``--config``) that someone else
may have written. So a name read from a file is imported only with ``--allow-import`` on the command line; without
it the command stops before importing anything, with one line saying which file named what. Every import says so in
one line on stderr, when it happens: here, in the command's own process, before any simulation (a process pool's
workers then find the module already imported).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

ALLOW_FLAG = "--allow-import"


@dataclass(frozen=True)
class Named:
    """One ``module:Class`` a config names."""

    where: str  # the field that names it: scheduler.policy, router, replica_groups[1].policy, ...
    name: str  # package.module:Class
    kind: str  # policy or router


def is_user_code(name: Any) -> bool:
    """Whether a policy or router name is ``module:Class`` rather than a built-in name."""
    return isinstance(name, str) and ":" in name


def named_in(config: Any) -> list[Named]:
    """The ``module:Class`` names of a ``RunConfig``: its policy, its router, and each replica group's or
    disaggregated pool's policy."""
    found = [Named("scheduler.policy", config.scheduler.policy, "policy"), Named("router", config.router, "router")]
    for k, group in enumerate(config.replica_groups):
        found.append(Named(f"replica_groups[{k}].policy", group.get("policy"), "policy"))
    if config.disaggregation is not None:
        for role in ("prefill", "decode"):
            found.append(Named(f"disaggregation.{role}.policy", getattr(config.disaggregation, role).get("policy"),
                               "policy"))  # fmt: skip
    return [n for n in found if is_user_code(n.name)]


def admit(named: Iterable[Named], command: str, source: str | None, allow_import: bool,
          from_flags: Iterable[str] = ()) -> None:  # fmt: skip
    """Import every ``module:Class`` in ``named``, saying so in one line each, or refuse.

    ``source``: the file the names were read from (None: all from flags); ``from_flags``: the names the command line
    itself gave (imported without ``--allow-import``). ValueError (one line) for a name from a file without
    ``allow_import``, and for a name that cannot be imported or is not a policy or router class."""
    flags = set(from_flags)
    seen: set[tuple[str, str]] = set()
    for item in named:
        if (item.kind, item.name) in seen:
            continue
        seen.add((item.kind, item.name))
        from_file = source is not None and item.name not in flags
        if from_file and not allow_import:
            raise ValueError(
                f"{item.where}={item.name!r} in {source} names Python code to import (its module runs when imported); "
                f"ferry imports code named in a file only with {ALLOW_FLAG}"
            )
        origin = f"{item.where} in {source}, {ALLOW_FLAG}" if from_file else f"--{item.kind}"
        print(f"ferry {command}: importing {item.name} ({item.kind}, from {origin})", file=sys.stderr)
        load(item)


def load(item: Named) -> None:
    """Import ``item``'s class and check that it is what its field needs (ValueError naming it otherwise)."""
    if item.kind == "policy":
        import policies

        policies.get_class(item.name)
    else:
        from policies.routing import router_class

        router_class(item.name)


def add_flag(p: Any) -> None:
    """``--allow-import`` on a command that reads files (``argparse.ArgumentParser``)."""
    p.add_argument(
        ALLOW_FLAG,
        dest="allow_import",
        action="store_true",
        help="import a policy or router that a file names as module:Class (its module's code runs); names given as "
        "flags are imported without it",
    )
