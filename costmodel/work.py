"""What each kernel of an iteration counts: its FLOPs and DRAM bytes per GPU, compiled (``costmodel.formulas`` times
them; both simulation engines call these through it).

The model, its parallel layout and the device are flattened into ``consts`` (built by ``CostModel`` from
``costmodel.layout``); the names below index it. Counts, per GPU: ``T`` tokens through the linear layers (prefill
chunks' new tokens + one per decode), ``H`` hidden size, ``q`` and ``kv`` the query and key (= value) widths (heads x
head_dim on this GPU; MLA: ``kv`` is the latent and rotary key one token caches), ``I`` the dense MLP's width on this
GPU, ``V`` the vocabulary slice, ``a``/``w``/``c`` bytes per activation/weight/KV element (each part of a layer in its
own stored format: ``W`` attention, ``W_MLP`` dense MLP, ``W_EXP`` routed experts, ``W_SH`` shared experts). FLOPs
count a multiply-add as 2; bytes are the kernel's ideal DRAM traffic: weights read once, inputs read once, outputs
written once (caches ignored).

Per layer kind:
- grouped-query attention: Q/K/V and O projections, RoPE, attention over the cached K and V of every KV head;
- MLA (DeepSeek-V2/V3, Kimi-K2), as vLLM 0.32.0 runs it (``vllm/model_executor/layers/attention/mla_attention.py``
  and ``vllm/v1/attention/backends/mla/common.py``): the query and latent down-projections (and the query's
  up-projection) in ``qkv_proj``; a prefill expands the latent of every token it attends into per-head keys and
  values (``mla_kv_up``: ``kv_b_proj`` over the cached context and the new tokens) and runs ordinary attention with
  query/key heads of ``d_nope + d_rope`` and value heads of ``d_v``; a decode runs the absorbed form: its query is
  multiplied into the latent space (``mla_absorb``: W_UK, then W_UV after attention, in bf16 as vLLM keeps them) and
  attends over the cached latent and rotary key of each token, one copy read for all heads (MQA);
- windowed layers (sliding window: every query sees at most ``w`` keys; chunked: a query sees the keys of its own
  chunk of ``w`` tokens up to itself, Llama-4's local attention) counted apart from full ones; a sink (GPT-OSS) adds
  one logit per head to the softmax, nothing to speak of;
- a mixture of experts: the router GEMM (``H x E``, in the activation format), the routed experts as one fused kernel
  (``moe_experts``: vLLM's ``fused_experts``, gate/up, activation and down over the rows routed to this GPU's experts)
  and the shared expert(s) (``moe_shared``, a dense MLP of their width). A token goes to ``k`` of ``E`` experts; with
  expert parallelism this GPU holds ``E_local`` of them and receives the tokens of every data-parallel rank
  (``MOE_TOKENS`` times its own, the ranks' batches taken to be alike). Under uniform routing the rows it computes are
  ``T_moe k E_local / E`` and the distinct experts whose weights it reads are ``E_local (1 - (1 - k/E)^T_moe)``: the
  expected number hit by ``T_moe`` tokens, growing with the batch and capped at all of them (routing is uniform in
  expectation only: real routers are skewed, which the semantics table says (docs/concepts/semantics.md)).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from costmodel import numba_cache

numba_cache.configure()  # before anything here is compiled (see costmodel.numba_cache)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# The kernels of one forward pass, in execution order: (kernel, the op it is reported under, operator class,
# instances per layer of a plain dense model, instances once per iteration). ``kernel_work`` returns their (FLOPs,
# bytes) in this order; ``CostModel`` sets each kernel's instances for the model (dense, MoE, windowed, MLA layers).
KERNELS: tuple[tuple[str, str, str, int, int], ...] = (
    ("embedding", "embedding", "elementwise", 0, 1),
    ("norm", "norms", "elementwise", 2, 0),  # before attention and before the MLP, residual add fused in
    ("qkv_proj", "qkv_proj", "gemm", 1, 0),  # MLA: the query and latent down-projections, the query's up-projection
    ("rope", "rope", "elementwise", 1, 0),
    ("attention_prefill", "attention_prefill", "attention_prefill", 1, 0),  # full-attention layers
    ("attention_decode", "attention_decode", "attention_decode", 1, 0),
    ("attention_prefill_window", "attention_prefill", "attention_prefill", 0, 0),  # windowed layers of a hybrid
    ("attention_decode_window", "attention_decode", "attention_decode", 0, 0),
    ("mla_kv_up", "mla", "gemm", 0, 0),  # MLA prefill: the latent expanded into keys and values (kv_b_proj)
    ("mla_absorb", "mla", "gemm", 0, 0),  # MLA decode: W_UK into the latent, W_UV out of it (batched GEMMs)
    ("o_proj", "o_proj", "gemm", 1, 0),
    ("mlp_gate_up", "mlp", "gemm", 1, 0),  # dense layers
    ("mlp_act", "mlp", "elementwise", 1, 0),
    ("mlp_down", "mlp", "gemm", 1, 0),
    ("moe_router", "moe", "gemm", 0, 0),  # MoE layers
    ("moe_experts", "moe", "gemm", 0, 0),
    ("moe_shared", "moe", "gemm", 0, 0),
    ("final_norm", "norms", "elementwise", 0, 1),
    ("lm_head", "lm_head", "gemm", 0, 1),  # on the sampled tokens only (a verification's every query token)
    # speculative decoding's verification: each sequence's query of 1 + k tokens over its cached context (appended
    # here, after the kernels whose positions calibration reads)
    ("attention_verify", "attention_verify", "attention_decode", 1, 0),
    ("attention_verify_window", "attention_verify", "attention_decode", 0, 0),
)

KERNEL_ROW = {name: i for i, (name, _, _, _, _) in enumerate(KERNELS)}

# indices into ``consts``; the first 21 are kept where they were (calibration reads them)
H, Q, KV, MLP, V, E, K, MOE, GATED, BIAS, A, W, C, WINDOW, N_ALLREDUCE, RING, AR_RATE, AR_HALF, AR_LATENCY = range(19)
PER_ITERATION, PER_SEQUENCE = 19, 20
# QKV_N: qkv_proj's output width (GQA: q + 2 kv; MLA: the down-projections' width); Q_UP: MLA's query bottleneck
# (0: none); O_IN: o_proj's input width; MLA: 1 for latent attention; NH heads on this GPU; LAT, ROPE, NOPE, DV: MLA's
# latent, rotary, non-rotary and value head sizes; WINDOW2: the windowed layers' window (-1: none); CHUNKED: 1 when it
# is a fixed chunk; MOE_I: one routed expert's width on this GPU; E_LOCAL: routed experts on this GPU; MOE_TOKENS: the
# tokens of the MoE layer over this rank's (data-parallel ranks); SH_I: the shared experts' width on this GPU;
# W_MLP, W_EXP, W_SH: bytes per weight of the dense MLP, routed and shared experts; N_DP_COMM: collectives over the
# data-parallel ranks per iteration (an all-gather before and a reduce-scatter after each MoE layer) and DP_RING their
# ring factor; N_P2P: pipeline sends per iteration
(QKV_N, Q_UP, O_IN, MLA, NH, LAT, ROPE, NOPE, DV, WINDOW2, CHUNKED, MOE_I, E_LOCAL, MOE_TOKENS, SH_I, W_MLP, W_EXP,
 W_SH, N_DP_COMM, DP_RING, N_P2P) = range(21, 42)  # fmt: skip
PER_PREFILL = 42  # host seconds per prompt chunk in the iteration (Overheads.per_prefill_s)
NUM_CONSTS = 43

# what ``shape_sums`` returns, by position: T, P, D, S, the prefill pairs, prefill KV read, decode KV read, sequences,
# the windowed layers' three; then speculative decoding's verifications: their query tokens, (query, key) pairs, KV
# read, the windowed layers' pairs and KV read, and their count
NUM_SUMS = 17
SUM_VQ, SUM_V_PAIRS, SUM_V_KV, SUM_W_V_PAIRS, SUM_W_V_KV, SUM_V_SEQS = range(11, 17)


@njit(cache=True)
def _window_pairs(n: int, c: int, w: int, chunked: bool) -> tuple[int, int]:
    """(twice the (query, key) pairs, keys read) of a prefill chunk of ``n`` new tokens after ``c`` cached ones when
    each query sees at most ``w`` keys: the last ``w`` (sliding), or those of its own chunk of ``w`` up to itself."""
    if not chunked:
        # the first m = clip(w - c, 0, n) queries see c+1 .. c+m keys, the rest exactly w
        m = min(max(w - c, 0), n)
        return m * (2 * c + m + 1) + 2 * w * (n - m), min(c, w) + n
    pairs2 = 0
    keys = 0
    p = c
    end = c + n
    while p < end:  # one segment per chunk the new tokens touch: offsets [lo, hi) in that chunk
        start = (p // w) * w
        stop = min(end, start + w)
        lo, hi = p - start, stop - start
        pairs2 += hi * (hi + 1) - lo * (lo + 1)  # 2 x sum of (offset + 1) keys
        keys += hi  # the chunk's keys from its start, read once
        p = stop
    return pairs2, keys


Sums = tuple[float, float, float, float, float, float, float, float, float, float, float, float, float, float, float,
             float, float]  # fmt: skip
NO_VERIFY = np.zeros(0, dtype=np.int64)


@njit(cache=True)
def shape_sums(
    consts: FloatArray, prefill_new: IntArray, prefill_ctx: IntArray, decode_ctx: IntArray, prefill_sampled: int,
    verify_new: IntArray = NO_VERIFY, verify_ctx: IntArray = NO_VERIFY,
) -> Sums:  # fmt: skip
    """Reduce an iteration's shape to what the formulas need: T tokens, P prefill tokens, D decodes, S sampled,
    prefill (query, key) pairs, KV tokens read by prefill and by decode attention, the sequences, and the same three
    attention sums for the windowed layers of a hybrid model (0 without them); then the verifications' (``VQ`` ...:
    a query of ``verify_new`` tokens over ``verify_ctx`` cached ones each, every query token sampled)."""
    window = int(consts[WINDOW])  # -1: full attention (a window here applies to every layer: Mistral)
    window2 = int(consts[WINDOW2])  # -1: no windowed layers of their own
    chunked = consts[CHUNKED] > 0.0
    n_pf = prefill_new.shape[0]
    n_dec = decode_ctx.shape[0]
    s_n = 0
    pairs2 = 0  # twice the (query, key) pairs, exact in integers
    pf_kv = 0
    w_pairs2 = 0
    w_pf_kv = 0
    for j in range(n_pf):
        n = prefill_new[j]
        c = prefill_ctx[j]
        s_n += n
        if window < 0:
            # query i in 0..n-1 sees c + i + 1 keys (causal): n c + n (n+1) / 2 pairs; K/V of c + n tokens read once
            pairs2 += 2 * n * c + n * (n + 1)
            pf_kv += c + n
        else:
            p2, kv = _window_pairs(n, c, window, False)
            pairs2 += p2
            pf_kv += kv
        if window2 >= 0:
            p2, kv = _window_pairs(n, c, window2, chunked)
            w_pairs2 += p2
            w_pf_kv += kv
    dec_kv = 0
    w_dec_kv = 0
    for j in range(n_dec):
        # a decode attends its c cached tokens plus itself
        ctx = decode_ctx[j]
        dec_kv += ctx + 1 if window < 0 else min(ctx + 1, window)
        if window2 >= 0:
            w_dec_kv += ctx % window2 + 1 if chunked else min(ctx + 1, window2)
    # verifications: a query of q tokens after c cached ones, causal among themselves, as a prefill chunk's pairs
    n_vf = verify_new.shape[0]
    v_q = 0
    v_pairs2 = 0
    v_kv = 0
    w_v_pairs2 = 0
    w_v_kv = 0
    for j in range(n_vf):
        q = verify_new[j]
        c = verify_ctx[j]
        v_q += q
        if window < 0:
            v_pairs2 += 2 * q * c + q * (q + 1)
            v_kv += c + q
        else:
            p2, kv = _window_pairs(q, c, window, False)
            v_pairs2 += p2
            v_kv += kv
        if window2 >= 0:
            p2, kv = _window_pairs(q, c, window2, chunked)
            w_v_pairs2 += p2
            w_v_kv += kv
    prefill = float(s_n)
    return (
        prefill + n_dec + v_q,
        prefill,
        float(n_dec),
        float(prefill_sampled + n_dec + v_q),
        0.5 * float(pairs2),
        float(pf_kv),
        float(dec_kv),
        float(n_pf + n_dec + n_vf),
        0.5 * float(w_pairs2),
        float(w_pf_kv),
        float(w_dec_kv),
        float(v_q),
        0.5 * float(v_pairs2),
        float(v_kv),
        0.5 * float(w_v_pairs2),
        float(w_v_kv),
        float(n_vf),
    )


@njit(cache=True)
def _attention(consts: FloatArray, P: float, D: float, pairs: float, pf_kv: float, dec_kv: float) -> FloatArray:
    """(prefill FLOPs, prefill bytes, decode FLOPs, decode bytes) of one layer's attention over these sums."""
    a, c = consts[A], consts[C]
    out = np.zeros(4)
    if consts[MLA] > 0.0:
        nh, lat, dv = consts[NH], consts[LAT] + consts[ROPE], consts[DV]
        qk = consts[NOPE] + consts[ROPE]
        # prefill, expanded: QK^T over query/key heads of d_nope + d_rope, PV over value heads of d_v; read Q, write
        # O, read the expanded K and V of every key once, write the new tokens' latent to the cache
        out[0] = 2.0 * nh * (qk + dv) * pairs
        out[1] = P * nh * (qk + dv) * a + pf_kv * nh * (qk + dv) * a + P * lat * c
        # decode, absorbed (MQA over the latent): QK^T over latent + rotary key, PV over the latent, for all heads;
        # one copy of each sequence's cached latent read for all heads, the new token's written
        out[2] = 2.0 * nh * (lat + consts[LAT]) * dec_kv
        out[3] = D * nh * (lat + consts[LAT]) * a + (D + dec_kv) * lat * c
        return out
    q, kv = consts[Q], consts[KV]
    # QK^T and PV, 2 x 2 x d FLOPs per (query head, key) pair summed over heads = 4 q pairs; read Q and write O, write
    # the chunk's K and V to the cache, read every K and V it attends to once
    out[0], out[1] = 4.0 * q * pairs, 2.0 * P * q * a + 2.0 * kv * c * (P + pf_kv)
    # decode: the same per pair; one query per sequence reads that sequence's whole KV cache
    out[2], out[3] = 4.0 * q * dec_kv, 2.0 * D * q * a + 2.0 * kv * c * (D + dec_kv)
    return out


@njit(cache=True)
def _verify_attention(consts: FloatArray, VQ: float, pairs: float, kv_read: float) -> tuple[float, float]:
    """(FLOPs, bytes) of one layer's attention over the verifications: ``VQ`` query tokens, their (query, key)
    pairs, the KV tokens they read (each sequence's context and its queries, once). Grouped-query attention as a
    prefill chunk is counted (the queries' pairs; Q read, O written, the sequence's K and V read once and the new
    ones written); MLA in the absorbed form its decodes take (vLLM runs a verification of up to 1 + k queries as a
    decode: ``reorder_batch_threshold``), per pair and reading one latent copy per sequence."""
    a, c = consts[A], consts[C]
    if consts[MLA] > 0.0:
        nh, lat = consts[NH], consts[LAT] + consts[ROPE]
        return 2.0 * nh * (lat + consts[LAT]) * pairs, VQ * nh * (lat + consts[LAT]) * a + (VQ + kv_read) * lat * c
    q, kv = consts[Q], consts[KV]
    return 4.0 * q * pairs, 2.0 * VQ * q * a + 2.0 * kv * c * (VQ + kv_read)


@njit(cache=True)
def kernel_work(
    consts: FloatArray, T: float, P: float, D: float, S: float, pf_pairs: float, pf_kv: float, dec_kv: float,
    w_pairs: float = 0.0, w_pf_kv: float = 0.0, w_dec_kv: float = 0.0, VQ: float = 0.0, v_pairs: float = 0.0,
    v_kv: float = 0.0, w_v_pairs: float = 0.0, w_v_kv: float = 0.0,
) -> FloatArray:  # fmt: skip
    """(FLOPs, bytes) of one instance of each kernel in ``KERNELS`` order, flattened; per GPU: the kernels that
    depend on the tokens alone (``token_work``) and those that depend on the shape (``shape_work``)."""
    out = np.zeros(2 * len(KERNELS))
    token_work(consts, T, out)
    shape_work(consts, P, D, S, pf_pairs, pf_kv, dec_kv, w_pairs, w_pf_kv, w_dec_kv, out, VQ, v_pairs, v_kv,
               w_v_pairs, w_v_kv)  # fmt: skip
    return out


# the kernels whose work is a function of the iteration's tokens T alone (``token_work``); the others (attention,
# MLA's expansions, the LM head) depend on how the tokens are split into prompts and decodes (``shape_work``)
BY_TOKENS = np.array([name not in ("attention_prefill", "attention_decode", "attention_prefill_window",
                                   "attention_decode_window", "mla_kv_up", "mla_absorb", "lm_head",
                                   "attention_verify", "attention_verify_window")
                      for name, _, _, _, _ in KERNELS])  # fmt: skip


@njit(cache=True)
def token_work(consts: FloatArray, T: float, out: FloatArray) -> None:
    """Into ``out`` (``kernel_work``'s layout): the (FLOPs, bytes) of the kernels of ``BY_TOKENS``, over T tokens."""
    h, q, inter = consts[H], consts[Q], consts[MLP]
    a, w = consts[A], consts[W]
    gated = consts[GATED] > 0.0
    act_flops = 5.0 if gated else 8.0  # per output element: SiLU (~4) x up, or GELU (tanh form, ~8); nominal
    act_io = 3.0 if gated else 2.0  # elements moved per output element: read gate, up; write out
    norm_flops = 4.0 * T * h  # residual add, square-accumulate, scale, weight multiply
    norm_bytes = 4.0 * T * h * a + h * a  # read input and residual, write both; weight vector
    # embedding: gather T rows of the table, write the hidden states
    out[0], out[1] = 0.0, 2.0 * T * h * a
    # norm (fused add + RMSNorm)
    out[2], out[3] = norm_flops, norm_bytes
    # qkv_proj: [T x H] @ [H x n] (+ bias); MLA adds the query's up-projection [T x q_lora] @ [q_lora x q]
    n_out, q_up = consts[QKV_N], consts[Q_UP]
    out[4] = 2.0 * T * (h * n_out + q_up * q)
    out[5] = (h * n_out + q_up * q) * w + (n_out * a if consts[BIAS] > 0.0 else 0.0)
    out[5] += T * (h + n_out + (q_up + q if q_up > 0.0 else 0.0)) * a
    # rope: rotate q and k in place (~3 FLOPs per element), read and write them (MLA: the rotary parts only)
    rot = consts[NH] * consts[ROPE] + consts[ROPE] if consts[MLA] > 0.0 else q + consts[KV]
    out[6], out[7] = 3.0 * T * rot, 2.0 * T * rot * a
    # o_proj: [T x o_in] @ [o_in x H]
    o_in = consts[O_IN]
    out[20], out[21] = 2.0 * T * o_in * h, o_in * h * w + T * (o_in + h) * a
    # dense MLP: gate and up side by side (or up alone), activation, down
    up = 2.0 * inter if gated else inter
    w_mlp = consts[W_MLP]
    out[22], out[23] = 2.0 * T * h * up, h * up * w_mlp + T * (h + up) * a
    out[24], out[25] = act_flops * T * inter, act_io * T * inter * a
    out[26], out[27] = 2.0 * T * inter * h, inter * h * w_mlp + T * (inter + h) * a
    if consts[MOE] > 0.0:
        e, k, e_local, moe_i = consts[E], consts[K], consts[E_LOCAL], consts[MOE_I]
        t_moe = T * consts[MOE_TOKENS]  # tokens the MoE layer takes on this GPU (all data-parallel ranks')
        # moe_router: [T x H] @ [H x E] on this rank's own tokens, in the activation format
        out[28], out[29] = 2.0 * T * h * e, (h * e + T * (h + e)) * a
        # moe_experts: the rows routed to this GPU's experts, gate/up, activation and down; the weights of the
        # distinct experts hit, read once (uniform routing, in expectation)
        rows = t_moe * k * e_local / e
        hit = e_local * (1.0 - (1.0 - k / e) ** t_moe)
        e_up = 2.0 * moe_i if gated else moe_i
        out[30] = 2.0 * rows * h * e_up + act_flops * rows * moe_i + 2.0 * rows * moe_i * h
        out[31] = hit * (h * e_up + moe_i * h) * consts[W_EXP] + rows * (2.0 * h + e_up + act_io * moe_i) * a
        out[31] += t_moe * h * a  # the gathered tokens read once
        # moe_shared: a dense MLP of the shared experts' width over this rank's tokens
        sh = consts[SH_I]
        if sh > 0.0:
            sh_up = 2.0 * sh if gated else sh
            out[32] = 2.0 * T * h * sh_up + act_flops * T * sh + 2.0 * T * sh * h
            out[33] = (h * sh_up + sh * h) * consts[W_SH] + T * (2.0 * h + sh_up + act_io * sh) * a
    # final_norm: once, over all T tokens
    out[34], out[35] = norm_flops, norm_bytes


@njit(cache=True)
def shape_work(
    consts: FloatArray, P: float, D: float, S: float, pf_pairs: float, pf_kv: float, dec_kv: float, w_pairs: float,
    w_pf_kv: float, w_dec_kv: float, out: FloatArray, VQ: float = 0.0, v_pairs: float = 0.0, v_kv: float = 0.0,
    w_v_pairs: float = 0.0, w_v_kv: float = 0.0,
) -> None:  # fmt: skip
    """Into ``out`` (``kernel_work``'s layout): the (FLOPs, bytes) of the kernels not in ``BY_TOKENS``; the
    verifications' attention (``VQ`` query tokens ...: ``shape_sums``) in their own kernels, their queries through
    MLA's absorption as decodes'."""
    h, vocab, a = consts[H], consts[V], consts[A]
    full = _attention(consts, P, D, pf_pairs, pf_kv, dec_kv)
    out[8], out[9], out[10], out[11] = full[0], full[1], full[2], full[3]
    windowed = _attention(consts, P, D, w_pairs, w_pf_kv, w_dec_kv)
    out[12], out[13], out[14], out[15] = windowed[0], windowed[1], windowed[2], windowed[3]
    if consts[MLA] > 0.0:
        nh, lat, nope, dv = consts[NH], consts[LAT], consts[NOPE], consts[DV]
        w = consts[W]
        # mla_kv_up: [K x latent] @ [latent x nh (d_nope + d_v)] over the K keys a prefill attends (its context and
        # itself); reads the cached latent, writes the expanded keys and values
        up = lat * nh * (nope + dv)
        out[16] = 2.0 * pf_kv * up
        out[17] = (up * w + pf_kv * (lat + consts[ROPE]) * consts[C] + pf_kv * nh * (nope + dv) * a) if P > 0.0 else 0.0
        # mla_absorb: per decode (or verification) query and head, [d_nope] @ [d_nope x latent] before attention and
        # [latent] @ [latent x d_v] after; W_UK and W_UV held in the activation format
        rows = D + VQ
        out[18] = 2.0 * rows * nh * lat * (nope + dv)
        out[19] = (nh * lat * (nope + dv) * a + rows * nh * (nope + 2.0 * lat + dv) * a) if rows > 0.0 else 0.0
    # lm_head: only the S sampled rows' hidden states, [S x H] @ [H x V/tp], unquantized
    out[36], out[37] = 2.0 * S * h * vocab, h * vocab * a + S * (h + vocab) * a
    if VQ > 0.0:  # attention_verify, attention_verify_window
        out[38], out[39] = _verify_attention(consts, VQ, v_pairs, v_kv)
        out[40], out[41] = _verify_attention(consts, VQ, w_v_pairs, w_v_kv)
