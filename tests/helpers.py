"""Small helpers for tests: requests from lists, stand-in cost models, and a one-call simulation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import policies
from costmodel.shape import IterationShape
from policies.config import SchedulerConfig
from sim.engine import simulate
from sim.kvcache import KVCacheManager
from sim.records import RunRecords
from sim.request import RequestTable


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


class LinearTimer:
    """``base`` seconds per iteration plus ``per_token`` per token computed and ``per_ctx`` per cached token read."""

    def __init__(self, base: float = 0.01, per_token: float = 1e-4, per_ctx: float = 0.0) -> None:
        self.base, self.per_token, self.per_ctx = base, per_token, per_ctx

    def iteration_time(self, shape: IterationShape) -> float:
        ctx = int(shape.prefill_ctx.sum() + shape.decode_ctx.sum())
        return self.base + self.per_token * shape.num_tokens + self.per_ctx * ctx


def run(
    requests: RequestTable,
    timer: object | None = None,
    kv_blocks: int = 1_000_000,
    block_size: int = 16,
    **config: object,
) -> RunRecords:
    """Simulate ``requests`` under ``SchedulerConfig(**config)``."""
    cfg = SchedulerConfig(**config)  # type: ignore[arg-type]
    kv = KVCacheManager(kv_blocks, block_size, len(requests))
    return simulate(requests, policies.get(cfg), timer or ConstantTimer(), kv, cfg.max_model_len)
