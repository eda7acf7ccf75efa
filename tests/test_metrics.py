"""Metrics derived from records, checked against hand computations."""

from __future__ import annotations

import pytest

from sim.metrics import parse_goodput, request_frame, summarize
from tests.helpers import ConstantTimer, make_requests, run


def test_latencies_by_hand() -> None:
    # request 0 alone at t=0 (prompt 10, 3 tokens); request 1 arrives at 5 (prompt 10, 2 tokens); 1 s iterations
    rec = run(make_requests([0.0, 5.0], 10, [3, 2]), ConstantTimer(1.0), policy="continuous", max_model_len=64)
    f = request_frame(rec)
    assert list(f.ttft_s) == [1.0, 1.0]
    assert list(f.e2el_s) == [3.0, 2.0]
    assert list(f.tpot_s) == [1.0, 1.0]
    s = summarize(rec)
    assert s["completed"] == 2 and s["failed"] == 0
    assert s["duration"] == 7.0
    assert s["total_input_tokens"] == 20 and s["total_output_tokens"] == 5
    assert s["request_throughput"] == pytest.approx(2 / 7)
    assert s["output_throughput"] == pytest.approx(5 / 7)
    assert s["total_token_throughput"] == pytest.approx(25 / 7)
    assert s["mean_ttft_ms"] == 1000.0 and s["median_e2el_ms"] == 2500.0
    assert s["mean_itl_ms"] == 1000.0  # three gaps of one iteration each
    assert s["num_iterations"] == 5
    assert s["gpu_busy_s"] == 5.0 and s["gpu_idle_s"] == 2.0
    assert s["gpu_idle_fraction"] == pytest.approx(2 / 7)
    assert s["idle_while_waiting_s"] == 0.0  # nobody waited while the GPU was idle
    assert s["seats_offered"] == 256  # max_num_seqs
    assert s["seat_utilization"] == 1 / 256  # one request at a time in 256 seats
    assert s["held_seat_fraction"] == 0.0
    assert s["mean_batch_size"] == 1.0


def test_goodput_counts_requests_within_every_slo() -> None:
    rec = run(make_requests([0.0, 0.0, 0.0], 10, [2, 2, 2]), ConstantTimer(1.0), policy="none", max_model_len=64)
    # TTFTs are 1, 3, 5 s; E2E 2, 4, 6 s
    s = summarize(rec, parse_goodput(["ttft:3000", "e2el:5000"]))
    assert s["request_goodput"] == pytest.approx(2 / 6)


def test_rejections_are_counted_with_their_reason() -> None:
    reqs = make_requests([0, 0, 0, 0], [10, 0, 60, 10], [5, 5, 10, 5])
    s = summarize(run(reqs, ConstantTimer(), policy="continuous", max_model_len=64))
    assert s["completed"] == 2 and s["failed"] == 2
    assert s["rejected_by_reason"] == {"empty": 1, "exceeds_max_model_len": 1}


@pytest.mark.parametrize("spec", ["ttft", "ttft:", "speed:3", "ttft:-1", "ttft:abc"])
def test_bad_goodput_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="goodput"):
        parse_goodput([spec])
