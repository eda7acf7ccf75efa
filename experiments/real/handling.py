"""The request handling a live server adds before a first token, beyond the iterations that compute it: what
``ferry probe`` measured (kept in its profile's settings) and what ``ferry validate --url`` adds to each simulated
TTFT before comparing it with the real one.

The probe measures it on an idle server (``client_s``: HTTP, parsing, the engine's pick-up, the first token's way
back) and arriving into running decodes, at a light and a heavy load (``client_busy_s`` at ``client_busy_seqs``
requests decoding, comma-separated, one per load): a server's front end streams every running request's tokens,
and a new request's handling waits behind that work. Between the loads measured, the handling is interpolated
linearly in the requests in flight, and held at the heaviest beyond it: the line between measured points is an
assumption.

A server left idle adds more (``client_idle_s`` after ``client_idle_after_s`` seconds of silence, one value per
pause the probe measured): its engine or its threads go to sleep, and its next first token comes later than one
sent to it awake (vLLM 0.32 on a CPU: about 4 ms more after 0.3 s, 5 ms after a second). A request arriving with
none in flight waits that much more, by how long the simulated server had been without one (since the last
response ended; the whole run before the first), linearly between the pauses measured and held beyond the last."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from costmodel import CostModel, IterationShape
from costmodel.hardware import HardwareProfile

if TYPE_CHECKING:
    from experiments.real.probe import ProbeRun

FloatArray = npt.NDArray[np.float64]


def _setting(hardware: HardwareProfile, key: str) -> str | None:
    return (hardware.provenance.settings or {}).get(key) or None


def handling_measured(hardware: HardwareProfile) -> bool:
    """Whether a profile's probe measured the handling on an idle server (``client_s``, which may be 0)."""
    return _setting(hardware, "client_s") is not None


def measured_handling(hardware: HardwareProfile) -> tuple[float, list[tuple[int, float]]]:
    """The handling a profile's probe measured: on an idle server (s), and (requests decoding, s) by load, sorted
    (empty when it measured none; older profiles hold one load). ValueError, one line, for settings that do not
    parse."""
    idle = float(_setting(hardware, "client_s") or 0.0)
    seconds, seqs = _setting(hardware, "client_busy_s"), _setting(hardware, "client_busy_seqs")
    if seconds is None:
        return idle, []
    try:
        times = [float(x) for x in seconds.split(",")]
        counts = [int(x) for x in (seqs or "1").split(",")]
    except ValueError:
        raise ValueError(
            f"profile {hardware.name!r}: client_busy_s {seconds!r} and client_busy_seqs {seqs!r} must be "
            "comma-separated numbers"
        ) from None
    if len(times) != len(counts) or min(counts) < 1 or min(times) < 0:
        raise ValueError(
            f"profile {hardware.name!r}: client_busy_s {seconds!r} and client_busy_seqs {seqs!r} must pair one "
            "handling >= 0 with each load >= 1"
        )
    return idle, sorted(zip(counts, times, strict=True))


def measured_wake(hardware: HardwareProfile) -> list[tuple[float, float]]:
    """What a profile's probe measured an idle server to add before a first token: (seconds idle, seconds more), by
    pause (empty when it measured none). ValueError, one line, for settings that do not parse."""
    seconds, after = _setting(hardware, "client_idle_s"), _setting(hardware, "client_idle_after_s")
    if seconds is None and after is None:
        return []
    try:
        times = [float(x) for x in (seconds or "").split(",")]
        pauses = [float(x) for x in (after or "").split(",")]
    except ValueError:
        times, pauses = [], []
    if not times or len(times) != len(pauses) or min(times) < 0 or pauses != sorted(set(pauses)) or pauses[0] <= 0:
        raise ValueError(
            f"profile {hardware.name!r}: client_idle_s {seconds!r} and client_idle_after_s {after!r} must pair one "
            "time >= 0 with each pause > 0, the pauses rising, comma-separated"
        )
    return list(zip(pauses, times, strict=True))


def handling_of(
    arrival: FloatArray, finish: FloatArray, idle_s: float, busy: list[tuple[int, float]],
    wake: list[tuple[float, float]] | None = None,
) -> FloatArray:  # fmt: skip
    """Per request, the handling a client waits beyond its simulated TTFT (s), by the requests in flight in the
    simulation at its arrival (arrived, not finished): ``idle_s`` with none, through the ``busy`` points (requests
    decoding, s) linearly, held at the last beyond it; with none in flight, also what the server's silence since the
    last response ended adds (``wake``: (seconds idle, seconds more), linearly from none at 0, held beyond the last;
    the first request finds the server idle since before the run)."""
    a, f = np.sort(arrival), np.sort(finish[np.isfinite(finish)])
    in_flight = np.searchsorted(a, arrival, side="right") - 1 - np.searchsorted(f, arrival, side="right")
    loads = np.array([0.0] + [float(n) for n, _ in busy])
    times = np.array([idle_s] + [t for _, t in busy])
    out = np.interp(in_flight.astype(np.float64), loads, times)
    if wake:
        ended = np.searchsorted(f, arrival, side="left")  # responses that ended before the arrival
        last = np.where(ended > 0, f[np.maximum(ended - 1, 0)], -np.inf)
        silent = np.where(in_flight <= 0, arrival - last, 0.0)
        pauses = np.array([0.0] + [p for p, _ in wake])
        extra = np.array([0.0] + [t for _, t in wake])
        out = out + np.interp(np.minimum(silent, pauses[-1]), pauses, extra)
    return out


# ---- what the probe measured -----------------------------------------------------------------------------------------


def busy_handling(run: ProbeRun, cost: CostModel) -> list[tuple[int, float]]:
    """Seconds a request waits for its first token beyond its iterations when it arrives into running decodes, for
    each number of requests decoding that a mixed experiment measured (sorted by it): the median over those
    experiments' prompts (the injected one and the short ones after it) of each TTFT less the iterations that
    computed it (the prompt in chunks of the server's budget, beside one token of each running request, as ``cost``
    times them) and half a decode step (the mean wait for the step in progress). Empty without a mixed experiment
    that finished. A busy server's front end streams every running request's tokens, so this is larger than
    ``client_s``, and it is measured at a light and a heavy load because it does not grow in proportion: on a 2-core
    CPU, vLLM's API server is already slowed by 2 streams about as much as by 16."""
    budget = run.max_num_batched_tokens or 1 << 30
    waits: dict[int, list[float]] = {}
    for e in run.experiments:
        running = [s for s in e.streams if s.ok]
        if e.kind != "mixed" or not running or budget <= len(running):
            continue
        if any(s is not None and s.error is not None for s in [*e.streams, e.injected, *e.busy]):
            continue  # an experiment that lost requests (``probe.lost``): left out, as from the fit
        for got in [s for s in [e.injected, *e.busy] if s is not None and s.ok]:
            ctx = [s.tokens + int(np.searchsorted(np.asarray(s.chunk_s), got.sent_s)) for s in running]
            step = cost.iteration_time(IterationShape.of(decode=[(1, c) for c in ctx]))
            busy, done = 0.5 * step, 0
            while done < got.tokens:
                n = min(budget - len(running), got.tokens - done)
                last = int(done + n == got.tokens)
                shape = IterationShape.of(prefill=[(n, done)], decode=[(1, c) for c in ctx], prefill_sampled=last)
                busy, done = busy + cost.iteration_time(shape), done + n
            waits.setdefault(e.requests, []).append(got.ttft_s - busy)
    return [(seqs, max(0.0, float(np.median(w)))) for seqs, w in sorted(waits.items())]


def idle_handling(run: ProbeRun) -> list[tuple[float, float]]:
    """Seconds a first token comes later after each pause of the idle experiments than when sent the moment the
    last response ended: the median TTFT after that pause less the median at none (never below 0), by pause. Empty
    without the experiments, or where a pause, or none, has no request that finished."""
    times: dict[float, list[float]] = {}
    for pause, s in run.wake:
        if s.ok:
            times.setdefault(pause, []).append(s.ttft_s)
    if 0.0 not in times or len(times) < 2:
        return []
    awake = float(np.median(times.pop(0.0)))
    return [(pause, max(0.0, float(np.median(t)) - awake)) for pause, t in sorted(times.items())]
