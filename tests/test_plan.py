"""`ferry plan`: the answer is the fewest replicas (one fewer fails on the same seed), more load never needs fewer
GPUs, a one-replica plan is `ferry run`'s numbers, candidates that cannot run are dropped with a reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.plan.search import Candidate, plan_candidate, scaled, simulated, workload_rate
from experiments.plan.slo import parse_slo, summary_key
from experiments.runner.config import RunConfig
from experiments.runner.simulation import build_workload, run_simulation

BASE = RunConfig.model_validate(
    {
        "model": "llama-3-8b",
        "workload": {"num_prompts": 600, "request_rate": 60, "input_len": 1024, "output_len": 128, "seed": 1},
    }  # fmt: skip
)
SLO = parse_slo(["ttft_p99_ms=1000", "tpot_p99_ms=60"])
H100 = Candidate("h100-sxm", 1, "chunked")


@pytest.fixture(scope="module")
def workload():  # noqa: ANN201
    return build_workload(BASE)


@pytest.fixture(scope="module")
def plan(workload):  # noqa: ANN001, ANN201
    return plan_candidate(H100, BASE, workload, SLO, router="least_requests")


def test_the_plan_is_minimal(plan, workload) -> None:  # noqa: ANN001
    assert plan.replicas is not None and plan.replicas >= 2
    tried = {e.replicas: e for e in plan.evaluations if e.rate == pytest.approx(60, rel=0.01)}
    assert tried[plan.replicas].meets and not tried[plan.replicas - 1].meets
    # and independently: the same cluster with one replica fewer, simulated again on the same seed, fails
    config = H100.config(BASE, plan.replicas - 1, "least_requests", 0)
    ok, ratios = SLO.check(run_simulation(config, workload=workload).summary)
    assert not ok and max(ratios.values()) > 1


def test_a_higher_rate_never_needs_fewer_gpus(plan, workload) -> None:  # noqa: ANN001
    gpus = [plan.gpus]
    for factor in (2.0, 4.0):
        more = plan_candidate(H100, BASE, scaled(workload, factor), SLO, "least_requests",
                              single_rate=plan.single_replica_rate)  # fmt: skip
        gpus.append(more.gpus)
    assert gpus == sorted(gpus) and gpus[-1] > gpus[0], gpus


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The search's simulations from here on, one entry each."""
    import experiments.plan.search as search

    runs: list[int] = []
    real = search.run_simulation

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(search, "run_simulation", counted)
    return runs


def test_a_run_the_search_asks_for_twice_is_run_once(workload, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """At a tenth of the rate one replica is enough: the count's search asks for the run at the target rate that
    the rate search made; it is recorded twice and run once, and it is what running it again gives."""
    light = scaled(workload, 0.1)
    runs = _counting(monkeypatch)
    result = plan_candidate(H100, BASE, light, SLO, router="least_requests")
    asked = [(e.replicas, e.rate) for e in result.evaluations]
    assert result.replicas == 1 and len(runs) == len(set(asked)) < len(asked)
    target = workload_rate(light)
    twice = [e for e in result.evaluations if (e.replicas, e.rate) == (1, target)]
    assert len(twice) == 2 and twice[0] == twice[1]
    config = H100.config(BASE, 1, "least_requests", 0).model_copy(update={"goodput": SLO.thresholds()})
    summary = run_simulation(config, workload=light, detail=False).summary
    assert twice[0].summary == {k: summary.get(k) for k in twice[0].summary}


def test_a_curve_point_reuses_the_candidates_own_simulations(plan, workload, monkeypatch) -> None:  # noqa: ANN001
    """A plan of the candidate at a lower rate (a point of plan.png's curve) asks for a run the candidate's rate
    search made (one replica at a rate below the target it began with): given the first plan's simulations, it runs
    fewer and plans exactly what it plans without them."""
    target = workload_rate(workload)
    below = [e.rate for e in plan.evaluations if e.replicas == 1 and e.rate < target]
    assert below  # one replica misses the SLO at the target, and the rate search went down
    light = scaled(workload, below[0] / target)
    alone = plan_candidate(H100, BASE, light, SLO, "least_requests", single_rate=plan.single_replica_rate)
    runs = _counting(monkeypatch)
    reused = plan_candidate(H100, BASE, light, SLO, "least_requests", single_rate=plan.single_replica_rate,
                            known=simulated(plan, workload))  # fmt: skip
    assert reused.to_json() == alone.to_json()
    assert len(runs) < len(alone.evaluations)


def test_a_one_replica_plan_agrees_with_ferry_run(workload, tmp_path: Path) -> None:  # noqa: ANN001
    light = scaled(workload, 0.1)  # 6 requests/s: one H100 is enough
    result = plan_candidate(H100, BASE, light, SLO)
    assert result.replicas == 1
    out = tmp_path / "run"
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: llama-3-8b\npolicy: chunked\nhardware: h100-sxm\nnum_prompts: 600\nrequest_rate: 6\n"
                   "input_len: 1024\noutput_len: 128\nseed: 1\n")  # fmt: skip
    assert main(["run", "--config", str(cfg), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in SLO.limits:
        assert result.achieved[key] == pytest.approx(summary[key], rel=1e-9)


def test_candidates_that_cannot_run_are_dropped_with_a_reason(workload) -> None:  # noqa: ANN001
    big = RunConfig.model_validate({"model": "llama-3-70b", "workload": {"num_prompts": 50, "request_rate": 2}})
    dropped = plan_candidate(Candidate("l40s", 1, "chunked"), big, build_workload(big), SLO)
    assert dropped.gpus is None and "does not fit" in dropped.reason
    odd = plan_candidate(Candidate("h100-sxm", 3, "chunked"), BASE, workload, SLO)
    assert odd.gpus is None and "does not run" in odd.reason


def test_an_slo_nobody_meets_says_so_and_shows_the_closest(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["plan", "--model", "llama-3-8b", "--request-rate", "4", "--num-prompts", "80", "--input-len", "2048",
            "--output-len", "16", "--slo", "ttft_p99_ms=5", "--hardware", "h100-sxm,a100-80g", "--out",
            str(tmp_path / "p"), "--jobs", "1"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "no candidate meets the SLO" in out and "closest:" in out and "misses the SLO even lightly loaded" in out
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert plan["ranked"] == [] and all(c["reason"] for c in plan["candidates"])


def test_ferry_plan_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["plan", "--model", "llama-3-8b", "--request-rate", "30", "--num-prompts", "400", "--input-len", "1024",
            "--output-len", "64", "--slo", "ttft_p99_ms=1500", "tpot_p99_ms=80", "--hardware", "h100-sxm,l40s",
            "--tensor-parallel-size", "1,2", "--router", "least_tokens", "--out", str(tmp_path / "p")]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "GPUs" in out and "$/h" in out
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert len(plan["candidates"]) == 4 and plan["ranked"]
    best = next(c for c in plan["candidates"] if c["label"] == plan["ranked"][0])
    assert best["usd_per_hour"] > 0 and best["gpus"] == best["replicas"] * best["candidate"]["tensor_parallel_size"]
    assert (tmp_path / "p" / "plan.png").stat().st_size > 10_000


def test_slo_names_and_errors() -> None:
    assert summary_key("ttft_p99_ms") == summary_key("p99_ttft_ms") == "p99_ttft_ms"
    assert summary_key("tpot_p50_ms") == "median_tpot_ms"
    with pytest.raises(ValueError, match="unknown SLO"):
        parse_slo(["ttft_p95_ms=100"])
    with pytest.raises(ValueError, match="needs --goodput"):
        parse_slo(None, 0.99)
    slo = parse_slo(None, 0.9, ["ttft:500"])
    assert slo.check({"request_throughput": 10.0, "request_goodput": 9.5, "failed": 0})[0]
    assert not slo.check({"request_throughput": 10.0, "request_goodput": 8.5, "failed": 0})[0]


def test_a_disaggregated_candidate_is_minimal_in_units_and_counts_its_gpus(capsys: pytest.CaptureFixture) -> None:
    """A P:D candidate counts units of P + D replicas: the plan's count meets the SLO and one unit fewer does not;
    the table says how many of each and which layout wins."""
    light = RunConfig.model_validate(
        {
            "model": "llama-3-8b",
            "workload": {"num_prompts": 200, "request_rate": 12, "input_len": 1024, "output_len": 64, "seed": 1},
        }  # fmt: skip
    )
    work = build_workload(light)
    split = Candidate("h100-sxm", 1, "chunked", pd_ratio=(1, 2))
    assert split.label() == "h100-sxm tp1 chunked 1P:2D"
    config = split.config(light, 2, "least_requests", 0)
    assert config.disaggregation is not None and config.disaggregation.count("decode") == 4
    result = plan_candidate(split, light, work, SLO, router="least_requests")
    assert result.replicas is not None and result.gpus == 3 * result.replicas
    tried = {e.replicas: e for e in result.evaluations if e.rate == pytest.approx(12, rel=0.01)}
    assert tried[result.replicas].meets
    assert result.replicas == 1 or not tried[result.replicas - 1].meets
    from experiments.plan import report

    together = plan_candidate(Candidate("h100-sxm", 1, "chunked"), light, work, SLO, router="least_requests")
    table = report.table([result, together], {}, SLO)
    assert f"{result.replicas}P+{2 * result.replicas}D" in table and " wins: best aggregated " in table


def test_a_profile_of_a_priced_device_costs_what_the_device_costs(plan) -> None:  # noqa: ANN001
    from dataclasses import replace

    from costmodel.prices import load_prices
    from experiments.plan.report import economics

    prices = load_prices()
    fitted = economics(plan, prices)
    assert fitted["usd_per_hour"] is not None and fitted["usd_per_hour"] > 0
    for name in ("h100-sxm.datasheet", "h100-sxm.sglang"):  # no entry of their own: the device's price
        other = replace(plan, candidate=replace(plan.candidate, hardware=name))
        assert economics(other, prices)["usd_per_hour"] == fitted["usd_per_hour"]
    unpriced = replace(plan, candidate=replace(plan.candidate, hardware="my-gpu"))
    assert economics(unpriced, prices)["usd_per_hour"] is None
