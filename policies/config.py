"""Scheduler settings users write (command-line flags or YAML), with vLLM's names where vLLM has the knob.

Fields left unset here take fixed fallbacks (``token_budget``, ``seq_limit``); a run (``experiments.runner.simulation``)
first fills them with what a default ``vllm serve`` picks on its device (``policies.vllm_defaults``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, model_validator

CHUNKED_ORDERS = ("vllm", "decodes-first")  # chunked: the order running requests take their tokens
DEFAULT_MAX_NUM_SEQS = 256  # without a device (vLLM V0's default)

# the settings only some built-in policies read (a user's own policy may read any): a run that sets one for another
# policy is refused rather than silently ignored
APPLIES_TO: dict[str, tuple[str, ...]] = {
    "max_num_seqs": ("continuous", "chunked"),
    "max_num_batched_tokens": ("continuous", "chunked"),
    "mix_prefill_decode": ("continuous",),
    "long_prefill_token_threshold": ("chunked",),
    "long_prefill_token_threshold_adaptive": ("chunked",),
    "cap_lone_prefill": ("chunked",),
    "scheduler_reserve_full_isl": ("chunked",),
    "chunked_order": ("chunked",),
    "max_batch_size": ("static", "dynamic"),
    "max_delay_ms": ("dynamic",),
    "preferred_batch_sizes": ("dynamic",),
    "kv_reservation": ("static", "dynamic", "continuous", "chunked"),
    "kv_watermark": ("continuous", "chunked"),  # a run setting: only paged admission keeps a watermark
    "vllm_defaults": ("continuous", "chunked"),  # a run setting: vLLM has no static or dynamic batching
    "enable_prefix_caching": ("continuous", "chunked"),  # a run setting: only paged admission looks up prefixes
}


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    return value


Number = Annotated[float, BeforeValidator(_no_bool)]  # a float that is not a bool (true would be 1.0); "inf" is fine
BUILTIN_POLICIES = ("none", "static", "dynamic", "continuous", "chunked")
# the policies with per-iteration limits (max_num_seqs, a token budget: vLLM's start-up checks and defaults apply),
# and those that carry whole batches reserved up front
ITERATION_LIMITED = APPLIES_TO["max_num_seqs"]
WHOLE_BATCHES = APPLIES_TO["max_batch_size"]


class SchedulerConfig(BaseModel):
    """Limits and knobs of the batching policies. Each policy reads the fields it needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = Field(
        "chunked",
        description="policy name (see `policies.names()`) or 'module:Class'; chunked: what `vllm serve` runs (V1, "
        "chunked prefill)",
    )
    max_model_len: StrictInt = Field(4096, ge=1, description="max prompt + output tokens of one request (tokens)")
    max_num_seqs: StrictInt | None = Field(
        None,
        ge=1,
        description="max sequences in one iteration (continuous, chunked); default vLLM's for the device, or 256 "
        "capped at max_num_batched_tokens",
    )
    max_num_batched_tokens: StrictInt | None = Field(
        None,
        ge=1,
        description="max tokens in one iteration; default 2048 for chunked, max(max_model_len, 2048) otherwise",
    )
    long_prefill_token_threshold: StrictInt = Field(
        0, ge=0, description="chunked: cap on one request's prefill chunk per iteration (tokens; 0 = no cap)"
    )
    mix_prefill_decode: StrictBool = Field(
        False, description="continuous: let prefills and decodes share an iteration (default: prefill-priority)"
    )
    long_prefill_token_threshold_adaptive: StrictBool = Field(
        False,
        description="chunked: floor long_prefill_token_threshold at max_num_batched_tokens / the requests running "
        "and waiting (vLLM >= 0.31.0's long_prefill_token_threshold_adaptive)",
    )
    cap_lone_prefill: StrictBool | None = Field(
        None,
        description="chunked: long_prefill_token_threshold caps a request even when it is the only one running or "
        "waiting (vLLM before 0.31.0); default: as the --vllm-defaults release does",
    )
    scheduler_reserve_full_isl: StrictBool = Field(
        True,
        description="chunked: admit a waiting request only if its whole prompt would fit in the free KV cache "
        "(vLLM's scheduler_reserve_full_isl); False: only its first chunk must fit (older vLLM V1 releases)",
    )
    chunked_order: Literal["vllm", "decodes-first"] = Field(
        "vllm",
        description="chunked: vllm = one pass over the running requests in admission order, decodes and unfinished "
        "prefills interleaved (vLLM V1); decodes-first = every decode, then unfinished prefills (Sarathi-Serve)",
    )
    max_batch_size: StrictInt = Field(8, ge=1, description="static, dynamic: passengers per boat (requests)")
    max_delay_ms: Number = Field(
        0.0,
        ge=0,
        description="dynamic: longest the oldest queued request waits for a fuller batch (ms; Triton's "
        "max_queue_delay_microseconds / 1000, default 0: leave at once)",
    )
    preferred_batch_sizes: tuple[StrictInt, ...] = Field(
        (),
        description="dynamic: batch sizes that leave at once when the queue reaches them, the largest first (Triton; "
        "none given means max_batch_size)",
    )
    kv_reservation: Literal["paged", "output", "max_model_len"] | None = Field(
        None,
        description="KV a request gets when admitted: paged (blocks as it grows; preempt when full), output (its "
        "prompt + output up front: an oracle that knows when generation stops) or max_model_len (that many tokens up "
        "front: an engine that must plan for the longest answer). Default: paged, but output for static and dynamic, "
        "which cannot grow a batch's memory",
    )

    @model_validator(mode="after")
    def _check(self) -> SchedulerConfig:
        for size in self.preferred_batch_sizes:
            if not 1 <= size <= self.max_batch_size:
                raise ValueError(
                    f"preferred_batch_sizes entry {size} must be between 1 and max_batch_size={self.max_batch_size}"
                )
        if self.policy in WHOLE_BATCHES and self.kv_reservation == "paged":
            raise ValueError(
                f"kv_reservation=paged: {self.policy} batching reserves each member's KV up front; "
                "choose output or max_model_len"
            )
        if (
            self.policy == "continuous"
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is smaller than max_model_len="
                f"{self.max_model_len}: without chunked prefill a whole prompt must fit in one iteration "
                "(raise max_num_batched_tokens, lower max_model_len, or use --policy chunked)"
            )
        if self.long_prefill_token_threshold_adaptive and self.long_prefill_token_threshold == 0:
            raise ValueError(
                "long_prefill_token_threshold_adaptive=true floors long_prefill_token_threshold, which is 0 (no "
                "cap): give --long-prefill-token-threshold too"
            )
        if self.policy in ITERATION_LIMITED and self.token_budget < self.seq_limit:
            # vLLM refuses to start: SchedulerConfig.verify_max_model_len (vllm/config/scheduler.py)
            raise ValueError(
                f"max_num_batched_tokens={self.token_budget} must be greater than or equal to max_num_seqs="
                f"{self.seq_limit}: an iteration must have room for one token of every running sequence "
                "(vLLM refuses to start with these)"
            )
        return self

    @property
    def reservation(self) -> str:
        """The resolved ``kv_reservation``."""
        if self.kv_reservation is not None:
            return self.kv_reservation
        return "output" if self.policy in WHOLE_BATCHES else "paged"

    @property
    def token_budget(self) -> int:
        """Tokens one iteration may compute (the resolved ``max_num_batched_tokens``)."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return 2048 if self.policy == "chunked" else max(self.max_model_len, 2048)

    @property
    def seq_limit(self) -> int:
        """Sequences one iteration may hold (the resolved ``max_num_seqs``): when unset, 256 capped at the token
        budget, as vLLM caps a default ``max_num_seqs`` at ``max_num_batched_tokens``."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return min(DEFAULT_MAX_NUM_SEQS, self.token_budget)
