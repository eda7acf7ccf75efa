"""Seeded cases for the conformance check against vLLM's scheduler (``experiments.vllm_check.conformance``).

Each case draws a small workload and scheduler settings. The kinds cycle so that every few cases cover each feature
the check is for: chunked prefill with V1's one pass, KV pressure with recompute preemption, admission with and
without ``scheduler_reserve_full_isl``, ``long_prefill_token_threshold`` and its adaptive form, few seats
(``max_num_seqs``), prefix caching with shared prefixes and eviction, and V1 with chunked prefill off (ferry's
``continuous --mix-prefill-decode``), and conversations (later turns sent when the turn before has ended, their
prompts the conversation so far, with prefix caching). Arrivals are all at once, a Poisson process, or bursts.
"""

from __future__ import annotations

import numpy as np

from experiments.vllm_check.conformance import Case
from sim.workload.base import Workload
from sim.workload.prefixes import Prefixes
from sim.workload.sessions import multi_turn

BASE_KINDS = ("chunked", "kv_pressure", "no_full_isl", "threshold", "adaptive", "few_seats", "prefix", "no_chunking",
              "conversation")  # fmt: skip
# speculative decoding on top of a kind above (``_drafter``): the kind it builds on, by name
SPEC_KINDS = {"spec": "chunked", "spec_pressure": "kv_pressure", "spec_prefix": "prefix", "spec_dynamic": "few_seats",
              "spec_no_chunking": "no_chunking", "spec_draft_model": "chunked", "spec_threshold": "threshold",
              "spec_conversation": "conversation", "spec_padding": "chunked"}  # fmt: skip
KINDS = BASE_KINDS + tuple(SPEC_KINDS)
SPEC_METHODS = ("eagle", "eagle3", "mtp", "ngram", "draft_model")
RATES = (0.0, 0.2, 0.5, 0.7, 0.9, 1.0)


def _arrivals(rng: np.random.Generator, n: int) -> list[float]:
    style = rng.integers(3)
    if style == 0:
        return [0.0] * n
    if style == 1:  # Poisson, a few iterations apart (an iteration here is ~10-40 ms)
        gaps = rng.exponential(rng.choice([0.005, 0.02, 0.06]), n)
        return list(np.cumsum(gaps))
    bursts = np.sort(rng.choice([0.0, 0.05, 0.2], n))
    return [float(x) for x in bursts]


def one_case(kind: str, rng: np.random.Generator, name: str) -> Case:
    if kind in SPEC_KINDS:
        case = one_case(SPEC_KINDS[kind], rng, name)
        if kind == "spec_padding":  # one-token prompts arriving while others decode: vLLM pads them to 1 + k
            w = case.workload
            short = np.where(rng.random(len(w)) < 0.7, 1, w.prompt_tokens)
            short[0] = w.prompt_tokens[0]
            arrival = np.cumsum(rng.exponential(0.01, len(w)))
            case.workload = Workload(arrival, short.astype(np.int64), w.output_tokens)
        case.settings["speculative"] = _drafter(kind, rng, case.settings)
        case.name = f"{name}-{kind}"
        return case
    n = int(rng.integers(1, 13))
    block_size = int(rng.choice([16, 32]))
    prompt = [int(x) for x in rng.integers(1, 300, n)]
    output = [int(x) for x in rng.integers(1, 40, n)]
    longest = max(p + o for p, o in zip(prompt, output, strict=True))
    max_model_len = -(-longest // block_size) * block_size
    need = max_model_len // block_size + 1  # one request of the longest fits; vLLM keeps one block as its null block
    total = sum(-(-(p + o) // block_size) for p, o in zip(prompt, output, strict=True)) + 1
    settings: dict = {
        "max_num_seqs": int(rng.integers(2, 17)),
        "max_num_batched_tokens": int(rng.choice([32, 64, 128, 256, 512])),
        "block_size": block_size,
        "max_model_len": max_model_len,
        "num_gpu_blocks": int(rng.integers(need, max(need, total) + 2)),
        "scheduler_reserve_full_isl": True,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": False,
        "long_prefill_token_threshold": 0,
        "long_prefill_token_threshold_adaptive": False,
    }
    groups: list[int] = []
    prefix_len = 0
    if kind == "kv_pressure":
        settings["num_gpu_blocks"] = int(rng.integers(need, need + max(2, (total - need) // 3) + 1))
        settings["scheduler_reserve_full_isl"] = bool(rng.integers(2))
    elif kind == "no_full_isl":
        settings["scheduler_reserve_full_isl"] = False
    elif kind in ("threshold", "adaptive"):
        settings["long_prefill_token_threshold"] = int(
            rng.integers(1, min(settings["max_num_batched_tokens"], max_model_len))
        )
        settings["long_prefill_token_threshold_adaptive"] = kind == "adaptive"
    elif kind == "few_seats":
        settings["max_num_seqs"] = int(rng.integers(1, 4))
    elif kind == "prefix":
        settings["enable_prefix_caching"] = True
        prefix_len = int(rng.integers(1, 5)) * block_size + int(rng.integers(0, block_size))
        groups = [int(g) for g in rng.integers(-1, int(rng.integers(1, 4)), n)]
        prompt = [p + (prefix_len if g >= 0 else 0) for p, g in zip(prompt, groups, strict=True)]
        longest = max(p + o for p, o in zip(prompt, output, strict=True))
        settings["max_model_len"] = max_model_len = -(-longest // block_size) * block_size
        need = max_model_len // block_size + 1
        total = sum(-(-(p + o) // block_size) for p, o in zip(prompt, output, strict=True)) + 1
        settings["num_gpu_blocks"] = int(rng.integers(need, max(need, total) + 2))
    elif kind == "no_chunking":
        settings["enable_chunked_prefill"] = False
        settings["max_num_batched_tokens"] = max(settings["max_num_batched_tokens"], max_model_len)
    arrival = np.asarray(_arrivals(rng, n), dtype=np.float64)
    prefixes = None
    if prefix_len:
        shared = [g for g in groups if g >= 0]
        offsets = np.concatenate([[0], np.cumsum([g >= 0 for g in groups])]).astype(np.int64)
        prefixes = Prefixes(np.asarray(shared, dtype=np.int64), np.full(len(shared), prefix_len, np.int64), offsets)
    workload = Workload(arrival, np.asarray(prompt, np.int64), np.asarray(output, np.int64), prefixes=prefixes)
    if kind == "conversation":
        settings["enable_prefix_caching"] = True
        turns = int(rng.integers(2, 4))
        workload = multi_turn(workload, turns, float(rng.choice([0.0, 0.02])), "uniform:1:60", "uniform:1:20", rng)
        longest = int((workload.prompt_tokens + workload.output_tokens).max())
        settings["max_model_len"] = max_model_len = -(-longest // block_size) * block_size
        need = max_model_len // block_size + 1
        total = int((-(-(workload.prompt_tokens + workload.output_tokens) // block_size)).sum()) + 1
        settings["num_gpu_blocks"] = int(rng.integers(need, max(need, total) + 2))
    return Case(f"{name}-{kind}", settings, workload)


def _drafter(kind: str, rng: np.random.Generator, settings: dict) -> dict:
    """A drafter for a speculative kind: its method (a draft model's for ``spec_draft_model``), 1-5 drafts, per-position
    unconditional rates (non-increasing, now and then all accepted or none), the seed of the draws; a draft count by
    batch size for ``spec_dynamic``; now and then EAGLE's block drop turned off. A chunk cap below ``1 + k`` is raised
    to it (vLLM asserts when the cap cuts a request it pads with placeholders)."""
    method = "draft_model" if kind == "spec_draft_model" else str(rng.choice(SPEC_METHODS))
    k = 1 if method == "mtp" else int(rng.integers(1, 6))  # (ferry models one MTP module)
    style = rng.integers(5)
    if style == 0:
        rates = [1.0] * k
    elif style == 1:
        rates = [0.0] * k
    else:
        rates = sorted((float(x) for x in rng.choice(RATES, k)), reverse=True)
    out: dict = {"method": method, "num_speculative_tokens": k, "rates": rates, "seed": int(rng.integers(0, 1000))}
    if kind == "spec_dynamic":
        cut = int(rng.integers(1, max(2, settings["max_num_seqs"])))
        out["num_speculative_tokens_per_batch_size"] = [[1, cut, k], [cut + 1, 64, int(rng.integers(0, k + 1))]]
    if method in ("eagle", "eagle3", "mtp") and rng.integers(4) == 0:
        out["disable_eagle_block_drop"] = True
    if settings["long_prefill_token_threshold"]:
        settings["long_prefill_token_threshold"] = max(settings["long_prefill_token_threshold"], k + 1)
    settings["max_num_batched_tokens"] = max(settings["max_num_batched_tokens"], settings["max_num_seqs"] + 1)
    return out


def generate(count: int, seed: int = 0) -> list[Case]:
    """``count`` cases, the kinds in turn, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return [one_case(KINDS[i % len(KINDS)], rng, f"{seed}.{i}") for i in range(count)]
