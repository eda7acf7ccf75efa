"""Tables of columns (``{name: numpy array}``) written as CSV or Parquet, at the speed of the simulation.

A million-request run has a million rows of ``requests.csv`` and more of ``iterations.csv``; ``DataFrame.to_csv``
formats them a value at a time (most of such a run's time). ``write_csv`` turns each column into cell text with
Arrow's casts (the shortest digits of each float, on both cores) and lays the lines out with a compiled kernel
(``runner.csv_text``), a block of rows at a time (so that the text of a whole file is never in memory at once).
It writes the text ``to_csv(index=False)`` writes: floats as Python's ``repr`` (the shortest text that reads back to
the same float: ``0.1``, ``3.0``, ``1e-05``), NaN and missing strings as empty fields, booleans as ``True``/``False``,
strings quoted only when they hold a comma, a quote or a newline (a quote doubled), lines ended by ``\n``.
``write_parquet`` writes the same columns (NaN kept as NaN).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TEXT = pa.large_string()
BLOCK_ROWS = 1 << 16  # rows rendered at a time: ~20 MB of text of requests.csv, and as much again while rendered
AHEAD = 3  # blocks rendered ahead of the one being written
# Arrays are built from their buffers: pyarrow's conversion of Python or numpy values (``pa.array``, ``pa.scalar``)
# imports pandas, a second of a short run's start.


def write_csv(path: Path, columns: Mapping[str, np.ndarray]) -> None:
    """``columns`` (equal lengths) as CSV at ``path``, with a header line. Blocks of rows are rendered on two threads
    (Arrow's casts and the compiled kernel let go of the GIL), a few ahead of the one being written, in order."""
    names = list(columns)
    n = len(next(iter(columns.values()))) if columns else 0
    with open(path, "wb") as out, ThreadPoolExecutor(max_workers=2) as pool:
        out.write((",".join(_quoted(name) for name in names) + "\n").encode())
        pending: deque[Future[np.ndarray]] = deque()
        for start in range(0, n, BLOCK_ROWS):
            pending.append(pool.submit(_block_text, [np.asarray(columns[name])[start : start + BLOCK_ROWS]
                                                     for name in names]))  # fmt: skip
            if len(pending) > AHEAD:
                out.write(pending.popleft().result().data)
                pa.default_memory_pool().release_unused()  # Arrow's allocator keeps what it freed unless told
        while pending:
            out.write(pending.popleft().result().data)
    pa.default_memory_pool().release_unused()


def _block_text(block: list[np.ndarray]) -> np.ndarray:
    """The CSV lines of a block of rows (one array per column), as bytes."""
    from experiments.runner import csv_text

    # a float column equal to one before it, bit for bit, reuses its cells (requests.csv has five: the client's times
    # are the server's without a stream delay, released_s is finish_s): the cast to text is most of the work
    first = [_same_as(block, k) for k in range(len(block))]
    own = sorted(set(first))
    cells = {k: _cells(block[k]) for k in own}
    kinds = np.array([cells[j][0] for j in first], dtype=np.int64)
    data = np.concatenate([cells[k][1] for k in own]) if own else np.zeros(0, np.uint8)
    base = dict(zip(own, np.cumsum([0] + [len(cells[k][1]) for k in own[:-1]]), strict=True))
    offsets = np.stack([cells[j][2] + base[j] for j in first])
    written = sum(len(cells[j][1]) for j in first)
    del cells
    # room for the cells, their separators, ".0" after whole floats, and a cell's worst case; more is counted first
    # only when that is not enough (long quoted texts, floats that repr spells out)
    room = written + offsets.size + 2 * int((kinds == csv_text.FLOAT).sum()) * offsets.shape[1] + 64
    text = np.empty(room, dtype=np.uint8)
    size = csv_text.render(kinds, data, offsets, text, False)
    if size < 0:
        text = np.empty(csv_text.render(kinds, data, offsets, text, True) + 64, dtype=np.uint8)
        size = csv_text.render(kinds, data, offsets, text, False)
    return text[:size]


def _same_as(block: list[np.ndarray], k: int) -> int:
    """The first float column of ``block`` whose values are column ``k``'s bit for bit (``k`` itself if none)."""
    values = block[k]
    if values.dtype != np.float64 or len(values) == 0:
        return k
    bits = values.view(np.int64)
    for j in range(k):
        other = block[j]
        if other.dtype == np.float64 and len(other) == len(values):
            theirs = other.view(np.int64)
            if theirs[0] == bits[0] and theirs[-1] == bits[-1] and np.array_equal(theirs, bits):
                return j
    return k


def write_parquet(path: Path, columns: Mapping[str, np.ndarray]) -> None:
    """``columns`` as a Parquet file at ``path`` (strings as UTF-8, missing ones null; NaN kept)."""
    import pyarrow.parquet as pq

    table = pa.table({name: _array(np.asarray(values)) for name, values in columns.items()})
    pq.write_table(table, path)


def _array(values: np.ndarray) -> pa.Array:
    """An Arrow array of a column: numbers and booleans as they are, anything else as text."""
    kind = values.dtype.kind
    if kind in "fiu":
        dtype = np.float64 if kind == "f" else np.int64
        data = np.ascontiguousarray(values, dtype=dtype)
        arrow_type = pa.float64() if kind == "f" else pa.int64()
        return pa.Array.from_buffers(arrow_type, len(data), [None, pa.py_buffer(data)])
    if kind == "b":
        bits = np.packbits(values.astype(bool), bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), len(values), [None, pa.py_buffer(bits)])
    return _strings(values)


STRINGS_BY_ARROW = 1 << 16  # from this many values, text is converted by pyarrow (C++; it imports pandas, ~0.4 s)


def _strings(values: np.ndarray) -> pa.Array:
    """A column of text: None, or pandas' NaN, missing; any other value as its ``str``."""
    if len(values) >= STRINGS_BY_ARROW:
        try:
            return pa.array(values, type=TEXT, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass  # not all strings: each as its str, below
    missing = np.array([v is None or (isinstance(v, float) and v != v) for v in values], dtype=bool)
    encoded = [b"" if m else str(v).encode() for v, m in zip(values, missing, strict=True)]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    valid = pa.py_buffer(np.packbits(~missing, bitorder="little")) if missing.any() else None
    return pa.Array.from_buffers(TEXT, len(encoded), [valid, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def _scalar(text: str) -> pa.Scalar:
    return _strings(np.array([text], dtype=object))[0]


def _quoted(field: str) -> str:
    return '"' + field.replace('"', '""') + '"' if any(c in field for c in ',"\n') else field


def _cells(values: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """(``experiments.runner.csv_text`` kind, the cells' bytes, where each starts and ends) of a column."""
    from experiments.runner import csv_text

    kind = values.dtype.kind
    if kind == "f":
        text, how = pc.cast(_array(values.astype(np.float64, copy=False)), TEXT), csv_text.FLOAT
    elif kind == "b":
        text, how = pc.if_else(_array(values), _scalar("True"), _scalar("False")), csv_text.COPY
    elif kind in "iu":
        text, how = pc.cast(_array(values), TEXT), csv_text.COPY
    else:
        text, how = pc.fill_null(_strings(values), _scalar("")), csv_text.TEXT
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int64)[text.offset : text.offset + len(text) + 1]
    buffer = text.buffers()[2]
    data = np.frombuffer(buffer, dtype=np.uint8) if buffer is not None and buffer.size else np.zeros(0, np.uint8)
    return how, data[offsets[0] : offsets[-1]], offsets - offsets[0]
