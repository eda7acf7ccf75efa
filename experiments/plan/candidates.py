"""`ferry plan`'s candidates: every combination of the lists it was given (GPU kinds, parallel layouts, policies,
limits, disaggregated splits), and the checks that refuse, before any simulation, what none of them could run
with."""

from __future__ import annotations

import argparse
import itertools
from typing import Annotated, Any

from experiments.runner import user_code


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
    from experiments.errors import one_line
    from experiments.runner.config import RunConfig
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
    from costmodel.model_spec import load_model

    load_model(base.model)  # one model for every candidate: a config it cannot read is refused here, not per candidate
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

    from experiments.runner.config import RunConfig, SchedulerConfig, WorkloadConfig, show

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
