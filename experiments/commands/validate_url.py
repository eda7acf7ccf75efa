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
"""

from __future__ import annotations

import numpy as np
import pandas as pd

import policies
from costmodel import load_hardware
from experiments.commands.validate import Validation, calibration_setting, compare
from experiments.config import RunConfig
from experiments.real import client as C
from experiments.real.client import Prompts, replay_trace
from experiments.real.measured import blank_server_side, records_of
from experiments.simulation import build_replica, build_workload
from sim.engine import simulate


def validate_url(
    config: RunConfig, url: str, served_name: str, *, seed: int = 0, concurrency: int | None = None,
    timeout_s: float = C.REQUEST_TIMEOUT_S,
) -> Validation:  # fmt: skip
    """Replay ``config``'s workload against ``url`` and simulate it with ``config.hardware``; compare. Each request
    waits at most ``timeout_s`` seconds for its response, then for each next token. ValueError (one line) when the
    server does not serve ``served_name`` or more than half the requests failed."""
    url = C.check_url(url)
    timeout_s = C.check_timeout(timeout_s)
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {concurrency}")
    hardware = load_hardware(config.hardware)
    dtype = config.dtype if config.dtype != "auto" else calibration_setting(hardware, "dtype") or "auto"
    config = config.model_copy(update={"dtype": dtype})
    replica = build_replica(config)
    config, cost = replica.config, replica.cost
    workload = build_workload(config)
    C.check_server(url, served_name, "--served-model-name", min(C.MODELS_TIMEOUT_S, timeout_s))
    prompts = Prompts(np.random.default_rng(seed))
    sent = [prompts.make(int(p)) for p in workload.prompt_tokens]
    streams = replay_trace(
        url, served_name, workload.arrival_s, sent, workload.output_tokens, concurrency or 1 << 16, timeout_s
    )
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
    simulated = simulate(requests, policy, cost, kv, config.scheduler.max_model_len, "reference", stream=config.stream)
    sim = replica.result(workload, simulated)
    comparison = compare(real.summary, sim.summary, np.zeros(0), np.zeros(0))
    comparison["profile"] = hardware.name
    comparison["policy"] = config.scheduler.policy
    comparison["workload"] = workload.source
    comparison["url"] = url
    client_s = float(calibration_setting(hardware, "client_s") or 0.0)
    comparison["client_handling_ms"] = 1e3 * client_s
    if client_s:
        comparison["note"] = (
            f"the probe measured {1e3 * client_s:.2f} ms of request handling before a first token, which the "
            "simulation does not add (its TTFT starts at the iteration)"
        )
    if errors:
        first = next(iter(errors.items()))
        comparison["failed"] = {"n": len(errors), "first": f"request {first[0]}: {first[1]}"}
    tokens = [s.prompt_tokens for s in streams if s.prompt_tokens is not None]
    comparison["prompt_tokens_exact"] = int(sum(t == p for t, p in zip(tokens, workload.prompt_tokens, strict=False)))
    return Validation(real, sim, comparison, pd.DataFrame())
