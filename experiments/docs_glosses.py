"""One line for each key and column `ferry run` and `ferry sweep` write, for ``docs/reference/outputs.md``
(``experiments.docs_reference`` lists the keys from real runs and takes each one's line from here; a key missing here
stops it, so that a new key ships with its line). ``iterations.csv``'s lines are the comments beside
``sim.records.ITERATION_COLUMNS``. Units are in the names: ``_s`` seconds, ``_ms`` milliseconds, ``_bytes`` bytes."""

from __future__ import annotations

STATS = {"mean": "mean", "median": "median", "std": "standard deviation", "p90": "90th percentile",
         "p99": "99th percentile", "p50": "median"}  # fmt: skip
METRICS = {
    "ttft": "time to first token, as the client received it",
    "tpot": "time per output token after the first, (E2EL - TTFT) / (output - 1), as `vllm bench serve` computes it",
    "itl": "gap between two tokens the client received (every gap of every request, pooled)",
    "e2el": "end-to-end latency, arrival to the last token received",
    "queueing": "wait from arrival until first scheduled",
    "server_ttft": "time to first token, as the server made it",
    "server_tpot": "time per output token after the first, as the server made them",
    "server_itl": "gap between two tokens as the server made them",
    "ttft_hit": "time to first token of the requests that found part of their prompt in the prefix cache",
    "ttft_miss": "time to first token of the requests that found none of it",
}
# (pattern, template): a key that matches takes the template, filled with the pattern's groups' words
FAMILIES = [
    (r"(?P<stat>mean|median|std|p90|p99)_(?P<metric>[a-z0-9_]+?)_ms", "{stat} of the {metric} (ms)"),
]


def family_words(stat: str, metric: str) -> dict[str, str]:
    return {"stat": STATS[stat], "metric": METRICS[metric]}


SUMMARY = {
    "duration": "seconds from the benchmark's start (t = 0, the workload's origin) to the last response or iteration",
    "completed": "requests that finished",
    "failed": "requests rejected (`rejected_by_reason` says why)",
    "total_input_tokens": "prompt tokens of the finished requests",
    "total_output_tokens": "output tokens of the finished requests",
    "request_throughput": "finished requests per second of `duration`",
    "output_throughput": "output tokens per second of `duration`",
    "total_token_throughput": "prompt and output tokens per second of `duration`",
    "request_goodput": "finished requests meeting every `--goodput` SLO (value <= SLO), per second of `duration`",
    "goodput_slos_ms": "the `--goodput` SLOs, metric to milliseconds",
    "request_goodput_per_gpu": "`request_goodput` divided by the GPUs of both pools",
    "mean_normalized_latency_ms": "mean of each request's E2EL divided by its output tokens (the vLLM paper's measure)",
    "rejected_by_reason": "rejected requests by reason (`empty`, `exceeds_max_model_len`, `exceeds_kv_cache`, ...)",
    "num_iterations": "iterations run (all replicas)",
    "gpu_busy_s": "seconds an iteration was running, summed over replicas",
    "gpu_idle_s": "seconds no iteration was running: the gaps between iterations, summed over replicas",
    "gpu_idle_fraction": "`gpu_idle_s` over the GPU-time of the run",
    "idle_while_waiting_s": "seconds with no iteration running while a request waited in the queue",
    "seats_offered": "seats the policy offers (`max_num_seqs`, `max_batch_size`, 1 for `none`)",
    "seat_utilization": "share of the offered seats held by requests still generating, averaged over busy time",
    "held_seat_fraction": "share of the offered seats held by finished requests until their batch ends "
    "(static, dynamic)",
    "mean_batch_size": "sequences per iteration (prefilling and decoding), mean",
    "mean_tokens_per_iteration": "tokens computed per iteration (prompt tokens plus one per decode), mean",
    "kv_cache_blocks": "KV-cache blocks of a replica (`num_gpu_blocks`)",
    "kv_block_size": "tokens per KV-cache block",
    "peak_kv_usage": "largest share of the KV cache's blocks in use in any iteration",
    "mean_kv_usage": "share of the KV cache's blocks in use, weighted by each iteration's time",
    "total_preemptions": "preemptions by recompute (a running request sent back to the queue, its KV dropped)",
    "preempted_requests": "requests preempted at least once",
    "recomputed_tokens": "tokens computed again after preemptions",
    "overload": "null, or how arrivals outran the replica over the second half of the arrivals: `arrival_rate`, "
    "`finished_rate`, `backlog_growth_per_s` (requests/s), `backlog_at_last_arrival` (requests), `sustained_rate` "
    "(requests finished per busy second: what the replica sustains on this workload)",
    "itl_kept": "`exact` (every token gap kept) or the histogram the ITL statistics were read from (beyond 20M gaps)",
    "stream": "true: each token reaches the client as it is made; false: the whole response when the request gives "
    "back its seat",
    "engine": "the simulator loop that ran: `reference` or `compiled` (the same records)",
    "engine_choice": "why `--engine auto` chose it",
    "prefix_cache_queries": "prompt tokens looked up in the prefix cache at admissions (vLLM's counter)",
    "prefix_cache_hits": "of those, tokens found cached",
    "prefix_cache_query_blocks": "prompt blocks looked up",
    "prefix_cache_hit_blocks": "of those, blocks found cached",
    "prefix_cache_evictions": "cached blocks evicted to make room",
    "prefix_cache_hit_rate": "`prefix_cache_hits` / `prefix_cache_queries`",
    "prefix_cache_block_hit_rate": "`prefix_cache_hit_blocks` / `prefix_cache_query_blocks`",
    "prefill_tokens_saved": "prompt tokens not computed because they were cached",
    "requests_with_cache_hit": "requests that found part of their prompt cached",
    "spec_decode_acceptance_rate": "speculative decoding: accepted drafts over draft tokens verified, in percent "
    "(`vllm bench serve`'s, from the server's `vllm:spec_decode_*` counters)",
    "spec_decode_acceptance_length": "1 + accepted drafts per verification step with drafts (the mean tokens a "
    "step makes)",
    "spec_decode_num_drafts": "verification steps with drafts (`vllm:spec_decode_num_drafts`)",
    "spec_decode_draft_tokens": "draft tokens verified, placeholders included, as vLLM counts them",
    "spec_decode_accepted_tokens": "of those, the drafts accepted",
    "spec_decode_per_position_acceptance_rates": "for each draft position, the steps that accepted it over "
    "`spec_decode_num_drafts`",
    "speculative_decoding": "the drafter and its acceptance, as the run drew it (below)",
    "num_replicas": "replicas of the cluster (both pools, when disaggregated)",
    "num_gpus": "GPUs of all replicas",
    "replicas": "one object per replica (below)",
    "pools": "the prefill and the decode pool, one object each (below)",
    "kv_transfer": "the KV cache's transfers from the prefill to the decode pool (below)",
    "prefill_pool_utilization": "share of the prefill pool's GPU-time spent running iterations",
    "decode_pool_utilization": "share of the decode pool's GPU-time spent running iterations",
    "kv_mean_transfer_ms": "mean time from a prefill's end to its KV's arrival at the decode pool, waiting included",
    "kv_p99_transfer_ms": "99th percentile of the same",
    "kv_total_bytes": "bytes of KV cache sent between the pools",
    "model": "the model's name",
    "hardware": "the hardware profile's name",
    "hardware_profile": "where the profile's numbers come from (below)",
    "workload": "the workload in words (its kind, rate, count and lengths)",
    "memory": "the KV-cache memory plan of a replica (below)",
    "vllm_defaults": "the `vllm serve` release whose defaults filled the limits not given, and which (below)",
    "config": "the whole resolved run config: `ferry run --config summary.json` runs it again",
}

NESTED = (
    ("memory", "the memory plan"),
    ("hardware_profile", "the profile"),
    ("vllm_defaults", "the defaults used"),
    ("speculative_decoding", "the drafter"),
    ("replicas", "each replica of a cluster"),
    ("pools", "each pool of a disaggregated run"),
    ("kv_transfer", "the KV link between the pools"),
    ("config", "the resolved run config"),
)
_POOL = {
    "replicas": "replicas of the pool", "replica": "the replica's index", "gpus": "GPUs of the replica or pool",
    "hardware": "its profile", "tensor_parallel_size": "its tensor-parallel size", "policy": "its policy",
    "requests": "requests it served", "completed": "requests it finished", "failed": "requests it rejected",
    "utilization": "share of its GPU-time spent running iterations",
    "request_throughput": "finished requests per second", "output_throughput": "output tokens per second",
    "mean_ttft_ms": "mean TTFT (ms)", "p99_ttft_ms": "99th percentile TTFT (ms)",
    "p99_tpot_ms": "99th percentile TPOT (ms)", "p99_itl_ms": "99th percentile ITL (ms)",
    "p99_e2el_ms": "99th percentile E2EL (ms)", "num_iterations": "iterations it ran",
    "gpu_busy_s": "seconds it ran iterations", "seat_utilization": "as the run's, for it",
    "mean_batch_size": "sequences per iteration, mean", "mean_tokens_per_iteration": "tokens per iteration, mean",
    "peak_kv_usage": "largest KV-cache share in use", "mean_kv_usage": "time-weighted KV-cache share in use",
    "total_preemptions": "preemptions", "kv_cache_blocks": "its KV-cache blocks",
    "overload": "null, or how arrivals outran it (as the run's `overload`)",
}  # fmt: skip
NESTED_FIELDS = {
    "memory": {
        "model": "the model", "hardware": "the profile", "tp": "tensor-parallel size",
        "gpu_memory_bytes": "memory of one GPU (bytes)",
        "gpu_memory_utilization": "share of it the engine may use (`--gpu-memory-utilization`)",
        "usable_bytes": "memory x utilization (bytes)", "weight_bytes_per_gpu": "weights held by one GPU (bytes)",
        "activation_reserve_bytes": "memory reserved for activations (bytes)",
        "kv_bytes_per_token": "KV-cache bytes one token costs on one GPU",
        "kv_cache_bytes": "bytes left for the KV cache", "block_size": "tokens per block",
        "num_gpu_blocks": "blocks of the KV cache (one of them vLLM's null block)",
        "layout": "the parallel layout in words", "stage": "the pipeline stage whose memory bounds the replica",
        "pp": "pipeline-parallel size",
    },
    "hardware_profile": {
        "name": "the profile's name", "kind": "`measured`, `datasheet`, `calibrated`, ...",
        "origin": "the `Profile numbers:` line: where its numbers come from",
    },
    "vllm_defaults": {
        "release": "the vLLM release (`--vllm-defaults`)", "engine": "V0 or V1",
        "tier": "the device tier the release picks its limits by",
        "max_num_batched_tokens": "the release's default token budget on this device",
        "max_num_seqs": "the release's default seats on this device",
        "scheduler_reserve_full_isl": "its admission rule: the whole prompt must fit the free KV cache",
        "watermark": "its KV watermark", "cap_lone_prefill": "whether it caps a lone request's prefill chunk",
        "enable_prefix_caching": "whether it caches prefixes by default", "applied": "the fields these defaults filled",
    },
    "speculative_decoding": {
        "method": "eagle, eagle3, mtp, ngram or draft_model", "num_speculative_tokens": "draft tokens per step (k)",
        "acceptance": "where the acceptance rates come from: a preset of `acceptance.yaml`, or the config's synthetic "
        "rates", "acceptance_rates": "per position, the chance that the drafts up to it are all accepted",
        "expected_acceptance_length": "the mean acceptance length these rates give with every position drafted",
        "lookahead_slots": "KV slots allocated past a step's tokens for the drafter (vLLM's num_lookahead_tokens)",
        "dynamic": "whether the draft count follows the batch size (num_speculative_tokens_per_batch_size)",
    },
    "replicas": _POOL,
    "pools": _POOL,
    "kv_transfer": {
        "link": "`nvlink` or `network`", "bandwidth_gbps": "the link's bandwidth per GPU (GB/s)",
        "latency_us": "the link's latency (us)", "lanes": "GPUs sending in parallel", "transfers": "requests sent",
        "total_bytes": "bytes sent", "mean_bytes": "bytes per request, mean",
        "mean_transfer_ms": "from the prefill's end to arrival, waiting for the link included: mean (ms)",
        "p50_transfer_ms": "the same, median (ms)", "p99_transfer_ms": "the same, 99th percentile (ms)",
        "mean_wire_ms": "on the link alone: mean (ms)", "p50_wire_ms": "on the link alone: median (ms)",
        "p99_wire_ms": "on the link alone: 99th percentile (ms)",
    },
    # the run config: each field is the `ferry run` flag of that name (docs/reference/cli.md), but these
    "config": {
        "scheduler": "the policy and its limits (`--policy`, `--max-num-seqs`, ...)",
        "workload": "arrivals and lengths, or the trace (`--request-rate`, `--input-len`, `--trace`, ...)",
        "replica_groups": "a config file's `replica_groups`", "disaggregation": "the pools' settings",
    },
}  # fmt: skip

ITERATION_EXTRA = {
    "replica": "the replica that ran the iteration (clusters, data parallelism, disaggregated pools)",
    "pool": "`prefill` or `decode` (disaggregated runs)",
}

COLUMNS = {
    "requests.csv": {
        "request_id": "the request's id (a trace's, or its row; `S-K` for turn K of conversation S)",
        "arrival_s": "when the request was sent",
        "first_scheduled_s": "when it first took part in an iteration",
        "first_token_s": "when the server made its first token",
        "finish_s": "when the server made its last token",
        "response_s": "when the client received the last token (the whole response, when not streamed)",
        "prompt_tokens": "its prompt's tokens",
        "output_tokens": "tokens it generated",
        "output_tokens_wanted": "tokens it asked for",
        "queueing_s": "`first_scheduled_s - arrival_s`",
        "ttft_s": "the client's time to first token",
        "tpot_s": "the client's time per output token after the first (empty for one token)",
        "e2el_s": "the client's end-to-end latency",
        "preemptions": "times it was preempted",
        "recomputed_tokens": "tokens it computed again after preemptions",
        "cached_tokens": "prompt tokens found in the prefix cache",
        "status": "`finished` or `rejected`",
        "reason": "why it was rejected (empty when finished)",
        "first_received_s": "when the client received the first token",
        "released_s": "when it gave back its seat and memory",
        "server_ttft_s": "the server's time to first token",
        "server_tpot_s": "the server's time per output token after the first",
        "replica": "the replica that served it (the prefill replica, when disaggregated)",
        "draft_tokens": "speculative decoding: draft tokens verified for it, placeholders included",
        "accepted_tokens": "of those, the drafts accepted (`output_tokens` counts them, and one token a step)",
        "decode_replica": "the decode replica (numbered after the prefill replicas)",
        "prefill_end_s": "when its prefill ended on the prefill replica",
        "kv_transfer_start_s": "when its KV started across the link",
        "kv_transfer_end_s": "when its KV arrived at the decode pool",
        "kv_transfer_bytes": "bytes of KV sent",
    },
    "batches.csv": {
        "iteration": "the iteration's row of `iterations.csv` (0-based)",
        "request_id": "the request that took part",
        "phase": "`prefill` (a whole prompt, or a recompute from nothing, in one go), `prefill_chunk` (part of one) or "
        "`decode`",
        "tokens": "tokens it computed in the iteration",
        "context_tokens": "tokens of it cached before the iteration",
        "replica": "the replica (clusters)",
        "draft_tokens": "speculative decoding: of `tokens`, the draft tokens verified (placeholders included)",
        "accepted_tokens": "of those, the drafts accepted",
    },
}

FILE_NOTES = {
    "requests.csv": "One row per request (`requests.parquet` with `--format parquet`); times in seconds from the "
    "benchmark's start.",
    "iterations.csv": "One row per iteration (`iterations.parquet` with `--format parquet`); the lines are the "
    "comments beside `sim.records.ITERATION_COLUMNS`.",
    "batches.csv": "With `--record-batches`: one row per request and iteration, in the order the policy scheduled "
    "them (`batches.parquet` with `--format parquet`).",
    "results.parquet": "One row per point (`--csv` also writes `results.csv`). Every swept parameter is a column of "
    "its own after `mode` (the example's `max_num_seqs`); the file's metadata names them (`ferry.swept`).",
}

SWEEP = {
    "point": "the point's index in the sweep",
    "hash": "content hash of the point's full config (defaults filled in) and the mode's SLO",
    "status": "`ok` or `error`",
    "error": "the error's message (a point that failed)",
    "seed": "the workload's seed",
    "wall_s": "seconds the point took",
    "ferry_version": "the version of ferry that ran it",
    "mode": "`run` or `max_rate`",
    "overloaded": "whether the point's run was overloaded (null for a point that failed)",
    "sustained_rate": "requests/s the replica sustains on that workload (NaN unless overloaded)",
    "max_rate": "the highest request rate (requests/s) that met the SLO",
    "evaluations": "JSON: every rate tried, whether it met the SLO, the SLO's metrics",
}
SWEPT_EXAMPLE = ("max_num_seqs",)  # the example sweep's axis: a column of the table, not a key of ferry's
