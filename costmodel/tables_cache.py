"""Built kernel tables kept on disk, so that a run of a model and device built before skips the database.

``kernel_tables.build`` turns NVIDIA's measured tables (Parquet, read with pandas) into ferry's grids: most of a second
per cost model, paid by every process, before its first event. The result is a pair of arrays and a few notes; this
module files them under a hash of everything they were built from: the caller's key (every input, the database's
version included) and the source of ``costmodel``'s modules (the code that builds and times them), so that an edited
formula or a new database never reads an old table. Files live in ``$FERRY_CACHE_DIR`` (default
``$XDG_CACHE_HOME/ferry`` or ``~/.cache/ferry``), under ``kernel-tables/``; a folder that cannot be written leaves
every run building its tables as before, and a file that cannot be read is built again.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

FOLDER = "kernel-tables"


def cache_root() -> Path:
    """ferry's cache folder (``$FERRY_CACHE_DIR``, else ``$XDG_CACHE_HOME/ferry``, else ``~/.cache/ferry``)."""
    if os.environ.get("FERRY_CACHE_DIR"):
        return Path(os.environ["FERRY_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ferry"


@lru_cache(maxsize=1)
def code_stamp() -> str:
    """A hash of the source of ``costmodel``'s own modules (what builds the tables and the formulas that read them)."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def path_of(key: str) -> Path:
    """The file of the tables built from ``key``."""
    name = hashlib.sha256(f"{code_stamp()}\0{key}".encode()).hexdigest()[:32]
    return cache_root() / FOLDER / f"{name}.npz"


def load(key: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64], tuple[str, ...]] | None:
    """(toc, tab, notes) built from ``key`` before, or None."""
    path = path_of(key)
    try:
        with np.load(path, allow_pickle=False) as kept:
            return kept["toc"].astype(np.int64), kept["tab"].astype(np.float64), tuple(str(n) for n in kept["notes"])
    except (OSError, KeyError, ValueError):
        return None


def save(key: str, toc: npt.NDArray[np.int64], tab: npt.NDArray[np.float64], notes: tuple[str, ...]) -> None:
    """Keep the tables built from ``key`` (whole or not at all; nothing when the folder cannot be written)."""
    path = path_of(key)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.partial.npz")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(tmp, toc=toc, tab=tab, notes=np.array(notes, dtype=np.str_))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
