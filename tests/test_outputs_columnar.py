"""The run's tables as ferry writes them (``runner.columnar``): the CSV text ``DataFrame.to_csv`` wrote before,
value for value and byte for byte, Parquet files that read back to the same columns, and the engine ``auto`` picks."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import formulas
from experiments.commands.summary_table import format_summary
from experiments.runner import columnar
from experiments.runner.config import RunConfig
from experiments.runner.simulation import run_simulation, write_outputs
from policies import compiled as kernels
from sim.compiled.engine import loop_on_disk
from sim.engine import AUTO_COMPILED_MIN_TOKENS, AUTO_LOADED_MIN_TOKENS, choose_engine
from sim.kernels.jit import kernel
from sim.metrics import request_frame
from sim.records import SPEC_COLUMNS
from sim.request import RequestTable

SMALL = {"model": "llama-3-8b", "hardware": "h100-sxm", "policy": "chunked", "num_prompts": 60, "request_rate": 30.0,
         "input_len": "uniform:16:512", "output_len": "uniform:1:64", "seed": 4}  # fmt: skip


def _pandas_csv(columns: dict[str, np.ndarray]) -> bytes:
    out = io.StringIO()
    pd.DataFrame(columns).to_csv(out, index=False)
    return out.getvalue().encode()


def _written(columns: dict[str, np.ndarray], tmp_path: Path) -> bytes:
    path = tmp_path / "t.csv"
    columnar.write_csv(path, columns)
    return path.read_bytes()


def _old_writer_files(result: object, out: Path) -> dict[str, pd.DataFrame]:
    """requests.csv and iterations.csv as the writer before the columnar one made them (``DataFrame.to_csv``)."""
    records = result.records  # type: ignore[attr-defined]
    requests = _spec_last(request_frame(records).assign(replica=0))
    iterations = _spec_last(records.iterations.to_frame().assign(replica=0))
    out.mkdir()
    requests.to_csv(out / "requests.csv", index=False)
    iterations.to_csv(out / "iterations.csv", index=False)
    return {"requests": requests, "iterations": iterations}


def _spec_last(frame: pd.DataFrame) -> pd.DataFrame:
    """The columns as a run writes them: speculative decoding's after every other (the order before them kept)."""
    return frame[[c for c in frame.columns if c not in SPEC_COLUMNS] + list(SPEC_COLUMNS)]


@pytest.mark.parametrize("engine", ["compiled", "reference"])
def test_a_runs_csv_files_are_those_to_csv_wrote(tmp_path: Path, engine: str) -> None:
    result = run_simulation(RunConfig.model_validate(SMALL | {"engine": engine}))
    write_outputs(result, tmp_path / "new")
    frames = _old_writer_files(result, tmp_path / "old")
    for name, frame in frames.items():
        new, old = tmp_path / "new" / f"{name}.csv", tmp_path / "old" / f"{name}.csv"
        back_new, back_old = pd.read_csv(new), pd.read_csv(old)
        assert list(back_new.columns) == list(frame.columns)
        pd.testing.assert_frame_equal(back_new, back_old, check_exact=True)  # value for value
        assert new.read_bytes() == old.read_bytes()  # and the very text


def test_parquet_reads_back_to_the_same_columns(tmp_path: Path) -> None:
    result = run_simulation(RunConfig.model_validate(SMALL | {"record_batches": True}))
    paths = write_outputs(result, tmp_path, fmt="parquet")
    assert sorted(p.name for p in paths) == ["batches.parquet", "iterations.parquet", "requests.parquet",
                                             "summary.json"]  # fmt: skip
    expected = _spec_last(request_frame(result.records).assign(replica=0))
    back = pd.read_parquet(tmp_path / "requests.parquet")
    pd.testing.assert_frame_equal(back, expected, check_exact=True, check_dtype=False)
    assert back["ttft_s"].dtype == np.float64 and back["status"].map(type).eq(str).all()
    iterations = pd.read_parquet(tmp_path / "iterations.parquet")
    pd.testing.assert_frame_equal(iterations, _spec_last(result.records.iterations.to_frame().assign(replica=0)),
                                  check_exact=True, check_dtype=False)  # fmt: skip
    assert len(pd.read_parquet(tmp_path / "batches.parquet")) == len(result.records.batches)


def test_a_second_run_in_the_other_format_replaces_the_first(tmp_path: Path) -> None:
    result = run_simulation(RunConfig.model_validate(SMALL | {"num_prompts": 5}))
    write_outputs(result, tmp_path, fmt="parquet")
    write_outputs(result, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iterations.csv", "requests.csv", "summary.json"]


floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e6, max_value=1e6),
    st.integers(-(10**17), 10**17).map(float),
    st.sampled_from([0.0, -0.0, 1e-4, 9.99e-5, 1e10, 1e15, 1e16, 5e-324, 0.1, 1 / 3]),
)
texts = st.one_of(st.none(), st.text(alphabet=st.sampled_from(list('ab ,"\n\r;é0'))), st.just(""))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(floats, st.integers(-(2**62), 2**62), texts, st.booleans()), min_size=1, max_size=40))
def test_any_column_is_written_as_to_csv_writes_it(rows: list[tuple[float, int, str | None, bool]]) -> None:
    columns = {
        "f": np.array([r[0] for r in rows], dtype=np.float64),
        "i": np.array([r[1] for r in rows], dtype=np.int64),
        "s": np.array([r[2] for r in rows], dtype=object),
        "b": np.array([r[3] for r in rows], dtype=bool),
    }
    columns["f again"] = columns["f"].copy()  # formatted once (``columnar._same_as``)
    columns["-f"] = -columns["f"]
    if all(v in ("", None) for v in columns["s"]) and len(rows) == 1:
        columns["s"][0] = "x"  # (a row of one empty field is quoted by the csv module; not a shape ferry writes)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        assert _written(columns, Path(tmp)) == _pandas_csv(columns)


def test_many_rows_are_written_in_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columnar, "BLOCK_ROWS", 7)
    rng = np.random.default_rng(0)
    columns = {"x": rng.random(50) * 10.0 ** rng.integers(-6, 12, 50), "k": np.arange(50)}
    assert _written(columns, tmp_path) == _pandas_csv(columns)
    assert _written({"x": np.zeros(0)}, tmp_path) == _pandas_csv({"x": np.zeros(0)})


def test_a_float_column_equal_to_another_is_written_as_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer formats a float column that equals an earlier one, bit for bit, once (per block of rows): -0.0 and
    0.0 are equal numbers but not the same text, NaN is never equal, and columns may agree in some blocks only."""
    monkeypatch.setattr(columnar, "BLOCK_ROWS", 4)
    a = np.array([0.1, -0.0, np.nan, 1e-5, 3.0, 1e16, 2.5, 0.0001, 7.0, 1 / 3])
    b = a.copy()
    b[1] = 0.0
    c = a.copy()
    c[6:] += 1.0
    columns = {"a": a, "k": np.arange(10), "b": b, "same": a.copy(), "c": c, "again": a}
    block = [a[:4], b[:4], a[:4].copy(), c[:4], c[6:]]
    assert [columnar._same_as(block, k) for k in range(len(block))] == [0, 1, 0, 0, 4]
    assert _written(columns, tmp_path) == _pandas_csv(columns)


def _table(tokens: int) -> RequestTable:
    return RequestTable(np.zeros(2), np.array([8, 8]), np.array([tokens - tokens // 2, tokens // 2]))


def test_auto_takes_the_compiled_engine_where_it_saves_time_and_says_why() -> None:
    tiny, small, large = AUTO_LOADED_MIN_TOKENS - 1, AUTO_LOADED_MIN_TOKENS, AUTO_COMPILED_MIN_TOKENS
    on, off = (lambda: True), (lambda: False)
    # below the cost of loading the loop: the reference engine, whether the loop is on disk or not
    assert choose_engine("auto", True, _table(tiny), on) == (
        "reference", f"auto: {tiny:,} output tokens, under {AUTO_LOADED_MIN_TOKENS:,}")  # fmt: skip
    # a small job: the compiled engine only where the loop loads from disk (compiling it would cost more)
    assert choose_engine("auto", True, _table(small), on) == (
        "compiled", f"auto: {small:,} output tokens, the compiled loop on disk")  # fmt: skip
    assert choose_engine("auto", True, _table(small), off) == ("reference", f"auto: {small:,} output tokens, the "
        f"compiled loop not built yet (from {AUTO_COMPILED_MIN_TOKENS:,})")  # fmt: skip
    # a large one: the compiled engine, loaded or compiled (and then it says so)
    assert choose_engine("auto", True, _table(large), on) == ("compiled", f"auto: {large:,} output tokens")
    assert choose_engine("auto", True, _table(large), off) == (
        "compiled", f"auto: {large:,} output tokens, its loop compiled now (once)")  # fmt: skip
    assert choose_engine("auto", False, _table(large), on)[0] == "reference"  # no compiled twin
    assert choose_engine("compiled", True, _table(1), off) == ("compiled", "asked")
    assert choose_engine("reference", True, _table(large), on) == ("reference", "asked")


def test_a_compiled_run_leaves_its_loop_on_disk_and_a_user_kernel_is_never_there() -> None:
    run_simulation(RunConfig.model_validate(SMALL | {"num_prompts": 4, "engine": "compiled"}))
    assert loop_on_disk(kernels.schedule_chunked, formulas.iteration_time)  # the pair that run loaded or compiled

    @kernel
    def mine(ri, rf, wk, sc, kv, ss, params, now):  # type: ignore[no-untyped-def]  # a user's kernel: never cached
        return kernels.schedule_chunked(ri, rf, wk, sc, kv, ss, params, now)

    assert not loop_on_disk(mine, formulas.iteration_time)


@pytest.mark.parametrize("router", ["least_requests", "round_robin", "prefix_affinity"])
def test_a_clusters_auto_asks_for_the_loop_that_routes_too(router: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster whose router has a kernel routes in a compiled loop of its own, which auto asks about beside the
    replicas' loops: absent, the job of 3,200 output tokens runs on the reference engine and says why."""
    config = SMALL | {"output_len": "16", "request_rate": 200.0, "num_prompts": 200, "replicas": 2, "router": router}
    monkeypatch.setattr("sim.cluster.loop_on_disk", lambda *pair: True)
    monkeypatch.setattr("sim.cluster.on_disk", lambda runner: False)
    choice = run_simulation(RunConfig.model_validate(config)).summary["engine_choice"]
    routes_compiled = router == "least_requests"  # round_robin has no kernel, prefix_affinity reads the caches
    assert ("not built yet" in choice) == routes_compiled, choice
    monkeypatch.setattr("sim.cluster.on_disk", lambda runner: True)
    assert "on disk" in run_simulation(RunConfig.model_validate(config)).summary["engine_choice"]


@pytest.mark.parametrize("cached", [True, False], ids=["loop on disk", "loop not built"])
def test_both_choices_give_the_same_records_and_the_header_names_the_choice(
    cached: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sim.engine.loop_on_disk", lambda *pair: cached)
    config = SMALL | {"output_len": "16", "request_rate": 200.0}
    tiny = math.ceil(AUTO_LOADED_MIN_TOKENS / 16) - 1
    small, large = math.ceil(AUTO_LOADED_MIN_TOKENS / 16), math.ceil(AUTO_COMPILED_MIN_TOKENS / 16)
    chosen = {n: run_simulation(RunConfig.model_validate(config | {"num_prompts": n})) for n in (tiny, small, large)}
    assert [chosen[n].summary["engine"] for n in (tiny, small, large)] == [
        "reference", "compiled" if cached else "reference", "compiled"]  # fmt: skip
    for n, result in chosen.items():
        assert f"{result.summary['engine']} (auto: " in format_summary(result.summary)
        other = "reference" if result.summary["engine"] == "compiled" else "compiled"
        again = run_simulation(RunConfig.model_validate(config | {"num_prompts": n, "engine": other}))
        assert again.summary["engine_choice"] == "asked"
        same = {k: v for k, v in result.summary.items() if k not in ("engine", "engine_choice", "config")}
        assert same == {k: v for k, v in again.summary.items() if k not in ("engine", "engine_choice", "config")}
