"""``ferry probe``: run the designed experiments against a live server (``probe_design``), infer its iteration times
from the streams, fit a profile to them, and score it on the requests it did not fit.

From the client's side an iteration is seen as the gap between two streamed tokens of a request it served (a token
goes out when the iteration that made it ends), and a prefill as a time to first token. So:
- a ``ttft`` experiment gives one row: a prefill of its prompt, the median TTFT of its repeats, which also holds the
  server's handling of a request (parsing, tokenizing, queueing for the next step, the network): fitted as one
  constant, ``client_s``, that every TTFT row pays and no gap does;
- ``decode`` and ``batch`` experiments give rows of ``WINDOW`` consecutive gaps while the same requests are all
  decoding (after each one's first decode step, before any finishes): the median gap is the step's time (the mean
  gap where tokens came in bursts, ``BURST``; none below ``MIN_STEP_S``: tokens held back), the contexts are each
  request's prompt plus the tokens it has made;
- a ``mixed`` experiment gives the running requests' enlarged gaps up to the injected prompt's first token: each an
  iteration with the running decodes and an equal share of the prompt; its prompts' TTFTs beyond their iterations
  give the request handling of a busy server (``busy_handling``: ``client_busy_s``);
- the idle experiments (``probe_design.idle_experiments``) give what a server left idle adds (``idle_handling``:
  ``client_idle_s``).
The rows (``probe_rows``, which holds these constants) are an iteration table (``costmodel.calibration.iterations``)
and are fitted the same way as ``ferry calibrate --from-iterations``, with the held-out experiments' rows scored
only: efficiency curves and the host overheads, whose ``per_iteration_s`` is the engine's host time per step
(``experiments.real.probe_report`` checks the fit on the gaps it was fitted on).

A request's tokens may reach the client all at once (``client.held_back``: a server that holds them back, or a
client starved of CPU by a server on the same machine): such a request times nothing. A batch's held-back requests
still count in its steps; an experiment left with nothing to time is sent again (``HELD_RETRIES`` times).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from costmodel.calibration.fit import error_summary
from costmodel.calibration.iterations import check_iterations, to_raw
from costmodel.calibration.profile import FitResult, fit_profile
from costmodel.hardware import HardwareProfile
from costmodel.model_spec import ModelSpec
from costmodel.roofline import CostModel
from experiments.real import client as C
from experiments.real.client import Prompts
from experiments.real.handling import busy_handling, idle_handling
from experiments.real.limits import ServerLimits, read_limits
from experiments.real.probe_design import (
    KINDS,
    Experiment,
    ProbePlan,
    design,
    idle_experiments,
    run_experiment,
    seeded_prompts,
)
from experiments.real.probe_report import WARMUP_REQUESTS, host_check, limit_notes
from experiments.real.probe_rows import failed, held_back, iteration_rows, lost, lost_words, spoiled

HELD_RETRIES = 2  # times an experiment whose tokens were held back is sent again
LOST_MAX = 0.25  # share of the experiments run that may lose requests (left out) before no profile is fitted


@dataclass
class ProbeRun:
    """What the probe sent and saw."""

    url: str
    model: str
    max_model_len: int | None
    text_prompts: bool  # token ids were refused: prompts were words
    experiments: list[Experiment]
    seconds: float = 0.0
    stopped: str = ""  # why the probe stopped early ("" if it ran every experiment)
    notes: list[str] = field(default_factory=list)
    max_num_batched_tokens: int | None = None  # the server's per-iteration token budget the prompts fit, if known
    max_num_seqs: int | None = None  # the server's seats, which capped the batches sent, if known
    limits: ServerLimits = field(default_factory=ServerLimits)  # what the server stated of its limits
    seed: int = 0  # the random prompts' seed
    held_back: int = 0  # requests whose tokens the server held back and sent at once (their experiment sent again)
    # the idle experiments: (pause before the request, s; its stream), pause 0 for those sent at once (``wake_up``)
    wake: list[tuple[float, C.Stream]] = field(default_factory=list)

    def streams(self) -> list[C.Stream]:
        sent = [s for e in self.experiments for s in [*e.streams, *([e.injected] if e.injected else []), *e.busy]]
        return sent + [s for _, s in self.wake]


# ---- sending ---------------------------------------------------------------------------------------------------


async def _first_checks(
    client: Any, url: str, model: str, plan: ProbePlan, seed: int, origin: float, stage: list[str],
    log: Callable[[str], None],
) -> tuple[dict[str, Any], Prompts, bool]:  # fmt: skip
    """``/models`` serves ``model``; one real streamed request answers as an SSE stream of completion chunks (with
    token ids, else words); then the warm-up requests. Returns the model's card, the prompts, whether they are words.
    ``stage[0]`` says what it waits for. ValueError, one line, at the first answer that is not what it should be."""
    card = C.served(await C.models(client, url, min(C.MODELS_TIMEOUT_S, plan.timeout_s)), model, url, "--model")
    stage[0] = "the first request"
    prompts, text = seeded_prompts(seed), False
    first = await C.complete(client, url, model, prompts.make(16), 2, origin, timeout_s=plan.timeout_s)
    if first.error and first.error.startswith(("HTTP 400", "HTTP 422")):
        log(f"token-id prompts refused ({first.error}); sending words")
        prompts, text = seeded_prompts(seed, text=True), True
        first = await C.complete(client, url, model, prompts.make(16), 2, origin, timeout_s=plan.timeout_s)
    if first.error:
        raise ValueError(f"{url}: the first probe request failed: {first.error}")
    for k in range(2, WARMUP_REQUESTS + 1):  # first-call costs of the server
        stage[0] = f"warm-up request {k} of {WARMUP_REQUESTS}"
        warm = await C.complete(client, url, model, prompts.make(64), 4, origin, timeout_s=plan.timeout_s)
        if warm.error:
            raise ValueError(f"{url}: {stage[0]} failed: {warm.error}")
    return card, prompts, text


async def _probe(url: str, model: str, plan: ProbePlan, seed: int, log: Callable[[str], None]) -> ProbeRun:
    origin = time.perf_counter()
    deadline = origin + plan.budget_s
    async with C.new_client(plan.max_concurrency, plan.timeout_s) as client:
        stage = [f"GET {url}/models"]
        try:
            async with asyncio.timeout(plan.budget_s):
                card, prompts, text = await _first_checks(client, url, model, plan, seed, origin, stage, log)
                stage[0] = "the server's limits (/server_info, /metrics)"
                limits = await read_limits(client, url, card, min(10.0, plan.timeout_s))
        except TimeoutError:
            raise ValueError(
                f"{url}: --budget-s {plan.budget_s:g} spent before the probe's first checks ended (at {stage[0]})"
            ) from None
        max_len = C.card_int(card, "max_model_len")
        budget = plan.max_num_batched_tokens or limits.max_num_batched_tokens
        seats = plan.max_num_seqs or limits.max_num_seqs
        experiments = design(plan, max_len, budget, seats)
        run = ProbeRun(url, model, max_len, text, experiments, max_num_batched_tokens=budget, max_num_seqs=seats,
                       limits=limits, seed=seed)  # fmt: skip
        for note in limit_notes(run, plan):
            log(note)
            run.notes.append(note)
        sent = WARMUP_REQUESTS
        for e in run.experiments:
            need = e.requests_needed(plan.repeats)
            for attempt in range(1 + HELD_RETRIES):
                if sent + need > plan.max_requests:
                    run.stopped = f"--max-requests {plan.max_requests} reached"
                    break
                left = deadline - time.perf_counter()
                if left <= 0:
                    run.stopped = f"--budget-s {plan.budget_s:g} spent"
                    break
                if attempt:  # the server held the tokens back: send the experiment again, afresh
                    e.streams, e.injected, e.busy = [], None, []
                job = run_experiment(e, client, url, model, prompts, plan.repeats, origin, timeout_s=plan.timeout_s)
                try:
                    await asyncio.wait_for(job, left)
                except TimeoutError:
                    run.stopped = f"--budget-s {plan.budget_s:g} spent (during {e.label})"
                    break
                sent += e.sent()
                bad = [s.error for s in e.streams if s.error]
                held = held_back(e)
                log(
                    f"{e.label}: {len(e.streams)} requests"
                    + (f", {len(bad)} failed: {bad[0]}" if bad else "")
                    + (f", {held} held back by the server and sent at once" if held else "")
                )
                run.held_back += held
                if not spoiled(e):
                    break
            if run.stopped:
                break
            if bad and len(bad) == len(e.streams) and not any(b.startswith("HTTP 4") for b in bad):
                run.stopped = f"every request of {e.label} failed ({bad[0]})"  # not these requests: the server
                break
        if plan.idle_pauses and not run.stopped:
            room = (deadline - time.perf_counter(), plan.max_requests - sent)
            run.stopped = await idle_experiments(client, url, model, prompts, plan, budget, origin, room, run.wake, log)
        run.seconds = time.perf_counter() - origin
    return run


def probe(
    url: str, model: str, plan: ProbePlan, seed: int | None = None, log: Callable[[str], None] = print
) -> ProbeRun:
    """Run the probe against ``url`` (``http://HOST:PORT/v1``) serving ``model``; returns what it saw. Ends by
    ``plan.budget_s`` seconds (wall clock); ValueError, one line, when the server is not one it can probe.
    ``seed`` draws the prompts; None: a fresh one (``ProbeRun.seed``), so that a second probe of a server does not
    send prompts its prefix cache holds (vLLM caches by default: a cached prompt's prefill is not computed again,
    and its TTFT would time nothing of it)."""
    plan.check()
    seed = C.fresh_seed() if seed is None else seed
    return asyncio.run(_probe(C.check_url(url), model, plan, seed, log))


# ---- fitting and scoring -------------------------------------------------------------------------------------------


@dataclass
class ProbeFit:
    fit: FitResult
    rows: pd.DataFrame  # each inferred iteration: kind, experiment, held out, measured and predicted seconds
    errors: pd.DataFrame  # per kind: fitted, held out, held-out median / p90 |err|, bias
    # the engine's host time: per_iteration_s and per_sequence_s (s), the median one-sequence decode step (s), and
    # the fit's error on the token gaps it was fitted on (n, median, p90 |err|, bias)
    host: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # warnings about the fit (printed, and kept in the report)
    # request handling arriving into running decodes (``busy_handling``): (requests decoding, seconds), by load
    busy: list[tuple[int, float]] = field(default_factory=list)
    # what an idle server adds before a first token (``idle_handling``): (seconds idle, seconds more), by pause
    wake: list[tuple[float, float]] = field(default_factory=list)
    # the experiments left out because they lost requests: index, label, requests failed and sent, the first reason
    lost: list[dict[str, Any]] = field(default_factory=list)

    @property
    def busy_s(self) -> float | None:
        """The handling into the most running decodes measured (s), None if none was."""
        return self.busy[-1][1] if self.busy else None

    @property
    def busy_seqs(self) -> int:
        return self.busy[-1][0] if self.busy else 0


def fit_probe(
    run: ProbeRun, *, spec: ModelSpec, dtype: str, base: HardwareProfile, name: str, settings: dict[str, str]
) -> ProbeFit:
    """Fit a profile to the probe's rows not held out; score it on the held-out experiments' rows. Experiments that
    lost requests are left out of both and named in a note; when more than ``LOST_MAX`` of those run lost some,
    ValueError (one line): the server was failing, and a profile of it would be a profile of its failures."""
    table = iteration_rows(run.experiments, run.max_num_batched_tokens)
    if table.empty or not (~table["held_out"]).any():
        raise ValueError(f"the probe of {run.url} gave no usable timing ({run.stopped or 'every stream failed'})")
    broken, ran = lost(run.experiments), [e for e in run.experiments if e.streams]
    if broken and len(broken) > LOST_MAX * len(ran):
        raise ValueError(
            f"{len(broken)} of the {len(ran)} experiments sent to {run.url} lost requests "
            f"({lost_words(broken[:2])}{'; ...' if len(broken) > 2 else ''}): the server was failing, so no "
            "profile is fitted; fix the server (its limits, its listen queue) or lower --max-concurrency"
        )
    checked = check_iterations(table.drop(columns=["kind", "experiment", "held_out"]), "probe")
    raw = to_raw(checked, spec, dtype, source=f"server at {run.url} ({run.model})")
    raw["client_requests"] = table["client_requests"].to_numpy()
    raw["software"] = json.dumps({"server": run.url, "model": run.model})
    fit = fit_profile(
        raw,
        name=name,
        base=base,
        measurements=f"ferry probe {run.url}",
        settings=settings,
        description=f"the server at {run.url} ({run.model}), probed",
        held=table["held_out"].to_numpy(dtype=bool),
    )
    # the request handling it fitted beside the profile, kept in its settings (``ferry validate --url`` reads it):
    # on an idle server, and arriving into running decodes (the mixed experiments' prompts)
    busy = busy_handling(run, CostModel(spec, fit.profile, dtype=dtype))
    prov = fit.profile.provenance
    handling = {"client_s": f"{fit.client_s:.6g}"}
    if busy:  # one value per load measured, comma-separated (experiments.real.handling reads them)
        handling |= {"client_busy_s": ",".join(f"{t:.6g}" for _, t in busy),
                     "client_busy_seqs": ",".join(str(n) for n, _ in busy)}  # fmt: skip
    wake = idle_handling(run)
    if wake:  # one value per pause measured, comma-separated, as the loads
        handling |= {"client_idle_s": ",".join(f"{t:.6g}" for _, t in wake),
                     "client_idle_after_s": ",".join(f"{p:g}" for p, _ in wake)}  # fmt: skip
    settings = (prov.settings or {}) | handling
    fit.profile = fit.profile.model_copy(update={"provenance": prov.model_copy(update={"settings": settings})})
    rows = table.assign(measured_s=fit.rows["median_s"].to_numpy(), predicted_s=fit.rows["predicted_s"].to_numpy())
    errors = []
    for kind in KINDS:
        sel = rows[rows["kind"] == kind]
        held = sel[sel["held_out"]]
        summary = error_summary(held["predicted_s"].to_numpy(), held["measured_s"].to_numpy())
        errors.append({"kind": kind, "fitted": int((~sel["held_out"]).sum()), "held_out": summary.pop("n")} | summary)
    host, notes = host_check(fit, rows, run.held_back, run.stopped)
    if broken:
        notes.insert(
            0,
            f"warning: {len(broken)} of the {len(ran)} experiments lost requests and are left out of the fit and "
            f"of the held-out error ({lost_words(broken)})",
        )
    index = {id(e): i for i, e in enumerate(run.experiments)}
    left_out = [{"experiment": index[id(e)], "label": e.label, "failed": len(failed(e)), "sent": e.sent(),
                 "first": failed(e)[0].error} for e in broken]  # fmt: skip
    return ProbeFit(fit, rows, pd.DataFrame(errors), host, notes, busy, wake, left_out)
