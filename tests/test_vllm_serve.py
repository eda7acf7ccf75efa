"""`ferry probe` and `ferry validate --url` against a real `vllm serve` (vLLM 0.32.0 for CPUs, from ROOT/.venv-vllm):
a random-weight Llama (`tiny_model_vllm.py`, the wide preset: 62 M parameters) served with chunked prefill, 32 seats,
a 256-token budget, bf16, eager (`experiments.vllm_check.real_serve.SETTINGS`), on localhost, its engine core under
SCHED_IDLE (`serve_vllm.py`: its busy-waiting would otherwise starve this client) and warmed up with one prompt of
every length to its budget, shortest first, for at most WARM_UP_S seconds (`VllmServer.warm_up`: all 256 lengths
where the kernels are fast; about 1-70 on an AVX2-only CPU, where all of them take five minutes and a first visit
costs no more than the noise).

What must hold: the probe reads the server's limits where vLLM states them (`/server_info`, with its development
endpoints on) and says it does not know them where it does not (vLLM's defaults: its card and `/metrics` state neither
limit), never guessing; it fits the engine's time per step beyond the base profile's kernels (`per_iteration_s`), a
share of a decode step that depends on the CPU, and that profile predicts the gaps it was fitted on and, as
`--hardware`, the decode step; `ferry validate --url` of a trace the probe never sent then has its median ITL, and its
median TTFT with the request handling the probe measured, within ITL_BOUND and TTFT_BOUND of the server's. Repeated
runs of the study on this 2-core machine (docs/checks/vllm-serve.md) put the wide preset's median ITL within 10%
and its TTFT within 30%; one run here is one draw from that spread, so the bounds leave it room. The probe and the
replay are timed on a machine that other work may share and whose own speed swings (by up to 2x within minutes on
the AVX2 VM, with nothing else running): a bound that fails is measured again, probe and replay, and fails at the
second failure on a machine that kept its speed, saying how busy the machine was and what the engine's one-request
decode step (``VllmServer.decode_step_ms``, vLLM's own inter-token latency) read before and after the probe and
the replay (tests/contention.py); the bounds do not move.

Should the server still hold tokens back and send them at once (a client starved on a loaded machine), what must hold
is that ferry says so: the probe's check of its fit warns that its ITL is not to be trusted, with the requests held
back counted, and validate counts the responses that came in one burst; the bounds are then not asserted.

Skips (with the reason) when ROOT/.venv-vllm is missing, unless FERRY_REQUIRE_VLLM=1 (CI), where it fails. ~4 min
on a CPU with AVX-512, ~10 min on an AVX2-only one (its probe stops at its 300 s budget).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from costmodel import load_hardware
from costmodel.model_spec import load_model
from costmodel.roofline import CostModel
from costmodel.shape import IterationShape
from experiments.cli import main
from experiments.vllm_check.real_serve import DEFAULT_VENV, VllmServer, build_model, probe_args, validate_args
from tests.contention import Contention, Gauge, measured

pytest.importorskip("httpx")

if not (DEFAULT_VENV / "bin" / "python").exists():
    why = f"no vLLM venv at {DEFAULT_VENV} (make vllm-venv builds it)"
    if os.environ.get("FERRY_REQUIRE_VLLM") == "1":
        raise RuntimeError(f"FERRY_REQUIRE_VLLM=1 but {why}")
    pytest.skip(why, allow_module_level=True)

# prompts up to 512 tokens: on a CPU without AVX-512 a step of this model's bf16 kernels is several times slower than
# with it, and 16 prompts of 2,048 tokens would not see a first token within the probe's timeout
PROBE = ["--decode-tokens", "48", "--max-concurrency", "16", "--batch-sizes", "2,4,8,16", "--repeats", "2",
         "--max-prompt", "512", "--budget-s", "300"]  # fmt: skip
TRACE = ["--num-prompts", "40", "--request-rate", "4", "--input-len", "uniform:32:384", "--output-len",
         "uniform:16:96", "--seed", "7"]  # fmt: skip
WARM_UP_S = 30.0  # warm_up's budget (s): every length where the kernels are fast, the short ones elsewhere
PRESET = "wide"  # the wider model: ~10 ms steps, which this machine's timing noise moves less than the tiny one's 3 ms
ITL_BOUND = 0.3
TTFT_BOUND = 0.45
FITTED_GAPS = 0.25  # the probe's own check (experiments.real.probe_report.GAP_CHECK_MEDIAN)
MIN_GAPS = 10  # fewer fitted token gaps: the server held its tokens back (a loaded machine), which the probe says
MIN_STREAMED = 10  # fewer of the replay's responses streamed (not held back): nothing to compare, which it says


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("vllm-model") / PRESET, PRESET)


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    with VllmServer(model, tmp_path_factory.mktemp("vllm") / "serve.log") as running:
        running.warm_up(budget_s=WARM_UP_S)
        yield running


@pytest.fixture(scope="module")
def gauge(server: VllmServer) -> Gauge:
    """The engine's own speed, read before and after each probe and replay (tests/contention.py)."""
    return Gauge(server.decode_step_ms, "the engine's one-request decode step")


@dataclass
class Probed:
    """A profile the probe wrote, and how busy the machine was with other work while it measured."""

    profile: Path
    load: Contention


def probe(server: VllmServer, folder: Path, gauge: Gauge) -> Probed:
    folder.mkdir(parents=True, exist_ok=True)
    profile = folder / "vllm.yaml"
    with Contention(own=served(server), gauge=gauge) as load:
        assert main(probe_args(server, profile, *PROBE)) == 0
    return Probed(profile, load)


def served(server: VllmServer) -> list[int]:
    """The server's pid: its process tree is the measurement's own CPU time, beside this process (the client)."""
    assert server.proc is not None
    return [server.proc.pid]


@pytest.fixture(scope="module")
def probed(server: VllmServer, gauge: Gauge, tmp_path_factory: pytest.TempPathFactory) -> Probed:
    return probe(server, tmp_path_factory.mktemp("probe"), gauge)


def test_probe_learns_the_limits_and_fits_the_host_time_per_step(
    server: VllmServer, gauge: Gauge, probed: Probed, tmp_path: Path
) -> None:
    """What the server states is read whatever the load; the fit's timing is checked by ``check_fit``, measured
    again (a new probe) should it fail (tests/contention.py)."""
    report = json.loads(probed.profile.with_name("vllm.probe.json").read_text())
    limits = report["server_limits"]
    assert (limits["max_num_batched_tokens"], limits["max_num_seqs"], limits["block_size"]) == (256, 32, 32)
    assert limits["sources"]["max_num_seqs"].endswith("/server_info")
    assert report["max_num_batched_tokens"] == 256 and report["max_num_seqs"] == 32

    def fitted(attempt: int) -> Path:
        return probed.profile if attempt == 0 else probe(server, tmp_path / f"probe-{attempt}", gauge).profile

    def checked(profile: Path) -> None:
        check_fit(server, profile)

    measured(fitted, checked, "the probe's fit", [probed.load], served(server), gauge)


def check_fit(server: VllmServer, profile: Path) -> None:
    """The probe's fit of the engine's time per step, against the gaps it was fitted on and those it held out."""
    report = json.loads(profile.with_name("vllm.probe.json").read_text())
    host = report["host"]
    errors = {r["kind"]: r for r in report["held_out_error"]}
    assert errors["ttft"]["held_out"] >= 3 and errors["ttft"]["median"] < 0.25, errors
    if untrusted(report):  # a loaded machine: the server held tokens back, and the probe says not to trust it
        return
    assert report["notes"] == [], report["notes"]  # limits known, and the fit passed its own check
    # the engine's host time is a real part of a decode step; how large depends on the CPU (93% of it with AVX-512,
    # where the kernels are fast; 32-49% on an AVX2-only one, whose bf16 kernels are slow), so only its range is held.
    # It is the one-sequence step's host time, per step and per sequence together: on the AVX2 CPU a step grows
    # about linearly with its sequences (~12 ms each), and how the fit splits the host time between the two moves
    # with the machine's speed (two probes of one server: 0.16 + 5.16 ms of a 16.8 ms step, then 8.59 + 0 of 20.7)
    one_seq_host = host["per_iteration_s"] + host["per_sequence_s"]
    assert 0.05 < one_seq_host / host["decode_step_s"] < 1.0, host
    assert host["fitted_gap_error"]["median"] < FITTED_GAPS, host
    assert errors["decode"]["median"] < 0.25, errors
    # the profile carries it: a decode step as `ferry run --hardware` times it is the one measured
    hw = load_hardware(str(profile))
    assert hw.overheads.per_iteration_s.value == pytest.approx(host["per_iteration_s"])
    cost = CostModel(load_model(str(server.model_dir / "config.json")), hw, dtype="bfloat16")
    one = cost.iteration_time(IterationShape.of(decode=[(1, 128)]))
    assert abs(one / host["decode_step_s"] - 1) < 0.25, (one, host["decode_step_s"])
    settings = hw.provenance.settings or {}
    # one handling time per load: idle, light (2 running) and heavy (15). Idle and light, a few ms, may fit as none
    # where a prompt chunk's kernels take a hundred (an AVX2-only CPU); into 15 running decodes it is tens of ms
    assert float(settings["client_s"]) >= 0
    busy = [float(t) for t in str(settings["client_busy_s"]).split(",")]
    seqs = [int(n) for n in str(settings["client_busy_seqs"]).split(",")]
    assert len(busy) == len(seqs) >= 1 and all(t >= 0 for t in busy) and all(n > 0 for n in seqs)
    assert busy[seqs.index(max(seqs))] > 0, (busy, seqs)


def untrusted(report: dict) -> bool:
    """Whether the probe said its token gaps are not to be trusted; then the server must have held tokens back
    (what vLLM does on a loaded 2-core machine: see the module docstring), which the report says too."""
    warned = [n for n in report["notes"] if "token gaps" in n and ("not to be trusted" in n or "barely" in n)]
    if warned or report["host"]["fitted_gap_error"]["n"] < MIN_GAPS:
        assert warned and report["held_back"] > 0, report
        return True
    return False


def test_validate_url_of_a_held_out_trace_matches_the_server(
    server: VllmServer, gauge: Gauge, probed: Probed, tmp_path: Path
) -> None:
    """The replay against the server, with the profile the probe fitted; should the bounds fail, the probe and the
    replay are measured again (tests/contention.py: twice on a steady machine, more where its speed changed)."""

    def replay(attempt: int) -> tuple[Path, Path]:
        profile = probed.profile if attempt == 0 else probe(server, tmp_path / f"probe-{attempt}", gauge).profile
        dest = tmp_path / f"validate-{attempt}"
        assert main(validate_args(server, profile, dest, *TRACE)) == 0
        return profile, dest

    measured(replay, check_replay, "the held-out replay", [probed.load], served(server), gauge)


def check_replay(replayed: tuple[Path, Path]) -> None:
    """What the replay compared: the prompts exact, the limits read, and its medians within the bounds."""
    profile, dest = replayed
    comparison = json.loads((dest / "comparison.json").read_text())
    assert comparison["prompt_tokens_exact"] == 40 and "failed" not in comparison
    assert comparison["server_limits"]["max_num_seqs"] == 32 and "states max_num" not in comparison.get("note", "")
    held = comparison["held_back"]
    if held["n"]:  # some responses came in one burst, which it says; the others are compared
        assert "in one burst" in comparison["note"] and comparison["streamed"]["n"] == held["of"] - held["n"]
        itl, ttft = comparison["streamed"]["median_itl_ms"], comparison["streamed"]["median_ttft_ms"]
    else:
        itl, ttft = comparison["metrics"]["median_itl_ms"], comparison["with_handling"]["median_ttft_ms"]
    assert comparison["client_handling_ms"] >= 0 and comparison["client_busy_handling_ms"] > 0
    report = json.loads(profile.with_name("vllm.probe.json").read_text())
    if held["of"] - held["n"] < MIN_STREAMED or untrusted(report):  # nothing to compare: a loaded machine
        return
    assert abs(itl["rel_error"]) < ITL_BOUND, (itl, held)
    assert abs(ttft["rel_error"]) < TTFT_BOUND, (ttft, held)


def test_probe_does_not_guess_limits_vllm_does_not_state(
    server: VllmServer, model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Last: a second server, as `vllm serve` runs by default (no /server_info), probed at the smallest size that
    reads its limits and fits a profile (16 requests: ~10 s where the full probe's 40 took 75)."""
    server.stop()
    with VllmServer(model, tmp_path / "serve.log", dev_mode=False) as plain:
        profile = tmp_path / "plain.yaml"
        small = ["--max-requests", "16", "--max-prompt", "64", "--decode-tokens", "16", "--batch-sizes", "2,4",
                 "--repeats", "1", "--idle-pauses", "none", "--max-concurrency", "16", "--budget-s", "300"]  # fmt: skip
        assert main(probe_args(plain, profile, *small)) == 0
    printed = capsys.readouterr().out
    report = json.loads(profile.with_name("plain.probe.json").read_text())
    limits = report["server_limits"]
    assert limits["max_num_batched_tokens"] is None and limits["max_num_seqs"] is None
    assert limits["block_size"] == 32 and "cache_config_info" in limits["sources"]["block_size"]  # /metrics has it
    assert report["max_num_batched_tokens"] is None and report["max_num_seqs"] is None
    (note,) = report["notes"]  # one line: both limits unknown, not guessed, and where vLLM states them
    assert "token budget is unknown" in note and "max_num_seqs is unknown" in note and "does not guess" in note
    assert all(note in printed for note in report["notes"])
