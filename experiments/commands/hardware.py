"""`ferry hardware`: the built-in GPU profiles (``hwprofiles/*.yaml``) and their key facts: memory per GPU, the peak
rates each states (dense TFLOP/s in bf16, fp8, fp4), memory bandwidth, the interconnect (its bandwidth and how many
GPUs one link joins), where the profile's numbers come from (``HardwareProfile.origin``, the line `ferry run` prints as
``Profile numbers:``) and the price of a GPU-hour (``hwprofiles/prices.yaml``).

Profiles are grouped by device: its default profile (fitted to vLLM's measured kernels where NVIDIA's database has
the device), then its variants (``.datasheet``, the ``.sglang`` and ``.trtllm`` engines, ``.vidur``). Nothing here
loads the engine or pandas."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from experiments.commands.listing import table

if TYPE_CHECKING:
    from costmodel.hardware import HardwareProfile

PEAKS = ("bf16", "fp8", "fp4")  # the formats the table shows (--json: every one the profile states)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hardware",
        help="list the built-in GPU profiles with memory, peak rates, bandwidth, interconnect, origin and price",
        description="List every built-in hardware profile (--hardware NAME), grouped by device: memory per GPU, "
        "dense peak TFLOP/s (bf16, fp8, fp4) and memory bandwidth as the profile states them, the interconnect "
        "(GB/s per GPU per direction, GPUs one link joins: the most tensor parallelism may span), where the "
        "numbers come from (measured kernel tables, a calibration, or a datasheet with assumed efficiencies) and "
        "the price per GPU-hour ferry plan uses. Names narrow the list to those devices and print each origin in "
        "full.",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="devices or profiles to show (default: all)")
    p.add_argument("--json", action="store_true", help="print a JSON list of objects instead of the table")
    p.set_defaults(func=main)


def device_of(name: str) -> tuple[str, str]:
    """A profile's device and variant: ``h100-sxm.sglang`` -> (``h100-sxm``, ``sglang``); the default's is ``""``."""
    device, _, variant = name.partition(".")
    return device, variant


def numbers_text(profile: HardwareProfile) -> str:
    """Where the profile's numbers come from, in a few words (the whole line: ``HardwareProfile.origin``)."""
    if profile.kernel_tables is not None:
        from costmodel import kerneldb

        tables = profile.kernel_tables
        here = kerneldb.missing(tables) is None
        return f"measured {tables.framework} {tables.version} kernels" + ("" if here else " (curves: tables not here)")
    if profile.kind == "calibrated":
        p = profile.provenance
        return f"calibrated: {(p.software or {}).get('source') or p.device}"
    return "datasheet; efficiencies and overheads assumed"


def facts(name: str, prices: dict[str, Any]) -> dict[str, Any]:
    """One profile's facts, with stable keys (``--json``): memory in GiB, rates in TFLOP/s and GB/s (1e9 B/s) as the
    profile states them; the price ``None`` where ``prices.yaml`` has none for the profile or its device."""
    from costmodel.hardware import load_hardware
    from costmodel.prices import price_of

    h = load_hardware(name)
    device, variant = device_of(name)
    try:
        price = price_of(prices, name)
    except ValueError:
        price = None
    return {
        "name": name,
        "device": device,
        "variant": variant,
        "description": h.description,
        "kind": h.kind,
        "memory_gib": h.memory_capacity_gib.value,
        "peak_tflops": {k: q.value for k, q in h.peak_tflops.items()},
        "memory_bandwidth_gbps": h.memory_bandwidth_gbps.value,
        "interconnect": h.interconnect.name,
        "link_bandwidth_gbps": h.interconnect.bandwidth_gbps.value,
        "domain_gpus": h.interconnect.domain_gpus,
        "kernel_tables": h.kernel_tables.describe() if h.kernel_tables is not None else None,
        "numbers": numbers_text(h),
        "origin": h.origin(),
        "usd_per_gpu_hour": price.usd_per_gpu_hour if price is not None else None,
        "price_source": price.source if price is not None else None,
        "price_date": price.date if price is not None else None,
    }


VARIANTS = ("", "datasheet", "sglang", "trtllm", "vidur")  # a device's profiles in this order, any other after


def selected(names: list[str]) -> list[str]:
    """The built-in profiles, grouped by device (``VARIANTS`` order); narrowed to ``names`` (devices or profiles),
    ValueError naming one that is neither."""
    from costmodel.hardware import builtin_hardware

    order = {v: k for k, v in enumerate(VARIANTS)}
    every = sorted(builtin_hardware(), key=lambda n: (device_of(n)[0], order.get(device_of(n)[1], len(order)), n))
    if not names:
        return every
    wanted = {n.strip().lower() for n in names}
    unknown = sorted(wanted - {n.lower() for n in every} - {device_of(n)[0].lower() for n in every})
    if unknown:
        raise ValueError(f"unknown hardware {', '.join(unknown)}; built-ins: {', '.join(every)}")
    return [n for n in every if n.lower() in wanted or device_of(n)[0].lower() in wanted]


COLUMNS = (("profile", "<"), ("memory", ">"), ("bf16", ">"), ("fp8", ">"), ("fp4", ">"), ("HBM GB/s", ">"),
           ("link", "<"), ("GB/s", ">"), ("GPUs", ">"), ("$/GPU-h", ">"), ("numbers", "<"))  # fmt: skip


def render(rows: list[dict[str, Any]], origins: bool) -> str:
    cells = [
        [f["name"], f"{f['memory_gib']:g} GiB", *(f"{f['peak_tflops'][k]:,g}" if k in f["peak_tflops"] else "-"
                                                  for k in PEAKS),
         f"{f['memory_bandwidth_gbps']:,g}", f["interconnect"].split(" (")[0],
         f"{f['link_bandwidth_gbps']:g}", str(f["domain_gpus"]),
         "-" if f["usd_per_gpu_hour"] is None else f"{f['usd_per_gpu_hour']:.2f}", f["numbers"]]
        for f in rows
    ]  # fmt: skip
    lines = [table(COLUMNS, cells)]
    lines.append("bf16, fp8, fp4: dense peak TFLOP/s as the profile states them; link: GB/s per GPU per direction, "
                 "and the GPUs it joins\n(the most --tensor-parallel-size may span); $/GPU-h: hwprofiles/prices.yaml "
                 "(on-demand list prices: assumptions); --json: every field")  # fmt: skip
    if origins:
        lines += ["", "Profile numbers (as `ferry run` prints them):"] + [f"  {f['name']}: {f['origin']}" for f in rows]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from costmodel.prices import load_prices

    prices = load_prices()
    rows = [facts(name, prices) for name in selected(args.names)]
    print(json.dumps(rows, indent=1) if args.json else render(rows, origins=bool(args.names)))
    return 0
