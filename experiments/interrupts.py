"""Ctrl-C that always stops a command: exit status 130, one line, and no output that looks complete.

Python turns SIGINT into ``KeyboardInterrupt`` at the next bytecode, but when that bytecode runs inside a ctypes
callback (numba loading its cache calls back into Python through ctypes) the exception is printed as "Exception
ignored" and swallowed, and the command runs on to the end. ``watch`` records every SIGINT, silences those swallowed
reports, and ``checkpoint`` raises ``KeyboardInterrupt`` at the places that matter (before outputs are written, at
progress reports, when the command returns) if one was seen.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

_seen = False  # a SIGINT arrived while ``watch`` was active


def requested() -> bool:
    """Whether Ctrl-C was pressed."""
    return _seen


def checkpoint() -> None:
    """Stop here (``KeyboardInterrupt``) if Ctrl-C was pressed, even if the exception it raised was swallowed."""
    if _seen:
        raise KeyboardInterrupt


def forget_caught() -> None:
    """Tell CPython that the ``KeyboardInterrupt`` it saw was handled, so ``python -m`` exits with our status.

    CPython (3.11-3.13, ``Python/pythonrun.c`` ``run_eval_code_obj``) marks an interrupt as unhandled when one ends a
    string ``exec`` (dataclasses and numba build functions that way while modules import), even if a caller catches it;
    ``python -m`` then ends the process by SIGINT (status -2) instead of with the status the command returned. Every
    string ``exec`` clears that mark when it starts, so one that succeeds leaves it cleared.
    """
    exec("pass", {})


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _seen
    _seen = True
    raise KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[Callable[[], bool]]:
    """Within the block SIGINT is recorded, not raised, and the block raises ``KeyboardInterrupt`` where it chooses;
    yields a function that says whether one arrived. For code that an exception at an arbitrary bytecode would leave
    broken: ``concurrent.futures.wait`` takes its futures' locks one by one in a Python loop (CPython 3.11-3.13,
    ``_base._AcquireFutures``), and an interrupt raised in that loop leaves some of them held by this thread; the
    executor's manager thread then waits for them forever, and the interpreter's exit waits for that thread. A
    SIGINT that was being ignored stays ignored; outside the main thread signals are left alone."""
    arrived = False

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal arrived
        global _seen
        arrived = _seen = True

    previous: Any = None
    installed = False
    try:
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            previous = signal.signal(signal.SIGINT, on_sigint)
            installed = True
    except ValueError:  # not the main thread
        pass
    try:
        yield lambda: arrived
    finally:
        if installed:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


@contextmanager
def watch() -> Iterator[None]:
    """Record SIGINT (and still raise ``KeyboardInterrupt`` at once) and keep swallowed interrupts quiet."""
    global _seen
    _seen = False
    previous_hook = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        global _seen
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            _seen = True  # raised inside a callback that could not propagate it: checkpoints will
            return
        previous_hook(unraisable)

    previous_handler = None
    try:
        # a SIGINT that the parent set to be ignored (a background job, nohup) stays ignored
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            previous_handler = signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread: leave signals alone
        pass
    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)
