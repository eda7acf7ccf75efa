"""How busy this machine was with other work while a test timed something real.

A test that times a real server (vLLM, llama.cpp, ferry's own) on a 2-core machine measures that server and whatever
else runs beside it. :class:`Contention` reads, over the very window of the measurement (not before it), the CPU time
the whole machine spent (``/proc/stat``: user, nice, system, irq, softirq, and steal, which a VM's host took) less the
CPU time of the measurement's own processes (``/proc/PID/stat``): this process (the client) and the server's process
tree, or where no server is named, this process and all its descendants. What is left is other work's share of the
machine's cores: 0 on a quiet machine, about 0.5 with one of two cores kept busy by another process, and it counts a
process an earlier test left running beside the server.

A timing test uses it through :func:`measured`: it measures and checks its bounds, and if they fail it measures once
more (the probe and the replay both, where the replay builds on a probe); a second failure reports how busy the
machine was in each attempt, so a failure on a busy machine says so, and one on a quiet machine reads as the
regression it is. The bounds themselves do not move.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
PROC = Path("/proc")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user, nice, system, irq, softirq, steal (not idle, iowait, or guest: in user)
MIN_WINDOW_S = 1.0  # a shorter window is too few clock ticks (10 ms each) to tell
CONTENDED = 0.15  # other work's share of the cores from which a machine counts as busy


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


@dataclass
class Contention:
    """Other work's share of this machine's cores over a ``with`` block: ``share`` (0..1; None where /proc is not
    readable or the window too short), from ``seconds`` of wall time on ``cores`` cores. ``own``: the pids of the
    servers measured (with their descendants, and this process); None counts this process's whole tree as its own."""

    share: float | None = None
    seconds: float = 0.0
    cores: int = os.cpu_count() or 1
    own: Sequence[int] | None = None

    def __enter__(self) -> Contention:
        self._start = (time.monotonic(), _machine_busy_s(), _own_cpu_s(self.own))
        return self

    def __exit__(self, *exc: object) -> None:
        wall, busy, own = time.monotonic(), _machine_busy_s(), _own_cpu_s(self.own)
        wall0, busy0, own0 = self._start
        self.seconds = wall - wall0
        if busy is None or busy0 is None or self.seconds < MIN_WINDOW_S:
            return
        other = (busy - busy0) - (own - own0)
        self.share = min(max(other / (self.seconds * self.cores), 0.0), 1.0)

    def __str__(self) -> str:
        if self.share is None:
            return f"contention unknown over {self.seconds:.1f} s (/proc/stat unreadable, or too short a window)"
        return f"other work took {self.share:.0%} of {self.cores} cores over {self.seconds:.0f} s"


class MeasuredAgain(UserWarning):
    """A bound that failed once and held when measured again."""


def measured(
    measure: Callable[[int], T],
    check: Callable[[T], None],
    what: str,
    earlier: Sequence[Contention] = (),
    own: Sequence[int] | None = None,
) -> T:
    """``measure(attempt)`` under a :class:`Contention` of ``own``, then ``check(result)``, which asserts the bounds.
    ``earlier``: the contention of what the first attempt builds on, measured before it (a module fixture's probe);
    the second attempt (``attempt`` 1) measures all of it again. A check that fails is measured once more: one
    measurement is one draw on a machine that other work may share, and a wrong time (the wrong moment, unit or
    model) fails both. A second failure fails the test with each attempt's contention and error in its message; a
    second attempt that passes warns (:class:`MeasuredAgain`) with the first one's."""
    tries: list[str] = []
    for attempt in range(2):
        with Contention(own=own) as load:
            result = measure(attempt)
        loads = [*(earlier if attempt == 0 else ()), load]
        try:
            check(result)
            if tries:  # passed the second time: said in pytest's warnings summary, so a flaky bound shows
                warnings.warn(f"{what}: passed when measured again, after {tries[0]}", MeasuredAgain, stacklevel=2)
            return result
        except AssertionError as exc:
            busy = any(x.share is not None and x.share >= CONTENDED for x in loads)
            state = "a busy machine" if busy else "a quiet machine"
            tries.append(f"attempt {attempt + 1}, on {state} ({'; '.join(map(str, loads))}): {exc}")
    raise AssertionError(f"{what}: " + "; then ".join(tries))
