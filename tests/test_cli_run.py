"""`ferry run` end to end: outputs, config files, reproducibility, and one-line errors for bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from experiments.cli import main

SMALL = [
    "--model",
    "llama-3-8b",
    "--hardware",
    "h100-sxm",
    "--num-prompts",
    "40",
    "--request-rate",
    "20",
    "--input-len",
    "uniform:16:512",
    "--output-len",
    "uniform:1:64",
    "--seed",
    "3",
]


def ferry(*args: str) -> int:
    return main(list(args))


def test_run_writes_summary_requests_and_iterations(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert (
        ferry(
            "run",
            *SMALL,
            "--policy",
            "chunked",
            "--max-num-batched-tokens",
            "256",
            "--goodput",
            "ttft:500",
            "--out",
            str(tmp_path),
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "Successful requests" in printed and "Seat utilization" in printed
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in (
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "request_goodput",
        "mean_ttft_ms",
        "median_tpot_ms",
        "p99_itl_ms",
        "std_e2el_ms",
        "p90_ttft_ms",
        "gpu_idle_fraction",
        "idle_while_waiting_s",
        "seat_utilization",
        "mean_batch_size",
        "mean_tokens_per_iteration",
    ):
        assert key in summary, key
    assert summary["completed"] + summary["failed"] == 40
    assert summary["config"]["scheduler"]["policy"] == "chunked"
    assert summary["config"]["scheduler"]["max_model_len"] == 8192  # the model's context length
    assert summary["memory"]["num_gpu_blocks"] > 0
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert len(requests) == 40
    for col in (
        "request_id",
        "arrival_s",
        "first_token_s",
        "finish_s",
        "response_s",
        "prompt_tokens",
        "output_tokens",
        "ttft_s",
        "tpot_s",
        "e2el_s",
        "preemptions",
        "status",
        "reason",
    ):
        assert col in requests.columns, col
    iterations = pd.read_csv(tmp_path / "iterations.csv")
    for col in ("start", "end", "prefill_tokens", "decode_seqs", "context_tokens", "kv_blocks_used"):
        assert col in iterations.columns, col
    assert (iterations.prefill_tokens + iterations.decode_seqs <= 256).all()


def test_same_seed_same_requests_csv_and_summary_reproduces(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert ferry("run", *SMALL, "--policy", "dynamic", "--out", str(a)) == 0
    assert ferry("run", *SMALL, "--policy", "dynamic", "--out", str(b)) == 0
    assert (a / "requests.csv").read_bytes() == (b / "requests.csv").read_bytes()
    # the summary carries the resolved config: feeding it back reproduces the run
    assert ferry("run", "--config", str(a / "summary.json"), "--out", str(c)) == 0
    assert (a / "requests.csv").read_bytes() == (c / "requests.csv").read_bytes()


def test_yaml_config_with_flat_fields_and_flag_override(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "model: llama-3-8b\nhardware: h100-sxm\npolicy: static\nmax_batch_size: 4\n"
        "num_prompts: 12\nrequest_rate: 5\ninput_len: 64\noutput_len: {dist: uniform, low: 1, high: 9}\n"
    )
    assert ferry("run", "--config", str(cfg), "--max-batch-size", "3", "--out", str(tmp_path)) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["scheduler"]["policy"] == "static"
    assert summary["config"]["scheduler"]["max_batch_size"] == 3
    assert summary["completed"] == 12


def test_trace_replay(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens,request_id\n0,100,5,a\n0.5,9000,5,b\n1.0,50,0,c\n")
    assert ferry("run", "--trace", str(trace), "--policy", "continuous", "--out", str(tmp_path)) == 0
    requests = pd.read_csv(tmp_path / "requests.csv", keep_default_na=False)
    assert list(requests.request_id) == ["a", "b", "c"]
    assert list(requests.status) == ["finished", "rejected", "rejected"]
    assert list(requests.reason) == ["", "exceeds_max_model_len", "empty"]


def _error(capsys: pytest.CaptureFixture, *args: str) -> str:
    assert ferry(*args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.startswith("ferry run: error:")
    return err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("arrival_time_s,prompt_tokens,output_tokens\n0,-5,3\n", "-5"),
        ("arrival_time_s,prompt_tokens,output_tokens\n0,abc,3\n", "abc"),
        ("arrival_time_s,prompt_tokens,output_tokens\n1,5,3\n0,5,3\n", "sorted"),
        ("arrival_time_s,prompt_tokens,output_tokens\nnan,5,3\n", "arrival"),
        ("arrival_time_s,prompt_tokens\n0,5\n", "output_tokens"),
    ],
)
def test_bad_trace_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: str, expected: str
) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(content)
    err = _error(capsys, "run", "--trace", str(trace), "--trace-format", "native", "--out", str(tmp_path))
    assert expected in err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--policy", "fifo"], "unknown policy 'fifo'"),
        (["--max-num-seqs", "0"], "max_num_seqs"),
        (
            ["--policy", "continuous", "--max-num-batched-tokens", "1024", "--max-model-len", "4096"],
            "max_num_batched_tokens=1024 is smaller than max_model_len=4096",
        ),
        (["--input-len", "-5"], "-5"),
        (["--input-len", "gaussian:3"], "token length"),
        (["--request-rate", "0"], "request_rate"),
        (["--model", "gpt-9"], "gpt-9"),
        (["--hardware", "tpu-v9"], "tpu-v9"),
        (["--max-model-len", "100000"], "max_position_embeddings"),
        (["--model", "llama-3-70b", "--hardware", "a100-40g"], "GiB"),
        (["--vllm-defaults", "0.5.4"], "from 0.6.6 on"),
        (["--vllm-defaults", "newest"], "expected a vLLM release"),
        (["--policy", "chunked", "--max-num-batched-tokens", "64", "--max-num-seqs", "128"], "max_num_seqs=128"),
        (["--num-gpu-blocks-override", "10"], "max_model_len=8192: one request that long needs 512 KV blocks"),
    ],
)
def test_bad_flags_are_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], expected: str
) -> None:
    err = _error(capsys, "run", *SMALL, *args, "--out", str(tmp_path))
    assert expected in err


def test_header_names_the_vllm_defaults_and_the_delivery(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["run", *SMALL, "--hardware", "a100-80g", "--policy", "chunked", "--out", str(tmp_path)]
    assert ferry(*args, "--vllm-defaults", "0.8.5", "--watermark", "0.02", "--no-stream") == 0
    printed = capsys.readouterr().out
    assert "0.8.5 V1, 80 GiB >= 70 GiB" in printed  # before 0.9.0 an A100-80GB got the large defaults
    assert "1,024 (vLLM 0.8.5)" in printed and "8,192 (vLLM 0.8.5)" in printed
    assert "first chunk fits (vLLM 0.8.5)" in printed  # scheduler_reserve_full_isl came with 0.19.0
    assert "KV watermark:" in printed and "0.02\n" in printed and "whole, at the last token" in printed
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["vllm_defaults"]["applied"] == [
        "max_num_batched_tokens",
        "max_num_seqs",
        "scheduler_reserve_full_isl",
        "kv_watermark",
        "enable_prefix_caching",
    ] or summary["vllm_defaults"]["applied"] == [
        "max_num_batched_tokens",
        "max_num_seqs",
        "scheduler_reserve_full_isl",
        "enable_prefix_caching",
    ]
    assert "Prefix caching:" in printed and "on (vLLM 0.8.5)" in printed  # V1 caches prefixes by default
    assert summary["config"]["kv_watermark"] == 0.02 and summary["config"]["stream"] is False
    assert summary["stream"] is False and summary["mean_tpot_ms"] == 0.0  # whole responses: no pace seen
    assert summary["mean_server_tpot_ms"] > 0
    requests = pd.read_csv(tmp_path / "requests.csv")
    assert (requests.ttft_s == requests.e2el_s).all()


def test_the_header_says_where_the_profiles_numbers_come_from(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert ferry("run", *SMALL, "--hardware", "a100-80g.datasheet", "--out", str(tmp_path / "a")) == 0
    printed = capsys.readouterr().out
    assert re.search(
        r"Profile numbers: +datasheet rates; \d+ of \d+ numbers \(efficiencies, overheads\) assumed", printed
    )
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["hardware_profile"]["kind"] == "datasheet"
    assert ferry("run", *SMALL, "--hardware", "a100-80g.vidur", "--out", str(tmp_path / "b")) == 0
    printed = capsys.readouterr().out
    assert "Profile numbers:" in printed and "calibrated: " in printed and "fitted to microsoft/vidur" in printed
    assert "held-out median error gemm" in printed
    # the default profiles: fitted to NVIDIA's measured kernels, for vLLM, with vLLM V1's host overheads
    assert ferry("run", *SMALL, "--hardware", "a100-80g", "--out", str(tmp_path / "c")) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("Profile numbers:"))
    assert "measured: aiconfigurator-core 0.12.0 a100_sxm vllm 0.14.0 kernel tables, interpolated" in line
    assert "engine preset vllm-v1" in line
    summary = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert summary["hardware_profile"]["kind"] == "calibrated"


def test_record_batches_writes_who_rode_in_each_iteration(tmp_path: Path) -> None:

    out = tmp_path / "run"
    args = ["run", "--policy", "chunked", "--num-prompts", "12", "--request-rate", "50", "--input-len", "700"]
    args += ["--output-len", "5", "--max-num-seqs", "4", "--max-num-batched-tokens", "512", "--out", str(out)]
    assert main([*args, "--record-batches"]) == 0
    batches, iterations = pd.read_csv(out / "batches.csv"), pd.read_csv(out / "iterations.csv")
    assert list(batches.columns) == [
        "iteration",
        "request_id",
        "phase",
        "tokens",
        "context_tokens",
        "replica",
        "draft_tokens",
        "accepted_tokens",
    ]  # speculative decoding's after the others
    per_iteration = batches.groupby("iteration").size()
    assert (per_iteration.to_numpy() == (iterations.prefill_seqs + iterations.decode_seqs).to_numpy()).all()
    assert set(batches.phase) == {"prefill_chunk", "decode"}  # 700-token prompts under a 512-token budget: chunks
    assert (batches[batches.phase == "prefill_chunk"].groupby("request_id").size() >= 2).all()
    assert (batches[batches.phase == "decode"].tokens == 1).all()
    assert batches.groupby("request_id").tokens.sum().eq(700 + 5 - 1).all()  # each prompt, and a decode per token
    assert main(args) == 0  # a run without it leaves no stale batches.csv behind
    assert not (out / "batches.csv").exists()


def test_a_run_without_flags_is_what_vllm_serve_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """No --policy: vLLM V1's chunked prefill; prefix caching on, as vllm serve 0.32 turns it on by default
    (``EngineArgs._set_default_chunked_prefill_and_prefix_caching_args``); both named in the header, and
    --no-enable-prefix-caching turns it off. Requests all at t=0 unless a rate is given, which the header says."""
    assert ferry("run", "--num-prompts", "20", "--out", str(tmp_path / "a")) == 0
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["config"]["scheduler"]["policy"] == "chunked" and summary["config"]["enable_prefix_caching"]
    assert {"policy", "enable_prefix_caching"} <= set(summary["vllm_defaults"]["applied"])
    assert "chunked (`vllm serve`" in printed and re.search(r"Prefix caching: +on \(vLLM", printed)
    assert "all at t=0 (--request-rate inf" in printed
    assert ferry("run", "--num-prompts", "20", "--no-enable-prefix-caching", "--out", str(tmp_path / "b")) == 0
    assert re.search(r"Prefix caching: +off", capsys.readouterr().out)


def test_a_run_where_no_request_completed_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    status = ferry("run", "--num-prompts", "5", "--input-len", "9000", "--max-model-len", "4096", "--out",
                   str(tmp_path))  # fmt: skip
    assert status == 3 and "no request completed (rejected: 5 exceeds_max_model_len)" in capsys.readouterr().err
    assert json.loads((tmp_path / "summary.json").read_text())["failed"] == 5  # written all the same
