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


def test_the_closed_loop_keeps_its_concurrency_in_flight() -> None:
    config = {"model": "llama-3-8b", "hardware": "h100-sxm.datasheet", "policy": "chunked", "input_len": 512,
              "output_len": 64, "burstiness": 100.0}  # fmt: skip
    summary = study.closed_loop(config, 8)
    in_flight = summary["request_throughput"] * summary["mean_e2el_ms"] / 1e3
    assert in_flight == pytest.approx(8, rel=0.15)  # arrivals at the rate found keep ~8 requests in flight
    assert summary["completed"] == 80
