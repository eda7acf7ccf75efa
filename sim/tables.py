"""A run's tables, column by column, from its records: ``requests.csv`` (one row per request: its times, tokens,
status and latencies, client's and server's, as ``sim.metrics`` defines them) and ``batches.csv`` (who rode in each
iteration); ``iterations.csv`` is ``IterationLog.columns``. Times in seconds. The ``*_frame`` functions give the same as
DataFrames (pandas is imported only by them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from sim.records import RunRecords
from sim.request import Reason, Status

if TYPE_CHECKING:
    import pandas as pd

FloatArray = npt.NDArray[np.float64]


STATUS_NAMES = np.array([s.name.lower() for s in Status], dtype=object)
REASON_LABELS = np.array(["" if x == Reason.NONE else x.label for x in Reason], dtype=object)


def client_times(records: RunRecords) -> tuple[FloatArray, FloatArray]:
    """When each request's client received its first token and its whole response (s), from how it is delivered
    (``records.stream``): as made, or whole when the request gives back its seat."""
    r = records.requests
    if records.stream:
        return r.first_token, r.finish
    return r.released, r.released


def batch_columns(records: RunRecords, request_ids: npt.NDArray[np.object_] | None = None) -> dict[str, np.ndarray]:
    """Who took part in each iteration (the columns of ``batches.csv``), one row per request and iteration in the
    order the policy scheduled them: ``iteration`` (the row of ``iterations.csv``), ``request_id``, ``phase``
    (``prefill``: a whole prompt, or a recompute from nothing, in one go; ``prefill_chunk``: part of one;
    ``decode``: a one-token step), ``tokens`` computed and ``context_tokens`` cached before, and of the tokens the
    draft tokens verified (speculative decoding) and the drafts accepted. Raises ValueError when
    the run did not keep them (``record_batches``). ``request_ids``: the ids to show (default the records')."""
    if records.batches is None:
        raise ValueError("this run did not record its batches; run it with record_batches (--record-batches)")
    b = records.batches.columns()
    r = records.requests
    ids = request_ids if request_ids is not None else records.request_ids
    ids = ids if ids is not None else np.arange(r.n).astype(str)
    whole = (b["context"] == 0) & (b["tokens"] >= r.prompt[b["request"]])
    phase = np.where(b["prefill"] == 0, "decode", np.where(whole, "prefill", "prefill_chunk")).astype(object)
    return {
        "iteration": b["iteration"],
        "request_id": np.asarray(ids, dtype=object)[b["request"]],
        "phase": phase,
        "tokens": b["tokens"],
        "context_tokens": b["context"],
        "draft_tokens": b["drafts"],
        "accepted_tokens": b["accepted"],
    }


def batch_frame(records: RunRecords, request_ids: npt.NDArray[np.object_] | None = None) -> pd.DataFrame:
    """``batch_columns`` as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(batch_columns(records, request_ids))


def latencies(records: RunRecords) -> dict[str, FloatArray]:
    """Each request's latencies (s), the columns of ``request_frame`` the summary reads: ``response_s`` and
    ``first_received_s`` (when the client received its response and its first token), ``queueing_s``, ``ttft_s``,
    ``tpot_s``, ``e2el_s`` (the client's) and ``server_ttft_s``, ``server_tpot_s``."""
    r = records.requests
    made = r.generated
    received, response = client_times(records)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(made > 1, ((response - r.arrival) - (received - r.arrival)) / (made - 1), np.nan)
        server_tpot = np.where(made > 1, (r.finish - r.first_token) / (made - 1), np.nan)
    return {
        "response_s": response,
        "first_received_s": received,
        "queueing_s": r.first_scheduled - r.arrival,
        "ttft_s": received - r.arrival,
        "tpot_s": tpot,
        "e2el_s": response - r.arrival,
        "server_ttft_s": r.first_token - r.arrival,
        "server_tpot_s": server_tpot,
    }


def request_frame(records: RunRecords) -> pd.DataFrame:
    """``request_columns`` as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(request_columns(records))


def request_columns(records: RunRecords) -> dict[str, np.ndarray]:
    """One row per request (the columns of ``requests.csv``); times in seconds. ``first_token_s`` and ``finish_s``
    are when the server made the first and last token, ``first_received_s`` and ``response_s`` when the client
    received them; ``ttft_s``, ``tpot_s`` and ``e2el_s`` are the client's, ``server_*`` the server's; with
    speculative decoding ``draft_tokens`` verified and ``accepted_tokens`` (its ``output_tokens`` are the accepted
    drafts and a token of every step)."""
    r = records.requests
    ids = records.request_ids if records.request_ids is not None else np.arange(r.n).astype(str)
    lat = latencies(records)
    return {
        "request_id": ids,
        "arrival_s": r.arrival,
        "first_scheduled_s": r.first_scheduled,
        "first_token_s": r.first_token,
        "finish_s": r.finish,
        "response_s": lat["response_s"],
        "prompt_tokens": r.prompt,
        "output_tokens": r.generated,
        "output_tokens_wanted": r.output_wanted,
        "queueing_s": lat["queueing_s"],
        "ttft_s": lat["ttft_s"],
        "tpot_s": lat["tpot_s"],
        "e2el_s": lat["e2el_s"],
        "preemptions": r.preemptions,
        "recomputed_tokens": r.recomputed,
        "cached_tokens": r.cached,
        "status": STATUS_NAMES[r.status],
        "reason": REASON_LABELS[r.reason],
        "first_received_s": lat["first_received_s"],
        "released_s": r.released,
        "server_ttft_s": lat["server_ttft_s"],
        "server_tpot_s": lat["server_tpot_s"],
        "draft_tokens": r.draft_tokens,
        "accepted_tokens": r.accepted_tokens,
    }
