"""Values as a trace file gives them, checked and bounded as they are read: token counts are whole numbers in
``0..MAX_TOKENS``; arrival times are finite (seconds, milliseconds or dates) and at most ``MAX_ARRIVAL_S`` after the
start. A bad value is a ``ValueError`` naming the file, the column and the row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import pandas as pd

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Most tokens one request may have in its prompt or its output: 2**31 - 1, far above any model's context
# (10**5..10**7), and small enough that sums over millions of requests stay far from int64 overflow.
MAX_TOKENS = 2**31 - 1
# Latest arrival, in seconds from the start of the trace (after the shift and time_scale): 1e9 s, about 32
# years; it keeps milliseconds (x 1e3), nanoseconds in int64 (x 1e9 < 9.2e18) and cumulative sums finite.
MAX_ARRIVAL_S = 1e9


def check_json(value: object, arrival: bool, at: str) -> None:
    """A JSON number: an arrival must be finite (and fit a float), a token count whole in 0..MAX_TOKENS."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        ok = False
    elif arrival:
        ok = -1e308 < value < 1e308  # exact for Python ints of any size; false for inf and nan
    else:
        ok = 0 <= value <= MAX_TOKENS and float(value).is_integer()
    if not ok:
        what = "a finite number" if arrival else f"a whole number in 0..{MAX_TOKENS} (MAX_TOKENS)"
        raise ValueError(f"{at} is {show(value)}, expected {what}")


def show(value: object) -> str:
    """A value from a file for a message: numpy scalars as plain numbers, cut to 40 characters."""
    if isinstance(value, np.generic):
        value = value.item()
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def numbers(series: pd.Series, where: str, column: str) -> FloatArray:
    """A column as float64; a missing, non-numeric or infinite value is an error naming its row."""
    import pandas as pd

    if pd.api.types.is_bool_dtype(series.dtype):  # pandas reads a column of True/False as bool: not numbers
        series = series.astype(str)
    try:
        numeric = pd.to_numeric(series, errors="coerce")
    except OverflowError:  # pandas does not coerce an integer past float64's range (~1.8e308); Python makes it inf
        numeric = series.map(as_float)
    values = numeric.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        i = int(bad[0])
        raw = series.iloc[i]
        what = "missing value" if pd.isna(raw) else f"{show(raw)} is not a finite number"
        raise ValueError(f"{where}: column {column!r} row {series.index[i]}: {what}")
    return values


def as_float(value: object) -> float:
    """One value as a float: inf past float64's range, nan if it is not a number."""
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:  # a Python int past ~1.8e308
        return np.inf if value > 0 else -np.inf  # type: ignore[operator]
    except (TypeError, ValueError):
        return np.nan


def tokens(series: pd.Series, where: str, column: str) -> IntArray:
    """A token-count column as int64: whole numbers in 0..MAX_TOKENS (0 is kept: the engine rejects it with a
    reason)."""
    import pandas as pd

    values: npt.NDArray[np.int64] | npt.NDArray[np.uint64] | FloatArray
    if pd.api.types.is_integer_dtype(series.dtype):  # int64, or uint64 when a value is above 2**63 - 1
        values = series.to_numpy()
    else:
        values = numbers(series, where, column)
    bad = np.flatnonzero((values != np.floor(values)) | (values < 0) | (values > MAX_TOKENS))
    if bad.size:
        i = int(bad[0])
        value = values[i]
        if value != np.floor(value):
            what = "is not a whole number"
        elif value < 0:
            what = "is negative"
        else:
            what = f"is more than MAX_TOKENS = {MAX_TOKENS} tokens"
        raise ValueError(f"{where}: column {column!r} row {series.index[i]}: {show(series.iloc[i])} {what}")
    return values.astype(np.int64)


def seconds(series: pd.Series, where: str, column: str, unit_s: float) -> FloatArray:
    values = numbers(series, where, column)
    return values * unit_s if unit_s != 1.0 else values


def datetimes(series: pd.Series, where: str, column: str) -> FloatArray:
    """Datetime strings -> seconds after the first row. ISO 8601 with any number of fractional digits (beyond
    nanoseconds they are cut) and an optional UTC offset; differences are taken in integer nanoseconds."""
    import pandas as pd

    stamps = pd.to_datetime(series.str.strip(), format="ISO8601", utc=True, errors="coerce")
    bad = np.flatnonzero(stamps.isna().to_numpy())
    if bad.size:
        i = int(bad[0])
        raw = series.iloc[i]
        what = "missing value" if pd.isna(raw) else f"{show(raw)} is not a date and time"
        raise ValueError(f"{where}: column {column!r} row {series.index[i]}: {what}")
    if len(stamps) == 0:
        return np.zeros(0)
    return ((stamps - stamps.iloc[0]) / pd.Timedelta(1, "s")).to_numpy(dtype=np.float64)
