"""Non-negative least squares, ``min |A x - b|`` with ``x >= 0``: Lawson and Hanson's active-set method, which the
profile fit (``costmodel.calibration.fit``) solves at every step of its alternation. Only numpy."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def nnls(a: FloatArray, b: FloatArray, guess: npt.NDArray[np.bool_] | None = None) -> FloatArray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson and Hanson, "Solving Least Squares Problems", 1974, ch. 23).

    Works on the normal equations (a'a x = a'b: a few columns, many rows), with the columns scaled to unit norm first
    (the fit mixes FLOPs ~1e12 with counts ~1); all-zero columns get 0. ``guess``: columns likely positive (a previous
    solution's), where the active set starts."""
    n = a.shape[1]
    norms = np.linalg.norm(a, axis=0)
    live = norms > 0
    x = np.zeros(n)
    if not live.any():
        return x
    scaled = a[:, live] / norms[live]
    gram, rhs = scaled.T @ scaled, scaled.T @ b
    k = gram.shape[0]
    sol = np.zeros(k)
    passive = np.zeros(k, dtype=bool) if guess is None else guess[live].copy()
    tol = 1e-10 * max(1.0, float(np.abs(rhs).max(initial=0.0))) * k
    grow = not passive.any()
    for _ in range(3 * k + 10):
        if grow:
            grad = rhs - gram @ sol
            if passive.all() or grad[~passive].max() <= tol:
                break
            passive[int(np.argmax(np.where(passive, -np.inf, grad)))] = True
        grow = True
        while passive.any():
            trial = np.zeros(k)
            trial[passive] = np.linalg.solve(*_regularised(gram, rhs, passive))
            if (trial[passive] > 0).all():
                sol = trial
                break
            blocking = passive & (trial <= 0)
            step = np.min(sol[blocking] / (sol[blocking] - trial[blocking]))
            sol = sol + step * (trial - sol)
            passive &= sol > tol
            sol[~passive] = 0.0
    x[live] = sol / norms[live]
    return x


def _regularised(gram: FloatArray, rhs: FloatArray, passive: npt.NDArray[np.bool_]) -> tuple[FloatArray, FloatArray]:
    """The normal equations on the passive columns, with a tiny ridge so that collinear columns stay solvable."""
    g = gram[np.ix_(passive, passive)]
    return g + np.eye(len(g)) * 1e-12 * max(1.0, float(np.trace(g))), rhs[passive]


# ---- the kernel fit -----------------------------------------------------------------------------------------------
