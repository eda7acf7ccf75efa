"""`ferry roofline`: draw the device's roofline with prefill and decode iterations of several sizes placed on it.

    ferry roofline --model llama-3-8b --hardware h100-sxm [--out roofline.png]

x is arithmetic intensity (FLOPs per byte of DRAM traffic), y the FLOP/s the iteration's GPU operators attain
(FLOPs / their predicted time, host overheads excluded). Prefill sits right of the ridge point (compute-bound), decode
left of it (memory-bound) and climbs the bandwidth slope as the batch grows.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from costmodel import CostModel, IterationShape
from experiments.commands.iteration import add_model_arguments, cost_model_from_args
from experiments.runner.outputs import figure_path

PREFILL_TOKENS = (128, 512, 2048, 8192)
DECODE_BATCHES = (1, 8, 32, 128, 256)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "roofline", help="draw the roofline with prefill and decode iterations on it (PNG)", description=__doc__
    )
    add_model_arguments(parser)
    parser.add_argument("--context", type=int, default=1024, help="context length of the decode points (default 1024)")
    parser.add_argument("--out", type=Path, default=Path("roofline.png"), help="PNG to write (default roofline.png)")
    parser.set_defaults(func=handle)


def points(cm: CostModel, context: int) -> list[dict[str, Any]]:
    """The iterations to place: (label, kind, FLOPs, bytes, GPU seconds, attained FLOP/s, intensity)."""
    max_len = cm.model.max_position_embeddings
    shapes = [("prefill", f"prefill {n}", IterationShape.of(prefill=[(n, 0)])) for n in PREFILL_TOKENS if n <= max_len]
    shapes += [("decode", f"decode x{b} @{context}", IterationShape.of(decode=[(b, context)])) for b in DECODE_BATCHES]
    out = []
    for kind, label, shape in shapes:
        b = cm.explain(shape)
        out.append(
            {
                "kind": kind,
                "label": label,
                "flops": b.flops,
                "bytes": b.bytes,
                "gpu_time_s": b.gpu_time_s,
                "intensity": b.flops / b.bytes,
                "flops_per_s": b.flops / b.gpu_time_s,
            }
        )
    return out


def draw(cm: CostModel, context: int, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hw = cm.hardware
    peak = hw.peak_flops(cm.gemm_dtype)
    bw = hw.bandwidth
    ridge = peak / bw
    eff = hw.efficiency.gemm
    pts = points(cm, context)

    lo = min(0.5, min(p["intensity"] for p in pts) / 2)
    hi = max(ridge * 20, max(p["intensity"] for p in pts) * 2)
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.plot(xs, [min(peak, bw * x) / 1e12 for x in xs], color="black", lw=2, label="roofline (datasheet peaks)")
    ax.plot(
        xs,
        [min(peak * eff.compute.max, bw * eff.memory.max * x) / 1e12 for x in xs],
        color="gray",
        ls="--",
        lw=1,
        label=f"attainable GEMM (x{eff.compute.max:g} compute, x{eff.memory.max:g} bandwidth)",
    )
    ax.axvline(ridge, color="gray", ls=":", lw=1)
    ax.annotate(
        f"ridge point = peak / bandwidth\n= {ridge:.0f} FLOP/byte",
        xy=(ridge, 0.03),
        xycoords=("data", "axes fraction"),
        xytext=(5, 0),
        textcoords="offset points",
        fontsize=8,
    )
    colours = {"prefill": "tab:red", "decode": "tab:blue"}
    for kind in ("prefill", "decode"):
        sel = [p for p in pts if p["kind"] == kind]
        ax.scatter(
            [p["intensity"] for p in sel],
            [p["flops_per_s"] / 1e12 for p in sel],
            color=colours[kind],
            zorder=3,
            label=f"{kind} iterations",
        )
        for i, p in enumerate(sel):  # labels alternate above-left and below-right so neighbours stay legible
            ax.annotate(
                f"{p['label']}\n{p['gpu_time_s'] * 1e3:.1f} ms",
                (p["intensity"], p["flops_per_s"] / 1e12),
                textcoords="offset points",
                xytext=(-8, 8) if i % 2 else (8, -18),
                ha="right" if i % 2 else "left",
                fontsize=7,
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of DRAM traffic)")
    ax.set_ylabel(f"attained {cm.gemm_dtype} TFLOP/s (GPU operators)")
    ax.set_title(
        f"{cm.model.name} on {hw.name} (tp={cm.tp}): prefill is compute-bound, decode memory-bound", fontsize=10
    )
    ax.grid(True, which="both", alpha=0.2)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def handle(args: argparse.Namespace) -> int:
    if args.context < 0:
        raise ValueError(f"--context must be >= 0, got {args.context}")
    cm = cost_model_from_args(args)
    max_len = cm.model.max_position_embeddings
    if args.context + 1 > max_len:  # as `ferry iteration` refuses it: a decode at context C makes token C + 1
        raise ValueError(
            f"--context {args.context}: a decode there exceeds {cm.model.name}'s max_position_embeddings={max_len}"
        )
    path = draw(cm, args.context, figure_path(args.out))
    print(f"wrote {path}")
    return 0
