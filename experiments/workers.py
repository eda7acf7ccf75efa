"""Independent jobs on a pool of processes, stopped at once by Ctrl-C: the one cancellation path of every command
that runs a pool (`ferry sweep`, `ferry plan`).

A terminal sends SIGINT to the whole process group. Left alone, every worker would catch it as a
``KeyboardInterrupt`` inside its job, ``concurrent.futures`` would hand that back as the job's result and give the
worker the next queued job, and the pool's shutdown would wait for the whole queue. Here workers ignore SIGINT and
the parent decides: on Ctrl-C (or any error of its own) it cancels what is queued, terminates the workers (the jobs
in flight are lost), hands every job that had already finished to the caller, and re-raises. The parent takes the
Ctrl-C between jobs (within ``POLL_S``), not wherever the signal lands: raised inside ``concurrent.futures.wait``, it
would leave futures' locks held, and the exit would wait for the executor's thread forever.

A worker pays its start-up once, however many jobs it runs: the pool is kept for every round of jobs a command has
(``Pool``), and ``warm`` (for a simulating pool, ``warm_engine``) runs in each worker as it starts, so that no job's
time includes the imports and the loading of the compiled engine.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

from experiments import interrupts

T = TypeVar("T")
R = TypeVar("R")

STOP_WAIT_S = 1.0  # how long a terminated worker is waited for before it is killed (seconds)
POLL_S = 0.05  # how often a wait for the next finished job looks for a Ctrl-C (seconds)


def _start_worker(warm: Callable[[], None] | None) -> None:
    """Worker initializer: Ctrl-C is the parent's to handle (it terminates the workers); then ``warm()``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if warm is not None:
        try:
            warm()
        except Exception:  # noqa: BLE001 (a warm-up that fails leaves the cost to the first job, which says why)
            pass


class Pool:
    """Worker processes started once and handed any number of rounds of jobs (``for_each``, ``ordered``): a command
    whose second round depends on the first (`ferry plan`'s curves after its candidates) keeps the workers of the
    first. As a context manager: leaving the block waits for the workers to exit; an error or Ctrl-C inside it
    stops them at once (``stop``).

    ``warm``: a function (picklable: module-level, or a ``functools.partial`` of one) each worker runs once as it
    starts, before its first job."""

    def __init__(self, processes: int, warm: Callable[[], None] | None = None) -> None:
        self.executor = ProcessPoolExecutor(max_workers=max(1, processes), initializer=_start_worker,
                                            initargs=(warm,))  # fmt: skip

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.executor.shutdown(wait=True)
        else:
            stop(self.executor)

    def for_each(self, fn: Callable[[T], R], items: Iterable[T],
                 on_result: Callable[[int, R], Iterable[T] | None]) -> None:  # fmt: skip
        """Run ``fn`` on every item on the workers, calling ``on_result(index, result)`` in this process as each job
        finishes (in the order they finish). ``on_result`` may return more items, which are run too (numbered after
        every item before them): a job that depends on finished ones starts as soon as they have finished.

        If this process is interrupted (``KeyboardInterrupt``) or ``fn`` or ``on_result`` raises, the queued jobs
        are cancelled and the workers stopped within about ``STOP_WAIT_S`` (the pool takes no more jobs); the jobs
        that had finished but were not yet handed over are handed to ``on_result`` first (so a caller that stores
        each result keeps every finished one; the one whose ``on_result`` was interrupted is handed again; what
        these calls return is not run), then the exception propagates.
        """
        index: dict[Future[R], int] = {}
        handed: set[Future[R]] = set()

        def submit(more: Iterable[T]) -> set[Future[R]]:
            futures: set[Future[R]] = set()
            for item in more:
                future = self.executor.submit(fn, item)
                index[future] = len(index)
                futures.add(future)
            return futures

        # Ctrl-C is taken between jobs, never inside the executor's code (``interrupts.deferred`` says why)
        with interrupts.deferred() as interrupted:
            try:
                running = submit(items)
                while running:
                    if interrupted():
                        raise KeyboardInterrupt
                    done, running = wait(running, timeout=POLL_S, return_when=FIRST_COMPLETED)
                    for future in sorted(done, key=index.__getitem__):
                        more = on_result(index[future], future.result())
                        handed.add(future)
                        running |= submit(more or ())
            except BaseException:
                stop(self.executor)
                for future, k in index.items():
                    if future not in handed and future.done() and not future.cancelled() and future.exception() is None:
                        on_result(k, future.result())
                        handed.add(future)
                raise

    def ordered(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """``[fn(x) for x in items]`` on the workers, stopped at once by Ctrl-C (see ``for_each``)."""
        items = list(items)
        out: list[Any] = [None] * len(items)

        def keep(k: int, result: R) -> None:
            out[k] = result

        self.for_each(fn, items, keep)
        return out


def for_each(
    fn: Callable[[T], R],
    items: Iterable[T],
    processes: int,
    on_result: Callable[[int, R], Iterable[T] | None],
    warm: Callable[[], None] | None = None,
) -> None:
    """``Pool.for_each`` on a pool of ``processes`` workers of its own (each running ``warm`` first)."""
    with Pool(processes, warm) as pool:
        pool.for_each(fn, items, on_result)


def ordered(fn: Callable[[T], R], items: Iterable[T], processes: int) -> list[R]:
    """``Pool.ordered`` on a pool of ``processes`` workers of its own."""
    with Pool(processes) as pool:
        return pool.ordered(fn, items)


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


# a run so small that it costs little more than loading the compiled code it runs (its result is dropped): a
# datasheet profile, which has no measured kernel tables to read
WARM_UP_RUN = {"model": "llama-3-8b", "hardware": "h100-sxm.datasheet", "num_prompts": 4, "input_len": 64,
               "output_len": 8, "request_rate": 100.0, "engine": "compiled"}  # fmt: skip


def warm_engine(policies: Iterable[str]) -> None:
    """A ``warm`` for a pool that simulates: import the simulator and load the compiled engine's loop of each of
    ``policies`` (the built-in ones; others have no compiled twin) from numba's disk cache (a cluster's replicas run
    the same loop). Most of a second a process, which the worker's first job would otherwise pay and count as its
    own."""
    from experiments.runner.config import RunConfig
    from experiments.runner.simulation import run_simulation
    from policies.config import BUILTIN_POLICIES

    for policy in dict.fromkeys(p for p in policies if p in BUILTIN_POLICIES):
        run_simulation(RunConfig.model_validate(WARM_UP_RUN | {"policy": policy}))
