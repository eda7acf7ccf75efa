"""Where numba keeps ferry's compiled functions: one folder per version of ferry's source.

numba files a compiled function under its own source file and checks only that file's time stamp, although the
machine code it keeps holds every function it calls, from other files too: the compiled loop holds the policies' and
the KV cache's kernels. After a ``git pull`` that changed a kernel but not the loop's file, the loop would run the old
kernel, silently. So ferry points numba's cache (``numba.config.CACHE_DIR``) at a folder named by a hash of the
source: a changed file gives a new folder, compiled once. The source is every file of the packages the compiled code
lives in and reads its constants from (``costmodel``, ``sim``, ``policies``), and of ``experiments`` only the files
that hold compiled code themselves (a command's or a study's edit leaves the compiled code as it was). The newest
``KEPT`` folders stay (about 16 MB each), older ones are removed. A ``NUMBA_CACHE_DIR`` the user set is left as it is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from numba.core import config as numba_config

PACKAGES = ("costmodel", "sim", "policies", "experiments")
LOWER = PACKAGES[:3]  # every file of these is in the stamp; of experiments, those that compile (``compiles``)
KEPT = 4  # source versions whose compiled code stays on disk


def source_stamp(root: Path) -> str:
    """A hash of the Python files the compiled code comes from, under ``root`` (names and contents): every file of
    the lower packages, and the files of ``experiments`` that compile a function."""
    digest = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_bytes()
            if package in LOWER or compiles(text):
                digest.update(str(path.relative_to(root)).encode() + b"\0" + text + b"\0")
    return digest.hexdigest()[:16]


def compiles(source: bytes) -> bool:
    """Whether a module's source compiles a function with numba (``njit``, or ``sim.kernels.jit``'s ``kernel``)."""
    return b"njit" in source or b"@kernel" in source


def configure() -> None:
    """Point numba's cache at this source version's folder (once per process, before any function is compiled)."""
    if os.environ.get("NUMBA_CACHE_DIR") or getattr(numba_config, "CACHE_DIR", ""):
        return
    from costmodel.tables_cache import cache_root

    base = cache_root() / "numba"
    folder = base / source_stamp(Path(__file__).resolve().parent.parent)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.utime(folder)  # (the newest stay)
        older = sorted((p for p in base.iterdir() if p.is_dir() and p != folder), key=lambda p: p.stat().st_mtime)
        for stale in older[: max(len(older) - (KEPT - 1), 0)]:
            shutil.rmtree(stale, ignore_errors=True)
    except OSError:
        return  # a folder that cannot be written: numba's own place, beside the sources
    numba_config.CACHE_DIR = str(folder)  # type: ignore[attr-defined]  # (read when a function is first compiled)
