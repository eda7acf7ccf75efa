"""`ferry calibrate`: measure a device's kernels, fit a hardware profile to them, and say how well it predicts.

    ferry calibrate --device cpu|cuda[:i] [--threads N] --dtype float32|bfloat16|float16 --model NAME_OR_CONFIG.json
                    [--model ...] [--quick | --grid full|quick|smoke] --out PROFILE.yaml
    ferry calibrate --from-measurements FILE_OR_DIR [--hardware NAME] [--model FILTER ...] --out PROFILE.yaml
    ferry calibrate --from-aiconfigurator SYSTEM [--framework vllm|sglang|trtllm] [--version V] --out PROFILE.yaml

The first form runs, with PyTorch on the device, the kernels of an iteration at the shapes of each model
(``costmodel.calibration.harness``), a copy (bandwidth), an empty step, all-reduces when several GPUs are visible, and
short serving runs of the real executor (``experiments.real.executor``) on the model at full and half depth, whose
iterations give the host overheads. It writes every measurement to ``PROFILE.raw.csv`` (one row per kernel run: shape,
FLOPs, bytes, median/min/max seconds), fits the profile (``costmodel.calibration.profile``) on half the points and
prints the error on the other half, per operator class. The profile is then ``--hardware PROFILE.yaml`` for ``ferry
run``, ``ferry iteration`` and ``ferry validate``.

The second form fits without running anything: from a raw CSV this command wrote (on another machine, say), or from a
directory of Vidur's published profiles (``compute/<device>/...``). For Vidur's data it fits the rows of the models
matching ``--model`` on ``--hardware`` and also reports the error on every other row, before (the datasheet profile)
and after (the fitted one; on another device, the fitted efficiencies applied to that device's datasheet rates).

The third fits NVIDIA's measured kernel database (``aiconfigurator-core``) for one GPU and serving engine
(``experiments.commands.calibrate_measured``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from costmodel.calibration import device as devices
from costmodel.calibration import grids, harness
from costmodel.calibration import kernels as K
from costmodel.calibration.aiconfigurator import FRAMEWORKS, SYSTEMS
from costmodel.calibration.fit import WorkCounter
from costmodel.calibration.iterations import iteration_row
from costmodel.calibration.profile import FitResult, fit_profile, format_errors
from costmodel.hardware import HardwareProfile, builtin_hardware, load_hardware, save_hardware
from costmodel.model_spec import ModelSpec, load_model
from costmodel.roofline import CostModel
from experiments.runner import outputs

# datasheet profiles of the GPUs torch may report: (words all in the device name, profile); a name that contains
# another's words comes first ("GB200" before "B200", "L40S" before "L4")
GPU_PROFILES = (
    (("H200",), "h200.datasheet"),
    (("H100", "PCIE"), "h100-pcie"),
    (("H100",), "h100-sxm.datasheet"),
    (("A100", "40GB"), "a100-40g"),
    (("A100",), "a100-80g.datasheet"),
    (("L40S",), "l40s.datasheet"),
    (("GB300",), "gb300.datasheet"),
    (("GB200",), "gb200.datasheet"),
    (("B300",), "b300.datasheet"),
    (("B200",), "b200.datasheet"),
    (("RTX", "PRO", "6000"), "rtx-pro-6000.datasheet"),
    (("MI300X",), "mi300x"),
)

# the executor's serving runs, chunked prefill: (requests, prompt tokens, output tokens, token budget, seconds between
# arrivals). All at once: prompts alone and in chunks of several sizes, mixed iterations, decode batches of several
# sizes; spread out: prompts joining running decodes, and prompts arriving at an idle engine, as in serving
SERVING_RUNS = {
    "quick": (
        (1, 48, 6, 256, 0.0),
        (1, 160, 4, 256, 0.0),
        (4, 96, 10, 256, 0.0),
        (8, 32, 12, 256, 0.0),
        (6, 120, 6, 96, 0.0),
        (12, 400, 6, 256, 0.0),
        (24, 48, 8, 256, 0.0),
        (6, 100, 16, 256, 0.12),
        (3, 72, 3, 256, 0.3),
    ),
    "full": (
        (1, 24, 8, 256, 0.0),
        (1, 96, 8, 256, 0.0),
        (1, 200, 8, 256, 0.0),
        (2, 200, 16, 256, 0.0),
        (4, 96, 16, 256, 0.0),
        (8, 32, 24, 256, 0.0),
        (6, 120, 12, 96, 0.0),
        (12, 400, 12, 256, 0.0),
        (24, 48, 16, 256, 0.0),
        (48, 64, 12, 512, 0.0),
        (12, 100, 24, 256, 0.1),
        (6, 72, 4, 256, 0.3),
    ),
}
# the smoke grid's (a check that the full grid runs): every other run of the full grid's, cut to at most 4 requests of
# at most 96 prompt tokens and 2 output tokens (each run's warm-up costs more than its iterations)
SERVING_RUNS["smoke"] = tuple(
    (min(n, 4), min(prompt, 96), 2, budget, interval) for n, prompt, _, budget, interval in SERVING_RUNS["full"][::2]
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="measure kernels on a device (or read measurements), fit a hardware profile, report held-out error",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="the calibrated profile to write (YAML)")
    p.add_argument("--model", action="append", default=[], help="model to measure (built-in or config.json; repeat)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:INDEX (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads torch uses (default: torch's)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=K.TORCH_DTYPES,
        help="the models' dtype (default float32; --from-iterations: the model's config.json torch_dtype)",
    )
    p.add_argument("--quick", action="store_true", help="a small grid (CI: under a minute on 2 CPU cores)")
    p.add_argument(
        "--grid",
        choices=sorted(grids.GRIDS),
        default=None,
        help="the sizes to time: full (the default), quick (as --quick), or smoke (every series of the full grid at a "
        "few small sizes, timed briefly: checks that the full grid runs, in seconds; not a calibration)",
    )
    p.add_argument("--name", default=None, help="the profile's name (default: the --out file's stem)")
    p.add_argument(
        "--base",
        default=None,
        help="datasheet profile whose device rates anchor the fit (default: matched from the GPU's name; "
        "'none' to measure the rates, as on a CPU)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs and weights")
    p.add_argument(
        "--kernels-only",
        action="store_true",
        help="fit the efficiency curves to the kernel measurements alone, then the overheads to the iterations "
        "(default: kernels and iterations together)",
    )
    g = p.add_argument_group("fitting measurements taken elsewhere")
    g.add_argument(
        "--from-measurements",
        type=Path,
        default=None,
        metavar="FILE_OR_DIR",
        help="a raw CSV of `ferry calibrate`, or Vidur's profiling directory (holds compute/)",
    )
    g.add_argument("--hardware", default=None, help="Vidur data: the device whose rows to fit (a100-80g, h100-sxm)")
    g.add_argument(
        "--from-iterations",
        type=Path,
        default=None,
        metavar="FILE",
        help="measured iterations of any engine (CSV or Parquet; columns in costmodel/calibration/iterations.py): "
        "fit --base's efficiencies and overheads to them for --model",
    )
    g.add_argument("--engine", default=None, help="--from-iterations: the engine measured (words, for the profile)")
    g.add_argument(
        "--from-aiconfigurator",
        default=None,
        metavar="SYSTEM",
        help="fit to NVIDIA's measured kernel database (aiconfigurator-core, pip install 'ferry[measured]'): "
        + ", ".join(sorted(SYSTEMS)),
    )
    g.add_argument(
        "--framework", choices=FRAMEWORKS, default="vllm", help="--from-aiconfigurator: whose kernels (default vllm)"
    )
    g.add_argument("--version", default=None, help="--from-aiconfigurator: the engine release (default: the package's)")
    g.add_argument(
        "--engine-overheads",
        default=None,
        help="--from-aiconfigurator: the host-overhead preset (default: the framework's; hwprofiles/engines.yaml)",
    )
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    sources = [
        s for s in ("from_measurements", "from_iterations", "from_aiconfigurator") if getattr(args, s) is not None
    ]
    if len(sources) > 1:
        raise ValueError(f"give one of --{sources[0].replace('_', '-')} and --{sources[1].replace('_', '-')}, not both")
    if args.from_aiconfigurator is not None:
        from experiments.commands.calibrate_measured import from_database

        return from_database(args)
    if args.from_measurements is not None:
        return _refit(args)
    if args.from_iterations is not None:
        from experiments.commands.calibrate_iterations import from_iterations

        return from_iterations(args)
    if not args.model:
        raise ValueError("give at least one --model to measure (or --from-measurements FILE_OR_DIR)")
    out: Path = args.out
    outputs.check_file(out)  # before the measurements, not after them
    raw_path = raw_path_of(out)
    result, raw = calibrate(
        models=args.model,
        device=args.device,
        dtype=args.dtype or "float32",
        threads=args.threads,
        quick=args.quick,
        grid=args.grid,
        name=args.name or out.stem,
        base=args.base,
        seed=args.seed,
        measurements=raw_path.name,
        joint=not args.kernels_only,
        log=print,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    raw.to_csv(raw_path, index=False)
    write_profile(result.profile, out, f"ferry calibrate on {result.profile.provenance.device}")
    print(f"held-out error of {out} (rows it was not fitted on; |predicted / measured - 1|):")
    print(format_errors(result.errors))
    print(f"wrote {out} and {raw_path}")
    return 0


def raw_path_of(profile: Path) -> Path:
    """Where the raw measurements of ``profile`` go: beside it, ``NAME.raw.csv``."""
    return profile.with_name(profile.stem + ".raw.csv")


write_profile = save_hardware  # the profile file with its header (where other commands imported it from)


def base_profile(base: str | None, device: Any) -> HardwareProfile | None:
    """The datasheet profile that anchors the device rates: ``base`` if named ('none': no base), else the GPU's by
    its name; None on the CPU or for a GPU ferry has no profile of."""
    if base is not None:
        return None if base.lower() == "none" else load_hardware(base)
    if device.type != "cuda":
        return None
    torch = K.require_torch()
    name = torch.cuda.get_device_name(device).upper()
    for words, profile in GPU_PROFILES:
        if all(w in name for w in words) and profile in builtin_hardware():
            return load_hardware(profile)
    return None


def calibrate(
    *,
    models: list[str],
    device: str,
    dtype: str,
    threads: int | None,
    quick: bool,
    grid: str | None = None,
    name: str,
    base: str | None,
    seed: int,
    measurements: str,
    joint: bool = True,
    log: Any = print,
) -> tuple[FitResult, pd.DataFrame]:
    """Measure, fit and score; returns the fit and the raw measurements (the caller writes them)."""
    torch = K.require_torch()
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    dev = K.device_of(device)
    if dev.type == "cpu" and dtype != "float32":
        log(f"note: {dtype} on a CPU runs without native support on most CPUs; timings will show it")
    if quick and grid not in (None, "quick"):
        raise ValueError(f"--quick is --grid quick; it contradicts --grid {grid}")
    sizes = grids.GRIDS[grid] if grid is not None else grids.QUICK if quick else grids.FULL
    anchor = base_profile(base, dev)
    device_name, software = devices.describe(dev)
    log(f"calibrating {device_name} in {dtype} ({sizes.name} grid), base profile: {anchor.name if anchor else 'none'}")
    started = time.perf_counter()
    rows = harness.measure_device(dev, dtype, sizes)
    rows.append(rows[0] | {"op": "memory", "op_class": "capacity", "bytes": float(devices.memory_bytes(dev))})
    rows[-1] |= {"median_s": 1.0, "min_s": 1.0, "max_s": 1.0, "repeats": 1}
    for model in models:
        spec = load_model(model)
        log(f"{spec.name}: kernels")
        rows += harness.measure_model(spec, model, dev, dtype, sizes, seed=seed, log=log)
        log(f"{spec.name}: executor iterations")
        rows += measure_iterations(model, spec, device, dtype, sizes.name, seed=seed, log=log)
    if dev.type == "cuda":
        rows += harness.measure_all_reduce(dtype, tuple(1 << k for k in range(10, 31, 2)), log=log)
    settings = {
        "device": device,
        "dtype": dtype,
        "threads": str(torch.get_num_threads()) if dev.type == "cpu" else "",
        "models": ",".join(models),
        "grid": sizes.name,
        "base": anchor.name if anchor else "none",
        "seed": str(seed),
        "fit": "joint" if joint else "kernels-only",
    }
    settings = {k: v for k, v in settings.items() if v}
    raw = pd.DataFrame(rows, columns=[*harness.ROW_COLUMNS])
    raw["host_s"] = raw["host_s"].fillna(0.0)
    raw["software"] = json.dumps(software)
    raw["date"] = date.today().isoformat()
    raw["settings"] = json.dumps(settings)
    log(f"measured {len(raw)} rows in {time.perf_counter() - started:.0f} s; fitting")
    result = fit_profile(raw, name=name, base=anchor, measurements=measurements, settings=settings, joint=joint)
    return result, raw


def measure_iterations(
    model: str, spec: ModelSpec, device: str, dtype: str, grid: str, seed: int = 0, log: Any = print
) -> list[dict[str, Any]]:
    """Whole iterations of the real executor: short serving runs (``SERVING_RUNS``, chunked prefill) on the model at
    full depth and at half depth (so per-layer time separates from per-iteration time). One row per iteration with
    its shape's kernels (``kernels``), sequences, layers, and the host's share of it (``host_s``: the time outside the
    forward pass); skipped when the model does not fit."""
    import policies
    from experiments.real.executor import Executor, replay
    from experiments.real.llama import Llama
    from sim.kvcache import KVCacheManager
    from sim.request import RequestTable

    runs = SERVING_RUNS[grid]
    max_len = max(p + o for _, p, o, _, _ in runs) + 1
    dev = K.device_of(device)
    weights = CostModel(spec, load_hardware("h100-sxm"), dtype=dtype).weight_bytes_per_gpu()
    if weights > devices.memory_bytes(dev) // 3:
        log(f"  skip: {spec.name}'s weights ({weights / 2**30:.1f} GiB) do not fit comfortably; overheads not measured")
        return []
    rows: list[dict[str, Any]] = []
    depths = sorted({spec.num_hidden_layers, max(1, spec.num_hidden_layers // 2)}, reverse=True)
    name = devices.describe(dev)[0]
    for depth in depths:
        llama = Llama.build(model, device, dtype, max_len=max_len, layers=depth, seed=seed)
        work = WorkCounter(dataclasses.replace(spec, num_hidden_layers=depth), dtype)
        for k, (n, prompt, output, budget, interval) in enumerate(runs):
            requests = RequestTable(np.arange(n) * interval, np.full(n, prompt), np.full(n, output))
            config = policies.SchedulerConfig(
                policy="chunked", max_num_seqs=n, max_num_batched_tokens=budget, max_model_len=max_len
            )
            executor = Executor(llama, requests, np.random.default_rng(seed + k), slots=n)
            kv = KVCacheManager(n * (-(-max_len // 16)), 16, n)
            run = replay(requests, policies.get(config), executor, kv, max_len)
            for shape, seconds, forward in zip(run.shapes, run.durations(), run.forward_s, strict=True):
                host = max(0.0, float(seconds) - forward)
                rows.append(
                    iteration_row(shape, float(seconds), work, device=name, dtype=dtype, model=model, layers=depth,
                                  host_s=host)
                )  # fmt: skip
        log(f"  depth {depth}: {len(runs)} serving runs")
    return rows


# ---- fitting measurements taken elsewhere ----------------------------------------------------------------------------


def _refit(args: argparse.Namespace) -> int:
    from costmodel.calibration import refit

    source: Path = args.from_measurements
    out: Path = args.out
    outputs.check_file(out)  # before the fit, not after it
    name = args.name or out.stem
    if source.is_dir():
        report = refit.fit_vidur(source, hardware=args.hardware, models=args.model, name=name)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_profile(report.fit.profile, out, f"ferry calibrate --from-measurements {source}")
        print(f"fitted {report.fit.profile.name} to {report.fitted} Vidur measurements on {report.hardware}")
        print("held-out error (every other point of the fitted series; |predicted / measured - 1|):")
        print(format_errors(report.fit.errors))
        print("on measurements the fit did not see, before (the datasheet profile) and after (the fitted one):")
        print(refit.format_transfer(report.transfer))
        print(f"wrote {out}")
        return 0
    if not source.is_file():
        raise ValueError(f"--from-measurements {source}: no such file or directory")
    text_columns = {c: str for c in ("device", "dtype", "model", "op", "op_class", "shape", "kernels", "settings")}
    raw = pd.read_csv(source, dtype=text_columns)
    for col in text_columns:
        if col in raw.columns:
            raw[col] = raw[col].fillna("")
    if "host_s" in raw.columns:
        raw["host_s"] = raw["host_s"].fillna(0.0)
    missing = [c for c in ("op", "op_class", "median_s", "kernels", "dtype") if c not in raw.columns]
    if missing:
        raise ValueError(f"{source}: not a raw CSV of `ferry calibrate` (missing columns {', '.join(missing)})")
    settings = {}
    if "settings" in raw.columns and len(raw):
        settings = json.loads(str(raw["settings"].iloc[0]) or "{}")
    base_name = args.base if args.base is not None else settings.get("base", "none")
    anchor = None if str(base_name).lower() == "none" else load_hardware(str(base_name))
    raw["kernels"] = raw["kernels"].replace("", "[]")
    joint = not args.kernels_only and settings.get("fit", "joint") == "joint"
    result = fit_profile(raw, name=name, base=anchor, measurements=str(source), settings=settings or None, joint=joint)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_profile(result.profile, out, f"ferry calibrate --from-measurements {source}")
    print(f"held-out error of {out} (rows it was not fitted on; |predicted / measured - 1|):")
    print(format_errors(result.errors))
    print(f"wrote {out}")
    return 0
