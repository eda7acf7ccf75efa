"""Small helpers for tests: requests from lists, stand-in cost models, a one-call simulation, a live server."""

from __future__ import annotations

import contextlib
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from numba import njit

import policies
from costmodel.shape import IterationShape
from experiments.children import ends_with_this_process
from policies.config import SchedulerConfig
from sim.engine import simulate
from sim.kvcache import KVCacheManager
from sim.records import RunRecords
from sim.request import RequestTable

ROOT = Path(__file__).resolve().parents[1]


def make_requests(
    arrivals: Sequence[float], prompts: Sequence[int] | int, outputs: Sequence[int] | int
) -> RequestTable:
    n = len(arrivals)
    p = np.full(n, prompts) if isinstance(prompts, int) else np.asarray(prompts)
    o = np.full(n, outputs) if isinstance(outputs, int) else np.asarray(outputs)
    return RequestTable(np.asarray(arrivals, dtype=float), p, o)


class ConstantTimer:
    """Every iteration takes ``seconds``, whatever it holds."""

    def __init__(self, seconds: float = 1.0) -> None:
        self.seconds = seconds

    def iteration_time(self, shape: IterationShape) -> float:
        return self.seconds


@njit(cache=True)
def _linear_time(args: tuple[float, float, float], pf_new, pf_ctx, dec_ctx, sampled: int, vf_new, vf_ctx) -> float:  # noqa: ANN001
    base, per_token, per_ctx = args
    tokens = pf_new.sum() + dec_ctx.shape[0] + vf_new.sum()
    ctx = pf_ctx.sum() + dec_ctx.sum() + vf_ctx.sum()
    return base + per_token * tokens + per_ctx * ctx


class LinearTimer:
    """``base`` seconds per iteration plus ``per_token`` per token computed and ``per_ctx`` per cached token read.
    Offers a compiled twin, as the roofline does, so both engines can run with it."""

    def __init__(self, base: float = 0.01, per_token: float = 1e-4, per_ctx: float = 0.0) -> None:
        self.args = (float(base), float(per_token), float(per_ctx))

    def iteration_time(self, shape: IterationShape) -> float:
        return _linear_time(self.args, shape.prefill_new, shape.prefill_ctx, shape.decode_ctx, shape.prefill_sampled,
                            shape.verify_new, shape.verify_ctx)  # fmt: skip

    def compiled(self) -> tuple[object, tuple[float, float, float]]:
        return _linear_time, self.args


def run(
    requests: RequestTable,
    timer: object | None = None,
    kv_blocks: int = 1_000_000,
    block_size: int = 16,
    engine: str = "auto",
    watermark: float = 0.0,
    stream: bool | None = None,
    **config: object,
) -> RunRecords:
    """Simulate ``requests`` under ``SchedulerConfig(**config)``."""
    cfg = SchedulerConfig(**config)  # type: ignore[arg-type]
    kv = KVCacheManager(kv_blocks, block_size, len(requests), watermark=watermark)
    timer = timer or ConstantTimer()
    return simulate(requests, policies.get(cfg), timer, kv, cfg.max_model_len, engine=engine, stream=stream)


@contextlib.contextmanager
def serving(args: list[str], stderr: Path, command: str = "serve") -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``ferry COMMAND ARGS --port 0`` (``serve`` or ``explore``) as a subprocess: yields it and the URL its ready
    line prints (``http://HOST:PORT/v1``, ``http://HOST:PORT/``) once it listens; killed at the end if still running,
    and sent SIGTERM should this process end first (killed from outside). Its stderr goes to ``stderr``."""
    cmd = [sys.executable, "-m", "experiments.cli", command, *args, "--port", "0"]
    with stderr.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                                preexec_fn=ends_with_this_process())  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline() if proc.stdout else ""), daemon=True).start()
    try:
        line = lines.get(timeout=90)
        url = re.search(r"http://\S+", line)
        assert line.startswith(f"ferry {command}: ") and url, f"{line!r}; stderr: {stderr.read_text()}"
        yield proc, url.group(0)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()  # the pipe of its stdout, whatever the test left unread
