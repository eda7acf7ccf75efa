"""Invariants every policy keeps on random traces and limits, and the two engines' records to the last bit on them,
with every KV feature (prefix caching, conversations, the decode side of disaggregation) drawn too (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import policies
from policies.config import ITERATION_LIMITED, WHOLE_BATCHES, SchedulerConfig
from sim.engine import simulate
from sim.kvcache import KVCacheManager, TransferredKV
from sim.metrics import request_frame
from sim.prefix_cache import PrefixCachingKV
from sim.request import Reason, RequestTable, Status
from sim.speculation import Speculation, dense_schedule
from sim.workload import Workload
from sim.workload.prefixes import grouped
from sim.workload.sessions import multi_turn
from tests.helpers import LinearTimer, make_requests

POLICIES = ["none", "static", "dynamic", "continuous", "chunked"]


@st.composite
def scenarios(draw: st.DrawFn, names: tuple[str, ...] = tuple(POLICIES)) -> dict:
    n = draw(st.integers(1, 25))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.3]), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(0, 120), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    policy = draw(st.sampled_from(names))
    max_model_len = draw(st.integers(8, 160))
    chunked = policy == "chunked"
    budget = draw(st.integers(1, 64)) if chunked else draw(st.integers(max_model_len, 2 * max_model_len))
    max_batch_size = draw(st.integers(1, 8))
    return {
        "arrivals": np.cumsum(gaps),
        "prompts": prompts,
        "outputs": outputs,
        "block_size": draw(st.sampled_from([1, 4, 16])),
        "kv_blocks": draw(st.integers(1, 80)),
        "watermark": draw(st.sampled_from([0.0, 0.0, 0.01, 0.1])),
        "stream": draw(st.sampled_from([None, True, False])),
        "config": SchedulerConfig(
            policy=policy,
            max_model_len=max_model_len,
            max_num_seqs=draw(st.integers(1, min(8, budget))),
            max_num_batched_tokens=budget,
            long_prefill_token_threshold=draw(st.sampled_from([0, 3, 17])),
            mix_prefill_decode=draw(st.booleans()),
            scheduler_reserve_full_isl=draw(st.booleans()),
            chunked_order=draw(st.sampled_from(["vllm", "decodes-first"])),
            max_batch_size=max_batch_size,
            max_delay_ms=draw(st.sampled_from([0.0, 5.0, 100.0])),
            preferred_batch_sizes=tuple(draw(st.lists(st.integers(1, max_batch_size), max_size=3))),
            kv_reservation=draw(
                st.sampled_from(
                    [None, "output", "max_model_len"] + ([] if policy in ("static", "dynamic") else ["paged"])
                )
            ),
        ),
    }


def seqs_of(it) -> np.ndarray:
    return it.column("prefill_seqs") + it.column("decode_seqs")


def _simulate(sc: dict, engine: str = "reference", record_batches: bool = True):
    reqs = make_requests(sc["arrivals"], sc["prompts"], sc["outputs"])
    kv = KVCacheManager(sc["kv_blocks"], sc["block_size"], len(reqs), watermark=sc["watermark"])
    cfg = sc["config"]
    timer = LinearTimer(0.01, 1e-3, 1e-5)
    records = simulate(
        reqs, policies.get(cfg), timer, kv, cfg.max_model_len, engine=engine, stream=sc["stream"],
        record_batches=record_batches,
    )  # fmt: skip
    return reqs, kv, records


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_ends_and_limits_hold(sc: dict) -> None:
    reqs, kv, records = _simulate(sc)
    cfg = sc["config"]

    # every request ends completed or rejected with a reason, and the policy never stalls
    assert set(np.unique(reqs.status)) <= {Status.FINISHED, Status.REJECTED}
    rejected = reqs.status == Status.REJECTED
    assert (reqs.reason[rejected] != Reason.NONE).all()
    assert (reqs.reason[rejected] != Reason.STALLED).all()
    assert (reqs.reason[~rejected] == Reason.NONE).all()
    # rejected exactly when it could never run
    total = reqs.prompt + reqs.output_wanted
    never = (reqs.prompt == 0) | (reqs.output_wanted == 0) | (total > cfg.max_model_len)
    never |= -(-total // sc["block_size"]) > sc["kv_blocks"]
    assert (rejected == never).all()

    # token conservation: each finished request made exactly the tokens it wanted
    done = ~rejected
    assert (reqs.generated[done] == reqs.output_wanted[done]).all()
    assert (reqs.generated[rejected] == 0).all()
    # and the iterations computed exactly the tokens that ended in (or were dropped from) the KV caches
    it = records.iterations
    computed = it.column("prefill_tokens").sum() + it.column("decode_seqs").sum()
    assert computed == (reqs.computed[done].sum() + reqs.recomputed.sum())
    assert (reqs.computed[done] == total[done] - 1).all()
    # the batch log says the same, iteration by iteration and request by request
    b = records.batches.to_frame()
    per_it = b.groupby("iteration")
    assert (per_it.size().to_numpy() == seqs_of(it)).all() and len(per_it) == len(it)
    assert (b.tokens[b.prefill == 1].groupby(b.iteration).sum().reindex(range(len(it)), fill_value=0).to_numpy()
            == it.column("prefill_tokens")).all()  # fmt: skip
    assert ((b.prefill == 1) | (b.tokens == 1)).all()
    made = b.groupby("request").tokens.sum().reindex(range(reqs.n), fill_value=0).to_numpy()
    assert (made == reqs.computed + reqs.recomputed).all()

    # limits: sequences, tokens and memory per iteration
    seqs = it.column("prefill_seqs") + it.column("decode_seqs")
    tokens = it.column("prefill_tokens") + it.column("decode_seqs")
    if cfg.policy in ITERATION_LIMITED:
        assert (seqs <= cfg.seq_limit).all()
        assert (tokens <= cfg.token_budget).all()
        assert (it.column("seats") <= cfg.seq_limit).all()
    if cfg.policy in WHOLE_BATCHES:
        assert (it.column("seats") <= cfg.max_batch_size).all()
    if cfg.policy == "none":
        assert (seqs == 1).all()
    assert (it.column("kv_blocks_used") <= sc["kv_blocks"]).all()
    assert kv.used == 0 and (kv.held == 0).all()  # every block freed by the end

    # timestamps ordered; iterations do not overlap
    f = request_frame(records)[done]
    assert (f.arrival_s <= f.first_scheduled_s).all()
    assert (f.first_scheduled_s < f.first_token_s).all()
    assert (f.first_token_s <= f.finish_s).all()
    # the client never receives a token before it is made, nor its response before the last token
    assert (f.first_token_s <= f.first_received_s).all() and (f.finish_s <= f.response_s).all()
    assert (f.response_s <= f.released_s).all()
    assert (f.first_received_s <= f.response_s).all()
    assert (it.column("start")[1:] >= it.column("end")[:-1]).all()
    assert (records.itl.values() > 0).all()
    assert len(records.itl.values()) == (reqs.generated[done] - 1).sum()


@settings(max_examples=40, deadline=None)
@given(scenarios())
def test_same_input_same_records(sc: dict) -> None:
    _, _, first = _simulate(sc)
    _, _, second = _simulate(sc)
    assert request_frame(first).equals(request_frame(second))
    assert first.iterations.to_frame().equals(second.iterations.to_frame())


@st.composite
def featured(draw: st.DrawFn) -> dict:
    """A scenario with KV features drawn on top: a prefix cache over shared system prompts (continuous and chunked,
    as vLLM has it), conversations (every policy; their turns' content shared with the cache too), or KV sent by a
    prefill replica (continuous and chunked, a decode pool's replicas)."""
    feature = draw(st.sampled_from(["none", "caching", "caching", "conversations", "caching+conversations", "sent"]))
    sc = draw(scenarios(("continuous", "chunked") if feature in ("caching", "sent") else tuple(POLICIES)))
    paged = sc["config"].policy in ("continuous", "chunked")
    sc["caching"] = "caching" in feature and paged
    sc["prefix"] = draw(st.sampled_from([0, 16, 40, 64])) if sc["caching"] else 0
    sc["groups"] = draw(st.integers(1, 3))
    sc["turns"] = draw(st.integers(2, 4)) if "conversations" in feature else 1
    sc["think"] = draw(st.sampled_from([0.0, 0.01, 0.2]))
    sc["sent"] = feature == "sent"
    sc["seed"] = draw(st.integers(0, 2**16))
    return sc


def _featured_simulate(sc: dict, engine: str):  # noqa: ANN202
    rng = np.random.default_rng(sc["seed"])
    n = len(sc["arrivals"])
    w = Workload(np.asarray(sc["arrivals"], dtype=float), np.asarray(sc["prompts"], dtype=np.int64),
                 np.asarray(sc["outputs"], dtype=np.int64))  # fmt: skip
    if sc["prefix"]:
        w = Workload(w.arrival_s, w.prompt_tokens + sc["prefix"], w.output_tokens,
                     prefixes=grouped(n, sc["prefix"], sc["groups"], rng))  # fmt: skip
    if sc["turns"] > 1:  # a conversation's answers are its content: each has a token at least
        w = Workload(w.arrival_s, w.prompt_tokens, np.maximum(w.output_tokens, 1), prefixes=w.prefixes)
        w = multi_turn(w, sc["turns"], sc["think"], "uniform:0:30", "uniform:1:20", rng)
    reqs = RequestTable(w.arrival_s, w.prompt_tokens, w.output_tokens)
    reqs.after, reqs.think = w.after, w.think_s
    blocks, size = sc["kv_blocks"], sc["block_size"]
    if sc["caching"]:
        kv: KVCacheManager = PrefixCachingKV(blocks, size, w, watermark=sc["watermark"])
    elif sc["sent"]:
        kv = TransferredKV(blocks, size, np.maximum(w.prompt_tokens - 1, 0), watermark=sc["watermark"])
    else:
        kv = KVCacheManager(blocks, size, len(w), watermark=sc["watermark"])
    cfg = sc["config"]
    records = simulate(reqs, policies.get(cfg), LinearTimer(0.01, 1e-3, 1e-5), kv, cfg.max_model_len, engine=engine,
                       stream=sc["stream"], record_batches=True)  # fmt: skip
    return reqs, kv, records


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(featured())
def test_the_compiled_engine_gives_the_reference_records_to_the_last_bit(sc: dict) -> None:
    reqs, kv_ref, reference = _featured_simulate(sc, "reference")
    _, kv_fast, fast = _featured_simulate(sc, "compiled")
    assert fast.engine == "compiled" and reference.engine == "reference"
    assert request_frame(fast).equals(request_frame(reference))
    assert fast.iterations.to_frame().equals(reference.iterations.to_frame())
    assert np.array_equal(fast.itl.values(), reference.itl.values())
    assert (kv_fast.held == kv_ref.held).all() and kv_fast.used == kv_ref.used == 0
    assert fast.batches is not None and reference.batches is not None
    assert fast.batches.to_frame().equals(reference.batches.to_frame())
    assert fast.prefix_cache == reference.prefix_cache
    if sc["caching"]:  # what stays cached, and in which order it would be evicted
        assert isinstance(kv_fast, PrefixCachingKV) and isinstance(kv_ref, PrefixCachingKV)
        assert kv_fast.evictable == kv_ref.evictable and not kv_fast.refcount
    # every request ends, a conversation's turns included
    assert set(np.unique(reqs.status)) <= {Status.FINISHED, Status.REJECTED}


@st.composite
def speculative(draw: st.DrawFn) -> dict:
    """A featured scenario of the policies that schedule speculative decoding (vLLM V1's: chunked, continuous mixing
    prefills and decodes), with a drafter drawn on top: its draft count, lookahead slots (EAGLE-like, draft model, or
    none: n-gram), a draft model's input slot, a schedule by batch size, the cached block dropped, its rates."""
    sc = draw(featured())
    cfg = sc["config"]
    if cfg.policy not in ("chunked", "continuous") or sc["sent"]:
        cfg = cfg.model_copy(update={"policy": "chunked", "max_num_batched_tokens": draw(st.integers(2, 64))})
        cfg = cfg.model_copy(update={"max_num_seqs": min(cfg.max_num_seqs or 8, cfg.max_num_batched_tokens)})
        sc["sent"] = False
    sc["config"] = cfg.model_copy(update={"chunked_order": "vllm", "mix_prefill_decode": True, "kv_reservation": None})
    k = draw(st.integers(1, 4))
    slots = draw(st.sampled_from([0, 0, 1]))
    schedule = draw(st.sampled_from([None, [(1, 2, k), (3, 8, max(k - 2, 0))], [(1, 1, 0), (2, 8, k)]]))
    rates = sorted(draw(st.lists(st.sampled_from([0.0, 0.3, 0.7, 0.9, 1.0]), min_size=k, max_size=k)), reverse=True)
    sc["spec"] = Speculation(
        "eagle", k, np.array(rates), seed=draw(st.integers(0, 99)), lookahead=draw(st.sampled_from([0, k])),
        draft_slots=slots, drop_cached_block=draw(st.booleans()),
        per_batch=None if schedule is None else dense_schedule(schedule, 8, k),
    )  # fmt: skip
    return sc


def _speculative_simulate(sc: dict, engine: str):  # noqa: ANN202
    spec = sc["spec"]
    w = Workload(np.asarray(sc["arrivals"], dtype=float), np.asarray(sc["prompts"], dtype=np.int64),
                 np.asarray(sc["outputs"], dtype=np.int64))  # fmt: skip
    if sc["prefix"]:
        rng = np.random.default_rng(sc["seed"])
        w = Workload(w.arrival_s, w.prompt_tokens + sc["prefix"], w.output_tokens,
                     prefixes=grouped(len(w), sc["prefix"], sc["groups"], rng))  # fmt: skip
    reqs = RequestTable(w.arrival_s, w.prompt_tokens, w.output_tokens)
    blocks, size = sc["kv_blocks"], sc["block_size"]
    if sc["caching"]:
        kv: KVCacheManager = PrefixCachingKV(blocks, size, w, sc["watermark"], drop_last_block=spec.drop_cached_block)
    else:
        kv = KVCacheManager(blocks, size, len(w), watermark=sc["watermark"])
    cfg = sc["config"]
    records = simulate(reqs, policies.get(cfg), LinearTimer(0.01, 1e-3, 1e-5), kv, cfg.max_model_len, engine=engine,
                       stream=sc["stream"], record_batches=True, spec=spec)  # fmt: skip
    return reqs, kv, records


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(speculative())
def test_speculative_decoding_keeps_the_invariants_on_both_engines_to_the_last_bit(sc: dict) -> None:
    reqs, kv_ref, reference = _speculative_simulate(sc, "reference")
    _, kv_fast, fast = _speculative_simulate(sc, "compiled")
    assert fast.engine == "compiled" and reference.engine == "reference"
    assert request_frame(fast).equals(request_frame(reference))
    assert fast.iterations.to_frame().equals(reference.iterations.to_frame())
    assert np.array_equal(fast.itl.values(), reference.itl.values())
    assert fast.batches.to_frame().equals(reference.batches.to_frame())
    assert fast.prefix_cache == reference.prefix_cache
    assert np.array_equal(fast.speculation, reference.speculation)
    assert (kv_fast.held == kv_ref.held).all() and kv_fast.used == kv_ref.used == 0
    # every request ends; a finished one made exactly its tokens, the accepted drafts among them
    cfg = sc["config"]
    assert set(np.unique(reqs.status)) <= {Status.FINISHED, Status.REJECTED}
    done = reqs.status == Status.FINISHED
    assert (reqs.generated[done] == reqs.output_wanted[done]).all()
    assert (reqs.accepted_tokens <= reqs.draft_tokens).all() and (reqs.drafts == 0).all()
    # the iterations computed what the caches hold (less what a prefix cache found), what preemption dropped and the
    # rejected drafts rolled back
    it, b = reference.iterations, reference.batches.to_frame()
    scheduled = it.column("prefill_tokens").sum() + it.column("decode_seqs").sum() + it.column("draft_tokens").sum()
    rejected = int((reqs.draft_tokens - reqs.accepted_tokens).sum())
    assert scheduled == b.tokens.sum()
    if not sc["caching"]:
        assert scheduled == reqs.computed.sum() + reqs.recomputed.sum() + rejected
    # limits: a draft model's slot counts in the budget, as vLLM's input budget charges it
    tokens = b.groupby("iteration").tokens.sum().to_numpy()
    seqs = b.groupby("iteration").size().to_numpy()
    assert (tokens + sc["spec"].draft_slots * seqs <= cfg.token_budget).all()
    assert (seqs <= cfg.seq_limit).all()
    assert (b.context + b.tokens < cfg.max_model_len).all()  # a sample always fits max_model_len
    assert (it.column("kv_blocks_used") <= sc["kv_blocks"]).all()
    assert reference.speculation[0] == int((b.drafts > 0).sum())
