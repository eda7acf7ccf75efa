"""A real ``llama-server`` (llama.cpp) on this machine's CPU, as a subprocess: for tests and studies that probe it.

    python -m experiments.llamacpp_check.real_server [--preset tiny|wide] [--server ROOT/.llamacpp] [--port 0] \\
        [llama-server's flags ...]    # builds the model, serves it, prints its URL, until Ctrl-C or SIGTERM

The server is the one ``install_server.sh`` builds (``make llamacpp``: ``ROOT/.llamacpp``), the model a random-weight
Llama in GGUF of ``tiny_model_vllm.py``'s shapes, written by ``tiny_model_gguf.py`` (seeded, bfloat16). It listens on
a free localhost port with the settings ``SETTINGS`` states, in a session of its own that ``stop()`` ends whole.

How llama-server schedules (read from the llama.cpp that llama-cpp-python 0.3.36 vendors, ``tools/server/``):
- ``--parallel N`` slots, each a request's seat (``server-context.cpp``, ``get_available_slot``: a request takes a
  free slot, by prompt similarity or least recently used, or waits in a deferred queue until one frees).
- One iteration is one ``update_slots`` call (``pre_decode``): a token of every generating slot first, then, with
  ``--cont-batching``, prompt tokens of the slots still prefilling, in slot order, while the batch holds fewer than
  ``--batch-size`` tokens (``n_batch``); a prompt longer than what is left is continued in the next iteration. A
  prompt's first token is sampled and streamed when its last chunk's iteration ends. This is ferry's ``chunked``
  policy with ``chunked_order: decodes-first`` and a token budget of ``n_batch`` (``SIMULATED``); new prompts there
  are taken in arrival order, here in slot order.
- The batch is one ``llama_decode``, computed in micro-batches of at most ``--ubatch-size`` (``n_ubatch``) tokens
  (``src/llama-batch.cpp``). With ``--kv-unified`` (one KV buffer for all slots: ``split_simple``) an iteration is
  one forward pass when the two sizes are equal, as ferry times it; but every token's attention then scans the cells
  of every slot, masked (``ggml-cpu/ops.cpp``, ``flash_attn_ext``: a masked cell is skipped, not free), which ferry
  does not model: it grows with the tokens in flight, and is small at these contexts. Without it (llama-server's
  default for an explicit ``--parallel``) each slot has a KV stream of its own and ``split_equal`` puts only slots of
  consecutive ids, with as many tokens each, in one micro-batch: an iteration is one forward pass per run of
  consecutive busy slots, and one more for a prompt beside decodes (each pass streams the weights again; four busy
  slots took 8.6 ms a step when their ids were consecutive, 16 ms when not). That setting missed the traces' median
  ITL by -19% (light) and -59% (heavy), medians of three runs; this one is the setting ferry's model describes.
- ``GET /props`` states ``total_slots`` (its ``--parallel``) and, in ``default_generation_settings.n_ctx``, a slot's
  context; ``GET /slots`` lists the slots (``id``, ``n_ctx``, ``is_processing``); neither states ``n_batch``
  (``experiments.real.limits``), so the probe is told it (``PROBE_FLAGS``).
- ``POST /v1/completions`` takes a prompt of token ids (``server-common.cpp``, ``tokenize_mixed``: used as sent, no
  BOS added to ids), ``ignore_eos`` (a logit bias against end-of-generation tokens, ``server-schema.cpp``),
  ``stream_options.include_usage``; it streams one chunk per token (held back only while a token leaves UTF-8
  incomplete: the model's vocabulary has no byte pieces) and ends with a chunk without text that carries the finish
  reason and the usage (``experiments.real.client``: not a token).

``SETTINGS``: 16 slots of up to 4096 tokens in one KV buffer (``--kv-unified --ctx-size 65536``), continuous
batching, ``--batch-size 256 --ubatch-size 256`` (vLLM's setting in ``experiments/vllm_check/real_serve.py`` also has
a 256-token budget), flash attention on,
one thread for its kernels (``--threads 1 --threads-batch 1``): on this 2-core machine the other core is left to the
server's HTTP threads and to the client on the same machine, as vLLM's CPU worker is bound to one core; a second
kernel thread would spin (ggml's ``--poll``) on the core the client needs. Its host-memory prompt cache is kept at 1
GiB (``--cache-ram 1024``): with one KV buffer, a new request first moves the idle slots' cells there
(``--cache-idle-slots``, on by default), so that attention scans only the running requests'; the probe's and the
traces' prompts are random and never hit it, and the copy is part of the request handling the probe measures.
``--fit off`` keeps the sizes as given; ``--no-webui`` serves no page.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
DEFAULT_SERVER = ROOT / ".llamacpp"  # install_server.sh's DEST, linked by make llamacpp
SERVED_NAME = "ferry-tiny-llama"
SLOTS = 16  # --parallel: requests seated at once
SLOT_CONTEXT = 4096  # tokens of KV cache per slot (--ctx-size / --parallel)
BATCH = 256  # --batch-size = --ubatch-size: tokens per iteration, one forward pass
DTYPE = "bfloat16"  # the model's weights (tiny_model_gguf.py), and ferry's --dtype for it
SETTINGS = ("--parallel", str(SLOTS), "--kv-unified", "--cont-batching", "--ctx-size", str(SLOTS * SLOT_CONTEXT),
            "--batch-size", str(BATCH), "--ubatch-size", str(BATCH), "--threads", "1", "--threads-batch", "1",
            "--flash-attn", "on", "--cache-ram", "1024", "--fit", "off", "--no-webui")  # fmt: skip
READY_TIMEOUT_S = 120.0  # the longest wait for /health to answer 200 (s); a second or two here
STOP_TIMEOUT_S = 20.0  # seconds SIGTERM has to end the server before SIGKILL
# ``ferry probe``'s flags: the token budget llama-server states nowhere (its seats it states at /props), and prompts
# up to 512 tokens, the traces' longest: with one KV buffer for all slots, 16 prompts of 2,048 tokens at once take
# minutes to prefill on this CPU (every token's attention scans all their cells) and fail the probe's 60 s timeout
PROBE_FLAGS = ("--max-num-batched-tokens", str(BATCH), "--max-prompt", "512", "--dtype", DTYPE)
# ``ferry validate --url``'s scheduler flags for a server started with SETTINGS: decodes first, then prompt chunks up
# to the batch size; the KV cache as ferry pages it (one buffer of 16 x 4096 tokens: it never runs short, nor
# does ferry's)
SIMULATED = ("--policy", "chunked", "--chunked-order", "decodes-first", "--max-num-seqs", str(SLOTS),
             "--max-num-batched-tokens", str(BATCH), "--max-model-len", str(SLOT_CONTEXT),
             "--dtype", DTYPE)  # fmt: skip


def server_binary(server: str | Path | None = None) -> Path:
    """``llama-server`` in ``server`` (default ``ROOT/.llamacpp``); ValueError when it is not there."""
    where = Path(server) if server is not None else DEFAULT_SERVER
    binary = where / "bin" / "llama-server"
    if not binary.exists():
        raise ValueError(f"--server {str(where)!r}: no bin/llama-server there; build it with make llamacpp")
    return binary


def build_model(out: Path, preset: str = "tiny", seed: int = 0, server: str | Path | None = None) -> Path:
    """``out`` holding the preset's ``model.gguf`` and ``config.json`` (written by ``tiny_model_gguf.py`` with the
    server's own ``gguf-py``, unless ``out`` already holds the one those arguments make); returns ``out``."""
    gguf_py = server_binary(server).parents[1] / "gguf-py"
    stamp = out / "ferry-model.json"
    wanted = {"preset": preset, "seed": seed, "dtype": DTYPE,
              "script": (HERE / "tiny_model_gguf.py").stat().st_mtime_ns}  # fmt: skip
    if stamp.exists() and json.loads(stamp.read_text()) == wanted and (out / "model.gguf").exists():
        return out
    cmd = [sys.executable, str(HERE / "tiny_model_gguf.py"), str(out), "--preset", preset, "--seed", str(seed),
           "--dtype", DTYPE]  # fmt: skip
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(gguf_py), str(ROOT)])}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"building the {preset} model failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    stamp.write_text(json.dumps(wanted))
    return out


class LlamaServer:
    """``llama-server -m MODEL_DIR/model.gguf`` on ``127.0.0.1``: ``start()`` returns once ``/health`` answers 200
    (RuntimeError with the end of its log if it exits or ``ready_timeout_s`` seconds pass first); ``stop()`` ends
    its session, and SIGTERM ends it should the process that started it be killed first
    (``experiments.children``)."""

    def __init__(
        self,
        model_dir: Path,
        log: Path,
        *,
        args: tuple[str, ...] | list[str] = SETTINGS,
        server: str | Path | None = None,
        served_name: str = SERVED_NAME,
        port: int = 0,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        self.binary = server_binary(server)
        self.model_dir, self.log, self.args, self.served_name = Path(model_dir), Path(log), list(args), served_name
        self.port, self.ready_timeout_s = port, ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s = float("nan")  # seconds it took to answer /health

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL (``http://127.0.0.1:PORT/v1``)."""
        return f"{self.root}/v1"

    def command(self) -> list[str]:
        return [str(self.binary), "--model", str(self.model_dir / "model.gguf"), "--alias", self.served_name,
                "--host", "127.0.0.1", "--port", str(self.port), *self.args]  # fmt: skip

    @staticmethod
    def environment() -> dict[str, str]:
        """This environment without llama.cpp's ``LLAMA_ARG_*`` settings (each would stand in for a flag not
        given) and without OpenMP's thread count."""
        return {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "OMP_"))}

    def start(self) -> LlamaServer:
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
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}) before it was ready: {self.tail()}")
            try:  # 503 while the model loads
                if httpx.get(f"{self.root}/health", timeout=2.0, trust_env=False).status_code == 200:
                    self.started_s = time.monotonic() - t0
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"llama-server was not ready within {self.ready_timeout_s:g} s: {self.tail()}")

    def get(self, path: str) -> Any:
        """The JSON of ``GET ROOT/path`` (``props``, ``slots``)."""
        import httpx

        r = httpx.get(f"{self.root}/{path}", timeout=10.0, trust_env=False)
        r.raise_for_status()
        return r.json()

    def warm_up(self, timeout_s: float = 60.0) -> float:
        """Send prompts of 1, 2, 4, ... ``BATCH`` tokens one after another, then one request to every slot at once,
        and return the seconds it took: the first iteration of each size allocates its compute graph, and a slot's
        first request its share of the KV cache; a server in service has long done both."""
        import httpx

        rng = np.random.default_rng(0)

        def body(n: int, out: int) -> dict[str, Any]:
            return {"model": self.served_name, "prompt": rng.integers(100, 8000, n).tolist(), "max_tokens": out,
                    "ignore_eos": True, "temperature": 0.0}  # fmt: skip

        async def every_slot(client: httpx.AsyncClient) -> list[httpx.Response]:
            jobs = [client.post(f"{self.url}/completions", json=body(32, 8)) for _ in range(SLOTS)]
            return list(await asyncio.gather(*jobs))

        async def run() -> None:
            async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as client:
                n = 1
                while n <= BATCH:
                    answers = [await client.post(f"{self.url}/completions", json=body(n, 2))]
                    n *= 2
                answers += await every_slot(client)
                for r in answers:
                    if r.status_code != 200:
                        raise RuntimeError(f"warming up {self.url}: HTTP {r.status_code}: {r.text[:200]}")

        t0 = time.monotonic()
        asyncio.run(run())
        return time.monotonic() - t0

    def decode_step_ms(self, requests: int = 5, tokens: int = 32, timeout_s: float = 60.0) -> float:
        """The server's own time per decode step of one request alone (ms): the median, over ``requests`` requests
        sent one after another (a 64-token prompt, ``tokens`` tokens out), of the ``timings.predicted_per_token_ms``
        llama-server returns with each response (``server-task.cpp``, ``result_timings``), which the client's speed
        does not touch. A gauge of the machine's speed for this model, for tests that time the server
        (``tests/contention.py``)."""
        import httpx

        prompt = np.random.default_rng(1).integers(100, 8000, 64).tolist()
        body = {"model": self.served_name, "prompt": prompt, "max_tokens": tokens, "ignore_eos": True,
                "temperature": 0.0}  # fmt: skip
        steps = []
        with httpx.Client(timeout=timeout_s, trust_env=False) as client:
            for _ in range(requests):
                r = client.post(f"{self.url}/completions", json=body)
                if r.status_code != 200:
                    raise RuntimeError(f"timing a decode step at {self.url}: HTTP {r.status_code}: {r.text[:200]}")
                steps.append(float(r.json()["timings"]["predicted_per_token_ms"]))
        return float(np.median(steps))

    def tail(self, n: int = 1500) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return " | ".join(text[-n:].splitlines()[-12:])

    def stop(self) -> None:
        """SIGTERM to the server's session, then, after at most ``STOP_TIMEOUT_S`` seconds, SIGKILL."""
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

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def probe_args(server: LlamaServer, out: Path, *extra: str) -> list[str]:
    """``ferry probe``'s arguments against ``server`` (its model's config.json counts the FLOPs), writing ``out``."""
    return ["probe", "--url", server.url, "--model", server.served_name, "--model-config",
            str(server.model_dir / "config.json"), *PROBE_FLAGS, "--out", str(out), *extra]  # fmt: skip


def validate_args(server: LlamaServer, profile: Path, out: Path, *workload: str) -> list[str]:
    """``ferry validate --url``'s arguments: ``workload`` replayed against ``server``, simulated with ``profile``."""
    return ["validate", "--url", server.url, "--served-model-name", server.served_name, "--model",
            str(server.model_dir / "config.json"), "--hardware", str(profile), *SIMULATED, *workload, "--out",
            str(out), "--force"]  # fmt: skip


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", help="the model: tiny or wide (tiny_model_vllm.py's shapes)")
    p.add_argument("--server", default=None, help="install_server.sh's folder (default ROOT/.llamacpp)")
    p.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    p.add_argument("--models", type=Path, default=ROOT / "artifacts" / "llamacpp-models", help="where models are built")
    args, extra = p.parse_known_args(argv)
    try:
        model = build_model(args.models / args.preset, args.preset, server=args.server)
        server = LlamaServer(model, args.models / f"{args.preset}.serve.log", args=extra or SETTINGS,
                             server=args.server, port=args.port)  # fmt: skip
        server.start()
    except (ValueError, RuntimeError) as exc:
        print(f"real_server: error: {exc}", file=sys.stderr)
        return 2
    print(f"llama-server: {server.url} serves {server.served_name!r} ({model}); ready in {server.started_s:.1f} s")
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
