"""Disaggregated prefill/decode against the same GPUs aggregated with chunked prefill: goodput per GPU (DistServe).

DistServe's measure: the highest request rate at which at least 90% of requests meet both a TTFT and a TPOT SLO,
divided by the GPUs serving it. On ``--gpus`` GPUs (one replica each) this study finds that rate (bisection,
``experiments.studies.ratesearch``) for every layout: all GPUs aggregated with chunked prefill at vLLM's token budget
and at a small one (the usual cure for prefill stalling decodes), and every prefill:decode split disaggregated over
NVLink. It does so for three workloads:

- ``strict``: long prompts, a tight TTFT and a tight TPOT. Aggregated, every prefill chunk rides in an iteration with
  the decodes and stretches their token gap; disaggregated, decode iterations hold decodes only.
- ``loose``: the same requests under a loose SLO: interference no longer breaks it, and aggregation uses every GPU
  for both phases.
- ``short``: short prompts under the tight SLO: prefill is a small share of the work and a prefill pool idles.

    python -m experiments.studies.disaggregation [--gpus 8] [--seconds 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from experiments.runner.config import RunConfig
from experiments.runner.simulation import run_simulation
from experiments.studies.ratesearch import max_rate

BASE = {"model": "llama-3-8b", "hardware": "h100-sxm", "policy": "chunked", "max_model_len": 8192, "seed": 0}
WORKLOADS = {
    "strict": {"input_len": "lognormal:median=3000,sigma=0.4,max=6000", "output_len": "uniform:64:512",
               "slo": {"ttft": 200.0, "tpot": 12.0}},
    "loose": {"input_len": "lognormal:median=3000,sigma=0.4,max=6000", "output_len": "uniform:64:512",
              "slo": {"ttft": 2000.0, "tpot": 100.0}},
    "short": {"input_len": "uniform:32:256", "output_len": "uniform:64:512", "slo": {"ttft": 200.0, "tpot": 12.0}},
}  # fmt: skip
# tokens per iteration of aggregated layouts that keep prefill chunks small (besides vLLM's default, 8192 here)
SMALL_BUDGETS = (2048, 512, 256)
ATTAINMENT = 0.9  # share of requests that must meet both SLOs
MIN_PROMPTS = 200  # requests of an evaluation at a low rate


def layouts(gpus: int) -> dict[str, dict[str, Any]]:
    """Every way to serve with ``gpus`` GPUs, one replica per GPU: aggregated (vLLM's token budget and smaller
    ones) and each P:D."""
    out: dict[str, dict[str, Any]] = {f"aggregated x{gpus}": {"replicas": gpus, "router": "least_requests"}}
    for budget in SMALL_BUDGETS:
        out[f"aggregated x{gpus}, budget {budget}"] = {"replicas": gpus, "router": "least_requests",
                                                       "max_num_batched_tokens": budget}  # fmt: skip
    for p in range(1, gpus):
        out[f"disaggregated {p}P:{gpus - p}D"] = {
            "disaggregation": {"prefill": {"count": p}, "decode": {"count": gpus - p}},
            "router": "least_requests",
        }
    return out


def attainment(summary: dict[str, Any]) -> float:
    """Share of the requests that met every SLO (goodput over throughput)."""
    done = float(summary["request_throughput"])
    return float(summary["request_goodput"]) / done if done > 0 else 0.0


def goodput(workload: str, layout: dict[str, Any], seconds: float) -> tuple[float, dict[str, Any] | None]:
    """The highest rate (requests/s) at which ``layout`` meets the workload's SLOs for 90% of requests, and the
    summary at that rate. Each rate is tried on ``seconds`` of Poisson arrivals (at least ``MIN_PROMPTS``
    requests): a fixed number of requests would let a high rate pass as one burst that never reaches a steady
    state."""
    spec = dict(WORKLOADS[workload])
    slo = spec.pop("slo")
    given = BASE | spec | layout | {"goodput": slo}

    def evaluate(rate: float) -> dict[str, Any]:
        n = max(MIN_PROMPTS, round(rate * seconds))
        config = RunConfig.model_validate(given | {"request_rate": rate, "num_prompts": n})
        return run_simulation(config, detail=False).summary

    search = max_rate(evaluate, lambda s: attainment(s) >= ATTAINMENT, start=4.0, rel_tol=0.04)
    best = max((s for r, s in search.tried if r == search.rate), key=attainment, default=None)
    return search.rate, best


def run(gpus: int, seconds: float, workloads: list[str]) -> list[dict[str, Any]]:
    rows = []
    for workload in workloads:
        for name, layout in layouts(gpus).items():
            rate, s = goodput(workload, layout, seconds)
            rows.append({"workload": workload, "layout": name, "gpus": gpus, "goodput": rate,
                         "goodput_per_gpu": rate / gpus, "slo_ms": WORKLOADS[workload]["slo"],
                         "p90_ttft_ms": s and s["p90_ttft_ms"], "p90_tpot_ms": s and s["p90_tpot_ms"]})  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'workload':<8} {'layout':<28} {'goodput/GPU':>11} {'vs best agg':>11} {'p90 TTFT':>9} {'p90 TPOT':>9}"]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload]
        agg = max(r["goodput_per_gpu"] for r in mine if r["layout"].startswith("aggregated"))
        for r in mine:
            ratio = r["goodput_per_gpu"] / agg if agg > 0 else float("nan")
            ttft = "-" if r["p90_ttft_ms"] is None else f"{r['p90_ttft_ms']:.0f}ms"
            tpot = "-" if r["p90_tpot_ms"] is None else f"{r['p90_tpot_ms']:.1f}ms"
            lines.append(f"{workload:<8} {r['layout']:<28} {r['goodput_per_gpu']:>9.2f}/s {ratio:>10.2f}x"
                         f" {ttft:>9} {tpot:>9}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=8, help="GPUs of every layout, one replica each")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds of Poisson arrivals per evaluated rate")
    p.add_argument("--workload", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = p.parse_args(argv)
    rows = run(args.gpus, args.seconds, args.workload)
    print(f"{BASE['model']} on {args.gpus} x {BASE['hardware']}; goodput: the highest rate with {ATTAINMENT:.0%} of "
          "requests within both SLOs (strict/short: TTFT 200 ms, TPOT 12 ms; loose: 2 s, 100 ms)")  # fmt: skip
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
