"""What a run leaves behind: one row per iteration, the token gaps, and the request table.

Metrics are derived from these afterwards (``sim.metrics``); nothing here summarises.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pandas as pd

from sim.request import RequestTable

# One row per iteration. Times in seconds; counts in sequences, tokens or blocks as named.
ITERATION_COLUMNS = (
    "start",  # when the iteration began (s)
    "end",  # when it ended (s)
    "prefill_seqs",  # sequences computing prompt (or recompute) tokens (count)
    "prefill_tokens",  # prompt tokens computed (tokens)
    "decode_seqs",  # sequences taking a one-token decode step (count)
    "context_tokens",  # KV tokens attended to that were cached before the iteration, all sequences (tokens)
    "kv_blocks_used",  # KV blocks held by all requests during the iteration (blocks)
    "seats",  # requests holding a seat (running or held for their batch) during the iteration (count)
    "held",  # of those, requests already done whose seat is held until their batch ends (count)
    "waiting",  # requests queued for admission when the iteration ended (count)
    "preempted",  # requests preempted while this iteration was scheduled (count)
    "finished",  # requests whose last token this iteration made (count)
)
_COL = {name: k for k, name in enumerate(ITERATION_COLUMNS)}


class IterationLog:
    """Rows of ``ITERATION_COLUMNS`` in a growable float64 block (no per-row Python objects)."""

    def __init__(self, capacity: int = 1024) -> None:
        self._rows = np.zeros((capacity, len(ITERATION_COLUMNS)))
        self.n = 0

    def append(self, row: tuple[float, ...]) -> None:
        if self.n == len(self._rows):
            self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
        self._rows[self.n] = row
        self.n += 1

    def __len__(self) -> int:
        return self.n

    def column(self, name: str) -> npt.NDArray[np.float64]:
        return self._rows[: self.n, _COL[name]]

    def to_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(self._rows[: self.n], columns=list(ITERATION_COLUMNS))
        for name in ITERATION_COLUMNS[2:]:
            frame[name] = frame[name].astype(np.int64)
        return frame


class ItlLog:
    """Inter-token gaps (s): for every output token after a request's first, the time since its previous token.

    Kept exactly, as numpy chunks (8 bytes per token)."""

    def __init__(self) -> None:
        self._chunks: list[npt.NDArray[np.float64]] = []

    def add(self, gaps: npt.NDArray[np.float64]) -> None:
        if len(gaps):
            self._chunks.append(gaps)

    def values(self) -> npt.NDArray[np.float64]:
        return np.concatenate(self._chunks) if self._chunks else np.zeros(0)


@dataclass
class RunRecords:
    """Everything a run recorded: the requests' columns, the iterations and the token gaps."""

    requests: RequestTable
    iterations: IterationLog = field(default_factory=IterationLog)
    itl: ItlLog = field(default_factory=ItlLog)
    request_ids: npt.NDArray[np.object_] | None = None  # external ids for requests.csv (default: row number)
    kv_num_blocks: int = 0  # KV-cache capacity of the replica (blocks)
    kv_block_size: int = 0  # tokens per block
