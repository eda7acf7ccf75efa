"""The ``Workload``: the requests a simulation replays, as three aligned numpy columns (arrival second, prompt tokens,
output tokens) plus optional ids; a million requests cost 24 MB and no Python object per request. Build one with
``synthetic`` (``sim.workload.synthetic``), ``load_trace`` (here; the readers are in ``sim.workload.traces``) or
``Workload.from_arrays``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from sim.workload import traces
from sim.workload.prefixes import Prefixes, from_hash_ids

if TYPE_CHECKING:
    import pandas as pd

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ObjArray = npt.NDArray[np.object_]


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    """Requests in arrival order, one row each. The arrays are stored read-only: a workload is a value."""

    # arrival time of each request, seconds from the start of the trace; non-decreasing, first >= 0 (float64)
    arrival_s: FloatArray
    # prompt (input) tokens of each request, >= 0; 0 is kept here, the engine rejects it with a reason (int64)
    prompt_tokens: IntArray
    # tokens each request wants generated, >= 0 (int64)
    output_tokens: IntArray
    # ids from the trace as an object array of str, or None: the row index is the id ("0", "1", ...), which
    # saves a Python string per request. Read ids through ``id_of(i)`` or ``ids()``, which handle both.
    request_id: ObjArray | None = None
    # what the requests are: "synthetic gamma(burstiness=0.5) rate=8/s n=1000 ..." or "azure:/path/file.csv"
    source: str = "arrays"
    # the token runs each prompt starts with that other requests may share (system prompts, Mooncake hash_ids), or
    # None: every prompt is its own (``sim.workload.prefixes``; what prefix caching can reuse)
    prefixes: Prefixes | None = None
    # sessions (multi-turn conversations), or None: row ``after[i]`` (an earlier row; -1 for none) is the turn before
    # row i, which is sent ``think_s[i]`` seconds after that turn's response has ended; its ``arrival_s`` is NaN until
    # a simulation sets it. Rows with no turn before arrive at ``arrival_s``, in order. A closed loop of clients
    # (``closed_loop``): rows of ``after`` -2 (``sim.kernels.sessions.CLIENT``) are sent, in order, as slots free up,
    # not before their ``think_s`` (when they were due)
    after: IntArray | None = None
    think_s: FloatArray | None = None
    # a closed loop's slots (``sim.workload.clients``): at most this many requests in flight; None: an open loop
    clients: int | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s) if isinstance(self.arrival_s, np.ndarray) else -1
        for name, kind in (
            ("arrival_s", np.float64),
            ("prompt_tokens", np.int64),
            ("output_tokens", np.int64),
        ):
            values = getattr(self, name)
            if not isinstance(values, np.ndarray) or values.dtype != kind or values.ndim != 1:
                got = (
                    f"{values.dtype} array of shape {values.shape}" if isinstance(values, np.ndarray) else type(values)
                )
                raise ValueError(f"{name} must be a 1-D {np.dtype(kind)} numpy array, got {got}")
            if len(values) != n:
                raise ValueError(f"{name} has {len(values)} rows but arrival_s has {n}")
            follows = self.after is not None and name == "arrival_s"
            finite = np.isfinite(values) if kind == np.float64 else None
            if follows and finite is not None:  # a later turn's arrival is not known before the simulation
                finite = np.where(np.asarray(self.after) != -1, np.isnan(values), finite)
            _bad_row(name, values, None if finite is None else ~finite, "is not finite")
            _bad_row(name, values, values < 0, "is negative")
            view = values.view()
            view.flags.writeable = False
            object.__setattr__(self, name, view)
        self._check_sessions(n)
        first = self.first_turns()
        if len(first) > 1:
            down = np.flatnonzero(np.diff(self.arrival_s[first]) < 0)
            if down.size:
                i, j = int(first[down[0] + 1]), int(first[down[0]])
                now, before = self.arrival_s[i].item(), self.arrival_s[j].item()
                raise ValueError(f"arrival_s is not sorted: row {i} is {now!r} < row {j} {before!r}")
        if self.request_id is not None:
            ids = self.request_id
            if not isinstance(ids, np.ndarray) or ids.dtype != object or ids.ndim != 1 or len(ids) != n:
                raise ValueError(f"request_id must be None or a 1-D object array of {n} str, got {ids!r:.80}")
            for i, x in enumerate(ids):
                if type(x) is not str:
                    raise ValueError(f"request_id row {i}: {x!r} is not a str")
            view = ids.view()
            view.flags.writeable = False
            object.__setattr__(self, "request_id", view)
        if self.prefixes is not None:
            self.prefixes.check(self.prompt_tokens, self.output_tokens)

    def _check_sessions(self, n: int) -> None:
        if (self.after is None) != (self.think_s is None):
            raise ValueError("after and think_s come together (sessions) or not at all")
        if self.after is None or self.think_s is None:
            return
        after = np.ascontiguousarray(self.after, dtype=np.int64)
        think = np.ascontiguousarray(self.think_s, dtype=np.float64)
        if len(after) != n or len(think) != n:
            raise ValueError(f"after and think_s must have {n} rows")
        bad = np.flatnonzero((after >= np.arange(n)) | (after < -2))
        if bad.size:
            raise ValueError(f"after row {int(bad[0])}: {int(after[bad[0]])} is not an earlier row (or -1, -2)")
        if (after == -2).any() and (after >= 0).any():
            raise ValueError("after: a closed loop of clients (-2) sends requests of its own, not conversations' turns")
        _bad_row("think_s", think, ~np.isfinite(think) | (think < 0), "is not a time >= 0")
        for name, values in (("after", after), ("think_s", think)):
            view = values.view()
            view.flags.writeable = False
            object.__setattr__(self, name, view)

    def first_turns(self) -> IntArray:
        """Rows that arrive at their ``arrival_s`` (all of them without sessions)."""
        return np.arange(len(self)) if self.after is None else np.flatnonzero(self.after == -1)

    @classmethod
    def from_arrays(
        cls,
        arrival_s: npt.ArrayLike,
        prompt_tokens: npt.ArrayLike,
        output_tokens: npt.ArrayLike,
        request_id: npt.ArrayLike | None = None,
        source: str = "arrays",
    ) -> Workload:
        """Build from any array-likes (lists, other dtypes); token counts must be whole numbers."""
        ids = None if request_id is None else np.array([str(x) for x in np.asarray(request_id)], dtype=object)
        arrival = np.asarray(arrival_s, dtype=np.float64)
        return cls(
            arrival,
            _whole(prompt_tokens, "prompt_tokens"),
            _whole(output_tokens, "output_tokens"),
            ids,
            source,
        )

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __repr__(self) -> str:
        return f"Workload({len(self)} requests, source={self.source!r})"

    def __eq__(self, other: object) -> bool:
        """Same requests (arrivals, lengths, ids) and source; ``None`` ids equal explicit row indices."""
        if not isinstance(other, Workload):
            return NotImplemented
        same_ids = self.request_id is None and other.request_id is None
        return (
            self.source == other.source
            and np.array_equal(self.arrival_s, other.arrival_s, equal_nan=True)
            and np.array_equal(self.prompt_tokens, other.prompt_tokens)
            and np.array_equal(self.output_tokens, other.output_tokens)
            and (same_ids or np.array_equal(self.ids(), other.ids()))
            and _same_prefixes(self.prefixes, other.prefixes)
            and _same(self.after, other.after)
            and _same(self.think_s, other.think_s)
            and self.clients == other.clients
        )

    __hash__ = None  # type: ignore[assignment]  # holds arrays: compared by value, not hashable

    def head(self, n: int) -> Workload:
        """The first ``n`` requests (all of them if there are fewer); the arrays are views, not copies."""
        if n < 0:
            raise ValueError(f"head(n={n}): n must be >= 0")
        if n >= len(self):
            return self
        ids = None if self.request_id is None else self.request_id[:n]
        prefixes = None if self.prefixes is None else self.prefixes.take(np.arange(n))
        after = None if self.after is None else self.after[:n]
        think = None if self.think_s is None else self.think_s[:n]
        return Workload(
            self.arrival_s[:n], self.prompt_tokens[:n], self.output_tokens[:n], ids, self.source, prefixes, after, think
        )

    def id_of(self, i: int) -> str:
        """The id of row ``i``."""
        return str(i) if self.request_id is None else str(self.request_id[i])

    def ids(self) -> ObjArray:
        """All ids as an object array of str (built on demand when the ids are the row indices)."""
        if self.request_id is not None:
            return self.request_id
        return np.arange(len(self)).astype(str).astype(object)

    def to_frame(self) -> pd.DataFrame:
        """Columns ``arrival_time_s, prompt_tokens, output_tokens, request_id``: the native trace format, so
        ``w.to_frame().to_csv(path, index=False)`` writes a file that ``load_trace(path)`` reads back
        exactly."""
        import pandas as pd

        return pd.DataFrame(
            {
                "arrival_time_s": self.arrival_s,
                "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens,
                "request_id": self.ids(),
            }
        )


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return a is b if a is None or b is None else np.array_equal(a, b)


def _same_prefixes(a: Prefixes | None, b: Prefixes | None) -> bool:
    if a is None or b is None:
        return a is b
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("ids", "tokens", "offsets"))


def _bad_row(name: str, values: np.ndarray, bad: np.ndarray | None, what: str) -> None:
    if bad is not None and bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} row {i}: {values[i].item()!r} {what}")


def _whole(values: npt.ArrayLike, name: str) -> IntArray:
    array = np.asarray(values)
    if array.dtype.kind == "f":
        _bad_row(name, array, ~np.isfinite(array) | (array != np.floor(array)), "is not a whole number")
    elif array.dtype.kind not in "iub" and array.size:
        raise ValueError(f"{name} must be numeric, got dtype {array.dtype}")
    return array.astype(np.int64)


def load_trace(
    path: str | Path,
    format: str = "auto",
    limit: int | None = None,
    time_scale: float = 1.0,
    *,
    model: str | None = None,
    sort: bool = False,
) -> Workload:
    """Read a trace file (formats in ``sim.workload.traces``; ``FORMATS`` names them).

    - ``format="auto"`` detects it: ``.jsonl`` is mooncake, otherwise the CSV header decides. A length-only
      file (ShareGPT stats: lengths, no arrival column) is not a trace; use it as an ``empirical`` source.
    - Arrivals are shifted so the first is at 0 s (all formats but ``native``, whose times are already
      relative, so a written workload reads back unchanged), then divided by ``time_scale`` (2 replays twice
      as fast).
    - ``limit`` keeps the first ``limit`` rows of the file (for BurstGPT, of those that pass ``model``, a
      filter on its ``Model`` column).
    - Timestamps must be sorted; an earlier row after a later one is an error naming both rows, unless
      ``sort=True`` (``ferry run --sort-trace``), which sorts by arrival (stable).
    - Token counts must be whole numbers in ``0..MAX_TOKENS`` (2**31 - 1) and arrivals at most ``MAX_ARRIVAL_S``
      (1e9 s) after the start (``sim.workload.traces``); a bad value is a ``ValueError`` naming the file, row and
      column.
    """
    cols = traces.read_trace(path, format, limit, time_scale, model, sort)
    prefixes = None if cols.hash_ids is None else from_hash_ids(cols.hash_ids, cols.prompt_tokens)
    return Workload(cols.arrival_s, cols.prompt_tokens, cols.output_tokens, cols.request_id, cols.source, prefixes)
