"""`ferry run`'s summary as the table it prints: the replica and what it ran with (limits and whose defaults they
are), the cluster or the pools, then the serving, latency and batching figures, in sections like `vllm bench
serve`'s."""

from __future__ import annotations

import math
from typing import Any

from experiments.commands.disagg_cli import disagg_rows
from policies.config import ITERATION_LIMITED, WHOLE_BATCHES


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf"
        return f"{value:,.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def arrivals_words(w: dict[str, Any]) -> str:
    """When the requests are sent, in words, with what to give for another pattern."""
    clients = w.get("max_concurrency")
    rate = w.get("request_rate", math.inf)
    rate = math.inf if rate in (None, "inf", "Infinity") else float(rate)
    if w.get("trace") is not None:
        sent = "at the trace's own times"
        sent += f", at most {clients} in flight (--max-concurrency)" if clients else ""
        return sent
    if clients:
        if math.isinf(rate):
            return f"{clients} clients in a closed loop: each sends its next request as its last response ends"
        return f"due at {rate:g}/s, at most {clients} in flight: the rest wait for a slot (--max-concurrency)"
    if math.isinf(rate):
        return ("all at t=0 (--request-rate inf, `vllm bench serve`'s default); --request-rate R: Poisson arrivals, "
                "--max-concurrency N: N clients")  # fmt: skip
    shape = w.get("burstiness", 1.0)
    return f"{'Poisson' if shape == 1 else f'gamma (burstiness {shape:g})'} arrivals at {rate:g}/s"


def policy_words(s: dict[str, Any]) -> str:
    """The policy, and whose default it is when it was not given (``vllm serve``'s: V1's chunked prefill)."""
    policy = s["config"]["scheduler"]["policy"]
    vllm = s.get("vllm_defaults") or {}
    if "policy" in vllm.get("applied", ()):
        return f"{policy} (`vllm serve` {vllm['release']}: {vllm['engine']}, chunked prefill)"
    return str(policy)


def scheduler_rows(s: dict[str, Any]) -> list[tuple[str, Any]]:
    """The header lines that say what the policy ran with: its limits (and whose defaults they are), the KV
    admission rule and watermark, and how responses reach the client."""
    cfg = s["config"]
    sched = cfg["scheduler"]
    policy = sched["policy"]
    vllm = s.get("vllm_defaults") or {}
    applied = set(vllm.get("applied", ()))

    def mark(field: str) -> str:
        return f" (vLLM {vllm['release']})" if field in applied else ""

    rows: list[tuple[str, Any]] = []
    if policy in ITERATION_LIMITED:
        if applied:
            rows.append(("`vllm serve` defaults", f"{vllm['release']} {vllm['engine']}, {vllm['tier']}"))
        rows.append(("Max num seqs", f"{sched['max_num_seqs']:,}{mark('max_num_seqs')}"))
        rows.append(("Max num batched tokens", f"{sched['max_num_batched_tokens']:,}{mark('max_num_batched_tokens')}"))
        if policy == "chunked":
            admission = "whole prompt fits" if sched["scheduler_reserve_full_isl"] else "first chunk fits"
            rows.append(("KV admission", f"{admission}{mark('scheduler_reserve_full_isl')}"))
            rows.append(("Order of running requests", sched["chunked_order"]))
    elif policy in WHOLE_BATCHES:
        rows.append(("Max batch size", sched["max_batch_size"]))
        if policy == "dynamic":
            preferred = sched["preferred_batch_sizes"] or [sched["max_batch_size"]]
            rows.append(
                ("Max delay (ms) / preferred sizes", f"{sched['max_delay_ms']:g} / {','.join(map(str, preferred))}")
            )
    if cfg.get("kv_watermark") is not None:
        rows.append(("KV watermark", f"{cfg['kv_watermark']:g}{mark('kv_watermark')}"))
    if policy in ITERATION_LIMITED:
        caching = "on" if cfg.get("enable_prefix_caching") else "off"
        rows.append(("Prefix caching", f"{caching}{mark('enable_prefix_caching')}"))
    spec = s.get("speculative_decoding")
    if spec:
        k = f"k={spec['num_speculative_tokens']}" + (" at most, by batch size" if spec["dynamic"] else "")
        rows.append(("Speculative decoding", f"{spec['method']}, {k}"))
        rows.append(("  acceptance", f"{spec['acceptance']}; length {spec['expected_acceptance_length']:.2f}"))
    whole = "whole, when the batch ends" if policy in WHOLE_BATCHES else "whole, at the last token"
    rows.append(("Responses", "streamed" if cfg["stream"] else whole))
    return rows


def cluster_rows(s: dict[str, Any]) -> list[tuple[str, Any]]:
    """A cluster's header lines: replicas and router, then each replica's share (none for a single replica); a
    disaggregated run's pools and KV transfers."""
    if "pools" in s:
        return disagg_rows(s)
    if "replicas" not in s:
        return []
    cfg = s["config"]
    clients = (cfg.get("workload") or {}).get("max_concurrency")
    router = f"{cfg['router']}" if clients is None else "none: each client stays with one replica (--max-concurrency)"
    gpus = f"{s['num_gpus']} GPU" + ("s" if s["num_gpus"] != 1 else "")
    rows: list[tuple[str, Any]] = [("Replicas / router", f"{s['num_replicas']} ({gpus}), {router}")]
    for r in s["replicas"]:
        p99 = r["p99_ttft_ms"]
        rows.append(
            (
                f"  replica {r['replica']} ({r.get('hardware', '')} x{r['gpus']})",
                f"{r['completed']:,} requests, busy {r['utilization']:.0%}, p99 TTFT "
                f"{'-' if p99 is None else f'{p99:,.0f}'} ms, peak KV {r['peak_kv_usage']:.0%}",
            )
        )
    return rows


def _kv_cache(mem: dict[str, Any]) -> str:
    tokens = mem["num_gpu_blocks"] * mem["block_size"]
    return (f"{mem['num_gpu_blocks']:,} blocks x {mem['block_size']} = {tokens:,} tokens "
            f"({mem['kv_cache_bytes'] / 2**30:.1f} GiB/GPU)")  # fmt: skip


def _layout(cfg: dict[str, Any]) -> str:
    """A replica's parallel layout in short: "TP 8", "TP 8, PP 2", "TP 1, DP 8, EP"."""
    text = f"TP {cfg['tensor_parallel_size']}"
    if cfg.get("pipeline_parallel_size", 1) > 1:
        text += f", PP {cfg['pipeline_parallel_size']}"
    if cfg.get("data_parallel_size", 1) > 1:
        text += f", DP {cfg['data_parallel_size']}"
    return text + (", EP" if cfg.get("enable_expert_parallel") else "")


def _choice(s: dict[str, Any]) -> str:
    """Why the engine ran, when ``auto`` chose it."""
    why = s.get("engine_choice") or ""
    return f" ({why})" if why.startswith("auto") else ""


def _placement(s: dict[str, Any], engine: str) -> str:
    """What ran where: the model, the device, the parallel layout and, for a cluster, its replicas and GPUs."""
    cfg = s["config"]
    if "pools" in s:  # disaggregated: each pool is described below
        return f"{s['model']} on {s['hardware']}"
    replicas, tp = int(s.get("num_replicas", 1)), cfg["tensor_parallel_size"]
    dp = cfg.get("data_parallel_size", 1)
    if replicas == 1:
        return f"{s['model']} on {s['hardware']}, {_layout(cfg)}{engine}"
    gpus = s.get("num_gpus", replicas * tp)
    if dp > 1:
        device = str(s["hardware"]).rsplit(" x", 1)[0]
        ranks = f"{replicas // dp} x {dp} data-parallel ranks" if replicas > dp else f"{dp} data-parallel ranks"
        return f"{s['model']} on {device}, {_layout(cfg)}: {ranks} ({gpus} GPUs){engine}"
    if s.get("replica_groups"):  # each group says its device and TP below
        return f"{s['model']} on {replicas} replicas ({s['hardware']}), {gpus} GPUs{engine}"
    device = str(s["hardware"]).rsplit(" x", 1)[0]
    return f"{s['model']} on {replicas} replicas of {device}, TP {tp} each ({gpus} GPUs){engine}"


def terms(labels: set[str], itl_kept: str) -> list[str]:
    """The lines under the table that gloss its terms a `vllm bench serve` user has not met, for the rows it has
    (docs/concepts/glossary.md says more). Each line starts with ``*``, so that no script reading the rows
    takes one for a row."""
    seats = [gloss for label, gloss in (
        ("Seat utilization", "seat utilization: share of the seats taken by requests still generating"),
        ("Held seats (done, waiting for batch)", "held seats: by finished ones until their batch ends"),
    ) if label in labels]  # fmt: skip
    lines = [f"* {'; '.join(seats)}"] if seats else []
    if "Engine" in labels:
        kept = "every token gap kept" if itl_kept == "exact" else "the token gaps binned, not kept each"
        engine = "the simulator loop that ran (reference or compiled, same records)"
        lines.append(f"* engine: {engine}; ITL {itl_kept}: {kept}")
    if lines:
        lines[-1] += " (docs/concepts/glossary.md)"
    return lines


def format_summary(s: dict[str, Any]) -> str:
    """A readable table of the summary, in sections, like `vllm bench serve` prints."""
    cfg = s["config"]
    mem = s["memory"]
    groups = s.get("replica_groups")
    engine = f" ({cfg['engine_overheads']} overheads)" if cfg.get("engine_overheads") else ""
    replica_rows: list[tuple[str, Any]] = [
        ("Model / hardware", _placement(s, engine)),
        *([("Profile numbers", s["hardware_profile"]["origin"])] if "hardware_profile" in s else []),
        ("Policy", policy_words(s)),
        *scheduler_rows(s),
        ("Workload", s["workload"]),
        ("Arrivals", arrivals_words(cfg.get("workload") or {})),
        ("KV cache per replica", _kv_cache(mem)),
        ("Weights per GPU (GiB)", mem["weight_bytes_per_gpu"] / 2**30),
        ("KV bytes per token per GPU", mem["kv_bytes_per_token"]),
    ]
    pp = cfg.get("pipeline_parallel_size", 1)
    if pp > 1:  # ferry's pipeline runs one batch through every stage in turn (docs/concepts/semantics.md)
        replica_rows.append(("Pipeline", f"{pp} stages, one batch in flight: a GPU busy 1/{pp} of it"))
    if groups:  # each group says its own device and limits
        replica_rows = [("Model / hardware", f"{s['model']} on {s['hardware']}"), ("Workload", s["workload"])]
        for k, g in enumerate(groups):
            gs = g["scheduler"]
            limits = f", max_num_seqs {gs['max_num_seqs']}, tokens {gs['max_num_batched_tokens']}" \
                if gs.get("max_num_seqs") else ""  # fmt: skip
            replica_rows.append((f"Group {k}: {g['count']} x {g['hardware']} tp{g['tensor_parallel_size']}",
                                 f"{gs['policy']}{limits}; KV {_kv_cache(g['memory'])}"))  # fmt: skip
    rows: list[tuple[str, Any] | str] = [
        "ferry run",
        *replica_rows,
        ("Engine", f"{s['engine']}{_choice(s)}, ITL {s['itl_kept']}"),
        *cluster_rows(s),
        "Serving",
        ("Successful requests", s["completed"]),
        ("Failed (rejected) requests", s["failed"]),
    ]
    rows += [(f"  rejected: {k}", v) for k, v in s["rejected_by_reason"].items()]
    rows += [
        ("Benchmark duration (s)", s["duration"]),
        ("Total input tokens", s["total_input_tokens"]),
        ("Total generated tokens", s["total_output_tokens"]),
        ("Request throughput (req/s)", s["request_throughput"]),
        ("Output token throughput (tok/s)", s["output_throughput"]),
        ("Total token throughput (tok/s)", s["total_token_throughput"]),
    ]
    if "request_goodput" in s:
        rows.append(("Request goodput (req/s)", s["request_goodput"]))
    for name, title in (
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st)"),
        ("itl", "Inter-token Latency"),
        ("e2el", "End-to-end Latency"),
        ("queueing", "Queueing delay"),
    ):
        rows.append(title)
        rows += [
            (f"{stat.capitalize()} {name.upper()} (ms)", s[f"{stat}_{name}_ms"])
            for stat in ("mean", "median", "p90", "p99")
        ]
    if "spec_decode_num_drafts" in s:  # as `vllm bench serve` prints it
        rows.append("Speculative Decoding")
        rows += [("Acceptance rate (%)", s["spec_decode_acceptance_rate"]),
                 ("Acceptance length", s["spec_decode_acceptance_length"]), ("Drafts", s["spec_decode_num_drafts"]),
                 ("Draft tokens", s["spec_decode_draft_tokens"]),
                 ("Accepted tokens", s["spec_decode_accepted_tokens"])]  # fmt: skip
        rows += [(f"  Position {i} acceptance (%)", 100 * r)
                 for i, r in enumerate(s["spec_decode_per_position_acceptance_rates"])]  # fmt: skip
    if not s.get("stream", True):  # what the server made, which the client received only with the whole response
        rows.append("Server side (when tokens were made)")
        rows += [
            (f"{stat.capitalize()} server {name.upper()} (ms)", s[f"{stat}_server_{name}_ms"])
            for name in ("ttft", "tpot")
            for stat in ("mean", "median", "p99")
        ]
    rows += [
        "Batching",
        ("Iterations", s["num_iterations"]),
        ("Mean iteration time (ms)", 1e3 * s["gpu_busy_s"] / s["num_iterations"] if s["num_iterations"] else None),
        ("Mean batch size (seqs)", s["mean_batch_size"]),
        ("Mean tokens per iteration", s["mean_tokens_per_iteration"]),
        ("GPU idle (s)", s["gpu_idle_s"]),
        ("GPU idle fraction", s["gpu_idle_fraction"]),
        ("Idle while requests wait (s)", s["idle_while_waiting_s"]),
        ("Seat utilization", s["seat_utilization"]),
        ("Held seats (done, waiting for batch)", s["held_seat_fraction"]),
        ("Peak / mean KV usage", f"{_fmt(s['peak_kv_usage'])} / {_fmt(s['mean_kv_usage'])}"),
        ("Preemptions", s["total_preemptions"]),
        ("Recomputed tokens", s["recomputed_tokens"]),
    ]
    width, label_width = 60, 36
    lines = []
    for row in rows:
        if isinstance(row, str):
            lines.append(f"{' ' + row + ' ':=^{width}}")
        else:
            label, value = row
            text = _fmt(value)
            lines.append(f"{label + ':':<{label_width}}{text:>{max(width - label_width, len(text) + 1)}}")
    lines.append("=" * width)
    lines += terms({row[0] for row in rows if not isinstance(row, str)}, str(s.get("itl_kept", "")))
    return "\n".join(lines)
