"""The tree keeps its architecture: one-way layers, modules of a readable size, and the old import paths of modules
that moved still giving the same module objects."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("costmodel", "sim", "policies", "experiments")  # bottom to top: a package imports only those below it
MAX_LINES = 420  # "about 400": a longer module says why in its docstring (the word "long")


def _modules() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_runs_back_up(path: Path) -> None:
    layer = path.relative_to(ROOT).parts[0]
    above = set(LAYERS[LAYERS.index(layer) + 1 :])
    upward = sorted(n for n in _imports(path) if n.split(".")[0] in above)
    assert not upward, f"{path.relative_to(ROOT)} imports {upward} from a layer above {layer}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_are_of_a_readable_size(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    if lines > MAX_LINES:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert "long" in doc.lower(), f"{path.relative_to(ROOT)} has {lines} lines and no reason in its docstring"


SHARED = ("sim/kernels", "sim/kvcache.py", "sim/prefix_cache.py", "sim/state.py", "sim/records.py")


@pytest.mark.parametrize("path", [p for p in _modules() if str(p.relative_to(ROOT)).startswith(SHARED)],
                         ids=lambda p: str(p.relative_to(ROOT)))  # fmt: skip
def test_what_both_engines_share_imports_neither_engine(path: Path) -> None:
    """The kernels written once (``sim.kernels``) and the reference engine's state over them sit below the compiled
    engine's twin (``sim.compiled``): no arrow from them up into it."""
    up = sorted(n for n in _imports(path) if n == "sim.compiled" or n.startswith("sim.compiled.") or n == "sim.engine")
    assert not up, f"{path.relative_to(ROOT)} imports {up}"


MOVED = {
    "costmodel.kernels": "costmodel.calibration.kernels",
    "costmodel.calibrate": "costmodel.calibration.harness",
    "costmodel.calibrated": "costmodel.calibration.profile",
    "costmodel.fit": "costmodel.calibration.fit",
    "costmodel.measurements": "costmodel.calibration.vidur",
    "costmodel.refit": "costmodel.calibration.refit",
    "sim.fast_engine": "sim.compiled.engine",
    "sim.fast_state": "sim.compiled.state",
    "sim.compiled.jit": "sim.kernels.jit",
    "sim.compiled.kv": "sim.kernels.kv",
    "sim.compiled.kvstate": "sim.kernels.kvstate",
    "sim.compiled.prefix": "sim.kernels.prefix",
    "sim.compiled.sessions": "sim.kernels.sessions",
    "sim.traces": "sim.workload.traces",
    "sim.lengths": "sim.workload.lengths",
    "experiments.run": "experiments.commands.run",
    "experiments.validate": "experiments.commands.validate",
    "experiments.executor": "experiments.real.executor",
    "experiments.paged_vs_static": "experiments.studies.paged_vs_static",
    "experiments.bench": "experiments.studies.bench",
    "experiments.config": "experiments.runner.config",
    "experiments.simulation": "experiments.runner.simulation",
    "experiments.outputs": "experiments.runner.outputs",
    "experiments.user_code": "experiments.runner.user_code",
    "experiments.summary_table": "experiments.commands.summary_table",
    "experiments.sweep_plots": "experiments.sweep.plots",
}


@pytest.mark.parametrize(("old", "new"), MOVED.items())
def test_old_import_paths_give_the_moved_module(old: str, new: str) -> None:
    moved = importlib.import_module(old)
    assert moved is importlib.import_module(new)
    assert moved.__spec__ is not None and moved.__spec__.name == new  # its own spec, not the alias's


def test_the_public_workload_surface() -> None:
    from sim.workload import FORMATS, LengthSpec, Workload, load_trace, parse_length_spec, synthetic

    assert callable(load_trace) and callable(synthetic) and callable(parse_length_spec)
    assert "native" in FORMATS and Workload.__module__ == "sim.workload.base" and LengthSpec is not None


def test_every_folder_that_ships_is_a_listed_package() -> None:
    """setuptools warns once per data folder that is importable but not listed (30 lines on every `make run`), and
    a folder of modules left out would be missing from an installed ferry. Example files a clone runs by path
    (``experiments/sweeps``) do not ship."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.relative_to(ROOT).parts) for layer in (*LAYERS, "hwprofiles") for p in [ROOT / layer,
               *(ROOT / layer).rglob("*")] if p.is_dir() and p.name != "__pycache__" and any(
               f.is_file() for f in p.iterdir())}  # fmt: skip
    assert folders - {"experiments.sweeps"} == listed, (sorted(folders - listed), sorted(listed - folders))
