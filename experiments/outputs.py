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

import pandas as pd

from experiments import interrupts

# every name a ferry command writes into an --out folder (files, and folders such as validate's real/ and sim/)
FERRY_OUTPUTS = ("summary.json", "requests.csv", "iterations.csv", "batches.csv", "comparison.json", "real", "sim",
                 "teach.json", "records", "plan.json", "plan.png", "points", "results.parquet",
                 "sweep.json")  # fmt: skip


def check(out: Path, own: tuple[str, ...], command: str, force: bool = False) -> None:
    """Refuse, before any work, an ``out`` that is a file, or a folder holding another ferry command's outputs
    (``FERRY_OUTPUTS`` not in ``own``), unless ``force``."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is a file, not a folder")
    if out.is_dir() and not force:
        others = [name for name in _entries(out) if name in FERRY_OUTPUTS and name not in own]
        if others:
            raise ValueError(
                f"--out {out} holds another command's outputs ({', '.join(others)}), which `ferry {command}` would "
                "leave mixed with its own; choose another folder, or pass --force to replace them"
            )


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
