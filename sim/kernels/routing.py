"""The built-in routers' choices as kernels: what ``policies.routing``'s classes decide from a cluster's loads, written
once and called by both of them and the compiled cluster's loop (``sim.compiled.cluster``), so that the two engines
route every request alike.

Each takes the loads the cluster shows a router (``sim.cluster.ReplicaLoad``'s arrays) and returns a replica's index;
ties go to the lowest index, as ``np.argmin`` breaks them. A router that draws at random (power of two choices) has its
draws made beforehand by its class, in the order it would make them, and passed in (``draws``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from sim.kernels.jit import kernel

IntArray = npt.NDArray[np.int64]

# the routers the compiled cluster runs (``pick``'s ``code``)
LEAST_REQUESTS, LEAST_TOKENS, LEAST_KV, POWER_OF_TWO = range(4)


@kernel
def least(values: IntArray) -> int:
    """The index of the smallest value (the first of equals)."""
    best = 0
    for j in range(1, values.shape[0]):
        if values[j] < values[best]:
            best = j
    return best


@kernel
def least_share(used: IntArray, blocks: IntArray) -> int:
    """The index of the smallest ``used / max(blocks, 1)`` (the first of equals): the lowest share of a KV cache."""
    best, low = 0, used[0] / max(blocks[0], 1)
    for j in range(1, used.shape[0]):
        share = used[j] / max(blocks[j], 1)
        if share < low:
            best, low = j, share
    return best


@kernel
def two_choices(unfinished: IntArray, a: int, b: int) -> int:
    """Of two replicas drawn, the one with fewer unfinished requests (the first drawn on a tie)."""
    return b if unfinished[b] < unfinished[a] else a


@kernel
def pick(code: int, unfinished: IntArray, work_left: IntArray, kv_used: IntArray, kv_blocks: IntArray,
         draws: IntArray, i: int) -> int:  # fmt: skip
    """The choice of router ``code`` for the ``i``-th request routed (``draws[i]``: its two draws, power of two)."""
    if code == LEAST_REQUESTS:
        return least(unfinished)
    if code == LEAST_TOKENS:
        return least(work_left)
    if code == LEAST_KV:
        return least_share(kv_used, kv_blocks)
    if unfinished.shape[0] == 1:
        return 0
    return two_choices(unfinished, draws[i, 0], draws[i, 1])
