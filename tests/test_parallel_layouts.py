"""Parallel layouts as vLLM's flags name them, through `ferry run` and `ferry plan`: pipeline stages, data-parallel
ranks as replicas of the cluster, expert parallelism; what is refused; and both engines giving the same records."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.plan.candidates import layouts
from experiments.plan.search import Candidate
from experiments.runner.config import RunConfig
from experiments.runner.simulation import build_replica, run_simulation

SMALL = {"num_prompts": 60, "request_rate": 20.0, "input_len": 512, "output_len": 32, "policy": "chunked", "seed": 2}


def test_the_flags_reach_the_replica(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["run", "--model", "llama-3.1-405b", "--hardware", "h100-sxm", "-tp", "8", "-pp", "2", "--num-prompts",
            "20", "--request-rate", "5", "--input-len", "256", "--output-len", "16", "--policy", "chunked",
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["pipeline_parallel_size"] == 2 and summary["memory"]["pp"] == 2
    assert summary["memory"]["weight_bytes_per_gpu"] < 50 * 2**30  # 811 GB over 16 GPUs, the larger stage
    assert summary["completed"] == 20
    # a config written back reproduces the run (and one without the new fields reads as before)
    again = RunConfig.load(out / "summary.json")
    assert again.parallelism.pp == 2 and again.parallelism.gpus == 16
    plain = RunConfig.model_validate({}).to_jsonable()
    assert not {"pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel"} & set(plain)


def test_data_parallel_ranks_are_replicas_of_the_cluster() -> None:
    fields = {"model": "qwen3-30b-a3b", "hardware": "h100-sxm", "data_parallel_size": 4, "enable_expert_parallel": True,
              "router": "least_requests"}  # fmt: skip
    config = RunConfig.model_validate(fields | SMALL)
    assert config.num_replicas == 4 and config.parallelism.ep == 4
    summary = run_simulation(config).summary
    assert summary["num_replicas"] == 4 and summary["num_gpus"] == 4 and summary["completed"] == 60
    replica = build_replica(config)
    assert replica.cost.layout.local_experts == 32  # 128 experts over 4 GPUs


@pytest.mark.parametrize(
    ("fields", "engine_fields"),
    [({"model": "deepseek-v3", "hardware": "h200", "tensor_parallel_size": 8}, {}),
     ({"model": "deepseek-v3", "hardware": "h200", "data_parallel_size": 8, "enable_expert_parallel": True,
       "router": "round_robin"}, {}),
     ({"model": "gpt-oss-120b", "hardware": "h100-sxm", "max_model_len": 8192}, {}),
     ({"model": "llama-3.1-405b", "hardware": "h100-sxm", "tensor_parallel_size": 8, "pipeline_parallel_size": 2},
      {})],
)  # fmt: skip
def test_both_engines_give_the_same_records(fields: dict, engine_fields: dict) -> None:
    runs = []
    for engine in ("compiled", "reference"):
        summary = run_simulation(RunConfig.model_validate(fields | SMALL | {"engine": engine})).summary
        summary.pop("engine"), summary["config"].pop("engine")
        runs.append(summary)
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"enable_expert_parallel": True}, "enable_expert_parallel spreads the experts over tensor x data-parallel"),
     ({"data_parallel_size": 2, "replica_groups": [{"count": 1}, {"count": 1, "hardware": "a100-80g"}]},
      "data_parallel_size=2 with replica_groups: not modelled"),
     ({"pipeline_parallel_size": 0}, "pipeline_parallel_size")],
)  # fmt: skip
def test_layouts_that_cannot_apply_are_refused_in_one_line(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        RunConfig.model_validate({"model": "qwen3-30b-a3b"} | fields)
    assert message in str(info.value)


def test_plan_layouts_and_their_vllm_flags() -> None:
    args = argparse.Namespace(tensor_parallel_size="1,8", pipeline_parallel_size="1", data_parallel_size="1,8",
                              enable_expert_parallel="off,on")  # fmt: skip
    got = layouts(args)
    assert (1, 1, 1, True) not in got  # expert parallelism over one GPU: skipped when both are asked for
    assert (1, 1, 8, True) in got and (8, 1, 1, True) in got and (8, 1, 8, False) in got
    c = Candidate("h200", 1, "chunked", 256, None, None, 1, 8, True)
    assert c.gpus_per_replica() == 8 and c.layout() == "dp8 ep"
    assert (
        c.vllm_flags() == "--tensor-parallel-size 1 --data-parallel-size 8 --enable-expert-parallel --max-num-seqs 256"
    )
    base = RunConfig.model_validate({"model": "deepseek-v3", "request_rate": 4})
    config = c.config(base, 2, "least_requests", 0)
    assert config.num_replicas == 16 and config.router == "least_requests"


def test_ferry_plan_searches_layouts_and_drops_what_does_not_fit(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["plan", "--model", "qwen3-235b-a22b-fp8", "--request-rate", "2", "--num-prompts", "60", "--input-len",
            "1024", "--output-len", "64", "--slo", "ttft_p99_ms=4000", "tpot_p99_ms=200", "--hardware", "h200",
            "--tensor-parallel-size", "1,8", "--enable-expert-parallel", "off,on", "--jobs", "1",
            "--out", str(tmp_path / "p")]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "layout" in out and "best:" in out and "vllm serve qwen3-235b-a22b-fp8 --tensor-parallel-size" in out
    assert "does not fit on h200 at tp=1" in out  # 235 GB of weights on one GPU
    assert "not a multiple of the fp8 block of 128" in out  # tp 8 without expert parallelism: vLLM refuses it
