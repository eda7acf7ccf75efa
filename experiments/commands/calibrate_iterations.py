"""`ferry calibrate --from-iterations FILE`: fit a profile to the measured iterations of any engine.

    ferry calibrate --from-iterations iterations.csv --model CONFIG --base h100-sxm [--dtype bfloat16] \\
        [--engine "vLLM 0.11 on H100"] --out PROFILE.yaml

Reads the iteration table (``costmodel.calibration.iterations``: one row per iteration, its decodes and prefill
chunks and its measured seconds), fits ``--base``'s efficiency curves and host overheads to every other iteration and
prints the error on the rest. Writes ``PROFILE.yaml`` and ``PROFILE.fit.csv`` (each iteration's shape, measured and
predicted seconds, and whether it was held out).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from costmodel.calibration.iterations import fit_iterations, read_iterations
from costmodel.calibration.profile import format_errors
from costmodel.hardware import load_hardware, save_hardware
from costmodel.model_spec import load_model
from experiments.runner import outputs


def from_iterations(args: argparse.Namespace) -> int:
    if len(args.model) != 1:
        raise ValueError("--from-iterations needs exactly one --model: the model the engine ran (name or config.json)")
    if args.base is None or args.base.lower() == "none":
        raise ValueError(
            "--from-iterations needs --base: the profile whose device rates anchor the fit (e.g. h100-sxm)"
        )
    source: Path = args.from_iterations
    out: Path = args.out
    outputs.check_file(out)
    frame = read_iterations(source)
    spec = load_model(args.model[0])
    dtype = args.dtype or spec.torch_dtype
    engine = args.engine or f"engine measured in {source.name}"
    result = fit_iterations(
        frame,
        spec=spec,
        dtype=dtype,
        base=load_hardware(args.base),
        name=args.name or out.stem,
        source=engine,
        measurements=str(source),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    save_hardware(result.profile, out, f"ferry calibrate --from-iterations {source}")
    fit_path = out.with_name(out.stem + ".fit.csv")
    rows = result.rows[["shape", "median_s", "predicted_s", "held_out"]].rename(columns={"median_s": "measured_s"})
    rows.to_csv(fit_path, index=False)
    ov = result.profile.overheads
    print(f"fitted {len(frame)} iterations of {spec.name} ({dtype}) on {engine}; base {args.base}")
    print(
        f"overheads: {ov.per_iteration_s.value * 1e3:.3g} ms per iteration, "
        f"{ov.per_sequence_s.value * 1e6:.3g} us per sequence"
    )
    print("held-out error (every other iteration, never fitted on; |predicted / measured - 1|):")
    print(format_errors(result.errors))
    print(f"wrote {out} and {fit_path} (each iteration: measured, predicted, held out)")
    return 0
