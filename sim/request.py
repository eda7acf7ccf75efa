"""Requests as columns: one row per request, counters instead of phases (a struct of arrays).

A request is a prompt of ``prompt[i]`` tokens that wants ``output_wanted[i]`` tokens generated. Its progress is two
counters, as in vLLM V1's scheduler:
- ``computed[i]``: tokens whose KV entries are in the cache (prompt and fed-back output tokens);
- ``generated[i]``: output tokens sampled so far.
The request "holds" ``prompt + generated`` tokens; an iteration computes some of the ones not yet cached and, when
the cache has caught up with all of them, samples one more. Prefill, chunked prefill, decode and recompute after a
preemption are all just "computed catches up with prompt + generated": no phase field is needed.

Times are seconds on the engine's clock (simulated or real), NaN until they happen.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import numpy.typing as npt


class Status(IntEnum):
    """Where a request is. The order means something: ``status >= FINISHED`` is over for good."""

    PENDING = 0  # not yet arrived
    WAITING = 1  # arrived, queued for admission (or put back after a preemption)
    RUNNING = 2  # holds a seat in the running batch and KV blocks
    HELD = 3  # all tokens made, but its seat and memory are held until its batch returns (static batching)
    FINISHED = 4  # done: its seat and memory are free again
    REJECTED = 5  # will never run; ``reason`` says why


class Reason(IntEnum):
    """Why a request was rejected (stored as a small integer per request)."""

    NONE = 0
    EMPTY = 1  # prompt or output length is zero
    EXCEEDS_MAX_MODEL_LEN = 2  # prompt + output tokens > max_model_len
    EXCEEDS_KV_CACHE = 3  # prompt + output tokens can never fit in the whole KV cache
    STALLED = 4  # the policy stopped scheduling with work left (a policy bug; never expected)
    ABORTED = 5  # its client went away before it ended (a live server, ``experiments.real.live``)
    FAILED = 6  # a live server did not serve it (seen from a client: an error, or no token; ``experiments.real``)
    EARLIER_TURN_REJECTED = 7  # a conversation's turn whose turn before was rejected: its client never sent it

    @property
    def label(self) -> str:
        return self.name.lower()


# every column: name and the value of a request that has not started (what ``RequestTable.append`` fills in)
COLUMN_FILLS: tuple[tuple[str, float], ...] = (
    ("arrival", np.nan),
    ("prompt", 0),
    ("output_wanted", 0),
    ("computed", 0),
    ("generated", 0),
    ("status", Status.PENDING),
    ("reason", Reason.NONE),
    ("preemptions", 0),
    ("recomputed", 0),
    ("cached", 0),
    ("admit_order", -1),
    ("first_scheduled", np.nan),
    ("first_token", np.nan),
    ("last_token", np.nan),
    ("finish", np.nan),
    ("released", np.nan),
    ("drafts", 0),
    ("draft_tokens", 0),
    ("accepted_tokens", 0),
)
MIN_CAPACITY = 64  # rows a table that grows reserves at least


class RequestTable:
    """All requests of a run as numpy columns, indexed by request number ``0..n-1`` in arrival order.

    Every column has exactly ``n`` rows. A live server learns its requests one at a time (``append``): the columns
    are then views of the first ``n`` rows of larger buffers that double when full, so an append costs O(1)
    amortised. Read the columns through the table (``table.status``), never keep one: an append replaces them."""

    def __init__(
        self,
        arrival: npt.ArrayLike,
        prompt: npt.ArrayLike,
        output_wanted: npt.ArrayLike,
    ) -> None:
        self.arrival = np.asarray(arrival, dtype=np.float64)  # seconds
        self.prompt = np.asarray(prompt, dtype=np.int64)  # tokens
        self.output_wanted = np.asarray(output_wanted, dtype=np.int64)  # tokens
        n = len(self.arrival)
        if not len(self.prompt) == len(self.output_wanted) == n:
            raise ValueError("arrival, prompt and output_wanted must have the same length")
        self.n = n
        self.computed = np.zeros(n, dtype=np.int64)  # tokens with KV in the cache
        self.generated = np.zeros(n, dtype=np.int64)  # output tokens sampled
        self.status = np.zeros(n, dtype=np.int8)  # Status
        self.reason = np.zeros(n, dtype=np.int8)  # Reason
        self.preemptions = np.zeros(n, dtype=np.int32)  # times preempted (count)
        self.recomputed = np.zeros(n, dtype=np.int64)  # KV tokens discarded by preemption (tokens)
        self.cached = np.zeros(n, dtype=np.int64)  # prompt tokens found in the prefix cache when first admitted
        self.admit_order = np.full(n, -1, dtype=np.int64)  # sequence number of the latest admission
        nan = np.full(n, np.nan)
        self.first_scheduled = nan.copy()  # start of the first iteration it took part in (s)
        self.first_token = nan.copy()  # end of the iteration that sampled its first token (s)
        self.last_token = nan.copy()  # end of the iteration that sampled its latest token (s)
        self.finish = nan.copy()  # time its last token was made (s)
        self.released = nan.copy()  # time it gave back its seat and memory: its finish, or its batch's end (s)
        # speculative decoding (``sim.speculation``): draft tokens proposed for its next step and not yet scheduled
        # (vLLM's spec_token_ids), and over the run the draft tokens scheduled (placeholders included) and accepted
        self.drafts = np.zeros(n, dtype=np.int64)
        self.draft_tokens = np.zeros(n, dtype=np.int64)
        self.accepted_tokens = np.zeros(n, dtype=np.int64)
        self._buffers: dict[str, np.ndarray] = {}  # the columns' storage once the table grows (``append``)
        # sessions (``Workload.after``, ``think_s``): the turn before each request (-1: none), and the seconds its
        # client thinks after that turn's response before sending it; None without sessions
        self.after: npt.NDArray[np.int64] | None = None
        self.think: npt.NDArray[np.float64] | None = None

    def __len__(self) -> int:
        return self.n

    def append(self, arrival: float, prompt: int, output_wanted: int) -> int:
        """Add a request arriving at ``arrival`` (s) with ``prompt`` tokens that wants ``output_wanted`` output
        tokens, not yet started (pending, nothing computed, no times); returns its index (the old ``n``)."""
        i = self.n
        if any(name not in self._buffers or getattr(self, name).base is not self._buffers[name]
               for name, _ in COLUMN_FILLS):  # fmt: skip
            self._regrow(max(MIN_CAPACITY, 2 * i))  # first growth, or a column was replaced since
        elif i == len(self._buffers["arrival"]):
            self._regrow(2 * i)
        self.n = i + 1
        for name, _ in COLUMN_FILLS:
            setattr(self, name, self._buffers[name][: self.n])
        self.arrival[i], self.prompt[i], self.output_wanted[i] = arrival, prompt, output_wanted
        return i

    def _regrow(self, capacity: int) -> None:
        """Move every column into a buffer of ``capacity`` rows (the rows past ``n`` hold a new request's values)."""
        for name, fill in COLUMN_FILLS:
            column = getattr(self, name)
            buffer = np.full(capacity, fill, dtype=column.dtype)
            buffer[: self.n] = column
            self._buffers[name] = buffer

    def total_tokens(self, ids: npt.NDArray[np.int64] | int) -> npt.NDArray[np.int64] | np.int64:
        """Tokens the request holds now: prompt plus output sampled so far (tokens)."""
        return self.prompt[ids] + self.generated[ids]

    def remaining(self, ids: npt.NDArray[np.int64] | int) -> npt.NDArray[np.int64] | np.int64:
        """Tokens to compute before the next sample (tokens): the whole prompt at first, 1 while decoding (draft
        tokens, scheduled beyond these, are verified with the last)."""
        return self.prompt[ids] + self.generated[ids] - self.computed[ids]

    def is_prefilling(self, ids: npt.NDArray[np.int64] | int) -> npt.NDArray[np.bool_] | np.bool_:
        """True where the next step is (part of) a prefill or a recompute, not a one-token decode step."""
        return (self.generated[ids] == 0) | (self.remaining(ids) > 1)

    def take(self, rows: npt.NDArray[np.int64]) -> RequestTable:
        """A new table of the requests ``rows`` (in that order), their counters and times copied."""
        out = RequestTable(self.arrival[rows], self.prompt[rows], self.output_wanted[rows])
        for name, _ in COLUMN_FILLS[3:]:  # all but arrival, prompt and output_wanted
            setattr(out, name, getattr(self, name)[rows].copy())
        return out
