"""How busy this machine was with other work, and how fast the server measured ran, while a test timed something real.

A test that times a real server (vLLM, llama.cpp, ferry's own) on a 2-core machine measures that server and whatever
else runs beside it. :class:`Contention` reads, over the very window of the measurement (not before it), the CPU time
the whole machine spent (``/proc/stat``: user, nice, system, irq, softirq, and steal, which a VM's host took) less the
CPU time of the measurement's own processes (``/proc/PID/stat``): this process (the client) and the server's process
tree, or where no server is named, this process and all its descendants. What is left is other work's share of the
machine's cores: 0 on a quiet machine, about 0.5 with one of two cores kept busy by another process, and it counts a
process an earlier test left running beside the server.

A quiet machine is not yet a steady one: this VM's own speed swings by up to 2x within minutes with no other work on
it and no steal counted (whatever the host runs beside it is unseen from inside), so a probe on the fast machine and
a replay on the slow one compare two machines. A :class:`Gauge` reads the measured server's own speed (a
fixed piece of its work: llama-server's one-request decode step, as it reports it) before and after each window;
an attempt whose readings spread by more than ``DRIFT`` ran on a machine that changed speed under it.

A timing test uses both through :func:`measured`: it measures and checks its bounds, and if they fail it measures
again (the probe and the replay both, where the replay builds on a probe). It fails after two failures on a machine
that kept its speed (or at the ``MAX_ATTEMPTS``-th attempt), reporting how busy the machine was and what the gauge
read in each attempt: a failure on a busy or changing machine says so, and one on a quiet, steady machine reads as
the regression it is. The bounds themselves do not move.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (not idle, iowait, or guest: in user)
MIN_WINDOW_S = 1.0  # a shorter window is too few clock ticks (10 ms each) to tell
CONTENDED = 0.15  # other work's share of the cores from which a machine counts as busy
# how far (largest / smallest reading - 1) the gauge of one attempt may spread and still be one machine: on the quiet
# 2-core VM, llama-server's one-request decode step read every 16 s took 8.7-12.1 ms over two minutes (each reading a
# median of three requests); over six probes each with its replay, the readings before the probe, between and after
# the replay spread by 8-30% and the replays' median ITL missed by -22% to +18%; the change that failed one was 2x
DRIFT = 0.3
MAX_ATTEMPTS = 4  # attempts at most, failures on a machine that changed speed included


def _machine_busy_s() -> float | None:
    """CPU seconds all cores have spent busy since boot (None where /proc/stat cannot be read)."""
    try:
        fields = (PROC / "stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    return sum(int(fields[i]) for i in BUSY_FIELDS if i < len(fields)) / CLOCK_TICKS


def _processes() -> dict[int, tuple[int, float]]:
    """Every readable process: pid -> (parent pid, CPU seconds of its own and of its children it has reaped)."""
    found: dict[int, tuple[int, float]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # ended while listed
            continue
        rest = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        # utime, stime, cutime, cstime are fields 14-17 of proc(5), 12-15 of what follows the command's name
        found[int(entry.name)] = (int(rest[1]), sum(int(x) for x in rest[11:15]) / CLOCK_TICKS)
    return found


def _own_cpu_s(roots: Sequence[int] | None = None) -> float:
    """CPU seconds of the measurement's own processes: this process and the trees under ``roots`` (None: this
    process's whole tree). A descendant that ended counts in its parent's time, once reaped."""
    processes = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in processes.items():
        children.setdefault(ppid, []).append(pid)
    me = os.getpid()
    total = 0.0 if roots is None else processes.get(me, (0, 0.0))[1]
    todo = [me] if roots is None else [pid for pid in roots if pid != me]
    while todo:
        pid = todo.pop()
        total += processes.get(pid, (0, 0.0))[1]
        todo += children.get(pid, [])
    return total


class Gauge:
    """The measured server's own speed: each call runs ``read`` (the milliseconds a fixed piece of the server's work
    took, e.g. ``LlamaServer.decode_step_ms``) and keeps the reading, with when it was taken, in ``readings``."""

    def __init__(self, read: Callable[[], float], what: str) -> None:
        self.read, self.what = read, what
        self.readings: list[tuple[float, float]] = []  # (time.monotonic() s, ms)

    def __call__(self) -> float:
        ms = float(self.read())
        self.readings.append((time.monotonic(), ms))
        return ms

    def since(self, t0: float) -> list[float]:
        """The readings taken from ``t0`` (time.monotonic(), s) on, in ms."""
        return [ms for t, ms in self.readings if t >= t0]


def spread(readings: Sequence[float]) -> float | None:
    """How far a gauge's readings spread: largest / smallest - 1 (None for fewer than two)."""
    return max(readings) / min(readings) - 1 if len(readings) >= 2 and min(readings) > 0 else None


@dataclass
class Contention:
    """Other work's share of this machine's cores over a ``with`` block: ``share`` (0..1; None where /proc is not
    readable or the window too short), from ``seconds`` of wall time on ``cores`` cores. ``own``: the pids of the
    servers measured (with their descendants, and this process); None counts this process's whole tree as its own.
    ``gauge``: read just before the window and just after it, into ``speed`` (ms)."""

    share: float | None = None
    seconds: float = 0.0
    cores: int = os.cpu_count() or 1
    own: Sequence[int] | None = None
    gauge: Gauge | None = None
    speed: list[float] = field(default_factory=list)

    def __enter__(self) -> Contention:
        if self.gauge is not None:
            self.speed.append(self.gauge())
        self._start = (time.monotonic(), _machine_busy_s(), _own_cpu_s(self.own))
        return self

    def __exit__(self, *exc: object) -> None:
        wall, busy, own = time.monotonic(), _machine_busy_s(), _own_cpu_s(self.own)
        wall0, busy0, own0 = self._start
        self.seconds = wall - wall0
        if self.gauge is not None and exc[0] is None:
            self.speed.append(self.gauge())
        if busy is None or busy0 is None or self.seconds < MIN_WINDOW_S:
            return
        other = (busy - busy0) - (own - own0)
        self.share = min(max(other / (self.seconds * self.cores), 0.0), 1.0)

    def __str__(self) -> str:
        if self.share is None:
            said = f"contention unknown over {self.seconds:.1f} s (/proc/stat unreadable, or too short a window)"
        else:
            said = f"other work took {self.share:.0%} of {self.cores} cores over {self.seconds:.0f} s"
        if self.speed and self.gauge is not None:
            said += f"; {self.gauge.what} {' then '.join(f'{ms:.1f}' for ms in self.speed)} ms"
        return said


class MeasuredAgain(UserWarning):
    """A bound that failed once and held when measured again."""


def measured(
    measure: Callable[[int], T],
    check: Callable[[T], None],
    what: str,
    earlier: Sequence[Contention] = (),
    own: Sequence[int] | None = None,
    gauge: Gauge | None = None,
) -> T:
    """``measure(attempt)`` under a :class:`Contention` of ``own`` (read by ``gauge`` before and after), then
    ``check(result)``, which asserts the bounds. ``earlier``: the contention of what the first attempt builds on,
    measured before it (a module fixture's probe); a later attempt (``attempt`` 1, 2, ...) measures all of it again,
    and the gauge's readings from its start are its own. A check that fails is measured again: one measurement is one
    draw on a machine that other work may share and whose speed may change, and a wrong time (the wrong moment, unit
    or model) fails every draw. The test fails at the second failure on a machine whose gauge kept within ``DRIFT``
    (or, with no gauge, at the second failure), or at the ``MAX_ATTEMPTS``-th, with each attempt's contention, gauge
    and error in its message; a later attempt that passes warns (:class:`MeasuredAgain`) with the earlier ones'."""
    tries: list[str] = []
    steady_failures = 0
    for attempt in range(MAX_ATTEMPTS):
        started = time.monotonic()
        with Contention(own=own, gauge=gauge) as load:
            result = measure(attempt)
        loads = [*(earlier if attempt == 0 else ()), load]
        try:
            check(result)
            if tries:  # passed when measured again: said in pytest's warnings summary, so a flaky bound shows
                warnings.warn(f"{what}: passed when measured again, after {'; '.join(tries)}", MeasuredAgain,
                              stacklevel=2)  # fmt: skip
            return result
        except AssertionError as exc:
            busy = any(x.share is not None and x.share >= CONTENDED for x in loads)
            state = "a busy machine" if busy else "a quiet machine"
            readings = [ms for x in loads[:-1] for ms in x.speed] + (gauge.since(started) if gauge else [])
            moved = spread(readings)
            if moved is not None and moved > DRIFT:
                state += f" whose speed changed by {moved:.0%} ({gauge.what if gauge else 'gauge'})"
            else:
                steady_failures += 1
            tries.append(f"attempt {attempt + 1}, on {state} ({'; '.join(map(str, loads))}): {exc}")
            if steady_failures == 2:
                break
    raise AssertionError(f"{what}: " + "; then ".join(tries))
