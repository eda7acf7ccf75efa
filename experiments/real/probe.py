"""``ferry probe``: run the designed experiments against a live server (``probe_design``), infer its iteration times
from the streams, fit a profile to them, and score it on the requests it did not fit.

From the client's side an iteration is seen as the gap between two streamed tokens of a request it served (a token
goes out when the iteration that made it ends), and a prefill as a time to first token. So:
- a ``ttft`` experiment gives one row: a prefill of its prompt, the median TTFT of its repeats, which also holds the
  server's handling of a request (parsing, tokenizing, queueing for the next step, the network): fitted as one
  constant, ``client_s``, that every TTFT row pays and no gap does;
- ``decode`` and ``batch`` experiments give rows of ``WINDOW`` consecutive gaps while the same requests are all
  decoding (after each one's first decode step, before any finishes): the median gap is the step's time, the
  contexts are each request's prompt plus the tokens it has made;
- a ``mixed`` experiment gives the running requests' enlarged gaps up to the injected prompt's first token: each an
  iteration with the running decodes and an equal share of the prompt.
The rows are an iteration table (``costmodel.calibration.iterations``) and are fitted the same way as
``ferry calibrate --from-iterations``, with the held-out experiments' rows scored only.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from costmodel.calibration.fit import error_summary
from costmodel.calibration.iterations import check_iterations, to_raw
from costmodel.calibration.profile import FitResult, fit_profile
from costmodel.hardware import HardwareProfile
from costmodel.model_spec import ModelSpec
from experiments.real import client as C
from experiments.real.client import Prompts
from experiments.real.probe_design import KINDS, Experiment, ProbePlan, design, run_experiment, seeded_prompts

WINDOW = 8  # gaps per decode row (their median is the step's time)
ENLARGED = 1.5  # a gap this many times the steady decode gap holds (part of) an injected prompt
WARMUP_REQUESTS = 3


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

    def streams(self) -> list[C.Stream]:
        return [s for e in self.experiments for s in [*e.streams, *([e.injected] if e.injected else [])]]


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


def _budget_note(run: ProbeRun, plan: ProbePlan, told: int | None) -> str | None:
    """A warning when the server's per-iteration token budget is unknown (or said twice, differently)."""
    if run.max_num_batched_tokens is None:
        longest = max(e.inject or e.prompt for e in run.experiments if e.kind in ("ttft", "mixed"))
        return (
            "warning: the server's per-iteration token budget is unknown (give --max-num-batched-tokens): a prompt "
            f"above it is chunked by the server but timed here as one iteration; prompts go up to {longest} tokens"
        )
    if told is not None and plan.max_num_batched_tokens is not None and told != plan.max_num_batched_tokens:
        return f"note: --max-num-batched-tokens {plan.max_num_batched_tokens} kept, where the server says {told}"
    return None


async def _probe(url: str, model: str, plan: ProbePlan, seed: int, log: Callable[[str], None]) -> ProbeRun:
    origin = time.perf_counter()
    deadline = origin + plan.budget_s
    async with C.new_client(plan.max_concurrency, plan.timeout_s) as client:
        stage = [f"GET {url}/models"]
        try:
            async with asyncio.timeout(plan.budget_s):
                card, prompts, text = await _first_checks(client, url, model, plan, seed, origin, stage, log)
        except TimeoutError:
            raise ValueError(
                f"{url}: --budget-s {plan.budget_s:g} spent before the probe's first checks ended (at {stage[0]})"
            ) from None
        max_len, told = C.card_int(card, "max_model_len"), C.card_int(card, "max_num_batched_tokens")
        budget = plan.max_num_batched_tokens or told
        run = ProbeRun(url, model, max_len, text, design(plan, max_len, budget), max_num_batched_tokens=budget)
        if note := _budget_note(run, plan, told):
            log(note)
            run.notes.append(note)
        sent = WARMUP_REQUESTS
        for e in run.experiments:
            need = e.requests * (plan.repeats if e.kind == "ttft" else 1) + (e.kind == "mixed")
            if sent + need > plan.max_requests:
                run.stopped = f"--max-requests {plan.max_requests} reached"
                break
            left = deadline - time.perf_counter()
            if left <= 0:
                run.stopped = f"--budget-s {plan.budget_s:g} spent"
                break
            job = run_experiment(e, client, url, model, prompts, plan.repeats, origin, timeout_s=plan.timeout_s)
            try:
                await asyncio.wait_for(job, left)
            except TimeoutError:
                run.stopped = f"--budget-s {plan.budget_s:g} spent (during {e.label})"
                break
            sent += e.sent()
            bad = [s.error for s in e.streams if s.error]
            log(f"{e.label}: {len(e.streams)} requests" + (f", {len(bad)} failed: {bad[0]}" if bad else ""))
            if bad and len(bad) == len(e.streams) and not any(b.startswith("HTTP 4") for b in bad):
                run.stopped = f"every request of {e.label} failed ({bad[0]})"  # not these requests: the server
                break
        run.seconds = time.perf_counter() - origin
    return run


def probe(url: str, model: str, plan: ProbePlan, seed: int = 0, log: Callable[[str], None] = print) -> ProbeRun:
    """Run the probe against ``url`` (``http://HOST:PORT/v1``) serving ``model``; returns what it saw. Ends by
    ``plan.budget_s`` seconds (wall clock); ValueError, one line, when the server is not one it can probe."""
    plan.check()
    return asyncio.run(_probe(C.check_url(url), model, plan, seed, log))


# ---- from streams to iterations -----------------------------------------------------------------------------------


def _row(duration: float, decode_ctx: list[float], chunks: list[tuple[int, int]], sampled: int) -> dict[str, Any]:
    return {
        "duration_s": float(duration),
        "num_decode_seqs": len(decode_ctx),
        "decode_context_tokens": float(sum(decode_ctx)),
        "prefill_chunks": json.dumps([list(c) for c in chunks]),
        "prefill_sampled": sampled,
    }


def decode_rows(streams: list[C.Stream]) -> list[dict[str, Any]]:
    """Rows of ``WINDOW`` gaps while every stream is decoding together (see the module docstring)."""
    good = [s for s in streams if s.ok and not s.coalesced and len(s.chunk_s) > 2]
    if not good or len(good) < len(streams):
        return []
    lo = max(s.chunk_s[1] for s in good)  # every stream has taken a decode step
    hi = min(s.chunk_s[-1] for s in good)  # none has finished
    per_stream = []
    for s in good:
        t = np.asarray(s.chunk_s)
        k = np.flatnonzero((t[:-1] >= lo) & (t[1:] <= hi))
        per_stream.append((s, k))
    n = min(len(k) for _, k in per_stream)
    rows = []
    for start in range(0, n - WINDOW + 1, WINDOW):
        gaps, ctx = [], []
        for s, k in per_stream:
            idx = k[start : start + WINDOW]
            gaps.extend(s.gaps_s[idx].tolist())
            ctx.append(s.tokens + float(idx.mean()))
        rows.append(_row(float(np.median(gaps)), ctx, [], 0))
    return rows


def mixed_rows(background: list[C.Stream], injected: C.Stream | None) -> list[dict[str, Any]]:
    """Rows of the iterations that computed the injected prompt alongside the running decodes."""
    good = [s for s in background if s.ok and not s.coalesced]
    if injected is None or not injected.ok or not good or len(good) < len(background):
        return []
    t_sent, t_first = injected.sent_s, injected.chunk_s[0]
    steady = np.concatenate([s.gaps_s[np.asarray(s.chunk_s[1:]) <= t_sent] for s in good])
    if len(steady) < 4:
        return []
    typical = float(np.median(steady[-4 * len(good) :]))
    ref = good[0]
    t = np.asarray(ref.chunk_s)
    tol = max(0.25 * typical, 0.002)
    ends = np.flatnonzero((t[1:] > t_sent) & (t[1:] <= t_first + tol)) + 1
    enlarged = [k for k in ends if t[k] - t[k - 1] > ENLARGED * typical]
    if not enlarged or any(t[-1] <= t_first for t in (np.asarray(s.chunk_s) for s in good)):
        return []
    share = np.full(len(enlarged), injected.tokens // len(enlarged))
    share[: injected.tokens % len(enlarged)] += 1
    rows, done = [], 0
    for j, k in enumerate(enlarged):
        when = t[k]
        gaps, ctx = [], []
        for s in good:  # the gap of each stream that ends with this iteration
            ts = np.asarray(s.chunk_s)
            m = int(np.argmin(np.abs(ts - when)))
            if m == 0 or abs(ts[m] - when) > tol:
                return []
            gaps.append(ts[m] - ts[m - 1])
            ctx.append(s.tokens + m - 1.0)
        last = j == len(enlarged) - 1
        rows.append(_row(float(np.median(gaps)), ctx, [(int(share[j]), done)], int(last)))
        done += int(share[j])
    return rows


def ttft_row(streams: list[C.Stream]) -> dict[str, Any] | None:
    good = [s for s in streams if s.ok]
    if not good:
        return None
    tokens = int(np.median([s.tokens for s in good]))
    row = _row(float(np.median([s.ttft_s for s in good])), [], [(tokens, 0)], 1)
    return row | {"client_requests": 1.0}


def iteration_rows(run: ProbeRun) -> pd.DataFrame:
    """Every experiment's rows with ``kind``, ``experiment`` (its index), ``held_out`` and ``client_requests``."""
    rows = []
    for i, e in enumerate(run.experiments):
        if e.kind == "ttft":
            got = [r] if (r := ttft_row(e.streams)) else []
        elif e.kind == "mixed":
            got = mixed_rows(e.streams, e.injected)
        else:
            got = decode_rows(e.streams)
        rows += [{"client_requests": 0.0} | r | {"kind": e.kind, "experiment": i, "held_out": e.held_out} for r in got]
    return pd.DataFrame(rows)


# ---- fitting and scoring -------------------------------------------------------------------------------------------


@dataclass
class ProbeFit:
    fit: FitResult
    rows: pd.DataFrame  # each inferred iteration: kind, experiment, held out, measured and predicted seconds
    errors: pd.DataFrame  # per kind: fitted, held out, held-out median / p90 |err|, bias


def fit_probe(
    run: ProbeRun, *, spec: ModelSpec, dtype: str, base: HardwareProfile, name: str, settings: dict[str, str]
) -> ProbeFit:
    """Fit a profile to the probe's rows not held out; score it on the held-out experiments' rows."""
    table = iteration_rows(run)
    if table.empty or not (~table["held_out"]).any():
        raise ValueError(f"the probe of {run.url} gave no usable timing ({run.stopped or 'every stream failed'})")
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
    # the request handling it fitted beside the profile, kept in its settings (``ferry validate --url`` reads it)
    prov = fit.profile.provenance
    settings = (prov.settings or {}) | {"client_s": f"{fit.client_s:.6g}"}
    fit.profile = fit.profile.model_copy(update={"provenance": prov.model_copy(update={"settings": settings})})
    rows = table.assign(measured_s=fit.rows["median_s"].to_numpy(), predicted_s=fit.rows["predicted_s"].to_numpy())
    errors = []
    for kind in KINDS:
        sel = rows[rows["kind"] == kind]
        held = sel[sel["held_out"]]
        summary = error_summary(held["predicted_s"].to_numpy(), held["measured_s"].to_numpy())
        errors.append({"kind": kind, "fitted": int((~sel["held_out"]).sum()), "held_out": summary.pop("n")} | summary)
    return ProbeFit(fit, rows, pd.DataFrame(errors))


WHAT = {
    "ttft": "time to first token",
    "decode": "token gap, 1 request",
    "batch": "token gap, batched",
    "mixed": "gap with a prompt",
}


def format_report(run: ProbeRun, fitted: ProbeFit) -> str:
    sent = run.streams()
    failed = [s for s in sent if s.error]
    counted = [s for s in sent if s.prompt_tokens is not None]
    exact = sum(s.prompt_tokens == s.prompt_sent for s in counted)
    lines = [
        f"ferry probe: {run.url} ({run.model}), {len(sent) + WARMUP_REQUESTS} requests in {run.seconds:.1f} s"
        + (f"; stopped early: {run.stopped}" if run.stopped else ""),
        f"prompts: {'words' if run.text_prompts else 'token ids'}; the server counted {exact} of {len(counted)} "
        "exactly as sent" + (f"; {len(failed)} requests failed ({failed[0].error})" if failed else ""),
        f"request handling before the first token (client_s): {1e3 * fitted.fit.client_s:.2f} ms",
        "held-out error (experiments never fitted on; |predicted / measured - 1|):",
        f"{'':<24} {'fitted':>6} {'held out':>8} {'median':>8} {'p90':>8} {'bias':>8}",
    ]
    for r in fitted.errors.to_dict(orient="records"):

        def pct(x: float, sign: str = "") -> str:
            return "-" if not math.isfinite(x) else f"{100 * x:{sign}.1f}%"

        lines.append(
            f"{WHAT[r['kind']]:<24} {r['fitted']:>6} {r['held_out']:>8} {pct(r['median']):>8} {pct(r['p90']):>8} "
            f"{pct(r['bias'], '+'):>8}"
        )
    return "\n".join(lines + run.notes)
