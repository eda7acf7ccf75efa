"""`ferry` command line: a few subcommands, each defined in its own module with a ``register(subparsers)``.

Errors a user can cause (bad flags, bad files, a model that does not fit) are ``ValueError``/``OSError`` raised with a
message that names the field and value; they are printed as one line and exit with status 2. ``--debug`` shows the
traceback instead. Ctrl-C stops any command with one line and status 130 (``experiments.interrupts``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from experiments import interrupts
from experiments.errors import one_line

# modules that define a subcommand, in the order `ferry --help` lists them
COMMAND_MODULES = (
    "experiments.commands.run",
    "experiments.commands.iteration",
    "experiments.commands.roofline",
    "experiments.commands.validate_kernels",
    "experiments.commands.kv_usage",
    "experiments.commands.calibrate",
    "experiments.commands.validate",
    "experiments.commands.serve",
    "experiments.commands.probe",
    "experiments.commands.teach",
    "experiments.commands.explore",
    "experiments.commands.plan",
    "experiments.commands.sweep",
    "experiments.commands.plot",
    "experiments.commands.fetch_data",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description="Discrete-event simulator of LLM serving schedulers.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


INTERRUPTED = 130  # the shell's status for a command stopped by SIGINT (128 + 2)


def main(argv: list[str] | None = None) -> int:
    with interrupts.watch():  # before the subcommands' imports, which take a second or two
        try:
            args = build_parser().parse_args(argv)
            return _run(args)
        except KeyboardInterrupt:
            command = getattr(locals().get("args"), "command", None)
            print(f"ferry{' ' + command if command else ''}: interrupted", file=sys.stderr)
            interrupts.forget_caught()
            return INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    """Run the subcommand; a user's error is one line and status 2 (``--debug``: the traceback)."""
    import pydantic

    try:
        code = int(args.func(args) or 0)
        interrupts.checkpoint()  # a Ctrl-C swallowed on the way still stops with 130
        return code
    except MemoryError:
        if args.debug:
            raise
        print(f"ferry {args.command}: error: out of memory (a workload or limit too large for this machine)",
              file=sys.stderr)  # fmt: skip
        return 2
    except (ValueError, OSError, pydantic.ValidationError) as exc:
        if args.debug:
            raise
        print(f"ferry {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
