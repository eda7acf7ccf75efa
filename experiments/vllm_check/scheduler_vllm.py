"""Drive vLLM's own V1 ``Scheduler`` through cases, with no model: runs in the vLLM venv, imports vLLM, never ferry.

    .venv-vllm/bin/python experiments/vllm_check/scheduler_vllm.py CASES.json OUT.json

A case (JSON, written by ``experiments.vllm_check.conformance``) names the scheduler's settings, the requests (token
ids, ``max_tokens``, and the step before which each is added, as its arrival), and how many steps to run. Each step
is ``Scheduler.schedule()`` then an output with one sampled token for every request whose prompt (or recompute) is
complete after the step, then ``update_from_output``: what vLLM's own tests do (``tests/v1/core/utils.py``
``create_scheduler``, ``tests/v1/core/test_scheduler.py``). The scheduler is built the way ``vllm serve`` builds it
(``VllmConfig`` from a local ``config.json``, a ``KVCacheConfig`` of ``num_gpu_blocks`` blocks of one full-attention
group), so the block pool keeps its null block as vLLM does.

With speculative decoding (a case's ``speculative`` settings) the scheduler is built with vLLM's
``SpeculativeConfig`` (an n-gram one, its ``method`` then set to the case's, which is what the scheduler and the KV
cache manager read: lookahead slots, a draft model's input slot, EAGLE's dropped block); each step's output then holds,
for a request verified with draft tokens, the drafts accepted and one more, the accepted count drawn as ferry draws it
(``accepted``: the same hash of the case's seed, the request, its output tokens so far and the position, against the
conditional rates; placeholders, vLLM's ``-1`` drafts, never accepted), and after ``update_from_output`` the drafter's
proposals are handed to ``update_draft_token_ids`` as the model runner hands them: ``num_spec_tokens_to_schedule``
drafts for every request of the step (vLLM ignores those of a request still prefilling or finished).

For every step it writes what vLLM scheduled, in the order it scheduled it: ``[request, tokens, computed before, draft
tokens]`` (computed before includes a prefix-cache hit taken at admission), the requests preempted, the blocks in use
(the pool's, less its null block; blocks cached but free count as free, as vLLM counts them), and the requests
finished.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("PYTHONHASHSEED", "0")

import torch  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.spec_decode.utils import unconditional_to_conditional_rates  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

# a Llama-shaped config.json: the scheduler reads only lengths and the architecture from it (no weights are loaded)
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "vocab_size": 2_000_000,
    "max_position_embeddings": 1 << 20,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
}

_hash_ready = False


def build(settings: dict[str, Any], model_dir: Path) -> Scheduler:
    """vLLM's scheduler with ``settings`` (vLLM's own names) over a cache of ``num_gpu_blocks`` blocks."""
    chunked = bool(settings.get("enable_chunked_prefill", True))
    scheduler_config = SchedulerConfig(
        max_num_seqs=settings["max_num_seqs"],
        max_num_batched_tokens=settings["max_num_batched_tokens"],
        max_model_len=settings["max_model_len"],
        long_prefill_token_threshold=settings.get("long_prefill_token_threshold", 0),
        long_prefill_token_threshold_adaptive=settings.get("long_prefill_token_threshold_adaptive", False),
        enable_chunked_prefill=chunked,
        scheduler_reserve_full_isl=settings.get("scheduler_reserve_full_isl", True),
        is_encoder_decoder=False,
    )
    model_config = ModelConfig(
        model=str(model_dir),
        dtype="float32",
        seed=0,
        skip_tokenizer_init=True,
        max_model_len=settings["max_model_len"],
    )
    block_size = settings["block_size"]
    cache_config = CacheConfig(
        block_size=block_size,
        enable_prefix_caching=bool(settings.get("enable_prefix_caching", False)),
    )
    speculative: dict[str, Any] = settings.get("speculative") or {}
    spec_config = None
    if speculative:
        spec_config = SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=speculative["num_speculative_tokens"],
            num_speculative_tokens_per_batch_size=speculative.get("num_speculative_tokens_per_batch_size"),
            disable_eagle_block_drop=bool(speculative.get("disable_eagle_block_drop", False)),
            target_model_config=model_config,
            target_parallel_config=ParallelConfig(),
        )
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        speculative_config=spec_config,
    )
    if spec_config is not None:  # the drafter the case names: what the scheduler and KV cache manager read of it
        object.__setattr__(spec_config, "method", speculative["method"])
    blocks = settings["num_gpu_blocks"]
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_config = KVCacheConfig(
        num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    cache_config.num_gpu_blocks = blocks
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_config,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
    )


def make_request(spec: dict[str, Any], block_size: int) -> Request:
    """A request as vLLM's engine makes one: greedy, ``ignore_eos``, block hashes by SHA-256 (prefix caching)."""
    global _hash_ready
    if not _hash_ready:
        init_none_hash(sha256)
        _hash_ready = True
    params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True, temperature=0.0)
    return Request(
        request_id=str(spec["id"]),
        prompt_token_ids=list(spec["prompt"]),
        sampling_params=params,
        pooling_params=None,
        arrival_time=float(spec.get("arrival", 0.0)),
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def uniform(seed: int, req: int, generated: int, j: int) -> float:
    """ferry's draw (``sim/kernels/speculation.py``, ``uniform``): splitmix64's finaliser chained over the keys."""
    z = _mix(seed & MASK)
    for part in (req, generated, j):
        z = _mix(z ^ (part & MASK))
    return (z >> 11) * 2.0**-53


def accepted(speculative: dict[str, Any], req: int, generated: int, drafts: list[int]) -> int:
    """Drafts accepted of ``drafts`` for ``req`` at output token ``generated``: the leading positions whose draw is
    below their conditional rate (from the case's unconditional ones, as vLLM's synthetic sampler converts them);
    none of placeholders (``-1``)."""
    if not drafts or drafts[0] < 0:
        return 0
    rates, seed = unconditional_to_conditional_rates(speculative["rates"]), int(speculative["seed"])
    n = 0
    while n < len(drafts) and uniform(seed, req, generated, n) < rates[n]:
        n += 1
    return n


def used_blocks(scheduler: Scheduler) -> int:
    """Blocks requests hold (cached blocks nobody holds are free, as vLLM counts them), less the null block."""
    pool = scheduler.kv_cache_manager.block_pool
    return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()


def run_case(case: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    """Every step of one case, as vLLM's scheduler took it."""
    settings = case["settings"]
    scheduler = build(settings, model_dir)
    by_step: dict[int, list[dict[str, Any]]] = {}
    for spec in case["requests"]:
        by_step.setdefault(int(spec["add_before_step"]), []).append(spec)
    steps: list[dict[str, Any]] = []
    outputs = {str(spec["id"]): spec["output"] for spec in case["requests"]}
    speculative = settings.get("speculative")
    finished_at: dict[str, int] = {}  # request -> its place in the order vLLM reported requests finished
    for step in range(int(case["steps"])):
        # in the order they arrive; a conversation's turns sent at one instant in the order the turns before ended
        due = sorted(
            by_step.get(step, []), key=lambda r: (r["arrival"], finished_at.get(str(r.get("after")), -1), int(r["id"]))
        )
        for spec in due:
            scheduler.add_request(make_request(spec, settings["block_size"]))
        out = scheduler.schedule()
        scheduled = []
        sampled: dict[str, list[int]] = {}
        for req_id, n in out.num_scheduled_tokens.items():
            req = scheduler.requests[req_id]
            drafts = list(out.scheduled_spec_decode_tokens.get(req_id, []))
            scheduled.append([req_id, int(n), int(req.num_computed_tokens) - int(n), len(drafts)])
            # the next of the tokens the case gives it (a conversation's next turn starts with them), and as many
            # more as drafts were accepted (past its last, any: vLLM stops it at max_tokens)
            done = req.num_computed_tokens >= req.num_tokens
            take = 1 + (accepted(speculative, int(req_id), req.num_output_tokens, drafts) if speculative else 0)
            given = outputs[req_id][req.num_output_tokens : req.num_output_tokens + take]
            sampled[req_id] = given + [1] * (take - len(given)) if done else []
        preempted = sorted(getattr(out, "preempted_req_ids", None) or [])
        ids = list(out.num_scheduled_tokens)
        runner = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[sampled[r] for r in ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )
        blocks = used_blocks(scheduler)
        engine_outputs = scheduler.update_from_output(out, runner)
        if speculative and ids:  # the drafter proposes for every request of the step (vLLM keeps what it may)
            k = int(out.num_spec_tokens_to_schedule)
            proposals = []
            for r in ids:
                req = scheduler.requests.get(r)
                g = req.num_output_tokens if req is not None else 0
                proposals.append([outputs[r][g + j] if g + j < len(outputs[r]) else 1 for j in range(k)])
            scheduler.update_draft_token_ids(DraftTokenIds(ids, proposals))
        ended = [o.request_id for eo in engine_outputs.values() for o in eo.outputs if o.finish_reason is not None]
        for req_id in ended:
            finished_at[req_id] = len(finished_at)
        finished = sorted(ended)
        steps.append({"scheduled": scheduled, "preempted": preempted, "kv_blocks_used": blocks, "finished": finished})
    left = [r for r in scheduler.requests]
    return {"steps": steps, "unfinished": sorted(left)}


def main(argv: list[str]) -> int:
    cases = json.loads(Path(argv[1]).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        (model_dir / "config.json").write_text(json.dumps(CONFIG))
        results = [run_case(case, model_dir) for case in cases]
    Path(argv[2]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
