"""The cost model: model specs, hardware profiles, and the roofline that turns an iteration's shape into seconds.

The lowest layer of ferry: it knows nothing of requests or policies. ``CostModel.iteration_time(IterationShape)`` is
what the simulator calls once per iteration; ``explain`` says where the time goes; ``memory_plan`` sizes the KV cache.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from costmodel.moved import alias as _alias

if TYPE_CHECKING:
    from costmodel.dtypes import Dtypes
    from costmodel.hardware import HardwareProfile, builtin_hardware, load_hardware
    from costmodel.layout import Parallelism
    from costmodel.memory import MemoryPlan
    from costmodel.model_spec import ModelSpec, builtin_models, load_model
    from costmodel.roofline import CostModel, IterationBreakdown, KernelCost, OpCost
    from costmodel.shape import IterationShape

# the public names and their modules, imported on first use: ``import costmodel.moved`` (every package's __init__
# does) and the command line's start stay light, without numba
_EXPORTS = {
    "CostModel": "costmodel.roofline",
    "Dtypes": "costmodel.dtypes",
    "HardwareProfile": "costmodel.hardware",
    "IterationBreakdown": "costmodel.roofline",
    "IterationShape": "costmodel.shape",
    "KernelCost": "costmodel.roofline",
    "MemoryPlan": "costmodel.memory",
    "ModelSpec": "costmodel.model_spec",
    "OpCost": "costmodel.roofline",
    "Parallelism": "costmodel.layout",
    "builtin_hardware": "costmodel.hardware",
    "builtin_models": "costmodel.model_spec",
    "load_hardware": "costmodel.hardware",
    "load_model": "costmodel.model_spec",
}
__all__ = [
    "CostModel",
    "Dtypes",
    "HardwareProfile",
    "IterationBreakdown",
    "IterationShape",
    "KernelCost",
    "MemoryPlan",
    "ModelSpec",
    "OpCost",
    "Parallelism",
    "builtin_hardware",
    "builtin_models",
    "load_hardware",
    "load_model",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'costmodel' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


# modules that moved into subpackages: their old import paths keep working (see costmodel.moved)
_alias(
    {
        "costmodel.kernels": "costmodel.calibration.kernels",
        "costmodel.calibrate": "costmodel.calibration.harness",
        "costmodel.calibrated": "costmodel.calibration.profile",
        "costmodel.fit": "costmodel.calibration.fit",
        "costmodel.measurements": "costmodel.calibration.vidur",
        "costmodel.refit": "costmodel.calibration.refit",
    }
)
