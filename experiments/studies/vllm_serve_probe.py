"""``ferry probe`` against a real ``vllm serve`` on this CPU, then ``ferry validate --url`` on a trace the probe never
sent: median TTFT and ITL errors for two model sizes, each repeated on a fresh server.

    python -m experiments.studies.vllm_serve_probe [--presets tiny,wide] [--repeats 3] [--venv ROOT/.venv-vllm] \\
        [--out artifacts/vllm-serve-probe] [--quick]

For every preset (random-weight Llamas of ``experiments/vllm_check/tiny_model_vllm.py``) and repeat: start ``vllm
serve`` with ``real_serve.SETTINGS`` (chunked prefill, 32 seats, a 256-token budget, bf16, eager; a fresh server
each time, warmed up with one prompt of every length to its budget: ``VllmServer.warm_up``), run ``ferry probe``
with its defaults (the limits read from the server's ``/server_info``), replay the
held-out trace (``TRACE``: Poisson arrivals, lengths drawn apart from the probe's designed requests, another seed
each repeat) with ``ferry validate --url`` against the same server, and read vLLM's own request histograms around
the replay (``/metrics``: its TTFT from the request's arrival at its API server, its queue and prefill times). Prints
one row per run and the spread over repeats, and writes ``OUT/runs.json`` and ``OUT/table.md``.

What ferry does not model, and how large it was in each run:
- request handling before a first token (``client_s``, fitted by the probe): added to the simulated TTFT in the
  "TTFT + handling" column, as ``ferry validate --url`` prints it;
- of which vLLM's own TTFT leaves out the HTTP, the SSE framing and the network (client TTFT minus vLLM's), and
  its frontend's work before the engine sees a request (vLLM's TTFT minus its queue and prefill times);
- the engine's host time per step is modelled (``per_iteration_s``, fitted by the probe): its size and share of a
  one-sequence decode step are in the table; detokenization and SSE framing per token run in vLLM's API server
  process beside the engine, and are in the token gaps the probe fitted.
``--quick`` runs the tiny model once, with a short probe (about a minute); ``--no-engine-idle`` serves without
``SCHED_IDLE`` for vLLM's engine and worker (``real_serve.VllmServer``), to see what their busy-waiting does to a
client on the same machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from experiments.cli import main as ferry
from experiments.vllm_check.real_serve import (
    ROOT,
    VllmServer,
    build_model,
    probe_args,
    server_timings,
    timing_means,
    validate_args,
)

TRACE = ("--num-prompts", "60", "--request-rate", "4", "--input-len", "uniform:32:512", "--output-len",
         "uniform:16:128")  # fmt: skip
QUICK_PROBE = ("--max-prompt", "384", "--decode-tokens", "32", "--max-concurrency", "16", "--batch-sizes",
               "2,4,8,16", "--repeats", "2")  # fmt: skip


def one_run(
    model: Path, preset: str, repeat: int, out: Path, venv: str | None, probe_extra: tuple[str, ...],
    engine_idle: bool = True,
) -> dict:  # fmt: skip
    """Serve, probe, replay; the run's figures (times in ms, errors as fractions)."""
    out.mkdir(parents=True, exist_ok=True)
    with VllmServer(model, out / "serve.log", venv=venv, engine_idle=engine_idle) as server:
        warmed = server.warm_up()
        profile = out / "probed.yaml"
        if ferry(probe_args(server, profile, "--budget-s", "600", *probe_extra)) != 0:
            raise RuntimeError(f"ferry probe failed against {server.url}: see {out}")
        before = server_timings(server.root)
        dest = out / "validate"
        if ferry(validate_args(server, profile, dest, *TRACE, "--seed", str(100 + repeat))) != 0:
            raise RuntimeError(f"ferry validate --url failed against {server.url}: see {out}")
        vllm_side = timing_means(before, server_timings(server.root))
        started = server.started_s
    report = json.loads(profile.with_name("probed.probe.json").read_text())
    comparison = json.loads((dest / "comparison.json").read_text())
    m, handled = comparison["metrics"], comparison.get("with_handling", {})
    requests = json.loads((dest / "real" / "summary.json").read_text())
    errors = {r["kind"]: r for r in report["held_out_error"]}
    host = report["host"]
    real_ttft_mean = requests.get("mean_ttft_ms")
    vllm_ttft = vllm_side["time_to_first_token_seconds"]
    queue, prefill = vllm_side["request_queue_time_seconds"], vllm_side["request_prefill_time_seconds"]
    return {
        "preset": preset + ("" if engine_idle else " (engine not idle)"),
        "repeat": repeat,
        "server_ready_s": started,
        "warm_up_s": warmed,
        "probe_requests": report["requests"],
        "probe_s": report["seconds"],
        "limits": report["server_limits"],
        "notes": report["notes"],
        "host_per_step_ms": 1e3 * host["per_iteration_s"],
        "per_sequence_ms": 1e3 * host["per_sequence_s"],
        "decode_step_ms": 1e3 * host["decode_step_s"],
        "host_share": host["host_share_of_decode_step"],
        "fitted_gap_error": host["fitted_gap_error"]["median"],
        "held_out_gap_error": errors["decode"]["median"],
        "held_out_batch_error": errors["batch"]["median"],
        "handling_ms": comparison["client_handling_ms"],
        "real_median_ttft_ms": m["median_ttft_ms"]["real"],
        "sim_median_ttft_ms": m["median_ttft_ms"]["sim"],
        "ttft_error": m["median_ttft_ms"]["rel_error"],
        "ttft_handled_error": handled.get("median_ttft_ms", {}).get("rel_error"),
        "real_median_itl_ms": m["median_itl_ms"]["real"],
        "sim_median_itl_ms": m["median_itl_ms"]["sim"],
        "itl_error": m["median_itl_ms"]["rel_error"],
        "throughput_error": m["request_throughput"]["rel_error"],
        "probe_held_back": report["held_back"],
        "held_back": comparison["held_back"]["n"],
        "replayed": comparison["held_back"]["of"],
        "busy_handling_ms": comparison["client_busy_handling_ms"],
        "light_handling_ms": (comparison["client_busy_handling"] or [{"ms": None}])[0]["ms"],
        "streamed_itl_error": comparison.get("streamed", {}).get("median_itl_ms", {}).get("rel_error"),
        "streamed_ttft_error": comparison.get("streamed", {}).get("median_ttft_ms", {}).get("rel_error"),
        # vLLM's own view of the replay (its /metrics): what its TTFT leaves out, and its front end's share
        "client_minus_vllm_ttft_ms": (real_ttft_mean - 1e3 * vllm_ttft) if real_ttft_mean and vllm_ttft else None,
        "vllm_frontend_ms": 1e3 * (vllm_ttft - queue - prefill)
        if vllm_ttft and queue is not None and prefill
        else None,
    }


COLUMNS = (
    ("preset", "model", "{}"),
    ("repeat", "run", "{}"),
    ("decode_step_ms", "decode step ms", "{:.2f}"),
    ("host_per_step_ms", "host/step ms", "{:.2f}"),
    ("host_share", "host share", "{:.0%}"),
    ("handling_ms", "handling ms", "{:.2f}"),
    ("light_handling_ms", "handling, light ms", "{:.2f}"),
    ("busy_handling_ms", "handling, heavy ms", "{:.2f}"),
    ("fitted_gap_error", "fitted gaps |err|", "{:.1%}"),
    ("held_out_gap_error", "held-out gaps |err|", "{:.1%}"),
    ("real_median_ttft_ms", "real TTFT ms", "{:.1f}"),
    ("ttft_error", "TTFT err", "{:+.1%}"),
    ("ttft_handled_error", "TTFT+handling err", "{:+.1%}"),
    ("real_median_itl_ms", "real ITL ms", "{:.2f}"),
    ("itl_error", "ITL err", "{:+.1%}"),
    ("held_back", "held back", "{}"),
    ("streamed_ttft_error", "streamed TTFT+h err", "{:+.1%}"),
    ("streamed_itl_error", "streamed ITL err", "{:+.1%}"),
    ("client_minus_vllm_ttft_ms", "HTTP+SSE ms", "{:.2f}"),
    ("vllm_frontend_ms", "vLLM frontend ms", "{:.2f}"),
)


def _cell(fmt: str, value: Any) -> str:
    return "-" if value is None else fmt.format(value)


def table(runs: list[dict]) -> str:
    """The runs as a markdown table, then the range over repeats of each preset's errors."""
    lines = ["| " + " | ".join(c[1] for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(f, r.get(k)) for k, _, f in COLUMNS) + " |" for r in runs]
    lines.append("")
    for preset in dict.fromkeys(r["preset"] for r in runs):
        mine = [r for r in runs if r["preset"] == preset]
        parts = []
        for key in ("ttft_handled_error", "itl_error", "streamed_ttft_error", "streamed_itl_error", "host_per_step_ms"):
            values = [r[key] for r in mine if r.get(key) is not None]
            if values:
                lo, hi, mid = min(values), max(values), statistics.median(values)
                f = "{:.2f} ms" if key.endswith("_ms") else "{:+.1%}"
                parts.append(f"{key} {f.format(lo)} to {f.format(hi)} (median {f.format(mid)})")
        lines.append(f"{preset}, {len(mine)} runs: " + "; ".join(parts))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny,wide", help="model presets, comma-separated (tiny_model_vllm.py)")
    p.add_argument("--repeats", type=int, default=3, help="fresh servers per preset")
    p.add_argument("--venv", default=None, help="the vLLM venv (default ROOT/.venv-vllm)")
    p.add_argument("--out", type=Path, default=ROOT / "artifacts" / "vllm-serve-probe", help="where to write")
    p.add_argument("--quick", action="store_true", help="the tiny model once, a short probe")
    p.add_argument(
        "--no-engine-idle",
        action="store_true",
        help="vLLM's engine core and worker at the normal policy, not SCHED_IDLE (see real_serve)",
    )
    args = p.parse_args(argv)
    presets = ["tiny"] if args.quick else [x.strip() for x in args.presets.split(",") if x.strip()]
    repeats = 1 if args.quick else args.repeats
    if repeats < 1:
        raise SystemExit(f"vllm_serve_probe: error: --repeats must be >= 1, got {repeats}")
    runs = []
    for preset in presets:
        model = build_model(args.out / "models" / preset, preset, venv=args.venv)
        for k in range(repeats):
            extra = QUICK_PROBE if args.quick else ()
            idle = not args.no_engine_idle
            runs.append(one_run(model, preset, k, args.out / f"{preset}-{k}", args.venv, extra, idle))
            print(json.dumps(runs[-1]), flush=True)
    text = table(runs)
    (args.out / "runs.json").write_text(json.dumps(runs, indent=2) + "\n")
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
