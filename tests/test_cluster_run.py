"""`ferry run` with replicas: the summary's replicas list, the replica columns, replica groups that differ, and a
`--config summary.json` that reproduces a cluster run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from experiments.cli import main
from experiments.runner.config import RunConfig

GROUPS = """model: llama-3-8b
policy: chunked
num_prompts: 300
request_rate: 40
input_len: 1024
output_len: 64
router: least_tokens
replica_groups:
  - {count: 2, hardware: h100-sxm}
  - {count: 1, hardware: a100-80g, max_num_seqs: 64}
"""


def test_a_cluster_run_writes_its_replicas(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["run", "--policy", "chunked", "--num-prompts", "200", "--request-rate", "30", "--input-len", "512",
            "--output-len", "32", "--replicas", "3", "--router", "round_robin", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["num_replicas"] == 3 and s["num_gpus"] == 3 and len(s["replicas"]) == 3
    assert [r["completed"] for r in s["replicas"]] == [67, 67, 66] and s["completed"] == 200
    requests, iterations = pd.read_csv(out / "requests.csv"), pd.read_csv(out / "iterations.csv")
    assert requests.replica.tolist()[:6] == [0, 1, 2, 0, 1, 2]
    assert sorted(iterations.replica.unique()) == [0, 1, 2]
    assert iterations.groupby("replica").size().sum() == s["num_iterations"]


def test_replica_groups_differ_and_the_summary_reproduces_the_run(tmp_path: Path) -> None:
    cfg = tmp_path / "groups.yaml"
    cfg.write_text(GROUPS)
    assert main(["run", "--config", str(cfg), "--out", str(tmp_path / "a")]) == 0
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert [r["hardware"] for r in a["replicas"]] == ["h100-sxm", "h100-sxm", "a100-80g"]
    groups = a["replica_groups"]
    # each group took its own device's `vllm serve` defaults; the A100's own limit as given
    assert groups[0]["scheduler"]["max_num_batched_tokens"] == 8192
    assert groups[1]["scheduler"]["max_num_batched_tokens"] == 2048 and groups[1]["scheduler"]["max_num_seqs"] == 64
    assert main(["run", "--config", str(tmp_path / "a" / "summary.json"), "--out", str(tmp_path / "b")]) == 0
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    for key in ("p99_ttft_ms", "p99_tpot_ms", "duration", "num_iterations"):
        assert a[key] == b[key]
    assert [r["completed"] for r in a["replicas"]] == [r["completed"] for r in b["replicas"]]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"replicas": 2}, "give one or the other"),
        ({"replica_groups": [{"count": 2, "colour": "red"}]}, "colour"),
        ({"replica_groups": [{"count": 0}]}, "count"),
        ({"replica_groups": [{"count": 2, "model": "llama-3-70b"}]}, "model"),
        ({"replica_groups": [{"count": 1, "hardware": "h100-sxm", "max_batch_size": 4}]}, "max_batch_size"),
    ],
)
def test_bad_groups_are_refused_naming_the_field(extra: dict, message: str) -> None:
    data = {"model": "llama-3-8b", "policy": "chunked", "replica_groups": [{"count": 2}]} | extra
    with pytest.raises(ValueError, match=message):
        RunConfig.model_validate(data)


def test_a_router_for_one_replica_is_refused() -> None:
    with pytest.raises(ValueError, match="router only acts"):
        RunConfig.model_validate({"router": "least_kv"})
    with pytest.raises(ValueError, match="unknown router"):
        RunConfig.model_validate({"replicas": 2, "router": "fastest"})
