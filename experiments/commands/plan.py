"""`ferry plan`: how many GPUs, of which kind, with which parallelism and batching settings, serve a workload at its
rate within an SLO, and at what cost. Every count it reports is a simulated cluster that met the SLO, with one
replica fewer simulated and failing it."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

from experiments import outputs, user_code, workers

PLAN_OUTPUTS = ("plan.json", "plan.png")
CURVE_FACTORS = (0.25, 0.5, 2.0)  # rates (times the target) at which the best candidates are also planned


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="the fewest GPUs (kind, TP, settings, replicas) that serve a workload within an SLO, and their cost",
        description="For each candidate replica (every --hardware x parallel layout (--tensor-parallel-size x "
        "--pipeline-parallel-size x --data-parallel-size x --enable-expert-parallel) x --policy x batching "
        "setting), find the fewest replicas behind --router whose simulated cluster meets the SLO at the workload's "
        "rate; print them ranked by cost, write plan.json (every candidate, with why one was dropped) and plan.png "
        "(GPUs needed against request rate for the best candidate of each of up to three GPU kinds).",
    )
    p.add_argument("--model", default="llama-3-8b", help="built-in model or path to a HF config.json")
    p.add_argument("--config", type=Path, default=None, help="a `ferry run` YAML for everything else (dtype, ...)")
    g = p.add_argument_group("workload (as `ferry run`)")
    g.add_argument("--trace", type=Path, default=None, help="trace to serve at its own rate (times --trace-time-scale)")
    g.add_argument("--trace-format", default=None)
    g.add_argument("--trace-time-scale", type=float, default=None)
    g.add_argument("--num-prompts", type=int, default=None, help="requests per simulation (synthetic: 1000)")
    g.add_argument("--request-rate", type=float, default=None, help="synthetic: the target rate (requests/s)")
    g.add_argument("--burstiness", type=float, default=None)
    g.add_argument("--input-len", default=None)
    g.add_argument("--output-len", default=None)
    g.add_argument("--lengths-from", type=Path, default=None)
    g.add_argument("--lengths-max-total", type=int, default=None)
    g.add_argument("--seed", type=int, default=None)
    g = p.add_argument_group("SLO")
    g.add_argument("--slo", nargs="+", default=None, metavar="NAME=MS", help="e.g. ttft_p99_ms=2000 tpot_p99_ms=100")
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
    g.add_argument("--prices", type=Path, default=None, help="US$ per GPU-hour (default hwprofiles/prices.yaml)")
    g.add_argument("--jobs", type=int, default=None, help="processes (default: every core)")
    p.add_argument("--out", type=Path, default=Path("plan"), help="folder for plan.json and plan.png (plan/)")
    p.add_argument("--json", action="store_true", help="print plan.json instead of the table")
    p.add_argument("--force", action="store_true", help="write into --out even if it holds another command's outputs")
    user_code.add_flag(p)
    p.set_defaults(func=main)


def _list(text: str | None, kind: type, flag: str) -> list[Any]:
    if text is None:
        return [None]
    try:
        values = [kind(x.strip()) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected a comma-separated list of {kind.__name__}") from None
    if not values:
        raise ValueError(f"{flag}: empty list")
    return values


def base_config(args: argparse.Namespace) -> Any:
    from experiments.config import RunConfig

    fields = {k: getattr(args, k) for k in ("trace", "trace_format", "trace_time_scale", "num_prompts",
              "request_rate", "burstiness", "input_len", "output_len", "lengths_from", "lengths_max_total", "seed")
              if getattr(args, k) is not None}  # fmt: skip
    fields["model"] = args.model
    if args.trace is None and "request_rate" not in fields:
        raise ValueError("give the workload's rate: --request-rate R (synthetic) or --trace FILE")
    if args.config is not None:
        return RunConfig.load(args.config, fields)
    return RunConfig.model_validate(fields)


def candidates(args: argparse.Namespace) -> list[Any]:
    from experiments.plan.search import Candidate
    from policies.config import ITERATION_LIMITED

    out = []
    seqs = _list(args.max_num_seqs, int, "--max-num-seqs")
    tokens = _list(args.max_num_batched_tokens, int, "--max-num-batched-tokens")
    ratios = _ratios(args.disagg_ratios)
    policy_names = _list(args.policy, str, "--policy")
    if ratios and not any(p in ITERATION_LIMITED for p in policy_names):
        raise ValueError(
            f"--disagg-ratios {args.disagg_ratios}: disaggregated pools run {' or '.join(ITERATION_LIMITED)} "
            f"batching; --policy {args.policy} has none of them"
        )
    for hw, layout, policy in itertools.product(_list(args.hardware, str, "--hardware"), layouts(args),
                                                policy_names):  # fmt: skip
        limits = list(itertools.product(seqs, tokens)) if policy in ITERATION_LIMITED else [(None, None)]
        out += [Candidate(hw, layout[0], policy, s, t, None, *layout[1:]) for s, t in limits]
        if policy in ITERATION_LIMITED and layout[2] == 1:  # disaggregated pools of data-parallel ranks: not modelled
            out += [Candidate(hw, layout[0], policy, s, t, pd, *layout[1:]) for s, t in limits for pd in ratios]
    return list(dict.fromkeys(out))


def layouts(args: argparse.Namespace) -> list[tuple[int, int, int, bool]]:
    """(tp, pp, dp, expert parallel) of every layout the lists give; expert parallelism only where tensor x data
    parallelism gives it more than one GPU (vLLM ignores it on one)."""
    ep_modes = _list(args.enable_expert_parallel, str, "--enable-expert-parallel")
    if any(m not in ("off", "on") for m in ep_modes):
        raise ValueError(f"--enable-expert-parallel {args.enable_expert_parallel!r}: expected off, on or off,on")
    out = []
    for tp, pp, dp, mode in itertools.product(_list(args.tensor_parallel_size, int, "--tensor-parallel-size"),
                                              _list(args.pipeline_parallel_size, int, "--pipeline-parallel-size"),
                                              _list(args.data_parallel_size, int, "--data-parallel-size"),
                                              ep_modes):  # fmt: skip
        if mode == "on" and tp * dp == 1 and len(ep_modes) > 1:
            continue
        out.append((tp, pp, dp, mode == "on"))
    return out


def check_candidates(todo: list[Any], base: Any, args: argparse.Namespace) -> None:
    """Refuse, before any simulation, what no candidate could run with: a list value that is not valid on its own
    (``--tensor-parallel-size 0``, ``--max-num-seqs -4``: as ``ferry run`` refuses it), an unknown GPU, policy or
    router (the router is checked even when one replica would do). A candidate that is valid but cannot run (the
    model does not fit at that TP, a budget below its seats) is dropped later, with its reason."""
    from costmodel.hardware import load_hardware
    from experiments.config import RunConfig
    from experiments.errors import one_line
    from policies.config import BUILTIN_POLICIES
    from policies.routing import router_names

    for flag, name, kind in (("--tensor-parallel-size", "tensor_parallel_size", int),
                             ("--pipeline-parallel-size", "pipeline_parallel_size", int),
                             ("--data-parallel-size", "data_parallel_size", int),
                             ("--max-num-seqs", "max_num_seqs", int),
                             ("--max-num-batched-tokens", "max_num_batched_tokens", int)):  # fmt: skip
        for value in _list(getattr(args, name), kind, flag):
            if value is not None:
                check_field(name, value, flag)
    for hardware in dict.fromkeys(c.hardware for c in todo):
        load_hardware(hardware)  # an unknown profile is a typo to fix, not a candidate to drop
    for name in dict.fromkeys(c.policy for c in todo):
        if name not in BUILTIN_POLICIES and not user_code.is_user_code(name):
            raise ValueError(f"--policy {name!r}: unknown policy; choose from {', '.join(BUILTIN_POLICIES)} or give "
                             "module:Class")  # fmt: skip
    if args.router not in router_names() and not user_code.is_user_code(args.router):
        raise ValueError(f"--router {args.router!r}: unknown router; choose one of {', '.join(router_names())} or "
                         "give module:Class")  # fmt: skip
    try:  # what holds for every cluster the search builds (a router that needs prefix caching, ...)
        RunConfig.model_validate(base.model_dump(exclude_unset=True) | {"replicas": 2, "router": args.router,
                                                                        "router_seed": args.router_seed})  # fmt: skip
    except ValueError as exc:
        raise ValueError(one_line(exc)) from None
    named: list[Any] = []
    for candidate in todo:
        try:
            named += user_code.named_in(candidate.config(base, 2, args.router, args.router_seed))
        except ValueError:
            pass  # a combination the candidate refuses: dropped with its reason when planned
    flags = [args.router, *(c.policy for c in todo)]
    source = str(args.config) if args.config is not None else None
    user_code.admit(named, "plan", source, args.allow_import, [f for f in flags if user_code.is_user_code(f)])


def check_field(name: str, value: Any, flag: str | None = None) -> Any:
    """``value`` checked as the run config's field ``name`` alone (its type and range, as ``RunConfig`` checks it),
    for a command that takes a list of values (``ferry plan --tensor-parallel-size 1,2``); ValueError naming the flag
    (or field) and the value."""
    from pydantic import TypeAdapter, ValidationError

    from experiments.config import RunConfig, SchedulerConfig, WorkloadConfig, show

    model = next(m for m in (RunConfig, SchedulerConfig, WorkloadConfig) if name in m.model_fields)
    info = model.model_fields[name]
    try:
        return TypeAdapter(Annotated[(info.annotation, *info.metadata)]).validate_python(value)  # type: ignore[arg-type]
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ValueError(f"{flag or name} {show(value)}: {problem}") from None


def _ratios(text: str | None) -> list[tuple[int, int]]:
    """``"1:1,1:2"`` -> ``[(1, 1), (1, 2)]``: prefill and decode replicas per unit of a disaggregated layout."""
    out = []
    for item in _list(text, str, "--disagg-ratios") if text is not None else []:
        p, sep, d = item.partition(":")
        if not (sep and p.isdigit() and d.isdigit() and int(p) >= 1 and int(d) >= 1):
            raise ValueError(f"--disagg-ratios {item!r}: expected P:D, two integers >= 1 (e.g. 1:2)")
        out.append((int(p), int(d)))
    return out


def _plan_one(job: tuple[Any, ...]) -> Any:
    from experiments.errors import one_line
    from experiments.plan.search import plan_candidate

    candidate, base, workload, slo, router, seed, max_replicas, single_rate = job
    try:
        return plan_candidate(candidate, base, workload, slo, router, seed, max_replicas, single_rate)
    except ValueError as exc:  # a setting the candidate refuses (e.g. max_num_batched_tokens < max_num_seqs)
        from experiments.plan.search import CandidateResult

        return CandidateResult(candidate, reason=f"does not run: {one_line(exc)}")


def main(args: argparse.Namespace) -> int:
    from costmodel.prices import load_prices
    from experiments.plan import report
    from experiments.plan.search import scaled, workload_rate
    from experiments.plan.slo import parse_slo
    from experiments.simulation import build_workload

    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: the number of processes, at least 1")
    slo = parse_slo(args.slo, args.min_goodput, args.goodput)
    prices = load_prices(args.prices)
    base = base_config(args)
    if args.max_replicas < 1:
        raise ValueError(f"--max-replicas {args.max_replicas}: must be >= 1")
    outputs.check(args.out, PLAN_OUTPUTS, "plan", args.force)
    workload = build_workload(base)
    target = workload_rate(workload)
    if not math.isfinite(target):
        raise ValueError(
            "the workload's arrivals all fall at one instant (--request-rate inf, or a trace whose requests all "
            "arrive together): ferry plan sizes a cluster for a rate; give a finite --request-rate"
        )
    todo = candidates(args)
    check_candidates(todo, base, args)
    jobs = args.jobs or os.cpu_count() or 1
    started = time.perf_counter()
    print(f"ferry plan: {len(todo)} candidates, {len(workload.arrival_s):,} requests at {target:.3g} req/s, "
          f"SLO {slo.describe()}, {jobs} processes", file=sys.stderr)  # fmt: skip
    common = (slo, args.router, args.router_seed, args.max_replicas)
    # Ctrl-C stops the pool at once (experiments.workers): a plan is whole or not written
    results = workers.ordered(_plan_one, [(c, base, workload, *common, None) for c in todo], jobs)
    best = report.best_per_kind(report.ranked(results, prices))[:3]
    curve_jobs = [(r, f) for r in best for f in CURVE_FACTORS]
    points = workers.ordered(_plan_one, [(r.candidate, base, scaled(workload, f), *common, r.single_replica_rate)
                                         for r, f in curve_jobs], jobs)  # fmt: skip
    curves: dict[str, list[tuple[float, int | None]]] = {r.candidate.label(): [(target, r.gpus)] for r in best}
    for (r, f), point in zip(curve_jobs, points, strict=True):
        curves[r.candidate.label()].append((target * f, point.gpus))
    elapsed = time.perf_counter() - started
    plan = {
        "model": base.model,
        "workload": workload.source,
        "requests": len(workload.arrival_s),
        "target_rate": target,
        "slo": {"limits": slo.limits, "min_goodput": slo.min_goodput, "goodput": slo.goodput},
        "router": args.router,
        "search_seconds": elapsed,
        "ranked": [r.candidate.label() for r in report.ranked(results, prices)],
        "candidates": [r.to_json() | report.economics(r, prices) for r in results],
        "gpus_against_rate": {k: [{"rate": x, "gpus": g} for x, g in sorted(v)] for k, v in curves.items()},
        "prices": {k: v.model_dump() for k, v in prices.items()},
    }
    outputs.prepare(args.out, PLAN_OUTPUTS, "plan", args.force)
    written = [outputs.write_text(args.out / "plan.json", json.dumps(plan, indent=2, default=_jsonable) + "\n")]
    if curves:
        written.append(report.plot(curves, target, args.out / "plan.png"))
    if args.json:
        print(json.dumps(plan, indent=2, default=_jsonable))
    else:
        print(report.table(results, prices, slo, base.model))
        print(f"\nsearched {len(todo)} candidates in {elapsed:.1f} s; wrote {', '.join(str(p) for p in written)}")
    return 0


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)
