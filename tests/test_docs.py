"""The documentation site builds with warnings as errors (a broken link or anchor, a page left out of the nav), and
its reference pages are what ``experiments.docs_reference`` writes from the code now."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import docs_reference

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the dev extra installs it: pip install -e '.[dev]')")
    pytest.importorskip("material", reason="mkdocs-material is not installed (the dev extra installs it)")
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and not warnings, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


@pytest.mark.parametrize("name", sorted(docs_reference.PAGES))
def test_the_reference_pages_are_current(name: str) -> None:
    """docs/reference/NAME is what the generator writes from today's parsers and outputs; if this fails, run
    ``python -m experiments.docs_reference`` and commit the pages."""
    committed = (docs_reference.REFERENCE / name).read_text()
    assert committed == docs_reference.PAGES[name](), (
        f"docs/reference/{name} is stale: python -m experiments.docs_reference"
    )


def test_every_page_is_in_the_nav() -> None:
    """mkdocs only warns about a page missing from the nav in strict mode; say which, before the build does."""
    yaml = pytest.importorskip("yaml")
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(items: list) -> set[str]:
        out: set[str] = set()
        for item in items:
            for value in item.values() if isinstance(item, dict) else [item]:
                out |= pages(value) if isinstance(value, list) else {value}
        return out

    on_disk = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk == pages(nav)
