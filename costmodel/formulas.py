"""The roofline's formulas, compiled: what each kernel of an iteration counts, and the iteration's time.

One implementation serves every caller: ``CostModel.iteration_time`` and ``explain`` call these functions from
Python, and the simulator's compiled engine calls ``iteration_time`` from its own loop (``CostModel.compiled``), so a
simulated iteration costs the same to the last bit on either path. The model and hardware are flattened into two float
arrays (``consts`` and ``kernel_params``, built by ``CostModel``); the names below index them.

A kernel instance takes ``max(floor, compute side, memory side)`` (the roofline, with the class's per-kernel floor).
A profile fitted to measured kernel tables times some kernels from them instead (``costmodel.kernel_tables`` builds
them for the model; ``toc`` and ``tab`` hold them): inside the measured shapes, the measured time interpolated
linearly in log space (log tokens for a GEMM; log sequences and log tokens for attention; log bytes for an
all-reduce); outside them, the roofline times the measured-over-roofline factor at the nearest measured shape, so
that beyond the measurements time follows the roofline from the last one. Without tables nothing changes.

Counts, per GPU (with tensor parallelism ``tp`` each GPU holds 1/tp of the heads, the MLP width and the vocabulary):
``T`` tokens through the linear layers (prefill chunks' new tokens + one per decode), ``H`` hidden size, ``q`` and
``kv`` the query and key (= value) widths (heads x head_dim on this GPU), ``I`` the MLP width on this GPU, ``V`` the
vocabulary slice, ``a``/``w``/``c`` bytes per activation/weight/KV element. FLOPs count a multiply-add as 2; bytes are
the kernel's ideal DRAM traffic: weights read once, inputs read once, outputs written once (caches ignored).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numba import njit

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# The kernels of one forward pass, in execution order: (kernel, the op it is reported under, operator class,
# instances per layer, instances once per iteration). ``kernel_work`` returns their (FLOPs, bytes) in this order.
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

# the measured tables (``toc`` rows): the four per-layer GEMMs at T tokens, the LM head at S sampled tokens, prefill
# attention at (sequences, tokens per sequence), decode attention at (sequences, tokens attended by all), and the
# all-reduce at its message bytes. ``toc[table]`` = (x points, y points, offset of the x then y axis in ``tab``, offset
# of the factors (measured over roofline seconds), offset of the roofline seconds, both x-major); x points 0: no
# table. Axes, factors and seconds are natural logs
T_QKV, T_O, T_UP, T_DOWN, T_LM, T_PREFILL, T_DECODE, T_ALLREDUCE = range(8)
NUM_TABLES = 8
NX, NY, AXES, FACTORS, ROOFS = range(5)
TOC_COLUMNS = 5
# the table of each kernel in ``KERNELS`` order (-1: none)
KERNEL_TABLE = np.array([-1, -1, T_QKV, -1, T_PREFILL, T_DECODE, T_O, T_UP, -1, T_DOWN, -1, T_LM], dtype=np.int64)

# indices into ``consts``
H, Q, KV, MLP, V, E, K, MOE, GATED, BIAS, A, W, C, WINDOW, N_ALLREDUCE, RING, AR_RATE, AR_HALF, AR_LATENCY = range(19)
PER_ITERATION, PER_SEQUENCE = 19, 20
NUM_CONSTS = 21
# columns of ``kernel_params`` (one row per kernel): instances per iteration, compute rate (FLOP/s) and half-size
# (FLOPs), memory rate (B/s) and half-size (B), the class's floor (s)
COUNT, C_RATE, C_HALF, M_RATE, M_HALF, FLOOR = range(6)
NUM_PARAMS = 6


@njit(cache=True)
def shape_sums(
    consts: FloatArray, prefill_new: IntArray, prefill_ctx: IntArray, decode_ctx: IntArray, prefill_sampled: int
) -> tuple[float, float, float, float, float, float, float, float]:
    """Reduce an iteration's shape to what the formulas need: T tokens, P prefill tokens, D decodes, S sampled,
    prefill (query, key) pairs, KV tokens read by prefill and by decode attention, and the sequences."""
    window = int(consts[WINDOW])  # -1: full attention
    n_pf = prefill_new.shape[0]
    n_dec = decode_ctx.shape[0]
    s_n = 0
    pairs2 = 0  # twice the (query, key) pairs, exact in integers
    pf_kv = 0
    for j in range(n_pf):
        n = prefill_new[j]
        c = prefill_ctx[j]
        s_n += n
        if window < 0:
            # query i in 0..n-1 sees c + i + 1 keys (causal): n c + n (n+1) / 2 pairs; K/V of c + n tokens read once
            pairs2 += 2 * n * c + n * (n + 1)
            pf_kv += c + n
        else:
            # each query sees at most `window` keys: the first m = clip(window - c, 0, n) see c+1 .. c+m, the rest
            # exactly `window`
            m = min(max(window - c, 0), n)
            pairs2 += m * (2 * c + m + 1) + 2 * window * (n - m)
            pf_kv += min(c, window) + n
    dec_kv = 0
    for j in range(n_dec):
        # a decode attends its c cached tokens plus itself
        dec_kv += decode_ctx[j] + 1 if window < 0 else min(decode_ctx[j] + 1, window)
    prefill = float(s_n)
    return (
        prefill + n_dec,
        prefill,
        float(n_dec),
        float(prefill_sampled + n_dec),
        0.5 * float(pairs2),
        float(pf_kv),
        float(dec_kv),
        float(n_pf + n_dec),
    )


@njit(cache=True)
def kernel_work(
    consts: FloatArray, T: float, P: float, D: float, S: float, pf_pairs: float, pf_kv: float, dec_kv: float
) -> FloatArray:
    """(FLOPs, bytes) of one instance of each kernel in ``KERNELS`` order, flattened; per GPU."""
    h, q, kv, inter, vocab = consts[H], consts[Q], consts[KV], consts[MLP], consts[V]
    a, w, c = consts[A], consts[W], consts[C]
    qkv = q + 2.0 * kv
    if consts[MOE] > 0.0:
        e, k = consts[E], consts[K]
        rows = T * k  # token-rows through the experts
        # expected distinct experts hit by T tokens routed uniformly: the expert weights read
        hit = e * (1.0 - (1.0 - k / e) ** T)
        router_flops = 2.0 * T * h * e  # router GEMM T x H x E
        router_bytes = (h * e + T * (h + e)) * a
    else:
        rows, hit, router_flops, router_bytes = T, 1.0, 0.0, 0.0
    gated = consts[GATED] > 0.0
    up = 2.0 * inter if gated else inter  # gate and up side by side, or up alone
    act_flops = 5.0 if gated else 8.0  # per output element: SiLU (~4) x up, or GELU (tanh form, ~8); nominal
    act_io = 3.0 if gated else 2.0  # elements moved per output element: read gate, up; write out
    norm_flops = 4.0 * T * h  # residual add, square-accumulate, scale, weight multiply
    norm_bytes = 4.0 * T * h * a + h * a  # read input and residual, write both; weight vector
    out = np.empty(2 * len(KERNELS))
    # embedding: gather T rows of the table, write the hidden states
    out[0], out[1] = 0.0, 2.0 * T * h * a
    # norm (fused add + RMSNorm)
    out[2], out[3] = norm_flops, norm_bytes
    # qkv_proj: [T x H] @ [H x (q + 2 kv)] (+ bias); weights once, input once, output once
    out[4] = 2.0 * T * h * qkv
    out[5] = h * qkv * w + (qkv * a if consts[BIAS] > 0.0 else 0.0) + T * (h + qkv) * a
    # rope: rotate q and k in place (~3 FLOPs per element), read and write them
    out[6], out[7] = 3.0 * T * (q + kv), 2.0 * T * (q + kv) * a
    # attention_prefill: QK^T and PV, 2 x 2 x d FLOPs per (query head, key) pair summed over heads = 4 q pairs;
    # read Q and write O, write the chunk's K and V to the cache, read every K and V it attends to once
    out[8], out[9] = 4.0 * q * pf_pairs, 2.0 * P * q * a + 2.0 * kv * c * (P + pf_kv)
    # attention_decode: the same per pair; one query per sequence reads that sequence's whole KV cache
    out[10], out[11] = 4.0 * q * dec_kv, 2.0 * D * q * a + 2.0 * kv * c * (D + dec_kv)
    # o_proj: [T x q] @ [q x H]
    out[12], out[13] = 2.0 * T * q * h, q * h * w + T * (q + h) * a
    # mlp_gate_up: [R x H] @ [H x up] for each expert hit (+ router); weights of the experts hit read once
    out[14] = 2.0 * rows * h * up + router_flops
    out[15] = hit * h * up * w + rows * (h + up) * a + router_bytes
    # mlp_act: SiLU(gate) * up (or GELU(up)) over R x I outputs
    out[16], out[17] = act_flops * rows * inter, act_io * rows * inter * a
    # mlp_down: [R x I] @ [I x H]
    out[18], out[19] = 2.0 * rows * inter * h, hit * inter * h * w + rows * (inter + h) * a
    # final_norm: once, over all T tokens
    out[20], out[21] = norm_flops, norm_bytes
    # lm_head: only the S sampling sequences' last hidden states, [S x H] @ [H x V/tp], unquantized
    out[22], out[23] = 2.0 * S * h * vocab, h * vocab * a + S * (h + vocab) * a
    return out


@njit(cache=True)
def kernel_time(flops: float, nbytes: float, params: FloatArray) -> tuple[float, float]:
    """(compute-limited, memory-limited) seconds of one kernel instance: size / (peak x eff(size)), which with
    eff(n) = max n / (n + half) is (size + half) / (peak x max); an empty side costs nothing."""
    tc = (flops + params[C_HALF]) / params[C_RATE] if flops > 0.0 else 0.0
    tm = (nbytes + params[M_HALF]) / params[M_RATE] if nbytes > 0.0 else 0.0
    return tc, tm


@njit(cache=True)
def _bracket(tab: FloatArray, at: int, n: int, x: float) -> tuple[int, float]:
    """(i, w): x lies between axis points i and i + 1 of the n at ``tab[at:]``, at share w of the way (clamped to the
    axis: w 0 before its first point, 1 past its last)."""
    if n == 1 or x <= tab[at]:
        return 0, 0.0
    if x >= tab[at + n - 1]:
        return n - 2, 1.0
    lo, hi = 0, n - 1
    while hi - lo > 1:  # tab[at + lo] <= x < tab[at + hi]
        mid = (lo + hi) // 2
        if tab[at + mid] <= x:
            lo = mid
        else:
            hi = mid
    return lo, (x - tab[at + lo]) / (tab[at + lo + 1] - tab[at + lo])


@njit(cache=True)
def _bilinear(tab: FloatArray, at: int, ny: int, i: int, i1: int, wx: float, j: int, j1: int, wy: float) -> float:
    low = (1.0 - wy) * tab[at + i * ny + j] + wy * tab[at + i * ny + j1]
    high = (1.0 - wy) * tab[at + i1 * ny + j] + wy * tab[at + i1 * ny + j1]
    return (1.0 - wx) * low + wx * high


@njit(cache=True)
def table_time(toc: IntArray, tab: FloatArray, table: int, x: float, y: float, roof: float) -> float:
    """Seconds of a kernel whose roofline time is ``roof`` at (x, y) (natural logs of the table's axes; y unused by a
    1-D table): inside the table's axes, its measured seconds interpolated bilinearly in log space; outside them,
    ``roof`` times the measured factor at the nearest measured shape (bilinear in log space along the axis inside);
    ``roof`` itself when the table is absent."""
    nx = toc[table, NX]
    if nx == 0:
        return roof
    ny, axes = toc[table, NY], toc[table, AXES]
    i, wx = _bracket(tab, axes, nx, x)
    i1 = i + 1 if nx > 1 else i
    j, wy, j1 = 0, 0.0, 0
    inside = tab[axes] <= x and x <= tab[axes + nx - 1]
    if ny > 1:
        j, wy = _bracket(tab, axes + nx, ny, y)
        j1 = j + 1
        inside = inside and tab[axes + nx] <= y and y <= tab[axes + nx + ny - 1]
    factor = _bilinear(tab, toc[table, FACTORS], ny, i, i1, wx, j, j1, wy)
    if inside:
        return math.exp(factor + _bilinear(tab, toc[table, ROOFS], ny, i, i1, wx, j, j1, wy))
    return roof * math.exp(factor)


@njit(cache=True)
def kernel_table_time(
    toc: IntArray, tab: FloatArray, table: int, roof: float, T: float, D: float, S: float, prefills: float,
    pf_pairs: float, dec_kv: float,
) -> float:  # fmt: skip
    """One kernel's seconds from its table at this iteration's shape (``table_time``; ``roof`` its roofline time):
    GEMMs at log T (the LM head at log S); prefill attention at (log chunks, log L), L the prompt length whose causal
    (query, key) pairs per chunk, L (L + 1) / 2, equal the chunks' mean (a prompt of L tokens alone is exactly the
    measured shape); decode attention at (log D, log tokens attended by all D): the KV cache read, whose size
    decides whether the measurements were served from the GPU's L2 cache (an L40S's small batches of short contexts
    ran up to 6x faster than from its memory)."""
    if table == T_LM:
        return table_time(toc, tab, table, math.log(S), 0.0, roof)
    if table == T_PREFILL:
        length = 0.5 * (math.sqrt(8.0 * pf_pairs / prefills + 1.0) - 1.0)
        return table_time(toc, tab, table, math.log(prefills), math.log(length), roof)
    if table == T_DECODE:
        return table_time(toc, tab, table, math.log(D), math.log(dec_kv), roof)
    return table_time(toc, tab, table, math.log(T), 0.0, roof)


@njit(cache=True)
def allreduce(consts: FloatArray, toc: IntArray, tab: FloatArray, T: float) -> tuple[float, float]:
    """(seconds, bytes per call) of the iteration's tensor-parallel all-reduces: each carries the [T x H]
    activations; a ring all-reduce takes latency + 2 (tp-1)/tp x (bytes + half) / (link bandwidth x max), times the
    measured table's time at its message size where there is one."""
    calls = consts[N_ALLREDUCE]
    if calls <= 0.0 or T <= 0.0:
        return 0.0, 0.0
    message = T * consts[H] * consts[A]
    per_call = consts[AR_LATENCY] + consts[RING] * (message + consts[AR_HALF]) / consts[AR_RATE]
    if toc[T_ALLREDUCE, NX] > 0:
        per_call = table_time(toc, tab, T_ALLREDUCE, math.log(message), 0.0, per_call)
    return calls * per_call, message


@njit(cache=True)
def time_of_sums(
    consts: FloatArray,
    kernel_params: FloatArray,
    toc: IntArray,
    tab: FloatArray,
    sums: tuple[float, float, float, float, float, float, float, float],
) -> float:
    """The iteration time (s): kernels (each the roofline maximum, at least its floor, or its measured table's time)
    + all-reduces + host overheads; 0 if empty."""
    T = sums[0]
    if T <= 0.0:
        return 0.0
    work = kernel_work(consts, T, sums[1], sums[2], sums[3], sums[4], sums[5], sums[6])
    gpu = 0.0
    for i in range(kernel_params.shape[0]):
        tc, tm = kernel_time(work[2 * i], work[2 * i + 1], kernel_params[i])
        t = tc if tc >= tm else tm
        if t > 0.0:
            if kernel_params[i, FLOOR] > t:
                t = kernel_params[i, FLOOR]
            table = KERNEL_TABLE[i]
            if table >= 0 and toc[table, NX] > 0:
                t = kernel_table_time(toc, tab, table, t, T, sums[2], sums[3], sums[7] - sums[2], sums[4], sums[6])
        gpu += kernel_params[i, COUNT] * t
    gpu += allreduce(consts, toc, tab, T)[0]
    return gpu + consts[PER_ITERATION] + consts[PER_SEQUENCE] * sums[7]


@njit(cache=True)
def iteration_time(
    args: tuple[FloatArray, FloatArray, IntArray, FloatArray],
    prefill_new: IntArray,
    prefill_ctx: IntArray,
    decode_ctx: IntArray,
    prefill_sampled: int,
) -> float:
    """Seconds of one iteration of this shape; ``args`` is ``(consts, kernel_params, toc, tab)`` from
    ``CostModel``."""
    consts, kernel_params, toc, tab = args
    return time_of_sums(
        consts, kernel_params, toc, tab, shape_sums(consts, prefill_new, prefill_ctx, decode_ctx, prefill_sampled)
    )
