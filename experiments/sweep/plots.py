"""Figures of a sweep's ``results.parquet``: throughput against latency with its Pareto front, a metric over two
swept axes, the highest rate each configuration sustains, and latency against request rate.

Each function takes the table (``load_results``), draws only the runs whose ``status`` is ``"ok"``, writes
``out.png`` and ``out.svg`` at slide size and returns their paths. A run that was overloaded (its ``overloaded``
column: arrivals outran the replica, so its latencies measure the trace's length) is never on the Pareto front; every
figure marks such runs and says so in its legend. A column that is not in the table, or a table
without ok runs, is a one-line ``ValueError`` naming the column and the ones there are. Axis labels are the column
names with the unit their suffix implies (``_ms``: ms, ``output_throughput``: tokens/s, ``request_rate``:
requests/s).

The module is long (four figures and the table handling they share) so that a sweep's figures live in one place
with no dependency on the sweep runner.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from experiments.sweep import overload
from experiments.teach.style import SLIDE, language, save

SWEPT_KEY = b"ferry.swept"  # the parquet schema metadata key holding the swept parameter names (a JSON list)
# columns every sweep row has that are neither swept nor measured
BOOKKEEPING = ("point", "hash", "status", "error", "seed", "wall_s", "ferry_version", "mode", "evaluations")
# swept columns that are not a configuration: the workload's seed and the load it is offered
NOT_CONFIG = ("seed", "request_rate")
# metrics of a run's summary.json whose names carry no tell-tale suffix (the rest end in _ms, _throughput, ...)
METRICS = frozenset(
    {"duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_goodput", "max_rate",
     "num_iterations", "gpu_busy_s", "gpu_idle_s", "gpu_idle_fraction", "idle_while_waiting_s", "seats_offered",
     "seat_utilization", "held_seat_fraction", "mean_batch_size", "mean_tokens_per_iteration", "kv_cache_blocks",
     "kv_block_size", "peak_kv_usage", "mean_kv_usage", "total_preemptions", "preempted_requests",
     "recomputed_tokens", "stream", "engine", "num_replicas", "num_gpus", "workload", "sustained_rate"}
)  # fmt: skip
METRIC_PATTERN = re.compile(r"(_ms|_throughput|_goodput|_usage|_fraction|_utilization)$")
# the unit of a column, by how its name ends (the first match counts)
UNITS = (
    (("_ms",), "ms"),
    (("request_throughput", "request_goodput", "_rate"), "requests/s"),
    (("_throughput", "_goodput"), "tokens/s"),
    (("_per_s",), "per s"),
    (("_s", "duration"), "s"),
    (("_tokens",), "tokens"),
    (("_fraction", "_usage", "_utilization"), "share, 0-1"),
)
DATA_SUFFIXES = (".csv", ".json", ".jsonl", ".yaml", ".yml", ".parquet", ".txt")  # a swept path shows its name
CATEGORY_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
OVERLOADED = "overloaded (arrivals outran the replica)"  # the legend's words for the runs marked so
OVERLOADED_COLOR = "#D55E00"


# ---- the table ------------------------------------------------------------------------------------------------


def load_results(path: Path) -> pd.DataFrame:
    """A sweep's table from its folder or its ``results.parquet``; the swept names go to ``attrs["swept"]``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    file = path / "results.parquet" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file}: not found (is {path} the output folder of a `ferry sweep`?)")
    try:
        metadata = pq.read_schema(file).metadata or {}
        table = pd.read_parquet(file)
        swept = json.loads(metadata.get(SWEPT_KEY, b"[]"))
    except (pa.ArrowException, OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file}: not the results.parquet of a `ferry sweep` ({' '.join(str(exc).split())})") from None
    if SWEPT_KEY in metadata:
        if not isinstance(swept, list):
            raise ValueError(f"{file}: schema metadata {SWEPT_KEY.decode()} is {swept!r}, not a list of column names")
        table.attrs["swept"] = [str(c) for c in swept]
    return table


def swept_columns(table: pd.DataFrame) -> list[str]:
    """The swept parameters, in the sweep file's order: ``attrs["swept"]`` (from the parquet's metadata), or else
    every column that is neither bookkeeping nor a metric."""
    if "swept" in table.attrs:
        return [c for c in table.attrs["swept"] if c in table.columns]
    return [c for c in table.columns if c not in BOOKKEEPING and not _is_metric(c)]


def _is_metric(column: str) -> bool:
    return column in METRICS or bool(METRIC_PATTERN.search(column)) or column.startswith(("itl_", "overload"))


def config_columns(table: pd.DataFrame) -> list[str]:
    """The swept columns that make a configuration: all but the seed and the request rate."""
    return [c for c in swept_columns(table) if c not in NOT_CONFIG]


def ok_rows(table: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """The rows with ``status == "ok"``, once ``columns`` are known to exist; ValueError naming what is missing."""
    for column in ("status", *columns):
        if column not in table.columns:
            raise ValueError(f"column {column!r} is not in the results (columns: {', '.join(map(str, table.columns))})")
    ok = table[table["status"] == "ok"]
    if ok.empty:
        errors = table["error"].dropna().astype(str) if "error" in table.columns else pd.Series(dtype=str)
        first = next((e for e in errors if e), "")
        raise ValueError(f"no run has status 'ok' ({len(table)} rows" + (f"; first error: {first})" if first else ")"))
    return ok


def _numeric(ok: pd.DataFrame, column: str) -> pd.Series:
    values = pd.to_numeric(ok[column], errors="coerce")
    if values.isna().all():
        raise ValueError(f"column {column!r} has no numeric values in the ok runs")
    return values


def unit(column: str) -> str | None:
    """The unit a column's name implies: ``_ms`` ms, ``*_throughput`` tokens/s (``request_*`` requests/s), ..."""
    return next((u for endings, u in UNITS if column.endswith(endings)), None)


def label(column: str) -> str:
    """An axis label: the column's name and its unit."""
    u = unit(column)
    return f"{column} ({u})" if u else column


def value_text(value: Any) -> str:
    """A parameter value as a label shows it: integers without ``.0``, floats to four digits, missing as none, a
    data file (a trace, lengths, a config) by its name only."""
    if pd.isna(value):
        return "none"
    if isinstance(value, str) and "/" in value and Path(value).suffix.lower() in DATA_SUFFIXES:
        return Path(value).name
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (float, np.floating)):
        return f"{int(value)}" if float(value).is_integer() else f"{float(value):.4g}"
    return str(value)


def _ordered(values: pd.Series) -> list[Any]:
    """The distinct values of a column, numbers ascending, then other values as text, missing last."""
    distinct = [v for v in values.drop_duplicates().tolist() if not pd.isna(v)]
    numbers = sorted(v for v in distinct if isinstance(v, (int, float)))
    others = sorted((v for v in distinct if not isinstance(v, (int, float))), key=str)
    return numbers + others + ([None] if values.isna().any() else [])


def _configs(ok: pd.DataFrame, by: Sequence[str], names: bool = True) -> pd.Series:
    """Each row's configuration label, ``"policy=chunked, max_num_seqs=128"`` (``names=False``: ``"chunked, 128"``;
    ``"all runs"`` when ``by`` is empty)."""
    if not by:
        return pd.Series("all runs", index=ok.index)
    labels = pd.Series("", index=ok.index)
    for k, c in enumerate(by):
        codes, distinct = pd.factorize(ok[c], use_na_sentinel=False)  # each distinct value written once
        texts = np.array([f"{c}={value_text(v)}" if names else value_text(v) for v in distinct], dtype=object)
        labels = labels + (", " if k else "") + texts[codes]
    return labels


def _varying(ok: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """Of ``columns``, those with more than one value in the ok runs (all of them if none varies)."""
    varying = [c for c in columns if ok[c].nunique(dropna=False) > 1]
    return varying or list(columns)


# ---- Pareto -----------------------------------------------------------------------------------------------------


def pareto_front(table: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The ok rows no other ok row beats (lower or equal ``x`` and higher or equal ``y``, one of them strictly),
    sorted by ``x``; rows with either value missing, and overloaded runs (``overload.mask``), take no part."""
    ok = ok_rows(table, (x, y))
    xs, ys = _numeric(ok, x), _numeric(ok, y)
    ok = ok[~overload.mask(ok)]
    xs, ys = xs[ok.index], ys[ok.index]
    pairs = pd.DataFrame({"x": xs, "y": ys}).dropna()
    pairs = pairs.sort_values(["x", "y"], ascending=[True, False], kind="stable")
    y_sorted = pairs["y"].to_numpy()
    best_before = np.concatenate([[-np.inf], np.maximum.accumulate(y_sorted)[:-1]])
    beats = pairs[y_sorted > best_before]  # higher y than every row of lower (or equal, listed first) x
    # an exact duplicate of a front row is on the front too
    on_front = pd.MultiIndex.from_frame(pairs).isin(pd.MultiIndex.from_frame(beats))
    return ok.loc[pairs.index[on_front]]


def pareto(
    table: pd.DataFrame,
    x: str = "p99_tpot_ms",
    y: str = "output_throughput",
    color: str | None = None,
    out: Path | str = "plot-pareto",
) -> list[Path]:
    """Throughput ``y`` against latency ``x``, one point per ok run coloured by ``color`` (default: the first swept
    column that varies), the Pareto front (lower ``x``, higher ``y``) of the runs not overloaded as a step line with
    its points ringed; overloaded runs crossed out."""
    ok = ok_rows(table, (x, y) + ((color,) if color else ()))
    if color is None:
        candidates = _varying(ok, [c for c in swept_columns(table) if c != "seed"])
        color = candidates[0] if candidates else None
    xs, ys = _numeric(ok, x), _numeric(ok, y)
    ok = ok[xs.notna() & ys.notna()]
    if ok.empty:
        raise ValueError(f"no ok run has both {x} and {y}")
    front = pareto_front(ok, x, y)
    size = 90 if len(ok) <= 500 else max(8.0, 90 * math.sqrt(500 / len(ok)))  # many runs: smaller points
    scale = math.sqrt(90 / size)  # ... but legend markers as large as ever
    with language("en"):
        fig, ax = _figure()
        if color is None:
            ax.scatter(xs[ok.index], ys[ok.index], s=size, color=CATEGORY_COLORS[0], alpha=0.85, label="run")
        elif _is_numeric(ok[color]):
            _scatter_numeric(fig, ax, xs[ok.index], ys[ok.index], ok[color], color, size)
        else:
            _scatter_categories(ax, xs[ok.index], ys[ok.index], ok[color], size)
        if len(ok) > 2000:  # the SVG keeps its axes and text as vectors, the many points as one image
            for points in ax.collections:
                points.set_rasterized(True)
        fx, fy = xs[front.index].to_numpy(), ys[front.index].to_numpy()
        if len(front):
            right = float(xs[ok.index].max())
            ax.step(np.append(fx, right), np.append(fy, fy[-1]), where="post", color="#333333", linewidth=2.2,
                    zorder=3, label="Pareto front")  # fmt: skip
            ax.scatter(fx, fy, s=260, facecolors="none", edgecolors="#333333", linewidths=2.2, zorder=4)
        hot = overload.mask(ok)
        if hot.any():
            ax.scatter(xs[ok.index][hot], ys[ok.index][hot], s=size * 1.6, marker="x", color=OVERLOADED_COLOR,
                       linewidths=2.0, zorder=5, label=OVERLOADED + ", off the front")  # fmt: skip
        _maybe_log(ax, xs[ok.index], "x")
        ax.set_xlabel(label(x) + ", lower is better")
        ax.set_ylabel(label(y) + ", higher is better")
        hot_text = f" ({int(hot.sum()):,} overloaded, left out of it)" if hot.any() else ""
        _title(fig, f"{y} against {x}: {len(ok):,} runs, {len(front):,} on the Pareto front{hot_text}")
        ax.grid(alpha=0.3)
        if color is not None and not _is_numeric(ok[color]):  # a legend of categories, beside the axes
            ax.legend(title=color, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, markerscale=scale)
        else:  # the colour bar is beside the axes: the front's legend goes inside
            ax.legend(loc="best", markerscale=scale)
        return _save(fig, out)


def _is_numeric(values: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)


def _scatter_numeric(
    fig: Figure, ax: Axes, xs: pd.Series, ys: pd.Series, values: pd.Series, name: str, size: float
) -> None:
    v = pd.to_numeric(values, errors="coerce")
    if v.isna().any():  # a parameter some runs leave unset (e.g. a threshold only one policy has): grey points
        ax.scatter(xs[v.isna()], ys[v.isna()], s=size, color="#AAAAAA", alpha=0.85, label=f"{name} none")
        xs, ys, v = xs[v.notna()], ys[v.notna()], v[v.notna()]
    low, high = float(v.min()), float(v.max())
    norm: mcolors.Normalize = (
        mcolors.LogNorm(low, high) if low > 0 and high / low >= 20 else mcolors.Normalize(low, max(high, low + 1e-12))
    )
    points = ax.scatter(xs, ys, c=v, cmap="viridis", norm=norm, s=size, alpha=0.9, edgecolors="white", linewidths=0.5)
    bar = fig.colorbar(points, ax=ax, pad=0.02)
    bar.set_label(label(name))
    distinct = sorted(v.dropna().unique())
    if len(distinct) <= 10:  # a few swept values: tick exactly those
        bar.set_ticks(distinct, labels=[value_text(d) for d in distinct])
        bar.minorticks_off()


def _scatter_categories(ax: Axes, xs: pd.Series, ys: pd.Series, values: pd.Series, size: float) -> None:
    texts = values.map(value_text)
    for k, value in enumerate(_ordered(values)):
        mask = texts == value_text(value)
        color, marker = _style(k)
        ax.scatter(xs[mask], ys[mask], s=size, alpha=0.85, color=color, marker=marker, label=value_text(value))


# ---- a metric over two axes -------------------------------------------------------------------------------------


def heatmap_grid(table: pd.DataFrame, metric: str, a: str, b: str) -> pd.DataFrame:
    """``metric`` averaged over everything else (seeds, other swept columns) for each pair of ``a`` (the columns)
    and ``b`` (the rows) values, labelled as ``value_text`` shows them; NaN where no ok run has the pair."""
    if a == b:
        raise ValueError(f"heatmap axes must be two different columns (got {a!r} twice)")
    ok = ok_rows(table, (metric, a, b))
    return _grid(ok, _numeric(ok, metric), a, b)


def heatmap_overloaded(table: pd.DataFrame, metric: str, a: str, b: str) -> pd.DataFrame:
    """The share (0-1) of the ok runs behind each cell of ``heatmap_grid`` that were overloaded; NaN where none ran."""
    ok = ok_rows(table, (metric, a, b))
    values = _numeric(ok, metric)
    return _grid(ok, overload.mask(ok).astype(float).where(values.notna()), a, b)


def _grid(ok: pd.DataFrame, values: pd.Series, a: str, b: str) -> pd.DataFrame:
    frame = pd.DataFrame({"a": ok[a].map(value_text), "b": ok[b].map(value_text), "m": values})
    grid = frame.groupby(["b", "a"], sort=False)["m"].mean().unstack("a")
    rows, columns = (list(dict.fromkeys(map(value_text, _ordered(ok[c])))) for c in (b, a))
    return grid.reindex(index=rows, columns=columns)


def heatmap(
    table: pd.DataFrame,
    metric: str = "output_throughput",
    a: str | None = None,
    b: str | None = None,
    out: Path | str = "plot-heatmap",
) -> list[Path]:
    """``metric`` over swept columns ``a`` (x axis) and ``b`` (y axis), default the first two that vary, each cell
    the mean over the other columns and seeds, its value written in it; a cell with overloaded runs hatched."""
    if a is None or b is None:
        ok = ok_rows(table, (metric,))
        axes = [c for c in _varying(ok, [c for c in swept_columns(table) if c != "seed"]) if c not in (a, b)]
        a, b = a or (axes.pop(0) if axes else None), b or (axes.pop(0) if axes else None)
        if a is None or b is None:
            raise ValueError(f"heatmap needs two swept columns to use as axes, the table has {swept_columns(table)}; "
                             "name them with --axes A B")  # fmt: skip
    grid = heatmap_grid(table, metric, a, b)
    cells = grid.to_numpy(dtype=float)
    hot = heatmap_overloaded(table, metric, a, b).to_numpy(dtype=float) > 0
    with language("en"):
        fig, ax = _figure()
        image = ax.imshow(cells, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(grid.shape[1]), list(grid.columns))
        ax.set_yticks(range(grid.shape[0]), list(grid.index))
        if grid.shape[1] * max((len(str(c)) for c in grid.columns), default=0) > 90:  # labels would touch
            ax.tick_params(axis="x", labelrotation=30)
        ax.set_xlabel(label(a))
        ax.set_ylabel(label(b))
        bar = fig.colorbar(image, ax=ax, pad=0.02)
        bar.set_label(label(metric))
        if cells.size <= 400:
            size = 14 if cells.size <= 36 else 11 if cells.size <= 120 else 8
            for (i, j), v in np.ndenumerate(cells):
                # white on dark cells (relative luminance, ITU-R BT.709 weights), black elsewhere
                dark = not np.isnan(v) and np.dot(image.cmap(image.norm(v))[:3], (0.2126, 0.7152, 0.0722)) < 0.5
                digits = ",.0f" if abs(v) >= 100 else ".1f" if abs(v) >= 10 else ".3g"
                text = "-" if np.isnan(v) else format(v, digits)
                ax.text(j, i, text, ha="center", va="center", fontsize=size, color="white" if dark else "black")
        _hatch(ax, hot)
        runs = len(ok_rows(table, (metric,)))
        _title(fig, f"{metric}, mean over seeds and other columns ({runs:,} runs)")
        return _save(fig, out)


def _hatch(ax: Axes, hot: np.ndarray) -> None:
    """Hatch the heatmap's cells where ``hot``, with a legend under the figure saying what that means."""
    from matplotlib.patches import Rectangle

    if not hot.any():
        return
    for i, j in zip(*np.nonzero(hot), strict=True):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor=OVERLOADED_COLOR,
                               linewidth=2.0))  # fmt: skip
    key = Rectangle((0, 0), 1, 1, fill=False, hatch="///", edgecolor=OVERLOADED_COLOR, label=OVERLOADED + " in "
                    "some of the cell's runs: its latencies measure the trace's length")  # fmt: skip
    ax.figure.legend(handles=[key], loc="outside lower left", frameon=False)


# ---- capacity ---------------------------------------------------------------------------------------------------


def capacity_table(table: pd.DataFrame, by: Sequence[str] | None = None) -> pd.DataFrame:
    """``max_rate`` per configuration (``by``, default the swept columns but seed and request_rate): its label,
    mean, min and max over the ok runs, how many there were, how many of them were overloaded at that rate (an SLO
    that bounds no wait lets the queue grow), and the ``by`` values; best first."""
    if "max_rate" not in table.columns:
        raise ValueError("column 'max_rate' is not in the results: capacity needs a sweep run with `mode: max_rate`")
    by = list(config_columns(table) if by is None else by)
    ok = ok_rows(table, ("max_rate", *by))
    rates = _numeric(ok, "max_rate")
    frame = pd.concat([pd.DataFrame({"configuration": _configs(ok, by), "max_rate": rates,
                                     "overloaded": overload.mask(ok)}), ok[by]], axis=1)  # fmt: skip
    groups = frame[frame["max_rate"].notna()].groupby("configuration", sort=False)
    stats = groups["max_rate"].agg(["mean", "min", "max", "count"])
    stats = stats.join(groups["overloaded"].sum().astype(int)).join(groups[by].first())
    return stats.sort_values("mean", ascending=False, kind="stable").reset_index()


def capacity(table: pd.DataFrame, by: Sequence[str] | None = None, out: Path | str = "plot-capacity") -> list[Path]:
    """Bars of the highest request rate meeting the SLO per configuration, best at the top, with the min-max over
    seeds as error bars."""
    by = list(config_columns(table) if by is None else by)
    stats = capacity_table(table, by)
    n = len(stats)
    with language("en"):
        fig, ax = _figure(height=max(SLIDE[1], 0.42 * n + 1.8))
        rows = np.arange(n)[::-1]  # the best at the top
        err = np.vstack([stats["mean"] - stats["min"], stats["max"] - stats["mean"]])
        bars = ax.barh(rows, stats["mean"], color=CATEGORY_COLORS[0], alpha=0.85, height=0.7)
        for bar, hot in zip(bars, stats["overloaded"] > 0, strict=True):
            if hot:
                bar.set(hatch="///", edgecolor=OVERLOADED_COLOR, label=OVERLOADED + " at that rate")
        if (stats["count"] > 1).any():
            ax.errorbar(stats["mean"], rows, xerr=err, fmt="none", ecolor="#333333", capsize=5, linewidth=1.5)
        top = float(stats["max"].max()) if n else 1.0
        for r, (mean, high) in zip(rows, zip(stats["mean"], stats["max"], strict=True), strict=True):
            ax.text(high + 0.01 * top, r, f" {mean:.3g}", va="center", fontsize=12)
        labels = list(stats["configuration"])
        if max(map(len, labels), default=0) > 50:  # long labels would squeeze the bars: values only, names below
            labels = [", ".join(value_text(v) for v in values) for values in stats[list(by)].itertuples(index=False)]
            ax.set_ylabel(textwrap.fill(", ".join(by), 60))
        ax.set_yticks(rows, labels)
        ax.set_xlim(0, top * 1.12 if top > 0 else 1.0)
        ax.set_xlabel(label("max_rate") + ": the highest rate meeting the SLO")
        ax.grid(axis="x", alpha=0.3)
        spread = " (bars: mean; whiskers: min-max over seeds)" if (stats["count"] > 1).any() else ""
        if (stats["overloaded"] > 0).any():
            handles, labels = ax.get_legend_handles_labels()
            fig.legend(handles[:1], [labels[0] + ": the SLO bounds no wait"], loc="outside lower left", frameon=False)
        _title(fig, f"Capacity of {n} configurations{spread}")
        return _save(fig, out)


# ---- latency against load ---------------------------------------------------------------------------------------


def latency_rate(
    table: pd.DataFrame,
    latency: str = "p99_ttft_ms",
    by: Sequence[str] | None = None,
    out: Path | str = "plot-latency",
) -> list[Path]:
    """``latency`` against ``request_rate``, one line per group of ``by`` (default: the swept columns but seed and
    request_rate that vary), the mean over seeds with their min-max shaded; a rate where a run was overloaded
    crossed out."""
    ok = ok_rows(table, (latency, "request_rate", *(by or ())))
    by = list(_varying(ok, config_columns(table)) if by is None else by)
    frame = pd.DataFrame(
        {"group": _configs(ok, by, names=False), "rate": _numeric(ok, "request_rate"), "latency": _numeric(ok, latency),
         "overloaded": overload.mask(ok)}
    ).dropna()  # fmt: skip
    if frame.empty:
        raise ValueError(f"no ok run has both request_rate and {latency}")
    with language("en"):
        fig, ax = _figure()
        groups = list(dict.fromkeys(frame["group"]))
        hot: list[pd.Series] = []  # the mean latency at each rate where a run was overloaded, of every group
        for k, group in enumerate(groups):
            runs = frame[frame["group"] == group].groupby("rate")
            stats = runs["latency"].agg(["mean", "min", "max"]).join(runs["overloaded"].any())
            c, marker = _style(k)
            style = ("-", "--", ":", "-.")[(k // len(CATEGORY_COLORS)) % 4]
            ax.plot(stats.index, stats["mean"], marker=marker, linestyle=style, color=c, linewidth=2, markersize=7,
                    label=group)  # fmt: skip
            if len(groups) <= 6 and (stats["max"] > stats["min"]).any():  # more bands than that hide the lines
                ax.fill_between(stats.index, stats["min"], stats["max"], color=c, alpha=0.15, linewidth=0)
            hot.append(stats.loc[stats["overloaded"], "mean"])
        hot_points = pd.concat(hot)
        if len(hot_points):
            ax.scatter(hot_points.index, hot_points, s=160, marker="x", color=OVERLOADED_COLOR, linewidths=2.2,
                       zorder=5, label=OVERLOADED)  # fmt: skip
        _maybe_log(ax, frame["latency"], "y")
        ax.set_xlabel(label("request_rate"))
        ax.set_ylabel(label(latency))
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        title = textwrap.fill(", ".join(by), 40) if by else None
        ax.legend(title=title, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False,
                  fontsize=11 if len(groups) <= 12 else 9)  # fmt: skip
        _title(fig, f"{latency} against request rate ({len(frame):,} runs)")
        return _save(fig, out)


# ---- drawing ----------------------------------------------------------------------------------------------------


def _style(k: int) -> tuple[str, str]:
    """The colour and marker of the ``k``-th category: no two of the first 64 share both."""
    n = len(CATEGORY_COLORS)
    return CATEGORY_COLORS[k % n], MARKERS[(k + k // n) % len(MARKERS)]


def _figure(height: float = SLIDE[1]) -> tuple[Figure, Axes]:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(SLIDE[0], height), layout="constrained")
    return fig, ax


def _maybe_log(ax: Axes, values: pd.Series, axis: str) -> None:
    """A log scale when positive values span more than 30x (latency near saturation grows by orders of magnitude),
    its ticks written as plain numbers (20, 50, 100 rather than 10^2), the 2s and 5s too when it spans few decades."""
    from matplotlib import ticker

    v = values[values > 0]
    if not (len(v) == len(values) and len(v) and float(v.max()) / float(v.min()) > 30):
        return
    ax.set_xscale("log") if axis == "x" else ax.set_yscale("log")
    scale = ax.xaxis if axis == "x" else ax.yaxis
    plain = ticker.FuncFormatter(lambda t, _: f"{t:g}")
    scale.set_major_formatter(plain)
    scale.set_minor_locator(ticker.LogLocator(subs=(2.0, 5.0)))
    few = math.log10(float(v.max()) / float(v.min())) <= 3
    scale.set_minor_formatter(plain if few else ticker.NullFormatter())


def _title(fig: Figure, text: str) -> None:
    """A title over the whole figure from its left edge (an axes title would run off a narrow axes' right side)."""
    fig.suptitle(text, x=0.01, ha="left", fontsize="large")


def _save(fig: Figure, out: Path | str) -> list[Path]:
    out = Path(out)
    if out.suffix.lower() in (".png", ".svg"):
        out = out.with_suffix("")
    return save(fig, out.parent, out.name)
