"""The sustainable-rate search against a known load-latency curve."""

from __future__ import annotations

import pytest

from experiments.studies.ratesearch import max_rate


def _curve(knee: float):
    # flat latency until the knee, then it climbs: the shape of every serving system's load curve
    return lambda rate: {"latency": 1.0 if rate <= knee else 1.0 + 10 * (rate - knee)}


@pytest.mark.parametrize("knee", [0.01, 0.37, 1.0, 3.3, 250.0])
@pytest.mark.parametrize("start", [0.1, 1.0, 40.0])
def test_finds_the_knee_within_tolerance(knee: float, start: float) -> None:
    found = max_rate(_curve(knee), lambda s: s["latency"] <= 1.0, start=start, rel_tol=0.02)
    assert knee / 1.02 <= found.rate <= knee
    assert [r for r, _ in found.curve()] == sorted(r for r, _ in found.tried)


def test_nothing_meets_the_bound() -> None:
    found = max_rate(lambda rate: {"latency": 5.0}, lambda s: s["latency"] <= 1.0, max_evaluations=8)
    assert found.rate == 0.0 and len(found.tried) == 8


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="start"):
        max_rate(_curve(1.0), lambda s: True, start=0)
