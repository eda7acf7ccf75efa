"""`ferry calibrate --from-aiconfigurator SYSTEM`: fit a profile to NVIDIA's measured kernel database.

    ferry calibrate --from-aiconfigurator h100_sxm [--framework vllm|sglang|trtllm] [--version V] \\
        [--base h100-sxm.datasheet] [--engine-overheads vllm-v1] --out PROFILE.yaml

Reads the system's GEMM, attention and all-reduce tables for the engine's release (``aiconfigurator-core``, ``pip
install 'ferry[measured]'``), fits the base profile's curves, per-kernel floors and all-reduce to every other measured
shape, prints the held-out error per kernel class of the curves and of the tables (``costmodel.calibration.measured``)
and writes the profile: ``--hardware PROFILE.yaml`` then times kernels from the database's tables where the package
is installed, and from the fitted curves where it is not. ``--base`` (default: the GPU's datasheet profile) gives the
device rates; the host overheads are ``--engine-overheads``' preset (default: the framework's: vllm-v1, sglang,
trt-llm). The profiles ferry ships were written this way (``python -m experiments.studies.kernel_fits --write``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from costmodel import kerneldb
from costmodel.calibration.aiconfigurator import SYSTEMS
from costmodel.calibration.measured import fit_database, format_errors
from costmodel.hardware import builtin_hardware, load_hardware, save_hardware
from experiments.runner import outputs


def from_database(args: argparse.Namespace) -> int:
    system: str = args.from_aiconfigurator
    out: Path = args.out
    outputs.check_file(out)  # before the fit, not after it
    known = kerneldb.systems()
    if system not in known:  # the database's systems, not ferry's profiles
        raise ValueError(f"--from-aiconfigurator {system}: the database has no such system ({', '.join(known)})")
    base = args.base or f"{SYSTEMS.get(system, system)}.datasheet"
    if base.lower() == "none":
        raise ValueError("--from-aiconfigurator needs --base: the datasheet profile whose device rates anchor the fit")
    if args.base is None and base not in builtin_hardware():
        raise ValueError(
            f"--from-aiconfigurator {system}: ferry has no datasheet profile of this device ({base}) to anchor the "
            "fit; give --base PROFILE.yaml, a datasheet profile of its rates (memory, bandwidth, peak FLOP/s, link)"
        )
    fitted = fit_database(
        system,
        args.framework,
        load_hardware(base),
        name=args.name or out.stem,
        version=args.version,
        engine_overheads=args.engine_overheads,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    save_hardware(fitted.profile, out, f"ferry calibrate --from-aiconfigurator {system} --framework {args.framework}")
    tables = fitted.profile.kernel_tables
    assert tables is not None
    print(f"fitted {base} to {tables.describe()} (all-reduce: {tables.comm_version or 'not measured'})")
    print("held-out error (every other shape of each series, never fitted on; |predicted / measured - 1|):")
    print(format_errors(fitted.errors))
    print(f"wrote {out}")
    return 0
