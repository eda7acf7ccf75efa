"""The cost model: model specs, hardware profiles, and the roofline that turns an iteration's shape into seconds.

The lowest layer of ferry: it knows nothing of requests or policies. ``CostModel.iteration_time(IterationShape)`` is
what the simulator calls once per iteration; ``explain`` says where the time goes; ``memory_plan`` sizes the KV cache.
"""

from costmodel.dtypes import Dtypes
from costmodel.hardware import HardwareProfile, builtin_hardware, load_hardware
from costmodel.memory import MemoryPlan
from costmodel.model_spec import ModelSpec, builtin_models, load_model
from costmodel.roofline import CostModel, IterationBreakdown, KernelCost, OpCost
from costmodel.shape import IterationShape

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
    "builtin_hardware",
    "builtin_models",
    "load_hardware",
    "load_model",
]
