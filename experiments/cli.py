"""`ferry` command line: a few subcommands, each defined in its own module with a ``register(subparsers)``.

Errors a user can cause (bad flags, bad files, a model that does not fit) are ``ValueError``/``OSError`` raised with a
message that names the field and value; they are printed as one line and exit with status 2. ``--debug`` shows the
traceback instead. Ctrl-C stops any command with one line and status 130 (``experiments.interrupts``).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys

from experiments import interrupts
from experiments.errors import one_line

# each subcommand and the module that defines it, in the order `ferry --help` lists them
COMMANDS = {
    "run": "experiments.commands.run",
    "iteration": "experiments.commands.iteration",
    "roofline": "experiments.commands.roofline",
    "validate-kernels": "experiments.commands.validate_kernels",
    "kv-usage": "experiments.commands.kv_usage",
    "calibrate": "experiments.commands.calibrate",
    "validate": "experiments.commands.validate",
    "serve": "experiments.commands.serve",
    "probe": "experiments.commands.probe",
    "teach": "experiments.commands.teach",
    "explore": "experiments.commands.explore",
    "plan": "experiments.commands.plan",
    "sweep": "experiments.commands.sweep",
    "plot": "experiments.commands.plot",
    "fetch-data": "experiments.commands.fetch_data",
    "models": "experiments.commands.models",
    "hardware": "experiments.commands.hardware",
}
COMMAND_MODULES = tuple(COMMANDS.values())


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand; given the command line, only of the subcommand it names (a command's module
    imports what it runs: the simulator, the kernel database, PyTorch, a web server), so that `ferry run` does not
    load the others' (the parse is the same: one subcommand's flags are its own)."""
    parser = argparse.ArgumentParser(prog="ferry", description="Discrete-event simulator of LLM serving schedulers.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = _command_named(sys.argv[1:] if argv is None else argv)
    for name, module in COMMANDS.items():
        if named is None or name == named:
            importlib.import_module(module).register(sub)
    return parser


def _command_named(argv: list[str]) -> str | None:
    """The subcommand ``argv`` asks for (its first word after ferry's own flags), or None (help, a typo)."""
    words = [w for w in argv if w != "--debug"]
    return words[0] if words and words[0] in COMMANDS else None


INTERRUPTED = 130  # the shell's status for a command stopped by SIGINT (128 + 2)
# At its exit, a process that loaded numba spends 0.2-0.3 s of a 1.5 s run in the cyclic garbage collector walking
# numba's ~million objects, which are about to go anyway. `ferry` freezes them (``gc.freeze``) once its command has
# returned and its files are closed; the interpreter still ends as usual (exit handlers, buffers flushed). A caller
# that passes ``argv`` (a test, a script) goes on living, and collecting.


def main(argv: list[str] | None = None) -> int:
    with interrupts.watch():  # before the subcommands' imports, which take a second or two
        try:
            args = build_parser(argv).parse_args(argv)
            code = _run(args)
            if argv is None:  # the `ferry` command, about to exit (the collector: above)
                gc.freeze()
            return code
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
