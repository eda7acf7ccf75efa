"""A one-line progress bar for long runs: requests finished, simulated seconds, wall rate. Quiet unless the stream
is a terminal, so sweeps, pipes and CI see nothing."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from experiments import interrupts


class Progress:
    """Call it with (simulated clock s, requests not yet ended, requests in all); it redraws at most every
    ``min_interval_s`` seconds of wall time."""

    def __init__(self, stream: TextIO | None = None, min_interval_s: float = 0.2) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.min_interval_s = min_interval_s
        self.started = time.perf_counter()
        self.last_draw = 0.0
        self.drawn = False

    def __call__(self, now: float, unfinished: int, total: int) -> None:
        interrupts.checkpoint()  # a Ctrl-C that was swallowed (see experiments.interrupts) stops the run here
        if not self.enabled:
            return
        wall = time.perf_counter()
        if wall - self.last_draw < self.min_interval_s:
            return
        self.last_draw = wall
        done = total - unfinished
        share = done / total if total else 1.0
        width = 30
        bar = "#" * int(share * width) + "-" * (width - int(share * width))
        rate = done / max(wall - self.started, 1e-9)
        self.stream.write(f"\r[{bar}] {done:,}/{total:,} requests  sim {now:,.1f} s  {rate:,.0f} req/s wall ")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


class Bar:
    """Jobs done, and the time left at the pace so far, redrawn on one line; on a terminal only."""

    def __init__(self, total: int, what: str, stream: TextIO | None = None) -> None:
        self.total, self.what, self.done, self.extra = total, what, 0, 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.perf_counter()

    def step(self, extra: bool = False) -> None:
        """One job done; ``extra``: one beyond the ``total`` counted (a plan's curve points, after its candidates)."""
        interrupts.checkpoint()
        if extra:
            self.extra += 1
        else:
            self.done += 1
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.started
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        if self.done < self.total:
            tail = f"about {elapsed / max(self.done, 1) * (self.total - self.done):,.0f} s left"
        else:
            tail = f"then {self.extra:,} more" if self.extra else "done"
        self.stream.write(f"\r[{'#' * filled}{'-' * (width - filled)}] {self.done:,}/{self.total:,} {self.what}  "
                          f"{elapsed:,.0f} s, {tail} ")  # fmt: skip
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and (self.done or self.extra):
            self.stream.write("\n")
            self.stream.flush()
