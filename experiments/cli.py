"""`ferry` command line: a few subcommands, each defined in its own module with a ``register(subparsers)``.

Errors a user can cause (bad flags, bad files, a model that does not fit) are ``ValueError``/``OSError`` raised with a
message that names the field and value; they are printed as one line and exit with status 2. ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import pydantic

# modules that define a subcommand, in the order `ferry --help` lists them
COMMAND_MODULES = (
    "experiments.run",
    "experiments.iteration",
    "experiments.roofline",
    "experiments.validate_kernels",
    "experiments.kv_usage",
    "experiments.calibrate",
    "experiments.validate",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description="Discrete-event simulator of LLM serving schedulers.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a command whose module is not there yet
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, pydantic.ValidationError) as exc:
        if args.debug:
            raise
        print(f"ferry {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, pydantic.ValidationError):
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "config"
            parts.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
        return "; ".join(parts)
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
