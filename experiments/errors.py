"""A user's error as one line: what every command prints for a bad flag, file or setting (``experiments.cli``), and
what a sweep point or a plan candidate keeps as its reason."""

from __future__ import annotations


def one_line(exc: BaseException, where: str = "config") -> str:
    """``exc`` on one line: a pydantic validation error as ``field: message (got VALUE)`` per problem, joined by
    "; " (``where`` names a problem of the whole model; "": none); any other exception's message with its whitespace
    collapsed."""
    import pydantic  # here, not at import: the command line reads its flags before the heavy imports

    if isinstance(exc, pydantic.ValidationError):
        parts = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or where
            msg = err["msg"].removeprefix("Value error, ")
            given = err.get("input")
            # a field's own value helps; a whole section (a model validator's input) does not
            text = msg if isinstance(given, dict) else f"{msg} (got {_short(given)})"
            parts.append(f"{loc}: {text}" if loc else text)
        return " ".join("; ".join(parts).split())
    return " ".join(str(exc).split())


def _short(value: object, limit: int = 100) -> str:
    """``repr(value)``, cut to ``limit`` characters (a 100 MB string is not repeated back)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
