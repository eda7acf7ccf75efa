"""What a run leaves behind: one row per iteration, the token gaps, and the request table.

Metrics are derived from these afterwards (``sim.metrics``); nothing here summarises. Both engines (the reference
SimPy loop and the compiled one) write the same records, through the same code where they could differ in the last bit
(``add_gaps`` for the token gaps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from sim.kernels.jit import kernel

if TYPE_CHECKING:
    import pandas as pd
from sim.request import RequestTable

FloatArray = npt.NDArray[np.float64]

# One row per iteration. Times in seconds; counts in sequences, tokens or blocks as named.
TIME_COLUMNS = (
    "start",  # when the iteration began (s)
    "end",  # when it ended (s)
)
COUNT_COLUMNS = (
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
    "draft_tokens",  # speculative decoding: draft tokens verified, placeholders included (tokens)
    "accepted_tokens",  # of those, the drafts accepted (tokens)
)
ITERATION_COLUMNS = TIME_COLUMNS + COUNT_COLUMNS
# columns of speculative decoding (in iterations.csv, requests.csv and batches.csv), written after a table's others
SPEC_COLUMNS = ("draft_tokens", "accepted_tokens")


def spec_columns_last(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``columns`` with speculative decoding's after every other (the tables' columns before them keep their order
    from before ferry modelled it)."""
    return {k: v for k, v in columns.items() if k not in SPEC_COLUMNS} | {
        k: columns[k] for k in SPEC_COLUMNS if k in columns
    }


class IterationLog:
    """Rows of ``ITERATION_COLUMNS``, in chunks of a float64 block of times and an int32 block of counts (no per-row
    Python objects; 48 bytes an iteration). A full log grows by a new chunk, never by copying what it holds: a long
    run's log is its largest record."""

    def __init__(self, capacity: int = 1024) -> None:
        self.times = np.zeros((capacity, len(TIME_COLUMNS)))  # the chunk being written
        self.counts = np.zeros((capacity, len(COUNT_COLUMNS)), dtype=np.int32)
        self.full: list[tuple[FloatArray, npt.NDArray[np.int32]]] = []  # the chunks before it
        self.base = 0  # rows in those
        self.n = 0

    @classmethod
    def from_arrays(cls, times: FloatArray, counts: npt.NDArray[np.int32], n: int) -> IterationLog:
        log = cls(0)
        log.times, log.counts, log.n = times, counts, n
        return log

    @classmethod
    def concat(cls, logs: list[IterationLog]) -> IterationLog:
        """The rows of ``logs`` one log after the other (a cluster's replicas)."""
        times = np.concatenate([log.blocks()[0] for log in logs])
        counts = np.concatenate([log.blocks()[1] for log in logs])
        return cls.from_arrays(times, counts, len(times))

    def append(self, start: float, end: float, counts: tuple[int, ...]) -> None:
        if self.n - self.base == len(self.times):
            self.grow()
        self.times[self.n - self.base] = (start, end)
        self.counts[self.n - self.base] = counts
        self.n += 1

    def grow(self) -> None:
        """Start a new chunk as large as those before it together (at least 1024 rows): the capacity doubles."""
        size = max(self.base + len(self.times), 1024)
        self.full.append((self.times, self.counts))
        self.base += len(self.times)
        self.times = np.zeros((size, len(TIME_COLUMNS)))
        self.counts = np.zeros((size, len(COUNT_COLUMNS)), dtype=np.int32)

    def __len__(self) -> int:
        return self.n

    def blocks(self) -> tuple[FloatArray, npt.NDArray[np.int32]]:
        """Every row's times and counts (the chunk itself when there is one)."""
        rows = self.n - self.base
        if not self.full:
            return self.times[:rows], self.counts[:rows]
        times = [t for t, _ in self.full] + [self.times[:rows]]
        counts = [c for _, c in self.full] + [self.counts[:rows]]
        return np.concatenate(times), np.concatenate(counts)

    def column(self, name: str) -> npt.NDArray[np.float64] | npt.NDArray[np.int32]:
        blocks: list[Any]
        if name in TIME_COLUMNS:
            blocks, k = [t for t, _ in self.full] + [self.times], TIME_COLUMNS.index(name)
        else:
            blocks, k = [c for _, c in self.full] + [self.counts], COUNT_COLUMNS.index(name)
        last = blocks[-1][: self.n - self.base, k]
        out: Any = np.concatenate([b[:, k] for b in blocks[:-1]] + [last]) if len(blocks) > 1 else last
        return out

    def columns(self) -> dict[str, np.ndarray]:
        """Every column (the content of ``iterations.csv``): times in seconds, counts as int64."""
        columns: dict[str, np.ndarray] = {name: self.column(name) for name in TIME_COLUMNS}
        columns |= {name: self.column(name).astype(np.int64) for name in COUNT_COLUMNS}
        return columns

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.columns())


# One row per (iteration, request that took part in it): who rode in each iteration, in the order the policy
# scheduled them. Kept only when a run asks for it (``record_batches``): a long run makes one row per token.
BATCH_COLUMNS = (
    "iteration",  # the iteration's row in the iteration log (0-based)
    "request",  # the request's row in the request table (0-based)
    "tokens",  # tokens it computed in the iteration: a prompt chunk (or recompute), or 1 for a decode step (tokens)
    "context",  # tokens of it already cached before the iteration (tokens)
    "prefill",  # 1: those tokens were prompt (or recompute) tokens; 0: a decode step
    "drafts",  # speculative decoding: of those tokens, draft tokens verified (placeholders included)
    "accepted",  # of the drafts, those accepted
)


class BatchLog:
    """Rows of ``BATCH_COLUMNS`` in one growable int64 block (56 bytes a row)."""

    def __init__(self, capacity: int = 1024) -> None:
        self.rows = np.zeros((capacity, len(BATCH_COLUMNS)), dtype=np.int64)
        self.n = 0

    def append(self, iteration: int, requests: npt.NDArray[np.int64], tokens: npt.NDArray[np.int64],
               context: npt.NDArray[np.int64], prefill: npt.ArrayLike, drafts: npt.ArrayLike = 0,
               accepted: npt.ArrayLike = 0) -> None:  # fmt: skip
        k = len(requests)
        while self.n + k > len(self.rows):
            self.grow()
        block = self.rows[self.n : self.n + k]
        block[:, 0] = iteration
        block[:, 1], block[:, 2], block[:, 3], block[:, 4] = requests, tokens, context, prefill
        block[:, 5], block[:, 6] = drafts, accepted
        self.n += k

    def grow(self) -> None:
        """Double the capacity."""
        extra = max(len(self.rows), 1024)
        self.rows = np.concatenate([self.rows, np.zeros((extra, self.rows.shape[1]), dtype=np.int64)])

    def __len__(self) -> int:
        return self.n

    def columns(self) -> dict[str, np.ndarray]:
        """Each of ``BATCH_COLUMNS`` (int64)."""
        return {name: self.rows[: self.n, k] for k, name in enumerate(BATCH_COLUMNS)}

    def to_frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.rows[: self.n], columns=list(BATCH_COLUMNS))


# ---- inter-token gaps ------------------------------------------------------------------------------------------------
# Exact: every gap, 8 bytes a token. Histogram: counts in log-spaced buckets from HIST_MIN_S by a factor HIST_RATIO,
# so any quantile read from it is within HIST_REL_ERROR of a gap of that rank (the bucket's geometric middle against
# its ends); count, mean and standard deviation stay exact (running sums).
HIST_MIN_S = 1e-7
HIST_RATIO = 1.01
HIST_BUCKETS = int(math.ceil(math.log(1e5 / HIST_MIN_S) / math.log(HIST_RATIO))) + 1
HIST_REL_ERROR = math.sqrt(HIST_RATIO) - 1  # 0.5%
EXACT_GAPS_LIMIT = 20_000_000  # runs with more gaps than this keep the histogram (160 MB of exact gaps)

# the running sums of ``ItlLog.sums``; then the last gap put in the histogram and its bucket (a cache: the decodes of
# one iteration mostly share one gap, the iteration before's duration, and a bucket takes a logarithm to find)
SUM, SUM_SQ, COUNT, LAST_GAP, LAST_BUCKET = range(5)
# A batch of gaps is added through a tally kept in registers (``tally_start``, ``tally``, ``tally_end``): the same
# operations in the same order as one gap at a time, without a round trip through memory for each sum and count.
Tally = tuple[float, float, float, float, int, int]  # sum, sum of squares, count, last gap, its bucket, gaps in it


@kernel
def gap_bucket(gap: float) -> int:
    """Histogram bucket of a gap (s)."""
    if gap <= HIST_MIN_S:
        return 0
    b = int(math.floor(math.log(gap / HIST_MIN_S) / math.log(HIST_RATIO)))
    return min(b, HIST_BUCKETS - 1)


@kernel
def tally_start(sums: FloatArray) -> Tally:
    return sums[SUM], sums[SUM_SQ], sums[COUNT], sums[LAST_GAP], int(sums[LAST_BUCKET]), 0


@kernel
def tally(t: Tally, gap: float, hist: npt.NDArray[np.int64], exact: FloatArray) -> Tally:
    """Record one gap: running sums always, then the exact array if it has room for all gaps, else the histogram
    (a run of equal gaps counted into their bucket when it ends)."""
    total, squares, count, last, bucket, run = t
    if hist.shape[0] == 0:
        exact[int(count)] = gap
    elif gap == last:
        run += 1
    else:
        if run:
            hist[bucket] += run
        last, bucket, run = gap, gap_bucket(gap), 1
    return total + gap, squares + gap * gap, count + 1.0, last, bucket, run


@kernel
def tally_end(t: Tally, sums: FloatArray, hist: npt.NDArray[np.int64]) -> None:
    total, squares, count, last, bucket, run = t
    if run:
        hist[bucket] += run
    sums[SUM], sums[SUM_SQ], sums[COUNT], sums[LAST_GAP], sums[LAST_BUCKET] = total, squares, count, last, bucket


@kernel
def add_gaps(gaps: FloatArray, sums: FloatArray, hist: npt.NDArray[np.int64], exact: FloatArray) -> None:
    t = tally_start(sums)
    for g in gaps:
        t = tally(t, g, hist, exact)
    tally_end(t, sums, hist)


class ItlLog:
    """Inter-token gaps (s): for every output token after a request's first, the time since its previous token.

    ``capacity`` is how many gaps the run can make at most (its requests' output tokens minus one each); up to
    ``EXACT_GAPS_LIMIT`` they are kept exactly, beyond that as a fixed-error histogram (``exact`` says which)."""

    def __init__(self, capacity: int, exact: bool | None = None) -> None:
        self.exact = capacity <= EXACT_GAPS_LIMIT if exact is None else exact
        self.sums = np.array([0.0, 0.0, 0.0, np.nan, 0.0])  # SUM, SUM_SQ, COUNT, LAST_GAP, LAST_BUCKET
        self.gaps = np.zeros(capacity if self.exact else 0)
        self.hist = np.zeros(0 if self.exact else HIST_BUCKETS, dtype=np.int64)
        self.reserved = capacity  # gaps there must be room for (``reserve``)

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more gaps (a replica of a cluster learns its requests as they are routed)."""
        self.make_room(extra)
        self.reserved += extra

    def make_room(self, extra: int) -> None:
        """Room for ``extra`` gaps beyond those reserved, not reserved yet (the compiled cluster counts them)."""
        need = self.reserved + extra
        if self.exact and need > len(self.gaps):
            need = max(2 * len(self.gaps), need, 1024)
            self.gaps = np.concatenate([self.gaps, np.zeros(need - len(self.gaps))])

    def add(self, gaps: FloatArray) -> None:
        if len(gaps):
            add_gaps(gaps, self.sums, self.hist, self.gaps)

    @property
    def count(self) -> int:
        return int(self.sums[COUNT])

    def values(self) -> FloatArray:
        """Every gap, in the order they were made (exact logs only)."""
        if not self.exact:
            raise ValueError("this run kept its token gaps as a histogram; use stats()")
        return self.gaps[: self.count]

    def describe(self) -> str:
        return "exact" if self.exact else f"histogram (quantiles within {HIST_REL_ERROR:.1%})"

    def stats(self, percentiles: tuple[float, ...]) -> tuple[float, float, list[float]] | None:
        """(mean, std, [percentile values]) in seconds, or None without gaps. Exact logs compute them from the gaps;
        histograms take mean and std from the running sums and each percentile from its bucket's geometric middle."""
        n = self.count
        if n == 0:
            return None
        if self.exact:
            v = self.values()
            return float(v.mean()), float(v.std()), [float(x) for x in np.percentile(v, percentiles)]
        mean = self.sums[SUM] / n
        var = max(self.sums[SUM_SQ] / n - mean * mean, 0.0)
        cum = np.cumsum(self.hist)
        out = []
        for p in percentiles:
            rank = p / 100 * (n - 1)  # the (0-based) rank numpy's linear percentile centres on
            b = int(np.searchsorted(cum, rank + 1 - 1e-9))
            out.append(HIST_MIN_S * HIST_RATIO ** (b + 0.5))
        return float(mean), float(math.sqrt(var)), out


@dataclass
class RunRecords:
    """Everything a run recorded: the requests' columns, the iterations and the token gaps."""

    requests: RequestTable
    itl: ItlLog
    iterations: IterationLog = field(default_factory=IterationLog)
    request_ids: npt.NDArray[np.object_] | None = None  # external ids for requests.csv (default: row number)
    kv_num_blocks: int = 0  # KV-cache capacity of the replica (blocks)
    kv_block_size: int = 0  # tokens per block
    engine: str = "reference"  # which engine ran: "reference" (Python policies on SimPy) or "compiled"
    engine_choice: str = ""  # why that engine ran ("asked", or auto's reason: ``sim.engine.choose_engine``)
    # how responses reach the client: True, each token as it is made (streaming); False, the whole response when
    # the request gives back its seat (static and dynamic batching return every member's response at batch end)
    stream: bool = True
    seats: int = 0  # seats the policy offers (max batch size or max_num_seqs; 0 = unknown)
    # with prefix caching: tokens and blocks looked up and found at admissions, evictions (``PrefixCachingKV``)
    prefix_cache: dict[str, int] | None = None
    # who took part in each iteration, with their tokens (None unless the run was asked to record it)
    batches: BatchLog | None = None
    # speculative decoding (``sim.speculation``): verification steps with drafts, then the drafts accepted at each
    # position (vLLM's spec_decode_num_drafts and _num_accepted_tokens_per_pos); None without it
    speculation: npt.NDArray[np.int64] | None = None
