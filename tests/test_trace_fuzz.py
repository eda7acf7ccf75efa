"""Fuzzing the file readers: whatever a trace or length file holds (random bytes, CSV of random shape and cells,
random JSONL lines, compressed or in another encoding), each reader either returns well-formed arrays or raises a
``ValueError`` naming the file; never another exception (KeyError, UnicodeDecodeError, OverflowError, pandas'
ParserError, ...), never a value past the bounds."""

from __future__ import annotations

import gzip
import json
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sim.workload import Workload, load_trace
from sim.workload.lengths import parse_length_spec, read_length_pairs
from sim.workload.traces import FORMATS, MAX_ARRIVAL_S, MAX_TOKENS, csv_header, read_length_column

# fixed examples (derandomize) so CI sees the same files every run; about 7 s for the four tests on one core
FUZZ = settings(
    max_examples=100, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

# every column name a reader looks for, so that random headers often hit a format
COLUMNS = (
    "arrival_time_s",
    "prompt_tokens",
    "output_tokens",
    "request_id",
    "TIMESTAMP",
    "ContextTokens",
    "GeneratedTokens",
    "Timestamp",
    "Model",
    "Request tokens",
    "Response tokens",
    "timestamp",
    "input_length",
    "output_length",
    "arrived_at",
    "num_prefill_tokens",
    "num_decode_tokens",
    "input_len",
    "output_len",
)
HEADERS = (
    ("arrival_time_s", "prompt_tokens", "output_tokens"),
    ("arrival_time_s", "prompt_tokens", "output_tokens", "request_id"),
    ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    ("Timestamp", "Model", "Request tokens", "Response tokens"),
    ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    ("num_prefill_tokens", "num_decode_tokens"),
)
ODD_VALUES = (
    str(MAX_TOKENS),
    str(MAX_TOKENS + 1),
    str(2**62),
    str(2**63 - 1),
    str(2**63),
    str(2**64),
    "9" * 400,
    "1e30",
    "-0",
    "1e9",
    "1e308",
    "-1e308",
    "1e400",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "",
    "NA",
    "True",
    "false",
    "0x10",
    "1_000",
    " 7 ",
    '"5"',
    '"1,2"',
    '"',
    "2023-11-16 18:15:46.6805900",
    "2024-05-10 02:00:01+02:00",
    "9999-12-31 23:59:59",
    "1677-09-21 00:12:43",
    "0001-01-01",
    "ChatGPT",
    "GPT-4",
)


def cells() -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(0, 5000).map(str),
        st.floats(0, 1e4).map(repr),
        st.integers(-(2**70), 2**70).map(str),
        st.floats().map(repr),  # nan, inf, negative, huge
        st.sampled_from(ODD_VALUES),
        st.text(max_size=6),  # unicode, quotes, commas, newlines
    )


def names() -> st.SearchStrategy[str]:
    real = st.sampled_from(COLUMNS)
    spaced = st.tuples(st.sampled_from(["", " ", "  "]), real, st.sampled_from(["", " "])).map("".join)
    return st.one_of(real, spaced, real.map(str.upper), st.text(max_size=6))


ARRIVALS = ("arrival_time_s", "Timestamp", "timestamp", "arrived_at")


def good_cell(name: str, row: int, second: int, tokens: int) -> str:
    """A valid value of column ``name`` in row ``row`` of a trace whose rows arrive at ``second``."""
    if name in ARRIVALS:
        return str(second)
    if name == "TIMESTAMP":
        return f"2023-11-16 {second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}.{row:07d}"
    if name == "Model":
        return ("ChatGPT", "GPT-4")[row % 2]
    if name == "request_id":
        return f"r{row}"
    return str(tokens)


@st.composite
def csv_texts(draw: st.DrawFn) -> str:
    """A CSV: a well-formed trace (a third of them), one with a random cell (a third), or of random shape: a real
    header or random names, rows of roughly the header's width and random cells."""
    mode = draw(st.sampled_from(["good", "one bad cell", "random"]))
    if mode == "random":
        header = list(draw(st.one_of(st.sampled_from(HEADERS), st.lists(names(), min_size=1, max_size=6))))
        header += draw(st.lists(names(), max_size=2))
        rows = []
        for _ in range(draw(st.integers(0, 6))):
            width = max(0, len(header) + draw(st.sampled_from([0, 0, 0, -1, 1])))
            rows.append(draw(st.lists(cells(), min_size=width, max_size=width)))
    else:
        header = list(draw(st.sampled_from(HEADERS)))
        n = draw(st.integers(1, 6))
        seconds = sorted(draw(st.lists(st.integers(0, 86_399), min_size=n, max_size=n)))
        tokens = st.integers(0, 5000)
        rows = [[good_cell(c, i, t, draw(tokens)) for c in header] for i, t in enumerate(seconds)]
        if mode == "one bad cell":
            row, col = draw(st.integers(0, n - 1)), draw(st.integers(0, len(header) - 1))
            rows[row][col] = draw(cells())
        spaces = draw(st.sampled_from(["", " "]))
        header = [f"{spaces}{c}{spaces}" for c in header]
    lines = [",".join(header), *(",".join(r) for r in rows)]
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n", "\n\n"]))


def json_values() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(0, 10**4),
        st.integers(-(2**80), 2**80),
        st.sampled_from([MAX_TOKENS, MAX_TOKENS + 1, 2**63, 10**30, 1e30, 10**400, 2.5, -1, True, None, "5", [1]]),
        st.floats(),  # json.dumps writes NaN and Infinity, which json.loads reads back
        st.text(max_size=4),
    )


@st.composite
def jsonl_texts(draw: st.DrawFn) -> str:
    """JSONL: well-formed mooncake records (a third), with one random value or line (a third), or random lines:
    records with some of the fields and random values, JSON that is not an object, text that is not JSON."""
    mode = draw(st.sampled_from(["good", "one bad value", "random"]))
    n = draw(st.integers(1 if mode != "random" else 0, 6))
    stamps = sorted(draw(st.lists(st.integers(0, 10**8), min_size=n, max_size=n)))
    records: list[Any] = [
        {"timestamp": t, "input_length": draw(st.integers(0, 5000)), "output_length": draw(st.integers(0, 5000))}
        for t in stamps
    ]
    lines = [json.dumps(r) for r in records]
    if mode == "one bad value":
        i = draw(st.integers(0, n - 1))
        records[i][draw(st.sampled_from(["timestamp", "input_length", "output_length"]))] = draw(json_values())
        lines[i] = draw(st.one_of(st.just(json.dumps(records[i])), st.text(max_size=20), st.just(lines[i][:-1])))
    elif mode == "random":
        for i in range(n):
            keys = draw(st.lists(st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "x"])))
            record = {k: draw(json_values()) for k in keys}
            lines[i] = draw(
                st.one_of(st.just(json.dumps(record)), st.just(json.dumps([record])), st.text(max_size=20), st.just(""))
            )
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n", "\n\n"]))


def encoded(text: str, how: str) -> bytes:
    """``text`` as a file's bytes: in an encoding, gzipped, gzipped and cut short, or with bytes not UTF-8."""
    if how == "gzip":
        return gzip.compress(text.encode("utf-8"))
    if how == "gzip-truncated":
        return gzip.compress(text.encode("utf-8"))[:-5]
    if how == "latin-1":
        return text.encode("utf-8") + b"\n\xe9\xff\n"
    return text.encode(how)


HOW = st.sampled_from(["utf-8"] * 4 + ["gzip", "utf-16", "utf-8-sig", "gzip-truncated", "latin-1"])


# each trace format's header and its (prompt, output) token columns
TRACE_HEADERS = {
    "native": (HEADERS[1], ("prompt_tokens", "output_tokens")),
    "azure": (HEADERS[2], ("ContextTokens", "GeneratedTokens")),
    "burstgpt": (HEADERS[3], ("Request tokens", "Response tokens")),
    "splitwise": (HEADERS[4], ("num_prefill_tokens", "num_decode_tokens")),
}


@st.composite
def good_traces(draw: st.DrawFn) -> tuple[str, str, list[float], list[int], list[int]]:
    """A well-formed trace of any format (header names in any case, some with spaces around), its file name and
    the arrays it must read back as."""
    fmt = draw(st.sampled_from([*TRACE_HEADERS, "mooncake"]))
    n = draw(st.integers(1, 8))
    times = sorted(draw(st.lists(st.integers(0, 86_399), min_size=n, max_size=n)))
    prompt = draw(st.lists(st.integers(0, MAX_TOKENS), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(0, 5000), min_size=n, max_size=n))
    if fmt == "mooncake":
        keys = ("timestamp", "input_length", "output_length")
        text = "\n".join(json.dumps(dict(zip(keys, r, strict=True))) for r in zip(times, prompt, output, strict=True))
        return text, "t.jsonl", [(t - times[0]) / 1e3 for t in times], prompt, output
    header, (p, o) = TRACE_HEADERS[fmt]
    rows = [
        ",".join(str(prompt[i]) if c == p else str(output[i]) if c == o else good_cell(c, i, t, 0) for c in header)
        for i, t in enumerate(times)
    ]
    names = [draw(st.sampled_from([c, f" {c} ", c.upper(), c.lower()])) for c in header]
    start = 0 if fmt == "native" else times[0]  # native is not shifted; azure's fraction is row * 1e-7 s
    arrival = [t - start + (i * 1e-7 if fmt == "azure" else 0.0) for i, t in enumerate(times)]
    return "\n".join([",".join(names), *rows]) + "\n", "t.csv", arrival, prompt, output


@contextmanager
def file_with(data: bytes, name: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        yield path


def attempt(path: Path, read: Callable[[], Any], what: str) -> Any:
    """``read()``, or None where it raised a ValueError naming the file; any other exception fails the test."""
    try:
        result = read()
    except ValueError as exc:
        assert str(path) in str(exc), f"the error does not name the file: {exc}"
        event(f"{what}: refused")
        return None
    event(f"{what}: read")
    return result


def check_lengths(values: np.ndarray) -> None:
    assert values.dtype == np.int64 and values.ndim == 1 and len(values) > 0
    assert values.min() >= 0 and values.max() <= MAX_TOKENS


def check_workload(w: Workload) -> None:
    assert w.arrival_s.dtype == np.float64 and w.prompt_tokens.dtype == np.int64 and w.output_tokens.dtype == np.int64
    assert len(w) > 0 and len(w.arrival_s) == len(w.prompt_tokens) == len(w.output_tokens)
    assert np.all(np.isfinite(w.arrival_s)) and w.arrival_s[0] >= 0 and np.all(np.diff(w.arrival_s) >= 0)
    assert w.arrival_s[-1] <= MAX_ARRIVAL_S
    for tokens in (w.prompt_tokens, w.output_tokens):
        assert tokens.min() >= 0 and tokens.max() <= MAX_TOKENS
    assert w.request_id is None or all(type(x) is str for x in w.request_id)


OPTIONS = st.fixed_dictionaries(
    {},
    optional={"sort": st.booleans(), "limit": st.integers(1, 3), "time_scale": st.sampled_from([0.5, 3.0, 1e-12])},
)


def read_everything(path: Path, options: dict[str, Any], column: str) -> None:
    """Every reader on one file: each format, the length column and pair readers, an ``empirical:`` spec."""
    for fmt in FORMATS:
        w = attempt(path, lambda fmt=fmt: load_trace(path, fmt, **options), f"load_trace {fmt}")
        if w is not None:
            check_workload(w)
    if "ChatGPT" in path.read_bytes().decode("latin-1"):
        w = attempt(path, lambda: load_trace(path, "auto", model="ChatGPT", **options), "load_trace model")
        if w is not None:
            check_workload(w)
    header = attempt(path, lambda: csv_header(path), "csv_header")
    assert header is None or all(isinstance(c, str) for c in header)
    for name in (column, "prompt_tokens", "output_tokens"):
        values = attempt(path, lambda name=name: read_length_column(path, name), "read_length_column")
        if values is not None:
            check_lengths(values)
    pairs = attempt(path, lambda: read_length_pairs(path, max_total=4000), "read_length_pairs")
    if pairs is not None:
        check_lengths(pairs[0])
        check_lengths(pairs[1])
        assert len(pairs[0]) == len(pairs[1]) and np.all(pairs[0] + pairs[1] <= 4000)
    spec = parse_length_spec(f"empirical:{path}:{column}")
    sampled = attempt(path, lambda: spec.sample(5, np.random.default_rng(0)), "empirical spec")
    if sampled is not None:
        check_lengths(sampled)


NAMES = st.sampled_from(["t.csv", "t.csv.gz", "t.jsonl", "t.jsonl.gz", "t.txt"])


@FUZZ
@given(csv_texts(), HOW, st.sampled_from(["t.csv", "t.csv", "t.csv.gz", "t.txt"]), OPTIONS, st.sampled_from(COLUMNS))
def test_random_csv_files(text, how, name, options, column):
    with file_with(encoded(text, how), name) as path:
        read_everything(path, options, column)


@FUZZ
@given(jsonl_texts(), HOW, st.sampled_from(["t.jsonl", "t.jsonl", "t.jsonl.gz"]), OPTIONS, st.sampled_from(COLUMNS))
def test_random_jsonl_files(text, how, name, options, column):
    with file_with(encoded(text, how), name) as path:
        read_everything(path, options, column)


@FUZZ
@given(good_traces(), st.sampled_from(["utf-8", "gzip", "utf-16", "utf-8-sig"]), st.sampled_from(["", ".gz"]))
def test_well_formed_traces_read_back_exactly(trace, how, suffix):
    text, name, arrival, prompt, output = trace
    with file_with(encoded(text, how), name + suffix) as path:
        w = load_trace(path)
        np.testing.assert_allclose(w.arrival_s, arrival, rtol=0, atol=1e-6)
        assert list(w.prompt_tokens) == prompt and list(w.output_tokens) == output
        pairs = read_length_pairs(path)
        assert list(pairs[0]) == prompt and list(pairs[1]) == output


# random bytes, some after a compression's magic number or a byte-order mark
MAGIC = st.sampled_from(
    [b"", b"", b"\x1f\x8b", b"\x1f\x8b\x08\x00", b"PK\x03\x04", b"BZh", b"\xfd7zXZ\x00", b"\xff\xfe"]
)


@FUZZ
@given(MAGIC, st.binary(max_size=200), NAMES, OPTIONS, st.sampled_from(COLUMNS))
def test_random_bytes(magic, data, name, options, column):
    with file_with(magic + data, name) as path:
        read_everything(path, options, column)
