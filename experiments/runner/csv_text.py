"""CSV lines from columns of cell text, compiled: what ``DataFrame.to_csv`` writes, at a few nanoseconds a byte.

The cells arrive as one byte buffer (``data``) and, per column, where each row's cell starts and ends in it
(``offsets[column, row]`` .. ``offsets[column, row + 1]``). A column's ``kind`` says how a cell is written:
- ``COPY``: as it is (integers, booleans);
- ``FLOAT``: a float as Arrow's cast to text has it (shortest digits, e.g. ``3``, ``1e+16``, ``0.00001``, ``nan``),
  laid out as Python's ``repr`` does, which ``to_csv`` writes: positional with at least one digit after the point
  (``3.0``, ``0.0001``, ``1000000000000000.0``) unless the leading digit's power of ten is below -4 or above 15
  (``1e-05``, ``1.5e+16``, an exponent of at least two digits); NaN as an empty field;
- ``TEXT``: quoted, with quotes doubled, when it holds a comma, a quote or a newline (the csv module's minimal
  quoting, lines ending in ``\\n``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.kernels.jit import NO_REFCOUNTS, kernel

COPY, FLOAT, TEXT = 0, 1, 2
_COMMA, _QUOTE, _NEWLINE, _MINUS, _PLUS, _DOT, _ZERO = 44, 34, 10, 45, 43, 46, 48
_E, _I, _N = 101, 105, 110


@njit(cache=True, nogil=True, **NO_REFCOUNTS)  # (two blocks are rendered at once, on two threads)
def render(kinds: np.ndarray, data: np.ndarray, offsets: np.ndarray, out: np.ndarray, measure: bool) -> int:
    """Write every row's line into ``out`` (uint8); returns the bytes written, or -1 when ``out`` would not hold
    them (nothing past its end is written). ``measure``: only count them, for an ``out`` of that size."""
    columns, rows = offsets.shape[0], offsets.shape[1] - 1
    room = out.shape[0]
    pos = 0
    for r in range(rows):
        for c in range(columns):
            a, b = offsets[c, r], offsets[c, r + 1]
            kind = kinds[c]
            if not measure and pos + 2 * (b - a) + 32 > room:  # the most a cell can take: a quoted text's
                return -1
            if c > 0:
                pos = _put(out, pos, _COMMA, measure)
            if kind == COPY or (kind == FLOAT and _as_repr(data, a, b)):
                if not measure:
                    for i in range(a, b):
                        out[pos + i - a] = data[i]
                pos += b - a
            elif kind == FLOAT:
                pos = _float(data, a, b, out, pos, measure)
            else:
                pos = _text(data, a, b, out, pos, measure)
        pos = _put(out, pos, _NEWLINE, measure)
    return pos


@kernel
def _as_repr(data: np.ndarray, a: int, b: int) -> bool:
    """Whether Arrow's text of a float is already ``repr``'s (most are: ``-12.5``, ``0.0123``): positional with a
    point, no exponent, at most 16 digits before the point, and not below 0.0001 (which ``repr`` writes
    ``1e-05``). Arrow's shortest digits have no trailing zero after the point, as ``repr``'s."""
    i = a + 1 if a < b and data[a] == _MINUS else a
    point = -1
    for k in range(i, b):
        c = data[k]
        if c == _DOT:
            point = k
        elif c < _ZERO or c > _ZERO + 9:  # an exponent, nan, inf
            return False
    if point < 0 or point == i or point == b - 1 or point - i > 16:
        return False
    if data[i] != _ZERO:
        return True
    if point != i + 1:  # a leading zero before other digits (Arrow writes none)
        return False
    # 0.ddd: repr's positional form down to 0.0001 (three zeros after the point, then a digit)
    zeros = 0
    for k in range(point + 1, b):
        if data[k] != _ZERO:
            break
        zeros += 1
    return zeros < 4 and point + 1 + zeros < b


@kernel
def _put(out: np.ndarray, pos: int, byte: int, measure: bool) -> int:
    if not measure:
        out[pos] = byte
    return pos + 1


@kernel
def _text(data: np.ndarray, a: int, b: int, out: np.ndarray, pos: int, measure: bool) -> int:
    special = False
    for i in range(a, b):
        if data[i] == _COMMA or data[i] == _QUOTE or data[i] == _NEWLINE:
            special = True
            break
    if special:
        pos = _put(out, pos, _QUOTE, measure)
    for i in range(a, b):
        if special and data[i] == _QUOTE:
            pos = _put(out, pos, _QUOTE, measure)
        pos = _put(out, pos, data[i], measure)
    if special:
        pos = _put(out, pos, _QUOTE, measure)
    return pos


@kernel
def _float(data: np.ndarray, a: int, b: int, out: np.ndarray, pos: int, measure: bool) -> int:
    """One float cell: Arrow's text in ``data[a:b]`` laid out as ``repr``."""
    if a == b:
        return pos
    i = a
    negative = data[i] == _MINUS
    if negative:
        i += 1
    if data[i] == _N:  # nan: an empty field
        return pos
    if data[i] == _I:  # inf, -inf: as they are
        for k in range(a, b):
            pos = _put(out, pos, data[k], measure)
        return pos
    # the mantissa's digits, d[0..n) = the integer part then the fraction, and the exponent after "e"
    int_start = i
    while i < b and data[i] != _DOT and data[i] != _E:
        i += 1
    int_len = i - int_start
    frac_start, frac_len = i, 0
    if i < b and data[i] == _DOT:
        i += 1
        frac_start = i
        while i < b and data[i] != _E:
            i += 1
        frac_len = i - frac_start
    exponent = 0
    if i < b and data[i] == _E:
        i += 1
        exp_negative = data[i] == _MINUS
        if data[i] == _MINUS or data[i] == _PLUS:
            i += 1
        while i < b:
            exponent = exponent * 10 + (data[i] - _ZERO)
            i += 1
        if exp_negative:
            exponent = -exponent
    n = int_len + frac_len
    lead = 0
    while lead < n and _digit(data, int_start, int_len, frac_start, lead) == _ZERO:
        lead += 1
    end = n
    while end > lead and _digit(data, int_start, int_len, frac_start, end - 1) == _ZERO:
        end -= 1
    if negative:
        pos = _put(out, pos, _MINUS, measure)
    if end == lead:  # zero
        pos = _put(out, pos, _ZERO, measure)
        pos = _put(out, pos, _DOT, measure)
        return _put(out, pos, _ZERO, measure)
    digits = end - lead
    point = int_len + exponent - lead  # value = 0.d[lead..end) x 10**point
    if point <= -4 or point > 16:  # repr's exponent form
        pos = _put(out, pos, _digit(data, int_start, int_len, frac_start, lead), measure)
        if digits > 1:
            pos = _put(out, pos, _DOT, measure)
            for k in range(lead + 1, end):
                pos = _put(out, pos, _digit(data, int_start, int_len, frac_start, k), measure)
        pos = _put(out, pos, _E, measure)
        power = point - 1
        pos = _put(out, pos, _MINUS if power < 0 else _PLUS, measure)
        power = -power if power < 0 else power
        if power >= 100:
            pos = _put(out, pos, _ZERO + power // 100, measure)
        pos = _put(out, pos, _ZERO + (power // 10) % 10, measure)
        return _put(out, pos, _ZERO + power % 10, measure)
    if point <= 0:  # 0.000ddd
        pos = _put(out, pos, _ZERO, measure)
        pos = _put(out, pos, _DOT, measure)
        for _ in range(-point):
            pos = _put(out, pos, _ZERO, measure)
        for k in range(lead, end):
            pos = _put(out, pos, _digit(data, int_start, int_len, frac_start, k), measure)
        return pos
    for k in range(point):  # ddd[000].ddd, or .0
        pos = _put(out, pos, _digit(data, int_start, int_len, frac_start, lead + k) if k < digits else _ZERO, measure)
    pos = _put(out, pos, _DOT, measure)
    if digits <= point:
        return _put(out, pos, _ZERO, measure)
    for k in range(lead + point, end):
        pos = _put(out, pos, _digit(data, int_start, int_len, frac_start, k), measure)
    return pos


@kernel
def _digit(data: np.ndarray, int_start: int, int_len: int, frac_start: int, k: int) -> int:
    """The ``k``-th digit (an ASCII byte) of the mantissa: the integer part's, then the fraction's."""
    return data[int_start + k] if k < int_len else data[frac_start + k - int_len]
