"""How ferry compiles the functions of its engines: ``kernel`` for every function the compiled loop runs.

``cache=True`` compiles each function once per machine (numba keeps it on disk). ``_nrt=False`` leaves out numba's
reference counting of arrays: it increments and decrements a counter, atomically, for each array a function binds or
passes on, which was a third of the compiled loop's time (perf, issue 27). A kernel therefore never allocates an
array nor returns one it did not receive; the engines hand every buffer in.
"""

from __future__ import annotations

from typing import Any

from numba import njit

from costmodel import numba_cache

numba_cache.configure()  # before anything here is compiled (see costmodel.numba_cache)

NO_REFCOUNTS: dict[str, Any] = {"_nrt": False}  # numba's target option for it
WITH_REFCOUNTS: dict[str, Any] = {"_nrt": True}  # for a function a kernel calls that allocates (not inherited)
kernel = njit(cache=True, **NO_REFCOUNTS)
