"""Output folders: never a mix of two runs' files, never a folder that looks complete when a run did not finish.

A command owns a few names in its ``--out`` folder. Before writing, ``prepare`` removes its own files from an earlier
run there (and says so), and refuses a folder that holds another ferry command's outputs, unless ``force``; files
that are not ferry's (a trace, a config) are left alone. ``write_text`` and
``write_frame`` write through a temporary name and rename, so a file is either whole or absent; a command writes its
summary last, so a folder without one is a run that did not finish.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from experiments import interrupts

if TYPE_CHECKING:
    import pandas as pd

# every name a ferry command writes into an --out folder (files, and folders such as validate's real/ and sim/)
FERRY_OUTPUTS = ("summary.json", "requests.csv", "iterations.csv", "batches.csv", "requests.parquet",
                 "iterations.parquet", "batches.parquet", "comparison.json", "real", "sim",
                 "teach.json", "records", "plan.json", "plan.png", "points", "results.parquet",
                 "sweep.json")  # fmt: skip


def check(out: Path, own: tuple[str, ...], command: str, force: bool = False) -> None:
    """Refuse, before any work, an ``out`` that is a file, or a folder holding another ferry command's outputs
    (``FERRY_OUTPUTS`` not in ``own``), unless ``force``."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is a file, not a folder")
    _writable(out if out.is_dir() else out.parent, f"--out {out}")
    if out.is_dir() and not force:
        others = [name for name in _entries(out) if name in FERRY_OUTPUTS and name not in own]
        if others:
            raise ValueError(
                f"--out {out} holds another command's outputs ({', '.join(others)}), which `ferry {command}` would "
                "leave mixed with its own; choose another folder, or pass --force to replace them"
            )


def check_file(path: Path, flag: str = "--out") -> None:
    """Refuse, before any work, a file ``path`` that could not be written when the work is done: a folder there, or
    a place where no file can be made (the nearest existing folder above it read-only, or a file where a folder must
    be). ValueError, one line, naming ``flag``."""
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a folder; give the file to write")
    _writable(path.parent, f"{flag} {path}")


def _writable(folder: Path, what: str) -> None:
    """A file can be made in ``folder`` or, where it does not exist yet, in the nearest folder above it that does
    (tried: a hidden file made and removed, so a read-only file system or mount says so too)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{what}: {existing} is a file, where a folder must be")
    probe = existing / f".ferry-write-check-{os.getpid()}"
    try:
        probe.touch(exist_ok=True)
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"{what}: cannot write in {existing} ({exc.strerror or exc})") from None


def prepare(out: Path, own: tuple[str, ...], command: str, force: bool = False) -> None:
    """Make ``out`` ready for a run that writes ``own``: create it, or clear an earlier run's ``own`` files from it
    (saying so). ``force`` also removes the other ferry outputs there; files that are not ferry's stay."""
    check(out, own, command, force)
    if out.is_dir():
        removed = [name for name in _entries(out) if name in own or (force and name in FERRY_OUTPUTS)]
        for name in removed:
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        if removed:
            print(f"ferry {command}: replacing {', '.join(removed)} in {out}", file=sys.stderr)
    interrupts.checkpoint()
    out.mkdir(parents=True, exist_ok=True)


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` whole or not at all."""
    return _whole(path, lambda tmp: tmp.write_text(text))


def write_frame(path: Path, frame: pd.DataFrame) -> Path:
    """Write ``frame`` as CSV, whole or not at all."""
    return _whole(path, lambda tmp: frame.to_csv(tmp, index=False))


TABLE_FORMATS = ("csv", "parquet")


def write_table(path: Path, columns: dict[str, np.ndarray], fmt: str = "csv") -> Path:
    """Write ``columns`` as ``fmt`` (``runner.columnar``: CSV as ``DataFrame.to_csv`` writes it, or Parquet) at
    ``path`` with that suffix, whole or not at all; returns the path written."""
    from experiments.runner import columnar

    if fmt not in TABLE_FORMATS:
        raise ValueError(f"--format {fmt}: not one of {', '.join(TABLE_FORMATS)}")
    path = path.with_suffix(f".{fmt}")
    write = columnar.write_csv if fmt == "csv" else columnar.write_parquet
    return _whole(path, lambda tmp: write(tmp, columns))


def _whole(path: Path, write: Callable[[Path], object]) -> Path:
    tmp = path.with_name(f".{path.name}.partial")
    try:
        write(tmp)
        interrupts.checkpoint()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def figure_path(out: Path) -> Path:
    """Where a figure asked for as ``out`` is written: ``out`` itself, with ``.png`` added when it has no suffix
    (matplotlib would add it silently)."""
    return out if out.suffix else out.with_name(out.name + ".png")
