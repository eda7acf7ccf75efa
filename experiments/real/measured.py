"""A live server's run as ferry records, from what its clients saw (``experiments.real.client.replay_trace``).

Only the client's side is known: when each request was sent, when each token arrived, and what the server counted
(``usage``). So the request table holds the client's times (arrival = sent, first token = first chunk, finish =
released = last chunk), the token gaps are the gaps between chunks, and there are no iterations: the summary's
iteration-derived values (idle time, iterations, batch sizes, KV use) are unknown and are blanked (``None``). A
request that failed (the server's error, or no token) is ``REJECTED`` (reason ``failed``), its message kept in
``errors``: none is dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from experiments.real.client import Stream
from sim.records import ItlLog, RunRecords
from sim.request import Reason, RequestTable, Status

# summary keys that come from the server's iterations, which a client does not see
SERVER_ONLY = (
    "num_iterations",
    "gpu_busy_s",
    "gpu_idle_s",
    "gpu_idle_fraction",
    "idle_while_waiting_s",
    "mean_batch_size",
    "mean_tokens_per_iteration",
    "peak_kv_usage",
    "mean_kv_usage",
    "kv_cache_blocks",
    "kv_block_size",
    "overload",
    "total_preemptions",
    "preempted_requests",
    "recomputed_tokens",
)


def records_of(streams: list[Stream], prompt_tokens: np.ndarray) -> tuple[RunRecords, dict[int, str]]:
    """The streams as records (client times, seconds from the replay's start) and the failed requests' errors."""
    arrival = np.array([s.sent_s for s in streams])
    counted = zip(streams, prompt_tokens, strict=True)
    prompt = np.array([s.prompt_tokens if s.prompt_tokens is not None else int(p) for s, p in counted], dtype=np.int64)
    requests = RequestTable(arrival, prompt, np.array([s.max_tokens for s in streams]))
    gaps = [s.gaps_s for s in streams if s.ok]
    itl = ItlLog(int(sum(len(g) for g in gaps)))
    errors: dict[int, str] = {}
    for i, s in enumerate(streams):
        if not s.ok:
            requests.status[i] = Status.REJECTED
            requests.reason[i] = Reason.FAILED
            errors[i] = s.error or "no token received"
            continue
        made = len(s.chunk_s)
        requests.status[i] = Status.FINISHED
        requests.generated[i] = made
        requests.computed[i] = requests.prompt[i] + made - 1
        requests.first_scheduled[i] = s.sent_s
        requests.first_token[i] = s.chunk_s[0]
        requests.last_token[i] = requests.finish[i] = requests.released[i] = s.chunk_s[-1]
        itl.add(s.gaps_s)
    return RunRecords(requests=requests, itl=itl, engine="live server", stream=True), errors


def blank_server_side(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with the values only the server's iterations could give set to None."""
    return summary | {k: None for k in SERVER_ONLY if k in summary}
