"""Routers: which replica of a cluster serves a request, decided when it arrives from what each replica reports.

A router is a policy like the batching policies: a small class, registered by name, that knows nothing of SimPy or
of seconds. It declares which loads it reads (``reads``: computing ``work_left`` walks a replica's queues, so it is
only computed for the routers that use it) and returns a replica's index. The cluster (``sim.cluster``) asks it once
per request, in arrival order, after every replica has run its events before that arrival.

The built-in ones follow the load-balancing policies of serving routers (vLLM's production-stack router offers round
robin and session affinity; llm-d's and BLIS's schedulers score replicas by queue length and KV-cache usage;
power-of-two choices is Mitzenmacher's): round_robin, random, least_requests, least_tokens, least_kv, power_of_two,
and prefix_affinity (where the prompt is cached, tempered by load).
Ties go to the lowest index. A user's router is ``package.module:Class`` with ``__init__(num_replicas, rng)`` and
``route(load, prompt, output)``.

The choices of the routers that read loads are kernels (``sim.kernels.routing``), which each class calls and which the
compiled cluster's loop calls without the class (``compiled``), so that both engines route alike.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from policies.by_name import load_class
from sim.cluster import LOADS, ReplicaLoad
from sim.kernels import routing as kernels


@runtime_checkable
class Router(Protocol):
    name: ClassVar[str]
    reads: ClassVar[tuple[str, ...]]  # which of LOADS it reads

    def route(self, load: ReplicaLoad, prompt: int, output: int) -> int:
        """The index of the replica that serves a request of ``prompt`` tokens wanting ``output`` tokens."""
        ...


_ROUTERS: dict[str, type] = {}
NO_DRAWS = np.zeros((0, 2), dtype=np.int64)


def register(cls: type) -> type:
    _ROUTERS[cls.name] = cls  # type: ignore[attr-defined]
    return cls


def router_names() -> list[str]:
    return sorted(_ROUTERS)


def router_class(name: str) -> Any:
    """The router class ``name`` names: a registered name, or ``package.module:Class`` (imported: its module's
    top-level code runs). ValueError naming it when it cannot be loaded or has no ``route``."""
    return load_class(name, "router", _ROUTERS, ("route",),
                      "__init__(num_replicas, rng) and route(load, prompt, output)")  # fmt: skip


def get_router(name: str, num_replicas: int, rng: np.random.Generator) -> Router:
    """The router ``name`` names (registered, or ``package.module:Class``) for ``num_replicas`` replicas."""
    cls = router_class(name)
    try:
        router = cls(num_replicas, rng)
    except TypeError as exc:  # a user's class whose constructor takes something else
        raise ValueError(
            f"router {name!r} cannot be built as {name.rpartition(':')[2]}(num_replicas, rng): {exc}"
        ) from None
    if not callable(getattr(router, "route", None)):
        raise ValueError(f"router {name!r} has no route(load, prompt, output) method")
    reads = getattr(router, "reads", LOADS)
    unknown = [r for r in reads if r not in LOADS]
    if unknown:
        raise ValueError(f"router {name!r} reads {', '.join(unknown)}; a router may read {', '.join(LOADS)}")
    return router


class _Base:
    reads: ClassVar[tuple[str, ...]] = ()

    def __init__(self, num_replicas: int, rng: np.random.Generator) -> None:
        if num_replicas < 1:
            raise ValueError(f"a cluster needs at least one replica, got {num_replicas}")
        self.n = num_replicas
        self.rng = rng


@register
class RoundRobin(_Base):
    """Replicas in turn: 0, 1, ..., n-1, 0, ..."""

    name = "round_robin"

    def __init__(self, num_replicas: int, rng: np.random.Generator) -> None:
        super().__init__(num_replicas, rng)
        self.next = 0

    def route(self, load: ReplicaLoad, prompt: int, output: int) -> int:
        k = self.next
        self.next = (k + 1) % self.n
        return k


@register
class Random(_Base):
    """A replica drawn uniformly (the run's seeded generator)."""

    name = "random"

    def route(self, load: ReplicaLoad, prompt: int, output: int) -> int:
        return int(self.rng.integers(self.n))


@register
class LeastRequests(_Base):
    """The replica with the fewest unfinished requests."""

    name = "least_requests"
    reads = ("unfinished",)

    def route(self, load: ReplicaLoad, prompt: int, output: int) -> int:
        return int(kernels.least(load.unfinished))

    def compiled(self, num_requests: int) -> tuple[int, np.ndarray]:
        """(kernel code, draws) for the compiled cluster's loop (``sim.kernels.routing.pick``)."""
        return kernels.LEAST_REQUESTS, NO_DRAWS


@register
class LeastTokens(_Base):
    """The replica with the least work left in tokens (prompt to prefill plus output to decode)."""

    name = "least_tokens"
    reads = ("work_left",)

    def route(self, load: ReplicaLoad, prompt: int, output: int) -> int:
        return int(kernels.least(load.work_left))

    def compiled(self, num_requests: int) -> tuple[int, np.ndarray]:
        return kernels.LEAST_TOKENS, NO_DRAWS


@register
class LeastKV(_Base):
    """The replica with the lowest share of its KV cache in use."""

    name = "least_kv"
    reads = ("kv_used",)

    def route(self, load: ReplicaLoad, prompt: int, output: int) -> int:
        return int(kernels.least_share(load.kv_used, load.kv_blocks))

    def compiled(self, num_requests: int) -> tuple[int, np.ndarray]:
        return kernels.LEAST_KV, NO_DRAWS


@register
class PowerOfTwo(_Base):
    """Two distinct replicas drawn at random; the one with fewer unfinished requests (the first drawn on a tie)."""

    name = "power_of_two"
    reads = ("unfinished",)

    def route(self, load: ReplicaLoad, prompt: int, output: int) -> int:
        if self.n == 1:
            return 0
        a, b = self._draw()
        return int(kernels.two_choices(load.unfinished, a, b))

    def _draw(self) -> tuple[int, int]:
        a, b = (int(x) for x in self.rng.choice(self.n, size=2, replace=False))
        return a, b

    def compiled(self, num_requests: int) -> tuple[int, np.ndarray]:
        """The draws of ``num_requests`` routings made now, in order (none for one replica, which draws nothing)."""
        draws = np.zeros((num_requests if self.n > 1 else 0, 2), dtype=np.int64)
        for i in range(len(draws)):
            draws[i] = self._draw()
        return kernels.POWER_OF_TWO, draws


@register
class PrefixAffinity(_Base):
    """The replica whose prefix cache holds most of the request's prompt, tempered by load (prefix-aware routing, as
    llm-d's scheduler scores replicas by prefix-cache hits and queue length, and BLIS models it). Each replica scores
    the share of the prompt it has cached (0 to 1) less its unfinished requests above the least loaded replica's,
    relative to the mean plus one: a cached prefix is worth a replica about one mean queue busier. Without prefix
    caching (nothing cached anywhere) it is least_requests."""

    name = "prefix_affinity"
    reads = ("unfinished", "cached")

    def route(self, load: ReplicaLoad, prompt: int, output: int) -> int:
        cached = load.cached if load.cached is not None else np.zeros(self.n)
        unfinished = load.unfinished.astype(float)
        crowding = (unfinished - unfinished.min()) / (1.0 + unfinished.mean())
        return int(np.argmax(cached / max(prompt, 1) - crowding))
