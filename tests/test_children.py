"""A server child started with ``ends_with_this_process`` ends when the process that started it is killed from
outside (SIGKILL: no ``finally``, no ``stop()``); one started without it outlives its parent, so the check can fail."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.children import free_port

ROOT = Path(__file__).resolve().parents[1]
PARENT = """
import subprocess, sys, time
from experiments.children import ends_with_this_process
hook = {"preexec_fn": ends_with_this_process()} if sys.argv[1] == "hooked" else {}
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], **hook)
print(child.pid, flush=True)
time.sleep(120)
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie, ended but not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def orphan(how: str, wait_s: float) -> tuple[int, bool]:
    """Start a parent that starts a sleeping child (``how``: "hooked" or "plain"), SIGKILL the parent, and return the
    child's pid and whether it still runs ``wait_s`` later (polled: False as soon as it is gone)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    parent.stdout.close()
    assert alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and alive(child):
        time.sleep(0.05)
    return child, alive(child)


def test_a_hooked_child_ends_with_its_killed_parent() -> None:
    _, still = orphan("hooked", wait_s=10.0)  # SIGTERM on the parent's death: milliseconds
    assert not still


def test_a_plain_child_outlives_its_killed_parent() -> None:
    child, still = orphan("plain", wait_s=1.0)
    try:
        assert still
    finally:
        if still:
            os.kill(child, signal.SIGKILL)


def test_a_free_port_can_be_listened_on() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
        s.listen()
