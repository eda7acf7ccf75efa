"""`ferry iteration`: explain the predicted time of one iteration, operator by operator.

    ferry iteration --model llama-3-8b --hardware h100-sxm --prefill 512@0 --decode 32@1024 [--json]

``--prefill N@C`` is one prefill chunk of N new tokens on top of C tokens already cached (repeat it, one per
sequence); ``--decode B@C`` is B sequences each decoding one token at context C (repeatable); with
``--speculative-config`` (vLLM's JSON) each decode is verified with its k draft tokens (a query of 1 + k) and the
drafter's work is added, shown apart (verification vs drafting), with the time per token the acceptance gives against
plain decoding. ``--json`` prints one
object ``{"time_s", "ops": [{"name", "time_s", "flops", "bytes", "bound"}], ...}``, a stable contract: an op's
``time_s`` covers all layers, the linear layers are ``qkv_proj``, ``o_proj`` and ``mlp`` (gate, up, activation and
down together); extra keys may be added, none renamed.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

import numpy as np

from costmodel import CostModel, IterationBreakdown, IterationShape, load_hardware, load_model
from costmodel.drafting import drafter_for
from costmodel.dtypes import QUANTIZATION_HELP
from costmodel.engines import apply_engine
from costmodel.layout import Parallelism

_PAIR = re.compile(r"^\s*(\d+)\s*@\s*(\d+)\s*$")


def parse_pair(text: str, flag: str, first: str) -> tuple[int, int]:
    """``N@C`` -> (N, C) with N >= 1 and C >= 0; ValueError saying what was expected."""
    match = _PAIR.match(text)
    if match is None:
        raise ValueError(f"{flag} {text!r}: expected {first}@CONTEXT with whole numbers, e.g. {flag} 512@0")
    n, c = int(match.group(1)), int(match.group(2))
    if n < 1:
        raise ValueError(f"{flag} {text!r}: {first} must be at least 1")
    return n, c


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that choose a cost model (shared with `ferry roofline`); vLLM's names and meanings."""
    parser.add_argument("--model", required=True, help="built-in model name (e.g. llama-3-8b) or path to a config.json")
    parser.add_argument(
        "--hardware", required=True, help="hardware profile name (e.g. h100-sxm) or path to a YAML file"
    )
    parser.add_argument(
        "--dtype", default="auto", help="activations: auto (the config's torch_dtype), bf16, fp16, fp32"
    )
    parser.add_argument("--kv-cache-dtype", default="auto", help="KV cache: auto (= --dtype) or fp8")
    parser.add_argument("--quantization", default=None, help=QUANTIZATION_HELP)
    parser.add_argument(
        "--tp", "--tensor-parallel-size", dest="tp", type=int, default=1, help="tensor-parallel GPUs (default 1)"
    )
    parser.add_argument("--pp", "--pipeline-parallel-size", dest="pp", type=int, default=1, help="pipeline stages (1)")
    parser.add_argument(
        "--dp",
        "--data-parallel-size",
        dest="dp",
        type=int,
        default=1,
        help="data-parallel ranks: MoE layers take every rank's tokens, this rank's batch repeated (1)",
    )
    parser.add_argument(
        "--enable-expert-parallel", action="store_true", help="MoE: whole experts per GPU over tp x dp GPUs"
    )
    parser.add_argument(
        "--engine-overheads", metavar="NAME", default=None, help="an engine preset's host overheads (vllm-v1, ...)"
    )


def cost_model_from_args(args: argparse.Namespace) -> CostModel:
    hardware = load_hardware(args.hardware)
    if args.engine_overheads is not None:
        hardware = apply_engine(hardware, args.engine_overheads)
    if args.enable_expert_parallel and args.tp * args.dp == 1:
        raise ValueError("--enable-expert-parallel spreads the experts over tp x dp GPUs, and there is one")
    return CostModel(
        load_model(args.model),
        hardware,
        parallel=Parallelism(tp=args.tp, pp=args.pp, dp=args.dp, expert_parallel=args.enable_expert_parallel),
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        quantization=args.quantization,
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "iteration",
        help="explain one iteration's predicted time, operator by operator",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--prefill",
        action="append",
        default=[],
        metavar="N@C",
        help="a prefill chunk of N new tokens on C cached tokens (repeatable, one per sequence)",
    )
    parser.add_argument(
        "--decode", action="append", default=[], metavar="B@C", help="B sequences decoding at context C (repeatable)"
    )
    parser.add_argument(
        "--speculative-config",
        metavar="JSON",
        default=None,
        help='speculative decoding, as vllm serve takes it (\'{"method": "eagle3", "num_speculative_tokens": 3}\'): '
        "each decode verifies its k drafts, and the drafter's work is added",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.set_defaults(func=handle)


MAX_SEQUENCES = 1 << 24  # sequences one iteration may hold (vLLM's max_num_seqs is in the hundreds)


def build_shape(prefill: list[str], decode: list[str], max_len: int, model: str) -> IterationShape:
    chunks = [parse_pair(p, "--prefill", "NEW_TOKENS") for p in prefill]
    groups = [parse_pair(d, "--decode", "SEQUENCES") for d in decode]
    if not chunks and not groups:
        raise ValueError("give at least one --prefill N@C or --decode B@C")
    sequences = sum(b for b, _ in groups) + len(chunks)
    if sequences > MAX_SEQUENCES:
        raise ValueError(f"--decode: {sequences:,} sequences in one iteration; at most {MAX_SEQUENCES:,}")
    for flag, n, c in [("--prefill", n, c) for n, c in chunks] + [("--decode", 1, c) for _, c in groups]:
        if c + n > max_len:
            raise ValueError(f"{flag}: context {c} + {n} new exceeds {model}'s max_position_embeddings={max_len}")
    return IterationShape.of(prefill=chunks, decode=groups)


def handle(args: argparse.Namespace) -> int:
    cm = cost_model_from_args(args)
    shape = build_shape(args.prefill, args.decode, cm.model.max_position_embeddings, cm.model.name)
    spec = None
    if args.speculative_config is not None:
        shape, spec = speculate(cm, shape, args.speculative_config)
    breakdown = cm.explain(shape)
    if args.json:
        out = to_json(cm, shape, breakdown, args)
        if spec is not None:
            out["speculative_decoding"] = spec
        print(json.dumps(out))
    else:
        print(render(cm, shape, breakdown, args))
        if spec is not None:
            print(speculation_lines(spec))
    return 0


def speculate(cm: CostModel, shape: IterationShape, given: str) -> tuple[IterationShape, dict[str, Any]]:
    """The shape with its decodes verified with k drafts each, ``cm`` timing the drafter too; and what to say of it:
    verification and drafting times, the plain decode step's, and per token with the acceptance's mean length."""
    from experiments.runner.speculative import mean_acceptance_length, parse, unconditional_rates

    config = parse(given)
    k = config.k
    plain = cm.iteration_time(shape)
    draft = load_model(config.model) if config.resolved_method == "draft_model" and config.model else None
    drafter = drafter_for(config.resolved_method, k, cm.model, draft, config.draft_tensor_parallel_size or cm.tp)
    cm.speculate(drafter)
    n = shape.num_decode_seqs
    verified = IterationShape(prefill_new=shape.prefill_new, prefill_ctx=shape.prefill_ctx,
                              prefill_sampled=shape.prefill_sampled, verify_new=np.full(n, 1 + k, dtype=np.int64),
                              verify_ctx=shape.decode_ctx)  # fmt: skip
    rates, source = unconditional_rates(config, cm.model.name)
    length = mean_acceptance_length(rates)
    b = cm.explain(verified)
    return verified, {"drafter": drafter.describe(), "num_speculative_tokens": k, "acceptance": source,
                      "mean_acceptance_length": length, "verification_s": b.time_s - b.drafting_s,
                      "drafting_s": b.drafting_s, "plain_step_s": plain, "time_per_token_s": b.time_s / length,
                      "plain_time_per_token_s": plain}  # fmt: skip


def speculation_lines(s: dict[str, Any]) -> str:
    per, plain = s["time_per_token_s"], s["plain_time_per_token_s"]
    step = (s["verification_s"] + s["drafting_s"]) * 1e3
    return "\n".join([
        "",
        f"speculative decoding: {s['drafter']}; acceptance {s['acceptance']}, mean length "
        f"{s['mean_acceptance_length']:.2f}",
        f"  verification {s['verification_s'] * 1e3:.3f} ms + drafting {s['drafting_s'] * 1e3:.3f} ms = "
        f"{step:.3f} ms a step (plain decoding {s['plain_step_s'] * 1e3:.3f} ms)",
        f"  per token a decode makes: {per * 1e3:.3f} ms, against {plain * 1e3:.3f} ms plain ({plain / per:.2f}x)",
    ])  # fmt: skip


def default_limits(cm: CostModel) -> tuple[int, int]:
    """``(max_num_batched_tokens, max_num_seqs)`` of a default `ferry run` of this model on this device (its default
    policy at the newest release's `vllm serve` limits): the activation reserve of its memory plan, so that this
    command and `ferry run` report one KV capacity."""
    from experiments.runner.config import RunConfig
    from experiments.runner.simulation import resolve

    config = RunConfig(model=cm.model.name, hardware=cm.hardware.name, tensor_parallel_size=cm.tp)
    scheduler = resolve(config, cm.model, cm.hardware)[0].scheduler
    return scheduler.token_budget, scheduler.seq_limit


def memory_note(cm: CostModel, shape: IterationShape) -> tuple[dict[str, Any], str]:
    """Whether the model and this iteration's KV fit (default gpu_memory_utilization 0.9, blocks of 16, the
    activation reserve of a default `ferry run`): a JSON object and a line of text. The iteration holds, per
    sequence, its cached context and the tokens it computes."""
    kv_tokens = int(shape.prefill_ctx.sum() + shape.prefill_new.sum() + shape.decode_ctx.sum() + shape.num_decode_seqs)
    tokens, seqs = default_limits(cm)
    try:
        plan = cm.memory_plan(max_num_batched_tokens=tokens, max_num_seqs=seqs)
    except ValueError as exc:
        return {"fits": False, "error": str(exc), "iteration_kv_tokens": kv_tokens}, f"memory: DOES NOT FIT: {exc}"
    out = {"kv_cache_tokens": plan.max_tokens, "num_gpu_blocks": plan.num_gpu_blocks, "iteration_kv_tokens": kv_tokens,
           "reserved_for_tokens": tokens, "reserved_for_seqs": seqs}  # fmt: skip
    if kv_tokens > plan.max_tokens:
        error = (
            f"this iteration's sequences hold {kv_tokens:,} KV tokens, but the KV cache holds {plan.max_tokens:,} "
            f"({cm.model.name} on {cm.hardware.name}, tp={cm.tp}, gpu_memory_utilization 0.9)"
        )
        return {"fits": False, "error": error} | out, f"memory: DOES NOT FIT: {error}"
    text = (
        f"memory: fits; the iteration holds {kv_tokens:,} of the KV cache's {plan.max_tokens:,} tokens per replica "
        f"at gpu_memory_utilization 0.9, activations reserved for {tokens:,} tokens and {seqs:,} sequences (a default "
        "`ferry run`'s vLLM limits)"
    )
    return {"fits": True} | out, text


def to_json(cm: CostModel, shape: IterationShape, b: IterationBreakdown, args: argparse.Namespace) -> dict[str, Any]:
    out = b.to_dict()
    out.update(
        model=cm.model.name,
        hardware=cm.hardware.name,
        hardware_kind=cm.hardware.kind,
        tp=cm.tp,
        dtypes={"activation": cm.dtypes.activation, "weight": cm.dtypes.weight, "kv_cache": cm.dtypes.kv_cache},
        prefill=list(args.prefill),
        decode=list(args.decode),
        memory=memory_note(cm, shape)[0],
        hardware_profile={"origin": cm.hardware.origin(), "kernel_times": cm.timing, "notes": list(cm.tables.notes)},
    )
    return out


def render(cm: CostModel, shape: IterationShape, b: IterationBreakdown, args: argparse.Namespace) -> str:
    parts = []
    if args.prefill:
        parts.append(f"{len(args.prefill)} prefill chunk(s), {shape.num_prefill_tokens} new tokens")
    if args.decode and len(shape.verify_new):
        parts.append(f"{len(shape.verify_new)} decode(s) verified, {int(shape.verify_new[0]) - 1} drafts each")
    elif args.decode:
        parts.append(f"{shape.num_decode_seqs} decode(s)")
    lines = [
        cm.describe() + ("" if cm.hardware.kind == "calibrated" else "  [datasheet profile: efficiencies assumed]"),
        f"profile numbers: {cm.hardware.origin()}",
        f"kernel times: {cm.timing}" + "".join(f"; {note}" for note in cm.tables.notes),
        f"iteration: {'; '.join(parts)}; {b.num_tokens} tokens, {b.num_sampled} sampled",
        f"predicted time: {b.time_s * 1e3:.3f} ms  (GPU operators {b.gpu_time_s * 1e3:.3f} ms, {b.bound}-bound; "
        f"communication {b.communication_s * 1e3:.3f} ms; host overhead {b.overhead_s * 1e3:.3f} ms)",
        f"ridge point: {cm.ridge_point:.0f} FLOP/byte ({cm.gemm_dtype} peak / memory bandwidth)",
        memory_note(cm, shape)[1],
        "",
        f"{'op':<18} {'GFLOP':>10} {'MB':>10} {'FLOP/B':>8} {'time ms':>9} {'share':>6}  bound",
    ]
    for op in b.ops:
        intensity = op.flops / op.bytes if op.bytes else float("inf")
        share = op.time_s / b.time_s if b.time_s else 0.0
        lines.append(
            f"{op.name:<18} {op.flops / 1e9:>10.2f} {op.bytes / 1e6:>10.1f} {intensity:>8.1f} "
            f"{op.time_s * 1e3:>9.3f} {share:>6.1%}  {op.bound}"
        )
    if b.all_reduces:
        lines.append(
            f"{'all-reduce x' + str(b.all_reduces):<18} {'':>10} {b.communication_bytes / 1e6:>10.1f} {'':>8} "
            f"{b.communication_s * 1e3:>9.3f} {b.communication_s / b.time_s:>6.1%}  interconnect"
        )
    lines.append(
        f"{'host overhead':<18} {'':>10} {'':>10} {'':>8} {b.overhead_s * 1e3:>9.3f} "
        f"{(b.overhead_s / b.time_s if b.time_s else 0.0):>6.1%}  host"
    )
    lines.append("(per GPU; op times cover all layers)")
    return "\n".join(lines)
