"""Trace files -> columns: the readers behind ``sim.workload.load_trace`` and the ``empirical`` length spec.

Every reader returns plain arrays (``TraceColumns``); ``sim.workload`` wraps them into a ``Workload``. Each
reader checks what it reads and raises ``ValueError`` naming the file, the file's own column name, the row
and the value, so a user can find the bad line. Rows are counted from 0 after the header (CSV) or by 1-based
line number (JSONL). Values are bounded as they are read: a token count is a whole number in
``0..MAX_TOKENS``; an arrival time is finite and at most ``MAX_ARRIVAL_S`` seconds after the start.

A file may be compressed and in any Unicode encoding with a byte-order mark (``sim.workload.files`` opens it).

Formats (the three columns each needs; other columns are ignored; header names are matched after stripping
the spaces around them, and case-insensitively):

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

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from sim.workload import files, values
from sim.workload.values import MAX_ARRIVAL_S, MAX_TOKENS  # noqa: F401  (MAX_TOKENS: part of this API)

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
    hash_ids: list[list[int]] | None = None  # Mooncake: each prompt's block ids (512 tokens each), in row order


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
    ids: npt.NDArray[np.object_] | None = None
    hashes: list[list[int]] | None = None
    if fmt.name == "mooncake":
        raw, prompt, output, rows, hashes = _read_jsonl(path, fmt, limit, where)
    else:
        raw, prompt, output, ids, rows = _read_csv(path, fmt, limit, model, where)
    if len(raw) == 0:
        raise ValueError(f"{where}: no requests" + (f" for model={model!r}" if model is not None else ""))

    def label(i: int) -> str:  # the file's own row (CSV) or line (JSONL) of the i-th request
        return f"{'line' if fmt.name == 'mooncake' else 'row'} {rows[i]}"

    with np.errstate(over="ignore"):  # two huge times of opposite sign differ by inf: late, below
        unsorted = np.flatnonzero(np.diff(raw) < 0)
    if unsorted.size and sort:
        order = np.argsort(raw, kind="stable")
        raw, prompt, output, rows = raw[order], prompt[order], output[order], rows[order]
        ids = None if ids is None else ids[order]
        hashes = None if hashes is None else [hashes[i] for i in order]
    elif unsorted.size:
        i = int(unsorted[0]) + 1
        raise ValueError(
            f"{where}: column {fmt.arrival!r} is not sorted: {label(i)} is earlier than {label(i - 1)} "
            f"({raw[i].item()!r} < {raw[i - 1].item()!r} s, relative); sort the file, or pass --sort-trace "
            "to ferry run (sort_trace: true in a config file) to sort by arrival"
        )
    if not fmt.shift and raw[0] < 0:
        raise ValueError(f"{where}: column {fmt.arrival!r} {label(0)}: {raw[0].item()!r} is negative")
    with np.errstate(over="ignore"):  # what overflows is past MAX_ARRIVAL_S, refused below
        relative = raw - raw[0] if fmt.shift else raw
        arrival = relative / time_scale if time_scale != 1.0 else relative
    late = np.flatnonzero(~(arrival <= MAX_ARRIVAL_S))
    if late.size:
        i = int(late[0])
        since = f"after the first request ({label(0)})" if fmt.shift else "after the start"
        scaled = f" with time_scale={time_scale:g}" if time_scale != 1.0 else ""
        raise ValueError(
            f"{where}: column {fmt.arrival!r} {label(i)}: arrives {arrival[i].item():.6g} s {since}{scaled}, "
            f"more than MAX_ARRIVAL_S = {MAX_ARRIVAL_S:g} s (about 32 years)"
        )

    source = f"{fmt.name}:{path}"
    extras = [f"model={model}" if model is not None else "", f"limit={limit}" if limit is not None else ""]
    extras += [f"time_scale={time_scale:g}" if time_scale != 1.0 else "", "sorted" if unsorted.size else ""]
    if any(extras):
        source += " (" + ", ".join(e for e in extras if e) + ")"
    return TraceColumns(arrival, prompt, output, ids, source, hashes)


def read_length_column(path: str | Path, column: str) -> IntArray:
    """All values of a token-count ``column`` of a file: any CSV with that column (a length-only stats file
    such as ShareGPT's ``num_prefill_tokens``), or a trace's token column under its own name or the normalized
    ``prompt_tokens`` / ``output_tokens`` (in arrival order; an unsorted trace is sorted, as only the lengths
    matter here)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"empirical length file not found: {path}")
    where = f"empirical length file {path}"
    header = [] if files.is_jsonl(path) else _header(path, where)
    actual = _lookup(header, column)
    if actual is not None:
        frame = files.read_frame(path, where, usecols=[actual])
        counts = values.tokens(frame[actual], where, actual.strip())
    elif files.is_jsonl(path) or _match(header) is not None:
        fmt = _FORMATS["mooncake" if files.is_jsonl(path) else _match(header) or ""]
        wanted = column.strip().lower()
        if wanted not in ("prompt_tokens", "output_tokens", fmt.prompt.lower(), fmt.output.lower()):
            raise ValueError(
                f"{where} is a {fmt.name} trace without column {column!r}; its token columns are "
                f"{fmt.prompt!r} / {fmt.output!r} (or, normalized, 'prompt_tokens' / 'output_tokens')"
            )
        trace = read_trace(path, fmt.name, sort=True)
        counts = trace.prompt_tokens if wanted in ("prompt_tokens", fmt.prompt.lower()) else trace.output_tokens
    else:
        raise ValueError(
            f"{where}: no column {column!r}; columns found: {_names(header)}"
            " (a trace file would also offer its token columns as prompt_tokens and output_tokens)"
        )
    if len(counts) == 0:
        raise ValueError(f"{where}: column {column!r} has no values")
    return counts


# --- detection ----------------------------------------------------------------------------------------------


def csv_header(path: str | Path) -> list[str]:
    """Column names of a CSV file, stripped (empty for JSONL or a missing file)."""
    path = Path(path)
    if not path.is_file() or files.is_jsonl(path):
        return []
    return _names(_header(path, str(path)))


def _header(path: Path, where: str) -> list[str]:
    """Column names as pandas reads them (what ``usecols`` wants); ``_lookup`` and ``_names`` strip them."""
    return [str(c) for c in files.read_frame(path, where, nrows=0).columns]


def _names(header: list[str]) -> list[str]:
    return [c.strip() for c in header]


def _lookup(header: list[str], name: str) -> str | None:
    """The header's spelling of column ``name`` (after stripping, case-insensitive; the first if several)."""
    by_lower = {c.strip().lower(): c for c in reversed(header)}
    return by_lower.get(name.strip().lower())


def _match(header: list[str]) -> str | None:
    for f in _FORMATS.values():
        if f.name != "mooncake" and all(_lookup(header, c) for c in (f.arrival, f.prompt, f.output)):
            return f.name
    return None


def _detect(path: Path) -> str:
    if files.is_jsonl(path):
        return "mooncake"
    header = _header(path, str(path))
    name = _match(header)
    if name is not None:
        return name
    raise ValueError(f"cannot tell the trace format of {path}: header {_names(header)}. {_known(header)}")


def _known(header: list[str]) -> str:
    text = f"Known formats and their columns: {format_help()}."
    if all(_lookup(header, c) for c in _LENGTH_ONLY):
        text = (
            "It has token lengths but no arrival times, so it is not a trace; use it as an empirical length "
            f"source instead, e.g. empirical:PATH:{_LENGTH_ONLY[0]}. " + text
        )
    return text


# --- readers ------------------------------------------------------------------------------------------------


def _read_csv(
    path: Path, fmt: _Format, limit: int | None, model: str | None, where: str
) -> tuple[FloatArray, IntArray, IntArray, npt.NDArray[np.object_] | None, IntArray]:
    """Arrivals (seconds, not shifted), prompt and output tokens, ids (or None) and each value's file row."""
    header = _header(path, where)
    cols = {}
    for want in (fmt.arrival, fmt.prompt, fmt.output):
        actual = _lookup(header, want)
        if actual is None:
            raise ValueError(f"{where}: missing column {want!r}; columns found: {_names(header)}. {_known(header)}")
        cols[want] = actual
    id_col = _lookup(header, "request_id")  # native's optional ids; any CSV trace may carry them
    model_col = _lookup(header, "Model") if model is not None else None
    if model is not None and model_col is None:
        raise ValueError(f"{where}: model={model!r} needs a 'Model' column; columns found: {_names(header)}")

    usecols = [c for c in (*cols.values(), id_col, model_col) if c is not None]
    dtype = {c: str for c in (id_col, model_col) if c is not None}
    if fmt.unit == "datetime":
        dtype[cols[fmt.arrival]] = str
    frame = files.read_frame(
        path,
        where,
        usecols=usecols,
        dtype=dtype,
        nrows=None if model is not None else limit,
        keep_default_na=False,  # an id "NA" is an id; a numeric column's empty field is still missing
        na_values={c: [""] for c in cols.values()},
    )
    frame.columns = _names([str(c) for c in frame.columns])  # the index stays the file's row number
    cols = {want: actual.strip() for want, actual in cols.items()}
    id_col, model_col = (None if c is None else c.strip() for c in (id_col, model_col))
    if model_col is not None:
        keep = frame[model_col].str.strip() == model
        if not keep.any():
            seen = sorted(frame[model_col].str.strip().unique())[:20]
            raise ValueError(f"{where}: no rows with Model == {model!r}; models found: {seen}")
        frame = frame[keep]
        if limit is not None:
            frame = frame.iloc[:limit]

    arrival_col = cols[fmt.arrival]
    if fmt.unit == "datetime":
        raw = values.datetimes(frame[arrival_col], where, arrival_col)
    else:
        raw = values.seconds(frame[arrival_col], where, arrival_col, 1e-3 if fmt.unit == "ms" else 1.0)
    prompt = values.tokens(frame[cols[fmt.prompt]], where, cols[fmt.prompt])
    output = values.tokens(frame[cols[fmt.output]], where, cols[fmt.output])
    rows = frame.index.to_numpy(dtype=np.int64)
    ids = None
    if id_col is not None:
        ids = frame[id_col].to_numpy(dtype=object)
        empty = np.flatnonzero(frame[id_col].str.len().to_numpy() == 0)
        if empty.size:
            raise ValueError(f"{where}: column {id_col!r} row {rows[empty[0]]}: empty request id")
        dup = frame[id_col].duplicated()
        if dup.any():
            i = int(np.flatnonzero(dup.to_numpy())[0])
            first = int(np.flatnonzero((frame[id_col] == ids[i]).to_numpy())[0])
            raise ValueError(
                f"{where}: column {id_col!r} row {rows[i]}: id {values.show(ids[i])} repeats row {rows[first]}"
            )
    return raw, prompt, output, ids, rows


def _read_jsonl(
    path: Path, fmt: _Format, limit: int | None, where: str
) -> tuple[FloatArray, IntArray, IntArray, IntArray, list[list[int]] | None]:
    """Mooncake JSONL; one request per line, values checked as they are read (errors name the line). The optional
    ``hash_ids`` (a list of non-negative integers per line) are kept when every line has them."""
    fields = (fmt.arrival, fmt.prompt, fmt.output)
    rows: list[tuple[float, int, int]] = []
    hashes: list[list[int] | None] = []
    lines: list[int] = []
    lineno = 0  # the last line read
    try:
        with files.open_text(path, where) as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    row, ids = _jsonl_row(line, f"{where}: line {lineno}", fields)
                    rows.append(row)
                    hashes.append(ids)
                    lines.append(lineno)
                    if limit is not None and len(rows) >= limit:
                        break
    except UnicodeDecodeError as exc:  # what surrogateescape cannot keep, e.g. half a UTF-16 character
        raise ValueError(f"{where}: is not {exc.encoding.upper()} text past line {lineno}; save it as UTF-8") from None
    except files.DAMAGED as exc:
        raise ValueError(f"{where}: damaged compressed data past line {lineno} ({exc})") from None
    table = np.array(rows, dtype=np.float64).reshape(-1, 3)
    kept = [h for h in hashes if h is not None]
    every = kept if len(kept) == len(hashes) and kept else None
    # milliseconds -> seconds; token counts were checked to be whole numbers <= MAX_TOKENS, exact in float64
    arrival, prompt, output = table[:, 0] * 1e-3, table[:, 1].astype(np.int64), table[:, 2].astype(np.int64)
    return arrival, prompt, output, np.array(lines), every


def _jsonl_row(line: str, at: str, fields: tuple[str, str, str]) -> tuple[tuple[float, int, int], list[int] | None]:
    """The (arrival, prompt, output) fields of one JSONL line, and its ``hash_ids`` if it has them; ``at`` names the
    file and line in errors."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # a byte that was not text, kept as a lone surrogate by files.open_text
        raise ValueError(f"{at} is not text in the file's encoding; save the file as UTF-8") from None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{at} is not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # an integer of over 4300 digits; nesting too deep
        raise ValueError(f"{at} cannot be read as JSON ({exc})") from None
    if not isinstance(record, dict):
        raise ValueError(f"{at} is {type(record).__name__}, expected a JSON object")
    for key in fields:
        if key not in record:
            raise ValueError(f"{at}: missing field {key!r}; fields found: {sorted(record)}")
        values.check_json(record[key], key == fields[0], f"{at}: field {key!r}")
    ids = record.get("hash_ids")
    if ids is not None and not (
        isinstance(ids, list) and all(type(h) is int and 0 <= h < 2**63 for h in ids)  # noqa: E721 (no bools)
    ):
        raise ValueError(f"{at}: field 'hash_ids' must be a list of non-negative integers, got {str(ids):.60}")
    return (record[fields[0]], record[fields[1]], record[fields[2]]), ids
