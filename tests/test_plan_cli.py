"""`ferry plan` as a newcomer asks it: every `ferry run` flag that fixes the replica or the workload (--max-model-len
first), several models at once, SLO limits given in two --slo, a closed loop of clients, the answer's stability,
drop reasons said once, and a plan that cannot be answered refused with status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.cli import main

SMALL = ["--request-rate", "2", "--num-prompts", "120", "--input-len", "2000", "--output-len", "300", "--jobs", "1"]


def _plan(tmp_path: Path, *args: str) -> dict:
    assert main(["plan", *args, "--out", str(tmp_path / "p"), "--force"]) == 0
    return json.loads((tmp_path / "p" / "plan.json").read_text())


def test_max_model_len_keeps_the_layouts_a_short_context_fits(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Sized for llama-3.3-70b's whole context (131,072 tokens) H100 TP 2 and B200 TP 1 cannot hold one request; at
    --max-model-len 4096, the plan's question for a 2k/300 workload, both run and meet the SLO."""
    common = ["--model", "llama-3.3-70b", "--hardware", "h100-sxm,b200", "--tensor-parallel-size", "1,2", *SMALL,
              "--slo", "ttft_p99_ms=5000", "tpot_p99_ms=100", "--repeats", "0"]  # fmt: skip
    full = _plan(tmp_path, *common)
    assert "h100-sxm tp2 chunked" not in full["ranked"] and "b200 tp1 chunked" not in full["ranked"]
    reasons = {c["label"]: c["reason"] for c in full["candidates"]}
    assert "lower --max-model-len" in reasons["b200 tp1 chunked"]
    short = _plan(tmp_path, *common, "--max-model-len", "4096")
    assert {"h100-sxm tp2 chunked", "b200 tp1 chunked"} <= set(short["ranked"])
    capsys.readouterr()


def test_several_models_and_slo_limits_given_twice(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    plans = _plan(tmp_path, "--model", "llama-3-8b,qwen3-8b", "--slo", "ttft_p99_ms=3000", "--slo", "tpot_p99_ms=80",
                  *SMALL, "--repeats", "0")  # fmt: skip
    assert [p["model"] for p in plans["models"]] == ["llama-3-8b", "qwen3-8b"]
    for plan in plans["models"]:
        assert plan["slo"]["limits"] == {"p99_ttft_ms": 3000.0, "p99_tpot_ms": 80.0} and plan["ranked"]
    out = capsys.readouterr().out
    assert "== llama-3-8b ==" in out and "== qwen3-8b ==" in out
    status = main(["plan", "--slo", "ttft_p99_ms=3000", "--slo", "p99_ttft_ms=2000", *SMALL, "--out",
                   str(tmp_path / "x")])  # fmt: skip
    assert status == 2 and "one limit with two values" in capsys.readouterr().err


def test_an_unknown_model_or_one_that_fits_nowhere_is_refused(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    assert main(["plan", "--model", "llama-9", *SMALL, "--slo", "ttft_p99_ms=5000", "--out", str(tmp_path / "a")]) == 2
    assert "llama-9" in capsys.readouterr().err
    status = main(["plan", "--model", "llama-3.1-405b", "--hardware", "l40s,a100-80g", *SMALL, "--out",
                   str(tmp_path / "b"), "--slo", "ttft_p99_ms=5000"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2 and "no candidate could run" in err and "l40s:" in err and "a100-80g:" in err


def test_drop_reasons_are_said_once_and_the_answer_says_how_stable_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    plan = _plan(tmp_path, "--model", "llama-3-70b", "--hardware", "h100-sxm", "--tensor-parallel-size", "1,4",
                 "--max-num-seqs", "64,128", "--max-model-len", "4096", *SMALL, "--slo", "ttft_p99_ms=5000",
                 "--repeats", "1")  # fmt: skip
    out = capsys.readouterr().out
    assert "h100-sxm tp1 chunked seqs=64, h100-sxm tp1 chunked seqs=128: does not run" in out
    assert plan["stability"]["seeds"][0] == {"seed": 0, "meets": True, "fewer_meets": False}
    assert len(plan["stability"]["seeds"]) == 2 and ("stable:" in out or "unstable:" in out)


def test_a_closed_loop_of_clients_is_planned_by_clients(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--max-concurrency N plans for N clients: the count found meets the SLO for them and one fewer does not."""
    plan = _plan(tmp_path, "--model", "llama-3-8b", "--max-concurrency", "48", "--num-prompts", "240", "--input-len",
                 "1024", "--output-len", "64", "--slo", "ttft_p99_ms=300", "--jobs", "1", "--repeats", "0")  # fmt: skip
    assert plan["load_unit"] == "clients" and plan["target_rate"] == 48
    best = next(c for c in plan["candidates"] if c["label"] == plan["ranked"][0])
    assert best["achieved"]["clients"] == 48
    at_target = {e["replicas"]: e["meets"] for e in best["evaluations"] if e["rate"] == 48}
    assert at_target[best["replicas"]] and (best["replicas"] == 1 or not at_target[best["replicas"] - 1])
    assert best["replicas"] > 1  # 48 clients' prompts of 1,024 tokens are more than one H100 clears in 300 ms
    capsys.readouterr()


def test_the_figure_names_model_workload_and_slo_and_the_bar_shows_time_left() -> None:
    import io

    from experiments.plan.report import title
    from experiments.progress import Bar

    plan = {"model": "llama-3-70b", "workload": "azure:splitwise_conv.csv n=5000",
            "slo": {"limits": {"p99_ttft_ms": 2000.0, "p99_tpot_ms": 100.0}}}  # fmt: skip
    words = title(plan)
    assert "llama-3-70b" in words and "splitwise_conv" in words and "p99_ttft_ms <= 2000" in words

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    bar = Bar(4, "candidates", screen)
    bar.step()
    bar.step()
    assert "2/4 candidates" in screen.getvalue() and "s left" in screen.getvalue()
    for _ in range(2):
        bar.step()
    bar.step(extra=True)
    bar.close()
    assert "4/4 candidates" in screen.getvalue() and "then 1 more" in screen.getvalue()
    quiet = io.StringIO()  # not a terminal: nothing drawn (pipes and CI see nothing)
    Bar(4, "candidates", quiet).step()
    assert quiet.getvalue() == ""
