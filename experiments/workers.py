"""Independent jobs on a pool of processes, stopped at once by Ctrl-C: the one cancellation path of every command
that runs a pool (`ferry sweep`, `ferry plan`).

A terminal sends SIGINT to the whole process group. Left alone, every worker would catch it as a
``KeyboardInterrupt`` inside its job, ``concurrent.futures`` would hand that back as the job's result and give the
worker the next queued job, and the pool's shutdown would wait for the whole queue. Here workers ignore SIGINT and
the parent decides: on Ctrl-C (or any error of its own) it cancels what is queued, terminates the workers (the jobs
in flight are lost), hands every job that had already finished to the caller, and re-raises.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

STOP_WAIT_S = 1.0  # how long a terminated worker is waited for before it is killed (seconds)


def _ignore_sigint() -> None:
    """Worker initializer: Ctrl-C is the parent's to handle (it terminates the workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def for_each(fn: Callable[[T], R], items: Iterable[T], processes: int,
             on_result: Callable[[int, R], None]) -> None:  # fmt: skip
    """Run ``fn`` on every item on ``processes`` worker processes, calling ``on_result(index, result)`` in this
    process as each job finishes (in the order they finish).

    If this process is interrupted (``KeyboardInterrupt``) or ``fn`` or ``on_result`` raises, the queued jobs are
    cancelled and the workers stopped within about ``STOP_WAIT_S``; the jobs that had finished but were not yet
    handed over are handed to ``on_result`` first (so a caller that stores each result keeps every finished one;
    the one whose ``on_result`` was interrupted is handed again), then the exception propagates.
    """
    pool = ProcessPoolExecutor(max_workers=max(1, processes), initializer=_ignore_sigint)
    index: dict[Future[R], int] = {}
    handed: set[Future[R]] = set()
    try:
        for k, item in enumerate(items):
            index[pool.submit(fn, item)] = k
        for future in as_completed(index):
            on_result(index[future], future.result())
            handed.add(future)
    except BaseException:
        stop(pool)
        for future, k in index.items():
            if future not in handed and future.done() and not future.cancelled() and future.exception() is None:
                on_result(k, future.result())
                handed.add(future)
        raise
    pool.shutdown(wait=True)


def ordered(fn: Callable[[T], R], items: Iterable[T], processes: int) -> list[R]:
    """``[fn(x) for x in items]`` on worker processes, stopped at once by Ctrl-C (see ``for_each``)."""
    items = list(items)
    out: list[Any] = [None] * len(items)

    def keep(k: int, result: R) -> None:
        out[k] = result

    for_each(fn, items, processes, keep)
    return out


def stop(pool: ProcessPoolExecutor) -> None:
    """End the pool's workers now (terminate, then kill one that lingers) and cancel its queued jobs.

    The workers go first: the executor's manager thread then finds them gone and takes its broken-pool path, which
    closes the pipe to the workers. Shut down first, it would instead wait for the queue's feeder thread, which may be
    stuck writing a large job into a pipe that no worker reads any more (seconds, at the interpreter's exit)."""
    # the executor keeps its worker processes in ``_processes`` (CPython 3.9-3.13; 3.14 has terminate_workers)
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(STOP_WAIT_S)
        if process.is_alive():
            process.kill()
            process.join(STOP_WAIT_S)
    pool.shutdown(wait=False, cancel_futures=True)
