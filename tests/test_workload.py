"""Workloads: the value type, the trace readers (one small file per format, written here), synthetic arrivals
against the gamma renewal process they claim to be, and the token-length specs and their compact strings."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import math
import zipfile
from pathlib import Path

import numpy as np
import pydantic
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.workload import (
    FORMATS,
    LengthSpec,
    Workload,
    load_trace,
    parse_length_spec,
    synthetic,
)
from sim.workload.lengths import read_length_pairs


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# --- the Workload value -------------------------------------------------------------------------------------


def test_workload_basics():
    w = Workload.from_arrays([0.0, 0.5, 0.5, 2.0], [10, 0, 30, 40], [1, 2, 0, 4])
    assert len(w) == 4
    assert w.arrival_s.dtype == np.float64 and w.prompt_tokens.dtype == np.int64
    assert w.request_id is None and w.id_of(2) == "2" and list(w.ids()) == ["0", "1", "2", "3"]
    head = w.head(2)
    assert len(head) == 2 and list(head.prompt_tokens) == [10, 0]
    assert w.head(10) is w and len(w.head(0)) == 0
    frame = w.to_frame()
    assert list(frame.columns) == ["arrival_time_s", "prompt_tokens", "output_tokens", "request_id"]
    assert list(frame.request_id) == ["0", "1", "2", "3"]
    with pytest.raises(ValueError):
        w.arrival_s[0] = 1.0  # read-only: a workload is a value


def test_workload_keeps_given_ids_and_does_not_freeze_the_callers_arrays():
    arrival = np.array([0.0, 1.0])
    w = Workload(arrival, np.array([1, 2]), np.array([3, 4]), np.array(["a", "b"], dtype=object), "test")
    assert w.id_of(1) == "b" and list(w.to_frame().request_id) == ["a", "b"]
    arrival[0] = 0.5  # the caller's array stays writable
    assert w.source == "test"


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"prompt_tokens": np.array([1, 2, 3])}, ["prompt_tokens", "3 rows", "2"]),
        ({"prompt_tokens": np.array([1, 2], dtype=np.int32)}, ["prompt_tokens", "int64", "int32"]),
        ({"arrival_s": np.array([0, 1])}, ["arrival_s", "float64"]),
        ({"arrival_s": np.array([0.0, np.nan])}, ["arrival_s", "row 1", "nan"]),
        ({"arrival_s": np.array([-1.0, 0.0])}, ["arrival_s", "row 0", "-1.0"]),
        ({"arrival_s": np.array([1.0, 0.5])}, ["arrival_s", "sorted", "row 1", "0.5"]),
        ({"output_tokens": np.array([5, -7])}, ["output_tokens", "row 1", "-7"]),
        ({"request_id": np.array(["a"], dtype=object)}, ["request_id"]),
        ({"request_id": np.array(["a", 3], dtype=object)}, ["request_id", "row 1", "3"]),
    ],
)
def test_workload_rejects(kwargs, words):
    fields = {
        "arrival_s": np.array([0.0, 1.0]),
        "prompt_tokens": np.array([1, 2]),
        "output_tokens": np.array([1, 2]),
        "request_id": None,
    }
    with pytest.raises(ValueError) as err:
        Workload(**{**fields, **kwargs})
    for word in words:
        assert word in str(err.value)


def test_from_arrays_rejects_fractional_tokens():
    with pytest.raises(ValueError, match=r"prompt_tokens row 1: 2\.5"):
        Workload.from_arrays([0.0, 1.0], [1.0, 2.5], [1, 1])


def test_native_round_trip(tmp_path):
    w = synthetic(50, 4.0, 0.5, "uniform:0:100", "zipf:a=1.5,max=50", rng(3))
    path = tmp_path / "w.csv"
    w.to_frame().to_csv(path, index=False)
    back = load_trace(path)
    assert back.source.startswith("native:")
    np.testing.assert_array_equal(back.arrival_s, w.arrival_s)  # native is not shifted
    np.testing.assert_array_equal(back.prompt_tokens, w.prompt_tokens)
    np.testing.assert_array_equal(back.output_tokens, w.output_tokens)
    assert list(back.ids()) == list(w.ids())


# --- trace files --------------------------------------------------------------------------------------------

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670123,879,0
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,230,1317,Conversation log
45,GPT-4,417,276,693,Conversation log
118,ChatGPT,300,0,300,API log
"""
MOONCAKE = "\n".join(
    json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": [1, 2, 3]})
    for t, i, o in [(1000, 6955, 52), (1000, 6472, 26), (3500, 100, 7)]
)
SPLITWISE = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n4.314579,396,109\n4.541877,879,55\n"
NATIVE = "arrival_time_s,prompt_tokens,output_tokens,request_id\n0.25,10,1,a\n0.5,0,2,NA\n1.0,30,3,007\n"
STATS = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n74,918,992,0.08\n290,905,1195,0.32\n"

EXPECTED = {
    # file name, text, format, arrivals (s), prompt tokens, output tokens
    "azure": ("az.csv", AZURE, [0.0, 4.314579, 4.541877012], [374, 396, 879], [44, 109, 0]),
    "burstgpt": ("b.csv", BURSTGPT, [0.0, 40.0, 40.0, 113.0], [472, 1087, 417, 300], [18, 230, 276, 0]),
    "mooncake": ("m.jsonl", MOONCAKE, [0.0, 0.0, 2.5], [6955, 6472, 100], [52, 26, 7]),
    "splitwise": ("s.csv", SPLITWISE, [0.0, 4.314579, 4.541877], [374, 396, 879], [44, 109, 55]),
    "native": ("n.csv", NATIVE, [0.25, 0.5, 1.0], [10, 0, 30], [1, 2, 3]),
}


@pytest.mark.parametrize("fmt", sorted(EXPECTED))
@pytest.mark.parametrize("given_format", ["auto", "explicit"])
def test_each_format_reads_the_right_arrays(tmp_path, fmt, given_format):
    name, text, arrival, prompt, output = EXPECTED[fmt]
    path = write(tmp_path, name, text)
    w = load_trace(path, fmt if given_format == "explicit" else "auto")
    np.testing.assert_allclose(w.arrival_s, arrival, rtol=0, atol=1e-9)
    assert list(w.prompt_tokens) == prompt and list(w.output_tokens) == output
    assert w.source == f"{fmt}:{path}"
    assert fmt in FORMATS and "auto" in FORMATS


def test_native_ids_are_kept_as_strings(tmp_path):
    w = load_trace(write(tmp_path, "n.csv", NATIVE))
    assert w.request_id is not None and list(w.request_id) == ["a", "NA", "007"]


def test_trace_without_ids_uses_the_row_index(tmp_path):
    w = load_trace(write(tmp_path, "s.csv", SPLITWISE))
    assert w.request_id is None and w.id_of(2) == "2"


def test_azure_timezone_offsets(tmp_path):
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,1,2\n"
    text += "2024-05-10 02:00:01.009930+02:00,3,4\n"  # 00:00:01 UTC
    w = load_trace(write(tmp_path, "a.csv", text))
    np.testing.assert_allclose(w.arrival_s, [0.0, 1.0], atol=1e-9)


def test_limit_time_scale_and_gzip(tmp_path):
    path = tmp_path / "s.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(SPLITWISE)
    w = load_trace(path, limit=2, time_scale=2.0)
    np.testing.assert_allclose(w.arrival_s, [0.0, 4.314579 / 2])
    assert "limit=2" in w.source and "time_scale=2" in w.source
    jpath = tmp_path / "m.jsonl.gz"
    with gzip.open(jpath, "wt") as f:
        f.write(MOONCAKE)
    assert len(load_trace(jpath, limit=1)) == 1


def test_burstgpt_model_filter(tmp_path):
    path = write(tmp_path, "b.csv", BURSTGPT)
    w = load_trace(path, model="ChatGPT", limit=2)
    assert list(w.prompt_tokens) == [472, 1087] and list(w.arrival_s) == [0.0, 40.0]
    with pytest.raises(ValueError, match=r"Claude.*models found: \['ChatGPT', 'GPT-4'\]"):
        load_trace(path, model="Claude")
    with pytest.raises(ValueError, match="BurstGPT"):
        load_trace(write(tmp_path, "s.csv", SPLITWISE), model="ChatGPT")


def test_sort_option(tmp_path):
    path = write(tmp_path, "s.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n5,1,1\n3,2,2\n4,3,3\n")
    w = load_trace(path, sort=True)
    assert list(w.arrival_s) == [0.0, 1.0, 2.0] and list(w.prompt_tokens) == [2, 3, 1]
    assert "sorted" in w.source


def test_length_only_file_is_not_a_trace(tmp_path):
    path = write(tmp_path, "stats.csv", STATS)
    with pytest.raises(ValueError, match=r"not a trace.*empirical:PATH:num_prefill_tokens"):
        load_trace(path)
    with pytest.raises(ValueError, match=r"missing column 'arrived_at'.*not a trace"):
        load_trace(path, "splitwise")


def test_unknown_header_lists_the_formats_and_the_header(tmp_path):
    with pytest.raises(ValueError) as err:
        load_trace(write(tmp_path, "x.csv", "when,in,out\n1,2,3\n"))
    text = str(err.value)
    assert "['when', 'in', 'out']" in text
    for name in ("native", "azure", "burstgpt", "mooncake", "splitwise", "arrived_at", "ContextTokens"):
        assert name in text


S_HEAD = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


@pytest.mark.parametrize(
    ("name", "text", "fmt", "words"),
    [
        (
            "s.csv",
            "arrived_at,num_prefill_tokens\n0,1\n",
            "splitwise",
            ["num_decode_tokens", "columns found"],
        ),
        ("s.csv", S_HEAD + "0,1,1\n1,abc,1\n", "auto", ["num_prefill_tokens", "row 1", "'abc'"]),
        ("s.csv", S_HEAD + "0,1,1\n1,-4,1\n", "auto", ["num_prefill_tokens", "row 1", "-4", "negative"]),
        ("s.csv", S_HEAD + "0,1,1\n1,2,1\n2,,1\n", "auto", ["num_prefill_tokens", "row 2", "missing"]),
        ("s.csv", S_HEAD + "0,1,1\n1,2.5,1\n", "auto", ["num_prefill_tokens", "row 1", "2.5", "whole"]),
        ("s.csv", S_HEAD + "0,True,1\n1,False,1\n", "auto", ["num_prefill_tokens", "row 0", "'True'"]),
        ("s.csv", S_HEAD + "0,1,1\nnan,2,1\n", "auto", ["arrived_at", "row 1", "'nan'"]),
        ("s.csv", S_HEAD + "0,1,1\n2,1,1\n1,1,1\n", "auto", ["arrived_at", "row 2", "row 1", "--sort-trace"]),
        ("s.csv", S_HEAD, "auto", ["no requests"]),
        (
            "a.csv",
            AZURE.replace("18:15:50.9951690", "yesterday"),
            "auto",
            ["TIMESTAMP", "row 1", "yesterday"],
        ),
        (
            "n.csv",
            "arrival_time_s,prompt_tokens,output_tokens\n-1,1,1\n",
            "auto",
            ["row 0", "-1.0", "negative"],
        ),
        ("n.csv", NATIVE.replace("NA", "a"), "auto", ["request_id", "row 1", "'a'", "row 0"]),
        ("m.jsonl", '{"timestamp": 1, "input_length": 2}\n', "auto", ["line 1", "output_length"]),
        ("m.jsonl", MOONCAKE + "\n{oops\n", "auto", ["line 4", "JSON"]),
        ("m.jsonl", MOONCAKE.replace("6472", "-6"), "auto", ["line 2", "input_length", "-6"]),
        ("m.jsonl", MOONCAKE.replace("3500", "10"), "auto", ["line 3", "line 2", "--sort-trace"]),
    ],
)
def test_trace_errors_name_the_column_and_row(tmp_path, name, text, fmt, words):
    with pytest.raises(ValueError) as err:
        load_trace(write(tmp_path, name, text), fmt)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"format": "vidur"}, ["format='vidur'", "splitwise"]),
        ({"limit": 0}, ["limit=0"]),
        ({"time_scale": 0.0}, ["time_scale=0.0"]),
        ({"time_scale": float("nan")}, ["time_scale=nan"]),
        ({"format": "splitwise", "model": "x"}, ["model='x'", "BurstGPT"]),
    ],
)
def test_trace_argument_errors(tmp_path, kwargs, words):
    with pytest.raises(ValueError) as err:
        load_trace(write(tmp_path, "s.csv", SPLITWISE), **kwargs)
    for word in words:
        assert word in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_trace(tmp_path / "nope.csv")


# --- bounds on values, compressions and encodings, header spaces --------------------------------------------

N_HEAD = "arrival_time_s,prompt_tokens,output_tokens\n"
M_LINE = '{{"timestamp": {}, "input_length": {}, "output_length": {}}}\n'


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("n.csv", N_HEAD + "0,1e30,1\n", ["'prompt_tokens' row 0", "1e+30", "MAX_TOKENS"]),
        ("n.csv", N_HEAD + f"0,1,1\n1,{2**63 - 1},1\n", ["'prompt_tokens' row 1", str(2**63 - 1), "MAX_TOKENS"]),
        ("n.csv", N_HEAD + f"0,{2**62},{2**62}\n", ["'prompt_tokens' row 0", str(2**62)]),
        ("n.csv", N_HEAD + f"0,1,{2**64}\n", ["'output_tokens' row 0", str(2**64)]),
        ("n.csv", N_HEAD + f"0,1,{2**31}\n", ["'output_tokens' row 0", str(2**31)]),
        ("m.jsonl", M_LINE.format(0, "1e30", 1), ["line 1", "'input_length'", "1e+30", "MAX_TOKENS"]),
        ("m.jsonl", M_LINE.format(0, 1, 10**30), ["line 1", "'output_length'", str(10**30)[:20]]),
    ],
)
def test_token_counts_are_bounded(tmp_path, name, text, words):
    path = write(tmp_path, name, text)
    with pytest.raises(ValueError) as err:
        load_trace(path)
    for word in [str(path), *words]:
        assert word in str(err.value)


def test_the_largest_token_count_is_read(tmp_path):
    w = load_trace(write(tmp_path, "n.csv", N_HEAD + f"0,{2**31 - 1},{2**31 - 1}\n"))
    assert list(w.prompt_tokens) == [2**31 - 1] and int(w.prompt_tokens.sum() + w.output_tokens.sum()) == 2**32 - 2
    from sim.workload.traces import MAX_ARRIVAL_S, MAX_TOKENS

    assert MAX_TOKENS == 2**31 - 1 and MAX_ARRIVAL_S == 1e9


@pytest.mark.parametrize(
    ("name", "text", "kwargs", "words"),
    [
        ("n.csv", N_HEAD + "1e30,1,1\n", {}, ["'arrival_time_s' row 0", "1e+30", "MAX_ARRIVAL_S"]),
        ("s.csv", S_HEAD + "0,1,1\n2e9,1,1\n", {}, ["'arrived_at' row 1", "2e+09", "MAX_ARRIVAL_S"]),
        ("s.csv", S_HEAD + "-1e308,1,1\n1e308,1,1\n", {}, ["'arrived_at' row 1", "inf"]),
        ("n.csv", N_HEAD + "0,1,1\n1,1,1\n", {"time_scale": 1e-10}, ["row 1", "1e+10", "time_scale=1e-10"]),
        ("m.jsonl", M_LINE.format(10**400, 1, 1), {}, ["line 1", "'timestamp'", "finite"]),
        ("m.jsonl", M_LINE.format(0, 1, 1) + M_LINE.format(2e12, 1, 1), {}, ["line 2", "2e+09"]),
        ("m.jsonl", M_LINE.format(0, 1, 1) + M_LINE.format("1" * 5000, 1, 1), {}, ["line 2", "JSON"]),
    ],
)
def test_arrival_times_are_bounded(tmp_path, name, text, kwargs, words):
    path = write(tmp_path, name, text)
    with pytest.raises(ValueError) as err:
        load_trace(path, **kwargs)
    for word in [str(path), *words]:
        assert word in str(err.value)
    assert load_trace(write(tmp_path, "ok.csv", N_HEAD + "0,1,1\n1e9,1,1\n")).arrival_s[-1] == 1e9


def test_errors_after_sorting_or_filtering_name_the_files_row(tmp_path):
    with pytest.raises(ValueError, match=r"row 1: -1\.0 is negative"):
        load_trace(write(tmp_path, "n.csv", N_HEAD + "1,1,1\n-1,2,2\n"), sort=True)
    with pytest.raises(ValueError, match=r"'Request tokens' row 3: 'abc'"):
        load_trace(write(tmp_path, "b.csv", BURSTGPT.replace("300", "abc")), model="ChatGPT")


def encode(text: str, how: str) -> bytes:
    """``text`` as the bytes of a file written ``how``: a compression, an encoding, or both (``utf-16+gzip``)."""
    encoding, _, compression = how.partition("+") if "utf" in how else ("utf-8", "", how)
    data = text.encode(encoding)
    if compression == "zip":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("inner.csv", data)
        return buffer.getvalue()
    compress = {"gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress, "": bytes}
    return compress[compression](data)


@pytest.mark.parametrize("how", ["gzip", "bz2", "xz", "zip", "utf-8-sig", "utf-16", "utf-32", "utf-16+gzip"])
@pytest.mark.parametrize(("fmt", "name"), [("splitwise", "s.csv"), ("splitwise", "s.csv.gz"), ("mooncake", "m.jsonl")])
def test_compressions_and_encodings_are_told_by_the_first_bytes(tmp_path, how, fmt, name):
    _, text, arrival, prompt, output = EXPECTED[fmt]
    path = tmp_path / name
    path.write_bytes(encode(text, how))
    w = load_trace(path)
    np.testing.assert_allclose(w.arrival_s, arrival, rtol=0, atol=1e-9)
    assert list(w.prompt_tokens) == prompt and list(w.output_tokens) == output
    spec = parse_length_spec({"dist": "empirical", "path": str(path), "column": "prompt_tokens"})
    assert set(spec.sample(20, rng())) <= set(prompt)


def test_plain_text_named_gz_is_read(tmp_path):
    assert len(load_trace(write(tmp_path, "s.csv.gz", SPLITWISE))) == 3


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("s.csv", SPLITWISE.encode() + "4.6,\u00e9,1\n".encode("latin-1"), ["not UTF-8 text"]),
        ("m.jsonl", MOONCAKE.encode() + b'\n{"timestamp": 1, "x": "\xff"}\n', ["line 4", "save the file as UTF-8"]),
        ("s.csv", SPLITWISE.encode("utf-16-le"), ["NUL bytes", "byte-order mark"]),
        ("s.csv", gzip.compress(SPLITWISE.encode())[:20], ["gzip"]),
        ("m.jsonl", encode(MOONCAKE, "zip")[:30], ["zip"]),
    ],
)
def test_undecodable_files_are_refused_by_name(tmp_path, name, data, words):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError) as err:
        load_trace(path)
    for word in [str(path), *words]:
        assert word in str(err.value)
    assert "\n" not in str(err.value)


def test_header_names_are_matched_after_stripping(tmp_path):
    path = write(tmp_path, "n.csv", " arrival_time_s , prompt_tokens,output_tokens \n0,1,2\n0.5,3,4\n")
    w = load_trace(path)
    assert list(w.prompt_tokens) == [1, 3] and list(w.output_tokens) == [2, 4]
    stats = write(tmp_path, "stats.csv", " num_prefill_tokens , num_decode_tokens \n5,6\n")
    assert set(parse_length_spec(f"empirical:{stats}:num_prefill_tokens").sample(3, rng())) == {5}
    assert [list(v) for v in read_length_pairs(stats)] == [[5], [6]]
    bad = write(tmp_path, "bad.csv", " arrival_time_s ,prompt_tokens,output_tokens\nx,1,1\n")
    with pytest.raises(ValueError, match=r"column 'arrival_time_s' row 0: 'x'"):
        load_trace(bad)


def test_a_trailing_field_does_not_shift_the_columns(tmp_path):
    w = load_trace(
        write(tmp_path, "b.csv", "Timestamp,Model,Request tokens,Response tokens\n1,GPT-4,7,8,\n2,GPT-4,9,10\n")
    )
    assert list(w.prompt_tokens) == [7, 9] and list(w.output_tokens) == [8, 10]


def test_an_unsorted_trace_is_a_length_source(tmp_path):
    path = write(tmp_path, "m.jsonl", M_LINE.format(5, 1, 10) + M_LINE.format(3, 2, 20))
    assert [list(v) for v in read_length_pairs(path)] == [[2, 1], [20, 10]]


# --- synthetic arrivals -------------------------------------------------------------------------------------


def gaps(w: Workload) -> np.ndarray:
    return np.diff(np.concatenate([[0.0], w.arrival_s]))


def test_mean_rate_of_the_raw_process():
    w = synthetic(100_000, 8.0, 1.0, 1, 1, rng(1), normalize=False)
    assert np.mean(gaps(w)) == pytest.approx(1 / 8.0, rel=0.02)
    assert w.arrival_s[0] > 0  # as in vLLM, the first request waits one gap too


def test_normalized_like_vllm_the_last_arrives_at_n_over_rate():
    w = synthetic(1000, 8.0, 0.5, 1, 1, rng(2))
    assert w.arrival_s[-1] == pytest.approx(1000 / 8.0, rel=1e-12)
    assert w.arrival_s[0] > 0 and np.all(np.diff(w.arrival_s) >= 0)
    assert "gamma(burstiness=0.5) rate=8/s n=1000" in w.source


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
@pytest.mark.parametrize("normalize", [False, True])
def test_burstiness_sets_the_coefficient_of_variation(burstiness, normalize):
    g = gaps(synthetic(100_000, 5.0, burstiness, 1, 1, rng(4), normalize=normalize))
    assert np.std(g) / np.mean(g) == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_infinite_rate_and_infinite_burstiness():
    assert np.all(synthetic(100, math.inf, 1.0, 1, 1, rng()).arrival_s == 0)
    w = synthetic(100, 4.0, math.inf, 1, 1, rng())
    np.testing.assert_allclose(gaps(w), 0.25)
    assert "poisson" in synthetic(3, 2.0, 1.0, 1, 1, rng()).source


def test_same_seed_same_workload():
    spec = ("lognormal:median=512,sigma=1.0,max=8192", "zipf:a=1.2,min=1,max=4096")
    a, b = (synthetic(500, 3.0, 0.7, *spec, rng(42)) for _ in range(2))
    for field in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert a == b and a is not b
    c = synthetic(500, 3.0, 0.7, *spec, rng(43))
    assert not np.array_equal(a.arrival_s, c.arrival_s) and a != c


@pytest.mark.parametrize(
    ("args", "word"),
    [
        ((0, 1.0, 1.0), "num_prompts=0"),
        ((10, 0.0, 1.0), "request_rate=0.0"),
        ((10, -1.0, 1.0), "request_rate=-1.0"),
        ((10, math.nan, 1.0), "request_rate=nan"),
        ((10, 1.0, 0.0), "burstiness=0.0"),
    ],
)
def test_synthetic_rejects(args, word):
    num_prompts, rate, burstiness = args
    with pytest.raises(ValueError, match=word):
        synthetic(num_prompts, rate, burstiness, 1, 1, rng())


# --- token lengths ------------------------------------------------------------------------------------------


def specs() -> st.SearchStrategy[LengthSpec]:
    bound = st.integers(0, 100_000)
    ordered = st.tuples(bound, bound).map(sorted)
    fixed = bound.map(lambda v: parse_length_spec({"dist": "fixed", "value": v}))
    uniform = ordered.map(lambda p: parse_length_spec({"dist": "uniform", "low": p[0], "high": p[1]}))
    lognormal = st.tuples(st.floats(0.5, 1e5), st.booleans(), st.floats(0.0, 3.0), ordered, st.booleans()).map(
        lambda t: parse_length_spec(
            {
                "dist": "lognormal",
                ("median" if t[1] else "mean"): t[0],
                "sigma": t[2],
                "min": t[3][0],
                "max": t[3][1] if t[4] else None,
            }
        )
    )
    zipf = st.tuples(st.floats(1.01, 5.0), st.integers(1, 5000), st.integers(0, 5000)).map(
        lambda t: parse_length_spec({"dist": "zipf", "a": t[0], "min": t[1], "max": t[1] + t[2]})
    )
    return st.one_of(fixed, uniform, lognormal, zipf)


@settings(max_examples=150, deadline=None)
@given(specs(), st.integers(0, 2**32 - 1))
def test_every_spec_round_trips_through_its_text_and_samples_in_range(spec, seed):
    assert parse_length_spec(spec.text()) == spec
    values = spec.sample(200, rng(seed))
    assert values.dtype == np.int64 and len(values) == 200
    low = {"fixed": "value", "uniform": "low"}.get(spec.dist, "min")
    high = {"fixed": "value", "uniform": "high"}.get(spec.dist, "max")
    assert values.min() >= getattr(spec, low)
    if getattr(spec, high) is not None:
        assert values.max() <= getattr(spec, high)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_the_parser_fails_only_with_value_errors(text):
    try:
        parse_length_spec(text)
    except ValueError:
        pass


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", {"dist": "fixed", "value": 1024}),
        (" fixed:7 ", {"dist": "fixed", "value": 7}),
        ("uniform:128:2048", {"dist": "uniform", "low": 128, "high": 2048}),
        ("lognormal:median=512,sigma=1.0", {"dist": "lognormal", "median": 512.0, "sigma": 1.0, "min": 1}),
        (
            "lognormal:mean=300,sigma=0.5,min=4,max=99",
            {"dist": "lognormal", "mean": 300, "sigma": 0.5, "min": 4},
        ),
        ("zipf:a=1.2,min=1,max=4096", {"dist": "zipf", "a": 1.2, "min": 1, "max": 4096}),
        ("empirical:C:/data/x.csv:num_prefill_tokens", {"dist": "empirical", "path": "C:/data/x.csv"}),
    ],
)
def test_compact_forms(text, expected):
    spec = parse_length_spec(text)
    for key, value in expected.items():
        assert getattr(spec, key) == value


@pytest.mark.parametrize("text", ["blah", "uniform:1", "uniform", "lognormal:median", "empirical:x", "zipf:a=2,a=3"])
def test_unparseable_text_lists_the_forms(text):
    with pytest.raises(ValueError, match=r"uniform:LOW:HIGH.*zipf:a=A.*empirical:PATH:COLUMN"):
        parse_length_spec(text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("uniform:500:100", ["low=500", "high=100"]),
        ("-3", ["fixed.value", "-3"]),
        ("zipf:a=0.9,max=10", ["zipf.a", "0.9"]),
        ("zipf:a=2,min=9,max=3", ["min=9", "max=3"]),
        ("lognormal:sigma=1", ["median", "mean"]),
        ("lognormal:median=5,mean=5,sigma=1", ["exactly one"]),
        ("lognormal:median=5,sigma=-1", ["lognormal.sigma", "-1"]),
        ("lognormal:median=5,sigma=1,mu=3", ["lognormal.mu"]),
        ("uniform:a:9", ["uniform.low", "'a'"]),
    ],
)
def test_bad_values_name_the_field_and_value(text, words):
    with pytest.raises(ValueError) as err:
        parse_length_spec(text)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (str(2**31), ["fixed.value", str(2**31)]),
        ("uniform:1:99999999999999999999", ["uniform.high"]),
        ("zipf:a=2,min=99999999999999999999,max=99999999999999999999", ["zipf.min"]),
        ("lognormal:median=5,sigma=1,max=3000000000", ["lognormal.max"]),
    ],
)
def test_length_specs_are_bounded_by_max_tokens(text, words):
    with pytest.raises(ValueError) as err:
        parse_length_spec(text)
    for word in words:
        assert word in str(err.value)


def test_lognormal_without_max_stays_within_max_tokens():
    values = parse_length_spec("lognormal:median=1e9,sigma=10").sample(1000, rng())
    assert values.max() == 2**31 - 1 and values.min() >= 1


def test_length_spec_in_a_yaml_config():
    class Config(pydantic.BaseModel):
        input_len: LengthSpec
        output_len: LengthSpec

    text = "input_len: {dist: uniform, low: 1, high: 9}\noutput_len: 'zipf:a=2,max=9'"
    config = Config.model_validate(yaml.safe_load(text))
    assert config.input_len.dist == "uniform" and config.output_len.dist == "zipf"
    assert Config.model_validate({"input_len": 5, "output_len": "7"}).input_len.text() == "5"
    with pytest.raises(pydantic.ValidationError, match=r"input_len\.uniform\.high"):
        Config.model_validate({"input_len": {"dist": "uniform", "low": 1, "high": -1}, "output_len": 1})


def test_distribution_shapes():
    median = np.median(parse_length_spec("lognormal:median=512,sigma=1.0").sample(50_000, rng(5)))
    assert median == pytest.approx(512, rel=0.03)
    mean = np.mean(parse_length_spec("lognormal:mean=300,sigma=0.5").sample(50_000, rng(6)))
    assert mean == pytest.approx(300, rel=0.02)
    z = parse_length_spec("zipf:a=1.5,min=1,max=1000").sample(100_000, rng(7))
    assert np.mean(z == 1) / np.mean(z == 2) == pytest.approx(2**1.5, rel=0.05)
    u = parse_length_spec("uniform:3:5").sample(3000, rng(8))
    assert set(u) == {3, 4, 5}


def test_empirical_lengths(tmp_path):
    stats = write(tmp_path / "dir:with:colons", "stats.csv", STATS)
    values = parse_length_spec(f"empirical:{stats}:num_prefill_tokens").sample(100, rng())
    assert set(values) == {74, 290}
    w = synthetic(20, 1.0, 1.0, f"empirical:{stats}:num_prefill_tokens", f"empirical:{stats}:num_decode_tokens", rng())
    assert set(w.output_tokens) <= {918, 905}
    trace = write(tmp_path, "m.jsonl", MOONCAKE)
    for column in ("prompt_tokens", "input_length"):
        assert set(
            parse_length_spec({"dist": "empirical", "path": str(trace), "column": column}).sample(50, rng())
        ) <= {
            6955,
            6472,
            100,
        }
    splitwise = write(tmp_path, "s.csv", SPLITWISE)
    assert set(parse_length_spec(f"empirical:{splitwise}:output_tokens").sample(50, rng())) <= {44, 109, 55}


@pytest.mark.parametrize(
    ("column", "text", "words"),
    [
        ("nope", STATS, ["'nope'", "num_prefill_tokens", "num_total_tokens"]),
        ("pd_ratio", STATS, ["pd_ratio", "row 0", "whole"]),
        ("prompt_tokens", STATS, ["prompt_tokens", "columns found"]),
        ("num_total_tokens", "num_total_tokens\n", ["no values"]),
        ("n", "n\n1\n1e30\n", ["'n' row 1", "1e+30", "MAX_TOKENS"]),
        ("n", f"n\n{2**63}\n", ["'n' row 0", str(2**63), "MAX_TOKENS"]),
    ],
)
def test_empirical_errors(tmp_path, column, text, words):
    spec = parse_length_spec({"dist": "empirical", "path": str(write(tmp_path, "f.csv", text)), "column": column})
    with pytest.raises(ValueError) as err:
        spec.sample(5, rng())
    for word in words:
        assert word in str(err.value)
