"""The contention meter the real-server timing tests use (tests/contention.py): other work's CPU counts, this
process's own descendants do not, and a failed bound is measured again only on a contended machine. Each check holds
whatever else the machine runs: other work only adds to what is measured as other work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.contention import CONTENDED, Contention, MeasuredAgain, _own_cpu_s, measured

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc")
SPIN = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass\n"  # ends on its own


def test_a_busy_process_outside_this_tree_is_other_work() -> None:
    """A loop re-parented away from this process (its shell exits) keeps one core busy: at least a third of two."""
    out = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!', SPIN], capture_output=True, text=True
    )
    pid = int(out.stdout)
    try:
        time.sleep(0.3)  # started
        with Contention() as load:
            time.sleep(2.0)
    finally:
        os.kill(pid, signal.SIGKILL)
    assert load.share is not None and load.share >= min(0.3, 0.6 / load.cores), load
    assert f"of {load.cores} cores" in str(load)


def test_this_process_own_children_are_not_other_work() -> None:
    """A busy child of this process is its own CPU time where no server is named, and other work's where one is:
    a process an earlier test left running beside the server counts against the measurement."""
    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.3)
        before = (_own_cpu_s(), _own_cpu_s([child.pid]), _own_cpu_s([]))
        time.sleep(2.0)
        after = (_own_cpu_s(), _own_cpu_s([child.pid]), _own_cpu_s([]))
    finally:
        child.kill()
        child.wait()
    tree, named, alone = (b - a for a, b in zip(before, after, strict=True))
    assert tree >= 0.5 and named >= 0.5, (tree, named)  # the child had a core, or a share of one on a busy machine
    assert alone < 0.5 * min(tree, named), (alone, tree, named)  # this process itself only sleeps


def test_a_window_too_short_to_tell_says_so() -> None:
    with Contention() as load:
        pass
    assert load.share is None and "too short" in str(load)


def _loads(*shares: float) -> Callable[[Contention], None]:
    """A stand-in for Contention.__exit__ that gives the windows these shares, in turn."""
    given = iter(shares)
    return lambda self, *exc: setattr(self, "share", next(given))  # type: ignore[misc]


def _check(error: float) -> None:
    assert error < 0.3, error


def test_a_failed_bound_is_measured_once_more(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Contention, "__exit__", _loads(0.5, 0.0))
    results = iter([1.0, 0.1])  # the first measurement, on a busy machine, misses its bound
    attempts: list[int] = []

    def measure(attempt: int) -> float:
        attempts.append(attempt)
        return next(results)

    with pytest.warns(MeasuredAgain, match=r"the replay: passed when measured again, after attempt 1, on a busy"):
        assert measured(measure, _check, "the replay") == 0.1
    assert attempts == [0, 1]
    monkeypatch.setattr(Contention, "__exit__", _loads(0.0))
    assert measured(lambda attempt: 0.2, _check, "the replay") == 0.2  # a pass is measured once


def test_a_second_failure_reports_the_contention_of_both_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Contention, "__exit__", _loads(0.0, 0.05))
    earlier = Contention(share=CONTENDED + 0.3, seconds=10.0)  # the first attempt's probe ran on a busy machine
    with pytest.raises(AssertionError) as failed:
        measured(lambda attempt: 1.0, _check, "the replay", earlier=[earlier])
    message = str(failed.value)
    assert message.startswith("the replay: attempt 1, on a busy machine (other work took 45% of")
    assert "; then attempt 2, on a quiet machine (other work took 5% of" in message and message.count("1.0") >= 2
