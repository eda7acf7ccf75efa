"""Prefill/decode disaggregation: a pool of prefill replicas and a pool of decode replicas, the KV cache of each
request sent from one to the other over a link (DistServe, Splitwise; vLLM's disaggregated prefill with a KV
connector, ``vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py``, the decode side's
``_update_waiting_for_remote_kv`` in ``vllm/v1/core/sched/scheduler.py`` and the proxy of
``examples/online_serving/disaggregated_serving/``, vLLM main late 2026).

A request is routed to a prefill replica when it arrives and prefills there as a one-token request (vLLM's proxy
sends it with ``max_tokens=1``). When that iteration ends its KV (``prompt`` tokens) crosses the link: the prefill
replica's link sends one request's KV after another, in the order their prefills ended, each taking
``latency + bytes / bandwidth`` (bytes: the whole model's KV of its prompt, split over the GPUs of the smaller
tensor-parallel group, which send in parallel); the transfer overlaps with the prefill replica's next iterations.
When it has arrived the request joins the decode pool (routed then): admission must find room for all its prompt's
blocks, takes the first ``prompt - 1`` tokens as computed (``sim.kvcache.TransferredKV``) and computes the last one,
whose logits give the first token the client sees (as vLLM's decode instance does); then it decodes as usual.

So TTFT = prefill queue + prefill + transfer + decode queue + one decode-side iteration. The two pools are simulated
one after the other: the prefill pool does not depend on the decode pool (its replica frees a request's blocks when
its prefill ends; vLLM keeps them until the decode side has read them, so ferry's prefill pool holds a little less
KV than a real one). vLLM's decode side allocates the blocks first and pulls the KV into them; here the KV is sent
first and admitted after, which differs only when the decode pool is short of memory (docs/concepts/semantics.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sim.cluster import ClusterRecords, ReplicaSetup, Router, merge_itl, simulate_cluster
from sim.kvcache import TransferredKV
from sim.records import IterationLog, RunRecords
from sim.request import COLUMN_FILLS, RequestTable, Status

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class KVLink:
    """What one request's KV crosses from its prefill replica to its decode replica."""

    name: str  # "nvlink" or "network"
    bandwidth: float  # per GPU, one direction (B/s; inf: instantaneous)
    latency_s: float  # fixed cost of one transfer (s)
    lanes: int  # GPUs sending at once: the smaller tensor-parallel group of the two pools

    def seconds(self, nbytes: FloatArray) -> FloatArray:
        """Time to send ``nbytes`` bytes of KV (s)."""
        if math.isinf(self.bandwidth):
            return np.full(len(nbytes), self.latency_s)
        return self.latency_s + nbytes / (self.bandwidth * self.lanes)


@dataclass
class Pool:
    """One pool: its replicas and the router that picks among them."""

    setups: list[ReplicaSetup]
    router: Router


@dataclass
class DisaggRecords:
    """What a disaggregated run recorded: the requests as the client saw them (original order), each pool's cluster
    records over its own request table, and each request's path."""

    requests: RequestTable
    prefill: ClusterRecords  # over a table in the original order, every request one output token
    decode: ClusterRecords  # over a table in the order the transfers ended
    prefill_replica: IntArray  # per request (-1: rejected before routing)
    decode_replica: IntArray  # per request (-1: never reached the decode pool)
    prefill_end: FloatArray  # when its prefill iteration ended (s; NaN if it did not prefill)
    transfer_start: FloatArray  # when its KV started across the link (s)
    transfer_end: FloatArray  # when its KV had arrived (s)
    transfer_bytes: FloatArray  # KV bytes it sent (B)
    link: KVLink
    engine: str
    stream: bool = True
    request_ids: npt.NDArray[np.object_] | None = None
    engine_choice: str = ""  # why that engine ran (``sim.engine.choose_engine``)

    @property
    def num_replicas(self) -> int:
        return len(self.prefill.replicas) + len(self.decode.replicas)

    def merged(self) -> RunRecords:
        """The whole run as one set of records: every request, the prefill replicas' iterations then the decode
        replicas', the decode replicas' token gaps (what the request-level metrics are computed from)."""
        return RunRecords(
            requests=self.requests,
            itl=merge_itl([r.itl for r in self.decode.replicas]),
            iterations=IterationLog.concat([r.iterations for r in self.prefill.replicas + self.decode.replicas]),
            request_ids=self.request_ids,
            kv_num_blocks=sum(r.kv_num_blocks for r in self.prefill.replicas + self.decode.replicas),
            kv_block_size=self.decode.replicas[0].kv_block_size,
            engine=self.engine,
            engine_choice=self.engine_choice,
            stream=self.stream,
            seats=sum(self.prefill.seats) + sum(self.decode.seats),
        )

    def iteration_replica(self) -> IntArray:
        """The replica of each row of ``merged().iterations``: prefill replicas first, then decode replicas."""
        sizes = [len(r.iterations) for r in self.prefill.replicas + self.decode.replicas]
        return np.repeat(np.arange(len(sizes)), sizes)


def simulate_disaggregated(
    requests: RequestTable,
    prefill: Pool,
    decode: Pool,
    link: KVLink,
    kv_bytes_per_token: float,
    engine: str = "auto",
    exact_itl: bool | None = None,
    stream: bool | None = None,
) -> DisaggRecords:
    """Replay ``requests`` (a fresh table, arrival order) through ``prefill`` then ``decode`` with ``link`` between
    them; ``kv_bytes_per_token``: the whole model's KV of one token (B, all tensor-parallel shards together). The
    decode pool's setups must hold plain KV caches of the request count: each is replaced by a ``TransferredKV`` of
    the same size."""
    n = len(requests)
    first = RequestTable(requests.arrival, requests.prompt, np.minimum(requests.output_wanted, 1))
    pre = simulate_cluster(first, prefill.setups, prefill.router, engine, exact_itl, stream=stream)

    done = first.status == Status.FINISHED
    prefill_end = np.where(done, first.first_token, np.nan)
    nbytes = np.where(done, requests.prompt * float(kv_bytes_per_token), 0.0)
    start, end = _send(pre.replica_of, prefill_end, link.seconds(nbytes), done)

    rows = np.flatnonzero(done)
    rows = rows[np.argsort(end[rows], kind="stable")]
    second = RequestTable(end[rows], requests.prompt[rows], requests.output_wanted[rows])
    present = np.maximum(requests.prompt[rows] - 1, 0)
    setups = [
        ReplicaSetup(s.policy, s.timer, _arrived(s, present), s.max_model_len)
        for s in decode.setups
    ]  # fmt: skip
    dec = simulate_cluster(second, setups, decode.router, engine, exact_itl, stream=stream)

    merged = _merged(requests, first, second, rows)
    decode_replica = np.full(n, -1, dtype=np.int64)
    decode_replica[rows] = dec.replica_of
    return DisaggRecords(
        requests=merged,
        prefill=pre,
        decode=dec,
        prefill_replica=pre.replica_of,
        decode_replica=decode_replica,
        prefill_end=prefill_end,
        transfer_start=start,
        transfer_end=end,
        transfer_bytes=nbytes,
        link=link,
        engine=dec.engine,
        engine_choice=dec.engine_choice,
        stream=dec.stream,
    )


def _send(
    replica: IntArray, ready: FloatArray, seconds: FloatArray, done: npt.NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray]:
    """Each prefill replica's link sends its requests' KV one after another, in the order their prefills ended
    (ties: request order); returns each transfer's start and end (s; NaN for requests that did not prefill)."""
    start = np.full(len(ready), np.nan)
    end = np.full(len(ready), np.nan)
    for k in np.unique(replica[done]).tolist():
        mine = np.flatnonzero(done & (replica == k))
        mine = mine[np.argsort(ready[mine], kind="stable")]
        free = -math.inf
        for i in mine.tolist():
            s = max(float(ready[i]), free)
            free = s + float(seconds[i])
            start[i], end[i] = s, free
    return start, end


def _arrived(setup: ReplicaSetup, present: IntArray) -> TransferredKV:
    """A decode replica's cache: ``setup``'s size and watermark, knowing what each request brings."""
    kv = setup.kv
    out = TransferredKV(kv.num_blocks, kv.block_size, present)
    out.watermark_blocks = kv.watermark_blocks
    return out


def _merged(requests: RequestTable, first: RequestTable, second: RequestTable, rows: IntArray) -> RequestTable:
    """The requests as the client saw them: queued from their arrival, first scheduled on a prefill replica, their
    tokens (the first included) made on a decode replica; rejected where they were rejected."""
    out = requests
    for name, _ in COLUMN_FILLS[3:]:  # all but arrival, prompt and output_wanted
        getattr(out, name)[:] = getattr(first, name)
        if name in ("preemptions", "recomputed"):
            getattr(out, name)[rows] += getattr(second, name)
        elif name not in ("first_scheduled", "cached"):
            getattr(out, name)[rows] = getattr(second, name)
    return out
