"""Bad input to `ferry plan`, `ferry run` and `ferry sweep` is refused before any work, in one line naming the field
or flag and the value, with status 2: values no candidate could run with, settings that would be ignored, a limit or
a key given twice, sweep files that would run nothing or the same point twice, `where` filters that fail. And code a
file names (``module:Class``) is imported only with --allow-import, saying so in one line."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.sweep.spec import SweepSpec, load_spec

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["plan", "--model", "llama-3-8b", "--num-prompts", "100", "--request-rate", "5", "--slo", "ttft_p99_ms=2000"]
RUN = ["run", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "20", "--request-rate", "20"]


def _error(capsys: pytest.CaptureFixture, *args: str) -> str:
    """Run ``ferry ARGS``: status 2 and one error line, no traceback and no pydantic dump; return the line."""
    assert main(list(args)) == 2
    lines = [x for x in capsys.readouterr().err.strip().splitlines() if ": importing " not in x]
    assert len(lines) == 1, lines
    assert re.match(r"ferry [a-z-]+: error: ", lines[0]) and "validation error" not in lines[0], lines[0]
    return lines[0]


# ---- ferry plan --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size 0: Input should be greater than or equal to 1"),
        (["--tensor-parallel-size", "1,0"], "--tensor-parallel-size 0:"),
        (["--max-num-seqs", "-4"], "--max-num-seqs -4: Input should be greater than or equal to 1"),
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens 0:"),
        (["--router", "nearest"], "--router 'nearest': unknown router"),  # one replica would do: checked anyway
        (["--router", "os:system"], "router 'os:system' is a builtin_function_or_method, not a router"),
        (["--router", "prefix_affinity", "--no-enable-prefix-caching"], "give --enable-prefix-caching"),
        (["--request-rate", "inf"], "arrivals all fall at one instant"),
        (["--hardware", "h100-sxm,h100-sxn"], "unknown hardware 'h100-sxn'"),
        (["--policy", "chunky"], "--policy 'chunky': unknown policy"),
        (["--disagg-ratios="], "--disagg-ratios: empty list"),
        (["--disagg-ratios", "1:1", "--policy", "static"], "disaggregated pools run continuous or chunked"),
        (["--slo", "ttft_p99_ms=100", "p99_ttft_ms=5000"], "one limit with two values; give it once"),
        (["--min-goodput", "0.9", "--goodput", "ttft:100", "ttft:900"], "ttft is given twice"),
    ],
)  # fmt: skip
def test_plan_refuses_what_no_candidate_could_run_with(
    tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], expected: str
) -> None:
    started = time.perf_counter()
    err = _error(capsys, *PLAN, *flags, "--out", str(tmp_path / "plan"))
    assert expected in err
    assert time.perf_counter() - started < 30  # refused before the search (which takes seconds per candidate)
    assert not (tmp_path / "plan").exists()


def test_plan_refuses_a_trace_that_arrives_all_at_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + "0,100,10\n" * 20)
    args = ["plan", "--trace", str(trace), "--slo", "ttft_p99_ms=2000", "--out", str(tmp_path / "plan")]
    assert "arrivals all fall at one instant" in _error(capsys, *args)


def test_a_dropped_candidate_has_a_one_line_reason(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A combination of valid values that a candidate refuses (a budget below its seats) is dropped, not an error,
    and its reason is one line (it was a multi-line pydantic dump)."""
    out = tmp_path / "plan"
    args = [*PLAN, "--max-num-seqs", "512", "--max-num-batched-tokens", "256,8192", "--jobs", "1", "--json"]
    assert main([*args, "--out", str(out)]) == 0
    import json

    plan = json.loads((out / "plan.json").read_text())
    reasons = [c["reason"] for c in plan["candidates"] if c["reason"]]
    assert len(reasons) == 1 and "\n" not in reasons[0]
    assert "max_num_batched_tokens=256 must be greater than or equal to max_num_seqs=512" in reasons[0]


# ---- ferry run -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--think-time", "5"], "think_time_s=5 is the pause between the turns of a conversation; give --turns 2"),
        (["--turns", "1", "--think-time", "5"], "think_time_s=5"),
        (["--num-prefix-groups", "4"], "num_prefix_groups=4 counts shared prompts of --prefix-len tokens"),
        (["--replicas", "2", "--router", "prefix_affinity", "--no-enable-prefix-caching"],
         "give --enable-prefix-caching"),
        (["--goodput", "ttft:100", "ttft:200"], "--goodput 'ttft:200': ttft is given twice"),
    ],
)  # fmt: skip
def test_run_refuses_settings_that_cannot_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], expected: str
) -> None:
    assert expected in _error(capsys, *RUN, *flags, "--out", str(tmp_path / "out"))


def test_what_the_refusals_leave_alone_still_runs(tmp_path: Path) -> None:
    args = [*RUN, "--policy", "chunked", "--turns", "2", "--think-time", "1", "--prefix-len", "64",
            "--num-prefix-groups", "2", "--enable-prefix-caching"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    args = [*RUN, "--policy", "chunked", "--replicas", "2", "--router", "prefix_affinity", "--enable-prefix-caching"]
    assert main([*args, "--out", str(tmp_path / "b")]) == 0


def test_a_prices_file_listing_a_gpu_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    prices = tmp_path / "p.yaml"
    entry = '{usd_per_gpu_hour: %s, source: mine, date: "2026-10"}'
    prices.write_text(f"h100-sxm: {entry % 2}\nh200: {entry % 3}\nh100-sxm: {entry % 1}\n")
    err = _error(capsys, *PLAN, "--prices", str(prices), "--out", str(tmp_path / "plan"))
    assert "key 'h100-sxm' appears twice (lines 1 and 3)" in err


# ---- sweep files -------------------------------------------------------------------------------------------------

BASE = "base: {model: llama-3-8b, policy: chunked, num_prompts: 20, request_rate: 10}\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE + "grid: {max_num_seqs: [8, 16]}\nseeds: 0\n", "seeds: 0 replicas of each point; give a count >= 1"),
        (BASE + "grid: {max_num_seqs: [8, 16]}\nseeds: -2\n", "seeds: -2 replicas"),
        (BASE + "seeds: []\n", "seeds: an empty list"),
        (BASE + "seeds: [1, 1]\n", "seeds: 1 is listed twice"),
        (BASE + "grid: {max_num_seqs: [8, 16, 8]}\n", "axis 'max_num_seqs' lists 8 twice"),
        (BASE + "zip: {max_num_seqs: [8, 8], seed: [1, 2]}\n", "axis 'max_num_seqs' lists 8 twice"),
        (BASE + "grid: {max_num_seqs: [8]}\nbase: {model: llama-3-70b}\n", "key 'base' appears twice (lines 1 and 3)"),
        ("", "the sweep file is empty"),
        ("# nothing but a comment\n", "the sweep file is empty"),
        (BASE + "grid: {max_num_seqs: [8, 16]}\nwhere: \"__builtins__ == 1\"\n",
         "where '__builtins__ == 1': __builtins__ is not a swept parameter (the names are max_num_seqs)"),
        (BASE + "grid: {max_num_seqs: [8, 16]}\nwhere: \"max_num_batched_tokens > 1\"\n",
         "max_num_batched_tokens is not a swept parameter"),
        (BASE + "grid: {policy: [chunked, continuous]}\nwhere: \"policy > 3\"\n",
         "where 'policy > 3': TypeError: '>' not supported between instances of 'str' and 'int' (at policy='chunked')"),
        (BASE + "grid: {max_num_seqs: [8, 16]}\nwhere: \"max_num_seqs / 0 > 1\"\n",
         "ZeroDivisionError: division by zero (at max_num_seqs=8)"),
        (BASE + "grid: {max_num_seqs: [8]}\nwhere: \"" + "+".join(["max_num_seqs"] * 20_000) + " > 1\"\n",
         "where: an expression of 260,003 characters; at most 10,000 (got 'max_num_seqs+max_num_seqs+"),
        (BASE + "grid: {x: [8]}\nwhere: \"" + "+".join(["x"] * 4000) + " > 1\"\n", "nested too deeply"),
        (BASE + "grid: {max_num_seqs: [8, 16]}\nzip: {request_rate: [10, 10.0]}\n", "are the same run"),
    ],
)  # fmt: skip
def test_a_sweep_file_that_would_run_nothing_or_the_same_point_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, text: str, expected: str
) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(text)
    err = _error(capsys, "sweep", str(spec), "--out", str(tmp_path / "out"))
    assert expected in err
    assert not (tmp_path / "out").exists()


def test_a_huge_grid_is_refused_from_its_count_before_it_is_built() -> None:
    """10^7 points took 18 s and 3.4 GB before the limit was checked; the count is a product."""
    started = time.perf_counter()
    axes = {"a": list(range(100)), "b": list(range(100)), "c": list(range(100)), "d": list(range(10))}
    with pytest.raises(ValueError, match="10,000,000 points before the where filter, more than 1,000,000"):
        SweepSpec.model_validate({"grid": axes})
    assert time.perf_counter() - started < 5


def test_a_sweep_file_may_still_leave_out_what_it_does_not_vary(tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(BASE)  # one point: the base
    assert load_spec(spec).count() == 1


# ---- code that files name ------------------------------------------------------------------------------------------

POLICY_MODULE = """from pathlib import Path
Path(__file__).with_name("imported.txt").write_text("top-level code ran")
from policies.continuous import ContinuousBatching as Mine
"""
ROUTER_MODULE = """class WrongInit:
    def __init__(self):
        pass
    def route(self, load, prompt, output):
        return 0
"""


def _ferry(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "userpol.py").write_text(POLICY_MODULE)
    (tmp_path / "userrouter.py").write_text(ROUTER_MODULE)
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "experiments.cli", *args], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip


def test_code_a_config_file_names_is_imported_only_with_allow_import(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("policy: userpol:Mine\nnum_prompts: 10\nrequest_rate: 10\n")
    refused = _ferry(tmp_path, "run", "--config", str(config), "--out", "a")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip() == (
        f"ferry run: error: scheduler.policy='userpol:Mine' in {config} names Python code to import (its module runs "
        "when imported); ferry imports code named in a file only with --allow-import"
    )
    assert not (tmp_path / "imported.txt").exists()  # its top-level code never ran
    allowed = _ferry(tmp_path, "run", "--config", str(config), "--out", "a", "--allow-import")
    assert allowed.returncode == 0, allowed.stderr
    assert (f"ferry run: importing userpol:Mine (policy, from scheduler.policy in {config}, --allow-import)"
            in allowed.stderr.splitlines())  # fmt: skip
    assert (tmp_path / "imported.txt").exists()
    # the run's summary.json names it too: replaying it is reading a file
    (tmp_path / "imported.txt").unlink()
    replay = _ferry(tmp_path, "run", "--config", "a/summary.json", "--out", "b")
    assert replay.returncode == 2 and "in a/summary.json names Python code to import" in replay.stderr
    assert not (tmp_path / "imported.txt").exists()
    # given as a flag it is the user's own choice, said in one line
    flag = _ferry(tmp_path, "run", "--config", "a/summary.json", "--policy", "userpol:Mine", "--out", "b")
    assert flag.returncode == 0, flag.stderr
    assert "ferry run: importing userpol:Mine (policy, from --policy)" in flag.stderr.splitlines()


def test_code_a_sweep_file_names_is_imported_only_with_allow_import(tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(BASE + "grid: {policy: [chunked, 'userpol:Mine']}\n")
    refused = _ferry(tmp_path, "sweep", str(spec), "--out", "s", "--jobs", "1")
    assert refused.returncode == 2 and "ferry imports code named in a file only with --allow-import" in refused.stderr
    assert not (tmp_path / "imported.txt").exists() and not (tmp_path / "s").exists()
    allowed = _ferry(tmp_path, "sweep", str(spec), "--out", "s", "--jobs", "1", "--allow-import")
    assert allowed.returncode == 0, allowed.stderr
    assert sum(": importing userpol:Mine" in x for x in allowed.stderr.splitlines()) == 1


def test_a_router_class_with_the_wrong_constructor_is_one_line(tmp_path: Path) -> None:
    done = _ferry(tmp_path, *RUN[:-2], "--replicas", "2", "--router", "userrouter:WrongInit", "--out", "a")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        "ferry run: importing userrouter:WrongInit (router, from --router)",
        "ferry run: error: router 'userrouter:WrongInit' cannot be built as WrongInit(num_replicas, rng): "
        "WrongInit.__init__() takes 1 positional argument but 3 were given",
    ]
