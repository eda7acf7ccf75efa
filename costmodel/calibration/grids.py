"""The grids of sizes the harness times: ``FULL`` (the default of ``ferry calibrate``), ``QUICK`` (CI's calibration)
and ``SMOKE`` (``FULL``'s every series at a few small sizes, timed briefly: a check that the full grid runs)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Grid:
    """The sizes measured and how long each point is timed."""

    name: str
    tokens: tuple[int, ...]  # token counts of the token-parallel kernels
    prefill_chunks: tuple[int, ...]  # new tokens of one prefill chunk
    prefill_contexts: tuple[int, ...]  # tokens already cached under the chunk
    decode_batches: tuple[int, ...]  # sequences decoding one token each
    decode_contexts: tuple[int, ...]  # tokens cached per decoding sequence
    budget_s: float  # seconds of samples per point (after warm-up)
    min_repeats: int  # samples per point at least
    max_call_s: float  # a series stops growing once one call takes longer than this (s)
    max_kv_tokens: int  # decode points with batch x context above this are skipped (memory)
    passes: int  # the grid is timed this many times over, a share of each point's budget each time
    pool_bytes: int | None = None  # the input pool's buffer (B); None: four times the last-level cache, >= 64 MiB


QUICK = Grid(
    name="quick",
    tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    prefill_chunks=(16, 64, 256, 512),
    prefill_contexts=(0, 128, 512),
    decode_batches=(1, 4, 16, 32),
    decode_contexts=(32, 128, 512),
    budget_s=0.06,
    min_repeats=5,
    max_call_s=0.25,
    max_kv_tokens=1 << 16,
    passes=3,
)
FULL = Grid(
    name="full",
    tokens=(
        1,
        2,
        4,
        8,
        12,
        16,
        24,
        32,
        48,
        64,
        96,
        128,
        192,
        256,
        384,
        512,
        768,
        1024,
        1536,
        2048,
        3072,
        4096,
        6144,
        8192,
        12288,
        16384,
    ),  # fmt: skip
    prefill_chunks=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
    prefill_contexts=(0, 256, 1024, 4096, 16384),
    decode_batches=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    decode_contexts=(16, 64, 256, 1024, 4096, 16384),
    budget_s=0.2,
    min_repeats=5,
    max_call_s=2.0,
    max_kv_tokens=1 << 21,
    passes=2,
)


def thinned(grid: Grid, name: str, *, every: int, max_size: int, budget_s: float, pool_bytes: int) -> Grid:
    """``grid``'s series (the same kernels, prefill contexts and decode contexts) with fewer and smaller points: every
    ``every``-th token count, chunk and batch size up to ``max_size``, at most ``grid.max_kv_tokens / 32`` tokens of
    KV cache per decode point, ``budget_s`` per point, one sample per pass at least. The input pool shrinks with the
    sizes (``pool_bytes``), so that input sets fill the pool, wrap around and outgrow it as the full sizes do."""

    def thin(sizes: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(n for k, n in enumerate(sizes) if k % every == 0 and n <= max_size)

    return Grid(
        name=name,
        tokens=thin(grid.tokens),
        prefill_chunks=thin(grid.prefill_chunks),
        prefill_contexts=grid.prefill_contexts,
        decode_batches=thin(grid.decode_batches),
        decode_contexts=grid.decode_contexts,
        budget_s=budget_s,
        min_repeats=grid.passes,
        max_call_s=grid.max_call_s,
        max_kv_tokens=grid.max_kv_tokens // 32,
        passes=grid.passes,
        pool_bytes=pool_bytes,
    )


# every series of the default grid, in seconds on a CPU: what CI runs to catch a crash anywhere in FULL
SMOKE = thinned(FULL, "smoke", every=3, max_size=512, budget_s=0.004, pool_bytes=16 << 20)
GRIDS = {"quick": QUICK, "full": FULL, "smoke": SMOKE}
