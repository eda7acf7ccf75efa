"""The request handling a live server adds before a first token, beyond the iterations that compute it: what
``ferry probe`` measured (kept in its profile's settings) and what ``ferry validate --url`` adds to each simulated
TTFT before comparing it with the real one.

The probe measures it on an idle server (``client_s``: HTTP, parsing, the engine's pick-up, the first token's way
back) and arriving into running decodes, at a light and a heavy load (``client_busy_s`` at ``client_busy_seqs``
requests decoding, comma-separated, one per load): a server's front end streams every running request's tokens,
and a new request's handling waits behind that work. Between the loads measured, the handling is interpolated
linearly in the requests in flight, and held at the heaviest beyond it: the line between measured points is an
assumption."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from costmodel.hardware import HardwareProfile

FloatArray = npt.NDArray[np.float64]


def _setting(hardware: HardwareProfile, key: str) -> str | None:
    return (hardware.provenance.settings or {}).get(key) or None


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


def handling_of(
    arrival: FloatArray, finish: FloatArray, idle_s: float, busy: list[tuple[int, float]]
) -> FloatArray:  # fmt: skip
    """Per request, the handling a client waits beyond its simulated TTFT (s), by the requests in flight in the
    simulation at its arrival (arrived, not finished): ``idle_s`` with none, through the ``busy`` points (requests
    decoding, s) linearly, held at the last beyond it."""
    a, f = np.sort(arrival), np.sort(finish)
    in_flight = np.searchsorted(a, arrival, side="right") - 1 - np.searchsorted(f, arrival, side="right")
    loads = np.array([0.0] + [float(n) for n, _ in busy])
    times = np.array([idle_s] + [t for _, t in busy])
    return np.interp(in_flight.astype(np.float64), loads, times)
