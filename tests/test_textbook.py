"""The seed's figures and queueing theory, on constructed traces with stand-in cost models."""

from __future__ import annotations

import numpy as np
import pytest

from sim.metrics import request_frame, summarize
from sim.request import RequestTable
from sim.workload import synthetic
from tests.helpers import ConstantTimer, LinearTimer, make_requests, run


def test_continuous_admits_request_4_as_soon_as_request_1_ends() -> None:
    # three seats; request 1 (index 0) wants the fewest tokens, request 4 queues behind the full boat
    reqs = make_requests([0, 0, 0, 0], 10, [2, 5, 5, 3])
    rec = run(reqs, ConstantTimer(1.0), policy="continuous", max_num_seqs=3, max_model_len=64)
    f = request_frame(rec)
    assert f.finish_s[0] == 2.0  # prefill ends at 1, one decode step later it is done
    assert f.first_scheduled_s[3] == f.finish_s[0]  # the seat is reused in the very next iteration
    assert (f.first_scheduled_s[:3] == 0).all()


def test_static_waits_for_the_tenth_passenger() -> None:
    reqs = make_requests(np.arange(10.0), 10, 4)
    rec = run(reqs, ConstantTimer(1.0), policy="static", max_batch_size=10, max_model_len=64)
    f = request_frame(rec)
    assert (f.first_scheduled_s == 9.0).all()
    assert rec.iterations.column("start")[0] == 9.0
    s = summarize(rec)
    assert s["idle_while_waiting_s"] == pytest.approx(9.0)  # the boat sat at the dock with passengers
    assert s["gpu_idle_s"] == pytest.approx(9.0)


def test_static_holds_seats_until_the_batch_ends() -> None:
    reqs = make_requests([0, 0, 0], 10, [1, 3, 5])
    rec = run(reqs, ConstantTimer(1.0), policy="static", max_batch_size=3, max_model_len=64)
    f = request_frame(rec)
    assert list(f.finish_s) == [1.0, 3.0, 5.0]
    assert (f.response_s == 5.0).all()  # every response returns when the whole batch ends
    # seat-time: 3 seats x 5 iterations; held: request 0 for 4 iterations, request 1 for 2
    assert summarize(rec)["seat_utilization"] == pytest.approx(1 - 6 / 15)


def test_dynamic_leaves_at_max_delay_with_eight() -> None:
    arrivals = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 5.0, 5.1, 20.0]
    rec = run(
        make_requests(arrivals, 10, 2),
        ConstantTimer(0.5),
        policy="dynamic",
        max_batch_size=10,
        max_delay_ms=1000,
        max_model_len=64,
    )
    it = rec.iterations.to_frame()
    assert it.start[0] == pytest.approx(1.0)  # the oldest passenger has waited max_delay
    assert it.prefill_seqs[0] == 8
    f = request_frame(rec)
    assert f.first_scheduled_s[8] == pytest.approx(6.0)  # the last two leave at 5.0 + 1.0
    # Triton's batcher cannot know the trace has ended: the last one waits out the delay too
    assert f.first_scheduled_s[10] == pytest.approx(21.0)
    # static, by contrast, waits for ten and only then goes (and flushes the last one at the end of the trace)
    static = request_frame(
        run(make_requests(arrivals, 10, 2), ConstantTimer(0.5), policy="static", max_batch_size=10, max_model_len=64)
    )
    assert (static.first_scheduled_s[:10] == 5.1).all()
    assert static.first_scheduled_s[10] == 20.0


def test_dynamic_preferred_batch_size_leaves_at_once() -> None:
    reqs = make_requests([0.0, 0.1, 0.2, 0.3], 10, 2)
    rec = run(
        reqs,
        ConstantTimer(0.5),
        policy="dynamic",
        max_batch_size=8,
        max_delay_ms=1000,
        preferred_batch_sizes=(2,),
        max_model_len=64,
    )
    f = request_frame(rec)
    assert f.first_scheduled_s[0] == pytest.approx(0.1)  # two queued: a preferred size
    assert f.first_scheduled_s[2] == pytest.approx(1.1)  # boat back at 1.1 finds the next two


def test_none_matches_md1_waiting_time_at_low_load() -> None:
    # one-token requests: each is served by one iteration of D seconds; Poisson arrivals at rate lam
    service, rho = 1.0, 0.3
    w = synthetic(40_000, rho / service, 1.0, 8, 1, np.random.default_rng(7), normalize=False)
    reqs = RequestTable(w.arrival_s, w.prompt_tokens, w.output_tokens)
    rec = run(reqs, ConstantTimer(service), policy="none", max_model_len=64)
    wait = (request_frame(rec).queueing_s).mean()
    md1 = rho * service / (2 * (1 - rho))  # Pollaczek-Khinchine with deterministic service
    assert wait == pytest.approx(md1, rel=0.04)


def _loaded_trace() -> RequestTable:
    rng = np.random.default_rng(3)
    w = synthetic(300, 40.0, 1.0, "uniform:50:400", "uniform:5:120", rng)
    return RequestTable(w.arrival_s, w.prompt_tokens, w.output_tokens)


def test_under_load_continuous_beats_static_and_dynamic() -> None:
    timer = LinearTimer(base=0.01, per_token=2e-5, per_ctx=1e-7)  # decode steps cost the base: batching pays
    common = dict(max_model_len=1024, max_batch_size=16, max_num_seqs=16)
    results = {
        name: summarize(run(_loaded_trace(), timer, policy=name, **common, **extra))
        for name, extra in [("static", {}), ("dynamic", {"max_delay_ms": 50.0}), ("continuous", {})]
    }
    cont = results["continuous"]
    for other in ("static", "dynamic"):
        assert cont["mean_ttft_ms"] < results[other]["mean_ttft_ms"]
        assert cont["output_throughput"] > results[other]["output_throughput"]
        assert cont["request_throughput"] > results[other]["request_throughput"]


def test_chunked_prefill_lowers_p99_itl_when_long_prompts_arrive_during_decodes() -> None:
    # eight chatty requests decode for a long time; long prompts land in the middle of their decodes
    arrivals = [0.0] * 8 + [0.5, 1.0, 1.5, 2.0, 2.5]
    prompts = [32] * 8 + [4000] * 5
    outputs = [300] * 8 + [5] * 5
    timer = LinearTimer(base=0.005, per_token=5e-5)
    reqs = lambda: make_requests(arrivals, prompts, outputs)  # noqa: E731
    cont = summarize(run(reqs(), timer, policy="continuous", max_model_len=8192, max_num_seqs=64))
    chunk = summarize(
        run(reqs(), timer, policy="chunked", max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=512)
    )
    assert chunk["p99_itl_ms"] < 0.5 * cont["p99_itl_ms"]
    assert cont["p99_itl_ms"] > 200  # a whole 4000-token prefill stalls every decode
