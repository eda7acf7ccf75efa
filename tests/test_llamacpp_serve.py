"""`ferry probe` and `ferry validate --url` against a real llama.cpp `llama-server` (built by `make llamacpp` from
PyPI's llama-cpp-python 0.3.36 sdist, ROOT/.llamacpp): a random-weight Llama in GGUF (`tiny_model_gguf.py`, the wide
preset: 62 M parameters, bfloat16) served with `experiments.llamacpp_check.real_server.SETTINGS` (16 slots of 4096
tokens in one KV buffer, continuous batching, a 256-token batch, one kernel thread) on localhost, warmed up
(`LlamaServer.warm_up`).

What must hold: the server is what its settings say (`/props`: 16 slots of 4096 tokens); the probe reads its seats
where llama-server states them (`/props`, `total_slots`) and takes the batch size it states nowhere from its flag,
with no warning; every response streams one chunk per token (llama-server's closing chunk, which carries the usage,
is no token: none is counted as coalesced) and the server counts the prompts' token ids exactly as sent; the fit
passes its own check on the token gaps it was fitted on; `ferry validate --url` of a light trace the probe never
sent then has its median ITL, and its median TTFT with the request handling the probe measured, within ITL_BOUND
and TTFT_BOUND of the server's. Repeated runs of the study (docs/checks/llamacpp-serve.md) put the wide model's
light trace within 12% on median ITL and 30% on median TTFT; one run here is one draw on a 2-core machine that
other work may share, so the bounds leave it room, and a bound that fails (tests/contention.py) is measured again,
probe and replay, before it fails saying how busy the machine was and how fast: the server's one-request decode step
(``LlamaServer.decode_step_ms``, as the server times it) is read before and after the probe and the replay, and an
attempt over which it moved by more than ``DRIFT`` (30%) compared two machines: this VM's speed swings by up to 2x
within minutes with nothing else running (a quiet run's replay missed its median ITL by -43% after a probe at 8.7 ms
a decode step; the probe and replay that followed, by +99%), so such an attempt is measured again rather than
counted as one of the two failures that fail the test.

Two choices keep that draw from failing by chance on a slower CPU (an AVX2 core without bfloat16 arithmetic, where
this model's prefill takes about 1.5 ms a token and a decode step 11 ms), measured there:
- The probe times seven batch sizes, so that four are fitted (2, 4, 8, 16; 3, 6 and 11 held out): one batch
  experiment's steps move by up to a quarter with the machine's own speed, which varies that much with nothing else
  running (a 128 MB sum took 10.8-16.8 ms over 40 s), and with two fitted batch sizes the fitted time per sequence
  went from 0.3 to 3.6 ms probe to probe, and the replays' median ITL (prompts to 512) from -36% to +63%; with
  four it was 1.5-2.9 ms in three probes, each followed by the light replay below: within -11% to +12% of the
  server's median ITL.
- Prompts go up to 256 tokens: up to 512 at one request a second kept 4-7 requests in flight there (a median TTFT
  near 0.9 s), a load near the server's limit, where a few percent on a step moves the medians by a third; to 256
  about two are in flight, the light load the bounds are about.

Should the client still be starved and read tokens in bursts (`client.held_back`), what must hold is that ferry
says so; the bounds are then not asserted.

Skips (with the reason) when ROOT/.llamacpp is missing, unless FERRY_REQUIRE_LLAMACPP=1 (CI), where it fails. About
three minutes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.llamacpp_check.real_server import (
    BATCH,
    DEFAULT_SERVER,
    SLOT_CONTEXT,
    SLOTS,
    LlamaServer,
    build_model,
    probe_args,
    validate_args,
)
from tests.contention import Contention, Gauge, measured

pytest.importorskip("httpx")

if not (DEFAULT_SERVER / "bin" / "llama-server").exists():
    why = f"no llama-server at {DEFAULT_SERVER} (make llamacpp builds it)"
    if os.environ.get("FERRY_REQUIRE_LLAMACPP") == "1":
        raise RuntimeError(f"FERRY_REQUIRE_LLAMACPP=1 but {why}")
    pytest.skip(why, allow_module_level=True)

PROBE = ["--decode-tokens", "48", "--batch-sizes", "2,3,4,6,8,11,16", "--repeats", "2", "--budget-s", "300"]
REQUESTS = 30
TRACE = ["--num-prompts", str(REQUESTS), "--request-rate", "1", "--input-len", "uniform:32:256", "--output-len",
         "uniform:16:128", "--seed", "7"]  # fmt: skip
PRESET = "wide"  # ~5 ms steps, which this machine's timing noise moves less than the tiny model's 0.5 ms
ITL_BOUND = 0.35
TTFT_BOUND = 0.45
FITTED_GAPS = 0.25  # the probe's own check (experiments.real.probe_report.GAP_CHECK_MEDIAN)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    model = build_model(tmp_path_factory.mktemp("gguf") / PRESET, PRESET)
    with LlamaServer(model, tmp_path_factory.mktemp("llamacpp") / "serve.log") as running:
        running.warm_up()
        yield running


@pytest.fixture(scope="module")
def gauge(server: LlamaServer) -> Gauge:
    """The server's own speed, read before and after each probe and replay (tests/contention.py)."""
    return Gauge(server.decode_step_ms, "the server's one-request decode step")


@dataclass
class Probed:
    """A profile the probe wrote, and how busy the machine was with other work while it measured."""

    profile: Path
    load: Contention


def probe(server: LlamaServer, folder: Path, gauge: Gauge) -> Probed:
    folder.mkdir(parents=True, exist_ok=True)
    profile = folder / "llamacpp.yaml"
    with Contention(own=served(server), gauge=gauge) as load:
        assert main(probe_args(server, profile, *PROBE)) == 0
    return Probed(profile, load)


def served(server: LlamaServer) -> list[int]:
    """The server's pid: its process tree is the measurement's own CPU time, beside this process (the client)."""
    assert server.proc is not None
    return [server.proc.pid]


@pytest.fixture(scope="module")
def probed(server: LlamaServer, gauge: Gauge, tmp_path_factory: pytest.TempPathFactory) -> Probed:
    return probe(server, tmp_path_factory.mktemp("probe"), gauge)


def test_the_server_is_what_its_settings_say(server: LlamaServer) -> None:
    props = server.get("props")
    assert props["total_slots"] == SLOTS and props["default_generation_settings"]["n_ctx"] == SLOT_CONTEXT
    slots = server.get("slots")
    assert len(slots) == SLOTS and {s["n_ctx"] for s in slots} == {SLOT_CONTEXT}


def test_probe_reads_the_slots_and_fits_the_steps(
    server: LlamaServer, gauge: Gauge, probed: Probed, tmp_path: Path
) -> None:
    """What the server states is read whatever the load; the fit's timing is checked by ``check_fit``, measured
    again (a new probe) should it fail (tests/contention.py)."""
    report = json.loads(probed.profile.with_name("llamacpp.probe.json").read_text())
    limits = report["server_limits"]
    assert limits["max_num_seqs"] == SLOTS and limits["sources"]["max_num_seqs"].endswith("/props")
    assert limits["max_num_batched_tokens"] is None  # stated nowhere: the flag gives it
    assert report["max_num_batched_tokens"] == BATCH and report["max_num_seqs"] == SLOTS

    def fitted(attempt: int) -> Path:
        return probed.profile if attempt == 0 else probe(server, tmp_path / f"probe-{attempt}", gauge).profile

    measured(fitted, check_fit, "the probe's fit", [probed.load], served(server), gauge)


def check_fit(profile: Path) -> None:
    """The probe's fit of the server's time per step, against the gaps it was fitted on and those it held out."""
    report = json.loads(profile.with_name("llamacpp.probe.json").read_text())
    errors = {r["kind"]: r for r in report["held_out_error"]}
    assert errors["ttft"]["held_out"] >= 3 and errors["ttft"]["median"] < 0.25, errors
    if report["held_back"]:  # a starved client: the probe must say its gaps are not to be trusted
        assert any("token gaps" in n for n in report["notes"]), report["notes"]
        return
    assert report["notes"] == [], report["notes"]  # the limits known, and the fit passed its own check
    host = report["host"]
    assert host["fitted_gap_error"]["median"] < FITTED_GAPS and host["fitted_gap_error"]["n"] >= 10, host
    assert errors["decode"]["median"] < 0.25, errors


def test_validate_url_of_a_held_out_trace_matches_the_server(
    server: LlamaServer, gauge: Gauge, probed: Probed, tmp_path: Path
) -> None:
    """The replay against the server, with the profile the probe fitted; should the bounds fail, the probe and the
    replay are measured again (tests/contention.py: twice on a steady machine, more where its speed changed)."""

    def replay(attempt: int) -> Path:
        profile = probed.profile if attempt == 0 else probe(server, tmp_path / f"probe-{attempt}", gauge).profile
        dest = tmp_path / f"validate-{attempt}"
        assert main(validate_args(server, profile, dest, *TRACE)) == 0
        return dest

    measured(replay, check_replay, "the held-out replay", [probed.load], served(server), gauge)


def check_replay(dest: Path) -> None:
    """What the replay compared: the prompts exact, one chunk per token, the slots read, and its medians within the
    bounds."""
    comparison = json.loads((dest / "comparison.json").read_text())
    assert comparison["prompt_tokens_exact"] == REQUESTS and "failed" not in comparison
    assert comparison["coalesced"]["n"] == 0  # one chunk per token, the closing chunk no token
    assert comparison["server_limits"]["max_num_seqs"] == SLOTS and "states max_num" not in comparison.get("note", "")
    if comparison["held_back"]["n"]:  # tokens read in bursts, which it says; nothing to bound
        assert "in one burst" in comparison["note"]
        return
    itl, ttft = comparison["metrics"]["median_itl_ms"], comparison["with_handling"]["median_ttft_ms"]
    assert abs(itl["rel_error"]) < ITL_BOUND, itl
    assert abs(ttft["rel_error"]) < TTFT_BOUND, ttft
