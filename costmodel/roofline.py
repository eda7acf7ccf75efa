"""Iteration time from a roofline of the real operators: what a batch costs on the hardware.

One iteration (``IterationShape``) runs every kernel of the forward pass once per layer. Each kernel instance takes

    max(FLOPs / (peak FLOP/s x eff_compute(FLOPs)), bytes / (peak B/s x eff_memory(bytes)))

with the efficiency curves of its operator class from the hardware profile (``costmodel.hardware``). The iteration adds
the tensor-parallel all-reduces and the host overheads:

    time = sum over kernels (instances x kernel time) + all-reduces + per_iteration + per_sequence x sequences
           + per_layer x layers

Everything is per GPU: with tensor parallelism ``tp`` each GPU holds 1/tp of the heads, the MLP width and the
vocabulary, and the kernels shrink accordingly (Megatron-style, as vLLM shards). Counts below use, per GPU:
``T`` tokens through the linear layers (prefill chunks' new tokens + one per decode), ``H`` hidden size, ``q`` and
``kv`` the query and key (= value) widths (heads x head_dim on this GPU), ``I`` the MLP width on this GPU, ``V`` the
vocabulary slice, ``a``/``w``/``c`` bytes per activation/weight/KV element. FLOPs count a multiply-add as 2; bytes are
the kernel's ideal DRAM traffic: weights read once, inputs read once, outputs written once (caches ignored).

Prefill is compute-bound: its GEMMs reuse each weight for every token (intensity ~T FLOP/byte). Decode is
memory-bound: every step streams all weights and each sequence's whole KV cache for one token each.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from costmodel.dtypes import PEAK_KEY, Dtypes
from costmodel.hardware import HardwareProfile
from costmodel.memory import MemoryPlan, plan_memory
from costmodel.model_spec import ModelSpec
from costmodel.shape import IterationShape

# The kernels of one forward pass, in execution order: (kernel, the op it is reported under, operator class,
# instances per layer, instances once per iteration). The order is the order of ``CostModel._work``'s pairs.
KERNELS: tuple[tuple[str, str, str, int, int], ...] = (
    ("embedding", "embedding", "elementwise", 0, 1),
    ("norm", "norms", "elementwise", 2, 0),  # before attention and before the MLP, residual add fused in
    ("qkv_proj", "qkv_proj", "gemm", 1, 0),
    ("rope", "rope", "elementwise", 1, 0),
    ("attention_prefill", "attention_prefill", "attention_prefill", 1, 0),
    ("attention_decode", "attention_decode", "attention_decode", 1, 0),
    ("o_proj", "o_proj", "gemm", 1, 0),
    ("mlp_gate_up", "mlp", "gemm", 1, 0),  # with the MoE router folded in
    ("mlp_act", "mlp", "elementwise", 1, 0),
    ("mlp_down", "mlp", "gemm", 1, 0),
    ("final_norm", "norms", "elementwise", 0, 1),
    ("lm_head", "lm_head", "gemm", 0, 1),  # on the sampled tokens only
)
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

    @property
    def time_s(self) -> float:
        """One instance's time: the roofline maximum (s)."""
        return max(self.compute_s, self.memory_s)


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
    communication_s: float  # tensor-parallel all-reduces (s); 0 at tp=1
    communication_bytes: float  # bytes all-reduced per GPU (message sizes summed)
    all_reduces: int  # all-reduce calls
    overhead_s: float  # host overheads (s)
    num_tokens: int  # tokens through the linear layers
    num_seqs: int  # sequences (prefill chunks + decodes)
    num_sampled: int  # sequences that sample a token

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
        }


def _prefill_sums(new: np.ndarray, ctx: np.ndarray) -> tuple[int, int, int, int]:
    """Exact integer sums over the prefill chunks: sum n, sum c, sum n c, sum n^2. A handful of chunks (the usual case)
    is cheaper through C-level list reductions than through four numpy calls (~2 us each); many chunks go to numpy."""
    if new.shape[0] <= _FEW_CHUNKS:
        nl, cl = new.tolist(), ctx.tolist()
        return sum(nl), sum(cl), sum(map(operator.mul, nl, cl)), sum(map(operator.mul, nl, nl))
    return int(new.sum()), int(ctx.sum()), int(np.dot(new, ctx)), int(np.dot(new, new))


_FEW_CHUNKS = 32


class CostModel:
    """Iteration times of one model on one device type with ``tp``-way tensor parallelism (one replica)."""

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareProfile,
        tp: int = 1,
        dtype: str | None = None,
        kv_cache_dtype: str | None = None,
        quantization: str | None = None,
    ) -> None:
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        if model.num_attention_heads % tp:
            raise ValueError(f"tp={tp} does not divide {model.name}'s num_attention_heads={model.num_attention_heads}")
        nkv = model.num_key_value_heads
        if nkv % tp and tp % nkv:
            raise ValueError(f"tp={tp} and {model.name}'s num_key_value_heads={nkv}: neither divides the other")
        self.model, self.hardware, self.tp = model, hardware, tp
        self.dtypes = Dtypes.resolve(model.torch_dtype, dtype, kv_cache_dtype, quantization)
        peaks = hardware.peaks()
        self.gemm_dtype = self.dtypes.gemm_compute(peaks)
        act_key = PEAK_KEY[self.dtypes.activation]

        # per-GPU shapes (elements) and element sizes (bytes)
        self._H = float(model.hidden_size)
        self._L = model.num_hidden_layers
        self._q = float(model.q_size // tp)  # query width on this GPU
        self._kv = float(max(nkv // tp, 1) * model.head_dim)  # key (= value) width; KV heads replicate when tp > n_kv
        self._I = model.intermediate_size / tp  # MLP width on this GPU
        self._V = float(math.ceil(model.vocab_size / tp))  # vocabulary slice (vLLM's vocab-parallel LM head)
        self._E = model.num_local_experts
        self._k = model.num_experts_per_tok
        self._moe = model.is_moe
        self._gated = model.gated_mlp
        self._bias = model.attention_bias
        self._window = model.sliding_window
        self._a = self.dtypes.activation_bytes
        self._w = self.dtypes.weight_bytes
        self._c = self.dtypes.kv_bytes

        # (instances, compute rate FLOP/s, compute half-size FLOPs, memory rate B/s, memory half-size B) per kernel
        eff = hardware.efficiency
        bw = hardware.bandwidth
        peak_of_class = {
            "gemm": peaks[PEAK_KEY[self.gemm_dtype]],
            "attention_prefill": peaks[act_key],
            "attention_decode": peaks[act_key],
            "elementwise": peaks["fp32"],  # CUDA cores, not tensor cores
        }
        params = []
        for name, _, op_class, per_layer, once in KERNELS:
            ce = eff.of(op_class)
            # the LM head stays unquantized: it multiplies in the activation format whatever the other GEMMs do
            peak = peaks[act_key] if name == "lm_head" else peak_of_class[op_class]
            params.append(
                (
                    per_layer * self._L + once,
                    peak * ce.compute.max,
                    ce.compute.half_size,
                    bw * ce.memory.max,
                    ce.memory.half_size,
                )
            )
        self._params = tuple(params)

        comm = eff.communication
        # all-reduces: after attention and after the MLP in each layer, and after the (vocab-parallel) embedding
        self._n_allreduce = 2 * self._L + 1 if tp > 1 else 0
        self._ring = 2.0 * (tp - 1) / tp  # ring all-reduce: each GPU sends and receives 2(n-1)/n of the message
        self._ar_rate = hardware.link_bandwidth * comm.bandwidth.max
        self._ar_half = comm.bandwidth.half_size
        self._ar_latency = comm.latency_s.value
        ov = hardware.overheads
        self._per_iteration = ov.per_iteration_s.value + ov.per_layer_s.value * self._L
        self._per_sequence = ov.per_sequence_s.value

    # ----------------------------------------------------------------------------------------------------------------
    # the formulas (one set, used by iteration_time and explain alike)

    def _sums(self, shape: IterationShape) -> tuple[float, float, float, float, float, float, float, int]:
        """Reduce a shape to the sums the formulas need (numpy over the batch, no per-sequence loop):
        T tokens, P prefill tokens, D decodes, S sampled, prefill (query, key) pairs, KV tokens read by prefill and by
        decode attention, and the number of sequences."""
        new, dctx = shape.prefill_new, shape.decode_ctx
        n_pf, n_dec = new.shape[0], dctx.shape[0]
        window = self._window
        if n_pf:
            ctx = shape.prefill_ctx
            if window is None:
                s_n, s_c, s_nc, s_nn = _prefill_sums(new, ctx)
                prefill = float(s_n)
                # chunk (n new on c cached): query i in 0..n-1 sees c + i + 1 keys (causal), sum = n c + n (n+1) / 2
                pairs = float(s_nc) + 0.5 * float(s_nn + s_n)
                pf_kv = float(s_c + s_n)  # K/V of every cached and new token, read once
            else:
                prefill = float(new.sum())
                # each query sees at most `window` keys: the first m = clip(window - c, 0, n) queries see c+1 .. c+m,
                # the rest see exactly `window`
                m = np.clip(window - ctx, 0, new)
                pairs = 0.5 * float(np.dot(m, 2 * ctx + m + 1)) + float(window * (new - m).sum())
                pf_kv = float(np.minimum(ctx, window).sum()) + prefill
        else:
            prefill = pairs = pf_kv = 0.0
        if n_dec:
            # a decode attends its c cached tokens plus itself
            dec_kv = float(dctx.sum()) + n_dec if window is None else float(np.minimum(dctx + 1, window).sum())
        else:
            dec_kv = 0.0
        decodes = float(n_dec)
        sampled = float(shape.prefill_sampled + n_dec)
        return prefill + decodes, prefill, decodes, sampled, pairs, pf_kv, dec_kv, n_pf + n_dec

    def _work(
        self, T: float, P: float, D: float, S: float, pf_pairs: float, pf_kv: float, dec_kv: float
    ) -> tuple[float, ...]:
        """(FLOPs, bytes) of one instance of each kernel in KERNELS order, flattened; per GPU."""
        H, q, kv, I, V = self._H, self._q, self._kv, self._I, self._V  # noqa: E741
        a, w, c = self._a, self._w, self._c
        qkv = q + 2.0 * kv
        if self._moe:
            E, k = self._E, self._k
            R = T * k  # token-rows through the experts
            # expected distinct experts hit by T tokens routed uniformly: the expert weights read
            X = E * (1.0 - (1.0 - k / E) ** T)
            router_flops = 2.0 * T * H * E  # router GEMM T x H x E
            router_bytes = (H * E + T * (H + E)) * a
        else:
            R, X, router_flops, router_bytes = T, 1.0, 0.0, 0.0
        up = 2.0 * I if self._gated else I  # gate and up side by side, or up alone
        act_flops = 5.0 if self._gated else 8.0  # per output element: SiLU (~4) x up, or GELU (tanh form, ~8); nominal
        act_io = 3.0 if self._gated else 2.0  # elements moved per output element: read gate, up; write out
        norm_flops = 4.0 * T * H  # residual add, square-accumulate, scale, weight multiply
        norm_bytes = 4.0 * T * H * a + H * a  # read input and residual, write both; weight vector
        return (
            # embedding: gather T rows of the table, write the hidden states
            0.0,
            2.0 * T * H * a,
            # norm (fused add + RMSNorm)
            norm_flops,
            norm_bytes,
            # qkv_proj: [T x H] @ [H x (q + 2 kv)] (+ bias); weights once, input once, output once
            2.0 * T * H * qkv,
            H * qkv * w + (qkv * a if self._bias else 0.0) + T * (H + qkv) * a,
            # rope: rotate q and k in place (~3 FLOPs per element), read and write them
            3.0 * T * (q + kv),
            2.0 * T * (q + kv) * a,
            # attention_prefill: QK^T and PV, 2 x 2 x d FLOPs per (query head, key) pair summed over heads = 4 q pairs;
            # read Q and write O, write the chunk's K and V to the cache, read every K and V it attends to once
            4.0 * q * pf_pairs,
            2.0 * P * q * a + 2.0 * kv * c * (P + pf_kv),
            # attention_decode: the same per pair; one query per sequence reads that sequence's whole KV cache
            4.0 * q * dec_kv,
            2.0 * D * q * a + 2.0 * kv * c * (D + dec_kv),
            # o_proj: [T x q] @ [q x H]
            2.0 * T * q * H,
            q * H * w + T * (q + H) * a,
            # mlp_gate_up: [R x H] @ [H x up] for each expert hit (+ router); weights of the X experts hit read once
            2.0 * R * H * up + router_flops,
            X * H * up * w + R * (H + up) * a + router_bytes,
            # mlp_act: SiLU(gate) * up (or GELU(up)) over R x I outputs
            act_flops * R * I,
            act_io * R * I * a,
            # mlp_down: [R x I] @ [I x H]
            2.0 * R * I * H,
            X * I * H * w + R * (I + H) * a,
            # final_norm: once, over all T tokens
            norm_flops,
            norm_bytes,
            # lm_head: only the S sampling sequences' last hidden states, [S x H] @ [H x V/tp], unquantized
            2.0 * S * H * V,
            H * V * a + S * (H + V) * a,
        )

    def _kernel_times(self, work: tuple[float, ...]) -> list[tuple[float, float]]:
        """(compute-limited, memory-limited) seconds of one instance of each kernel: size / (peak x eff(size)), which
        with eff(n) = max n / (n + half) is (size + half) / (peak x max); an empty kernel costs nothing."""
        out = []
        for i, (_, crate, chalf, mrate, mhalf) in enumerate(self._params):
            f, b = work[2 * i], work[2 * i + 1]
            out.append(((f + chalf) / crate if f > 0.0 else 0.0, (b + mhalf) / mrate if b > 0.0 else 0.0))
        return out

    def _communication(self, T: float) -> tuple[float, float]:
        """(seconds, bytes per call) of the iteration's all-reduces: each carries the [T x H] activations;
        a ring all-reduce takes latency + 2 (tp-1)/tp x (bytes + half) / (link bandwidth x max)."""
        if not self._n_allreduce or T <= 0.0:
            return 0.0, 0.0
        message = T * self._H * self._a
        per_call = self._ar_latency + self._ring * (message + self._ar_half) / self._ar_rate
        return self._n_allreduce * per_call, message

    def _total(self, sums: tuple[float, float, float, float, float, float, float, int]) -> float:
        """The iteration time (s). The kernel-time formula is ``_kernel_times``'s, inlined for speed (the tests check
        that the two agree)."""
        T = sums[0]
        if T <= 0.0:
            return 0.0  # nothing to run: no iteration
        work = self._work(T, sums[1], sums[2], sums[3], sums[4], sums[5], sums[6])
        gpu = 0.0
        i = 0
        for count, crate, chalf, mrate, mhalf in self._params:
            f = work[i]
            b = work[i + 1]
            i += 2
            tc = (f + chalf) / crate if f > 0.0 else 0.0
            tm = (b + mhalf) / mrate if b > 0.0 else 0.0
            gpu += count * (tc if tc >= tm else tm)
        if self._n_allreduce:
            gpu += self._communication(T)[0]
        return gpu + self._per_iteration + self._per_sequence * sums[7]

    # ----------------------------------------------------------------------------------------------------------------
    # public

    def iteration_time(self, shape: IterationShape) -> float:
        """Predicted wall time of one iteration (s); 0 for an empty shape. Fast: a few numpy sums, then scalars."""
        return self._total(self._sums(shape))

    def kernels(self, shape: IterationShape) -> list[KernelCost]:
        """Every kernel of the iteration with its per-instance FLOPs, bytes and times (no overheads)."""
        sums = self._sums(shape)
        work = self._work(*sums[:7])
        times = self._kernel_times(work)
        out = []
        for i, ((name, op, op_class, _, _), (count, crate, _, mrate, _), (tc, tm)) in enumerate(
            zip(KERNELS, self._params, times, strict=True)
        ):
            f, b = work[2 * i], work[2 * i + 1]
            bound = "compute" if f * mrate >= b * crate else "memory"  # f / crate >= b / mrate
            out.append(KernelCost(name, op, op_class, count, f, b, tc, tm, bound))
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
            OpCost(name, f, b, t, "compute" if tc > t - tc else "memory")
            for name, (f, b, t, tc) in ops.items()
            if f > 0.0 or b > 0.0
        )
        comm_s, message = self._communication(T)
        calls = self._n_allreduce if comm_s > 0.0 else 0
        overhead = self._per_iteration + self._per_sequence * sums[7] if T > 0.0 else 0.0
        return IterationBreakdown(
            time_s=self._total(sums),
            ops=op_costs,
            communication_s=comm_s,
            communication_bytes=calls * message,
            all_reduces=calls,
            overhead_s=overhead,
            num_tokens=int(T),
            num_seqs=sums[7],
            num_sampled=int(sums[3]),
        )

    @property
    def ridge_point(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the linear layers turn compute-bound at peak rates."""
        return self.hardware.peak_flops(self.gemm_dtype) / self.hardware.bandwidth

    def weight_bytes_per_gpu(self) -> float:
        """Weights one GPU holds (B): its 1/tp of every sharded matrix, plus the replicated norms (and router)."""
        H, q, kv, I, V = self._H, self._q, self._kv, self._I, self._V  # noqa: E741
        a, w = self._a, self._w
        up = 2.0 * I if self._gated else I
        per_layer = (H * (q + 2.0 * kv) + q * H) * w + self._E * (up + I) * H * w + 2.0 * H * a
        if self._bias:
            per_layer += (q + 2.0 * kv) * a
        if self._moe:
            per_layer += H * self._E * a
        embeddings = (1 if self.model.tie_word_embeddings else 2) * V * H * a
        return self._L * per_layer + embeddings + H * a

    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies on one GPU: 2 x L x (KV heads here) x head_dim x bytes."""
        return int(2 * self._L * self._kv * self._c)

    def memory_plan(
        self,
        gpu_memory_utilization: float = 0.9,
        block_size: int = 16,
        *,
        max_num_batched_tokens: int = 2048,
        max_num_seqs: int = 256,
    ) -> MemoryPlan:
        """The KV-cache capacity of one GPU, as vLLM computes it (see ``costmodel.memory``)."""
        # activations of one forward pass over max_num_batched_tokens, all live at once (a generous estimate): the
        # residual stream and hidden state (2H), the q/k/v output, the MLP's gate/up and activation outputs (per routed
        # expert for MoE); plus fp32 logits for max_num_seqs sampled sequences over the whole vocabulary
        up = 2.0 * self._I if self._gated else self._I
        per_token = (2.0 * self._H + self._q + 2.0 * self._kv + self._k * (up + self._I)) * self._a
        reserve = max_num_batched_tokens * per_token + max_num_seqs * self.model.vocab_size * 4 + RUNTIME_RESERVE_BYTES
        return plan_memory(
            model=self.model.name,
            hardware=self.hardware.name,
            tp=self.tp,
            gpu_memory_bytes=self.hardware.memory_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            weight_bytes_per_gpu=int(self.weight_bytes_per_gpu()),
            activation_reserve_bytes=int(reserve),
            kv_bytes_per_token=self.kv_bytes_per_token(),
            block_size=block_size,
        )

    def describe(self) -> str:
        """One line: model, device, parallelism and formats."""
        gemm = "" if self.gemm_dtype == self.dtypes.activation else f", GEMMs in {self.gemm_dtype}"
        return f"{self.model.name} on {self.hardware.name}, tp={self.tp}: {self.dtypes.describe()}{gemm}"
