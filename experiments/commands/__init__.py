"""The ``ferry`` subcommands, one module each, each with a ``register(subparsers)`` that ``experiments.cli`` calls."""
