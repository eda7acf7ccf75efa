"""`ferry explore`: a local web page where moving a knob re-runs the simulation and redraws the ferry.

    ferry explore [--host 127.0.0.1] [--port 8765] [--scenario NAME|FILE] [--lang en|ko] \\
        [--max-run-tokens 2000000] [--max-request-body-bytes 16777216]

Starts an HTTP server (Starlette on uvicorn, ``experiments.explore.app``) and prints one line when it listens:

    ferry explore: http://HOST:PORT/

Open it in a browser. Each control is one `ferry run` setting (policy, max batch size, max delay, max num seqs, max
batched tokens, long prefill threshold, request rate, number of requests, prompt and output lengths, model, GPU); each
change simulates those settings on the server and the page draws, from the JSON it gets back, every request's
timeline, the seats of the ferry, the metrics, and the run before beside it. The page's address holds the settings:
``http://HOST:PORT/?policy=dynamic&max_delay_ms=200`` opens with them (``&lang=ko``: Korean labels), so a teacher can
link to a prepared example. ``--scenario`` starts from a teaching scenario (`ferry teach --list` names the built-in
ones; a YAML file of your own works too): its model, GPU, limits and its own requests. Ctrl-C stops it (status 0).
Needs the ``serve`` extra (starlette, uvicorn).

A run may be at most ``--max-run-tokens`` of work, its requests' prompt and output tokens summed (more: the page
says so beside the length to shorten); a run of at most a tenth of that has a lane of its own, so it never waits
behind a large one (``experiments.explore.app``; ``experiments.http_limits`` has the limits of both servers).
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import threading
from typing import Any

from experiments import http_limits
from experiments.teach.labels import LANGS


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "explore",
        help="a local web page where moving a knob re-runs the simulation and redraws the ferry",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port to listen on; 0 picks a free one (default 8765)")
    p.add_argument(
        "--scenario",
        default=None,
        metavar="NAME|FILE",
        help="start from a teaching scenario: a built-in one's name (ferry teach --list) or a scenario YAML file",
    )
    p.add_argument("--lang", choices=LANGS, default="en", help="the language of the printed address's page (en)")
    http_limits.add_arguments(p, simulates=True)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        import uvicorn
    except ModuleNotFoundError:
        raise ValueError("ferry explore needs starlette and uvicorn: pip install -e '.[serve]'") from None
    from experiments.commands.serve import _run_until_signalled, listening_socket
    from experiments.explore.app import FONTS, build_app, korean_font
    from experiments.explore.payload import Explorer
    from experiments.teach.scenario import pick_scenarios

    limits = http_limits.from_args(args)
    explorer = Explorer() if args.scenario is None else Explorer.of_scenario(pick_scenarios([args.scenario])[0])
    explorer = dataclasses.replace(explorer, max_run_tokens=limits.max_run_tokens)
    explorer.run(explorer.defaults)  # the defaults run (a bad scenario fails here, before anything listens)
    sock = listening_socket(args.host, args.port)
    bound = sock.getsockname()
    host = f"[{bound[0]}]" if sock.family == socket.AF_INET6 else bound[0]
    url = f"http://{host}:{bound[1]}/" + ("?lang=ko" if args.lang == "ko" else "")
    threading.Thread(target=lambda: [korean_font(name) for name in FONTS], daemon=True).start()  # warm
    app = build_app(explorer, on_ready=lambda: print(f"ferry explore: {url}", flush=True),
                    max_body_bytes=limits.max_request_body_bytes)  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    try:
        _run_until_signalled(server, sock)
    finally:
        sock.close()
    print("ferry explore: stopped", flush=True)
    return 0
