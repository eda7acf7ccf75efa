"""The bench's whole-process mode: `ferry run` as a child process, its wall time and peak RSS measured, its output kept
from the terminal, a failing child an error with its stderr. Behaviour only: no timing is asserted."""

from __future__ import annotations

import pytest

from experiments.studies import bench


def test_the_jobs_are_the_ferry_run_command_lines() -> None:
    assert bench.job_of(1000).name == "make run default"
    assert bench.job_of(1000).flags() == ["--model", "llama-3-8b", "--hardware", "h100-sxm", "--policy", "chunked",
                                          "--num-prompts", "1000", "--request-rate", "8", "--input-len", "1024",
                                          "--output-len", "256"]  # fmt: skip
    big = bench.job_of(1_000_000)
    assert (big.name, big.requests) == ("1M requests", 1_000_000)
    assert ["--max-num-seqs", "256"] == big.flags()[-6:-4]
    assert bench.job_of(5).name == "5 requests" and bench.job_of(5).flags()[-2:] == ["--num-prompts", "5"]
    assert bench.sizes("20,1000") == [20, 1000]
    assert bench.engine_names("compiled,reference") == ["compiled", "reference"]


def test_a_tiny_job_runs_as_a_child_and_is_measured(capfd: pytest.CaptureFixture[str]) -> None:
    row = bench.whole_process(bench.job_of(5), "compiled", repeats=1, cold=False, inner=False)
    assert row["job"] == "5 requests" and row["engine"] == "compiled" and row["requests"] == 5
    assert row["warm_s"] > 0 and row["warm_min_s"] <= row["warm_s"] <= row["warm_max_s"]
    assert len(row["warm_runs_s"]) == 1
    assert row["peak_rss_mb"] > 0
    assert row["cold_s"] is None and row["inner_sim_s"] is None
    assert "run --model llama-3-8b" in row["command"] and "--engine compiled" in row["command"]
    assert bench.show_whole(row).startswith("| 5 requests | compiled | - |")
    out = capfd.readouterr()
    assert out.out == "" and out.err == ""  # the child's table and progress were captured, not printed


def test_a_failing_child_raises_with_its_stderr() -> None:
    with pytest.raises(RuntimeError, match="unrecognized arguments: --no-such-flag") as failed:
        bench.timed_run([*bench.ferry_prefix(), "run", "--no-such-flag"])
    assert isinstance(failed.value, bench.ChildFailed) and failed.value.returncode != 0


def test_several_checkouts_take_turns_run_by_run(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[tuple[str, bool]] = []  # (checkout, cold) of each child, in the order they ran

    def fake_run(cmd: list[str], env: dict[str, str] | None = None, cwd: object = None) -> tuple[float, float]:
        assert env is not None
        cold = "ferry-bench-" in env.get("NUMBA_CACHE_DIR", "")  # numba's cache in an empty folder of the bench's
        taken.append((env["PYTHONPATH"].split(":")[0], cold))
        return float(len(taken)), 100.0 + len(taken)

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(bench, "timed_run", fake_run)
    rows = bench.whole_processes(bench.job_of(5), "auto", 2, True, False, None, ["/before", "/after"])
    assert taken == [("/before", True), ("/after", True), ("/before", False), ("/after", False),
                     ("/before", False), ("/after", False), ("/before", False), ("/after", False)]  # fmt: skip
    assert [r["pythonpath"] for r in rows] == ["/before", "/after"]
    assert [r["cold_s"] for r in rows] == [1.0, 2.0]
    assert [r["warm_runs_s"] for r in rows] == [[5.0, 7.0], [6.0, 8.0]]  # the warm-ups (3, 4) not counted
    assert bench.show_whole(rows[1], checkout=True).endswith("| /after |")
