"""What ferry keeps on disk between runs (compiled code, built kernel tables) is keyed so that it is never stale."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from costmodel import numba_cache, tables_cache


def _tree(root: Path) -> None:
    for package in numba_cache.PACKAGES:
        (root / package).mkdir(parents=True)
        (root / package / "a.py").write_text(f"# {package}\n")


def test_any_changed_source_file_gives_numba_another_folder(tmp_path: Path) -> None:
    _tree(tmp_path)
    before = numba_cache.source_stamp(tmp_path)
    assert numba_cache.source_stamp(tmp_path) == before
    (tmp_path / "policies" / "a.py").write_text("# policies, edited\n")
    edited = numba_cache.source_stamp(tmp_path)
    assert edited != before
    (tmp_path / "sim" / "deep").mkdir()
    (tmp_path / "sim" / "deep" / "b.py").write_text("")
    assert numba_cache.source_stamp(tmp_path) not in (before, edited)


def test_a_file_of_experiments_counts_only_if_it_compiles(tmp_path: Path) -> None:
    """A command's or a study's edit leaves the compiled code as it was; a compiled kernel's does not."""
    _tree(tmp_path)
    before = numba_cache.source_stamp(tmp_path)
    (tmp_path / "experiments" / "a.py").write_text("# a command, edited\n")
    assert numba_cache.source_stamp(tmp_path) == before
    (tmp_path / "experiments" / "lines.py").write_text("from numba import njit\n")
    assert numba_cache.source_stamp(tmp_path) != before


def test_the_process_compiles_into_this_source_versions_folder() -> None:
    import numba

    import costmodel.formulas  # noqa: F401  (its import points the cache)

    if not numba.config.CACHE_DIR:
        pytest.skip("NUMBA_CACHE_DIR is set by the user, or the cache folder cannot be written")
    root = Path(numba_cache.__file__).resolve().parent.parent
    assert Path(numba.config.CACHE_DIR).name == numba_cache.source_stamp(root)


def test_built_tables_are_kept_under_their_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_CACHE_DIR", str(tmp_path))
    toc, tab = np.arange(6, dtype=np.int64).reshape(2, 3), np.linspace(0.0, 1.0, 5)
    assert tables_cache.load("key") is None
    tables_cache.save("key", toc, tab, ("a note", "another"))
    kept = tables_cache.load("key")
    assert kept is not None
    assert np.array_equal(kept[0], toc) and np.array_equal(kept[1], tab) and kept[2] == ("a note", "another")
    assert tables_cache.load("another key") is None
    tables_cache.path_of("key").write_bytes(b"not a table")  # a damaged file is built again, not read
    assert tables_cache.load("key") is None
