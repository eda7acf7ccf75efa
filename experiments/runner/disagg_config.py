"""The settings of a disaggregated cluster (``RunConfig.disaggregation``): a pool of prefill replicas and a pool of
decode replicas, each a replica group (its ``count`` and any replica field: hardware, tensor_parallel_size, policy,
limits), and the link the KV cache crosses between them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from policies.config import ITERATION_LIMITED, Number

ROLES = ("prefill", "decode")
# the link between the pools when they span more GPUs than one node holds (``kv_link="auto"``)
GPUS_PER_NODE = 8
# a network link per GPU: one 400 Gb/s NIC (ConnectX-7, NDR InfiniBand) per GPU, as DGX H100 and B200 nodes have
DEFAULT_NETWORK_GBPS = 50.0
# one transfer's fixed cost on the network: RDMA setup and the KV connector's handshake (an assumption)
DEFAULT_NETWORK_LATENCY_US = 20.0


class Disaggregation(BaseModel):
    """Prefill on one pool, decode on another (DistServe, Splitwise; vLLM's disaggregated prefill)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prefill: dict[str, Any] = Field(..., description="the prefill pool: count and the fields that differ")
    decode: dict[str, Any] = Field(..., description="the decode pool: count and the fields that differ")
    kv_link: Literal["auto", "nvlink", "network"] = Field(
        "auto",
        description="what the KV cache crosses: the GPUs' NVLink (one node), the network, or auto: NVLink when both "
        f"pools fit in one node of {GPUS_PER_NODE} GPUs",
    )
    network_bandwidth_gbps: Number = Field(
        DEFAULT_NETWORK_GBPS, gt=0, description="network bandwidth per GPU, one direction (GB/s)"
    )
    network_latency_us: Number = Field(
        DEFAULT_NETWORK_LATENCY_US, ge=0, description="fixed cost of one transfer on the network (µs)"
    )

    @field_validator("prefill", "decode")
    @classmethod
    def _count(cls, group: dict[str, Any]) -> dict[str, Any]:
        count = group.get("count", 1)
        if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
            raise ValueError(f"count={count!r}: the pool's number of replicas, an integer >= 1")
        return dict(group)

    def count(self, role: str) -> int:
        return int(getattr(self, role).get("count", 1))


def check_disaggregation(config: Any) -> None:
    """Refuse what a disaggregated ``RunConfig`` cannot be run with, naming the field."""
    clash = [
        name
        for name, on in (
            ("replicas", config.replicas != 1),
            ("replica_groups", bool(config.replica_groups)),
            ("enable_prefix_caching", config.enable_prefix_caching),
            ("turns", config.workload.turns > 1),
            ("record_batches", config.record_batches),
        )
        if on
    ]
    if clash:
        raise ValueError(f"disaggregation: not with {', '.join(clash)} (the pools replace them; not modelled together)")
    for role in ROLES:
        try:
            pool = config.pool_config(role)
        except ValueError as exc:
            raise ValueError(f"disaggregation.{role}: {exc}") from None
        if pool.scheduler.policy not in ITERATION_LIMITED:
            raise ValueError(
                f"disaggregation.{role}: policy {pool.scheduler.policy!r}; a pool runs continuous or chunked batching"
            )
