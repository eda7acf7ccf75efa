"""`ferry plot` and experiments.sweep.plots: every figure of a sweep's results.parquet is written as a slide-size PNG
and an SVG from the ok runs only, the Pareto front is the set of runs nothing beats, and a missing column or a table
without ok runs is a one-line error naming what is there."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matplotlib.figure import Figure
from PIL import Image

from experiments.commands import plot
from experiments.sweep import plots as sweep_plots

POLICIES = ("continuous", "chunked")
SEQS = (64, 128, 256)
RATES = (1.0, 2.0, 4.0, 8.0)
SEEDS = (0, 1)


def make_results(mode: str = "run", errors: int = 2) -> pd.DataFrame:
    """A sweep of policy x max_num_seqs x request_rate x seed whose metrics follow a made-up load curve, plus
    ``errors`` failed runs whose (absurd) numbers must never show."""
    rng = np.random.default_rng(0)
    rows = []
    for policy in POLICIES:
        for seqs in SEQS:
            for rate in RATES:
                for seed in SEEDS:
                    load = rate / (6.0 + seqs / 64 + (2.0 if policy == "chunked" else 0.0))
                    rows.append({
                        "status": "ok", "error": "", "seed": seed, "wall_s": 0.5, "ferry_version": "0.1.0",
                        "mode": mode, "policy": policy, "max_num_seqs": seqs, "request_rate": rate,
                        "output_throughput": 128 * rate * min(1.0, 1 / load) * (1 + 0.02 * rng.standard_normal()),
                        "p99_tpot_ms": 20 + 4 * seqs / 64 + 200 * max(0.0, load - 0.6) + rng.random(),
                        "p99_ttft_ms": 50 / max(0.05, 1 - load) + rng.random(),
                        "completed": 100, "failed": 0,
                    })  # fmt: skip
    for k in range(errors):
        rows.append({"status": "error", "error": f"boom {k}", "seed": 0, "wall_s": 0.1, "ferry_version": "0.1.0",
                     "mode": mode, "policy": "chunked", "max_num_seqs": 64, "request_rate": 8.0,
                     "output_throughput": 1e9, "p99_tpot_ms": 0.001, "p99_ttft_ms": 1e-3})  # fmt: skip
    table = pd.DataFrame(rows)
    if mode == "max_rate":
        table["max_rate"] = (6.0 + table["max_num_seqs"] / 64 + (table["policy"] == "chunked") * 2.0
                             + 0.1 * table["seed"]).where(table["status"] == "ok", 1e6)  # fmt: skip
        table["evaluations"] = "[]"
    table.insert(0, "point", range(len(table)))
    table.insert(1, "hash", [f"h{k}" for k in range(len(table))])
    return table


def write_results(folder: Path, table: pd.DataFrame, swept: list[str] | None) -> Path:
    """``table`` as ``folder/results.parquet``, with the swept names in the schema metadata (as `ferry sweep`)."""
    folder.mkdir(parents=True, exist_ok=True)
    arrow = pa.Table.from_pandas(table, preserve_index=False)
    if swept is not None:
        arrow = arrow.replace_schema_metadata({**(arrow.schema.metadata or {}), b"ferry.swept": json.dumps(swept)})
    pq.write_table(arrow, folder / "results.parquet")
    return folder


SWEPT = ["policy", "max_num_seqs", "request_rate", "seed"]


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    return write_results(tmp_path / "sweep", make_results(), SWEPT)


def assert_figures(paths: list[Path]) -> None:
    png, svg = paths
    assert png.suffix == ".png" and svg.suffix == ".svg"
    assert png.stat().st_size > 10_000 and svg.stat().st_size > 10_000
    with Image.open(png) as image:
        assert image.width >= 800, image.size


def run_cli(folder: Path, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    plot.register(parser.add_subparsers())
    args = parser.parse_args(["plot", str(folder), *argv])
    return args.func(args)


# ---- the table --------------------------------------------------------------------------------------------------


def test_swept_columns_come_from_the_metadata_or_else_from_the_names(tmp_path: Path) -> None:
    table = make_results()
    assert sweep_plots.swept_columns(sweep_plots.load_results(write_results(tmp_path / "a", table, SWEPT))) == SWEPT
    inferred = sweep_plots.load_results(write_results(tmp_path / "b", table, None))
    assert sweep_plots.swept_columns(inferred) == ["policy", "max_num_seqs", "request_rate"]
    assert sweep_plots.config_columns(inferred) == ["policy", "max_num_seqs"]


def test_units_follow_the_column_suffix() -> None:
    assert sweep_plots.label("p99_tpot_ms") == "p99_tpot_ms (ms)"
    assert sweep_plots.unit("output_throughput") == "tokens/s"
    assert sweep_plots.unit("request_throughput") == sweep_plots.unit("request_rate") == "requests/s"
    assert sweep_plots.unit("max_rate") == "requests/s"
    assert sweep_plots.unit("duration") == "s" and sweep_plots.unit("policy") is None


# ---- the Pareto front -------------------------------------------------------------------------------------------


def test_pareto_front_of_a_hand_made_table() -> None:
    table = pd.DataFrame({
        "name":   ["a", "b", "c", "d", "e", "f", "g", "h"],
        "status": ["ok", "ok", "ok", "ok", "ok", "ok", "ok", "error"],
        "lat":    [10.0, 20.0, 15.0, 30.0, 20.0, 10.0, 40.0, 1.0],
        "tput":   [100.0, 300.0, 200.0, 300.0, 150.0, 90.0, 350.0, 1e6],
    })  # fmt: skip
    front = sweep_plots.pareto_front(table, "lat", "tput")
    # d: b has the same throughput at lower latency; e: b is as fast and faster; f: a beats it; h: an error
    assert list(front["name"]) == ["a", "c", "b", "g"]
    assert list(front["lat"]) == sorted(front["lat"])


def test_pareto_front_keeps_exact_ties() -> None:
    table = pd.DataFrame({"status": ["ok"] * 3, "lat": [1.0, 1.0, 2.0], "tput": [5.0, 5.0, 5.0]})
    assert list(sweep_plots.pareto_front(table, "lat", "tput").index) == [0, 1]


def test_pareto_figure(sweep: Path, tmp_path: Path) -> None:
    table = sweep_plots.load_results(sweep)
    assert_figures(sweep_plots.pareto(table, out=tmp_path / "categories"))
    assert_figures(sweep_plots.pareto(table, color="max_num_seqs", out=tmp_path / "numbers.png"))
    front = sweep_plots.pareto_front(table, "p99_tpot_ms", "output_throughput")
    assert (front["status"] == "ok").all() and front["output_throughput"].max() < 1e6


def test_an_overloaded_run_is_never_on_the_pareto_front() -> None:
    """c would beat every run, but it was overloaded (its latency measures the trace's length): a and b make the
    front; a table from before the column was kept treats every run as valid."""
    table = pd.DataFrame({"status": ["ok"] * 3, "lat": [10.0, 20.0, 5.0], "tput": [100.0, 300.0, 1000.0],
                          "overloaded": [False, False, True]})  # fmt: skip
    assert list(sweep_plots.pareto_front(table, "lat", "tput").index) == [0, 1]
    assert list(sweep_plots.pareto_front(table.drop(columns="overloaded"), "lat", "tput").index) == [2]
    assert sweep_plots.pareto_front(table.assign(overloaded=True), "lat", "tput").empty


def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """The figures the plotting functions draw, kept instead of written."""
    figures: list[Figure] = []
    monkeypatch.setattr(sweep_plots, "_save", lambda fig, out: figures.append(fig) or [])
    return figures


def hot_results(mode: str = "run") -> pd.DataFrame:
    """``make_results`` with the runs near and beyond the made-up knee (load >= 0.8) marked overloaded."""
    table = make_results(mode)
    load = table["request_rate"] / (6.0 + table["max_num_seqs"] / 64 + 2.0 * (table["policy"] == "chunked"))
    table["overloaded"] = (load >= 0.8) & (table["status"] == "ok")
    table["sustained_rate"] = (table["request_rate"] / load.clip(lower=1.0)).where(table["overloaded"])
    return table


def test_the_figures_mark_overloaded_runs_and_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = drawn(monkeypatch)
    table = hot_results()
    ok = table[table.status == "ok"]
    hot = ok[ok.overloaded]
    assert 0 < len(hot) < len(ok)
    sweep_plots.pareto(table, color="policy")
    (ax,) = figures[-1].axes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert sweep_plots.OVERLOADED + ", off the front" in labels
    crossed = next(c for c in ax.collections if c.get_label().startswith(sweep_plots.OVERLOADED))
    assert sorted(map(tuple, crossed.get_offsets())) == sorted(zip(hot.p99_tpot_ms, hot.output_throughput, strict=True))
    front = next(line for line in ax.lines if line.get_label() == "Pareto front")
    assert not set(front.get_xdata()[:-1]) & set(hot.p99_tpot_ms)  # its last point: the step to the right edge
    valid = sweep_plots.pareto_front(table.drop(columns="overloaded"), "p99_tpot_ms", "output_throughput")
    assert valid.index.intersection(hot.index).size  # without the column they would be on it
    # a heatmap cell with overloaded runs is hatched; the share of them per cell is the data behind it
    share = sweep_plots.heatmap_overloaded(table, "p99_ttft_ms", "request_rate", "max_num_seqs")
    expected = hot_results().query("status == 'ok'").groupby(["max_num_seqs", "request_rate"]).overloaded.mean()
    assert share.loc["64", "8"] == pytest.approx(expected[(64, 8.0)]) and share.loc["64", "1"] == 0
    sweep_plots.heatmap(table, "p99_ttft_ms", "request_rate", "max_num_seqs")
    hatched = [p for p in figures[-1].axes[0].patches if p.get_hatch()]
    assert len(hatched) == int((share > 0).sum().sum())
    assert sweep_plots.OVERLOADED in figures[-1].legends[0].get_texts()[0].get_text()
    # latency against rate: the rates where a run was overloaded are crossed out, in the legend
    sweep_plots.latency_rate(table)
    ax = figures[-1].axes[0]
    assert sweep_plots.OVERLOADED in [t.get_text() for t in ax.get_legend().get_texts()]


def test_a_sweep_all_overloaded_draws_no_front(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = drawn(monkeypatch)
    table = make_results().assign(overloaded=lambda t: t.status == "ok")
    sweep_plots.pareto(table)
    ax = figures[-1].axes[0]
    assert not any(line.get_label() == "Pareto front" for line in ax.lines)
    assert "0 on the Pareto front (48 overloaded, left out of it)" in figures[-1].get_suptitle()


def test_capacity_counts_the_runs_overloaded_at_their_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    figures = drawn(monkeypatch)
    table = make_results("max_rate")
    table["overloaded"] = (table.policy == "continuous") & (table.max_num_seqs == 64) & (table.status == "ok")
    stats = sweep_plots.capacity_table(table).set_index("configuration")
    assert stats.loc["policy=continuous, max_num_seqs=64", "overloaded"] == 8 and stats.overloaded.sum() == 8
    sweep_plots.capacity(table)
    ax = figures[-1].axes[0]
    assert len([p for p in ax.patches if p.get_hatch()]) == 1
    assert sweep_plots.OVERLOADED in figures[-1].legends[0].get_texts()[0].get_text()


def test_cli_pareto_says_how_many_runs_it_left_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = write_results(tmp_path / "hot", hot_results(), SWEPT)
    assert run_cli(folder, "--kind", "pareto") == 0
    hot = int(hot_results().overloaded.sum())
    assert f"; {hot} overloaded runs left out, crossed out in the figure):" in capsys.readouterr().out


# ---- the other figures ------------------------------------------------------------------------------------------


def test_heatmap_means_over_seeds_and_ignores_errors(sweep: Path, tmp_path: Path) -> None:
    table = sweep_plots.load_results(sweep)
    grid = sweep_plots.heatmap_grid(table, "output_throughput", "request_rate", "max_num_seqs")
    assert list(grid.columns) == ["1", "2", "4", "8"] and list(grid.index) == ["64", "128", "256"]
    ok = table[(table.status == "ok") & (table.request_rate == 8.0) & (table.max_num_seqs == 64)]
    assert grid.loc["64", "8"] == pytest.approx(ok.output_throughput.mean())
    assert_figures(sweep_plots.heatmap(table, "p99_tpot_ms", "request_rate", "max_num_seqs", tmp_path / "heat"))
    assert_figures(sweep_plots.heatmap(table, out=tmp_path / "default"))  # policy x max_num_seqs


def test_capacity_bars_sorted_with_the_spread_over_seeds(tmp_path: Path) -> None:
    table = sweep_plots.load_results(write_results(tmp_path / "s", make_results("max_rate"), SWEPT))
    stats = sweep_plots.capacity_table(table)
    assert len(stats) == len(POLICIES) * len(SEQS)
    assert list(stats["mean"]) == sorted(stats["mean"], reverse=True)
    assert stats.iloc[0]["configuration"] == "policy=chunked, max_num_seqs=256"
    assert stats["max"].max() < 1e6  # the failed runs' max_rate is not there
    assert (stats["max"] - stats["min"]).round(6).eq(0.1).all()
    assert_figures(sweep_plots.capacity(table, out=tmp_path / "capacity"))


def test_latency_against_rate(sweep: Path, tmp_path: Path) -> None:
    table = sweep_plots.load_results(sweep)
    assert_figures(sweep_plots.latency_rate(table, out=tmp_path / "latency"))
    assert_figures(sweep_plots.latency_rate(table, "p99_tpot_ms", ["policy"], tmp_path / "by-policy"))


# ---- errors -----------------------------------------------------------------------------------------------------


def test_a_missing_column_names_it_and_the_ones_there_are(sweep: Path, tmp_path: Path) -> None:
    table = sweep_plots.load_results(sweep)
    with pytest.raises(ValueError, match=r"column 'p99_itl_ms' is not in the results \(columns: point, hash"):
        sweep_plots.pareto(table, x="p99_itl_ms", out=tmp_path / "p")
    with pytest.raises(ValueError, match="'hardware' is not in the results"):
        sweep_plots.heatmap(table, a="hardware", b="policy", out=tmp_path / "h")
    with pytest.raises(ValueError, match="'nope' is not in the results"):
        sweep_plots.latency_rate(table, by=["nope"], out=tmp_path / "l")
    with pytest.raises(ValueError, match="mode: max_rate"):
        sweep_plots.capacity(table, out=tmp_path / "c")
    assert not list(tmp_path.glob("*.png"))


def test_a_table_without_ok_runs_is_an_error(tmp_path: Path) -> None:
    table = make_results()
    table["status"], table["error"] = "error", "out of memory"
    with pytest.raises(ValueError, match=r"no run has status 'ok' \(50 rows; first error: out of memory\)"):
        sweep_plots.pareto(table, out=tmp_path / "p")


# ---- the command ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["pareto", "heatmap", "latency"])
def test_cli_writes_each_kind_beside_the_results(sweep: Path, kind: str, capsys: pytest.CaptureFixture) -> None:
    assert run_cli(sweep, "--kind", kind) == 0
    printed = capsys.readouterr().out
    for suffix in (".png", ".svg"):
        assert f"wrote {sweep / f'plot-{kind}{suffix}'}" in printed
    assert_figures([sweep / f"plot-{kind}.png", sweep / f"plot-{kind}.svg"])


def test_cli_capacity_and_its_flags(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = write_results(tmp_path / "s", make_results("max_rate"), SWEPT)
    out = tmp_path / "figs" / "cap"
    assert run_cli(folder / "results.parquet", "--kind", "capacity", "--by", "policy", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert "policy=chunked" in printed and f"wrote {out}.png" in printed
    with pytest.raises(ValueError, match="--kind capacity does not use --metric"):
        run_cli(folder, "--kind", "capacity", "--metric", "p99_ttft_ms")


def test_cli_capacity_of_a_run_sweep_says_what_to_do(sweep: Path) -> None:
    with pytest.raises(ValueError, match="capacity needs a sweep run with `mode: max_rate`"):
        run_cli(sweep, "--kind", "capacity")


def test_cli_namespace_and_a_folder_without_results(tmp_path: Path) -> None:
    args = argparse.Namespace(dir=tmp_path, kind="pareto", x=None, y=None, color=None, metric=None, axes=None,
                              by=None, latency=None, out=None)  # fmt: skip
    with pytest.raises(FileNotFoundError, match="results.parquet: not found"):
        plot.main(args)


def test_labels_show_values_briefly() -> None:
    assert [sweep_plots.value_text(v) for v in (2.0, 0.125, None, float("nan"), True, "chunked")] == [
        "2", "0.125", "none", "none", "True", "chunked"
    ]  # fmt: skip
    assert sweep_plots.value_text("../shared/data/traces/sharegpt.csv") == "sharegpt.csv"
    assert sweep_plots.value_text("meta-llama/Llama-3.1-8B") == "meta-llama/Llama-3.1-8B"
