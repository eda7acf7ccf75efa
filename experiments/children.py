"""Servers a command starts for the length of a job (a real `vllm serve`, a `llama-server`, `ferry serve` under
test): a free port on localhost for each, and a child that does not outlive the process that started it.

A server is stopped by its owner's ``stop()`` or ``finally``, which a process killed from outside never runs (a
``timeout`` that sends SIGTERM, a SIGKILL, the out-of-memory killer): its servers would keep their port, their memory
and a share of the cores, and time the next job. ``dies_with_parent`` has Linux send the child SIGTERM when the
thread that started it ends (``prctl(PR_SET_PDEATHSIG)``, prctl(2)), whatever ended it; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from collections.abc import Callable
from functools import partial

PR_SET_PDEATHSIG = 1  # linux/prctl.h

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None  # loaded before any fork


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dies_with_parent(parent: int) -> None:
    """Run in the child between fork and exec: it gets SIGTERM when the thread that started it ends, and at once if
    ``parent`` (the pid that forked it) is already gone."""
    if _libc is None:
        return
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died between fork and prctl
        os.kill(os.getpid(), signal.SIGTERM)


def ends_with_this_process() -> Callable[[], None]:
    """``Popen(..., preexec_fn=ends_with_this_process())``: a server child that gets SIGTERM when the thread that
    started it ends; start it from a thread that lives as long as the server should (the main thread)."""
    return partial(dies_with_parent, os.getpid())
