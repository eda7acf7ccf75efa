"""Speculative decoding's scheduling rules, each on a trace worked out by hand, on both engines (vLLM 0.32.0's
``Scheduler.schedule`` / ``update_from_output``, ``sim.speculation``)."""

from __future__ import annotations

import numpy as np
import pytest

import policies
from policies.config import SchedulerConfig
from sim.engine import simulate
from sim.kvcache import KVCacheManager
from sim.metrics import request_frame
from sim.prefix_cache import PrefixCachingKV
from sim.records import RunRecords
from sim.request import RequestTable
from sim.speculation import Speculation
from sim.workload import Workload
from sim.workload.prefixes import Prefixes
from tests.helpers import LinearTimer, make_requests

ENGINES = ("reference", "compiled")


def spec(k: int = 3, rate: float = 1.0, **kw: object) -> Speculation:
    """A drafter of k drafts whose every draft is accepted (rate 1) or rejected (rate 0)."""
    return Speculation("eagle", k, np.full(k, rate), seed=0, **kw)  # type: ignore[arg-type]


def run(reqs: RequestTable, drafter: Speculation, engine: str, kv: KVCacheManager | None = None,
        **config: object) -> RunRecords:  # fmt: skip
    fields = {"policy": "chunked", "max_model_len": 512, "max_num_seqs": 8, "max_num_batched_tokens": 256} | config
    cfg = SchedulerConfig(**fields)  # type: ignore[arg-type]
    kv = kv or KVCacheManager(1000, 16, len(reqs))
    return simulate(reqs, policies.get(cfg), LinearTimer(0.01, 1e-4, 0.0), kv, cfg.max_model_len, engine=engine,
                    record_batches=True, spec=drafter)  # fmt: skip


def steps(records: RunRecords) -> list[list[tuple[int, int, int, int]]]:
    """Each iteration's (request, tokens, drafts, accepted)."""
    b = records.batches.to_frame()  # type: ignore[union-attr]
    columns = ["request", "tokens", "drafts", "accepted"]
    return [[tuple(int(x) for x in row) for row in g[columns].to_numpy()] for _, g in b.groupby("iteration")]


@pytest.mark.parametrize("engine", ENGINES)
def test_drafts_follow_the_first_sample_and_all_accepted_make_k_plus_one_tokens(engine: str) -> None:
    reqs = make_requests([0.0], [20], [9])
    records = run(reqs, spec(3, 1.0), engine)
    # the prefill samples, the drafter proposes 3: each step then verifies 1 + 3 and makes 4 tokens
    assert steps(records) == [[(0, 20, 0, 0)], [(0, 4, 3, 3)], [(0, 4, 3, 3)]]
    assert reqs.generated[0] == 9 and reqs.accepted_tokens[0] == 6 and reqs.draft_tokens[0] == 6
    assert records.speculation.tolist() == [2, 2, 2, 2]  # two steps with drafts, each position accepted twice


@pytest.mark.parametrize("engine", ENGINES)
def test_rejected_drafts_are_rolled_back(engine: str) -> None:
    reqs = make_requests([0.0], [20], [3])
    records = run(reqs, spec(3, 0.0), engine)
    # every draft rejected: a step makes one token and its context grows by one, not four
    assert [(s[0][1], s[0][2], s[0][3]) for s in steps(records)] == [(20, 0, 0), (4, 3, 0), (4, 3, 0)]
    context = records.batches.to_frame().context.tolist()  # type: ignore[union-attr]
    assert context == [0, 20, 21]


@pytest.mark.parametrize("engine", ENGINES)
def test_drafts_take_the_budget_and_stop_at_max_model_len(engine: str) -> None:
    reqs = make_requests([0.0, 0.0], [30, 30], [40, 40])
    records = run(reqs, spec(4, 1.0), engine, max_num_batched_tokens=64)
    assert steps(records)[1] == [(0, 5, 4, 4), (1, 5, 4, 4)]  # 10 tokens of the budget
    tight = make_requests([0.0], [24], [8])
    records = run(tight, spec(4, 1.0), engine, max_model_len=32)
    # context 29 after two steps: max_model_len - 29 - 1 = 2 tokens, one draft
    assert [s[0][:3] for s in steps(records)] == [(0, 24, 0), (0, 5, 4), (0, 2, 1)]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_one_token_prompt_is_padded_only_beside_decodes(engine: str) -> None:
    reqs = make_requests([0.0, 0.005], [20, 1], [4, 3])
    records = run(reqs, spec(2, 1.0), engine)
    # request 1 arrives while request 0 decodes: admitted as 1 + 2 tokens, its placeholders never accepted
    assert steps(records)[1] == [(0, 3, 2, 2), (1, 3, 2, 0)]
    beside_prefill = make_requests([0.0, 0.005], [300, 1], [4, 3])
    records = run(beside_prefill, spec(2, 1.0), engine, max_num_batched_tokens=256)
    assert steps(records)[1] == [(0, 44, 0, 0), (1, 1, 0, 0)]  # request 0 still prefilling: no padding


@pytest.mark.parametrize("engine", ENGINES)
def test_a_draft_models_slot_counts_in_the_budget(engine: str) -> None:
    reqs = make_requests([0.0, 0.0], [40, 40], [4, 4])
    records = run(reqs, spec(2, 1.0, draft_slots=1), engine, max_num_batched_tokens=60)
    # the budget less a slot per request scheduled (and one kept back): 60 - 1 - (40 + 1) = 18 for the second
    assert steps(records)[0] == [(0, 40, 0, 0), (1, 18, 0, 0)]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_draft_count_follows_the_batch_size(engine: str) -> None:
    reqs = make_requests([0.0, 0.0], [10, 10], [9, 9])
    per_batch = np.array([0, 3, 1], dtype=np.int64)  # one request scheduled: 3 drafts; two: 1
    records = run(reqs, spec(3, 1.0, per_batch=per_batch), engine)
    assert steps(records)[1] == [(0, 2, 1, 1), (1, 2, 1, 1)]


@pytest.mark.parametrize("engine", ENGINES)
def test_preemption_drops_the_drafts(engine: str) -> None:
    reqs = make_requests([0.0, 0.0], [30, 30], [30, 30])
    kv = KVCacheManager(6, 16, 2)
    records = run(reqs, spec(2, 1.0, lookahead=2), engine, kv=kv)
    b = records.batches.to_frame()  # type: ignore[union-attr]
    assert reqs.preemptions.sum() > 0
    resumed = b[(b.request == b.request.iloc[-1])]
    first_again = resumed[resumed.context == 0].index[-1]
    assert b.loc[first_again, "drafts"] == 0  # its recompute carries no draft


def test_an_eagle_drafter_drops_the_last_block_of_a_hit() -> None:
    shared = Prefixes(np.array([7, 7]), np.array([64, 64]), np.array([0, 1, 2]))
    w = Workload(np.array([0.0, 0.5]), np.array([80, 80]), np.array([2, 2]), prefixes=shared)
    for drop, found in ((False, 64), (True, 48)):
        reqs = RequestTable(w.arrival_s, w.prompt_tokens, w.output_tokens)
        kv = PrefixCachingKV(100, 16, w, drop_last_block=drop)
        run(reqs, spec(2, 1.0), "reference", kv=kv)
        assert reqs.cached[1] == found


def test_both_engines_agree_on_a_mixed_trace() -> None:
    rng = np.random.default_rng(3)
    n = 40
    args = (np.sort(rng.uniform(0, 0.3, n)), rng.integers(1, 200, n), rng.integers(1, 60, n))
    drafter = Speculation("eagle", 3, np.array([0.8, 0.6, 0.5]), seed=4, lookahead=3)
    frames = []
    for engine in ENGINES:
        reqs = make_requests(*args)
        records = run(reqs, drafter, engine, kv=KVCacheManager(60, 16, n), max_num_batched_tokens=96)
        frames.append((request_frame(records), records.iterations.to_frame(), records.speculation))
    assert frames[0][0].equals(frames[1][0]) and frames[0][1].equals(frames[1][1])
    assert np.array_equal(frames[0][2], frames[1][2])
