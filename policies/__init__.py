"""Batching policies, registered by name: none, static, dynamic, continuous, chunked."""

from policies import chunked, continuous, dynamic, none, static  # noqa: F401  (registration)
from policies.base import Policy, get, get_class, names, register
from policies.config import SchedulerConfig

__all__ = ["Policy", "SchedulerConfig", "get", "get_class", "names", "register"]
