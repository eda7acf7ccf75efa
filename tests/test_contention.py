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

from tests.contention import (
    CONTENDED,
    DRIFT,
    MAX_ATTEMPTS,
    Contention,
    Gauge,
    MeasuredAgain,
    _own_cpu_s,
    measured,
    spread,
)

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


def _gauge(*readings: float) -> Gauge:
    """A gauge that reads these milliseconds, in turn."""
    given = iter(readings)
    return Gauge(lambda: next(given), "the step")


def test_a_gauge_is_read_before_and_after_the_window_and_said() -> None:
    gauge = _gauge(10.0, 12.5)
    with Contention(gauge=gauge) as load:
        time.sleep(1.1)
    assert load.speed == [10.0, 12.5] and [ms for _, ms in gauge.readings] == [10.0, 12.5]
    assert str(load).endswith("; the step 10.0 then 12.5 ms"), str(load)
    assert spread(load.speed) == pytest.approx(0.25) and spread([10.0]) is None


def test_failures_on_a_machine_whose_speed_changed_are_measured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two attempts over which the gauge doubled compared two machines; they do not count as the two failures
    that fail the test, and the third attempt, on a steady machine, passes."""
    monkeypatch.setattr(Contention, "__exit__", _quiet_with_gauge)
    earlier = Contention(share=0.0, seconds=100.0, speed=[10.0, 10.5])  # the fixture's probe, on the fast machine
    gauge = _gauge(20.0, 21.0, 10.0, 20.0, 15.0, 15.5)  # the replay slow; then a probe fast, its replay slow; steady
    results = iter([1.0, 1.0, 0.1])
    with pytest.warns(MeasuredAgain, match=r"attempt 1, on a quiet machine whose speed changed by 110% \(the step\)"):
        assert measured(lambda attempt: next(results), _check, "the replay", [earlier], gauge=gauge) == 0.1


def test_two_failures_on_a_steady_machine_fail_and_changes_end_at_the_last_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wrong time fails every draw: two failures on a machine whose speed held within DRIFT fail the test, with
    what the gauge read; a machine that never holds still ends it at MAX_ATTEMPTS."""
    monkeypatch.setattr(Contention, "__exit__", _quiet_with_gauge)
    steady = 10.0 * (1 + DRIFT / 2)
    attempts: list[int] = []

    def wrong(attempt: int) -> float:
        attempts.append(attempt)
        return 1.0

    with pytest.raises(AssertionError) as failed:
        measured(wrong, _check, "the replay", gauge=_gauge(10.0, steady, 10.0, steady))
    assert attempts == [0, 1] and "speed changed" not in str(failed.value)
    assert str(failed.value).count(f"the step 10.0 then {steady:.1f} ms") == 2, failed.value
    attempts.clear()
    with pytest.raises(AssertionError) as failed:
        measured(wrong, _check, "the replay", gauge=_gauge(*[10.0, 30.0] * MAX_ATTEMPTS))
    assert attempts == list(range(MAX_ATTEMPTS)) and str(failed.value).count("speed changed by 200%") == MAX_ATTEMPTS


def _quiet_with_gauge(self: Contention, *exc: object) -> None:
    """Contention.__exit__ on a quiet machine: no other work, and the gauge read after the window."""
    self.share = 0.0
    if self.gauge is not None:
        self.speed.append(self.gauge())
