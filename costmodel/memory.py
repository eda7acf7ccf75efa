"""KV-cache capacity of one GPU of a replica, as vLLM computes it.

    usable      = device memory x gpu_memory_utilization
    KV cache    = usable - weights on this GPU - activation reserve
    blocks      = floor(KV cache / (block_size x KV bytes per token on this GPU))

vLLM measures the activation reserve with a profiling forward pass; ferry estimates it (``CostModel.memory_plan``).
Every GPU of a tensor-parallel replica holds 1/tp of each token's KV (all of MLA's latent: one head), so the
replica's token capacity is one GPU's; with pipeline parallelism each stage holds its own layers' weights and KV, and
the replica has the blocks of the stage that fits fewest (vLLM takes the least of its workers' counts,
``vllm/v1/core/kv_cache_utils.py``); with data parallelism each rank has a cache of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = float(1 << 30)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """How one GPU's memory divides between weights, activations and the KV cache."""

    model: str
    hardware: str
    tp: int  # GPUs the replica is split over
    gpu_memory_bytes: int  # device memory (B)
    gpu_memory_utilization: float  # share of it the engine may use
    usable_bytes: int  # gpu_memory_bytes x gpu_memory_utilization (B)
    weight_bytes_per_gpu: int  # this GPU's share of the weights (B)
    activation_reserve_bytes: int  # peak activations of a forward pass + runtime reserve (B)
    kv_bytes_per_token: int  # KV cache of one token on this GPU (B)
    kv_cache_bytes: int  # what is left for the KV cache (B)
    block_size: int  # tokens per KV block
    num_gpu_blocks: int  # KV blocks that fit
    layout: str = ""  # the parallel layout, e.g. "tp=8" or "tp=1, dp=8, ep=8" (empty: tp alone)
    stage: int = 0  # the pipeline stage this plan is of (the one that fits fewest blocks)
    pp: int = 1  # pipeline stages

    @property
    def usable_blocks(self) -> int:
        """Blocks requests can hold: vLLM's block pool keeps one of ``num_gpu_blocks`` as its null block
        (``vllm/v1/core/block_pool.py``, ``BlockPool.null_block``), which no request is given."""
        return self.num_gpu_blocks - 1

    @property
    def max_tokens(self) -> int:
        """Tokens the KV cache holds, all sequences together, as vLLM reports its size (its null block included)."""
        return self.num_gpu_blocks * self.block_size

    def describe(self) -> str:
        """A few lines for ``ferry run``'s report."""
        where = self.layout or f"tp={self.tp}"
        if self.pp > 1:
            where += f"; stage {self.stage} of {self.pp}, the one that fits fewest blocks"
        return (
            f"memory per GPU ({self.hardware}, {where}): {self.gpu_memory_bytes / GiB:.1f} GiB x "
            f"{self.gpu_memory_utilization:g} = {self.usable_bytes / GiB:.2f} GiB usable; "
            f"weights {self.weight_bytes_per_gpu / GiB:.2f} GiB, activation reserve "
            f"{self.activation_reserve_bytes / GiB:.2f} GiB, KV cache {self.kv_cache_bytes / GiB:.2f} GiB\n"
            f"KV cache: {self.num_gpu_blocks:,} blocks of {self.block_size} tokens = {self.max_tokens:,} tokens "
            f"({self.kv_bytes_per_token / 1024:g} KiB per token per GPU)"
        )


def plan_memory(
    *,
    model: str,
    hardware: str,
    tp: int,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    weight_bytes_per_gpu: int,
    activation_reserve_bytes: int,
    kv_bytes_per_token: int,
    block_size: int,
    reserve_for: str = "",
    layout: str = "",
    stage: int = 0,
    pp: int = 1,
) -> MemoryPlan:
    """Divide one GPU's memory; ValueError naming the sizes, and the value at fault, when no KV block fits: the
    weights, the activation reserve (for ``reserve_for``, e.g. the scheduler limits it was sized for) or one block
    itself."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    usable = int(gpu_memory_bytes * gpu_memory_utilization)
    kv_cache = usable - weight_bytes_per_gpu - activation_reserve_bytes
    block_bytes = block_size * kv_bytes_per_token
    blocks = kv_cache // block_bytes if kv_cache > 0 else 0
    usable_text = (
        f"{gpu_memory_bytes / GiB:.1f} GiB x gpu_memory_utilization {gpu_memory_utilization:g} = "
        f"{usable / GiB:.1f} GiB is usable"
    )
    # the weights fit on their own and a reserve sized for the limits takes the rest: the limits are at fault (a
    # reserve under a tenth of the usable memory is the runtime's own: then the weights are)
    reserve_at_fault = weight_bytes_per_gpu <= usable and activation_reserve_bytes > 0.1 * usable
    if blocks < 1 and kv_cache <= 0 and not reserve_at_fault:
        verdict = "do not fit" if weight_bytes_per_gpu > usable else "leave no room for the KV cache"
        at = layout or f"tp={tp}"
        raise ValueError(
            f"{model} does not fit on {hardware} at {at}: its weights need {weight_bytes_per_gpu / GiB:.1f} GiB "
            f"per GPU{f' (pipeline stage {stage})' if pp > 1 else ''} and the activation reserve "
            f"{activation_reserve_bytes / GiB:.1f} GiB, but {usable_text}, so they {verdict}; use more GPUs (tensor "
            "parallelism; pipeline or expert parallelism), quantized weights or a larger device"
        )
    if blocks < 1 and kv_cache <= 0:  # the reserve, larger than the weights, is what leaves no room
        raise ValueError(
            f"the activation reserve{' for ' + reserve_for if reserve_for else ''} needs "
            f"{activation_reserve_bytes / GiB:,.1f} GiB per GPU, more than the "
            f"{(usable - weight_bytes_per_gpu) / GiB:.1f} GiB left after {model}'s weights "
            f"({weight_bytes_per_gpu / GiB:.1f} GiB) on {hardware} ({usable_text}); lower those limits"
        )
    if blocks < 1:
        raise ValueError(
            f"block_size={block_size:,}: one KV block needs {block_bytes / GiB:,.2f} GiB per GPU, but only "
            f"{kv_cache / GiB:.2f} GiB is left for the KV cache of {model} on {hardware}; use a smaller --block-size "
            "(vLLM's default is 16 tokens)"
        )
    return MemoryPlan(
        model=model,
        hardware=hardware,
        tp=tp,
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        usable_bytes=usable,
        weight_bytes_per_gpu=weight_bytes_per_gpu,
        activation_reserve_bytes=activation_reserve_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        kv_cache_bytes=kv_cache,
        block_size=block_size,
        num_gpu_blocks=int(blocks),
        layout=layout,
        stage=stage,
        pp=pp,
    )
