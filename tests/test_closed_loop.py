"""``--max-concurrency N`` (``sim.workload.clients``): requests wait for one of N slots in the order they were made,
as ``vllm bench serve``'s semaphore has them wait, and a response that ends (or a request that fails) frees its slot.
So the k-th request (from 0) is sent at the later of when it was due and the (k - N)-th end of a request, in the order
the ends came; never more than N are in flight; both engines give the same records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.runner.config import RunConfig
from experiments.runner.simulation import build_workload, run_simulation
from sim.metrics import request_frame
from sim.request import Reason, Status


def _run(fields: dict, engine: str = "auto"):  # noqa: ANN202
    config = RunConfig.model_validate(fields | {"engine": engine})
    return build_workload(RunConfig.model_validate(fields | {"max_concurrency": None})), run_simulation(config)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    clients=st.integers(1, 6),
    rate=st.sampled_from([float("inf"), 2.0, 20.0, 200.0]),
    policy=st.sampled_from(["chunked", "continuous", "static", "none"]),
    seed=st.integers(0, 5),
)
def test_each_request_waits_for_a_slot_in_order(clients: int, rate: float, policy: str, seed: int) -> None:
    fields = {"model": "llama-3-8b", "hardware": "h100-sxm", "policy": policy, "num_prompts": 40, "seed": seed,
              "request_rate": rate, "input_len": "uniform:20:600", "output_len": "uniform:1:60",
              "max_concurrency": clients}  # fmt: skip
    if policy == "static":
        fields["max_batch_size"] = 4
    due, result = _run(fields, "compiled")
    r = result.records.requests
    assert (r.status == Status.FINISHED).all()
    sent, ended = r.arrival, r.released
    np.testing.assert_array_equal(sent[:clients], due.arrival_s[:clients])
    order = np.sort(ended)
    later = np.arange(clients, len(r))
    np.testing.assert_array_equal(sent[later], np.maximum(due.arrival_s[later], order[later - clients]))
    in_flight = [int(((sent <= t) & (ended > t)).sum()) for t in sent]
    assert max(in_flight) <= clients
    reference = run_simulation(RunConfig.model_validate(fields | {"engine": "reference"})).records
    assert request_frame(reference).equals(request_frame(result.records))
    assert reference.iterations.to_frame().equals(result.records.iterations.to_frame())


def test_a_failed_request_frees_its_slot_and_every_request_ends() -> None:
    fields = {"num_prompts": 30, "max_model_len": 600, "input_len": "uniform:100:800", "output_len": 50,
              "max_concurrency": 3, "seed": 2}  # fmt: skip
    _, result = _run(fields)
    r = result.records.requests
    rejected = r.status == Status.REJECTED
    assert rejected.any() and (r.reason[rejected] == Reason.EXCEEDS_MAX_MODEL_LEN).all()
    assert ((r.status == Status.FINISHED) | rejected).all()
    assert result.summary["completed"] + result.summary["failed"] == 30


def test_without_a_rate_it_is_n_clients_and_throughput_grows_with_them() -> None:
    base = {"num_prompts": 64, "input_len": 256, "output_len": 64}
    one = run_simulation(RunConfig.model_validate(base | {"max_concurrency": 1})).summary
    eight = run_simulation(RunConfig.model_validate(base | {"max_concurrency": 8})).summary
    assert eight["request_throughput"] > 4 * one["request_throughput"]  # decode steps batch: nearly 8x
    assert one["mean_ttft_ms"] < eight["mean_ttft_ms"]  # but each prompt shares its iterations


def test_it_is_refused_with_conversations() -> None:
    with pytest.raises(ValueError, match="max_concurrency=4 with turns=3"):
        RunConfig.model_validate({"max_concurrency": 4, "turns": 3})
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        RunConfig.model_validate({"max_concurrency": 0})


def test_a_sweep_takes_max_concurrency_as_an_axis(tmp_path) -> None:  # noqa: ANN001
    import pandas as pd

    from experiments.cli import main

    spec = tmp_path / "sweep.yaml"
    spec.write_text("base: {num_prompts: 60, input_len: 512, output_len: 32}\ngrid:\n  max_concurrency: [1, 8]\n")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "s"), "--jobs", "1"]) == 0
    table = pd.read_parquet(tmp_path / "s" / "results.parquet").sort_values("max_concurrency")
    assert table["max_concurrency"].tolist() == [1, 8]
    assert table["request_throughput"].iloc[1] > 3 * table["request_throughput"].iloc[0]


def test_more_slots_than_requests_sends_each_at_its_time_and_stays_a_closed_loop() -> None:
    """With N >= the requests nothing waits for a slot; it is still N clients (a plan scales clients, not a rate)."""
    from experiments.plan.search import load_unit, scaled, workload_rate

    fields = {"num_prompts": 10, "input_len": 256, "output_len": 16, "max_concurrency": 64}
    config = RunConfig.model_validate(fields)
    w = build_workload(config)
    assert w.after is None and load_unit(w) == "clients" and workload_rate(w) == 64
    assert workload_rate(scaled(w, 0.25)) == 16
    alone = run_simulation(config).summary
    spread = run_simulation(RunConfig.model_validate(fields | {"replicas": 3})).summary
    assert alone["completed"] == spread["completed"] == 10
