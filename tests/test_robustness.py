"""Nothing silently wrong: Ctrl-C, numbers out of range, memory messages that name the value at fault, settings a
policy would ignore, inputs that are not what they claim, output folders, overload, and what `make run` installs.
Every error is one line naming the field and value, and exits 2; Ctrl-C exits 130."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import experiments.commands.run
from experiments.cli import main
from sim.metrics import overload, summarize
from tests.helpers import ConstantTimer, make_requests, run

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "20", "--request-rate", "20"]


def _error(capsys: pytest.CaptureFixture, *args: str) -> str:
    """Run ``ferry ARGS``, expect one error line and status 2 (after the line that says a user's code is imported,
    if one is); return it."""
    assert main(list(args)) == 2
    err = "\n".join(x for x in capsys.readouterr().err.strip().splitlines() if ": importing " not in x)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert re.match(r"ferry [a-z-]+: error: ", err), err
    return err


# ---- 2. Ctrl-C -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("after_s", [0.3, 2.5])
def test_ctrl_c_stops_any_time_with_130_one_line_and_no_summary(tmp_path: Path, after_s: float) -> None:
    """At 0.3 s the command is importing; at 2.5 s numba is loading its cache or the run is under way."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "experiments.cli", "run", *SMALL[:4], "--num-prompts", "300000", "--request-rate",
           "50", "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert re.fullmatch(r"ferry( run)?: interrupted", err.strip()), err
    assert not (out / "summary.json").exists()


def test_an_interrupt_inside_a_string_exec_still_exits_130_under_python_m(tmp_path: Path) -> None:
    """Ctrl-C while dataclasses or numba run a string ``exec`` (module imports) left CPython's 'unhandled interrupt'
    mark set, and ``python -m`` ended the process by SIGINT (-2) after the command had printed its line."""
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import sys\nimport experiments.cli as cli\n"
        "cli.build_parser = lambda *_: exec('raise KeyboardInterrupt', {})\nsys.exit(cli.main([]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip() == "ferry: interrupted"


def test_an_interrupt_swallowed_by_a_callback_still_stops_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A KeyboardInterrupt raised inside a ctypes callback (numba loading its cache) reaches Python only as an
    'unraisable' report; the run used to finish and exit 0 with full results."""
    real = experiments.commands.run.run_simulation

    def swallowed(*args: object, **kwargs: object) -> object:
        result = real(*args, **kwargs)  # type: ignore[arg-type]
        sys.unraisablehook(types.SimpleNamespace(exc_type=KeyboardInterrupt, exc_value=KeyboardInterrupt(),
                                                 exc_traceback=None, err_msg=None, object=None))  # fmt: skip
        return result

    monkeypatch.setattr(experiments.commands.run, "run_simulation", swallowed)
    assert main(["run", *SMALL, "--out", str(tmp_path / "out")]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "ferry run: interrupted"  # and no "Exception ignored ..." report
    assert not (tmp_path / "out" / "summary.json").exists()


# ---- 3. numbers out of range -------------------------------------------------------------------------------------


def test_counts_and_rates_out_of_range_are_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out"
    err = _error(capsys, "run", "--num-prompts", "1000000000000", "--out", str(out))
    assert "1,000,000,000,000 requests are more than ferry simulates in one run" in err
    err = _error(capsys, "run", "--request-rate", "1e-300", "--out", str(out))
    assert "request_rate=1e-300 spreads 1,000 requests over 1e+303 s" in err
    assert not out.exists()  # no empty folder left behind


def test_running_out_of_memory_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def oom(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(experiments.commands.run, "run_simulation", oom)
    assert "out of memory" in _error(capsys, "run", *SMALL, "--out", str(tmp_path))


# ---- 4. memory messages that name the value at fault ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--block-size", "1000000"], "block_size=1,000,000: one KV block needs 122.07 GiB per GPU"),
        (["--policy", "chunked", "--max-num-seqs", "100000000", "--max-num-batched-tokens", "100000000"],
         "the activation reserve for max_num_batched_tokens=100,000,000 and max_num_seqs=100,000,000 needs"),
        (["--num-gpu-blocks-override", "100000000"], "num_gpu_blocks_override=100,000,000 needs 195,312.5 GiB"),
        (["--model", "llama-3-70b", "--hardware", "a100-40g"], "its weights need 131.4 GiB per GPU"),
    ],
)  # fmt: skip
def test_memory_errors_name_the_value_at_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], expected: str
) -> None:
    assert expected in _error(capsys, "run", *SMALL, *args, "--out", str(tmp_path))


def test_a_smaller_blocks_override_is_reported_at_its_own_size(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["run", *SMALL, "--num-gpu-blocks-override", "1000", "--max-model-len", "2048", "--out",
                 str(tmp_path)]) == 0  # fmt: skip
    assert "1,000 blocks x 16 = 16,000 tokens (2.0 GiB/GPU)" in capsys.readouterr().out


def test_an_iteration_larger_than_the_cache_does_not_fit(capsys: pytest.CaptureFixture) -> None:
    assert main(["iteration", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--decode", "100000@1000"]) == 0
    out = capsys.readouterr().out
    assert "memory: DOES NOT FIT: this iteration's sequences hold 100,100,000 KV tokens" in out
    assert main(["iteration", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--decode", "8@100", "--json"]) == 0
    memory = json.loads(capsys.readouterr().out)["memory"]
    assert memory["fits"] is True and memory["iteration_kv_tokens"] == 808


# ---- 5. settings that would be ignored ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--request-rate", "5", "--input-len", "20"],
         "input_len=20, request_rate=5: synthetic-workload setting(s) that --trace ignores"),
        (["--burstiness", "0.5"], "burstiness=0.5: synthetic-workload setting(s) that --trace ignores"),
        (["--lengths-from", "x.csv"], "lengths_from=x.csv: synthetic-workload setting(s) that --trace ignores"),
    ],
)  # fmt: skip
def test_synthetic_flags_with_a_trace_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], expected: str
) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,10,5\n1,10,5\n")
    assert expected in _error(capsys, "run", "--trace", str(trace), *args, "--out", str(tmp_path / "o"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--lengths-max-total", "100"], "lengths_max_total=100 filters the rows of --lengths-from, which is not"),
        (["--trace-time-scale", "2"], "trace_time_scale: setting(s) of a trace replay, given without --trace"),
        (["--policy", "static", "--max-num-batched-tokens", "512"],
         "max_num_batched_tokens=512 does not apply to --policy static: only continuous and chunked read it"),
        (["--policy", "continuous", "--max-batch-size", "4"], "max_batch_size=4 does not apply to --policy continuous"),
        (["--policy", "dynamic", "--kv-watermark", "0.1"], "kv_watermark=0.1 does not apply to --policy dynamic"),
        (["--policy", "chunked", "--max-delay-ms", "5"], "max_delay_ms=5 does not apply to --policy chunked"),
    ],
)  # fmt: skip
def test_flags_the_run_would_ignore_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], expected: str
) -> None:
    assert expected in _error(capsys, "run", *SMALL, *args, "--out", str(tmp_path))


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("num_prompts: true\n", "workload.num_prompts: Input should be a valid integer (got True)"),
        ("num_prompts: 5.0\n", "workload.num_prompts: Input should be a valid integer (got 5.0)"),
        ("policy: continuous\nmix_prefill_decode: 1\n", "scheduler.mix_prefill_decode: Input should be a valid bool"),
        ("num_prompts: 5\nnum_prompts: 6\n", "not valid YAML (line 2): key 'num_prompts' appears twice (lines 1 and"),
        ("scheduler:\n  policy: static\n  policy: dynamic\n", "key 'policy' appears twice"),
    ],
)  # fmt: skip
def test_yaml_types_are_strict_and_keys_unique(
    tmp_path: Path, capsys: pytest.CaptureFixture, yaml_text: str, expected: str
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml_text)
    assert expected in _error(capsys, "run", "--config", str(config), "--out", str(tmp_path / "o"))


def test_a_trace_run_reproduces_from_its_summary_in_another_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resolved config keeps every field (most at their defaults): reading it back must not trip the checks
    above, and its relative trace path is stored resolved."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "t.csv").write_text("arrival_time_s,prompt_tokens,output_tokens\n0,10,5\n1,10,5\n")
    monkeypatch.chdir(tmp_path / "a")
    assert main(["run", "--trace", "t.csv", "--policy", "static", "--out", "r1"]) == 0
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--config", "a/r1/summary.json", "--out", "r2"]) == 0
    assert (tmp_path / "a/r1/requests.csv").read_bytes() == (tmp_path / "r2/requests.csv").read_bytes()
    stored = json.loads((tmp_path / "r2/summary.json").read_text())["config"]["workload"]["trace"]
    assert stored == str((tmp_path / "a" / "t.csv").resolve())


# ---- 6. errors that were tracebacks or riddles ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("os:path", "policy 'os:path' is a module, not a policy"),
        ("collections:OrderedDict", "is a class without from_config and schedule, not a policy"),
        ("os:nothing", "policy 'os:nothing' could not be loaded"),
        (":Class", "expected package.module:Class"),
    ],
)
def test_a_policy_that_is_not_one_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture, policy: str, expected: str
) -> None:
    assert expected in _error(capsys, "run", *SMALL, "--policy", policy, "--out", str(tmp_path))


def test_kv_usage_on_corrupt_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "r"
    assert main(["run", *SMALL, "--out", str(folder)]) == 0
    capsys.readouterr()
    summary = (folder / "summary.json").read_text()
    (folder / "summary.json").write_text('{"config": {}}')
    assert "summary.json: not a summary.json of `ferry run`" in _error(capsys, "kv-usage", str(folder))
    (folder / "summary.json").write_bytes(b"\xff\xfe\x00garbage")
    assert "summary.json: not a summary.json of `ferry run`" in _error(capsys, "kv-usage", str(folder))
    (folder / "summary.json").write_text(summary)
    (folder / "iterations.csv").write_text("a,b\n1,2\n")
    assert "iterations.csv: missing column(s) start, end, kv_blocks_used" in _error(capsys, "kv-usage", str(folder))
    (folder / "iterations.csv").write_text("start,end,kv_blocks_used\n0,1,x\n")
    assert "iterations.csv: row 0: column 'kv_blocks_used' is 'x', not a number" in _error(
        capsys, "kv-usage", str(folder)
    )


def test_validate_kernels_on_corrupt_profiles(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    profile = tmp_path / "compute" / "a100" / "org" / "m" / "mlp.csv"
    profile.parent.mkdir(parents=True)
    real = ROOT.parent / "shared" / "data" / "vidur-profiling" / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf"
    header, row = (real / "mlp.csv").read_text().splitlines()[:2] if real.is_dir() else ("", "")
    profile.write_bytes(os.urandom(64) + b"\xff\xfe")
    assert "mlp.csv: not a readable CSV file" in _error(capsys, "validate-kernels", "--data", str(tmp_path))
    if header:
        names, values = header.split(","), row.split(",")
        values[names.index("n_head")] = "0"
        profile.write_text(header + "\n" + ",".join(values) + "\n")
        assert "mlp.csv: row 0: column 'n_head' is 0, expected a whole number >= 1" in _error(
            capsys, "validate-kernels", "--data", str(tmp_path)
        )
        keep = [i for i, n in enumerate(names) if n != "n_kv_head"]
        profile.write_text(",".join(names[i] for i in keep) + "\n" + ",".join(row.split(",")[i] for i in keep) + "\n")
        assert "mlp.csv: missing column 'n_kv_head'" in _error(capsys, "validate-kernels", "--data", str(tmp_path))


# ---- 7. outputs ------------------------------------------------------------------------------------------------------


def test_out_folders_are_never_a_mix_of_two_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(["run", *SMALL, "--out", str(out)]) == 0
    assert main(["run", *SMALL, "--policy", "static", "--out", str(out)]) == 0  # its own files: replaced, and said
    assert "ferry run: replacing iterations.csv, requests.csv, summary.json in" in capsys.readouterr().err
    (out / "comparison.json").write_text("{}")  # another command's output (ferry validate's)
    (out / "notes.txt").write_text("mine")  # not ferry's: left alone
    err = _error(capsys, "run", *SMALL, "--out", str(out))
    assert "holds another command's outputs (comparison.json)" in err and "--force" in err
    assert main(["run", *SMALL, "--out", str(out), "--force"]) == 0
    assert "replacing comparison.json, iterations.csv" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["iterations.csv", "notes.txt", "requests.csv", "summary.json"]
    assert "is a file, not a folder" in _error(capsys, "run", *SMALL, "--out", str(out / "summary.json"))


def test_figures_say_the_file_they_wrote(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["roofline", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'o.png'}"
    assert (tmp_path / "o.png").is_file() and not (tmp_path / "o").exists()


# ---- 8. overload ---------------------------------------------------------------------------------------------------


def test_an_overloaded_run_says_so() -> None:
    """No batching, 1 s per request: arrivals every 0.5 s outrun it (2/s against 1/s) and the backlog grows by
    1/s; arrivals every 2 s do not."""
    fast = summarize(run(make_requests([0.5 * i for i in range(60)], 10, 1), ConstantTimer(1.0), policy="none"))
    info = fast["overload"]
    assert info is not None
    assert info["arrival_rate"] == pytest.approx(2.0, rel=0.05)
    assert info["backlog_growth_per_s"] == pytest.approx(1.0, rel=0.1)
    assert info["sustained_rate"] == pytest.approx(1.0)
    slow = run(make_requests([2.0 * i for i in range(60)], 10, 1), ConstantTimer(1.0), policy="none")
    assert overload(slow) is None


def test_the_notice_is_printed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["--num-prompts", "600", "--request-rate", "60", "--input-len", "1024", "--output-len", "256"]
    assert main(["run", "--model", "llama-3-8b", "--hardware", "h100-sxm", *args, "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("ferry run: overloaded: requests arrived at") and "req/s of this workload" in err
    assert json.loads((tmp_path / "summary.json").read_text())["overload"]["sustained_rate"] > 0


# ---- 9. what `make run` installs -------------------------------------------------------------------------------------


def test_make_run_installs_no_pytorch_and_ferry_run_needs_none(tmp_path: Path) -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(VENV)/.installed: pyproject.toml", 1)[1].split("\n\n", 1)[0]
    assert "torch" not in recipe and "calibrate" not in recipe
    assert re.search(r"^run: setup( bytecode)?$", makefile, re.M)  # (bytecode: compileall of ferry's own modules)
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any import of torch now fails
        "from experiments.cli import main\n"
        f"raise SystemExit(main(['run', '--num-prompts', '10', '--out', {str(tmp_path / 'o')!r}]))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_record_batches_refuses_a_run_too_long_to_keep(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    err = _error(capsys, "run", "--num-prompts", "60000", "--output-len", "1000", "--record-batches",
                 "--out", str(tmp_path / "r"))  # fmt: skip
    assert "record_batches" in err and "60,000,000" in err and "--num-prompts" in err
    assert not (tmp_path / "r" / "summary.json").exists()
