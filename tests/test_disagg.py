"""Prefill/decode disaggregation: nothing lost, no decode before its KV has arrived, the timing of a small trace
computed by hand, and `ferry run`'s flags, outputs and refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies
from experiments.cli import main
from policies.config import SchedulerConfig
from policies.routing import get_router
from sim.cluster import ReplicaSetup
from sim.disagg import KVLink, Pool, simulate_disaggregated
from sim.kvcache import KVCacheManager
from sim.metrics import request_frame
from sim.request import Status
from tests.helpers import LinearTimer, make_requests

INSTANT = KVLink("nvlink", math.inf, 0.0, 1)


def _pool(n: int, count: int, policy: str = "continuous", blocks: int = 400, **limits: int) -> Pool:
    cfg = SchedulerConfig(policy=policy, max_model_len=4096, **limits)
    setups = [
        ReplicaSetup(policies.get(cfg), LinearTimer(0.01, 1e-3), KVCacheManager(blocks, 16, n), cfg.max_model_len)
        for _ in range(count)
    ]
    return Pool(setups, get_router("round_robin", count, np.random.default_rng(0)))


def test_a_small_trace_takes_the_times_computed_by_hand() -> None:
    """P = D = 1, an instant link, an iteration of ``0.01 + 0.001 * tokens`` seconds: request 0 (arrives 0, prompt
    100, 3 tokens) prefills in 0.11 s; on the decode replica its last prompt token is computed (0.011 s) and gives
    the first token at 0.121, then two decode steps of 0.011 s. Request 1 (arrives 0.5, prompt 50, 2 tokens):
    prefill 0.06 s, first token 0.571, second 0.582."""
    reqs = make_requests([0.0, 0.5], [100, 50], [3, 2])
    d = simulate_disaggregated(reqs, _pool(2, 1), _pool(2, 1), INSTANT, kv_bytes_per_token=1000.0)
    r = d.requests
    np.testing.assert_allclose(d.prefill_end, [0.11, 0.56])
    np.testing.assert_allclose(d.transfer_end, d.prefill_end)
    np.testing.assert_allclose(r.first_token, [0.121, 0.571])
    np.testing.assert_allclose(r.finish, [0.143, 0.582])
    np.testing.assert_allclose(d.transfer_bytes, [100_000.0, 50_000.0])
    assert (r.status == Status.FINISHED).all() and r.generated.tolist() == [3, 2]
    # the decode replica computed one prompt token per request, the prefill replica the rest
    decode_its = d.decode.replicas[0].iterations
    assert decode_its.column("prefill_tokens").sum() == 2
    assert d.prefill.replicas[0].iterations.column("prefill_tokens").sum() == 150


def test_a_slow_link_delays_the_first_token_and_queues_on_the_sender() -> None:
    """Two requests prefilled together on one replica send their KV one after the other over its link."""
    reqs = make_requests([0.0, 0.0], [100, 100], [2, 2])
    link = KVLink("network", 1e6, 0.002, 1)  # 1 MB/s: 100 KB takes 0.1 s
    d = simulate_disaggregated(reqs, _pool(2, 1), _pool(2, 1), link, kv_bytes_per_token=1000.0)
    np.testing.assert_allclose(d.prefill_end, [0.21, 0.21])  # one iteration of 200 tokens
    np.testing.assert_allclose(d.transfer_start, [0.21, 0.312])
    np.testing.assert_allclose(d.transfer_end, [0.312, 0.414])
    assert (d.requests.first_token > d.transfer_end).all()


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 30))
    return {
        "arrivals": np.cumsum(draw(st.lists(st.floats(0, 0.2), min_size=n, max_size=n))),
        "prompts": draw(st.lists(st.integers(0, 700), min_size=n, max_size=n)),
        "outputs": draw(st.lists(st.integers(0, 60), min_size=n, max_size=n)),
        "p": draw(st.integers(1, 3)),
        "d": draw(st.integers(1, 3)),
        "policy": draw(st.sampled_from(["continuous", "chunked"])),
        "blocks": draw(st.integers(8, 200)),
        "bandwidth": draw(st.sampled_from([math.inf, 1e6, 1e8])),
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_nothing_is_lost_and_no_decode_starts_before_its_kv_arrived(sc: dict) -> None:
    reqs = make_requests(sc["arrivals"], sc["prompts"], sc["outputs"])
    n = len(reqs)
    limits = {"max_num_seqs": 8, "max_num_batched_tokens": 512 if sc["policy"] == "chunked" else 4096}
    prefill = _pool(n, sc["p"], sc["policy"], 200, **limits)
    decode = _pool(n, sc["d"], sc["policy"], sc["blocks"], **limits)
    d = simulate_disaggregated(reqs, prefill, decode, KVLink("network", sc["bandwidth"], 1e-4, 1), 100.0)
    r = d.requests
    done, rejected = r.status == Status.FINISHED, r.status == Status.REJECTED
    assert (done | rejected).all()  # every request ends completed or rejected with a reason
    assert (r.reason[rejected] > 0).all()
    assert (r.generated[done] == r.output_wanted[done]).all()  # tokens conserved
    assert (r.generated[rejected] == 0).all()
    assert ((d.decode_replica >= 0) == ~np.isnan(d.transfer_end)).all()
    assert (d.decode_replica[done] >= 0).all()
    # the first token is made on the decode replica, in an iteration that began once the KV had arrived
    assert (r.first_token[done] > d.transfer_end[done]).all()
    assert (d.transfer_start[done] >= d.prefill_end[done]).all()
    assert (r.first_scheduled[done] <= d.prefill_end[done]).all() and (r.arrival[done] <= r.first_scheduled[done]).all()
    # the prefill pool computed every prompt token of what it finished; the decode pool one per request, unless a
    # preemption made it recompute
    sent = ~np.isnan(d.transfer_end)
    pre = sum(int(x.iterations.column("prefill_tokens").sum()) for x in d.prefill.replicas)
    assert pre >= int(r.prompt[sent].sum())
    dec = sum(int(x.iterations.column("prefill_tokens").sum()) for x in d.decode.replicas)
    if not r.preemptions.any():
        assert pre == int(r.prompt[sent].sum())
        assert dec == int(done.sum())
    records = d.merged()
    assert len(records.iterations) == sum(len(x.iterations) for x in d.prefill.replicas + d.decode.replicas)


RUN = ["run", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--num-prompts", "60", "--request-rate", "6",
       "--input-len", "2048", "--output-len", "64", "--policy", "chunked"]  # fmt: skip


def test_ferry_run_disaggregated_writes_pools_and_transfers(tmp_path: Path) -> None:
    out = tmp_path / "d"
    flags = ["--prefill-replicas", "1", "--decode-replicas", "2", "--kv-link", "network", "--goodput", "ttft:200"]
    assert main([*RUN, *flags, "--out", str(out), "--json"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["completed"] == 60 and s["num_replicas"] == 3 and s["num_gpus"] == 3
    assert set(s["pools"]) == {"prefill", "decode"} and s["pools"]["decode"]["replicas"] == 2
    t = s["kv_transfer"]
    # llama-3-8b keeps 128 KiB of KV per token (32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes)
    assert t["link"] == "network" and t["transfers"] == 60 and t["mean_bytes"] == 2048 * 131072
    assert t["p50_wire_ms"] == pytest.approx(20e-3 + 2048 * 131072 / 50e9 * 1e3, rel=1e-9)
    assert s["request_goodput_per_gpu"] == pytest.approx(s["request_goodput"] / 3)
    assert s["kv_total_bytes"] == t["total_bytes"]
    assert s["decode_pool_utilization"] == s["pools"]["decode"]["utilization"]
    assert 0 < s["prefill_pool_utilization"] < 1 and s["kv_mean_transfer_ms"] >= t["p50_wire_ms"] * 0.99
    requests = pd.read_csv(out / "requests.csv")
    assert (requests["ttft_s"] > requests["kv_transfer_end_s"] - requests["arrival_s"]).all()
    assert set(requests["decode_replica"]) <= {1, 2} and set(requests["replica"]) == {0}
    iterations = pd.read_csv(out / "iterations.csv")
    assert set(iterations["pool"]) == {"prefill", "decode"}
    # the summary's config reproduces the run
    again = tmp_path / "again"
    assert main(["run", "--config", str(out / "summary.json"), "--out", str(again), "--json"]) == 0
    assert json.loads((again / "summary.json").read_text())["mean_ttft_ms"] == s["mean_ttft_ms"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prefill-replicas", "1"], "give both"),
        (["--prefill-replicas", "1", "--decode-replicas", "1", "--decode-policy", "static"], "continuous or chunked"),
        (["--prefill-replicas", "1", "--decode-replicas", "1", "--replicas", "2"], "not with replicas"),
        (["--prefill-replicas", "0", "--decode-replicas", "1"], "integer >= 1"),
    ],
)
def test_bad_disaggregation_flags_are_refused_clearly(flags: list[str], message: str, capsys, tmp_path: Path) -> None:  # noqa: ANN001
    assert main([*RUN, *flags, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err


def test_ferry_plan_refuses_a_bad_ratio(capsys, tmp_path: Path) -> None:  # noqa: ANN001
    args = ["plan", "--request-rate", "4", "--slo", "ttft_p99_ms=500", "--disagg-ratios", "1:2,2-1", "--out",
            str(tmp_path / "p")]  # fmt: skip
    assert main(args) == 2
    assert "--disagg-ratios '2-1': expected P:D" in capsys.readouterr().err


def test_a_traces_request_ids_reach_requests_csv(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens,request_id\n0,100,5,a\n0.1,300,3,b\n0.2,50,4,c\n")
    out = tmp_path / "d"
    args = ["run", "--trace", str(trace), "--prefill-replicas", "1", "--decode-replicas", "1", "--out", str(out)]
    assert main(args) == 0
    requests = pd.read_csv(out / "requests.csv")
    assert list(requests["request_id"]) == ["a", "b", "c"]


def test_a_decode_replica_takes_sent_kv_alike_on_both_engines() -> None:
    from sim.engine import simulate
    from sim.kvcache import TransferredKV

    records = {}
    for engine in ("compiled", "reference"):
        reqs = make_requests([0.0, 0.0, 0.0], [10, 40, 25], [2, 5, 3])
        policy = policies.get(SchedulerConfig(policy="continuous", max_model_len=64))
        kv = TransferredKV(20, 4, np.array([9, 39, 24]))
        records[engine] = simulate(reqs, policy, LinearTimer(), kv, 64, engine)
        assert records[engine].engine == engine
        assert (kv.present == 0).all() and kv.used == 0
    # each computes its last prompt token only (one iteration admits all three), then decodes
    assert list(records["compiled"].iterations.column("prefill_tokens"))[0] == 3
    assert request_frame(records["compiled"]).equals(request_frame(records["reference"]))
    assert records["compiled"].iterations.to_frame().equals(records["reference"].iterations.to_frame())
