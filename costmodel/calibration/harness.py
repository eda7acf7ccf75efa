"""The calibration harness: time the kernels an LLM iteration is made of on one device, one row per kernel run.

What it runs (``costmodel.calibration.kernels``, the functions the real executor calls), for each model's shapes, in its
dtype:
- GEMMs (``qkv_proj``, ``o_proj``, ``mlp_gate_up``, ``mlp_down``, ``lm_head``) and the token-parallel elementwise
  kernels (``embedding``, ``norm``, ``rope``, ``mlp_act``) over a range of token counts;
- prefill attention over chunk and context lengths, decode attention over batch and context lengths;
- a large device copy (bandwidth), the fixed cost of an empty step (launch and synchronise), and on several GPUs the
  all-reduce of tensor parallelism (``measure_all_reduce``).

How it times: a few warm-up calls; then samples until a time budget (and a minimum count) is spent, each sample being
one call (or a few back-to-back calls when a call is tiny), timed with CUDA events on a GPU and ``perf_counter`` on
the CPU, the device synchronised before reading; the row keeps the median, min and max per call. The grid is timed in
several passes whose samples are pooled, so a spell of interference spoils a share of every point's samples rather
than all the points measured during it. Inputs are random (never zeros: some kernels shortcut them), disjoint slices
of one large random buffer (``Pool``), and rotate over enough sets that together they exceed twice the last-level
cache, so each call reads from memory as it would inside a model too big for the cache.

The pieces: ``grids`` (which sizes), ``device`` (what the device is), ``timing`` (``Timer`` and ``Pool``), and this
module (which kernels, at which shapes, into rows).

On a GPU the kernels are launched eagerly from Python, as the real executor launches them: a small kernel's time
includes its launch when the host is slower than the device (no CUDA graphs). Untested on a GPU so far.

Each row carries ferry's FLOPs and bytes for the kernel (``costmodel.calibration.fit.WorkCounter``), so
``costmodel.calibration.fit`` can fit the profile from the rows alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from costmodel.calibration import kernels as K
from costmodel.calibration.device import describe, last_level_cache_bytes, memory_bytes
from costmodel.calibration.fit import WorkCounter, dump_terms
from costmodel.calibration.grids import Grid
from costmodel.calibration.timing import Pool, Timer
from costmodel.model_spec import ModelSpec
from costmodel.shape import IterationShape

if TYPE_CHECKING:
    import torch

Row = dict[str, Any]
Log = Callable[[str], None]

# the LM head runs on the sequences that sample, at most max_num_seqs (hundreds): larger sizes are not timed
MAX_SAMPLED = 2048
TOKEN_KERNELS = ("qkv_proj", "o_proj", "mlp_gate_up", "mlp_down", "lm_head", "embedding", "norm", "rope", "mlp_act")
ROW_COLUMNS = (
    "device",
    "dtype",
    "model",
    "layers",
    "op",
    "op_class",
    "num_tokens",
    "batch_size",
    "chunk",
    "context",
    "seqs",
    "shape",
    "flops",
    "bytes",
    "median_s",
    "min_s",
    "max_s",
    "repeats",
    "sets",
    "kernels",
    "host_s",  # whole iterations: seconds outside the model's forward pass (scheduling, inputs, bookkeeping)
)


# ---- the kernels of one model -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Point:
    """One kernel at one size, ready to time."""

    op: str  # ferry kernel name
    op_class: str
    num_tokens: int  # tokens through the kernel (chunk length for prefill attention, batch for decode)
    batch_size: int
    chunk: int
    context: int
    seqs: int
    shape: IterationShape  # an iteration whose ``op`` kernel this is
    make: Callable[[Pool], tuple[Any, ...]]  # a random input set
    run: Callable[[tuple[Any, ...]], object]  # the kernel on one set
    set_bytes: float  # bytes of one input set


def _token_points(spec: ModelSpec, eps: float, sizes: tuple[int, ...], item: int) -> Iterator[list[Point]]:
    """One series per token-parallel kernel, in token counts."""
    h, q, kv, i, v = spec.hidden_size, spec.q_size, spec.kv_size, spec.intermediate_size, spec.vocab_size
    hq, hkv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    gemms = {
        "qkv_proj": (q + 2 * kv, h, spec.attention_bias),
        "o_proj": (h, q, False),
        "mlp_gate_up": (2 * i, h, False),
        "mlp_down": (h, i, False),
        "lm_head": (v, h, False),
    }

    def gemm(n_out: int, n_in: int, bias: bool, t: int) -> tuple[Any, Any, float]:
        def make(p: Pool) -> tuple[Any, ...]:
            return (p.take(t, n_in), p.take(n_out, n_in), p.take(n_out) if bias else None)

        return make, lambda s: K.linear(*s), (t + n_out) * n_in * item

    def elementwise(name: str, t: int) -> tuple[Any, Any, float]:
        if name == "embedding":
            return (lambda p: (p.ints(v, t), p.take(v, h))), (lambda s: K.embedding(*s)), t * h * item
        if name == "norm":
            return (
                (lambda p: (p.take(t, h), p.take(t, h), p.take(h))),
                (lambda s: K.add_rms_norm(s[0], s[1], s[2], eps)),
                2 * t * h * item,
            )
        if name == "rope":
            return (
                (lambda p: (p.take(t, hq + hkv, d), p.rotation(t, d // 2))),
                (lambda s: K.rope(*s)),
                (t * (hq + hkv) * d * item),
            )
        return (lambda p: (p.take(t, 2 * i),)), (lambda s: K.silu_mul(*s)), 2 * t * i * item

    for name in TOKEN_KERNELS:
        series = []
        for t in sizes:
            if name == "lm_head" and t > MAX_SAMPLED:
                break
            make, run, nbytes = gemm(*gemms[name], t) if name in gemms else elementwise(name, t)
            op_class = "gemm" if name in gemms else "elementwise"
            shape = IterationShape.of(decode=[(t, 0)])
            series.append(Point(name, op_class, t, 0, 0, 0, t, shape, make, run, nbytes))
        yield series


def _attention_points(spec: ModelSpec, grid: Grid, item: int) -> Iterator[list[Point]]:
    """One series per prefill context (in chunk sizes) and per decode context (in batch sizes)."""
    torch = K.require_torch()
    hq, hkv, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    limit = spec.max_position_embeddings
    for ctx in grid.prefill_contexts:
        series = []
        for n in grid.prefill_chunks:
            if n + ctx > limit:
                continue

            def make_chunk(p: Pool, n: int = n, ctx: int = ctx) -> tuple[Any, ...]:
                caches = (p.take(1, hkv, ctx + n, d), p.take(1, hkv, ctx + n, d))
                return (p.take(n, hq, d), p.take(n, hkv, d), p.take(n, hkv, d), *caches)

            def run_chunk(s: tuple[Any, ...], ctx: int = ctx) -> object:
                return K.prefill_attention(s[0], s[1], s[2], s[3], s[4], 0, ctx)

            shape = IterationShape.of(prefill=[(n, ctx)])
            nbytes = (n * hq + 2 * (ctx + 2 * n) * hkv) * d * item
            series.append(
                Point("attention_prefill", "attention_prefill", n, 1, n, ctx, 1, shape, make_chunk, run_chunk, nbytes)
            )
        yield series
    for ctx in grid.decode_contexts:
        series = []
        for b in grid.decode_batches:
            if ctx + 1 > limit or b * (ctx + 1) > grid.max_kv_tokens:
                continue

            def make_step(p: Pool, b: int = b, ctx: int = ctx) -> tuple[Any, ...]:
                caches = (p.take(b, hkv, ctx + 1, d), p.take(b, hkv, ctx + 1, d))
                slots = torch.randperm(b, device=p.device, generator=p.gen)
                positions = torch.full((b,), ctx, dtype=torch.int64, device=p.device)
                return (p.take(b, hq, d), p.take(b, hkv, d), p.take(b, hkv, d), *caches, slots, positions)

            def run_step(s: tuple[Any, ...], ctx: int = ctx) -> object:
                return K.decode_attention(s[0], s[1], s[2], s[3], s[4], s[5], s[6], ctx)

            shape = IterationShape.of(decode=[(b, ctx)])
            nbytes = (b * hq + 2 * b * (ctx + 2) * hkv) * d * item
            series.append(
                Point("attention_decode", "attention_decode", b, b, 0, ctx, b, shape, make_step, run_step, nbytes)
            )
        yield series


def grid_series(spec: ModelSpec, grid: Grid, item: int, eps: float = 1e-5) -> list[list[Point]]:
    """The points ``grid`` times for ``spec`` (``item`` bytes per element), one list per series, in the order they
    are timed: each token-parallel kernel in token counts, then prefill attention per context, decode per context."""
    return list(_token_points(spec, eps, grid.tokens, item)) + list(_attention_points(spec, grid, item))


def measure_model(
    spec: ModelSpec,
    label: str,
    device: torch.device,
    dtype: str,
    grid: Grid,
    *,
    eps: float = 1e-5,
    seed: int = 0,
    log: Log | None = None,
) -> list[Row]:
    """Time every kernel of ``spec`` over ``grid`` on ``device`` in ``dtype``; one row per point (ROW_COLUMNS).

    The grid is timed in ``grid.passes`` passes, a share of each point's budget per pass, and a point's statistics
    pool the samples of all passes: a spell of interference (another process, a clock change) then spoils a share
    of each point's samples rather than all of the points measured during it."""
    log = log or (lambda _: None)
    timer = Timer(device)
    pool = Pool(device, K.torch_dtype(dtype), last_level_cache_bytes(device), seed, grid.pool_bytes)
    budget = memory_bytes(device) // 4
    work = WorkCounter(spec, dtype)
    device_name = describe(device)[0]
    series_all = grid_series(spec, grid, pool.item, eps)
    samples: dict[tuple[int, int], list[float]] = {}
    kept: dict[tuple[int, int], int] = {}  # point -> input sets it rotated over
    length = {s: len(series) for s, series in enumerate(series_all)}  # points of each series still measured
    per_pass = grid.budget_s / grid.passes
    min_per_pass = max(1, math.ceil(grid.min_repeats / grid.passes))
    for rnd in range(grid.passes):
        for s, series in enumerate(series_all):
            for j, point in enumerate(series[: length[s]]):
                if 4 * point.set_bytes > budget:
                    log(f"  skip {point.op} at {point.num_tokens}: its inputs exceed the memory budget")
                    length[s] = j
                    break
                sets = pool.sets(point.make, point.set_bytes)

                def call(i: int, sets: list[tuple[Any, ...]] = sets, run: Any = point.run) -> object:
                    return run(sets[i % len(sets)])

                got = timer(call, per_pass, min_per_pass)
                samples.setdefault((s, j), []).extend(got)
                kept[(s, j)] = len(sets)
                del sets
                if rnd == 0 and sorted(got)[len(got) // 2] > grid.max_call_s:
                    length[s] = j + 1  # the series stops growing here
                    log(f"  {point.op}: stop at {point.num_tokens} ({sorted(got)[len(got) // 2]:.2f} s per call)")
                    break
        log(f"  pass {rnd + 1}/{grid.passes}: {sum(length.values())} points")
    rows: list[Row] = []
    for s, series in enumerate(series_all):
        for j, point in enumerate(series[: length[s]]):
            got = sorted(samples[(s, j)])
            terms = work.terms(point.shape, {point.op: 1})
            rows.append(
                {
                    "device": device_name,
                    "dtype": dtype,
                    "model": label,
                    "layers": spec.num_hidden_layers,
                    "op": point.op,
                    "op_class": point.op_class,
                    "num_tokens": point.num_tokens,
                    "batch_size": point.batch_size,
                    "chunk": point.chunk,
                    "context": point.context,
                    "seqs": point.seqs,
                    "shape": "",
                    "flops": sum(t.flops for t in terms),
                    "bytes": sum(t.bytes for t in terms),
                    "median_s": got[len(got) // 2],
                    "min_s": got[0],
                    "max_s": got[-1],
                    "repeats": len(got),
                    "sets": kept[(s, j)],
                    "kernels": dump_terms(terms),
                }
            )
    return rows


def measure_device(device: torch.device, dtype: str, grid: Grid) -> list[Row]:
    """The device's copy bandwidth (a copy much larger than the last-level cache) and the fixed cost of an empty step
    (a one-element op and a synchronisation, timed on the host)."""
    torch = K.require_torch()
    name = describe(device)[0]
    cache = last_level_cache_bytes(device)
    elem = K.torch_dtype(dtype)
    item = int(torch.empty((), dtype=elem).element_size())
    nbytes = min(max(16 * cache, 256 << 20 if device.type == "cpu" else 2 << 30), memory_bytes(device) // 8)
    src = torch.randn(nbytes // item, device=device, dtype=elem)
    dst = torch.empty_like(src)
    timer = Timer(device)
    copies = sorted(timer(lambda _: dst.copy_(src), grid.budget_s, grid.min_repeats))
    base: Row = {"device": name, "dtype": dtype, "model": "", "layers": 0, "num_tokens": 0, "batch_size": 0}
    base |= {"chunk": 0, "context": 0, "seqs": 0, "shape": "", "sets": 1, "kernels": "[]", "flops": 0.0}
    rows = [
        base
        | {"op": "copy", "op_class": "bandwidth", "bytes": float(2 * src.numel() * item)}
        | {"median_s": copies[len(copies) // 2], "min_s": copies[0], "max_s": copies[-1], "repeats": len(copies)}
    ]
    one = torch.ones(1, device=device, dtype=elem)
    empty = []
    for _ in range(200):
        t0 = time.perf_counter()
        one.add_(1.0)
        K.synchronize(device)
        empty.append(time.perf_counter() - t0)
    empty.sort()
    rows.append(
        base
        | {"op": "empty", "op_class": "launch", "bytes": 0.0}
        | {"median_s": empty[len(empty) // 2], "min_s": empty[0], "max_s": empty[-1], "repeats": len(empty)}
    )
    return rows


# ---- tensor parallelism ---------------------------------------------------------------------------------------------


def measure_all_reduce(dtype: str, sizes: tuple[int, ...], log: Log | None = None) -> list[Row]:
    """All-reduce times over the visible GPUs, in groups of 2, 4, 8 ... (NCCL through ``torch.distributed``, one
    process per GPU); [] when fewer than two GPUs are visible. Untested here: written for several GPUs, run on one."""
    torch = K.require_torch()
    log = log or (lambda _: None)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        return []
    import json
    import tempfile

    rows: list[Row] = []
    name = describe(torch.device("cuda", 0))[0]
    world = 2
    while world <= count:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "all_reduce.json"
            torch.multiprocessing.spawn(
                _all_reduce_worker, args=(world, dtype, sizes, str(out), tmp), nprocs=world, join=True
            )
            for r in json.loads(out.read_text()):
                rows.append(
                    {"device": f"{world} x {name}", "dtype": dtype, "model": "", "layers": 0, "op": "all_reduce"}
                    | {"op_class": "communication", "num_tokens": 0, "batch_size": 0, "chunk": 0, "context": 0}
                    | {"seqs": world, "shape": "", "flops": 0.0, "bytes": float(r["bytes"]), "sets": 1}
                    | {"median_s": r["median_s"], "min_s": r["min_s"], "max_s": r["max_s"], "repeats": r["repeats"]}
                    | {"kernels": "[]"}
                )
        log(f"  all_reduce over {world} GPUs: {len(sizes)} sizes")
        world *= 2
    return rows


def _all_reduce_worker(rank: int, world: int, dtype: str, sizes: tuple[int, ...], out: str, tmp: str) -> None:
    """One rank: time all_reduce of each message size with CUDA events (rank 0 writes the medians)."""
    import json

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world)
    results = []
    elem = K.torch_dtype(dtype)
    for nbytes in sizes:
        item = int(torch.empty((), dtype=elem).element_size())
        x = torch.randn(max(1, nbytes // item), device="cuda", dtype=elem)
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dist.barrier()
            begin.record()
            dist.all_reduce(x)
            end.record()
            torch.cuda.synchronize()
            times.append(begin.elapsed_time(end) * 1e-3)
        times.sort()
        message = x.numel() * x.element_size()
        results.append({"bytes": message, "median_s": times[10], "min_s": times[0], "max_s": times[-1], "repeats": 20})
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()
