"""Automatic prefix caching (``sim.prefix_cache``): what is shared is computed once, a referenced block is never
evicted, nothing is found where nothing is shared, and a run with caching off (or nothing to find) is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import policies
from experiments.cli import main as ferry
from experiments.runner.config import RunConfig
from experiments.runner.simulation import run_simulation
from policies.config import SchedulerConfig
from sim.engine import simulate
from sim.kvcache import KVCacheManager
from sim.prefix_cache import PrefixCachingKV
from sim.request import RequestTable, Status
from sim.workload import Workload, load_trace
from sim.workload.prefixes import Prefixes, grouped
from tests.helpers import LinearTimer

BLOCK = 16


def _workload(
    arrivals: list[float], prompts: list[int], outputs: list[int], groups: list[int], shared: int
) -> Workload:
    """Requests whose prompts start with ``shared`` tokens of group ``groups[i]`` (-1: no shared segment)."""
    ids = [g for g in groups if g >= 0]
    offsets = np.concatenate([[0], np.cumsum([1 if g >= 0 else 0 for g in groups])])
    prefixes = Prefixes(np.array(ids), np.full(len(ids), shared), offsets)
    return Workload(
        np.asarray(arrivals, dtype=float),
        np.asarray(prompts, dtype=np.int64),
        np.asarray(outputs, dtype=np.int64),
        prefixes=prefixes,
    )


def _run(workload: Workload, blocks: int = 10_000, caching: bool = True, checks: list | None = None, **config):  # noqa: ANN001, ANN003, ANN201
    cfg = SchedulerConfig(**({"policy": "chunked", "max_num_seqs": 8, "max_num_batched_tokens": 256} | config))
    n = len(workload)
    kv = PrefixCachingKV(blocks, BLOCK, workload) if caching else KVCacheManager(blocks, BLOCK, n)
    timer = LinearTimer()
    if checks is not None:  # check the cache's invariants before every iteration
        inner = timer.iteration_time
        timer.iteration_time = lambda shape: (checks.append(_invariants(kv)), inner(shape))[1]  # type: ignore[method-assign]
    requests = RequestTable(workload.arrival_s, workload.prompt_tokens, workload.output_tokens)
    records = simulate(requests, policies.get(cfg), timer, kv, cfg.max_model_len, engine="reference")
    return records, kv


def _invariants(kv: PrefixCachingKV) -> bool:
    referenced: dict[int, int] = {}
    for refs in kv.shared.values():
        for k in refs:
            referenced[k] = referenced.get(k, 0) + 1
    assert referenced == kv.refcount  # every cached block's count is the requests that reference it
    assert not set(kv.refcount) & set(kv.evictable)  # a referenced block is never on the eviction list
    private = sum(int(kv.held[r]) - len(refs) for r, refs in kv.shared.items())
    private += int(kv.held[[r for r in range(len(kv.held)) if r not in kv.shared]].sum())
    assert kv.used == private + len(kv.refcount)  # a shared block counts once
    assert kv.used + len(kv.evictable) <= kv.num_blocks
    return True


def test_identical_prompts_compute_their_prefix_once() -> None:
    # four requests with the same 512-token system prompt and 64 tokens of their own, arriving after the first's
    # prefill: the 32 blocks of the prefix are computed once, the others prefill their own 64 tokens only
    w = _workload([0.0, 1.0, 1.5, 2.0], [576] * 4, [4] * 4, [7, 7, 7, 7], shared=512)
    records, kv = _run(w)
    prefill = int(records.iterations.column("prefill_tokens").sum())
    assert prefill == 576 + 3 * 64
    assert list(records.requests.cached) == [0, 512, 512, 512]
    assert kv.hit_tokens == 3 * 512 and kv.query_tokens == 4 * 576
    off, _ = _run(w, caching=False)
    assert int(off.iterations.column("prefill_tokens").sum()) == 4 * 576


def test_a_whole_cached_prompt_still_computes_its_last_token() -> None:
    # a prompt made only of shared blocks: at most prompt - 1 tokens hit, so the last block is computed again
    w = _workload([0.0, 1.0], [512, 512], [3, 3], [1, 1], shared=512)
    records, _ = _run(w)
    assert list(records.requests.cached) == [0, 512 - BLOCK]
    assert int(records.iterations.column("prefill_tokens").sum()) == 512 + BLOCK


def test_hit_rate_is_zero_when_prefixes_are_unique() -> None:
    n = 12
    w = _workload(list(np.linspace(0, 2, n)), [400] * n, [5] * n, list(range(n)), shared=300)
    records, kv = _run(w)
    assert kv.hit_tokens == 0 and (records.requests.cached == 0).all()
    none = Workload.from_arrays(np.linspace(0, 2, n), [400] * n, [5] * n)  # no prefixes at all
    _, kv = _run(none)
    # every full block is cached, a request's own too (vLLM hashes them all), though nobody else can find them
    assert kv.hit_tokens == 0 and kv.cached_blocks == n * (405 // BLOCK)


def test_caching_with_nothing_shared_changes_nothing_until_a_preemption() -> None:
    """With nothing shared and no preemption, caching on runs exactly as caching off. Under KV pressure a preempted
    request finds its own blocks when readmitted, if they were not evicted meanwhile (vLLM caches every full block:
    ``KVCacheManager.allocate_slots``' ``cache_blocks``), so it recomputes less than with caching off."""
    rng = np.random.default_rng(3)
    n = 60
    w = Workload.from_arrays(np.sort(rng.uniform(0, 0.5, n)), rng.integers(20, 900, n), rng.integers(50, 300, n))
    roomy_on, _ = _run(w)
    roomy_off, _ = _run(w, caching=False)
    assert roomy_on.requests.preemptions.sum() == 0
    for column in ("start", "end", "prefill_tokens", "decode_seqs", "kv_blocks_used"):
        np.testing.assert_array_equal(roomy_on.iterations.column(column), roomy_off.iterations.column(column))
    on, kv = _run(w, blocks=150)  # a small cache: preemptions happen
    off, _ = _run(w, blocks=150, caching=False)
    assert on.requests.preemptions.sum() > 0 and off.requests.preemptions.sum() > 0
    assert kv.hit_tokens > 0  # the readmitted found their own blocks
    assert on.iterations.column("prefill_tokens").sum() < off.iterations.column("prefill_tokens").sum()
    assert (on.requests.generated == off.requests.generated).all()  # every token is still made


def test_caching_off_is_unchanged_on_both_engines() -> None:
    config = RunConfig.model_validate(
        {
            "policy": "chunked",
            "num_prompts": 200,
            "request_rate": 20,
            "input_len": "uniform:100:2000",
            "output_len": "uniform:1:200",
            "prefix_len": 512,
            "num_prefix_groups": 3,
            "enable_prefix_caching": False,
        }  # fmt: skip
    )
    compiled = run_simulation(config.model_copy(update={"engine": "compiled"}))
    reference = run_simulation(config.model_copy(update={"engine": "reference"}))
    assert compiled.summary["engine"] == "compiled" and "prefix_cache_hits" not in compiled.summary
    for key in ("mean_ttft_ms", "p99_itl_ms", "duration", "num_iterations"):
        assert compiled.summary[key] == reference.summary[key]


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(2, 30),
    groups=st.integers(1, 4),
    blocks=st.integers(60, 400),
    seed=st.integers(0, 1000),
    policy=st.sampled_from(["continuous", "chunked"]),
)
def test_the_cache_keeps_its_invariants_and_conserves_tokens(
    n: int, groups: int, blocks: int, seed: int, policy: str
) -> None:
    rng = np.random.default_rng(seed)
    shared = int(rng.integers(16, 400))
    prompts = shared + rng.integers(1, 300, n)
    outputs = rng.integers(1, 80, n)
    w = Workload(
        np.sort(rng.uniform(0, 1, n)), prompts.astype(np.int64), outputs.astype(np.int64),
        prefixes=grouped(n, shared, groups, rng),
    )  # fmt: skip
    checks: list[bool] = []
    extra = {"max_num_batched_tokens": 1024, "max_model_len": 1024} if policy == "continuous" else {}
    records, kv = _run(w, blocks=blocks, checks=checks, policy=policy, **extra)
    assert checks and all(checks)
    r = records.requests
    done = r.status == Status.FINISHED
    assert ((r.status == Status.FINISHED) | (r.status == Status.REJECTED)).all()  # every request ends
    np.testing.assert_array_equal(r.generated[done], r.output_wanted[done])
    # every token is computed or found cached: prompt + output - 1 each (the last is sampled, never computed);
    # exactly so without preemptions, more with them (a recompute computes again what had been computed)
    it = records.iterations
    computed = int(it.column("prefill_tokens").sum() + it.column("decode_seqs").sum()) + kv.hit_tokens
    needed = int((r.prompt[done] + r.output_wanted[done] - 1).sum())
    assert computed == needed if r.preemptions.sum() == 0 else computed >= needed
    assert kv.used == 0 and not kv.refcount  # all freed at the end; what stays cached is evictable
    assert kv.cached_blocks == len(kv.evictable) <= blocks


def test_ferry_run_with_shared_system_prompts(tmp_path: Path) -> None:
    args = ["run", "--policy", "chunked", "--enable-prefix-caching", "--prefix-len", "1024", "--num-prefix-groups", "4",
            "--num-prompts", "200", "--request-rate", "10", "--input-len", "256", "--output-len", "32",
            "--engine", "compiled", "--out", str(tmp_path)]  # fmt: skip
    assert ferry(args) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["engine"] == "compiled"  # (auto would take the reference engine for this job of 6,400 tokens)
    assert s["prefix_cache_queries"] == 200 * 1280
    assert s["prefix_cache_hits"] == s["prefill_tokens_saved"] >= (200 - 4 * 2) * 1024  # all but the first few
    assert s["mean_ttft_hit_ms"] < s["mean_ttft_miss_ms"]
    requests = (tmp_path / "requests.csv").read_text().splitlines()
    assert "cached_tokens" in requests[0]


def test_prefix_caching_is_refused_where_it_means_nothing() -> None:
    with pytest.raises(ValueError, match="enable_prefix_caching=True does not apply to --policy static"):
        RunConfig.model_validate({"policy": "static", "enable_prefix_caching": True})


def test_mooncake_hash_ids_are_read(tmp_path: Path) -> None:
    trace = tmp_path / "mooncake.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [10, 11, 12]},
        {"timestamp": 500, "input_length": 1300, "output_length": 5, "hash_ids": [10, 11, 13]},
        {"timestamp": 900, "input_length": 700, "output_length": 5, "hash_ids": [20, 21]},
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = load_trace(trace)
    assert w.prefixes is not None
    assert list(w.prefixes.tokens) == [512, 512, 76, 512, 512, 276, 512, 188]
    keys = [PrefixCachingKV(100, BLOCK, w).keys(i) for i in range(3)]
    assert len(keys[0]) == 1105 // BLOCK and (keys[0][:64] == keys[1][:64]).all()  # two shared 512-token blocks
    assert keys[0][64] != keys[1][64] and not set(keys[2]) & set(keys[0])
    records, kv = _run(w)
    assert list(records.requests.cached) == [0, 1024, 0]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, "x"]}) + "\n")
    with pytest.raises(ValueError, match="line 1: field 'hash_ids' must be a list of non-negative integers"):
        load_trace(bad)


def test_a_cluster_sums_its_replicas_caches() -> None:
    config = {"policy": "chunked", "enable_prefix_caching": True, "num_prompts": 60, "request_rate": 20,
              "input_len": 128, "output_len": 8, "prefix_len": 512, "num_prefix_groups": 2}  # fmt: skip
    one = run_simulation(RunConfig.model_validate(config)).summary
    two = run_simulation(RunConfig.model_validate(config | {"replicas": 2})).summary
    assert one["prefix_cache_queries"] == two["prefix_cache_queries"] == 60 * 640
    # round robin splits each group over both replicas: each computes each shared prompt once (more misses)
    assert 0 < two["prefix_cache_hits"] < one["prefix_cache_hits"]
    assert two["requests_with_cache_hit"] < one["requests_with_cache_hit"]


def test_prefix_affinity_routes_requests_where_their_prefix_is_cached() -> None:
    # the datasheet H100, whose slower prefills keep requests of one group overlapping on a round-robin replica
    config = {"policy": "chunked", "enable_prefix_caching": True, "num_prompts": 200, "request_rate": 20,
              "input_len": 128, "output_len": 16, "prefix_len": 1024, "num_prefix_groups": 4,
              "replicas": 2, "hardware": "h100-sxm.datasheet"}  # fmt: skip
    spread = run_simulation(RunConfig.model_validate(config)).summary  # round robin
    affine = run_simulation(RunConfig.model_validate(config | {"router": "prefix_affinity"})).summary
    assert affine["prefix_cache_hit_rate"] > spread["prefix_cache_hit_rate"]
    assert affine["prefill_tokens_saved"] > spread["prefill_tokens_saved"]
    # one shared prompt: every replica has it cached after its first request, so load decides, and both serve
    one = run_simulation(RunConfig.model_validate(config | {"router": "prefix_affinity", "num_prefix_groups": 1}))
    served = np.bincount(one.cluster.replica_of, minlength=2)
    assert served.min() > 50
