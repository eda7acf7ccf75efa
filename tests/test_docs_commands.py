"""Every command the documentation shows runs, and exits as the docs say (0 unless a `# exits N` comment says
otherwise): each `ferry ...` and `python -m experiments...` line of a ```bash block in README.md and docs/**/*.md
(`make` targets and other programs are not run), made smaller where a flag allows (fewer requests, one scenario, a
smaller grid, no extra seeds), each page's commands in order in a folder of their own, so that one may read what an
earlier one wrote (`ferry kv-usage` the runs above it). A YAML block whose first line is `# NAME.yaml` is written
there as NAME.yaml first, and `cp SRC DST` lines are carried out. The two servers (`ferry serve`, `ferry explore`) are
started on a free port, must print their address, and are stopped with Ctrl-C.

A command skipped says why: it needs what a test machine has not got (a GPU, a running vLLM server, the public data
`make data` fetches into ../shared/data, the network), or it is a study of minutes whose own test runs it smaller
(`SKIPS`). The rest run for real: about two minutes on 2 cores with warm caches (the first run after an install
also compiles the numba kernels)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from experiments.children import ends_with_this_process

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"  # the public data `make data` fetches: ../shared/data beside the clone
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Command:
    page: str  # the page, relative to the repository's root
    line: int  # the line of its block's opening fence
    words: tuple[str, ...]  # the command as a shell would split it, `.venv/bin/` dropped
    status: int  # the exit status the docs give it (`# exits N`), 0 otherwise

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {shlex.join(self.words)}"


def _pages() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.relative_to(ROOT / "docs").parts)
    return [ROOT / "README.md", *docs]


def _blocks(path: Path) -> list[tuple[str, int, list[str]]]:
    """(language, line of the opening fence, body lines) of each fenced block."""
    out: list[tuple[str, int, list[str]]] = []
    lang: str | None = None
    start, body = 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if lang is None and line.startswith("```"):
            m = FENCE.match(line)
            lang, start, body = (m.group(1) if m else "?"), number, []
        elif lang is not None and line.startswith("```"):
            out.append((lang, start, body))
            lang = None
        elif lang is not None:
            body.append(line)
    return out


def _commands(path: Path) -> list[Command]:
    page = str(path.relative_to(ROOT))
    out = []
    for lang, start, body in _blocks(path):
        if lang not in ("bash", "sh", "shell"):
            continue
        for line in "\n".join(body).replace("\\\n", " ").splitlines():
            exits = re.search(r"#.*\bexits (\d+)", line)
            words = shlex.split(line, comments=True)
            if words and words[0].startswith(".venv/bin/"):
                words[0] = words[0].removeprefix(".venv/bin/")
            study = (
                words[:1] in (["python"], ["python3"]) and words[1:2] == ["-m"] and words[2].startswith("experiments.")
            )
            runnable = words and (words[0] in ("ferry", "cp") or study)
            if runnable:
                out.append(Command(page, start, tuple(words), int(exits.group(1)) if exits else 0))
    return out


def _named_files(path: Path) -> dict[str, str]:
    """The YAML blocks of a page whose first line names them (`# sweep.yaml`), by name."""
    files = {}
    for lang, _, body in _blocks(path):
        m = re.match(r"#\s*([\w.-]+\.ya?ml)\b", body[0]) if lang in ("yaml", "yml") and body else None
        if m:
            files[m.group(1)] = "\n".join(body) + "\n"
    return files


COMMANDS = [c for p in _pages() for c in _commands(p)]

# (a piece of the command, why it does not run here); the first that matches wins
SKIPS = (
    ("--device cuda", "needs a CUDA GPU"),
    ("h200.calibrated.yaml", "reads the profile a GPU's calibration writes"),
    ("http://localhost:8000", "needs a `vllm serve` at localhost:8000 (tests/test_vllm_serve.py probes a real one)"),
    ("h100.vllm.yaml", "reads the profile a probe of a running `vllm serve` writes"),
    ("--from-iterations iterations.csv", "needs an engine's iteration log (tests/test_from_iterations.py fits one)"),
    ("experiments.studies.vllm_serve_probe", "starts vLLM servers for minutes (tests/test_vllm_serve.py: a short one)"),
    ("experiments.studies.engine_probe", "starts real servers for minutes (tests/test_llamacpp_serve.py: a short one)"),
)
DATA = "../shared/data"
# (a piece of the command, what breaks it): documented commands that fail today, each with its cause; strict, so that
# the test says so the day one runs again and its line here can go
BROKEN: tuple[tuple[str, str], ...] = ()


def _skip_reason(cmd: Command) -> str | None:
    text = shlex.join(cmd.words)
    for piece, reason in SKIPS:
        if piece in text:
            return reason
    if "experiments.vllm_check.conformance" in cmd.words and not (ROOT / ".venv-vllm").exists():
        return "needs vLLM's own venv, .venv-vllm (make vllm-venv; make test builds it)"
    if "fetch-data" in cmd.words and not (SHARED / "data").is_dir():
        return "downloads from GitHub; no network here, and no local copy of ../shared/data to fetch from"
    reads_data = DATA in text or "sweeps/sarathi" in text
    if reads_data and not (SHARED / "data" / "traces").is_dir():
        return "reads the public data in ../shared/data, which is not here (make data fetches it)"
    for word in cmd.words:
        if word.startswith(DATA) and not (ROOT / word).exists():
            return f"reads {word}, which is not here (make data fetches it)"
    return None


def _set(words: list[str], flag: str, value: str, cap: int | None = None) -> None:
    """``flag value`` in place: the smaller of its value and ``cap`` when given, added when absent."""
    if flag in words:
        k = words.index(flag) + 1
        words[k] = str(min(int(words[k]), cap)) if cap is not None else value
    else:
        words += [flag, value]


def _shrunk(cmd: Command) -> list[str]:
    """The command at a test's size: the flags that set how much work it does, smaller; nothing else changed."""
    words = list(cmd.words)
    if words[0] == "ferry":
        sub = words[1]
        cap = {"run": 40, "plan": 60, "validate": 8}.get(sub)
        if cap is not None:
            _set(words, "--num-prompts", str(cap), cap=cap)
        if sub == "plan":
            _set(words, "--repeats", "0")
        if sub == "sweep" and "--dry-run" not in words:
            _set(words, "--jobs", "1")
        if sub == "teach" and "--list" not in words and "--scenario" not in words:
            words += ["--scenario", "aligned"]
        if sub == "calibrate" and "--quick" in words:
            words[words.index("--quick")] = "--grid=smoke"
        if sub == "fetch-data":
            _set(words, "--dest", "fetched")
            words += ["--mirror", (SHARED / "data").as_uri()]
        if sub in ("serve", "explore"):
            _set(words, "--port", "0")
    elif words[0] in ("python", "python3"):
        words[0] = sys.executable
        module = words[2]
        small = {
            "experiments.vllm_check.conformance": ("--cases", "6"),
            "experiments.studies.disaggregation": ("--seconds", "2"),
            "experiments.studies.paged_vs_static": ("--batch-sizes", "8"),
            "experiments.studies.prefix_caching": ("--sessions", "20"),
        }
        if module in small:
            _set(words, *small[module])
        if module == "experiments.studies.disaggregation":
            _set(words, "--gpus", "2")
        if module == "experiments.studies.paged_vs_static":
            _set(words, "--num-prompts", "100")
        if module == "experiments.studies.kernel_fits":
            words += ["--systems", "h100_sxm", "--frameworks", "vllm"]
        if module == "experiments.studies.end_to_end":
            words += ["--quick", "--sources", "trtllm-perf-overview"]
    return words


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One working folder per page, beside a link to ../shared (so that `../shared/data` reads the same files), with
    links to the repository's folders the commands name (`experiments/sweeps/...`) and the page's named files."""
    top = tmp_path_factory.mktemp("docs")
    if SHARED.is_dir():
        (top / "shared").symlink_to(SHARED)
    out = {}
    for page in _pages():
        folder = top / re.sub(r"\W", "_", str(page.relative_to(ROOT)))
        folder.mkdir()
        for name in ("experiments", "hwprofiles"):
            (folder / name).symlink_to(ROOT / name)
        for name, text in _named_files(page).items():
            (folder / name).write_text(text)
        out[str(page.relative_to(ROOT))] = folder
    return out


def _run_server(words: list[str], folder: Path) -> int:
    """Start a server, wait for its address, stop it with Ctrl-C; its exit status (0 or 130 is a clean stop)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.cli", *words[1:]], cwd=folder, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, preexec_fn=ends_with_this_process(),
    )  # fmt: skip
    seen = []
    try:
        deadline = time.monotonic() + 180
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "http://" in line:
                proc.send_signal(signal.SIGINT)
                rest = proc.communicate(timeout=60)[0]
                assert proc.returncode in (0, 130), "".join(seen) + rest
                return 0
        raise AssertionError("the server never printed its address:\n" + "".join(seen))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("cmd", COMMANDS, ids=[f"{c.page}:{c.line}:{' '.join(c.words[:3])}" for c in COMMANDS])
def test_documented_command_runs(
    cmd: Command,
    folders: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    reason = _skip_reason(cmd)
    if reason:
        pytest.skip(reason)
    text = shlex.join(cmd.words)
    for piece, cause in BROKEN:
        if piece in text:
            request.applymarker(pytest.mark.xfail(reason=cause, strict=True))
    folder = folders[cmd.page]
    words = _shrunk(cmd)
    if words[0] == "cp":
        shutil.copy(folder / words[1], folder / words[2])
        return
    if words[0] == "ferry" and words[1] in ("serve", "explore"):
        pytest.importorskip("starlette", reason="the serve extra is not installed (pip install -e '.[serve]')")
        if words[1] == "serve":
            pytest.importorskip("torch", reason="ferry serve runs the real model: pip install -e '.[calibrate]'")
        assert _run_server(words, folder) == cmd.status
        return
    if words[0] == "ferry":
        from experiments.cli import main

        monkeypatch.chdir(folder)
        code = main(words[1:])
        out = capsys.readouterr()
        assert code == cmd.status, f"{cmd}\nran as: {shlex.join(words)}\n{out.out[-2000:]}{out.err[-2000:]}"
        return
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(words, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == cmd.status, (
        f"{cmd}\nran as: {shlex.join(words)}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    )


def test_the_docs_show_commands() -> None:
    """The extraction finds the commands (a change of fence or prompt style would otherwise skip them all)."""
    pages = {c.page for c in COMMANDS}
    assert len(COMMANDS) > 50 and {"README.md", "docs/guide/run.md", "docs/guide/plan.md"} <= pages
