"""`ferry probe`: calibrate a profile against a live OpenAI-compatible server, from the client's side.

    ferry probe --url http://HOST:PORT/v1 --model NAME --out PROFILE.yaml [--base h100-sxm] [--model-config CONFIG]
                [--budget-s 600] [--timeout 60] [--max-concurrency 64] [--max-requests 1000] [--max-prompt 2048]
                [--max-num-batched-tokens N] [--max-num-seqs N]

Sends designed streamed completions (``experiments.real.probe_design``: single prompts of many lengths, long single
generations, groups decoding together at several batch sizes, prompts arriving into running decodes), infers each
iteration's time from the time to first token and the gaps between streamed tokens (``experiments.real.probe``),
fits the ``--base`` profile's efficiencies and host overheads to them, and prints the error on the experiments it
held out. Writes ``PROFILE.yaml`` (for ``--hardware``), ``PROFILE.probe.csv`` (every inferred iteration: kind,
experiment, held out, shape, measured and predicted seconds) and ``PROFILE.probe.json`` (the report).

The server must take ``ignore_eos`` (vLLM, SGLang and ``ferry serve`` do) and stream one token per chunk; the prompts
timed as one iteration must fit in one (its max_num_batched_tokens: give ``--max-num-batched-tokens``, or the server
states it, and they are capped to it; else a warning), the requests sent to decode together must find seats (its
max_num_seqs: ``--max-num-seqs``, or stated; else a warning), and nothing else should load it. Where a server states
them (``experiments.real.limits``): ``ferry serve`` on its ``/models`` card; ``vllm serve`` only at ``/server_info``,
with ``VLLM_SERVER_DEV_MODE=1`` (its card and ``/metrics`` do not); they are never guessed.

The fit gives the engine's host time per step (``per_iteration_s``, which ``ferry run`` and ``ferry validate`` add to
every simulated iteration) and is checked on the token gaps it was fitted on: printed, and a warning (in the report's
``notes``) when it misses them.

It first checks the server: ``/models`` must list ``--model``, and one streamed request must answer as an SSE stream
of completion chunks; otherwise it stops with one line naming what the server answered (exit 2), before any
experiment. ``--budget-s`` is a wall-clock deadline for all of it; ``--timeout`` bounds each wait for a response or
a next token (keep-alive comments without a token do not count as an answer).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from costmodel import load_hardware
from costmodel.model_spec import load_model
from experiments.commands.calibrate import write_profile
from experiments.real.probe import fit_probe, probe
from experiments.real.probe_design import ProbePlan
from experiments.real.probe_report import format_report
from experiments.runner import outputs

DEFAULT = ProbePlan()


def _pauses(text: str) -> tuple[float, ...]:
    """``--idle-pauses``: comma-separated seconds, or ``none``."""
    if text.strip().lower() == "none":
        return ()
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated seconds, e.g. 0.1,0.3,1, or none") from None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "probe",
        help="fit a hardware profile to a live OpenAI-compatible server from the client's side",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", required=True, help="the server's OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", required=True, help="the model name the server serves (as in /v1/models)")
    p.add_argument(
        "--model-config",
        default=None,
        help="its config.json or a built-in ferry model, to count FLOPs and bytes (default: --model)",
    )
    p.add_argument("--out", type=Path, required=True, help="the fitted profile to write (YAML)")
    p.add_argument("--base", default="h100-sxm", help="profile whose device rates anchor the fit (default h100-sxm)")
    p.add_argument("--dtype", default=None, help="the served weights' dtype (default: the config's torch_dtype)")
    p.add_argument("--name", default=None, help="the profile's name (default: the --out file's stem)")
    p.add_argument("--budget-s", type=float, default=DEFAULT.budget_s, help="stop after this many seconds")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT.timeout_s,
        help="seconds a request waits for its response, then for each next token, before it fails "
        f"(default {DEFAULT.timeout_s:g})",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="the server's per-iteration token budget: caps the prompts timed as one iteration (default: what the "
        "server's /models states, else a warning)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=None,
        help="the server's seats (requests it runs at once): caps the batches sent (default: what the server states, "
        "else a warning)",
    )
    p.add_argument("--max-concurrency", type=int, default=DEFAULT.max_concurrency, help="streams open at once")
    p.add_argument("--max-requests", type=int, default=DEFAULT.max_requests, help="requests sent in all")
    p.add_argument("--max-prompt", type=int, default=DEFAULT.max_prompt, help="longest prompt (tokens)")
    p.add_argument("--decode-tokens", type=int, default=DEFAULT.decode_tokens, help="tokens per decoding request")
    p.add_argument("--repeats", type=int, default=DEFAULT.repeats, help="requests per prompt length (median kept)")
    p.add_argument("--idle-pauses", type=_pauses, default=DEFAULT.idle_pauses, metavar="S,S,...",
                   help="seconds of silence before the idle experiments' prompts, to measure what an idle server adds "
                        "before its next first token (default %(default)s; 'none' skips them)")  # fmt: skip
    p.add_argument(
        "--batch-sizes",
        default=",".join(map(str, DEFAULT.batch_sizes)),
        help="requests decoding at once, comma-separated (capped by --max-concurrency)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the random prompts (default: a fresh one, kept in the report: a server's prefix cache must not "
        "hold them from an earlier probe)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    try:
        sizes = tuple(int(x) for x in str(args.batch_sizes).split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--batch-sizes: not comma-separated integers: {args.batch_sizes!r}") from None
    if any(b < 1 for b in sizes):
        raise ValueError(f"--batch-sizes must be >= 1: {args.batch_sizes!r}")
    plan = ProbePlan(
        max_prompt=args.max_prompt,
        decode_tokens=args.decode_tokens,
        repeats=args.repeats,
        batch_sizes=sizes,
        max_concurrency=args.max_concurrency,
        max_requests=args.max_requests,
        budget_s=args.budget_s,
        timeout_s=args.timeout,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        idle_pauses=tuple(args.idle_pauses),
    )
    plan.check()
    config = args.model_config or args.model
    try:
        spec = load_model(config)
    except (ValueError, OSError) as exc:
        raise ValueError(f"--model-config: {exc} (give the served model's config.json or a built-in model)") from None
    base = load_hardware(args.base)
    dtype = args.dtype or spec.torch_dtype
    log = (lambda _: None) if args.json else print
    out: Path = args.out
    outputs.check_file(out)  # before the experiments, not after them
    run = probe(args.url, args.model, plan, seed=args.seed, log=log)
    settings = {
        "fit": "probe",
        "url": run.url,
        "model": run.model,
        "model_config": config,
        "base": base.name,
        "dtype": dtype,
        "prompts": "words" if run.text_prompts else "token ids",
    }
    fitted = fit_probe(run, spec=spec, dtype=dtype, base=base, name=args.name or out.stem, settings=settings)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_profile(fitted.fit.profile, out, f"ferry probe {run.url}")
    rows_path = out.with_name(out.stem + ".probe.csv")
    fitted.rows.to_csv(rows_path, index=False)
    report = {
        "url": run.url,
        "model": run.model,
        "profile": str(out),
        "seconds": run.seconds,
        "requests": len(run.streams()),
        "stopped": run.stopped or None,
        "max_num_batched_tokens": run.max_num_batched_tokens,
        "max_num_seqs": run.max_num_seqs,
        "seed": run.seed,
        "held_back": run.held_back,
        "server_limits": run.limits.as_dict(),
        "notes": run.notes + fitted.notes,
        "lost": fitted.lost,
        "client_s": fitted.fit.client_s,
        "client_busy_s": fitted.busy_s,
        "client_busy_seqs": fitted.busy_seqs,
        "client_busy": [{"running": n, "s": t} for n, t in fitted.busy],
        "client_idle": [{"after_s": p, "s": t} for p, t in fitted.wake],
        "host": fitted.host,
        "held_out_error": fitted.errors.to_dict(orient="records"),
    }
    json_path = out.with_name(out.stem + ".probe.json")
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(run, fitted))
        print(f"wrote {out}, {rows_path} and {json_path}")
    return 0
