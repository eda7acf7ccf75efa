"""`ferry run` for a disaggregated cluster (``RunConfig.disaggregation``): the flags (the pools' sizes, what differs
between them, the KV link; a YAML config may set any replica field per pool instead) and the summary's lines."""

from __future__ import annotations

import argparse
from typing import Any

S = argparse.SUPPRESS
# flag destination -> (pool, replica field); None: a field of the disaggregation itself
POOL_FLAGS = {
    "prefill_replicas": ("prefill", "count"),
    "decode_replicas": ("decode", "count"),
    "prefill_hardware": ("prefill", "hardware"),
    "decode_hardware": ("decode", "hardware"),
    "prefill_tensor_parallel_size": ("prefill", "tensor_parallel_size"),
    "decode_tensor_parallel_size": ("decode", "tensor_parallel_size"),
    "prefill_policy": ("prefill", "policy"),
    "decode_policy": ("decode", "policy"),
}
LINK_FLAGS = ("kv_link", "network_bandwidth_gbps", "network_latency_us")


def add_disagg_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prefill/decode disaggregation (both pool sizes switch it on)")
    g.add_argument("--prefill-replicas", type=int, default=S, metavar="P", help="replicas that only prefill")
    g.add_argument("--decode-replicas", type=int, default=S, metavar="D", help="replicas that only decode")
    for role in ("prefill", "decode"):
        g.add_argument(f"--{role}-hardware", default=S, help=f"the {role} pool's device (default --hardware)")
        g.add_argument(f"--{role}-tensor-parallel-size", type=int, default=S, help=f"the {role} pool's TP")
        g.add_argument(f"--{role}-policy", default=S, help=f"the {role} pool's policy: continuous or chunked")
    g.add_argument(
        "--kv-link",
        choices=("auto", "nvlink", "network"),
        default=S,
        help="what the KV crosses: NVLink, the network, or auto (NVLink when both pools fit one node of 8 GPUs)",
    )
    g.add_argument("--network-bandwidth-gbps", type=float, default=S, help="network link per GPU (GB/s, 50)")
    g.add_argument("--network-latency-us", type=float, default=S, help="fixed cost of a network transfer (µs, 20)")


def disagg_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with the disaggregation flags folded into one ``disaggregation`` field (unchanged if none)."""
    given = {k: overrides.pop(k) for k in (*POOL_FLAGS, *LINK_FLAGS) if k in overrides}
    if not given:
        return overrides
    if "prefill_replicas" not in given or "decode_replicas" not in given:
        raise ValueError("--prefill-replicas and --decode-replicas: give both to disaggregate (and neither otherwise)")
    pools: dict[str, dict[str, Any]] = {"prefill": {}, "decode": {}}
    for key, (role, field) in POOL_FLAGS.items():
        if key in given:
            pools[role][field] = given[key]
    return overrides | {"disaggregation": pools | {k: given[k] for k in LINK_FLAGS if k in given}}


def disagg_rows(s: dict[str, Any]) -> list[tuple[str, Any]]:
    """Each pool (replicas, device, policy, how busy) and the KV transfers between them."""
    rows: list[tuple[str, Any]] = []
    for role, p in s["pools"].items():
        rows.append((f"{role.capitalize()} pool", f"{p['replicas']} x {p['hardware']} tp{p['tensor_parallel_size']}, "
                     f"{p['policy']}: busy {p['utilization']:.0%}, peak KV {p['peak_kv_usage']:.0%}"))  # fmt: skip
    t = s["kv_transfer"]
    if t["transfers"]:
        rate = "instant" if t["bandwidth_gbps"] is None else f"{t['bandwidth_gbps']:g} GB/s x{t['lanes']}"
        rows.append(("KV transfers", f"{t['transfers']:,} over {t['link']} ({rate}), {t['mean_bytes'] / 2**20:,.1f} "
                     f"MiB each, mean {t['mean_transfer_ms']:.3f} ms, p99 {t['p99_transfer_ms']:.3f} ms"))  # fmt: skip
    return rows
