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

What each kernel counts (FLOPs and bytes per GPU, for every layer kind: grouped-query and latent attention, full and
windowed, dense and MoE MLPs) is ``costmodel.work``; this module times them and adds the communication: the
tensor-parallel all-reduces, the collectives of an MoE layer over data-parallel ranks, and the sends between pipeline
stages.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from costmodel import numba_cache
from costmodel.work import (  # noqa: F401  (what each kernel counts; its names are part of this module's)
    AR_HALF,
    AR_LATENCY,
    AR_RATE,
    BIAS,
    BY_TOKENS,
    CHUNKED,
    DP_RING,
    DV,
    E_LOCAL,
    GATED,
    KERNEL_ROW,
    KERNELS,
    KV,
    LAT,
    MLA,
    MLP,
    MOE,
    MOE_I,
    MOE_TOKENS,
    N_ALLREDUCE,
    N_DP_COMM,
    N_P2P,
    NH,
    NO_VERIFY,
    NOPE,
    NUM_CONSTS,
    NUM_SUMS,
    O_IN,
    PER_ITERATION,
    PER_PREFILL,
    PER_SEQUENCE,
    Q_UP,
    QKV_N,
    RING,
    ROPE,
    SH_I,
    SUM_V_KV,
    SUM_V_SEQS,
    SUM_W_V_KV,
    W_EXP,
    W_MLP,
    W_SH,
    WINDOW,
    WINDOW2,
    A,
    C,
    E,
    FloatArray,
    H,
    IntArray,
    K,
    Q,
    Sums,
    V,
    W,
    kernel_work,
    shape_sums,
    shape_work,
    token_work,
)

numba_cache.configure()  # before anything here is compiled (see costmodel.numba_cache)

# the measured tables (``toc`` rows): the four per-layer GEMMs at T tokens, the LM head at S sampled tokens, prefill
# attention at (sequences, tokens per sequence), decode attention at (sequences, tokens attended by all), the
# all-reduce at its message bytes, and the routed experts (vLLM's fused MoE) at the tokens the MoE layer takes.
# ``toc[table]`` = (x points, y points, offset of the x then y axis in ``tab``, offset of the factors (measured over
# roofline seconds), offset of the roofline seconds, both x-major); x points 0: no table. Axes, factors and seconds
# are natural logs
T_QKV, T_O, T_UP, T_DOWN, T_LM, T_PREFILL, T_DECODE, T_ALLREDUCE, T_MOE = range(9)
NUM_TABLES = 9
NX, NY, AXES, FACTORS, ROOFS = range(5)
TOC_COLUMNS = 5
# the table of each kernel in ``KERNELS`` order (-1: none)
_TABLE_OF = {"qkv_proj": T_QKV, "attention_prefill": T_PREFILL, "attention_decode": T_DECODE,
             "attention_prefill_window": T_PREFILL, "attention_decode_window": T_DECODE, "o_proj": T_O,
             "mlp_gate_up": T_UP, "mlp_down": T_DOWN, "moe_experts": T_MOE, "lm_head": T_LM}  # fmt: skip
KERNEL_TABLE = np.array([_TABLE_OF.get(name, -1) for name, _, _, _, _ in KERNELS], dtype=np.int64)
# the windowed layers' attention kernels, which take the windowed sums
WINDOW_KERNELS = (KERNEL_ROW["attention_prefill_window"], KERNEL_ROW["attention_decode_window"])
# speculative decoding's verification attention: no table measured a query of 1 + k over a context; where a decode
# table was measured, the roofline is scaled by its measured-over-roofline factor at the same sequences and KV read
# (an approximation: a verification reads its KV as a decode does)
VERIFY_KERNELS = (KERNEL_ROW["attention_verify"], KERNEL_ROW["attention_verify_window"])

# columns of ``kernel_params`` (one row per kernel): instances per iteration, compute rate (FLOP/s) and half-size
# (FLOPs), memory rate (B/s) and half-size (B), the class's floor (s)
COUNT, C_RATE, C_HALF, M_RATE, M_HALF, FLOOR = range(6)
NUM_PARAMS = 6


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
    axes = toc[table, AXES]
    i, wx = _bracket(tab, axes, nx, x)
    return _table_time_at(toc, tab, table, i, wx, tab[axes] <= x and x <= tab[axes + nx - 1], y, roof)


@njit(cache=True)
def table_factor(toc: IntArray, tab: FloatArray, table: int, x: float, y: float) -> float:
    """The measured-over-roofline factor of a 2-D table at (x, y) (natural logs), at the nearest measured shape
    outside its axes; 1 when the table is absent."""
    nx, ny, axes = toc[table, NX], toc[table, NY], toc[table, AXES]
    if nx == 0:
        return 1.0
    i, wx = _bracket(tab, axes, nx, x)
    i1 = i + 1 if nx > 1 else i
    j, wy, j1 = 0, 0.0, 0
    if ny > 1:
        j, wy = _bracket(tab, axes + nx, ny, y)
        j1 = j + 1
    return math.exp(_bilinear(tab, toc[table, FACTORS], ny, i, i1, wx, j, j1, wy))


@njit(cache=True)
def _table_time_at(
    toc: IntArray, tab: FloatArray, table: int, i: int, wx: float, inside: bool, y: float, roof: float
) -> float:
    """``table_time`` with x already placed on the table's x axis (``_bracket``'s i and wx; ``inside``: x within it),
    so that tables sharing one axis (the GEMMs') place an iteration's tokens once."""
    nx, ny, axes = toc[table, NX], toc[table, NY], toc[table, AXES]
    i1 = i + 1 if nx > 1 else i
    j, wy, j1 = 0, 0.0, 0
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
    pf_pairs: float, dec_kv: float, moe_tokens: float = 1.0,
) -> float:  # fmt: skip
    """One kernel's seconds from its table at this iteration's shape (``table_time``; ``roof`` its roofline time):
    GEMMs at log T (the LM head at log S); prefill attention at (log chunks, log L), L the prompt length whose causal
    (query, key) pairs per chunk, L (L + 1) / 2, equal the chunks' mean (a prompt of L tokens alone is exactly the
    measured shape); decode attention at (log D, log tokens attended by all D): the KV cache read, whose size
    decides whether the measurements were served from the GPU's L2 cache (an L40S's small batches of short contexts
    ran up to 6x faster than from its memory); the routed experts at log of the tokens the MoE layer takes (T times
    ``moe_tokens``, the data-parallel ranks')."""
    if table == T_LM:
        return table_time(toc, tab, table, math.log(S), 0.0, roof)
    if table == T_PREFILL:
        length = 0.5 * (math.sqrt(8.0 * pf_pairs / prefills + 1.0) - 1.0)
        return table_time(toc, tab, table, math.log(prefills), math.log(length), roof)
    if table == T_DECODE:
        return table_time(toc, tab, table, math.log(D), math.log(dec_kv), roof)
    if table == T_MOE:
        return table_time(toc, tab, table, math.log(T * moe_tokens), 0.0, roof)
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
def collectives(consts: FloatArray, T: float) -> tuple[float, float]:
    """(seconds of the MoE layers' collectives over the data-parallel ranks, of the pipeline's sends) per iteration.

    Data-parallel attention with MoE layers (vLLM's default ``allgather_reducescatter`` all-to-all,
    ``vllm/distributed/device_communicators/all2all.py``): before each MoE layer the ranks' tokens are all-gathered,
    after it the outputs are reduce-scattered; together they move what a ring all-reduce of the gathered
    activations moves, (dp - 1)/dp x 2 x (dp x T x H) elements per GPU, timed as that on the device's link. The pipeline
    sends each stage's hidden states and residual (2 T H elements) to the next, once per stage boundary."""
    if T <= 0.0:
        return 0.0, 0.0
    rate, half, latency = consts[AR_RATE], consts[AR_HALF], consts[AR_LATENCY]
    dp_s = 0.0
    if consts[N_DP_COMM] > 0.0:
        gathered = T * consts[MOE_TOKENS] * consts[H] * consts[A]
        dp_s = consts[N_DP_COMM] * (latency + consts[DP_RING] * (gathered + half) / rate)
    p2p_s = 0.0
    if consts[N_P2P] > 0.0:
        p2p_s = consts[N_P2P] * (latency + (2.0 * T * consts[H] * consts[A] + half) / rate)
    return dp_s, p2p_s


# a cost model's memo (``memo``, one row per token count, ``MEMO_ROWS`` of them): what an iteration of T tokens costs
# in the kernels that depend on T alone (``BY_TOKENS``: instances x seconds, each as the loop adds it), the
# all-reduces and the other collectives, with a flag; and in row S, the LM head over S sampled tokens, with its flag.
# An iteration then computes only its attention (and MLA's expansions) from its shape: the same additions, in the same
# order, of the same numbers, so a memo changes no bit of a time
M_TOKENS = 0
M_KERNELS = 1  # + kernel row
M_ALLREDUCE, M_DP, M_P2P, M_SAMPLED, M_LM = (len(KERNELS) + 1 + k for k in range(5))
MEMO_COLUMNS = len(KERNELS) + 6
MEMO_ROWS = 16385  # token counts up to 16,384 (a larger iteration is computed in full); rows are taken as written
LM_ROW = KERNEL_ROW["lm_head"]
NO_MEMO = np.zeros((0, MEMO_COLUMNS))


def new_memo() -> FloatArray:
    """An empty memo for one cost model's ``args`` (np.zeros: memory is taken only for the rows written)."""
    return np.zeros((MEMO_ROWS, MEMO_COLUMNS))


@njit(cache=True)
def time_of_sums(
    consts: FloatArray,
    kernel_params: FloatArray,
    toc: IntArray,
    tab: FloatArray,
    sums: Sums,
    memo: FloatArray,
) -> float:
    """The iteration time (s): kernels (each the roofline maximum, at least its floor, or its measured table's time)
    + all-reduces + data-parallel and pipeline communication + host overheads; 0 if empty. With pipeline parallelism
    the stages run one after the other on one batch, so every layer's kernels add up as on one stage. ``memo``: what
    this cost model has already computed of other iterations of as many tokens (see ``M_TOKENS``), read and written
    (``NO_MEMO``: none)."""
    T = sums[0]
    if T <= 0.0:
        return 0.0
    t_row, s_row = int(T), int(sums[3])
    rows = memo.shape[0]
    known_t = t_row < rows and memo[t_row, M_TOKENS] != 0.0
    known_s = s_row < rows and memo[s_row, M_SAMPLED] != 0.0
    work = np.zeros(2 * len(KERNELS))
    if not known_t:
        token_work(consts, T, work)
    shape_work(consts, sums[1], sums[2], sums[3], sums[4], sums[5], sums[6], sums[8], sums[9], sums[10], work,
               sums[11], sums[12], sums[13], sums[14], sums[15])  # fmt: skip
    gpu = 0.0
    # where the last GEMM table placed its tokens: (axis offset, log tokens, i, w, inside); the GEMM tables share one
    # axis where their measured tokens are the same (``kernel_tables.pack``), and T (or S) is placed once
    placed_axes, placed_x, placed_i, placed_w, placed_in = -1, 0.0, 0, 0.0, False
    for i in range(kernel_params.shape[0]):
        count = kernel_params[i, COUNT]
        if count == 0.0:
            continue
        if BY_TOKENS[i] and known_t:
            gpu += memo[t_row, M_KERNELS + i]
            continue
        if i == LM_ROW and known_s:
            gpu += memo[s_row, M_LM]
            continue
        tc, tm = kernel_time(work[2 * i], work[2 * i + 1], kernel_params[i])
        t = tc if tc >= tm else tm
        if t > 0.0:
            if kernel_params[i, FLOOR] > t:
                t = kernel_params[i, FLOOR]
            table = KERNEL_TABLE[i]
            if table >= 0 and table <= T_LM and toc[table, NX] > 0:  # a GEMM: at log T (the LM head at log S)
                x = math.log(sums[3] if table == T_LM else T)
                axes, nx = toc[table, AXES], toc[table, NX]
                if axes != placed_axes or x != placed_x:
                    placed_i, placed_w = _bracket(tab, axes, nx, x)
                    placed_axes, placed_x = axes, x
                    placed_in = tab[axes] <= x and x <= tab[axes + nx - 1]
                t = _table_time_at(toc, tab, table, placed_i, placed_w, placed_in, 0.0, t)
            elif table >= 0 and toc[table, NX] > 0:
                if i == WINDOW_KERNELS[0] or i == WINDOW_KERNELS[1]:
                    pairs, dec_kv = sums[8], sums[10]
                else:
                    pairs, dec_kv = sums[4], sums[6]
                t = kernel_table_time(toc, tab, table, t, T, sums[2], sums[3], sums[7] - sums[2] - sums[SUM_V_SEQS],
                                      pairs, dec_kv, consts[MOE_TOKENS])  # fmt: skip
            elif (i == VERIFY_KERNELS[0] or i == VERIFY_KERNELS[1]) and toc[T_DECODE, NX] > 0:
                read = sums[SUM_W_V_KV] if i == VERIFY_KERNELS[1] else sums[SUM_V_KV]
                t = t * table_factor(toc, tab, T_DECODE, math.log(sums[SUM_V_SEQS]), math.log(read))
        gpu += count * t
        if BY_TOKENS[i] and t_row < rows:
            memo[t_row, M_KERNELS + i] = count * t
        elif i == LM_ROW and s_row < rows:
            memo[s_row, M_LM] = count * t
            memo[s_row, M_SAMPLED] = 1.0
    if known_t:
        ar, dp_s, p2p_s = memo[t_row, M_ALLREDUCE], memo[t_row, M_DP], memo[t_row, M_P2P]
    else:
        ar = allreduce(consts, toc, tab, T)[0]
        dp_s, p2p_s = collectives(consts, T)
        if t_row < rows:
            memo[t_row, M_ALLREDUCE], memo[t_row, M_DP], memo[t_row, M_P2P] = ar, dp_s, p2p_s
            memo[t_row, M_TOKENS] = 1.0
    gpu += ar
    return gpu + dp_s + p2p_s + host_time(consts, sums)


@njit(cache=True)
def host_time(consts: FloatArray, sums: Sums) -> float:
    """The iteration's host overheads (s): per iteration, per sequence, per prompt chunk (not per decode or
    verification)."""
    return (consts[PER_ITERATION] + consts[PER_SEQUENCE] * sums[7]
            + consts[PER_PREFILL] * (sums[7] - sums[2] - sums[SUM_V_SEQS]))  # fmt: skip


@njit(cache=True)
def iteration_time(
    args: tuple[FloatArray, FloatArray, IntArray, FloatArray, FloatArray],
    prefill_new: IntArray,
    prefill_ctx: IntArray,
    decode_ctx: IntArray,
    prefill_sampled: int,
    verify_new: IntArray = NO_VERIFY,
    verify_ctx: IntArray = NO_VERIFY,
) -> float:
    """Seconds of one iteration of this shape (``verify_new`` and ``verify_ctx``: speculative decoding's
    verifications, ``shape_sums``); ``args`` is ``(consts, kernel_params, toc, tab, memo)`` from ``CostModel``."""
    consts, kernel_params, toc, tab, memo = args
    sums = shape_sums(consts, prefill_new, prefill_ctx, decode_ctx, prefill_sampled, verify_new, verify_ctx)
    return time_of_sums(consts, kernel_params, toc, tab, sums, memo)
