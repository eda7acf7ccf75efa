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


@pytest.mark.parametrize("knee", [0.01, 0.37, 3.3])
def test_a_hint_below_a_failed_rate_is_taken_and_the_knee_still_found(knee: float) -> None:
    """``lower``: below a failed rate, the search goes to the hint (what an overloaded run carried) when it is under
    half the rate, else to half; either way it ends within tolerance of the knee, and a good hint saves runs."""
    meets = lambda s: s["latency"] <= 1.0  # noqa: E731
    carried = lambda rate, summary: 1.2 * knee  # noqa: E731  (an overloaded replica carries a bit more than the knee)
    halving = max_rate(_curve(knee), meets, start=40.0, rel_tol=0.02)
    hinted = max_rate(_curve(knee), meets, start=40.0, rel_tol=0.02, lower=carried)
    assert knee / 1.02 <= hinted.rate <= knee
    assert hinted.tried[1][0] == pytest.approx(1.2 * knee)  # taken: under half of 40
    assert len(hinted.tried) < len(halving.tried)
    useless = max_rate(_curve(knee), meets, start=40.0, rel_tol=0.02, lower=lambda rate, s: rate)  # not below half
    assert [r for r, _ in useless.tried] == [r for r, _ in halving.tried]
