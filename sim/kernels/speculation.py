"""Speculative decoding's acceptance, compiled: which draft tokens a verification step accepts.

vLLM's rejection sampler with ``rejection_sample_method='synthetic'`` (``vllm/v1/sample/rejection_sampler.py``,
0.32.0) accepts the draft at position ``j`` (0-based) when a uniform draw is below the conditional rate ``c_j``, and
stops at the first rejection: ``c_j = p_j / p_(j-1)`` from the per-position unconditional rates ``p`` the config gives
(``vllm/v1/spec_decode/utils.py``, ``unconditional_to_conditional_rates``). ferry draws the same way for every method
(a preset's rates, or the config's synthetic ones), so that acceptance varies across requests and steps as in a
server.

The draw is counter-based: the uniform of position ``j`` of the step that starts at output token ``generated`` of
request ``req`` is a hash of ``(seed, req, generated, j)`` (splitmix64's finaliser, chained). Both engines, a cluster's
replicas and the conformance harness's driver of vLLM (``experiments/vllm_check/scheduler_vllm.py``, which has its
own copy in pure Python) compute the same numbers without sharing a generator's state, and a preempted request that
recomputes meets the same draws where it resumes. Placeholder drafts (vLLM's ``-1`` ids, scheduled to pad a request
to ``1 + k`` tokens) are never accepted.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sim.kernels.jit import kernel

FloatArray = npt.NDArray[np.float64]

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment (2^64 / the golden ratio)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
TO_UNIT = 2.0**-53  # 53 random bits to a double in [0, 1)


@kernel
def _mix(x: np.uint64) -> np.uint64:
    """splitmix64: one step of its counter and its finaliser (Steele, Lea and Flood, OOPSLA 2014)."""
    z = x + GOLDEN
    z = (z ^ (z >> np.uint64(30))) * MIX1
    z = (z ^ (z >> np.uint64(27))) * MIX2
    return z ^ (z >> np.uint64(31))


@kernel
def uniform(seed: int, req: int, generated: int, j: int) -> float:
    """The uniform in [0, 1) of draft position ``j`` of request ``req``'s step from output token ``generated``."""
    z = _mix(np.uint64(seed))
    z = _mix(z ^ np.uint64(req))
    z = _mix(z ^ np.uint64(generated))
    z = _mix(z ^ np.uint64(j))
    return float(z >> np.uint64(11)) * TO_UNIT


@kernel
def accepted(rates: FloatArray, seed: int, req: int, generated: int, drafts: int) -> int:
    """Drafts accepted of ``drafts`` (> 0) scheduled for ``req`` at output token ``generated``: the leading positions
    whose draw is below their conditional rate (``rates``, one per position); 0 for placeholders (``drafts < 0``)."""
    if drafts <= 0:
        return 0
    n = 0
    while n < drafts and uniform(seed, req, generated, n) < rates[n]:
        n += 1
    return n


def conditional(unconditional: list[float]) -> list[float]:
    """Per-position conditional rates from unconditional ones (the chance the first ``j + 1`` drafts are all
    accepted), as vLLM converts them: ``p_j / p_(j-1)``, 0 after a position of 0."""
    before = [1.0, *unconditional[:-1]]
    return [p / q if q > 0.0 else 0.0 for p, q in zip(unconditional, before, strict=True)]


def uniform_py(seed: int, req: int, generated: int, j: int) -> float:
    """``uniform`` in plain Python (what the vLLM driver computes; a test checks they agree)."""
    mask = (1 << 64) - 1

    def mix(x: int) -> int:
        z = (x + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    z = mix(seed & mask)
    for part in (req, generated, j):
        z = mix(z ^ (part & mask))
    return (z >> 11) * TO_UNIT
