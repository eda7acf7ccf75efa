"""What ``ferry probe`` says about a probe and its fit: the warnings on the server's limits (unknown, or told twice
differently), the fit's check on the token gaps it was fitted on with the engine's host time per step, and the
report it prints."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd

from costmodel.calibration.fit import error_summary
from costmodel.calibration.profile import FitResult
from experiments.real.probe_design import ProbePlan

if TYPE_CHECKING:
    from experiments.real.probe import ProbeFit, ProbeRun

WARMUP_REQUESTS = 3  # requests the probe sends before its experiments (the first checks and warm-ups)
# the fit is checked on the token gaps it was fitted on before it is trusted: a median |error| or a bias beyond these
# there says its curves and host time do not describe the server's steps (noise, other load, a regime it misses)
GAP_CHECK_MEDIAN = 0.25
GAP_CHECK_BIAS = 0.15
GAP_CHECK_MIN = 10  # fewer token gaps fitted than this: the decode steps are barely measured


def limit_notes(run: ProbeRun, plan: ProbePlan) -> list[str]:
    """Warnings for the scheduler limits that are unknown (or said twice, differently): one line when the budget is
    unknown, naming the seats too when they are unknown as well, and where vLLM states them (they are not guessed).
    Seats alone unknown cost only the batch experiments above them, which give no rows: no warning."""
    budget = _budget_note(run, plan, run.limits.max_num_batched_tokens)
    told = run.limits.max_num_seqs
    if budget and run.max_num_batched_tokens is None:
        if run.max_num_seqs is None:
            largest = max([e.requests for e in run.experiments if e.kind == "batch"], default=0)
            budget += (
                "; its max_num_seqs is unknown too (give --max-num-seqs): a batch above it waits for seats and gives "
                f"no token gap; batches go up to {largest} requests"
            )
        unknown = run.limits.unknown_note()
        budget += f"; {unknown}" if unknown else ""
    seats = None
    if told is not None and plan.max_num_seqs is not None and told != plan.max_num_seqs:
        seats = f"note: --max-num-seqs {plan.max_num_seqs} kept, where the server says {told}"
    return [n for n in (budget, seats) if n]


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


def host_check(
    fit: FitResult, rows: pd.DataFrame, held_back: int = 0, stopped: str = ""
) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """The fitted host time per step beside a one-sequence decode step, and the fit checked on the gaps it was
    fitted on (``rows``: ``fit_probe``'s, with measured and predicted seconds); a warning when it misses them."""
    ov = fit.profile.overheads
    decode = rows[rows["kind"] == "decode"]["measured_s"]
    step = float(decode.median()) if len(decode) else math.nan
    gaps = rows[rows["kind"].isin(["decode", "batch"]) & ~rows["held_out"]]
    check = error_summary(gaps["predicted_s"].to_numpy(), gaps["measured_s"].to_numpy())
    host = {
        "per_iteration_s": ov.per_iteration_s.value,
        "per_sequence_s": ov.per_sequence_s.value,
        "per_prefill_s": ov.per_prefill_s.value if ov.per_prefill_s is not None else 0.0,
        "decode_step_s": step,
        "host_share_of_decode_step": ov.per_iteration_s.value / step if step > 0 else math.nan,
        "fitted_gap_error": check,
    }
    notes = []
    held_words = f"; the server held back {held_back} requests' tokens and sent them at once" if held_back else ""
    if check["n"] < GAP_CHECK_MIN and stopped:
        pass  # the probe stopped early, which its report says first
    elif check["n"] < GAP_CHECK_MIN:
        notes.append(
            f"warning: {check['n']} token gaps were fitted (no decode or batch experiment gave rows, or few): "
            f"ITL is barely measured{held_words}"
        )
    elif check["median"] > GAP_CHECK_MEDIAN or abs(check["bias"]) > GAP_CHECK_BIAS:
        notes.append(
            f"warning: the profile misses the {check['n']} token gaps it was fitted on (median |error| "
            f"{100 * check['median']:.1f}%, bias {100 * check['bias']:+.1f}%): its ITL is not to be trusted; see "
            "the decode and batch rows of PROFILE.probe.csv (other load on the server, or steps it does not model)"
        )
    return host, notes


WHAT = {
    "ttft": "time to first token",
    "decode": "token gap, 1 request",
    "batch": "token gap, batched",
    "mixed": "gap with a prompt",
}


def _idle_lines(wake: list[tuple[float, float]]) -> list[str]:
    """What an idle server added before its first token, by pause (none when it was not measured)."""
    if not wake:
        return []
    after = ", ".join(f"+{1e3 * t:.2f} ms after {p:g} s" for p, t in wake)
    return [f"an idle server's first token, against one sent to it awake: {after} of silence (client_idle_s)"]


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
        f"request handling before the first token (client_s): {1e3 * fitted.fit.client_s:.2f} ms"
        + "".join(f", {1e3 * t:.2f} ms into {n} running decodes" for n, t in fitted.busy)
        + (" (client_busy_s)" if fitted.busy else ""),
        *_idle_lines(fitted.wake),
        _host_line(fitted.host),
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
    return "\n".join(lines + run.notes + fitted.notes)


def _host_line(host: dict[str, Any]) -> str:
    """The fitted host time per step, beside a one-sequence decode step, and the fit's error on its fitted gaps."""
    step, check = host["decode_step_s"], host["fitted_gap_error"]
    share = (
        f", {100 * host['host_share_of_decode_step']:.0f}% of a one-sequence decode step ({1e3 * step:.2f} ms)"
        if step > 0
        else ""
    )
    gaps = "" if not check["n"] else (
        f"; on the {check['n']} gaps it was fitted on: median |error| {100 * check['median']:.1f}%, "
        f"bias {100 * check['bias']:+.1f}%"
    )  # fmt: skip
    return (
        f"engine host time per step (per_iteration_s): {1e3 * host['per_iteration_s']:.2f} ms{share}, "
        f"per sequence {1e3 * host['per_sequence_s']:.3f} ms, per prompt chunk {1e3 * host['per_prefill_s']:.2f} ms"
        f"{gaps}"
    )
