"""`ferry validate --url`: replay a workload against a live server and compare with its simulation.

    ferry validate --url http://HOST:PORT/v1 --model CONFIG --hardware PROBED.yaml [--served-model-name NAME] \\
        --policy ... (the server's scheduler flags) --num-prompts 200 --request-rate 4 ... --out validate/

The real side is the server as its clients see it: each request of the workload is sent at its arrival time (open
loop), prompts of exact token counts (``experiments.real.client``), streamed; TTFT, TPOT, ITL and end-to-end
latency are measured on arrival of the chunks (``experiments.real.measured``). The simulated side replays the same
workload through the same policy, timed by ``--hardware`` (the profile ``ferry probe`` fitted to this server). The
table is ``ferry validate``'s; what only the server's iterations could say (idle time, iterations, batch sizes) is
"-" on the real side. Give the scheduler flags the server runs with: the simulation cannot read them from it.

Before the workload, ``/models`` must list the served model (nothing listening, an answer that is not an OpenAI model
list, or another model: one line and exit 2). Every request waits at most ``--timeout`` seconds for its response and
then for each next token (``experiments.real.client.REQUEST_TIMEOUT_S`` by default). When more than half the requests
failed, nothing is written and the command stops with one line: how many failed and the first reason (exit 2); a few
failures are kept in ``comparison.json`` (``failed``) and printed above the table.

What the simulation does not model is said beside the table: the request handling before a first token that the
probe measured (``experiments.real.handling``: on an idle server and into running decodes at the loads it measured,
in ``comparison.json`` as ``client_handling_ms``, ``client_busy_handling`` and ``client_busy_handling_ms`` for the
heaviest, and what an idle server adds, ``client_idle_handling``; and the TTFTs with each request's handling added to
the simulated ones, ``with_handling``, by the requests the simulation had in flight at its arrival and how long it had
been idle), and the scheduler limits the server states (``experiments.real.limits``: a
``note`` when they differ from the flags the simulation ran with, ``server_limits`` in ``comparison.json``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pandas as pd

import policies
from costmodel import load_hardware
from experiments.real import client as C
from experiments.real.client import Prompts, replay_trace
from experiments.real.handling import handling_measured, handling_of, measured_handling, measured_wake
from experiments.real.limits import ServerLimits, read_limits
from experiments.real.measured import blank_server_side, records_of
from experiments.runner.config import RunConfig
from experiments.runner.simulation import build_replica, build_workload
from experiments.runner.validation import Validation, calibration_setting, compare
from sim.engine import simulate
from sim.workload.clients import open_loop


def validate_url(
    config: RunConfig, url: str, served_name: str, *, seed: int = 0, timeout_s: float = C.REQUEST_TIMEOUT_S
) -> Validation:
    """Replay ``config``'s workload against ``url`` and simulate it with ``config.hardware``; compare. Each request
    waits at most ``timeout_s`` seconds for its response, then for each next token. The prompts' tokens are drawn
    from ``seed`` and a fresh seed (``prompt_seed`` in the comparison), new in every run: a prompt the server's
    prefix cache held from an earlier run would skip its prefill, which the simulation computes. ValueError (one
    line) when the server does not serve ``served_name`` or more than half the requests failed. With
    ``--max-concurrency`` the replay holds at most that many requests open, each waiting for a slot as
    ``vllm bench serve``'s does, and the simulation models the same slots (``sim.workload.clients``)."""
    url = C.check_url(url)
    timeout_s = C.check_timeout(timeout_s)
    concurrency = config.workload.max_concurrency
    hardware = load_hardware(config.hardware)
    dtype = config.dtype if config.dtype != "auto" else calibration_setting(hardware, "dtype") or "auto"
    config = config.model_copy(update={"dtype": dtype})
    replica = build_replica(config)
    config, cost = replica.config, replica.cost
    workload = build_workload(config)
    limits = _server_limits(url, served_name, min(C.MODELS_TIMEOUT_S, timeout_s))
    prompt_seed = [int(seed), C.fresh_seed()]  # a server's prefix cache must not hold them from an earlier run
    prompts = Prompts(np.random.default_rng(prompt_seed))
    sent = [prompts.make(int(p)) for p in workload.prompt_tokens]
    due = open_loop(workload).arrival_s  # each request's time; a slot's wait comes on top, as the server answers
    streams = replay_trace(url, served_name, due, sent, workload.output_tokens, concurrency or 1 << 16, timeout_s)
    records, errors = records_of(streams, workload.prompt_tokens)
    if 2 * len(errors) > len(streams):  # a failure must not look like a comparison
        i, why = next(iter(errors.items()))
        raise ValueError(
            f"{len(errors)} of {len(streams)} requests to {url} failed (request {i}: {why}); nothing written"
        )
    real = replica.result(workload, records, f"live server at {url} ({served_name})")
    real.summary = blank_server_side(real.summary)
    real.summary["device"] = f"live server at {url}"

    policy = policies.get(config.scheduler)
    requests, kv = replica.new_requests(workload)
    simulated = simulate(requests, policy, cost, kv, config.scheduler.max_model_len, "reference", stream=config.stream,
                         spec=replica.spec)  # fmt: skip
    sim = replica.result(workload, simulated)
    comparison = compare(real.summary, sim.summary, np.zeros(0), np.zeros(0))
    comparison["profile"] = hardware.name
    comparison["policy"] = config.scheduler.policy
    comparison["workload"] = workload.source
    comparison["url"] = url
    comparison["prompt_seed"] = prompt_seed
    client_s, busy = measured_handling(hardware)
    wake = measured_wake(hardware)
    comparison["client_handling_ms"] = 1e3 * client_s
    comparison["client_idle_handling"] = [{"after_s": p, "ms": 1e3 * t} for p, t in wake]
    comparison["client_busy_handling_ms"] = 1e3 * (busy[-1][1] if busy else client_s)  # the heaviest load measured
    comparison["client_busy_handling"] = [{"running": n, "ms": 1e3 * t} for n, t in busy]
    notes = []
    if handling_measured(hardware) or busy or wake:  # measured, even where it came out as none
        added = handling_of(simulated.requests.arrival, simulated.requests.finish, client_s, busy, wake)
        ttft = simulated.requests.first_token - simulated.requests.arrival
        comparison["with_handling"] = handled = with_handling(comparison["metrics"], ttft + added)
        err = handled["median_ttft_ms"]["rel_error"]
        loads = "".join(f", {1e3 * t:.2f} ms into {n} running decodes" for n, t in busy)
        loads += "".join(f", {1e3 * t:.2f} ms more after {p:g} s idle" for p, t in wake)
        notes.append(
            f"the probe measured {1e3 * client_s:.2f} ms of request handling before a first token on an idle "
            f"server{loads}, which the simulation does not add (its TTFT starts at the iteration)"
            + (f"; with it added, median TTFT {100 * err:+.1f}%" if err is not None else "")
        )
    comparison["server_limits"] = limits.as_dict()
    notes += limit_mismatches(limits, config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens)
    if notes:
        comparison["note"] = "; ".join(notes)
    if errors:
        first = next(iter(errors.items()))
        comparison["failed"] = {"n": len(errors), "first": f"request {first[0]}: {first[1]}"}
    held = sum(C.held_back(s) for s in streams)
    comparison["held_back"] = {"n": held, "of": len(streams)}
    if held:
        comparison["streamed"] = streamed_only(streams, comparison)
        note = (
            f"{held} of {len(streams)} responses came from the server in one burst (tokens held back, then sent at "
            "once): their gaps are no steps, and the real ITL and TTFT hold them (the others alone: 'streamed')"
        )
        comparison["note"] = f"{comparison['note']}; {note}" if "note" in comparison else note
    miscounted = [s for s in streams if s.ok and s.coalesced]
    comparison["coalesced"] = {"n": len(miscounted), "of": len(streams)}
    if miscounted:  # the server's usage and the chunks received disagree: the chunks' gaps are not its steps
        one = miscounted[0]
        note = (
            f"{len(miscounted)} of {len(streams)} responses' usage counts completion tokens other than the chunks "
            f"received (the first: {one.completion_tokens} against {len(one.chunk_s)}): several tokens to a "
            "chunk, or a miscount; their gaps are not the server's steps"
        )
        comparison["note"] = f"{comparison['note']}; {note}" if "note" in comparison else note
    tokens = [s.prompt_tokens for s in streams if s.prompt_tokens is not None]
    comparison["prompt_tokens_exact"] = int(sum(t == p for t, p in zip(tokens, workload.prompt_tokens, strict=False)))
    return Validation(real, sim, comparison, pd.DataFrame())


def _server_limits(url: str, served_name: str, timeout_s: float) -> ServerLimits:
    """``/models`` must list ``served_name`` (ValueError, one line, otherwise); the limits the server states."""

    async def ask() -> ServerLimits:
        async with C.new_client(1, timeout_s) as client:
            card = C.served(await C.models(client, url, timeout_s), served_name, url, "--served-model-name")
            return await read_limits(client, url, card, min(10.0, timeout_s))

    return asyncio.run(ask())


def with_handling(metrics: dict[str, Any], handled_s: np.ndarray) -> dict[str, Any]:
    """The real TTFT rows of ``compare``'s metrics beside the simulated TTFTs with their handling (``handled_s``:
    seconds, per request), as ms: real, sim and the relative error."""
    got = handled_s[np.isfinite(handled_s)]
    out = {}
    for key, q in (("median_ttft_ms", 50), ("p90_ttft_ms", 90)):
        real = metrics.get(key, {}).get("real")
        if not isinstance(real, (int, float)) or not len(got):
            continue
        sim = 1e3 * float(np.percentile(got, q))
        out[key] = {"real": real, "sim": sim, "rel_error": sim / real - 1.0 if real else None}
    return out


def streamed_only(streams: list[C.Stream], comparison: dict[str, Any]) -> dict[str, Any]:
    """The real median ITL and TTFT (ms) of the responses the server streamed (not held back), beside the
    simulated ones (TTFT with handling where the comparison has it): which requests the server holds back is not
    the simulation's business, so all of its requests are the comparator."""
    ok = [s for s in streams if s.ok and not C.held_back(s)]
    out: dict[str, Any] = {"n": len(ok)}
    gaps = np.concatenate([s.gaps_s for s in ok]) if ok else np.zeros(0)
    sims = {
        "median_itl_ms": comparison["metrics"]["median_itl_ms"]["sim"],
        "median_ttft_ms": comparison.get("with_handling", {}).get("median_ttft_ms", {}).get("sim")
        or comparison["metrics"]["median_ttft_ms"]["sim"],
    }
    reals = {
        "median_itl_ms": 1e3 * float(np.median(gaps)) if len(gaps) else None,
        "median_ttft_ms": 1e3 * float(np.median([s.ttft_s for s in ok])) if ok else None,
    }
    for key, real in reals.items():
        sim = sims[key]
        both = real is not None and isinstance(sim, (int, float))
        out[key] = {"real": real, "sim": sim, "rel_error": sim / real - 1.0 if both and real else None}
    return out


def limit_mismatches(limits: ServerLimits, max_num_seqs: int | None, max_num_batched_tokens: int | None) -> list[str]:
    """A line for each scheduler limit the server states differently from the simulation's."""
    out = []
    for name, simulated in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
        told = getattr(limits, name)
        if told is not None and simulated is not None and told != simulated:
            out.append(
                f"the server states {name} {told}, the simulation ran with {simulated} (--{name.replace('_', '-')})"
            )
    return out
