"""KV-cache memory bounds every batch: paging and preemption in continuous batching, reservation in static."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import main
from sim.metrics import request_frame, summarize
from sim.request import Status
from tests.helpers import ConstantTimer, make_requests, run

# eight requests whose outputs outgrow a 1024-token cache: 8 x (32 + 200) = 1856 tokens wanted
OVERFLOW = dict(arrivals=[0.0] * 8, prompts=32, outputs=200)
CACHE = dict(kv_blocks=64, block_size=16)


def _overflow(policy: str, **extra: object):
    reqs = make_requests(OVERFLOW["arrivals"], OVERFLOW["prompts"], OVERFLOW["outputs"])
    return reqs, run(reqs, ConstantTimer(0.01), policy=policy, max_model_len=512, max_batch_size=8, **CACHE, **extra)


def test_long_outputs_preempt_continuous_but_static_admits_fewer() -> None:
    reqs, cont = _overflow("continuous")
    s = summarize(cont)
    assert s["total_preemptions"] > 0 and s["recomputed_tokens"] > 0
    assert s["completed"] == 8 and (reqs.generated == 200).all()
    assert s["peak_kv_usage"] == 1.0

    reqs, static = _overflow("static")
    s = summarize(static)
    assert s["total_preemptions"] == 0 and s["completed"] == 8 and (reqs.generated == 200).all()
    # each member reserves 232 tokens = 15 blocks up front: only four of the eight board at once
    assert static.iterations.column("seats").max() == 4
    assert static.iterations.column("kv_blocks_used").max() == 60


def test_preempted_requests_recompute_and_still_make_exactly_their_tokens() -> None:
    reqs, records = _overflow("chunked", max_num_batched_tokens=64)
    f = request_frame(records)
    preempted = f[f.preemptions > 0]
    assert len(preempted) > 0
    assert (preempted.output_tokens == 200).all()
    # a victim drops everything it had computed; the run computes that again
    assert records.requests.recomputed.sum() == f.recomputed_tokens.sum() > 0
    # victims are the most recently admitted: the first request is never preempted
    assert f.preemptions[0] == 0


@pytest.mark.parametrize("policy", ["none", "static", "dynamic", "continuous", "chunked"])
def test_a_cache_that_holds_exactly_one_request_loses_nobody(policy: str) -> None:
    # each request needs 4 blocks of 4 tokens; the cache has 4 blocks
    reqs = make_requests([0.0, 0.0, 0.1, 0.2], 8, 8)
    rec = run(
        reqs,
        ConstantTimer(0.01),
        policy=policy,
        max_model_len=64,
        max_num_batched_tokens=64,
        kv_blocks=4,
        block_size=4,
        max_batch_size=4,
    )
    assert (reqs.status == Status.FINISHED).all()
    assert (reqs.generated == 8).all()
    assert rec.iterations.column("kv_blocks_used").max() <= 4


def test_a_request_larger_than_the_cache_is_rejected_with_that_reason() -> None:
    reqs = make_requests([0.0, 0.0], [8, 60], 8)
    s = summarize(run(reqs, ConstantTimer(), policy="continuous", max_model_len=128, kv_blocks=4, block_size=16))
    assert s["completed"] == 1
    assert s["rejected_by_reason"] == {"exceeds_kv_cache": 1}


def test_static_reserving_max_model_len_boards_fewer_than_reserving_output() -> None:
    reqs = make_requests([0.0] * 8, 16, 16)
    oracle = run(reqs, ConstantTimer(), policy="static", max_model_len=256, max_batch_size=8, kv_blocks=64)
    reqs = make_requests([0.0] * 8, 16, 16)
    worst = run(
        reqs,
        ConstantTimer(),
        policy="static",
        max_model_len=256,
        max_batch_size=8,
        kv_blocks=64,
        kv_reservation="max_model_len",
    )
    assert oracle.iterations.column("seats").max() == 8  # 2 blocks each
    assert worst.iterations.column("seats").max() == 4  # 16 blocks each


def test_continuous_with_up_front_reservation_admits_fewer_and_never_preempts() -> None:
    # Orca before paging: a request is admitted only when its whole prompt + output fits
    reqs, records = _overflow("continuous", kv_reservation="output")
    s = summarize(records)
    assert s["total_preemptions"] == 0 and s["completed"] == 8 and (reqs.generated == 200).all()
    assert records.iterations.column("seats").max() == 4  # 4 x 15 blocks of the 64
    _, worst = _overflow("continuous", kv_reservation="max_model_len")  # 512 tokens = 32 blocks each: two at a time
    assert summarize(worst)["total_preemptions"] == 0 and worst.iterations.column("seats").max() == 2


def test_static_cannot_page() -> None:
    with pytest.raises(ValueError, match="reserves each member's KV up front"):
        _overflow("static", kv_reservation="paged")


def test_kv_usage_command_plots_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    common = [
        "--model",
        "llama-3-8b",
        "--num-prompts",
        "30",
        "--request-rate",
        "inf",
        "--input-len",
        "64",
        "--output-len",
        "200",
        "--num-gpu-blocks-override",
        "100",
        "--max-model-len",
        "512",
    ]
    for policy in ("continuous", "static"):
        assert main(["run", *common, "--policy", policy, "--out", str(tmp_path / policy)]) == 0
    png = tmp_path / "kv.png"
    assert main(["kv-usage", str(tmp_path / "continuous"), str(tmp_path / "static"), "--out", str(png)]) == 0
    assert png.stat().st_size > 10_000
    out = capsys.readouterr().out
    assert "continuous" in out and "static" in out
    rows = [line for line in out.splitlines() if line.startswith(("continuous", "static"))]
    preemptions = {line.split()[0]: int(line.split()[-1].replace(",", "")) for line in rows}
    assert preemptions["continuous"] > 0 and preemptions["static"] == 0
