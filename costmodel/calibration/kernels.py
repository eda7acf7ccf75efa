"""The torch kernels one LLM iteration is made of: what the real executor runs and what calibration times.

One place, so that ``ferry calibrate`` measures exactly what ``ferry validate``'s executor executes. Each function is
one of the cost model's kernels (``costmodel.roofline.KERNELS``), named as there:

- ``embedding``: gather T rows of the embedding table;
- ``add_rms_norm``: residual add fused with RMSNorm (vLLM's ``fused_add_rms_norm``; ``norm`` and ``final_norm``);
- ``linear``: ``x @ W^T`` (+ bias): ``qkv_proj``, ``o_proj``, ``mlp_gate_up``, ``mlp_down``, ``lm_head``;
- ``rope``: rotary position embedding of the query and key heads together (complex-pair form);
- ``silu_mul``: SiLU(gate) * up (``mlp_act``);
- ``prefill_attention``: one prompt chunk of n new tokens on top of c cached ones: writes the chunk's K and V into
  its sequence's cache slot, then attends causally with bottom-right alignment (query i sees keys 0..c+i);
- ``decode_attention``: one new token for each of B sequences: writes the B new K/V entries, then attends each query
  to its own sequence's cache (gathered into a padded batch with a length mask: one call per layer, like a paged
  attention kernel, at the cost of padding to the longest context).

The KV cache of one layer is a pair of tensors ``[slots, kv_heads, max_len, head_dim]``: a sequence owns a slot.
Attention uses ``torch.nn.functional.scaled_dot_product_attention``, which dispatches to FlashAttention or
memory-efficient kernels on CUDA and to its fused CPU kernel on the CPU.

torch is imported lazily: the rest of ferry works without it (``pip install .[calibrate]`` brings it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

INSTALL_HINT = "this command runs real kernels and needs PyTorch: pip install 'ferry[calibrate]' (or pip install torch)"

TORCH_DTYPES = ("float32", "bfloat16", "float16")


def require_torch() -> Any:
    """The torch module; ValueError with the install hint when it is missing."""
    try:
        import torch
    except ModuleNotFoundError:
        raise ValueError(INSTALL_HINT) from None
    return torch


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a canonical float format name (``costmodel.dtypes``)."""
    th = require_torch()
    if name not in TORCH_DTYPES:
        raise ValueError(f"dtype {name!r}: the kernels run in {', '.join(TORCH_DTYPES)}")
    dtype: torch.dtype = getattr(th, name)
    return dtype


def device_of(spec: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:i`` as a torch device; ValueError when it is not available here."""
    torch = require_torch()
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise ValueError(f"--device {spec!r}: {exc}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {spec!r}: torch sees no CUDA device (torch {torch.__version__})")
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ValueError(f"--device {spec!r}: only {torch.cuda.device_count()} CUDA device(s) visible")
        device = torch.device("cuda", index)
    elif device.type != "cpu":
        raise ValueError(f"--device {spec!r}: choose cpu, cuda or cuda:INDEX")
    return device


def synchronize(device: torch.device) -> None:
    """Wait until every kernel queued on ``device`` has finished (a no-op on the CPU, which runs synchronously)."""
    if device.type == "cuda":
        require_torch().cuda.synchronize(device)


# ---- token-parallel kernels ------------------------------------------------------------------------------------------


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` ([T], int64) of ``table`` ([V, H]): [T, H]."""
    return require_torch().nn.functional.embedding(ids, table)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` [T, K] times ``weight`` [N, K] transposed (+ ``bias`` [N]): [T, N].

    On the CPU a single row runs as a two-row product: BLAS libraries (MKL here) turn a one-row GEMM into a
    matrix-vector kernel that streams the weights about twice as fast as their GEMM does at 2 to 16 rows, a step in
    time between one and two tokens that no roofline curve follows. One GEMM path for every token count keeps the
    executor's cost a smooth function of its shape (at the price of a slower single-sequence decode), as real engines
    pad small batches to a few captured sizes."""
    torch = require_torch()
    if x.shape[0] == 1 and x.device.type == "cpu":
        return torch.nn.functional.linear(x.expand(2, -1), weight, bias)[:1]
    return torch.nn.functional.linear(x, weight, bias)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream ``x + residual`` (``x`` alone in the first layer), and its RMSNorm times ``weight``:
    returns (normalised, new residual), both [T, H]."""
    torch = require_torch()
    residual = x if residual is None else x + residual
    return torch.nn.functional.rms_norm(residual, (residual.shape[-1],), weight, eps), residual


def rope_tables(max_len: int, head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """The rotation of each position: ``exp(i p theta^(-2j/d))`` for position p < max_len and pair j < d/2, a
    [max_len, d/2] complex64 table (RoFormer; the interleaved-pair form of Meta's Llama code)."""
    torch = require_torch()
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    return torch.polar(torch.ones_like(angles), angles).to(device, torch.complex64)


def rope(qk: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """Rotate the query and key heads of each token, ``qk`` [T, heads, d] (queries and keys side by side, one call),
    by its position's ``rotation`` [T, d/2] (rows of ``rope_tables``): element pairs (2j, 2j+1) are multiplied as
    complex numbers. Returns a new [T, heads, d] tensor (3 FLOPs and 2 element moves per element, as the cost model
    counts). float32 multiplies as complex64 in one kernel; 16-bit formats (no complex type) in real arithmetic."""
    torch = require_torch()
    t, heads, d = qk.shape
    pairs = qk.unflatten(-1, (d // 2, 2))
    rot = rotation[:, None, :]
    if qk.dtype == torch.float32:
        return torch.view_as_real(torch.view_as_complex(pairs) * rot).view(t, heads, d)
    c, s = rot.real.to(qk.dtype), rot.imag.to(qk.dtype)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).view(t, heads, d)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up, with ``gate_up`` [T, 2I] holding gate then up side by side: [T, I]."""
    torch = require_torch()
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely next token of each row of ``logits`` [S, V]: [S] (greedy sampling)."""
    return logits.argmax(dim=-1)


# ---- attention ---------------------------------------------------------------------------------------------------


def kv_cache(
    slots: int, kv_heads: int, max_len: int, head_dim: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's K and V cache, ``[slots, kv_heads, max_len, head_dim]`` each, zeroed (a decode batch reads past
    the shorter sequences' ends, masked out: those entries must hold finite numbers)."""
    torch = require_torch()
    shape = (slots, kv_heads, max_len, head_dim)
    return torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype)


def prefill_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot: int,
    ctx: int,
) -> torch.Tensor:
    """Attention of one prompt chunk: ``q`` [n, Hq, d], its new ``k``/``v`` [n, Hkv, d] (written into ``slot`` at
    positions ctx..ctx+n-1), against the ``ctx`` cached tokens and itself, causal with bottom-right alignment.
    Returns [n, Hq, d]."""
    torch = require_torch()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    n = q.shape[0]
    end = ctx + n
    k_cache[slot, :, ctx:end] = k.transpose(0, 1)
    v_cache[slot, :, ctx:end] = v.transpose(0, 1)
    keys = k_cache[slot, :, :end].unsqueeze(0)  # [1, Hkv, c + n, d]
    values = v_cache[slot, :, :end].unsqueeze(0)
    query = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, n, d]
    gqa = q.shape[1] != k.shape[1]
    if ctx == 0:
        out = sdpa(query, keys, values, is_causal=True, enable_gqa=gqa)
    else:
        out = sdpa(query, keys, values, attn_mask=_lower_right(n, end, q.device), enable_gqa=gqa)
    return out[0].transpose(0, 1)


def _lower_right(n: int, total: int, device: torch.device) -> Any:
    """Causal mask of n queries over ``total`` keys, aligned at the bottom right: query i sees keys 0..total-n+i."""
    try:
        from torch.nn.attention.bias import causal_lower_right
    except ImportError:  # older torch: an explicit boolean mask (True = attend)
        torch = require_torch()
        return torch.ones(n, total, dtype=torch.bool, device=device).tril(total - n)
    return causal_lower_right(n, total)


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    max_position: int,
) -> torch.Tensor:
    """Attention of one new token per sequence: ``q`` [B, Hq, d] and new ``k``/``v`` [B, Hkv, d] of the sequences
    in cache ``slots`` [B] at ``positions`` [B] (their cached token counts); ``max_position`` is ``positions.max()``
    (given by the caller, who knows it on the host). Each query sees its own sequence's keys 0..position.
    Returns [B, Hq, d]."""
    torch = require_torch()
    k_cache[slots, :, positions] = k
    v_cache[slots, :, positions] = v
    length = max_position + 1
    keys = k_cache[:, :, :length].index_select(0, slots)  # [B, Hkv, length, d]: each sequence's cache, padded
    values = v_cache[:, :, :length].index_select(0, slots)
    mask = torch.arange(length, device=q.device)[None, :] <= positions[:, None]  # [B, length]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2), keys, values, attn_mask=mask[:, None, None, :], enable_gqa=q.shape[1] != k.shape[1]
    )
    return out[:, :, 0]
