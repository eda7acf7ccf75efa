"""`ferry serve`: ferry's real executor behind an OpenAI-compatible HTTP server, scheduled by a ferry policy.

    ferry serve --model tiny-llama [--device cpu] [--threads 1] --policy chunked --max-num-seqs 16 \\
        --max-num-batched-tokens 256 [--host 127.0.0.1] [--port 8000] [--iterations-log iterations.csv] \\
        [--max-request-body-bytes 16777216]

The model is built from its config.json with random weights (``experiments.real.llama``) on ``--device``; requests
arriving on ``POST /v1/completions`` are scheduled by the policy the flags describe (the same objects as ``ferry
run``; ``--hardware`` sizes the KV cache the policy sees, as in a simulation) and run on the model as they come
(``experiments.real.live``); tokens stream back as each iteration ends (``experiments.real.server`` has the API).
The tokens are meaningless (random weights); the timing is real. Prints one line when ready:

    ferry serve: NAME (MODEL) on DEVICE, policy POLICY, listening on http://HOST:PORT/v1

(``--port 0`` picks a free port, which the line names). Ctrl-C or SIGTERM stops it: the engine stops after the
iteration in progress and every request still open ends with a 503 (a stream: its error event, then ``data: [DONE]``),
connections still open ``GRACE_S`` seconds later are closed, ``--iterations-log`` is written (one row per iteration
the engine ran: ``experiments.real.live.ITERATION_LOG_COLUMNS``, the input of ``ferry calibrate
--from-iterations``), status 0.
Needs the ``serve`` extra (starlette, uvicorn) and PyTorch. ``--dtype auto`` is float32 on a CPU, the config's
``torch_dtype`` on a GPU.

Limits: one device (no tensor parallelism, quantization or fp8 KV cache). The model's KV cache keeps
``--max-model-len`` tokens for every seated sequence (dense slots, not pages; it grows as more are seated), while the
policy's block accounting follows ``--hardware`` (or ``--num-gpu-blocks-override``): keep ``--max-model-len`` x
``--max-num-seqs`` within the device's memory. The policy never sees the end of the arrivals, so ``static`` waits for
a full boat of ``--max-batch-size`` requests however long that takes. Each iteration's record stays in memory for the
log (a few hundred bytes an iteration), as do the request table and the token gaps.

What a request may be (``experiments.http_limits``): a body of at most ``--max-request-body-bytes`` (longer: 413,
unread), a prompt shorter than ``--max-model-len`` tokens (refused before the rest of it is read); a client that
disconnects aborts its request, streamed or not.
"""

from __future__ import annotations

import argparse
import signal
import socket
from pathlib import Path
from types import FrameType
from typing import Any

import policies
from costmodel.dtypes import canonical
from costmodel.model_spec import load_model
from experiments import http_limits
from experiments.commands.run import add_run_arguments, config_from_args
from experiments.runner import outputs
from experiments.runner.config import RunConfig
from experiments.runner.simulation import build_replica
from policies.config import ITERATION_LIMITED
from sim.kvcache import KVCacheManager

GRACE_S = 5  # seconds connections get to close after a stop signal (their requests have ended), before being cut
MAX_INITIAL_SLOTS = 16  # sequences the model's KV cache holds at first (it doubles as more are seated)
SERVER_GROUPS = ("replica", "scheduler")  # the groups of `ferry run`'s flags a server takes


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model for real over an OpenAI-compatible API, scheduled by a ferry policy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:INDEX (default cpu)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of the model (default: PyTorch's)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default 8000)")
    p.add_argument("--served-model-name", default=None, help="the model's name in the API (default: --model)")
    p.add_argument("--model-seed", type=int, default=0, help="seed of the model's random weights (0)")
    p.add_argument("--iterations-log", type=Path, default=None, help="CSV of every iteration, written at exit")
    http_limits.add_arguments(p, simulates=False)
    _add_server_arguments(p)
    p.set_defaults(func=handle, config=None)


def _add_server_arguments(p: argparse.ArgumentParser) -> None:
    """`ferry run`'s replica and scheduler flags, and not its workload or cluster ones (a server's requests come over
    HTTP, to one replica). argparse has no public way to take some groups of another parser's flags: build them all
    on a scratch parser and move the groups wanted."""
    scratch = argparse.ArgumentParser(add_help=False)
    add_run_arguments(scratch, simulator=False)
    for group in scratch._action_groups:
        if group.title in SERVER_GROUPS:
            ours = p.add_argument_group(group.title)
            for action in group._group_actions:
                ours._add_action(action)


_OWN_FLAGS = frozenset(
    {"device", "threads", "host", "port", "served_model_name", "model_seed", "iterations_log"} | http_limits.LIMIT_FLAGS
)


def handle(args: argparse.Namespace) -> int:
    if "model" not in args:  # a server builds what it is told: no default model
        raise ValueError("--model is required (a built-in model such as tiny-llama, or a config.json)")
    config = config_from_args(args, _OWN_FLAGS)
    return serve(
        config,
        device=args.device,
        threads=args.threads,
        host=args.host,
        port=args.port,
        served_name=args.served_model_name,
        seed=args.model_seed,
        iterations_log=args.iterations_log,
        limits=http_limits.from_args(args),
    )


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: a free port) and listening, so clients can connect as soon as the ready
    line names it (they are answered once the server runs)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        raise OSError(f"--host {host} --port {port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(
    config: RunConfig,
    *,
    device: str = "cpu",
    threads: int | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_name: str | None = None,
    seed: int = 0,
    iterations_log: Path | None = None,
    limits: http_limits.HttpLimits | None = None,
) -> int:
    """Build the model and the policy, serve until a stop signal, write the iteration log; returns the exit status."""
    try:
        import starlette  # noqa: F401  (the app's framework, imported by experiments.real.server)
        import uvicorn
    except ModuleNotFoundError:
        raise ValueError("ferry serve needs starlette and uvicorn: pip install -e '.[serve]'") from None
    from costmodel.calibration import kernels as K
    from experiments.real.live import LiveEngine, LiveExecutor, iteration_table
    from experiments.real.llama import Llama
    from experiments.real.server import EngineServer, build_app

    torch = K.require_torch()
    if threads:
        torch.set_num_threads(threads)
    if config.tensor_parallel_size != 1 or config.pipeline_parallel_size != 1:
        raise ValueError("the real executor runs on one device: use --tensor-parallel-size 1, no pipeline stages")
    if config.enable_prefix_caching:
        raise ValueError("the real executor keeps each sequence's own KV: no --enable-prefix-caching")
    if config.speculative_config is not None:
        raise ValueError("the real executor has no drafter: no --speculative-config")
    config = config.model_copy(update={"enable_prefix_caching": False})  # (where `vllm serve` would cache prefixes)
    if config.disaggregation is not None or config.num_replicas != 1:
        raise ValueError("the real executor is one replica: no disaggregation or replicas")
    if config.quantization is not None or config.kv_cache_dtype != "auto":
        raise ValueError("the real executor keeps weights and KV cache in --dtype: no quantization or kv_cache_dtype")
    torch_device = K.device_of(device)
    if config.dtype == "auto":  # the checkpoint's dtype on a GPU; float32 on a CPU (what its kernels run best)
        dtype = "float32" if torch_device.type == "cpu" else load_model(config.model).torch_dtype
    else:
        dtype = canonical(config.dtype)
    replica = build_replica(config.model_copy(update={"dtype": dtype}))
    config, sched = replica.config, replica.config.scheduler
    name = served_name or config.model
    sock = listening_socket(host, port)  # before the slow part: a busy port fails at once

    policy = policies.get(sched)
    kv = KVCacheManager(
        replica.memory.usable_blocks, replica.memory.block_size, 0, watermark=config.kv_watermark or 0.0
    )
    model = Llama.build(config.model, device, dtype, max_len=sched.max_model_len, seed=seed)
    seats = max(sched.seq_limit, sched.max_batch_size)
    engine = LiveEngine(policy, LiveExecutor(model, slots=min(seats, MAX_INITIAL_SLOTS)), kv, sched.max_model_len)
    n_threads = torch.get_num_threads()
    where = f"cpu, {n_threads} thread{'s' if n_threads > 1 else ''}" if torch_device.type == "cpu" else str(device)
    bound = sock.getsockname()
    url_host = f"[{bound[0]}]" if sock.family == socket.AF_INET6 else bound[0]
    ready = (
        f"ferry serve: {name} ({replica.model.name}) on {where}, policy {sched.policy}, "
        f"listening on http://{url_host}:{bound[1]}/v1"
    )
    limits = limits or http_limits.HttpLimits()
    card = {"max_num_batched_tokens": sched.token_budget, "max_num_seqs": sched.seq_limit}
    app = build_app(engine, name, sched.max_model_len, on_ready=lambda: print(ready, flush=True),
                    max_body_bytes=limits.max_request_body_bytes,
                    limits=card if sched.policy in ITERATION_LIMITED else None)  # fmt: skip
    server = EngineServer(
        uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=GRACE_S, lifespan="on"),
        engine,
    )
    engine.on_error = lambda exc: setattr(server, "should_exit", True)
    engine.start()
    try:
        _run_until_signalled(server, sock)
    finally:
        engine.stop()
        sock.close()
        if iterations_log is not None:
            outputs.write_frame(iterations_log, iteration_table(engine.iterations))
    done = f"ferry serve: stopped after {engine.requests.n:,} requests and {len(engine.iterations):,} iterations"
    print(done + (f"; wrote {iterations_log}" if iterations_log is not None else ""), flush=True)
    if engine.error is not None:
        print(f"ferry serve: error: the engine failed: {engine.error!r}", flush=True)
        return 1
    return 0


def _run_until_signalled(server: Any, sock: socket.socket) -> None:
    """Run the server until SIGINT or SIGTERM. uvicorn catches both while it runs, shuts down gracefully, then
    raises the signal again for the handler it found: here one that only notes it, so the command goes on to stop
    the engine and write its log, and ends with status 0 rather than the interrupt's 130."""
    seen: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
