"""The end-to-end study's sources and its closed-loop client (``experiments.studies.end_to_end``)."""

from __future__ import annotations

import math

import pytest

from costmodel import strict_yaml
from experiments.config import RunConfig
from experiments.studies import end_to_end as study


def test_every_published_point_is_a_setting_ferry_runs_with_its_source_cited() -> None:
    sources = strict_yaml.load(study.PUBLISHED.read_text())["sources"]
    for name, source in sources.items():
        assert source["url"].startswith("https://") and source["settings"] and source["measured"], name
    points = study.trtllm_points(sources["trtllm-perf-overview"])
    assert len(points) == 42 and all(p.published > 0 for p in points)
    for p in points:
        config = RunConfig.model_validate(p.config)  # a bad model, profile or format would be refused here
        assert config.workload.request_rate == math.inf and config.kv_cache_dtype == "fp8"


def test_the_open_loop_keeps_its_concurrency_in_flight() -> None:
    config = {"model": "llama-3-8b", "hardware": "h100-sxm.datasheet", "policy": "chunked", "input_len": 512,
              "output_len": 64}  # fmt: skip
    summary = study.open_loop(config, 8)
    in_flight = summary["request_throughput"] * summary["mean_e2el_ms"] / 1e3
    assert in_flight == pytest.approx(8, rel=0.15)  # arrivals at the rate found keep ~8 requests in flight
    assert summary["completed"] == 80


def test_a_closed_loop_client_sends_its_next_request_when_its_last_has_ended() -> None:
    from experiments.simulation import build_workload, run_simulation
    from sim.metrics import request_frame

    config = {"model": "llama-3-8b", "hardware": "h100-sxm.datasheet", "policy": "chunked", "input_len": 512,
              "output_len": 64, "num_prompts": 12, "request_rate": math.inf, "engine": "reference"}  # fmt: skip
    run = RunConfig.model_validate(config)
    looped = study.clients(build_workload(run), 3)
    assert list(looped.after) == [-1, -1, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8] and not looped.think_s.any()
    requests = request_frame(run_simulation(run, looped).records)
    requests = requests.assign(row=requests["request_id"].astype(int)).sort_values("row")
    arrive, done = requests["arrival_s"].to_numpy(), requests["response_s"].to_numpy()
    assert (arrive[:3] == 0).all() and arrive[3:] == pytest.approx(done[:-3])  # each the moment its last ended
    summary = study.closed_loop(config, 3, rounds=4)
    assert summary["completed"] == 12 and summary["request_throughput"] > 0
    # a round of 3 requests arriving together queues their prefills: a mean TTFT above one prompt's alone
    alone = run_simulation(RunConfig.model_validate(config | {"num_prompts": 1})).summary["mean_ttft_ms"]
    assert summary["mean_ttft_ms"] > alone
