"""A real ``vllm serve`` on this machine's CPU, as a subprocess of ferry's venv: for tests and studies that probe it.

    python -m experiments.vllm_check.real_serve [--preset tiny|wide] [--venv ROOT/.venv-vllm] [--port 0] \\
        [vllm serve's flags ...]      # builds the model, serves it, prints its URL, until Ctrl-C or SIGTERM

The model is a random-weight Llama written by ``tiny_model_vllm.py`` (seeded: the same preset gives the same files),
served by ``serve_vllm.py`` in the vLLM venv (``make vllm-venv``: ``ROOT/.venv-vllm``; another with ``venv``), on a
free localhost port, with the flags of the setting ``ferry probe`` was checked in (``SETTINGS``: chunked prefill,
32 seats, a 256-token budget, bf16, eager, blocks of 32 tokens: the CPU attention backend wants a multiple of 32), a
KV cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB, and vLLM's development endpoints on (``VLLM_SERVER_DEV_MODE=1``), so
that ``/server_info`` states the scheduler's limits (``experiments.real.limits``); ``dev_mode=False`` serves as
``vllm serve`` does by default. vLLM's engine core runs under ``SCHED_IDLE`` (``engine_idle``, the
default; ``serve_vllm.py`` says why): its busy-waiting otherwise starves a client on the same 2-core machine for up
to 1.5 s, and the client then reads whole responses at once. ``VllmServer`` starts it in a session of its own
(vLLM runs an engine process and a worker beside its API server) and ends that whole session when it stops.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from experiments.children import ends_with_this_process, free_port

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DEFAULT_VENV = ROOT / ".venv-vllm"
SERVED_NAME = "ferry-tiny-llama"
# vllm serve's flags for the setting probed: chunked prefill (V1's default), 32 seats, a 256-token budget, bf16
SETTINGS = ("--max-num-seqs", "32", "--max-num-batched-tokens", "256", "--dtype", "bfloat16", "--enforce-eager",
            "--block-size", "32", "--max-model-len", "4096")  # fmt: skip
KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE: GiB of KV cache (524,288 tokens of the tiny model)
READY_TIMEOUT_S = 240.0  # the longest wait for /health to answer 200 (s); ~20 s on a 2-core machine, eager
# serve_vllm.py's switch (read there; not imported: that module answers vLLM's version lookup when imported)
IDLE_ENV = "FERRY_VLLM_ENGINE_IDLE"
STOP_TIMEOUT_S = 20.0  # seconds SIGTERM has to end the server before SIGKILL
WARM_UP_TOKENS = 256  # SETTINGS' --max-num-batched-tokens: every token count an iteration can have


def venv_python(venv: str | Path | None = None) -> Path:
    """The vLLM venv's Python (``venv``, default ``ROOT/.venv-vllm``); ValueError when there is none."""
    where = Path(venv) if venv is not None else DEFAULT_VENV
    python = where / "bin" / "python"
    if not python.exists():
        raise ValueError(f"--venv {str(where)!r}: no vLLM venv there (no bin/python); build it with make vllm-venv")
    return python


def build_model(out: Path, preset: str = "tiny", seed: int = 0, venv: str | Path | None = None) -> Path:
    """``out`` holding the preset's checkpoint (built by ``tiny_model_vllm.py`` in the vLLM venv unless ``out``
    already holds the one those arguments make); returns ``out``."""
    stamp = out / "ferry-model.json"
    wanted = {"preset": preset, "seed": seed, "script": (HERE / "tiny_model_vllm.py").stat().st_mtime_ns}
    if stamp.exists() and json.loads(stamp.read_text()) == wanted and (out / "config.json").exists():
        return out
    cmd = [str(venv_python(venv)), str(HERE / "tiny_model_vllm.py"), str(out), "--preset", preset, "--seed", str(seed)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"building the {preset} model failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    stamp.write_text(json.dumps(wanted))
    return out


class VllmServer:
    """``vllm serve MODEL_DIR`` on ``127.0.0.1``: ``start()`` returns once ``/health`` answers 200 (RuntimeError with
    the end of its log if it exits or ``ready_timeout_s`` seconds pass first); ``stop()`` ends its session,
    and SIGTERM ends it should the process that started it be killed first (``experiments.children``)."""

    def __init__(
        self,
        model_dir: Path,
        log: Path,
        *,
        args: tuple[str, ...] | list[str] = SETTINGS,
        venv: str | Path | None = None,
        served_name: str = SERVED_NAME,
        dev_mode: bool = True,
        engine_idle: bool = True,
        kv_cache_gib: int = KV_CACHE_GIB,
        port: int = 0,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self.python = venv_python(venv)
        self.model_dir, self.log, self.args, self.served_name = Path(model_dir), Path(log), list(args), served_name
        self.dev_mode, self.engine_idle = dev_mode, engine_idle
        self.kv_cache_gib, self.port, self.ready_timeout_s = kv_cache_gib, port, ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s = float("nan")  # seconds it took to answer /health
        self.warmed_to = 0  # the longest prompt warm_up sent (tokens)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL (``http://127.0.0.1:PORT/v1``)."""
        return f"{self.root}/v1"

    def command(self) -> list[str]:
        return [str(self.python), str(HERE / "serve_vllm.py"), str(self.model_dir), "--host", "127.0.0.1",
                "--port", str(self.port), "--served-model-name", self.served_name, *self.args]  # fmt: skip

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
        env |= {"VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"}  # fmt: skip
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        else:
            env.pop("VLLM_SERVER_DEV_MODE", None)
        if self.engine_idle:
            env[IDLE_ENV] = "1"
        else:
            env.pop(IDLE_ENV, None)
        return env

    def start(self) -> VllmServer:
        import httpx

        self.port = self.port or free_port()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.command(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=self.environment(),
                start_new_session=True, preexec_fn=ends_with_this_process(),
            )  # fmt: skip
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.ready_timeout_s:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"vllm serve exited ({self.proc.returncode}) before it was ready: {self.tail()}")
            try:
                if httpx.get(f"{self.root}/health", timeout=2.0, trust_env=False).status_code == 200:
                    self.started_s = time.monotonic() - t0
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vllm serve was not ready within {self.ready_timeout_s:g} s: {self.tail()}")

    def warm_up(self, longest: int = WARM_UP_TOKENS, budget_s: float | None = None, timeout_s: float = 60.0) -> float:
        """Send one prompt of every length from 1 to ``longest`` tokens (one output token each, one after another,
        shortest first; with ``budget_s``, none after that many seconds) and return the seconds it took; the longest
        length sent is ``warmed_to``. vLLM's CPU backend pays about 10 ms more for an iteration the first time it
        sees its token count (measured on the wide preset: the first of three same-length prompts 47-55 ms, the
        next two 39-44 ms), so a server's first minutes are slower than its steady state; this visits every token
        count an iteration can have under ``SETTINGS``' budget, as a server in service has long done. It costs
        the sum of those iterations: seconds where the kernels are fast (AVX-512), about five minutes on an
        AVX2-only CPU, whose bf16 kernels take ~10 ms a token, and where the first visit is lost in the noise
        (wide preset, one prompt of each length four times: 1 token 29.6 ms then 27.6-27.9; 16 tokens 172 ms then
        160-164; 256 tokens 2.40 s then 2.41-2.59). A budget then warms the short counts, where a first visit's
        cost is the larger share of a step, and leaves the long ones."""
        import httpx

        rng = np.random.default_rng(0)
        t0 = time.monotonic()
        self.warmed_to = 0
        with httpx.Client(timeout=timeout_s, trust_env=False) as client:
            for n in range(1, longest + 1):
                if budget_s is not None and time.monotonic() - t0 >= budget_s:
                    break
                body = {"model": self.served_name, "prompt": rng.integers(100, 8000, n).tolist(), "max_tokens": 1,
                        "ignore_eos": True}  # fmt: skip
                r = client.post(f"{self.url}/completions", json=body)
                if r.status_code != 200:
                    got = f"HTTP {r.status_code}: {r.text[:200]}"
                    raise RuntimeError(f"warming up {self.url}: a {n}-token prompt got {got}")
                self.warmed_to = n
        return time.monotonic() - t0

    def decode_step_ms(self, requests: int = 5, tokens: int = 32, timeout_s: float = 60.0) -> float:
        """The engine's own time per decode step of one request alone (ms): ``requests`` requests sent one after
        another (a 64-token prompt, ``tokens`` tokens out), and the mean of vLLM's inter-token latency histogram over
        them (``/metrics``, ``server_timings``: the gaps between the engine core's output timestamps, which the
        client's speed does not touch). A gauge of the machine's speed for this model, for tests that time the
        server (``tests/contention.py``)."""
        import httpx

        prompt = np.random.default_rng(1).integers(100, 8000, 64).tolist()
        body = {"model": self.served_name, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True}
        before = server_timings(self.root)
        with httpx.Client(timeout=timeout_s, trust_env=False) as client:
            for _ in range(requests):
                r = client.post(f"{self.url}/completions", json=body)
                if r.status_code != 200:
                    raise RuntimeError(f"timing a decode step at {self.url}: HTTP {r.status_code}: {r.text[:200]}")
        itl = timing_means(before, server_timings(self.root))["inter_token_latency_seconds"]
        if itl is None:
            raise RuntimeError(f"timing a decode step at {self.url}: /metrics counted no inter-token latency")
        return 1e3 * float(itl)

    def tail(self, n: int = 1500) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return " | ".join(text[-n:].splitlines()[-12:])

    def stop(self) -> None:
        """SIGTERM to the server's session (its API server, engine and worker), then, after at most
        ``STOP_TIMEOUT_S`` seconds, SIGKILL to whatever of that session is left."""
        if self.proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break  # the whole session has ended
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        self.proc.wait()

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


# ``ferry validate --url``'s scheduler flags for a server started with SETTINGS (V1's chunked prefill, its prefix cache)
SIMULATED = ("--policy", "chunked", "--max-num-seqs", "32", "--max-num-batched-tokens", "256", "--block-size", "32",
             "--max-model-len", "4096", "--enable-prefix-caching", "--dtype", "bfloat16")  # fmt: skip


def probe_args(server: VllmServer, out: Path, *extra: str) -> list[str]:
    """``ferry probe``'s arguments against ``server`` (its model's config.json counts the FLOPs), writing ``out``."""
    return ["probe", "--url", server.url, "--model", server.served_name, "--model-config",
            str(server.model_dir / "config.json"), "--out", str(out), *extra]  # fmt: skip


def validate_args(server: VllmServer, profile: Path, out: Path, *workload: str) -> list[str]:
    """``ferry validate --url``'s arguments: ``workload`` replayed against ``server``, simulated with ``profile``."""
    return ["validate", "--url", server.url, "--served-model-name", server.served_name, "--model",
            str(server.model_dir / "config.json"), "--hardware", str(profile), *SIMULATED, *workload, "--out",
            str(out), "--force"]  # fmt: skip


_SAMPLE = re.compile(r"^(vllm:[a-z_]+)_(sum|count)\{[^}]*\}\s+(\S+)\s*$", re.MULTILINE)
TIMINGS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "request_queue_time_seconds",
           "request_prefill_time_seconds", "request_decode_time_seconds", "e2e_request_latency_seconds")  # fmt: skip


def server_timings(root: str) -> dict[str, tuple[float, float]]:
    """vLLM's own histograms of request timing at ``root``/metrics: name (without ``vllm:``) -> (sum in seconds,
    count), summed over its label sets. Two readings around a workload give the server's view of it."""
    import httpx

    text = httpx.get(f"{root}/metrics", timeout=10.0, trust_env=False).text
    out: dict[str, list[float]] = {name: [0.0, 0.0] for name in TIMINGS}
    for name, part, value in _SAMPLE.findall(text):
        key = name.removeprefix("vllm:")
        if key in out:
            out[key][0 if part == "sum" else 1] += float(value)
    return {k: (v[0], v[1]) for k, v in out.items()}


def timing_means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Mean seconds of each histogram over what happened between two ``server_timings`` readings (None if none)."""
    out: dict[str, Any] = {}
    for name in TIMINGS:
        total, n = after[name][0] - before[name][0], after[name][1] - before[name][1]
        out[name] = total / n if n > 0 else None
    return out


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", help="the model: tiny or wide (tiny_model_vllm.py)")
    p.add_argument("--venv", default=None, help="the vLLM venv (default ROOT/.venv-vllm)")
    p.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    p.add_argument("--models", type=Path, default=ROOT / "artifacts" / "vllm-models", help="where models are built")
    p.add_argument("--no-dev-mode", action="store_true", help="serve without /server_info (vLLM's default)")
    args, extra = p.parse_known_args(argv)
    try:
        model = build_model(args.models / args.preset, args.preset, venv=args.venv)
        server = VllmServer(model, args.models / f"{args.preset}.serve.log", args=extra or SETTINGS, venv=args.venv,
                            dev_mode=not args.no_dev_mode, port=args.port)  # fmt: skip
        server.start()
    except (ValueError, RuntimeError) as exc:
        print(f"real_serve: error: {exc}", file=sys.stderr)
        return 2
    print(f"vllm serve: {server.url} serves {server.served_name!r} ({model}); ready in {server.started_s:.1f} s")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background (ignored there)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while server.proc is not None and server.proc.poll() is None:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
