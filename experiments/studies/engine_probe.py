"""``ferry probe`` against a real engine on this CPU, then ``ferry validate --url`` of two held-out traces, a light load
and a heavier one, on the same server: median TTFT and ITL errors for two model sizes, each repeated on a fresh
server. The engines are llama.cpp's ``llama-server`` (``experiments/llamacpp_check/real_server.py``) and ``vllm
serve`` (``experiments/vllm_check/real_serve.py``), each with the settings its module states.

    python -m experiments.studies.engine_probe [--engine llamacpp|vllm] [--presets tiny,wide] [--repeats 3] \\
        [--out artifacts/engine-probe-ENGINE] [--server-args '...'] [--quick]

For every preset (random-weight Llamas of ``tiny_model_vllm.py``'s shapes) and repeat: start the server, warm it up
(each module's ``warm_up``), run ``ferry probe`` with its defaults and the flags the engine's module gives it
(llama-server states its slots but not its batch size: ``--max-num-batched-tokens 256``), then replay ``LOADS``'
two traces with ``ferry validate --url`` and the engine's scheduler flags (Poisson arrivals, prompts uniform 32-512
tokens, outputs uniform 16-128, seeds the probe never uses: the probe draws its prompts from fresh entropy and sends
designed sizes, not a trace). A load is a request rate per preset: the light one leaves the server mostly idle
between requests, the heavy one keeps several requests in flight (``in flight`` in the table: the real requests'
summed latency over the replay's length). Errors are ferry / real - 1 of the trace's medians; TTFT with the
request handling the probe measured added (``ferry validate --url``'s ``with_handling``), and without.

This study wants the machine otherwise idle: before each run it waits (``--wait-idle`` seconds at most) until the
CPUs were less than ``IDLE_BUSY`` busy over ``IDLE_WINDOW_S`` seconds (``/proc/stat``; its own server is stopped
then), and it records that share (``busy before``) and the one-minute load average before and after the run (which
counts its own server and client too). Prints one row per run and load, then each preset's and load's
median and range over the repeats; writes ``OUT/runs.json`` and ``OUT/table.md``. ``--quick``: the tiny model
once, a short probe and short traces (a minute or two).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.cli import main as ferry

ROOT = Path(__file__).resolve().parents[2]
# request rates (per s) of the light and the heavy trace, per preset: the tiny model's steps are shorter
LOADS = {"tiny": (2.0, 10.0), "wide": (1.0, 2.5)}
REQUESTS = {"light": 40, "heavy": 80}  # requests per trace
LENGTHS = ("--input-len", "uniform:32:512", "--output-len", "uniform:16:128")
QUICK_PROBE = ("--max-prompt", "384", "--decode-tokens", "32", "--max-concurrency", "16", "--batch-sizes",
               "2,4,8,16", "--repeats", "2")  # fmt: skip
QUICK_REQUESTS = 20
IDLE_BUSY = 0.15  # the share of the CPUs' time others may use while a run starts
IDLE_WINDOW_S = 5.0  # seconds over which that share is read


@dataclass(frozen=True)
class Engine:
    """How to build a preset's model, start a server of it and name the probe's and validate's arguments."""

    build_model: Callable[[Path, str], Path]
    server: Callable[[Path, Path, tuple[str, ...]], Any]  # (model, log, extra server flags) -> a server to enter
    probe_args: Callable[..., list[str]]
    validate_args: Callable[..., list[str]]


def engine(name: str) -> Engine:
    if name == "llamacpp":
        from experiments.llamacpp_check import real_server as L

        return Engine(lambda out, preset: L.build_model(out, preset),
                      lambda model, log, extra: L.LlamaServer(model, log, args=[*L.SETTINGS, *extra]),
                      L.probe_args, L.validate_args)  # fmt: skip
    if name == "vllm":
        from experiments.vllm_check import real_serve as V

        return Engine(lambda out, preset: V.build_model(out, preset),
                      lambda model, log, extra: V.VllmServer(model, log, args=[*V.SETTINGS, *extra]),
                      V.probe_args, V.validate_args)  # fmt: skip
    raise SystemExit(f"engine_probe: error: --engine {name!r}: llamacpp or vllm")


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0]) if Path("/proc/loadavg").exists() else float("nan")


def busy_share(window_s: float = IDLE_WINDOW_S) -> float:
    """The share of all CPUs' time spent busy over the next ``window_s`` seconds (``/proc/stat``: not idle nor
    waiting for I/O); NaN where there is no ``/proc/stat``."""
    stat = Path("/proc/stat")
    if not stat.exists():
        return float("nan")

    def times() -> tuple[int, int]:
        fields = [int(x) for x in stat.read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]

    total0, idle0 = times()
    time.sleep(window_s)
    total1, idle1 = times()
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_idle(limit_s: float) -> float:
    """Wait until the machine is less than ``IDLE_BUSY`` busy, at most ``limit_s`` seconds; the last share read."""
    deadline = time.monotonic() + limit_s
    while True:
        busy = busy_share()
        if not busy >= IDLE_BUSY or time.monotonic() >= deadline:
            return busy


def in_flight(requests: pd.DataFrame) -> float:
    """Requests in flight on average over a replay: their summed latency over its length."""
    done = requests.dropna(subset=["finish_s"])
    span = float(done["finish_s"].max() - done["arrival_s"].min())
    return float((done["finish_s"] - done["arrival_s"]).sum()) / span if span > 0 else float("nan")


def replay_row(dest: Path) -> dict[str, Any]:
    """One replay's figures (times in ms, errors as fractions) from ``ferry validate --url``'s outputs."""
    comparison = json.loads((dest / "comparison.json").read_text())
    m, handled = comparison["metrics"], comparison.get("with_handling", {})
    return {
        "real_median_ttft_ms": m["median_ttft_ms"]["real"],
        "ttft_error": m["median_ttft_ms"]["rel_error"],
        "ttft_handled_error": handled.get("median_ttft_ms", {}).get("rel_error"),
        "real_median_itl_ms": m["median_itl_ms"]["real"],
        "sim_median_itl_ms": m["median_itl_ms"]["sim"],
        "itl_error": m["median_itl_ms"]["rel_error"],
        "throughput_error": m["request_throughput"]["rel_error"],
        "real_in_flight": in_flight(pd.read_csv(dest / "real" / "requests.csv")),
        "sim_in_flight": in_flight(pd.read_csv(dest / "sim" / "requests.csv")),
        "held_back": comparison["held_back"]["n"],
        "coalesced": comparison["coalesced"]["n"],
        "failed": comparison.get("failed", {}).get("n", 0),
    }


def one_run(
    eng: Engine, model: Path, preset: str, repeat: int, out: Path, server_args: tuple[str, ...], quick: bool,
    wait_s: float = 0.0,
) -> list[dict[str, Any]]:  # fmt: skip
    """Wait for an idle machine (``wait_s`` seconds at most), serve, probe, replay both loads; one row per load."""
    out.mkdir(parents=True, exist_ok=True)
    busy = wait_idle(wait_s) if wait_s > 0 else busy_share()
    rows, before = [], load_average()
    with eng.server(model, out / "serve.log", server_args) as server:
        warmed = server.warm_up()
        profile = out / "probed.yaml"
        extra = QUICK_PROBE if quick else ()
        if ferry(eng.probe_args(server, profile, "--budget-s", "600", *extra)) != 0:
            raise RuntimeError(f"ferry probe failed against {server.url}: see {out}")
        for k, (load, rate) in enumerate(zip(("light", "heavy"), LOADS[preset], strict=True)):
            n = QUICK_REQUESTS if quick else REQUESTS[load]
            seed = str(100 + 10 * repeat + k)
            trace = ("--num-prompts", str(n), "--request-rate", f"{rate:g}", *LENGTHS, "--seed", seed)
            dest = out / f"validate-{load}"
            if ferry(eng.validate_args(server, profile, dest, *trace)) != 0:
                raise RuntimeError(f"ferry validate --url failed against {server.url}: see {dest}")
            rows.append({"load": load, "rate": rate} | replay_row(dest))
    report = json.loads(profile.with_name("probed.probe.json").read_text())
    host = report["host"]
    run = {
        "preset": preset,
        "repeat": repeat,
        "warm_up_s": warmed,
        "probe_requests": report["requests"],
        "probe_s": report["seconds"],
        "limits": report["server_limits"],
        "notes": report["notes"],
        "decode_step_ms": 1e3 * host["decode_step_s"],
        "host_per_step_ms": 1e3 * host["per_iteration_s"],
        "per_sequence_ms": 1e3 * host["per_sequence_s"],
        "fitted_gap_error": host["fitted_gap_error"]["median"],
        "held_out": {r["kind"]: r["median"] for r in report["held_out_error"]},
        "busy_before": busy,
        "load_average": [before, load_average()],
    }
    return [run | row for row in rows]


COLUMNS = (
    ("preset", "model", "{}"),
    ("repeat", "run", "{}"),
    ("load", "load", "{}"),
    ("rate", "req/s", "{:g}"),
    ("decode_step_ms", "decode step ms", "{:.2f}"),
    ("host_per_step_ms", "host/step ms", "{:.2f}"),
    ("fitted_gap_error", "fitted gaps |err|", "{:.1%}"),
    ("real_in_flight", "in flight", "{:.1f}"),
    ("real_median_ttft_ms", "real TTFT ms", "{:.1f}"),
    ("ttft_error", "TTFT err", "{:+.1%}"),
    ("ttft_handled_error", "TTFT+handling err", "{:+.1%}"),
    ("real_median_itl_ms", "real ITL ms", "{:.2f}"),
    ("itl_error", "ITL err", "{:+.1%}"),
    ("held_back", "held back", "{}"),
    ("busy_before", "busy before", "{:.0%}"),
    ("load_average", "load avg", "{}"),
)


def _cell(fmt: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "/".join(f"{v:.1f}" for v in value)
    return fmt.format(value)


def table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table, then each preset's and load's median and range over the repeats."""
    lines = ["| " + " | ".join(c[1] for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(f, r.get(k)) for k, _, f in COLUMNS) + " |" for r in rows]
    lines.append("")
    for preset, load in dict.fromkeys((r["preset"], r["load"]) for r in rows):
        mine = [r for r in rows if r["preset"] == preset and r["load"] == load]
        parts = []
        for key in ("real_median_ttft_ms", "ttft_handled_error", "real_median_itl_ms", "itl_error", "real_in_flight"):
            values = [r[key] for r in mine if r.get(key) is not None]
            if values:
                lo, hi, mid = min(values), max(values), statistics.median(values)
                f = "{:+.1%}" if key.endswith("error") else "{:.2f}"
                parts.append(f"{key} {f.format(mid)} ({f.format(lo)} to {f.format(hi)})")
        lines.append(f"{preset}, {load}, {len(mine)} runs: " + "; ".join(parts))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", default="llamacpp", help="llamacpp (llama-server) or vllm (vllm serve)")
    p.add_argument("--presets", default="tiny,wide", help="model presets, comma-separated (tiny, wide)")
    p.add_argument("--repeats", type=int, default=3, help="fresh servers per preset")
    p.add_argument("--out", type=Path, default=None, help="where to write (default artifacts/engine-probe-ENGINE)")
    p.add_argument("--server-args", default="", help="flags added to the engine's settings (space-separated)")
    p.add_argument("--quick", action="store_true", help="the tiny model once, a short probe and short traces")
    p.add_argument("--wait-idle", type=float, default=600.0, help="seconds a run waits for an idle machine at most")
    args = p.parse_args(argv)
    eng = engine(args.engine)
    out = args.out or ROOT / "artifacts" / f"engine-probe-{args.engine}"
    presets = ["tiny"] if args.quick else [x.strip() for x in args.presets.split(",") if x.strip()]
    unknown = [x for x in presets if x not in LOADS]
    if unknown or args.repeats < 1:
        raise SystemExit(f"engine_probe: error: presets are {', '.join(LOADS)} and --repeats >= 1")
    repeats = 1 if args.quick else args.repeats
    rows: list[dict[str, Any]] = []
    for preset in presets:
        model = eng.build_model(out / "models" / preset, preset)
        for k in range(repeats):
            dest, extra = out / f"{preset}-{k}", tuple(args.server_args.split())
            got = one_run(eng, model, preset, k, dest, extra, args.quick, args.wait_idle)
            rows += got
            for row in got:
                print(json.dumps(row), flush=True)
    text = table(rows)
    (out / "runs.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
