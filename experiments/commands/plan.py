"""`ferry plan`: how many GPUs, of which kind, with which parallelism and batching settings, serve a workload at its
rate within an SLO, and at what cost. Every count it reports is a simulated cluster that met the SLO, with one
replica fewer simulated and failing it."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from experiments import workers
from experiments.plan.candidates import _list
from experiments.progress import Bar
from experiments.runner import outputs, user_code

PLAN_OUTPUTS = ("plan.json", "plan.png")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="the fewest GPUs (kind, TP, settings, replicas) that serve a workload within an SLO, and their cost",
        description="For each model and candidate replica (every --hardware x parallel layout "
        "(--tensor-parallel-size x --pipeline-parallel-size x --data-parallel-size x --enable-expert-parallel) x "
        "--policy x batching setting), find the fewest replicas behind --router whose simulated cluster meets the "
        "SLO at the workload's rate (or for its --max-concurrency clients); print them ranked by cost, write "
        "plan.json (every candidate, with why one was dropped) and plan.png (GPUs needed against the load for the "
        "best candidate of each of up to three GPU kinds). Every `ferry run` flag of the replica, scheduler and "
        "workload is taken, fixed for every candidate (--max-model-len 4096 sizes each for 4,096-token requests).",
        conflict_handler="resolve",  # the lists below replace `ferry run`'s single values of the same flags
    )
    p.add_argument("--config", type=Path, default=None, help="a `ferry run` YAML for everything else (dtype, ...)")
    from experiments.commands.run import add_run_arguments

    add_run_arguments(p, simulator=False, cluster=False)
    p.add_argument(
        "--model",
        default="llama-3-8b",
        help="built-in models or paths to HF config.json, comma-separated (each planned on its own)",
    )
    g = p.add_argument_group("SLO")
    g.add_argument(
        "--slo",
        nargs="+",
        action="append",
        default=None,
        metavar="NAME=MS",
        help="e.g. ttft_p99_ms=2000 tpot_p99_ms=100 (given twice: the limits together; a limit given twice with two "
        "values is refused)",
    )
    g.add_argument("--min-goodput", type=float, default=None, help="least share of requests meeting --goodput")
    g.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS", help="per-request thresholds")
    g = p.add_argument_group("candidates (comma-separated lists)")
    g.add_argument("--hardware", default="h100-sxm", help="GPU profiles (h100-sxm)")
    g.add_argument("--tensor-parallel-size", "-tp", default="1", help="TP degrees (1)")
    g.add_argument("--pipeline-parallel-size", "-pp", default="1", help="pipeline stages (1)")
    g.add_argument(
        "--data-parallel-size", "-dp", default="1", help="data-parallel ranks per replica, MoE layers spanning them (1)"
    )
    g.add_argument(
        "--enable-expert-parallel",
        nargs="?",
        const="on",
        default="off",
        metavar="off,on",
        help="MoE models: whole experts per GPU over tensor x data-parallel GPUs; alone: on; off,on: both (off)",
    )
    g.add_argument("--policy", default="chunked", help="batching policies (chunked)")
    g.add_argument("--max-num-seqs", default=None, help="values to try (default: vLLM's for each device)")
    g.add_argument("--max-num-batched-tokens", default=None, help="values to try (default: vLLM's)")
    g.add_argument(
        "--disagg-ratios",
        default=None,
        metavar="P:D,...",
        help="also disaggregated layouts: P prefill and D decode replicas per unit, e.g. 1:1,1:2,2:1 (continuous, "
        "chunked)",
    )
    g = p.add_argument_group("cluster and search")
    g.add_argument("--router", default="round_robin", help="router of every cluster (round_robin)")
    g.add_argument("--router-seed", type=int, default=0)
    g.add_argument("--max-replicas", type=int, default=256, help="give up on a candidate beyond this many replicas")
    g.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="synthetic workloads: the best candidate's count checked again on this many other seeds, so that the "
        "answer says how stable it is (2; 0: not checked)",
    )
    g.add_argument("--prices", type=Path, default=None, help="US$ per GPU-hour (default hwprofiles/prices.yaml)")
    g.add_argument("--jobs", type=int, default=None, help="processes (default: every core)")
    p.add_argument("--out", type=Path, default=Path("plan"), help="folder for plan.json and plan.png (plan/)")
    p.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    p.add_argument("--force", action="store_true", help="write into --out even if it holds another command's outputs")
    user_code.add_flag(p)
    p.set_defaults(func=main)


# plan's own flags, and the lists it tries (not a run config's fields as they are)
OWN = frozenset({"model", "slo", "min_goodput", "goodput", "hardware", "tensor_parallel_size", "pipeline_parallel_size",
                 "data_parallel_size", "enable_expert_parallel", "policy", "max_num_seqs", "max_num_batched_tokens",
                 "disagg_ratios", "router", "router_seed", "max_replicas", "repeats", "prices", "jobs"})  # fmt: skip


def base_config(args: argparse.Namespace, model: str) -> Any:
    """The run config every candidate of ``model`` starts from: `ferry run`'s flags given (and ``--config``), less
    what the candidates vary."""
    from experiments.commands.run import config_from_args

    given = argparse.Namespace(**(vars(args) | {"model": model}))
    config = config_from_args(given, not_fields=OWN - {"model"})
    w = config.workload
    if w.trace is None and "request_rate" not in w.model_fields_set and w.max_concurrency is None:
        raise ValueError(
            "give the workload's load: --request-rate R (synthetic), --trace FILE, or --max-concurrency N clients"
        )
    return config


def main(args: argparse.Namespace) -> int:
    from costmodel.prices import load_prices
    from experiments.plan.slo import parse_slo

    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: the number of processes, at least 1")
    if args.max_replicas < 1:
        raise ValueError(f"--max-replicas {args.max_replicas}: must be >= 1")
    if args.repeats < 0:
        raise ValueError(f"--repeats {args.repeats}: the other seeds to check the answer on, at least 0")
    slo = parse_slo(merged_slo(args.slo), args.min_goodput, args.goodput)
    prices = load_prices(args.prices)
    models = _list(args.model, str, "--model")
    bases = [base_config(args, m) for m in models]  # every model read (and refused) before any simulation
    outputs.check(args.out, PLAN_OUTPUTS, "plan", args.force)
    plans, tables, failed = [], [], []
    for base in bases:
        plan, text, ok = plan_model(args, base, slo, prices)
        plans.append(plan)
        tables.append(text if len(bases) == 1 else f"== {base.model} ==\n{text}")
        if not ok:
            failed.append(plan)
    written = write_plans(args, plans)
    if args.json:
        print(json.dumps(plans[0] if len(plans) == 1 else {"models": plans}, indent=2, default=_jsonable))
    else:
        print("\n\n".join(tables))
        seconds = sum(p["search_seconds"] for p in plans)
        print(f"\nsearched {sum(len(p['candidates']) for p in plans)} candidates in {seconds:.1f} s; wrote "
              f"{', '.join(str(p) for p in written)}")  # fmt: skip
    for plan in failed:  # nothing was simulated: the question cannot be answered as asked (bad input, status 2)
        print(f"ferry plan: error: {plan['model']}: no candidate could run ({plan['why_none_ran']})", file=sys.stderr)
    return 2 if failed else 0


def merged_slo(given: list[list[str]] | None) -> list[str] | None:
    """``--slo`` given more than once: its limits together; the same limit given twice with two values is refused."""
    if given is None:
        return None
    from experiments.plan.slo import parse_slo

    seen: dict[str, tuple[str, float]] = {}
    for item in (x for group in given for x in group):
        for key, limit in parse_slo([item]).limits.items():
            if key in seen and seen[key][1] != limit:
                raise ValueError(f"--slo {seen[key][0]} and --slo {item}: one limit with two values; give it once")
            seen[key] = (item, limit)
    return [text for text, _ in seen.values()]


def plan_model(args: argparse.Namespace, base: Any, slo: Any, prices: dict[str, Any]) -> tuple[dict[str, Any], str,
                                                                                             bool]:  # fmt: skip
    """One model's plan: its dict (plan.json's), its table, and whether any candidate could run."""
    from experiments.plan import report
    from experiments.plan.candidates import candidates, check_candidates
    from experiments.plan.pool import search
    from experiments.plan.search import load_unit, workload_rate
    from experiments.plan.search import stability as settled
    from experiments.runner.simulation import build_workload

    workload = build_workload(base)
    target, unit = workload_rate(workload), load_unit(workload)
    if not math.isfinite(target):
        raise ValueError(
            "the workload's arrivals all fall at one instant (--request-rate inf, or a trace whose requests all "
            "arrive together): ferry plan sizes a cluster for a rate; give a finite --request-rate, or "
            "--max-concurrency N to plan for N clients"
        )
    todo = candidates(args)
    check_candidates(todo, base, args)
    jobs = min(args.jobs or os.cpu_count() or 1, len(todo))
    started = time.perf_counter()
    print(f"ferry plan: {base.model}: {len(todo)} candidates, {len(workload.arrival_s):,} requests at "
          f"{target:.3g} {unit}, SLO {slo.describe()}, {jobs} processes", file=sys.stderr)  # fmt: skip
    common = (slo, args.router, args.router_seed, args.max_replicas)
    policies = [c.policy for c in todo] if base.engine != "reference" else []
    bar = Bar(len(todo), "candidates")
    # Ctrl-C stops the pool at once (experiments.workers): a plan is whole or not written
    try:
        with workers.Pool(jobs, partial(workers.warm_engine, policies)) as pool:
            results, best, curve_points = search(pool, todo, base, workload, common, prices, bar.step)
    finally:
        bar.close()
    curves: dict[str, list[tuple[float, int | None]]] = {r.candidate.label(): [(target, r.gpus)] for r in best}
    for (r, f), point in curve_points:
        curves[r.candidate.label()].append((target * f, point.gpus))
    ranked = report.ranked(results, prices)
    stability = None
    if ranked and args.repeats:
        stability = settled(ranked[0], base, workload, slo, args.router, args.router_seed, args.repeats)
    plan = {
        "model": base.model,
        "workload": workload.source,
        "requests": len(workload.arrival_s),
        "target_rate": target,
        "load_unit": unit,
        "slo": {"limits": slo.limits, "min_goodput": slo.min_goodput, "goodput": slo.goodput},
        "router": args.router,
        "search_seconds": time.perf_counter() - started,
        "ranked": [r.candidate.label() for r in ranked],
        "candidates": [r.to_json() | report.economics(r, prices) for r in results],
        "gpus_against_rate": {k: [{"rate": x, "gpus": g} for x, g in sorted(v)] for k, v in curves.items()},
        "stability": stability,
        "prices": {k: v.model_dump() for k, v in prices.items()},
    }
    ran = [r for r in results if not (r.reason or "").startswith("does not run")]
    if not ran:
        plan["why_none_ran"] = report.why_none_ran(results)
    return plan, report.table(results, prices, slo, base.model, stability), bool(ran)


def write_plans(args: argparse.Namespace, plans: list[dict[str, Any]]) -> list[Path]:
    """plan.json (one model's plan, or ``{"models": [...]}``) and plan.png (a panel per model)."""
    from experiments.plan import report

    outputs.prepare(args.out, PLAN_OUTPUTS, "plan", args.force)
    body = plans[0] if len(plans) == 1 else {"models": plans}
    written = [outputs.write_text(args.out / "plan.json", json.dumps(body, indent=2, default=_jsonable) + "\n")]
    if any(p["gpus_against_rate"] for p in plans):
        written.append(report.plot(plans, args.out / "plan.png"))
    return written


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)
