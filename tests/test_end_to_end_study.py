"""The end-to-end study's sources and its closed-loop client (``experiments.studies.end_to_end``)."""

from __future__ import annotations

import importlib.util
import math

import pytest

from costmodel import strict_yaml
from experiments.runner.config import RunConfig
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
    from experiments.runner.simulation import build_workload, run_simulation
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


@pytest.mark.skipif(
    importlib.util.find_spec("aiconfigurator_core") is None,
    reason="aiconfigurator-core is not installed (pip install 'ferry[measured]'): the silicon rows live in it",
)
def test_silicon_rows_of_a_known_benchmark_run_with_its_clients_lengths_and_server_flags() -> None:
    source = strict_yaml.load(study.PUBLISHED.read_text())["sources"]["nvidia-silicon"]
    bench = source["clients"]["source_file=2026-04-06.csv"]
    assert bench["random_range_ratio"] == 0.8 and all(u.startswith("https://") for u in bench["urls"])
    points = study.silicon_points(source)
    known = [p for p in points if p.seeds > 1]
    assert len(known) == 2 * 441 and len(points) == 2 * 685  # InferenceMAX's Llama-70B rows, both metrics
    assert sum(p.source == "nvidia-silicon (vllm, InferenceMAX)" for p in known) == 2 * 225
    for p in known:
        isl, osl = (int(x) for x in p.label.split()[-2].split("/"))
        assert p.config["input_len"] == f"uniform:{int(0.8 * isl)}:{isl}"
        assert p.config["output_len"] == f"uniform:{int(0.8 * osl)}:{osl}"
        assert p.config["kv_cache_dtype"] == "fp8"
        assert p.source.endswith(", InferenceMAX)")
        if p.source.startswith("nvidia-silicon (vllm,"):
            assert p.config["max_num_seqs"] == p.concurrency and p.config["max_num_batched_tokens"] == 8192
        RunConfig.model_validate(p.config | {"num_prompts": 10 * (p.concurrency or 1)})
    assert all(isinstance(p.config["input_len"], int) and p.seeds == 1 for p in points if p.seeds == 1)


def test_a_point_of_random_lengths_is_the_mean_over_its_seeds() -> None:
    config = {"model": "llama-3-8b", "hardware": "h100-sxm.datasheet", "policy": "chunked",
              "input_len": "uniform:409:512", "output_len": "uniform:51:64"}  # fmt: skip
    runs = [study.closed_loop(config | {"seed": s}, 4)["mean_ttft_ms"] for s in range(2)]
    assert runs[0] != runs[1]  # each seed draws other lengths
    point = study.Point("test", "mean_ttft_ms", 1.0, config, concurrency=4, seeds=2)
    study.predict([point])
    assert point.predicted == pytest.approx(sum(runs) / 2, rel=1e-12)


def test_a_row_whose_numbers_need_more_prefill_than_the_kernels_do_is_flagged() -> None:
    config = {"model": "llama-3-8b", "hardware": "h100-sxm.datasheet", "policy": "chunked", "input_len": 512,
              "output_len": 64}  # fmt: skip
    fast = [study.Point("s", m, v, config, concurrency=8, label="fast") for m, v in
            (("mean_ttft_ms", 1.0), ("mean_tpot_ms", 0.1))]  # fmt: skip
    slow = [study.Point("s", m, v, config, concurrency=8, label="slow") for m, v in
            (("mean_ttft_ms", 1000.0), ("mean_tpot_ms", 100.0))]  # fmt: skip
    study.prefill_demand(fast + slow)
    # 8 clients x 512 tokens every 1 + 63 x 0.1 ms: 561k prompt tokens/s, more than an H100 prefills Llama-3-8B
    assert fast[0].extra["prefill_demand"] > 1 and fast[1].extra == fast[0].extra
    assert slow[0].extra["prefill_demand"] == pytest.approx(fast[0].extra["prefill_demand"] * 7.3 / 7300)
    for p in fast + slow:
        p.predicted = p.published
    result = study.table(fast + slow).set_index("metric")
    assert (result["over_capacity"] == 1).all() and (result["median_abs_error"] == 0).all()
