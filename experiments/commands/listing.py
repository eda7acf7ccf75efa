"""The plain-text table `ferry models` and `ferry hardware` print: a header, a rule, one row per item, columns
padded to their widest cell (numbers right-aligned, words left-aligned)."""

from __future__ import annotations

from collections.abc import Sequence


def table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> str:
    """``columns``: (title, ``"<"`` or ``">"``) each; ``rows``: the cells, as text. The last column is not padded."""
    widths = [max([len(title), *(len(r[k]) for r in rows)]) for k, (title, _) in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        padded = [c.rjust(w) if a == ">" else c.ljust(w) for c, w, (_, a) in zip(cells, widths, columns, strict=True)]
        return "  ".join(padded).rstrip()

    return "\n".join([line([t for t, _ in columns]), line(["-" * w for w in widths]), *map(line, rows)])


def size(value: float, units: Sequence[tuple[float, str]]) -> str:
    """``value`` in the largest of ``units`` (scale, suffix; largest first) it reaches, to three significant digits."""
    for scale, suffix in units:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {suffix}"
    scale, suffix = units[-1]
    return f"{value / scale:.3g} {suffix}"
