"""Iteration time from a roofline of the real operators: what a batch costs on the hardware.

One iteration (``IterationShape``) runs every kernel of the forward pass once per layer. Each kernel instance takes

    max(floor, FLOPs / (peak FLOP/s x eff_compute(FLOPs)), bytes / (peak B/s x eff_memory(bytes)))

with the efficiency curves and the per-kernel floor of its operator class from the hardware profile
(``costmodel.hardware``). A profile fitted to NVIDIA's measured kernel database multiplies that by the measured
tables' factor at the kernel's shape (``costmodel.kernel_tables``), where the package is installed. The iteration adds
the tensor-parallel all-reduces and the host overheads:

    time = sum over kernels (instances x kernel time) + all-reduces + per_iteration + per_sequence x sequences
           + per_layer x layers

Everything is per GPU: with tensor parallelism ``tp`` each GPU holds 1/tp of the heads, the MLP width and the
vocabulary, and the kernels shrink accordingly (Megatron-style, as vLLM shards). The FLOP and byte counts of each
kernel, and what each term counts, are in ``costmodel.formulas`` (compiled, shared with the simulator's fast engine).

Prefill is compute-bound: its GEMMs reuse each weight for every token (intensity ~T FLOP/byte). Decode is
memory-bound: every step streams all weights and each sequence's whole KV cache for one token each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel import drafting, kernel_tables
from costmodel import formulas as f
from costmodel.dtypes import PEAK_KEY
from costmodel.formulas import KERNELS
from costmodel.hardware import HardwareProfile
from costmodel.layout import Layout, Parallelism
from costmodel.memory import MemoryPlan, plan_memory
from costmodel.model_spec import ModelSpec
from costmodel.shape import IterationShape

OPS: tuple[str, ...] = tuple(dict.fromkeys(op for _, op, _, _, _ in KERNELS))

# host-side activation reserve beyond the activations themselves: CUDA context, cuBLAS/NCCL workspaces, CUDA-graph pools
# (bytes); an assumption, ~what vLLM's profiling run finds outside the model's tensors
RUNTIME_RESERVE_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class KernelCost:
    """One kernel of an iteration, per GPU."""

    name: str  # kernel, e.g. "mlp_gate_up"
    op: str  # the operator it is reported under, e.g. "mlp"
    op_class: str  # its efficiency class in the hardware profile
    count: int  # instances per iteration (layers x per layer, or 1)
    flops: float  # FLOPs of one instance
    bytes: float  # DRAM bytes of one instance
    compute_s: float  # one instance's time if compute-limited (s), fixed cost included
    memory_s: float  # one instance's time if memory-limited (s), fixed cost included
    # which side of the roofline it is on: "compute" when its intensity (FLOPs / bytes) reaches the effective ridge
    # point (peak FLOP/s x max / (bandwidth x max)), else "memory"; judged without the fixed costs, which can make a
    # tiny kernel's time a toss-up between the two
    bound: str
    floor_s: float = 0.0  # the least time one instance of its class takes (s)
    factor: float = 1.0  # the measured table's time over the roofline's at this shape (1: no table)

    @property
    def time_s(self) -> float:
        """One instance's time: the roofline maximum, at least the floor, times the measured table's factor (s); 0 for
        a kernel with no work."""
        t = max(self.compute_s, self.memory_s)
        return max(t, self.floor_s) * self.factor if t > 0.0 else 0.0


@dataclass(frozen=True, slots=True)
class OpCost:
    """One operator over the whole iteration (all layers), per GPU."""

    name: str  # qkv_proj, o_proj, mlp, attention_prefill, ...
    flops: float  # FLOPs, all layers
    bytes: float  # DRAM bytes, all layers
    time_s: float  # seconds, all layers
    bound: str  # "compute" or "memory": what limits most of its time

    def to_dict(self) -> dict[str, float | str]:
        return {"name": self.name, "time_s": self.time_s, "flops": self.flops, "bytes": self.bytes, "bound": self.bound}


@dataclass(frozen=True, slots=True)
class IterationBreakdown:
    """Where one iteration's time goes: ``time_s = sum(op.time_s) + communication_s + overhead_s``."""

    time_s: float  # predicted iteration time (s), == CostModel.iteration_time(shape)
    ops: tuple[OpCost, ...]  # GPU operators that did work, in execution order
    communication_s: float  # tensor-parallel all-reduces, data-parallel MoE collectives, pipeline sends (s)
    communication_bytes: float  # bytes all-reduced per GPU (message sizes summed)
    all_reduces: int  # all-reduce calls
    overhead_s: float  # host overheads (s)
    num_tokens: int  # tokens through the linear layers
    num_seqs: int  # sequences (prefill chunks + decodes)
    num_sampled: int  # sequences that sample a token
    data_parallel_s: float = 0.0  # MoE layers' all-gathers and reduce-scatters over data-parallel ranks (s)
    pipeline_s: float = 0.0  # sends between pipeline stages (s)
    drafting_s: float = 0.0  # speculative decoding's drafter after the target's pass (s, ``costmodel.drafting``)

    @property
    def gpu_time_s(self) -> float:
        """Time in GPU operators (s): the part the roofline explains."""
        return sum(op.time_s for op in self.ops)

    @property
    def flops(self) -> float:
        return sum(op.flops for op in self.ops)

    @property
    def bytes(self) -> float:
        return sum(op.bytes for op in self.ops)

    @property
    def bound(self) -> str:
        """Compute-bound operators take most of the GPU time ("compute") or not ("memory")."""
        compute = sum(op.time_s for op in self.ops if op.bound == "compute")
        return "compute" if compute > self.gpu_time_s - compute else "memory"

    def op(self, name: str) -> OpCost:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"no op {name!r} in this iteration (ops: {', '.join(o.name for o in self.ops)})")

    def to_dict(self) -> dict[str, Any]:
        """The ``ferry iteration --json`` object: ``time_s``, ``ops`` (the stable contract) and the other terms."""
        return {
            "time_s": self.time_s,
            "ops": [op.to_dict() for op in self.ops],
            "communication": {
                "time_s": self.communication_s,
                "bytes": self.communication_bytes,
                "calls": self.all_reduces,
            },
            "overhead": {"time_s": self.overhead_s},
            "gpu_time_s": self.gpu_time_s,
            "bound": self.bound,
            "num_tokens": self.num_tokens,
            "num_seqs": self.num_seqs,
            "num_sampled": self.num_sampled,
            "drafting": {"time_s": self.drafting_s},
        }


class CostModel:
    """Iteration times of one model on one device type, split over GPUs as ``parallel`` says (default: ``tp``-way
    tensor parallelism), for one data-parallel rank (one engine; ``costmodel.layout``)."""

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareProfile,
        tp: int = 1,
        dtype: str | None = None,
        kv_cache_dtype: str | None = None,
        quantization: str | None = None,
        *,
        tables: bool = True,
        parallel: Parallelism | None = None,
    ) -> None:
        """``tables=False``: time kernels by the profile's curves even where it names measured kernel tables;
        ``parallel``: the whole layout (pipeline, data and expert parallelism), whose ``tp`` replaces ``tp``."""
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        if parallel is not None and tp not in (1, parallel.tp):
            raise ValueError(f"tp={tp} and parallel.tp={parallel.tp}: give one")
        par = parallel or Parallelism(tp=tp)
        domain = hardware.interconnect.domain_gpus
        if par.tp > domain:
            raise ValueError(
                f"tensor_parallel_size={par.tp} spans more than the {domain} GPUs {hardware.name}'s "
                f"{hardware.interconnect.name} joins: its all-reduce would cross the network between servers, which "
                "ferry does not price; split across servers with --pipeline-parallel-size instead"
            )
        self.model, self.hardware, self.parallel, self.tp = model, hardware, par, par.tp
        self.dtypes = model.dtypes(dtype, kv_cache_dtype, quantization)
        self.layout = layout = Layout(model, par, self.dtypes)
        peaks = hardware.peaks()
        self.gemm_formats = layout.gemm_formats(peaks)
        # the format most of the linear layers multiply in (what ``ferry roofline`` draws against)
        self.gemm_dtype = self.gemm_formats["moe_experts" if model.is_moe else "qkv_proj"]
        act_key = PEAK_KEY[self.dtypes.activation]
        self._L = model.num_hidden_layers

        # (instances, compute rate FLOP/s, compute half-size FLOPs, memory rate B/s, memory half-size B, floor s)
        # per kernel
        eff = hardware.efficiency
        bw = hardware.bandwidth
        counts = layout.kernel_counts()
        params = []
        for name, _, op_class, _, _ in KERNELS:
            ce = eff.of(op_class)
            if op_class == "gemm":  # each GEMM at its weights' rate; the LM head, router and MLA's bmm unquantized
                peak = peaks[PEAK_KEY[self.gemm_formats[name]]]
            elif op_class == "elementwise":
                peak = peaks["fp32"]  # CUDA cores, not tensor cores
            else:
                peak = peaks[act_key]
            params.append((counts[name], peak * ce.compute.max, ce.compute.half_size, bw * ce.memory.max,
                           ce.memory.half_size, ce.floor))  # fmt: skip
        self._params = tuple(params)
        self._kernel_params = np.array(params, dtype=np.float64)  # rows: formulas.COUNT .. formulas.M_HALF

        comm = eff.communication
        ov = hardware.overheads
        consts = np.zeros(f.NUM_CONSTS)
        for index, value in layout.consts().items():
            consts[index] = value
        consts[f.AR_RATE] = hardware.link_bandwidth * comm.bandwidth.max
        consts[f.AR_HALF] = comm.bandwidth.half_size
        consts[f.AR_LATENCY] = comm.latency_s.value
        consts[f.PER_ITERATION] = ov.per_iteration_s.value + ov.per_layer_s.value * self._L
        consts[f.PER_SEQUENCE] = ov.per_sequence_s.value
        consts[f.PER_PREFILL] = ov.per_prefill_s.value if ov.per_prefill_s is not None else 0.0
        self._consts = consts
        self.tables = kernel_tables.Tables()
        # where the kernels' seconds come from, in words (``timing``), and why not the tables when they are named
        self.timing = "the profile's roofline curves"
        ref = hardware.kernel_tables
        if ref is not None and tables:
            try:
                self.tables = kernel_tables.build(
                    ref,
                    model,
                    par.tp,
                    self.dtypes,
                    self.gemm_dtype,
                    consts,
                    self._kernel_params,
                    part_formats=layout.formats,
                    compute_formats=self.gemm_formats,
                )
                self.timing = f"measured kernel tables ({ref.describe()}), interpolated"
            except ValueError as exc:  # the package is absent (or another version): the curves fitted to it
                self.timing = f"the curves fitted to {ref.describe()} ({exc})"
        self._args = (consts, self._kernel_params, self.tables.toc, self.tables.tab, f.new_memo())
        self.drafter: drafting.Drafter | None = None  # speculative decoding's (``speculate``)
        self.draft_cost: CostModel | None = None
        self._dargs: Any = None

    def speculate(self, drafter: drafting.Drafter) -> None:
        """Time each iteration with ``drafter``'s work after it, and hold its weights and KV cache in the memory plan
        (``costmodel.drafting.attach``)."""
        self.drafter = drafter
        self.draft_cost, self._dargs = drafting.attach(self, drafter)

    # ----------------------------------------------------------------------------------------------------------------
    # public (the formulas themselves are in costmodel.formulas, shared with the simulator's compiled engine)

    def iteration_time(self, shape: IterationShape) -> float:
        """Predicted wall time of one iteration (s), a drafter's work included; 0 for an empty shape."""
        fn, args = self.compiled()
        return float(fn(args, shape.prefill_new, shape.prefill_ctx, shape.decode_ctx, shape.prefill_sampled,
                        shape.verify_new, shape.verify_ctx))  # fmt: skip

    def compiled(self) -> tuple[Any, Any]:
        """``(fn, args)`` for compiled callers: ``fn(args, prefill_new, prefill_ctx, decode_ctx, prefill_sampled,
        verify_new, verify_ctx)`` is ``iteration_time`` as a numba function (with a drafter, ``drafting``'s)."""
        if self._dargs is not None:
            return drafting.iteration_time, (self._args, self._dargs)
        return f.iteration_time, self._args

    def _sums(self, shape: IterationShape) -> f.Sums:
        return f.shape_sums(self._consts, shape.prefill_new, shape.prefill_ctx, shape.decode_ctx, shape.prefill_sampled,
                            shape.verify_new, shape.verify_ctx)  # fmt: skip

    def kernels(self, shape: IterationShape) -> list[KernelCost]:
        """Every kernel of the iteration with its per-instance FLOPs, bytes and times (no overheads)."""
        sums = self._sums(shape)
        T, P, D, S, pairs, _, dec_kv, seqs, w_pairs, _, w_dec_kv = sums[:11]
        work = f.kernel_work(self._consts, *sums[:7], *sums[8:16])
        toc, tab = self.tables.toc, self.tables.tab
        out = []
        for i, ((name, op, op_class, _, _), row) in enumerate(zip(KERNELS, self._kernel_params, strict=True)):
            flops, nbytes = float(work[2 * i]), float(work[2 * i + 1])
            tc, tm = f.kernel_time(flops, nbytes, row)
            bound = "compute" if flops * row[f.M_RATE] >= nbytes * row[f.C_RATE] else "memory"
            table = int(f.KERNEL_TABLE[i])
            factor, roof = 1.0, max(tc, tm, row[f.FLOOR]) if max(tc, tm) > 0.0 else 0.0
            read = sums[f.SUM_W_V_KV] if i == f.VERIFY_KERNELS[1] else sums[f.SUM_V_KV]
            if i in f.VERIFY_KERNELS and roof > 0.0 and read > 0.0:
                factor = f.table_factor(toc, tab, f.T_DECODE, np.log(sums[f.SUM_V_SEQS]), np.log(read))
            elif table >= 0 and roof > 0.0 and toc[table, f.NX] > 0:
                windowed = i in f.WINDOW_KERNELS
                at = (w_pairs, w_dec_kv) if windowed else (pairs, dec_kv)
                moe_tokens = self._consts[f.MOE_TOKENS]
                prefills = seqs - D - sums[f.SUM_V_SEQS]
                factor = f.kernel_table_time(toc, tab, table, roof, T, D, S, prefills, *at, moe_tokens) / roof
            out.append(
                KernelCost(name, op, op_class, int(row[f.COUNT]), flops, nbytes, tc, tm, bound, row[f.FLOOR], factor)
            )
        return out

    def explain(self, shape: IterationShape) -> IterationBreakdown:
        """The iteration time split by operator (all layers), with the communication and overhead terms."""
        sums = self._sums(shape)
        T = sums[0]
        ops: dict[str, list[float]] = {}  # op -> [flops, bytes, time, compute-bound time]
        if T > 0.0:
            for k in self.kernels(shape):
                acc = ops.setdefault(k.op, [0.0, 0.0, 0.0, 0.0])
                acc[0] += k.count * k.flops
                acc[1] += k.count * k.bytes
                acc[2] += k.count * k.time_s
                acc[3] += k.count * k.time_s if k.bound == "compute" else 0.0
        op_costs = tuple(
            OpCost(name, fl, b, t, "compute" if tc > t - tc else "memory")
            for name, (fl, b, t, tc) in ops.items()
            if fl > 0.0 or b > 0.0
        )
        comm_s, message = f.allreduce(self._consts, self.tables.toc, self.tables.tab, T)
        calls = int(self._consts[f.N_ALLREDUCE]) if comm_s > 0.0 else 0
        dp_s, p2p_s = f.collectives(self._consts, T)
        overhead = f.host_time(self._consts, sums) if T > 0.0 else 0.0
        drafting_s = 0.0
        if self._dargs is not None and T > 0.0:
            drafting_s = drafting.drafting_time(self._dargs, shape.prefill_new, shape.prefill_ctx, shape.decode_ctx,
                                                shape.verify_new, shape.verify_ctx)  # fmt: skip
        target = f.time_of_sums(self._consts, self._kernel_params, self.tables.toc, self.tables.tab, sums, f.NO_MEMO)
        return IterationBreakdown(
            time_s=target + drafting_s,
            ops=op_costs,
            communication_s=comm_s + dp_s + p2p_s,
            communication_bytes=calls * message,
            all_reduces=calls,
            overhead_s=float(overhead),
            num_tokens=int(T),
            num_seqs=int(sums[7]),
            num_sampled=int(sums[3]),
            data_parallel_s=dp_s,
            pipeline_s=p2p_s,
            drafting_s=drafting_s,
        )

    @property
    def ridge_point(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the linear layers turn compute-bound at peak rates."""
        return self.hardware.peak_flops(self.gemm_dtype) / self.hardware.bandwidth

    def weight_bytes_per_gpu(self) -> float:
        """Weights one GPU holds (B): its shares of the sharded matrices and its whole replicated ones, on the
        pipeline stage that holds the most (``costmodel.layout``)."""
        return max(self.layout.stage_weight_bytes(s) for s in range(self.parallel.pp))

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies on one GPU (the stage with the most charged layers): layers x (MLA: the
        latent and rotary key; else 2 x this GPU's KV heads x head_dim) x bytes."""
        return max(self.layout.stage_kv_bytes_per_token(s) for s in range(self.parallel.pp))

    def activation_reserve_bytes(self, max_num_batched_tokens: int, max_num_seqs: int) -> float:
        """Peak activations of one forward pass, as vLLM's profiling run finds them, estimated (B): over
        max_num_batched_tokens, all live at once (a generous estimate), the residual stream and hidden state (2H),
        the q/k/v projection's output (MLA: its down-projections'), the MLP's gate/up and activation outputs (MoE:
        the rows routed to this GPU's experts, a rank's batch at a time, and the shared expert's), plus fp32 logits for
        max_num_seqs sampled sequences over the whole vocabulary and the runtime's own reserve."""
        c, lay = self._consts, self.layout
        up = 2.0 if self.model.gated_mlp else 1.0
        mlp = (up + 1.0) * lay.mlp if len(self.model.moe_layer_ids) < self._L else 0.0
        if self.model.is_moe:  # the gathered tokens of data-parallel ranks are processed a rank's batch at a time
            # (vLLM's ChunkingMoERunner, ``vllm/model_executor/layers/fused_moe/runner/``)
            rows = c[f.K] * c[f.E_LOCAL] / c[f.E]
            mlp = max(mlp, rows * (up + 1.0) * lay.moe_i + (up + 1.0) * lay.shared_i + c[f.H])
        per_token = (2.0 * c[f.H] + lay.qkv_n + mlp) * self.dtypes.activation_bytes
        return max_num_batched_tokens * per_token + max_num_seqs * self.model.vocab_size * 4 + RUNTIME_RESERVE_BYTES

    def memory_plan(
        self,
        gpu_memory_utilization: float = 0.9,
        block_size: int = 16,
        *,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int = 256,
    ) -> MemoryPlan:
        """The KV-cache capacity of one rank, as vLLM computes it (see ``costmodel.memory``): every GPU of a pipeline
        has the blocks of the stage that fits fewest (vLLM takes the least of its workers' counts)."""
        reserve = self.activation_reserve_bytes(max_num_batched_tokens, max_num_seqs)
        plans = []
        draft_weights, draft_kv = drafting.drafter_bytes(self)
        for stage in range(self.parallel.pp):
            last = stage == self.parallel.pp - 1  # vLLM runs the drafter on the last stage
            plans.append(
                plan_memory(
                    model=self.model.name,
                    hardware=self.hardware.name,
                    tp=self.tp,
                    gpu_memory_bytes=self.hardware.memory_bytes,
                    gpu_memory_utilization=gpu_memory_utilization,
                    weight_bytes_per_gpu=int(self.layout.stage_weight_bytes(stage) + (draft_weights if last else 0)),
                    activation_reserve_bytes=int(reserve),
                    kv_bytes_per_token=self.layout.stage_kv_bytes_per_token(stage) + (draft_kv if last else 0),
                    block_size=block_size,
                    reserve_for=f"max_num_batched_tokens={max_num_batched_tokens:,} and max_num_seqs={max_num_seqs:,}",
                    layout=self.parallel.describe(),
                    stage=stage,
                    pp=self.parallel.pp,
                )
            )
        return min(plans, key=lambda p: p.num_gpu_blocks)

    def describe(self) -> str:
        """One line: model, device, parallelism and formats."""
        gemm = "" if self.gemm_dtype == self.dtypes.activation else f", GEMMs in {self.gemm_dtype}"
        kept = [p.replace("_", " ") for p in self.model.unquantized] if self.dtypes.quantization else []
        gemm += f" ({', '.join(kept)} kept in {self.dtypes.activation})" if kept else ""
        return f"{self.model.name} on {self.hardware.name}, {self.parallel.describe()}: {self.dtypes.describe()}{gemm}"
