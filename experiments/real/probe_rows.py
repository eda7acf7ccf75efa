"""From the probe's streams to an iteration table: the rows each experiment's requests time (see ``probe``'s
docstring for what a client sees of an iteration), and which experiments lost requests and are left out."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from experiments.real import client as C
from experiments.real.probe_design import Experiment

WINDOW = 8  # gaps per decode row (their median is the step's time)
# tokens that came in bursts: a window whose median gap is below this share of its mean gap (a server's front end
# behind its engine sends the tokens of several steps back to back), timed by its mean gap (the streams' pace)
BURST = 0.5
MIN_STEP_S = C.MIN_STEP_S  # a window or a steady gap below it saw tokens held back, and is dropped
MERGED = 0.1  # share of a decoding stream's tokens that may come two to a chunk (its gaps are still steps)
ENLARGED = 1.5  # a gap this many times the steady decode gap holds (part of) an injected prompt


def _row(duration: float, decode_ctx: list[float], chunks: list[tuple[int, int]], sampled: int) -> dict[str, Any]:
    return {
        "duration_s": float(duration),
        "num_decode_seqs": len(decode_ctx),
        "decode_context_tokens": float(sum(decode_ctx)),
        "prefill_chunks": json.dumps([list(c) for c in chunks]),
        "prefill_sampled": sampled,
    }


def held_back(e: Experiment) -> int:
    """How many of a decode, batch or mixed experiment's requests the server held back (``client.held_back``)."""
    return 0 if e.kind == "ttft" else sum(C.held_back(s) for s in e.streams)


def spoiled(e: Experiment) -> bool:
    """Whether held-back requests leave ``e`` nothing to time: every request of a decode or batch experiment (the
    others time the steps), any of a mixed one (its prompt's iterations are read from every running request)."""
    held = held_back(e)
    return held > 0 and (e.kind == "mixed" or held == len(e.streams))


def _few_merged(s: C.Stream) -> bool:
    """Whether ``s`` has one token per chunk but for at most ``MERGED`` of its tokens: a chunk that carries two
    (a server's front end that fell behind its engine) spans two steps, which a window's median gap shrugs off."""
    return not s.coalesced or (s.completion_tokens or 0) - len(s.chunk_s) <= MERGED * len(s.chunk_s)


def decode_rows(streams: list[C.Stream]) -> list[dict[str, Any]]:
    """Rows of ``WINDOW`` gaps while every stream is decoding together (see the module docstring). A stream the
    server held back (``client.held_back``) decoded in the same steps but times none of them: it counts in each
    step's batch (its context as far along as the others') and its gaps are left out."""
    good = [s for s in streams if s.ok and len(s.chunk_s) > 2 and _few_merged(s)]
    timing = [s for s in good if not C.held_back(s)]
    if not timing or len(good) < len(streams):
        return []
    lo = max(s.chunk_s[1] for s in timing)  # every stream has taken a decode step
    hi = min(s.chunk_s[-1] for s in timing)  # none has finished
    per_stream = []
    for s in timing:
        t = np.asarray(s.chunk_s)
        k = np.flatnonzero((t[:-1] >= lo) & (t[1:] <= hi))
        per_stream.append((s, k))
    n = min(len(k) for _, k in per_stream)
    held = [s for s in good if C.held_back(s)]
    rows = []
    for start in range(0, n - WINDOW + 1, WINDOW):
        gaps, ctx, pace = [], [], []
        for s, k in per_stream:
            idx = k[start : start + WINDOW]
            gaps.extend(s.gaps_s[idx].tolist())
            pace.append(float(s.gaps_s[idx].mean()))
            ctx.append(s.tokens + float(idx.mean()))
        made = float(np.mean(ctx) - np.mean([s.tokens for s in timing]))  # tokens each has made by then
        ctx += [s.tokens + made for s in held]
        step, mean = float(np.median(gaps)), float(np.median(pace))
        step = step if step >= BURST * mean else mean
        if step >= MIN_STEP_S:
            rows.append(_row(step, ctx, [], 0))
    return rows


def mixed_rows(
    background: list[C.Stream], injected: C.Stream | None, budget: int | None = None
) -> list[dict[str, Any]]:  # fmt: skip
    """Rows of the iterations that computed the injected prompt alongside the running decodes. With the server's
    token budget known, the prompt took ``ceil(P / (budget - B))`` iterations of ``budget - B`` tokens and the rest
    (B running decodes each take a token first, as vLLM V1's one pass does): the last that many enlarged gaps up to
    its first token are they, and an enlarged gap before them (the step during which the server took the request in,
    slowed by that work on a machine that shares its cores) is no prefill. Without it, each enlarged gap is taken
    for an iteration with an equal share of the prompt."""
    good = [s for s in background if s.ok and not s.coalesced]
    if injected is None or not injected.ok or not good or len(good) < len(background):
        return []
    t_sent, t_first = injected.sent_s, injected.chunk_s[0]
    steady = np.concatenate([s.gaps_s[np.asarray(s.chunk_s[1:]) <= t_sent] for s in good])
    if len(steady) < 4:
        return []
    typical = float(np.median(steady[-4 * len(good) :]))
    if typical < MIN_STEP_S:
        return []
    ref = good[0]
    t = np.asarray(ref.chunk_s)
    tol = max(0.25 * typical, 0.002)
    ends = np.flatnonzero((t[1:] > t_sent) & (t[1:] <= t_first + tol)) + 1
    enlarged = [k for k in ends if t[k] - t[k - 1] > ENLARGED * typical]
    if not enlarged or any(t[-1] <= t_first for t in (np.asarray(s.chunk_s) for s in good)):
        return []
    room = (budget or 0) - len(background)
    if room > 0:
        chunks = -(-injected.tokens // room)
        if len(enlarged) < chunks:
            return []  # fewer enlarged gaps than the prompt's iterations: one was not seen
        enlarged = enlarged[-chunks:]
        share = np.array([min(room, injected.tokens - j * room) for j in range(chunks)])
    else:
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
        if float(np.median(gaps)) < typical:  # a step with a prompt is no faster than a decode: tokens in bursts
            return []
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


def failed(e: Experiment) -> list[C.Stream]:
    """The requests of ``e`` that failed (an error, not tokens held back): its injected prompt and busy ones too."""
    sent = [*e.streams, *([e.injected] if e.injected is not None else []), *e.busy]
    return [s for s in sent if s.error is not None]


def lost(experiments: list[Experiment]) -> list[Experiment]:
    """The experiments that lost requests: what they timed is not the batch they were designed to be (a request
    that failed left it, or never joined it), and the server may have been in trouble while they ran."""
    return [e for e in experiments if failed(e)]


def lost_words(experiments: list[Experiment]) -> str:
    """``label: k of n failed (first reason)`` for each of ``experiments``, semicolon-separated."""
    parts = []
    for e in experiments:
        bad = failed(e)
        parts.append(f"{e.label}: {len(bad)} of {e.sent()} failed ({bad[0].error})")
    return "; ".join(parts)


def iteration_rows(experiments: list[Experiment], budget: int | None = None) -> pd.DataFrame:
    """Every experiment's rows with ``kind``, ``experiment`` (its index), ``held_out`` and ``client_requests``; none
    of an experiment that lost requests (``lost``). ``budget``: the server's token budget, if known (``mixed_rows``)."""
    rows = []
    broken = {id(e) for e in lost(experiments)}
    for i, e in enumerate(experiments):
        if id(e) in broken:
            continue
        if e.kind == "ttft":
            got = [r] if (r := ttft_row(e.streams)) else []
        elif e.kind == "mixed":
            got = mixed_rows(e.streams, e.injected, budget)
        else:
            got = decode_rows(e.streams)
        rows += [{"client_requests": 0.0} | r | {"kind": e.kind, "experiment": i, "held_out": e.held_out} for r in got]
    return pd.DataFrame(rows)
