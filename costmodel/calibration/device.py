"""What the harness needs to know of the device it times: its last-level cache, its memory, and how to name it (with
the software versions) in a calibrated profile's provenance."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from costmodel.calibration import kernels as K

if TYPE_CHECKING:
    import torch


def last_level_cache_bytes(device: torch.device) -> int:
    """The device's last-level cache (B): the GPU's L2, or the CPU's largest cache level; 64 MiB if unknown."""
    torch = K.require_torch()
    if device.type == "cuda":
        return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20)
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best or 64 << 20


def memory_bytes(device: torch.device) -> int:
    """The device's memory (B): the GPU's, or the host's RAM."""
    torch = K.require_torch()
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def describe(device: torch.device) -> tuple[str, dict[str, str]]:
    """The device in words, and the software that ran the measurements (versions)."""
    torch = K.require_torch()
    import numpy

    software = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "os": platform.platform(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = (
            f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs, "
            f"compute capability {props.major}.{props.minor}"
        )
        software["cuda"] = str(torch.version.cuda)
        software["cudnn"] = str(torch.backends.cudnn.version())
        driver = _nvidia_driver()
        if driver:
            software["driver"] = driver
        return name, software
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    software["torch_threads"] = str(torch.get_num_threads())
    return f"{model} ({os.cpu_count()} logical CPUs), {torch.get_num_threads()} torch thread(s)", software


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
