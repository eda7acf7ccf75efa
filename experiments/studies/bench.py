"""Simulator speed against its goals: requests, iterations, wall seconds, iterations per second and peak memory, and
the cost of each feature per iteration against the plain case.

    python -m experiments.studies.bench                       # the goals: 1M light and busy, each feature's cost
    python -m experiments.studies.bench --sizes 10000 100000 --workloads light --policies continuous chunked
    python -m experiments.studies.bench --sizes 20000 --engines reference --features prefix-caching disaggregated

Workloads, all llama-3-8b on h100-sxm (``--hardware``) with the limits a default ``vllm serve`` picks there,
Poisson arrivals at 20 requests/s (busy without ever idling, below saturation):
- ``light``: ShareGPT-like lengths (lognormal with the vLLM paper's ShareGPT means: 161 prompt and 338 output
  tokens): with the device profile of December 2026, about 60 sequences per iteration, 5.4 iterations per request;
- ``busy``: the same prompts with longer answers (mean 512 output tokens): about 110 sequences per iteration, 4.4
  iterations per request.

Features, each on the light lengths at ``--feature-size`` requests (chunked prefill), against the plain light case
of that size: ``prefix-caching`` (every prompt starts with one of 8 shared system prompts of 400 tokens; 20
requests/s), ``conversations`` (sessions of 4 turns, 5 s of thinking, each turn's prompt the conversation so far,
prefix caching on; 4 sessions/s, whose batches are the plain case's size: at 5 a turn's longer prompts make them a
third larger), ``disaggregated`` (one prefill and one decode replica over NVLink; 20 requests/s). Their cost is wall
time per iteration against the plain case's, and per sequence scheduled (an iteration of more sequences costs more).

Each case runs in a fresh process, after a small warm-up run that loads the compiled code, so its peak RSS and wall
time are its own; "wall" is the simulation call alone (engine and SimPy), "total" adds generating the workload and
the summary (which the peak RSS includes). The goals (issue 27), printed under the table: 1M requests of each
workload within 10 s of wall time and 1 GB peak RSS, and each feature within 2x the plain case's time per iteration.

Whole-process mode (``--whole-process``) times what a user waits for: ``ferry run ... --out TMP`` as a child process,
from its start to its exit, with its peak RSS (the child's own, from ``os.wait4``), its output captured:

    python -m experiments.studies.bench --whole-process                      # 20, 1000 and 1M requests, both engines
    python -m experiments.studies.bench --whole-process 20,1000 --engines compiled,reference --repeats 5
    python -m experiments.studies.bench --whole-process 20,1000 --pythonpath /tmp/before --json before.json
    python -m experiments.studies.bench --whole-process 20,1000 --pythonpath /tmp/before . --repeats 5

- cold: the first run after an install, numba's cache (``NUMBA_CACHE_DIR``) and ferry's kernel tables
  (``FERRY_CACHE_DIR``) pointed at empty folders for that one run (Python's ``.pyc`` files left as they are);
- warm: the median (and min-max) of ``--repeats`` runs after one untimed run, with the usual caches;
- inner sim: the simulation call alone, in a fresh process after a 200-request warm-up, as the cases above.
Jobs by requests: 20 (``20 requests at 8/s``: 1024 prompt and 256 output tokens, a first try of ``ferry run``),
1000 (``make run default``: the same at 1,000 requests), 1000000 (``1M requests``: 40 requests/s, 512 and 128
tokens, 256 sequences and 2048 tokens an iteration); another number is that many requests of the CLI's defaults. All
chunked, llama-3-8b on h100-sxm. The reference engine runs only jobs of at most ``--reference-max-requests``
(10,000). ``--pythonpath DIR`` times another checkout (a baseline worktree): ``python -c '...experiments.cli.main()'``
with ``PYTHONPATH=DIR``; given several, each case's warm runs take turns between them (the first of each, then the
second of each, ...), so that the machine's own drift falls on all alike: compare checkouts that way, not by tables
taken minutes apart.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INPUT_LEN = "lognormal:mean=161,sigma=1.0,max=2048"
OUTPUT_LEN = "lognormal:mean=338,sigma=0.8,max=2048"
WORKLOADS = {
    "light": {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "request_rate": 20.0},
    "busy": {"input_len": INPUT_LEN, "output_len": "lognormal:mean=512,sigma=0.8,max=2048", "request_rate": 20.0},
}
FEATURES: dict[str, dict[str, Any]] = {
    # every request starts with one of 8 system prompts of 400 tokens, and the KV cache reuses them
    "prefix-caching": {"enable_prefix_caching": True, "prefix_len": 400, "num_prefix_groups": 8},
    # sessions of 4 turns, each turn's prompt the conversation so far
    "conversations": {"enable_prefix_caching": True, "turns": 4, "think_time_s": 5.0, "request_rate": 4.0},
    # one prefill replica and one decode replica (two GPUs) over NVLink
    "disaggregated": {"disaggregation": {"prefill": {"count": 1}, "decode": {"count": 1}}},
}
GOAL_WALL_S, GOAL_RSS_MB, GOAL_SIZE, GOAL_FEATURE_RATIO = 10.0, 1024.0, 1_000_000, 2.0
HARDWARE = "h100-sxm"  # the device profile of every case (--hardware): kernels timed from its measured tables


def case_config(
    policy: str, size: int, engine: str, workload: str, feature: str | None, seed: int, hardware: str = HARDWARE,
    **extra: Any,
) -> Any:  # fmt: skip
    """The run config of one case (``extra``: run config fields that replace the case's)."""
    from experiments.runner.config import RunConfig

    fields: dict[str, Any] = {"model": "llama-3-8b", "hardware": hardware, "policy": policy, "engine": engine,
                              "num_prompts": size, "seed": seed} | WORKLOADS[workload]  # fmt: skip
    if feature is not None:
        fields |= FEATURES[feature]
        if "turns" in fields:
            fields["num_prompts"] = size // fields["turns"]
    return RunConfig.model_validate(fields | extra)


def job_config(fields: dict[str, Any], size: int, engine: str) -> Any:
    """The run config of a whole-process job's ``fields`` (its ``ferry run`` flags) at ``size`` requests."""
    from experiments.runner.config import RunConfig

    return RunConfig.model_validate(fields | {"num_prompts": size, "engine": engine})


def one_case(
    policy: str, size: int, engine: str, workload: str = "light", feature: str | None = None, seed: int = 0,
    hardware: str = HARDWARE, fields: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run one case in this process and measure it (``fields``: a whole-process job's run config fields in place of
    the case's policy, workload, feature, seed and hardware)."""
    from experiments.runner.simulation import build_workload, run_simulation

    def config(n: int) -> Any:
        if fields is not None:
            return job_config(fields, n, engine)
        return case_config(policy, n, engine, workload, feature, seed, hardware)

    t = time.perf_counter()
    run_simulation(config(200))  # warm-up: load the code
    warmup = time.perf_counter() - t
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    cfg = config(size)
    workload_ = build_workload(cfg)
    t1 = time.perf_counter()
    timings: dict[str, float] = {}
    result = run_simulation(cfg, workload_, on_progress=None, timings=timings)
    t2 = time.perf_counter()
    s = result.summary
    return {
        "policy": policy,
        "workload": workload,
        "feature": feature or "",
        "engine": s["engine"],
        "requests": len(workload_),
        "iterations": s["num_iterations"],
        "wall_s": timings["simulate_s"],
        "total_s": (t1 - t0) + (t2 - t1),
        "warmup_s": warmup,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mb": rss_before,
        "mean_batch_size": s.get("mean_batch_size"),
        "gpu_idle_fraction": s["gpu_idle_fraction"],
        "completed": s["completed"],
        "itl_kept": s["itl_kept"],
    }


def bare_simpy(timeouts: int) -> float:
    """Wall seconds of a SimPy loop that only yields ``timeouts`` timeouts."""
    import simpy

    def proc(env: simpy.Environment):  # noqa: ANN202
        for _ in range(timeouts):
            yield env.timeout(0.001)

    env = simpy.Environment()
    env.process(proc(env))
    t = time.perf_counter()
    env.run()
    return time.perf_counter() - t


def run_case(
    policy: str, size: int, engine: str, workload: str, feature: str | None, seed: int, hardware: str = HARDWARE,
    fields: dict[str, Any] | None = None, pythonpath: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``one_case`` in a fresh process (``pythonpath``: of the checkout there, with this file run as a script, since
    that checkout's own bench may lack ``fields``). A failing child raises ``ChildFailed``."""
    where = [str(Path(__file__).resolve())] if pythonpath else ["-m", "experiments.studies.bench"]
    cmd = [sys.executable, *where, "--one", policy, str(size), engine, workload, feature or "-", "--seed", str(seed),
           "--hardware", hardware]  # fmt: skip
    if fields is not None:
        cmd += ["--fields", json.dumps(fields)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env(pythonpath))
    if done.returncode != 0:
        raise ChildFailed(cmd, done.returncode, done.stderr)
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return row


# whole-process mode: `ferry run` as a user starts it, timed from its start to its exit

CLI_STUB = "import sys; sys.argv[0]='ferry'; from experiments.cli import main; sys.exit(main())"
JOB_BASE: dict[str, Any] = {"model": "llama-3-8b", "hardware": HARDWARE, "policy": "chunked"}
JOBS: dict[int, tuple[str, dict[str, Any]]] = {  # requests: (name, run config fields beyond JOB_BASE)
    20: ("20 requests at 8/s", {"request_rate": 8, "input_len": 1024, "output_len": 256}),
    1000: ("make run default", {"request_rate": 8, "input_len": 1024, "output_len": 256}),
    1_000_000: ("1M requests", {"input_len": 512, "output_len": 128, "max_num_seqs": 256,
                                "max_num_batched_tokens": 2048, "request_rate": 40}),
}  # fmt: skip
WHOLE_PROCESS_SIZES = [20, 1000, 1_000_000]
REFERENCE_MAX_REQUESTS = 10_000  # the reference engine takes very long beyond this
RSS_UNIT = 1024 * 1024 if sys.platform == "darwin" else 1024  # ru_maxrss per MB: bytes on macOS, KB on Linux
STDERR_TAIL = 2000  # characters of a failing child's stderr in the error
ENGINES = ("auto", "compiled", "reference")  # auto: what a run without --engine gets (sim.engine.choose_engine)


class ChildFailed(RuntimeError):
    """A child process exited non-zero; the message ends with the tail of its stderr."""

    def __init__(self, cmd: list[str], returncode: int, stderr: str) -> None:
        super().__init__(f"{shlex.join(cmd)} exited with {returncode}:\n{stderr[-STDERR_TAIL:]}")
        self.returncode = returncode
        self.stderr = stderr


@dataclass(frozen=True, slots=True)
class Job:
    name: str  # its key in the table and the JSON
    fields: dict[str, Any]  # run config fields, each a `ferry run` flag (``--`` and the name with '-' for '_')

    @property
    def requests(self) -> int:
        return int(self.fields["num_prompts"])

    def flags(self) -> list[str]:
        """The job's ``ferry run`` flags."""
        return [a for k, v in self.fields.items() for a in ("--" + k.replace("_", "-"), str(v))]


def job_of(requests: int) -> Job:
    """The named job of that many requests, or the 20-request job at that size."""
    name, fields = JOBS.get(requests, (f"{requests:,} requests", {}))
    return Job(name, JOB_BASE | {"num_prompts": requests} | fields)


def ferry_prefix(ferry_cmd: str | None = None, pythonpath: str | None = None) -> list[str]:
    """The command that starts ``ferry``: ``ferry_cmd`` split as a shell would, else with ``pythonpath`` that
    checkout's CLI through this Python, else the ``ferry`` beside this Python (its CLI if there is none)."""
    if ferry_cmd:
        return shlex.split(ferry_cmd)
    beside = Path(sys.executable).parent / "ferry"
    if pythonpath or not beside.exists():
        return [sys.executable, "-c", CLI_STUB]
    return [str(beside)]


def child_env(pythonpath: str | None = None, caches: Path | None = None) -> dict[str, str]:
    """This process's environment, with ``pythonpath`` first on ``PYTHONPATH`` and, given ``caches``, numba's and
    ferry's caches in empty folders under it (a cold start)."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    if caches is not None:
        for var, name in (("NUMBA_CACHE_DIR", "numba"), ("FERRY_CACHE_DIR", "ferry")):
            (caches / name).mkdir(parents=True)
            env[var] = str(caches / name)
    return env


def timed_run(cmd: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None) -> tuple[float, float]:
    """Run ``cmd`` to its exit, its stdout and stderr captured: (wall s from its start to its exit, its peak RSS in
    MB). A non-zero exit raises ``ChildFailed`` with the tail of its stderr."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=cwd)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        if proc.returncode != 0:
            err.seek(0)
            raise ChildFailed(cmd, proc.returncode, err.read().decode(errors="replace"))
    return wall, usage.ru_maxrss / RSS_UNIT


def whole_process(
    job: Job, engine: str, repeats: int = 3, cold: bool = True, inner: bool = True, ferry_cmd: str | None = None,
    pythonpath: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``ferry run`` of ``job`` on ``engine`` as child processes, each writing into a fresh ``--out`` folder: the cold
    run's wall s and peak RSS MB (None without ``cold``), the median, min and max wall s of ``repeats`` warm runs
    after an untimed one and their highest peak RSS MB, and (``inner``) the simulation call's wall s alone."""
    return whole_processes(job, engine, repeats, cold, inner, ferry_cmd, [pythonpath])[0]


def whole_processes(
    job: Job, engine: str, repeats: int, cold: bool, inner: bool, ferry_cmd: str | None,
    pythonpaths: list[str | None],
) -> list[dict[str, Any]]:  # fmt: skip
    """``whole_process`` of each checkout in ``pythonpaths`` (one row each), their runs taken in turn: each one's cold
    run, each one's warm-up, then the first warm run of each, the second of each, and so on, so that a change of
    the machine's own speed during the case (a shared VM's moves by 15-30% within minutes) falls on every checkout
    alike instead of on whichever ran last."""
    prefixes = [ferry_prefix(ferry_cmd, path) for path in pythonpaths]
    with tempfile.TemporaryDirectory(prefix="ferry-bench-") as tmp:

        def once(side: int, caches: Path | None = None) -> tuple[float, float]:
            out = tempfile.mkdtemp(dir=tmp)
            try:  # in tmp: `python -c` puts the working folder first on sys.path, before PYTHONPATH
                return timed_run([*prefixes[side], "run", *job.flags(), "--engine", engine, "--out", out],
                                 child_env(pythonpaths[side], caches), cwd=tmp)  # fmt: skip
            finally:
                shutil.rmtree(out, ignore_errors=True)

        sides = range(len(pythonpaths))
        first = [once(i, Path(tempfile.mkdtemp(dir=tmp))) if cold else None for i in sides]
        for i in sides:
            once(i)  # warm-up: fills the usual caches
        warm: list[list[tuple[float, float]]] = [[] for _ in sides]
        for _ in range(repeats):
            for i in sides:
                warm[i].append(once(i))
    rows = []
    for i, path in enumerate(pythonpaths):
        walls = [w for w, _ in warm[i]]
        sim = run_case(job.fields["policy"], job.requests, engine, "-", None, 0, fields=job.fields,
                       pythonpath=path) if inner else None  # fmt: skip
        cold_run = first[i]
        rows.append({
            "job": job.name,
            "engine": engine,
            "requests": job.requests,
            "cold_s": cold_run[0] if cold_run else None,
            "cold_rss_mb": cold_run[1] if cold_run else None,
            "warm_s": statistics.median(walls),
            "warm_min_s": min(walls),
            "warm_max_s": max(walls),
            "warm_runs_s": walls,
            "peak_rss_mb": max(r for _, r in warm[i]),
            "inner_sim_s": sim["wall_s"] if sim else None,
            "inner_iterations": sim["iterations"] if sim else None,
            "command": shlex.join([*prefixes[i], "run", *job.flags(), "--engine", engine, "--out", "TMP"]),
            "pythonpath": path,
        })  # fmt: skip
    return rows


WHOLE_HEADER = ("| job | engine | cold s | warm s (median) | min-max | peak RSS MB | inner sim s |\n"
                "|---|---|---:|---:|---:|---:|---:|")  # fmt: skip
WHOLE_HEADER_CHECKOUTS = WHOLE_HEADER.replace(" |\n", " | checkout |\n") + "---|"  # (several --pythonpath)


def show_whole(row: dict[str, Any], checkout: bool = False) -> str:
    """One markdown row of ``whole_process``'s result (``checkout``: with its ``PYTHONPATH`` in a last column)."""
    cold = "-" if row["cold_s"] is None else f"{row['cold_s']:.2f}"
    inner = "-" if row["inner_sim_s"] is None else f"{row['inner_sim_s']:.4f}"
    last = f" {row['pythonpath'] or '-'} |" if checkout else ""
    return (f"| {row['job']} | {row['engine']} | {cold} | {row['warm_s']:.2f} | "
            f"{row['warm_min_s']:.2f}-{row['warm_max_s']:.2f} | {row['peak_rss_mb']:,.0f} | {inner} |"
            f"{last}")  # fmt: skip


def whole_process_main(args: argparse.Namespace, engines: list[str]) -> int:
    """The whole-process table of ``args.whole_process``'s jobs (and ``--json``)."""
    paths = args.pythonpath or [None]
    several = len(paths) > 1
    if args.pythonpath:
        print(f"PYTHONPATH={' '.join(paths)}" + (": warm runs taken in turn" if several else ""))
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("note: PYTHONDONTWRITEBYTECODE is set: children without .pyc files compile their Python every run")
    print(WHOLE_HEADER if not several else WHOLE_HEADER_CHECKOUTS, flush=True)
    rows = []
    for size in args.whole_process:
        job = job_of(size)
        for engine in engines:
            if engine == "reference" and job.requests > args.reference_max_requests:
                continue
            for row in whole_processes(job, engine, args.repeats, args.cold, args.inner, args.ferry_cmd, paths):
                rows.append(row)
                print(show_whole(row, several), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


def engine_names(text: str) -> list[str]:
    """Engines named in one argument, comma-separated."""
    names = [n for n in text.split(",") if n]
    for n in names:
        if n not in ENGINES:
            raise argparse.ArgumentTypeError(f"invalid engine {n!r} (choose from {', '.join(ENGINES)})")
    return names


def sizes(text: str) -> list[int]:
    """Numbers of requests, comma-separated."""
    try:
        return [int(n) for n in text.split(",") if n]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not numbers of requests: {text!r}") from None


HEADER = (f"{'policy':<11}{'workload':<9}{'feature':<15}{'engine':<10}{'requests':>10}{'iterations':>11}{'batch':>6}"
          f"{'wall s':>8}{'total s':>8}{'iter/s':>10}{'peak MB':>8}{'SimPy s':>8}{'ratio':>6}")  # fmt: skip


def show(row: dict[str, Any]) -> str:
    return (f"{row['policy']:<11}{row['workload']:<9}{row['feature'] or '-':<15}{row['engine']:<10}"
            f"{row['requests']:>10,}{row['iterations']:>11,}{row['mean_batch_size'] or 0:>6.1f}{row['wall_s']:>8.2f}"
            f"{row['total_s']:>8.2f}{row['iterations'] / row['wall_s']:>10,.0f}{row['peak_rss_mb']:>8,.0f}"
            f"{row['simpy_s']:>8.2f}{row['ratio']:>6.2f}")  # fmt: skip


def goals(rows: list[dict[str, Any]]) -> list[str]:
    """One line per goal the rows measure: the 1M cases' wall time and memory, and each feature's time per iteration
    against the plain case of its size, policy and engine."""
    lines = []
    for row in rows:
        if row["requests"] == GOAL_SIZE and not row["feature"] and row["engine"] == "compiled":
            ok = row["wall_s"] <= GOAL_WALL_S and row["peak_rss_mb"] <= GOAL_RSS_MB
            lines.append(f"{'met' if ok else 'MISSED':<7}{row['policy']} {row['workload']} 1M: {row['wall_s']:.2f} s "
                         f"(goal {GOAL_WALL_S:g}), {row['peak_rss_mb']:,.0f} MB (goal {GOAL_RSS_MB:,.0f})")  # fmt: skip
    plain = {(r["engine"], r["requests"]): r for r in rows if not r["feature"] and r["workload"] == "light"
             and r["policy"] == "chunked"}  # fmt: skip
    for row in rows:
        base = plain.get((row["engine"], row["requests"]))
        if row["feature"] and base is not None:
            ratio = (row["wall_s"] / row["iterations"]) / (base["wall_s"] / base["iterations"])
            per_seq = ratio * (base["mean_batch_size"] or 1) / (row["mean_batch_size"] or 1)
            batches = f"{row['mean_batch_size']:.0f} a batch against {base['mean_batch_size']:.0f}"
            lines.append(f"{'met' if ratio <= GOAL_FEATURE_RATIO else 'MISSED':<7}{row['feature']}: {ratio:.2f}x the "
                         f"plain case's time per iteration (goal {GOAL_FEATURE_RATIO:g}x), {per_seq:.2f}x per "
                         f"sequence scheduled ({batches})")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--policies", nargs="+", default=["continuous", "chunked"])
    p.add_argument("--engines", nargs="+", type=engine_names, default=None, metavar="ENGINE",
                   help="compiled, reference (spaces or commas; default compiled, whole-process both)")  # fmt: skip
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--features", nargs="*", default=list(FEATURES), choices=list(FEATURES),
                   help="features to time against the plain case (none: --features with no value)")  # fmt: skip
    p.add_argument("--feature-size", type=int, default=100_000, help="requests of each feature's case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hardware", default=HARDWARE,
                   help=f"device profile of every case (default {HARDWARE}; e.g. h100-sxm.datasheet: the roofline "
                        "alone, no measured tables)")  # fmt: skip
    p.add_argument("--json", default=None, help="also write the rows here")
    g = p.add_argument_group("whole process", "`ferry run` as a child process, from its start to its exit")
    g.add_argument("--whole-process", nargs="?", type=sizes, const=WHOLE_PROCESS_SIZES, default=None,
                   metavar="SIZES", help="jobs by requests, comma-separated: 20, 1000 and 1000000 are named jobs, "
                   "another the 20-request job at that size (default 20,1000,1000000)")  # fmt: skip
    g.add_argument("--repeats", type=int, default=3, help="warm runs after the untimed one (3)")
    g.add_argument("--cold", action=argparse.BooleanOptionalAction, default=True,
                   help="also time a first run with empty numba and ferry caches")  # fmt: skip
    g.add_argument("--inner", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the simulation call alone, in a fresh process")  # fmt: skip
    g.add_argument("--reference-max-requests", type=int, default=REFERENCE_MAX_REQUESTS,
                   help="run the reference engine only on jobs of at most this many requests "
                        f"({REFERENCE_MAX_REQUESTS:,})")  # fmt: skip
    g.add_argument("--ferry-cmd", default=None,
                   help="command that starts ferry, split as a shell would (default: the ferry beside this "
                        "Python; with --pythonpath: that checkout's CLI through this Python)")  # fmt: skip
    g.add_argument("--pythonpath", nargs="+", default=None, metavar="DIR",
                   help="time the checkout in DIR: its CLI through this Python with PYTHONPATH=DIR; several: "
                        "each case's warm runs taken in turn (before and after on the same machine)")  # fmt: skip
    p.add_argument("--one", nargs=5, help=argparse.SUPPRESS)  # POLICY SIZE ENGINE WORKLOAD FEATURE: one case, as JSON
    p.add_argument("--fields", type=json.loads, default=None, help=argparse.SUPPRESS)  # with --one: a job's fields
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    if args.one:
        policy, size, engine, workload, feature = args.one
        row = one_case(policy, int(size), engine, workload, None if feature == "-" else feature, args.seed,
                       args.hardware, args.fields)  # fmt: skip
        print(json.dumps(row))
        return 0
    whole = args.whole_process is not None
    default = list(ENGINES) if whole else ["compiled"]
    engines = [e for group in args.engines for e in group] if args.engines else default
    if whole:
        return whole_process_main(args, engines)
    args.engines = engines

    cases: list[tuple[str, int, str, str, str | None]] = []
    for engine in args.engines:
        for workload in args.workloads:
            for policy in args.policies:
                cases += [(policy, size, engine, workload, None) for size in args.sizes]
        if args.features:
            if (engine, "light", "chunked", args.feature_size) not in {(c[2], c[3], c[0], c[1]) for c in cases}:
                cases.append(("chunked", args.feature_size, engine, "light", None))
            cases += [("chunked", args.feature_size, engine, "light", f) for f in args.features]
    print(HEADER, flush=True)
    rows = []
    for policy, size, engine, workload, feature in cases:
        row = run_case(policy, size, engine, workload, feature, args.seed, args.hardware)
        row["simpy_s"] = bare_simpy(row["iterations"])
        row["ratio"] = row["wall_s"] / row["simpy_s"]
        rows.append(row)
        print(show(row), flush=True)
    print()
    for line in goals(rows):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
