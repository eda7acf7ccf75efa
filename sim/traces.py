"""Trace files -> columns: the readers behind ``sim.workload.load_trace`` and the ``empirical`` length spec.

Every reader returns plain arrays (``TraceColumns``); ``sim.workload`` wraps them into a ``Workload``. Each
reader checks what it reads and raises ``ValueError`` naming the file, the file's own column name, the row
and the value, so a user can find the bad line. Rows are counted from 0 after the header (CSV) or by 1-based
line number (JSONL).

Formats (the three columns each needs; other columns are ignored; names match case-insensitively):

- ``native``: ``arrival_time_s, prompt_tokens, output_tokens`` (seconds), optional ``request_id``; what
  ``Workload.to_frame().to_csv(path, index=False)`` writes.
- ``azure``: Azure LLM inference trace 2023/2024, ``TIMESTAMP, ContextTokens, GeneratedTokens``; TIMESTAMP is
  a date and time (``2023-11-16 18:15:46.6805900``, any number of fractional digits, optional UTC offset).
- ``burstgpt``: BurstGPT, ``Timestamp, Request tokens, Response tokens`` (seconds); ``Model`` can filter.
- ``mooncake``: Mooncake JSONL, ``timestamp`` (milliseconds), ``input_length``, ``output_length``.
- ``splitwise``: the Azure 2023 trace as Vidur ships it, ``arrived_at`` (seconds), ``num_prefill_tokens``,
  ``num_decode_tokens``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

import numpy as np
import numpy.typing as npt
import pandas as pd

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class _Format:
    """How one trace format names its columns and measures time."""

    name: str
    arrival: str  # column of arrival times
    prompt: str  # column of prompt (input) token counts
    output: str  # column of output (generated) token counts
    unit: str  # arrival unit: "s", "ms" or "datetime"
    shift: bool  # shift arrivals so the first is 0 (all but native, which is already relative)


_FORMATS = {
    f.name: f
    for f in (
        _Format("native", "arrival_time_s", "prompt_tokens", "output_tokens", "s", shift=False),
        _Format("azure", "TIMESTAMP", "ContextTokens", "GeneratedTokens", "datetime", shift=True),
        _Format("burstgpt", "Timestamp", "Request tokens", "Response tokens", "s", shift=True),
        _Format("mooncake", "timestamp", "input_length", "output_length", "ms", shift=True),
        _Format("splitwise", "arrived_at", "num_prefill_tokens", "num_decode_tokens", "s", shift=True),
    )
}

# names for the command line's ``choices``; "auto" detects from the suffix and the header
FORMATS: tuple[str, ...] = ("auto", *_FORMATS)

# columns of a length-only file (ShareGPT/arXiv stats): lengths, but no arrival times
_LENGTH_ONLY = ("num_prefill_tokens", "num_decode_tokens")


class TraceColumns(NamedTuple):
    """One trace as arrays, rows in arrival order."""

    arrival_s: FloatArray  # seconds from the start of the trace
    prompt_tokens: IntArray
    output_tokens: IntArray
    request_id: npt.NDArray[np.object_] | None  # the file's ids, or None: the row index is the id
    source: str  # "format:path" and the options that changed it


def format_help() -> str:
    """One line per format: its name and required columns."""
    return "; ".join(f"{f.name} ({', '.join((f.arrival, f.prompt, f.output))})" for f in _FORMATS.values())


def read_trace(
    path: str | Path,
    format: str = "auto",
    limit: int | None = None,
    time_scale: float = 1.0,
    model: str | None = None,
    sort: bool = False,
) -> TraceColumns:
    """Read a trace file; see ``sim.workload.load_trace`` for the meaning of each argument."""
    path = Path(path)
    if format not in FORMATS:
        raise ValueError(f"format={format!r} is not one of {', '.join(FORMATS)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit} must be >= 1 (or None for the whole file)")
    if not (np.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale={time_scale} must be a finite number > 0")
    if model is not None and format not in ("auto", "burstgpt"):
        raise ValueError(f"model={model!r} filters BurstGPT traces only, not format={format!r}")
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")

    fmt = _FORMATS[_detect(path) if format == "auto" else format]
    if model is not None and fmt.name != "burstgpt":
        raise ValueError(f"model={model!r} filters BurstGPT traces only; {path} is a {fmt.name} trace")
    where = f"{fmt.name} trace {path}"
    if fmt.name == "mooncake":
        raw, prompt, output, line_of = _read_jsonl(path, fmt, limit, where)
        ids: npt.NDArray[np.object_] | None = None
        label: Callable[[int], str] = lambda i: f"line {line_of[i]}"  # noqa: E731
    else:
        raw, prompt, output, ids = _read_csv(path, fmt, limit, model, where)
        label = _row
    if len(raw) == 0:
        raise ValueError(f"{where}: no requests" + (f" for model={model!r}" if model is not None else ""))

    unsorted = np.flatnonzero(np.diff(raw) < 0)
    if unsorted.size and sort:
        order = np.argsort(raw, kind="stable")
        raw, prompt, output = raw[order], prompt[order], output[order]
        ids = None if ids is None else ids[order]
    elif unsorted.size:
        i = int(unsorted[0]) + 1
        raise ValueError(
            f"{where}: column {fmt.arrival!r} is not sorted: {label(i)} is earlier than {label(i - 1)} "
            f"({raw[i].item()!r} < {raw[i - 1].item()!r} s, relative); pass sort=True to sort by arrival"
        )
    if fmt.shift:
        raw = raw - raw[0]
    elif raw[0] < 0:
        raise ValueError(f"{where}: column {fmt.arrival!r} {label(0)}: {raw[0].item()!r} is negative")
    arrival = raw / time_scale if time_scale != 1.0 else raw

    source = f"{fmt.name}:{path}"
    extras = [f"model={model}" if model is not None else "", f"limit={limit}" if limit is not None else ""]
    extras += [f"time_scale={time_scale:g}" if time_scale != 1.0 else "", "sorted" if unsorted.size else ""]
    if any(extras):
        source += " (" + ", ".join(e for e in extras if e) + ")"
    return TraceColumns(arrival, prompt, output, ids, source)


def read_length_column(path: str | Path, column: str) -> IntArray:
    """All values of a token-count ``column`` of a file: any CSV with that column (a length-only stats file
    such as ShareGPT's ``num_prefill_tokens``), or a trace's token column under its own name or the normalized
    ``prompt_tokens`` / ``output_tokens``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"empirical length file not found: {path}")
    where = f"empirical length file {path}"
    header = [] if _is_jsonl(path) else _header(path)
    actual = _lookup(header, column)
    if actual is not None:
        frame = pd.read_csv(path, usecols=[actual], **_CSV_OPTIONS)
        values = _tokens(frame[actual], where, actual)
    elif _is_jsonl(path) or _match(header) is not None:
        fmt = _FORMATS["mooncake" if _is_jsonl(path) else _match(header) or ""]
        wanted = column.strip().lower()
        if wanted not in ("prompt_tokens", "output_tokens", fmt.prompt.lower(), fmt.output.lower()):
            raise ValueError(
                f"{where} is a {fmt.name} trace without column {column!r}; its token columns are "
                f"{fmt.prompt!r} / {fmt.output!r} (or, normalized, 'prompt_tokens' / 'output_tokens')"
            )
        trace = read_trace(path, fmt.name)
        values = trace.prompt_tokens if wanted in ("prompt_tokens", fmt.prompt.lower()) else trace.output_tokens
    else:
        raise ValueError(
            f"{where}: no column {column!r}; columns found: {header}"
            " (a trace file would also offer its token columns as prompt_tokens and output_tokens)"
        )
    if len(values) == 0:
        raise ValueError(f"{where}: column {column!r} has no values")
    return values


# --- detection ----------------------------------------------------------------------------------------------

_CSV_OPTIONS: dict[str, object] = {"encoding": "utf-8-sig", "skipinitialspace": True}


def _is_jsonl(path: Path) -> bool:
    suffixes = [s.lower() for s in path.suffixes]
    return bool(suffixes) and (suffixes[-1] == ".jsonl" or suffixes[-2:] == [".jsonl", ".gz"])


def _open_text(path: Path) -> IO[str]:
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def csv_header(path: str | Path) -> list[str]:
    """Column names of a CSV file (empty for JSONL or a missing file)."""
    path = Path(path)
    if not path.is_file() or _is_jsonl(path):
        return []
    return _header(path)


def _header(path: Path) -> list[str]:
    try:
        return [str(c).strip() for c in pd.read_csv(path, nrows=0, **_CSV_OPTIONS).columns]
    except pd.errors.EmptyDataError:
        return []


def _lookup(header: list[str], name: str) -> str | None:
    """The header's spelling of column ``name`` (case-insensitive), or None."""
    by_lower = {c.lower(): c for c in header}
    return by_lower.get(name.strip().lower())


def _match(header: list[str]) -> str | None:
    for f in _FORMATS.values():
        if f.name != "mooncake" and all(_lookup(header, c) for c in (f.arrival, f.prompt, f.output)):
            return f.name
    return None


def _detect(path: Path) -> str:
    if _is_jsonl(path):
        return "mooncake"
    header = _header(path)
    name = _match(header)
    if name is not None:
        return name
    raise ValueError(f"cannot tell the trace format of {path}: header {header}. {_known(header)}")


def _known(header: list[str]) -> str:
    text = f"Known formats and their columns: {format_help()}."
    if all(_lookup(header, c) for c in _LENGTH_ONLY):
        text = (
            "It has token lengths but no arrival times, so it is not a trace; use it as an empirical length "
            f"source instead, e.g. empirical:PATH:{_LENGTH_ONLY[0]}. " + text
        )
    return text


# --- readers ------------------------------------------------------------------------------------------------


def _row(i: int) -> str:
    return f"row {i}"


def _read_csv(
    path: Path, fmt: _Format, limit: int | None, model: str | None, where: str
) -> tuple[FloatArray, IntArray, IntArray, npt.NDArray[np.object_] | None]:
    header = _header(path)
    cols = {}
    for want in (fmt.arrival, fmt.prompt, fmt.output):
        actual = _lookup(header, want)
        if actual is None:
            raise ValueError(f"{where}: missing column {want!r}; columns found: {header}. {_known(header)}")
        cols[want] = actual
    id_col = _lookup(header, "request_id")  # native's optional ids; any CSV trace may carry them
    model_col = _lookup(header, "Model") if model is not None else None
    if model is not None and model_col is None:
        raise ValueError(f"{where}: model={model!r} needs a 'Model' column; columns found: {header}")

    usecols = [c for c in (*cols.values(), id_col, model_col) if c is not None]
    dtype = {c: str for c in (id_col, model_col) if c is not None}
    if fmt.unit == "datetime":
        dtype[cols[fmt.arrival]] = str
    frame = pd.read_csv(
        path,
        usecols=usecols,
        dtype=dtype,
        nrows=None if model is not None else limit,
        keep_default_na=False,  # an id "NA" is an id; a numeric column's empty field is still missing
        na_values={c: [""] for c in cols.values()},
        **_CSV_OPTIONS,
    )
    if model_col is not None:
        keep = frame[model_col].str.strip() == model
        if not keep.any():
            seen = sorted(frame[model_col].str.strip().unique())[:20]
            raise ValueError(f"{where}: no rows with Model == {model!r}; models found: {seen}")
        frame = frame[keep].reset_index(drop=True)
        if limit is not None:
            frame = frame.iloc[:limit]

    arrival_col = cols[fmt.arrival]
    if fmt.unit == "datetime":
        raw = _datetimes(frame[arrival_col], where, arrival_col)
    else:
        raw = _seconds(frame[arrival_col], where, arrival_col, 1e-3 if fmt.unit == "ms" else 1.0)
    prompt = _tokens(frame[cols[fmt.prompt]], where, cols[fmt.prompt])
    output = _tokens(frame[cols[fmt.output]], where, cols[fmt.output])
    ids = None
    if id_col is not None:
        ids = frame[id_col].to_numpy(dtype=object)
        empty = np.flatnonzero(frame[id_col].str.len().to_numpy() == 0)
        if empty.size:
            raise ValueError(f"{where}: column {id_col!r} row {empty[0]}: empty request id")
        dup = frame[id_col].duplicated()
        if dup.any():
            i = int(np.flatnonzero(dup.to_numpy())[0])
            first = int(np.flatnonzero((frame[id_col] == ids[i]).to_numpy())[0])
            raise ValueError(f"{where}: column {id_col!r} row {i}: id {ids[i]!r} repeats row {first}")
    return raw, prompt, output, ids


def _read_jsonl(
    path: Path, fmt: _Format, limit: int | None, where: str
) -> tuple[FloatArray, IntArray, IntArray, IntArray]:
    """Mooncake JSONL; one request per line, values checked as they are read (errors name the line)."""
    fields = (fmt.arrival, fmt.prompt, fmt.output)
    rows: list[tuple[float, int, int]] = []
    lines: list[int] = []
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: line {lineno} is not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: line {lineno} is {type(record).__name__}, expected a JSON object")
            for key in fields:
                if key not in record:
                    raise ValueError(f"{where}: line {lineno}: missing field {key!r}; fields found: {sorted(record)}")
                value = record[key]
                ok = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
                if key != fmt.arrival:
                    ok = ok and value >= 0 and float(value).is_integer()
                if not ok:
                    what = "a finite number" if key == fmt.arrival else "a whole number >= 0"
                    raise ValueError(f"{where}: line {lineno}: field {key!r} is {value!r}, expected {what}")
            rows.append((record[fields[0]], record[fields[1]], record[fields[2]]))
            lines.append(lineno)
            if limit is not None and len(rows) >= limit:
                break
    table = np.array(rows, dtype=np.float64).reshape(-1, 3)
    # milliseconds -> seconds; token counts were checked to be whole numbers, exact in float64 below 2**53
    return table[:, 0] * 1e-3, table[:, 1].astype(np.int64), table[:, 2].astype(np.int64), np.array(lines)


# --- column conversion --------------------------------------------------------------------------------------


def _numbers(series: pd.Series, where: str, column: str) -> FloatArray:
    """A column as float64; a missing, non-numeric or infinite value is an error naming its row."""
    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        i = int(bad[0])
        raw = series.iloc[i]
        what = "missing value" if pd.isna(raw) else f"{raw!r} is not a finite number"
        raise ValueError(f"{where}: column {column!r} row {i}: {what}")
    return values


def _tokens(series: pd.Series, where: str, column: str) -> IntArray:
    """A token-count column as int64: whole numbers >= 0 (0 is kept: the engine rejects it with a reason)."""
    if pd.api.types.is_integer_dtype(series.dtype):
        values = series.to_numpy(dtype=np.int64)
    else:
        floats = _numbers(series, where, column)
        frac = np.flatnonzero(floats != np.floor(floats))
        if frac.size:
            i = int(frac[0])
            raise ValueError(f"{where}: column {column!r} row {i}: {series.iloc[i]!r} is not a whole number")
        values = floats.astype(np.int64)
    negative = np.flatnonzero(values < 0)
    if negative.size:
        i = int(negative[0])
        raise ValueError(f"{where}: column {column!r} row {i}: {values[i]} is negative")
    return values


def _seconds(series: pd.Series, where: str, column: str, unit_s: float) -> FloatArray:
    values = _numbers(series, where, column)
    return values * unit_s if unit_s != 1.0 else values


def _datetimes(series: pd.Series, where: str, column: str) -> FloatArray:
    """Datetime strings -> seconds after the first row. ISO 8601 with any number of fractional digits (beyond
    nanoseconds they are cut) and an optional UTC offset; differences are taken in integer nanoseconds."""
    stamps = pd.to_datetime(series.str.strip(), format="ISO8601", utc=True, errors="coerce")
    bad = np.flatnonzero(stamps.isna().to_numpy())
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{where}: column {column!r} row {i}: {series.iloc[i]!r} is not a date and time")
    if len(stamps) == 0:
        return np.zeros(0)
    return ((stamps - stamps.iloc[0]) / pd.Timedelta(1, "s")).to_numpy(dtype=np.float64)
