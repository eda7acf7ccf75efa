"""Each semantic rule ferry follows, on a tiny constructed trace whose numbers are worked out by hand in the test's
docstring, with the reference file and release it follows. Every scenario also runs on the compiled engine (a
constant-time ``LinearTimer`` has a compiled twin) and must give the same records there."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from experiments.runner.config import RunConfig
from experiments.runner.simulation import build_replica, run_simulation
from policies.config import SchedulerConfig
from policies.vllm_defaults import engine_defaults
from sim.metrics import parse_goodput, request_frame, summarize
from sim.records import RunRecords
from tests.helpers import LinearTimer, make_requests, run

ONE_SECOND = LinearTimer(base=1.0, per_token=0.0, per_ctx=0.0)  # every iteration takes 1 s, on both engines
ENGINES = ("reference", "compiled")


def _both(arrivals: list[float], prompts: list[int], outputs: list[int], **kwargs: object) -> RunRecords:
    """Run on both engines, check they agree to the last bit, return the reference records."""
    records = {}
    for engine in ENGINES:
        reqs = make_requests(arrivals, prompts, outputs)
        records[engine] = run(reqs, ONE_SECOND, engine=engine, **kwargs)  # type: ignore[arg-type]
        assert records[engine].engine == engine
    ref, fast = records["reference"], records["compiled"]
    assert request_frame(ref).equals(request_frame(fast))
    assert ref.iterations.to_frame().equals(fast.iterations.to_frame())
    return ref


# ---- 1. chunked admission under KV pressure ---------------------------------------------------------------------


@pytest.mark.parametrize("full_isl", [True, False])
def test_chunked_admission_needs_the_whole_prompt_to_fit(full_isl: bool) -> None:
    """vLLM ``vllm/v1/core/kv_cache_manager.py`` ``allocate_slots(full_sequence_must_fit=...)`` with
    ``SchedulerConfig.scheduler_reserve_full_isl=True`` (default since 0.19.0; 0.19.0 checked it in
    ``can_fit_full_sequence``): a waiting request is admitted only if all its tokens would fit the free blocks, though
    only its first chunk's blocks are allocated. Older V1 (<= 0.18.1) checked the first chunk only.

    Cache 30 blocks of 1 token; budget 8 tokens; 1 s per iteration. A (prompt 16, 10 outputs) and B (prompt 16, 2
    outputs) arrive at 0. A prefills in two chunks of 8 (t=0..2, first token at 2), then decodes one token per
    iteration, holding 15+k tokens in the iteration starting at t=k, until its 10th token at t=11.
    - whole prompt: from t=2 on, B needs 16 free blocks but at most 30-17=13 are free: B waits until A ends at 11,
      prefills 8+8 (first token at 13) and finishes at 14. No preemption.
    - first chunk: at t=2 B's chunk of 7 fits (13 free) and B is admitted; at t=3 A takes its block first and B's next
      7 do not fit (5 free): B, the last running request, is preempted (7 tokens dropped). B is admitted again at 4, 6
      and 8 and preempted at 5, 7 and 9 (at 9 A's own block does not fit: B is the victim): 4 preemptions, 28
      recomputed tokens. At 10, 5 blocks are free: its chunk of 7 waits. B then runs as above: first token at 13, done
      at 14. With equal iteration times the wasted work shows as preemptions, not latency; with a real cost model the
      iterations that carry B's discarded chunks are slower.
    """
    rec = _both(
        [0.0, 0.0],
        [16, 16],
        [10, 2],
        policy="chunked",
        max_num_batched_tokens=8,
        max_num_seqs=2,
        max_model_len=64,
        kv_blocks=30,
        block_size=1,
        scheduler_reserve_full_isl=full_isl,
    )
    f = request_frame(rec)
    assert list(f.finish_s) == [11.0, 14.0]
    assert f.first_token_s[1] == 13.0
    if full_isl:
        assert list(f.preemptions) == [0, 0] and f.first_scheduled_s[1] == 11.0
        assert f.recomputed_tokens.sum() == 0
    else:
        assert list(f.preemptions) == [0, 4] and f.first_scheduled_s[1] == 2.0
        assert f.recomputed_tokens[1] == 28


# ---- 2. defaults that follow vLLM's, per device ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hardware", "release", "seqs", "tokens"),
    [("h100-sxm", "0.33.0", 1024, 8192), ("h200", "0.33.0", 1024, 8192), ("b200", "0.33.0", 1024, 16384),
     ("mi300x", "0.33.0", 1024, 16384), ("a100-80g", "0.33.0", 256, 2048), ("l40s", "0.33.0", 256, 2048),
     ("b200", "0.27.0", 1024, 8192), ("a100-80g", "0.8.5", 1024, 8192), ("h100-sxm", "0.8.0", 1024, 8192),
     ("l40s", "0.8.0", 1024, 2048), ("l40s", "0.8.4", 256, 2048), ("h100-sxm", "0.7.3", 256, 2048)],
)  # fmt: skip
def test_chunked_limits_are_what_vllm_serve_picks_on_the_device(
    hardware: str, release: str, seqs: int, tokens: int
) -> None:
    """``vllm/engine/arg_utils.py`` (``get_batch_defaults`` in 0.33.0; ``_set_default_args`` before), usage context
    ``OPENAI_API_SERVER`` (``vllm serve``), read from each release's wheel. 0.33.0: a GPU of >= 160 GiB (B200,
    MI300X) gets 16384 tokens and 1024 sequences (since 0.28.0); >= 70 GiB and not an A100 (H100, H200) 8192 and
    1024; the rest (A100, L40S) 2048 and 256. 0.8.5 tested memory only, so an A100-80GB got 8192/1024; 0.8.0 tested
    the name ("h100"/"h200") and gave everyone 1024 sequences; V0 (0.7.3) used 2048 and 256 with chunked prefill."""
    config = RunConfig.model_validate(
        {"model": "llama-3-8b", "hardware": hardware, "policy": "chunked", "vllm_defaults": release}
    )
    replica = build_replica(config)
    assert replica.config.scheduler.max_num_seqs == seqs
    assert replica.config.scheduler.max_num_batched_tokens == tokens
    assert replica.vllm is not None and "max_num_seqs" in replica.vllm.applied


def test_given_limits_win_and_unchunked_budget_covers_max_model_len() -> None:
    """A flag given wins over the release's default; a default ``max_num_seqs`` is capped at the token budget
    (``max_num_seqs = min(max_num_seqs, max_num_batched_tokens)``, vLLM >= 0.11.1); without chunked prefill the
    budget is ``max(max_model_len, default)`` (0.33.0): 4096 on an A100 whose default is 2048."""
    base = {"model": "llama-3-8b", "hardware": "h100-sxm"}
    given = build_replica(RunConfig.model_validate(base | {"policy": "chunked", "max_num_batched_tokens": 512}))
    assert given.config.scheduler.max_num_batched_tokens == 512 and given.config.scheduler.max_num_seqs == 512
    assert given.vllm is not None and given.vllm.applied == (
        "max_num_seqs",
        "scheduler_reserve_full_isl",
        "kv_watermark",
        "enable_prefix_caching",  # on in V1 unless given
    )
    a100 = build_replica(
        RunConfig.model_validate(base | {"hardware": "a100-80g", "policy": "continuous", "max_model_len": 4096})
    )
    assert a100.config.scheduler.max_num_batched_tokens == 4096 and a100.config.scheduler.max_num_seqs == 256
    old = build_replica(RunConfig.model_validate(base | {"policy": "chunked", "vllm_defaults": "0.18.1"}))
    assert old.config.scheduler.scheduler_reserve_full_isl is False  # added in 0.19.0
    with pytest.raises(ValueError, match="0.6.6 or later|from 0.6.6 on"):
        RunConfig.model_validate(base | {"vllm_defaults": "0.5.0"})


def test_static_and_dynamic_limits_do_not_come_from_vllm() -> None:
    """vLLM has no static or dynamic batching: their limits stay ferry's own (max_batch_size)."""
    replica = build_replica(RunConfig.model_validate({"policy": "dynamic", "max_batch_size": 4}))
    assert replica.vllm is None and replica.config.scheduler.max_batch_size == 4


# ---- 3. what a client sees: delivery times -----------------------------------------------------------------------


def _static_135(stream: bool | None) -> RunRecords:
    return _both([0.0, 0.0, 0.0], [10, 10, 10], [1, 3, 5], policy="static", max_batch_size=3, max_model_len=64,
                 stream=stream)  # fmt: skip


def test_static_batch_responses_arrive_when_the_batch_ends() -> None:
    """The chapter's premise, and Triton's non-decoupled models: a static or dynamic batch returns every member's
    response when the batch ends. Client metrics as ``vllm/benchmarks/serve.py`` computes them from what the client
    receives: TTFT = first content received - sent, E2EL = last received - sent, TPOT = (E2EL - TTFT) / (output - 1).

    Three requests (outputs 1, 3, 5) in one batch, 1 s per iteration: tokens are made at t=1 (all first tokens),
    2, 3, 4, 5; request 0 is done at 1, request 1 at 3, request 2 at 5; the batch ends at 5.
    - Whole responses (the default): every client receives everything at 5: TTFT = E2EL = 5 s for all; TPOT 0 s for
      requests 1 and 2 (none for request 0, one token); no token gaps; goodput under ttft:2000 is 0.
    - Streamed (--stream): TTFT 1 s each; E2EL 1, 3, 5 s; TPOT (3-1)/2 = 1 s and (5-1)/4 = 1 s; 6 gaps of 1 s;
      goodput under ttft:2000 is 3 requests in 5 s.
    The server side is the same in both: server TTFT 1 s, server TPOT 1 s."""
    whole, streamed = _static_135(None), _static_135(True)
    assert whole.stream is False and streamed.stream is True
    fw, fs = request_frame(whole), request_frame(streamed)
    assert list(fw.ttft_s) == [5.0] * 3 and list(fw.e2el_s) == [5.0] * 3
    assert np.isnan(fw.tpot_s[0]) and list(fw.tpot_s[1:]) == [0.0, 0.0]
    assert list(fs.ttft_s) == [1.0] * 3 and list(fs.e2el_s) == [1.0, 3.0, 5.0] and list(fs.tpot_s[1:]) == [1.0, 1.0]
    for f in (fw, fs):
        assert list(f.server_ttft_s) == [1.0] * 3 and list(f.server_tpot_s[1:]) == [1.0, 1.0]
        assert list(f.released_s) == [5.0] * 3  # the seats are held until the batch ends either way
    slo = parse_goodput(["ttft:2000"])
    sw, ss = summarize(whole, slo), summarize(streamed, slo)
    assert sw["request_goodput"] == 0.0 and ss["request_goodput"] == pytest.approx(3 / 5)
    assert sw["mean_itl_ms"] is None and sw["mean_server_itl_ms"] == 1000.0
    assert ss["mean_itl_ms"] == 1000.0 and ss["p99_itl_ms"] == 1000.0
    assert sw["mean_ttft_ms"] == 5000.0 and sw["mean_server_ttft_ms"] == 1000.0


def test_tpot_goodput_counts_what_the_client_received() -> None:
    """vLLM's goodput (``vllm/benchmarks/serve.py``): a request is good when every SLO holds (value <= SLO); a
    one-token response has TPOT 0. Streamed [1, 3, 5] as above: TPOTs 0, 1000, 1000 ms: under tpot:500 one request
    is good (1/5 req/s). Whole responses: TPOTs 0, 0, 0: all three are good, but their TTFT is the whole 5 s, which
    a TTFT SLO catches; the server-side TPOT (1 s) never counts, since no client saw tokens paced at that rate."""
    slo = parse_goodput(["tpot:500"])
    assert summarize(_static_135(True), slo)["request_goodput"] == pytest.approx(1 / 5)
    assert summarize(_static_135(False), slo)["request_goodput"] == pytest.approx(3 / 5)
    both = parse_goodput(["tpot:500", "ttft:4000"])
    assert summarize(_static_135(False), both)["request_goodput"] == 0.0


def test_continuous_without_streaming_delivers_at_the_last_token() -> None:
    """``--no-stream`` for a policy that frees seats at once: the response arrives with its last token. One request
    (prompt 10, 3 tokens) alone: tokens made at 1, 2, 3; TTFT = E2EL = 3 s, TPOT 0; streamed: TTFT 1 s, TPOT 1 s."""
    whole = request_frame(_both([0.0], [10], [3], policy="continuous", max_model_len=64, stream=False))
    streamed = request_frame(_both([0.0], [10], [3], policy="continuous", max_model_len=64))
    assert (whole.ttft_s[0], whole.e2el_s[0], whole.tpot_s[0]) == (3.0, 3.0, 0.0)
    assert (streamed.ttft_s[0], streamed.e2el_s[0], streamed.tpot_s[0]) == (1.0, 3.0, 1.0)


# ---- 4. Triton's dynamic batcher ---------------------------------------------------------------------------------


def _dynamic(arrivals: list[float], **config: object) -> list[float]:
    """When each request's batch left (s): every request has prompt 10 and 2 outputs, so a batch takes 2 s."""
    n = len(arrivals)
    rec = _both(arrivals, [10] * n, [2] * n, policy="dynamic", max_model_len=64, **config)
    return list(request_frame(rec).first_scheduled_s)


def test_triton_burst_larger_than_max_batch_size() -> None:
    """``DynamicBatchScheduler::GetDynamicBatch`` (triton-inference-server/core ``src/dynamic_batch_scheduler.cc``,
    r25.09-r26.06), delay 0 (``max_queue_delay_microseconds`` default): ten requests at 0, max batch 4: batches of 4
    leave at 0, 2 (when the first ends) and the last 2 at 4. With preferred size 3 and a 10 s delay the largest
    preferred size leaves at once, not the max batch: 3 at 0, 3 at 2, 3 at 4; the last one waits for the delay
    (queued since 0, it leaves at 10)."""
    assert _dynamic([0.0] * 10, max_batch_size=4) == [0.0] * 4 + [2.0] * 4 + [4.0] * 2
    burst = _dynamic([0.0] * 10, max_batch_size=4, preferred_batch_sizes=(3,), max_delay_ms=10_000)
    assert burst == [0.0] * 3 + [2.0] * 3 + [4.0] * 3 + [10.0]


def test_triton_preferred_sizes_before_and_after_the_delay() -> None:
    """Same file. Before the oldest request's delay expires the largest preferred size the queue reaches leaves at
    once; after it, everything queued leaves (up to max batch), whatever the preferred sizes.
    Max batch 8, preferred 4, delay 1 s; arrivals 0, 0.1, ..., 0.5: at 0.3 four are queued and leave at once (batch
    ends 2.3); the two of 0.4 and 0.5 have waited 1.9 s at 2.3 (past the delay) and leave together though 2 is not a
    preferred size. Three arrivals 0, 0.1, 0.2 with no preferred size reached leave together at 1.0."""
    assert _dynamic([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], max_batch_size=8, preferred_batch_sizes=(4,),
                    max_delay_ms=1000) == [0.3] * 4 + [2.3] * 2  # fmt: skip
    assert _dynamic([0.0, 0.1, 0.2], max_batch_size=8, preferred_batch_sizes=(4,), max_delay_ms=1000) == [1.0] * 3


def test_triton_delay_zero_sends_at_once() -> None:
    """Same file: a delay of 0 never waits. Arrivals 0 and 0.5, max batch 8: the first leaves alone at 0; the second
    queues while that batch runs and leaves when it ends, at 2. With preferred sizes 4 and 8 and six queued, the
    largest preferred size reached (4) leaves, then the other 2 (no preferred size reached, delay 0: at once)."""
    assert _dynamic([0.0, 0.5], max_batch_size=8) == [0.0, 2.0]
    assert _dynamic([0.0] * 6, max_batch_size=8, preferred_batch_sizes=(4, 8)) == [0.0] * 4 + [2.0] * 2


def test_dynamic_delay_defaults_to_tritons_zero() -> None:
    assert SchedulerConfig(policy="dynamic").max_delay_ms == 0.0


# ---- 5. V1's order inside a chunked step -------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["vllm", "decodes-first"])
def test_chunked_step_order(order: str) -> None:
    """vLLM V1 ``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule`` (0.33.0): one pass over ``self.running``
    in order, decodes and unfinished prefills interleaved; when a request's blocks do not fit, ``self.running.pop()``
    (the last running request) is preempted, possibly the request itself. ``decodes-first`` is Sarathi-Serve's order.

    Cache 15 blocks of 1 token; budget 8; chunks capped at 4 (``long_prefill_token_threshold``); 1 s per iteration.
    X (prompt 12, 1 output) and Y (prompt 2, 6 outputs) arrive at 0; running order [X, Y].
    t=0: X takes 4, Y its whole prompt 2 (Y's first token at 1). t=1: X 4 more (8), Y decodes (3 tokens held).
    t=2: 4 blocks are free; X needs 4, Y 1:
    - vllm: X first gets its 4; Y's block does not fit and Y is the last running request: Y is preempted (3 tokens
      dropped). X's first (and only) token at 3. Y recomputes its 2+2 tokens at t=3 (token 3 at 4), then decodes:
      done at 7.
    - decodes-first: Y's decode first; X's chunk does not fit and X (the last not yet in this batch) is preempted (8
      tokens dropped). X must wait until its 12 tokens fit (Y holds 5-7 blocks): Y finishes at 6, and X, alone, is
      not capped (vLLM >= 0.31.0: a lone request has nobody to starve): it prefills 8+4 from 6 and is done at 8."""
    rec = _both(
        [0.0, 0.0],
        [12, 2],
        [1, 6],
        policy="chunked",
        max_num_batched_tokens=8,
        max_num_seqs=4,
        long_prefill_token_threshold=4,
        max_model_len=64,
        kv_blocks=15,
        block_size=1,
        chunked_order=order,
    )
    f = request_frame(rec)
    if order == "vllm":
        assert list(f.finish_s) == [3.0, 7.0]
        assert list(f.preemptions) == [0, 1] and list(f.recomputed_tokens) == [0, 3]
    else:
        assert list(f.finish_s) == [8.0, 6.0]
        assert list(f.preemptions) == [1, 0] and list(f.recomputed_tokens) == [8, 0]


# ---- 6. smaller ones ---------------------------------------------------------------------------------------------


def test_watermark_is_the_modelled_engines() -> None:
    """vLLM V0 ``vllm/core/block_manager.py`` (``SelfAttnBlockSpaceManager(watermark=0.01)``, through 0.10.x):
    ferry's continuous policy without mixing models V0, so it keeps 1% of the blocks free when admitting; V1 had no
    watermark until 0.24.0 added ``--watermark`` (default 0). With 100 blocks of 1 token and A (prompt 50) running,
    B with prompt 49 fits 50 free - 1 kept = 49 and joins at once; with prompt 50 it waits for A to finish."""
    for policy, mix, expected in (("continuous", False, 0.01), ("continuous", True, 0.0), ("chunked", False, 0.0)):
        config = RunConfig.model_validate({"policy": policy, "mix_prefill_decode": mix})
        assert build_replica(config).config.kv_watermark == expected, policy
    v0 = RunConfig.model_validate({"policy": "chunked", "vllm_defaults": "0.6.6"})
    assert build_replica(v0).config.kv_watermark == 0.01
    for prompt_b, joins_at in ((49, 1.0), (50, 3.0)):
        rec = _both([0.0, 0.5], [50, prompt_b], [3, 1], policy="continuous", max_model_len=128, kv_blocks=100,
                    block_size=1, watermark=0.01)  # fmt: skip
        assert request_frame(rec).first_scheduled_s[1] == joins_at


def test_start_up_errors_as_vllm_refuses_to_start() -> None:
    """``vllm/config/scheduler.py`` ``SchedulerConfig.verify_max_model_len``: max_num_batched_tokens below
    max_num_seqs is refused; ``vllm/v1/core/kv_cache_utils.py`` ``check_enough_kv_cache_memory``: a max_model_len
    whose KV cannot fit the cache is refused (here 8192 tokens against 100 blocks of 16)."""
    with pytest.raises(ValueError, match="must be greater than or equal to max_num_seqs=64"):
        SchedulerConfig(policy="chunked", max_num_batched_tokens=32, max_num_seqs=64)
    with pytest.raises(ValueError, match="max_model_len=8192: one request that long needs 512 KV blocks"):
        build_replica(RunConfig.model_validate({"num_gpu_blocks_override": 100}))
    with pytest.raises(ValueError, match="must be greater than or equal to max_num_seqs"):
        build_replica(RunConfig.model_validate({"policy": "chunked", "max_num_seqs": 4096, "hardware": "a100-80g"}))


def test_duration_runs_from_the_benchmark_start() -> None:
    """``vllm/benchmarks/serve.py``: ``benchmark_start_time`` is taken before the first request is sent, which (with
    a finite rate) waits one inter-arrival gap itself. One request arriving at 5 s (prompt 10, 2 tokens, 1 s per
    iteration) ends at 7: the duration is 7 s, of which 5 idle before it arrived."""
    s = summarize(_both([5.0], [10], [2], policy="continuous", max_model_len=64))
    assert s["duration"] == 7.0 and s["gpu_idle_s"] == 5.0 and s["request_throughput"] == pytest.approx(1 / 7)


# ---- 7. seat utilisation as a teacher means it -------------------------------------------------------------------


def test_seat_utilization_is_occupied_over_offered_seats() -> None:
    """Occupied seats / seats the policy offers (max batch size, max_num_seqs), averaged over busy time, with seats
    held by finished requests counted apart. One passenger alone in an 8-seat static batch: 1/8, whatever the batch
    length. Outputs 1, 3, 5 in a 3-seat batch over 5 one-second iterations: active seats 3, 2, 2, 1, 1 (9 of 15
    seat-seconds), held 0, 1, 1, 2, 2 (6 of 15)."""
    alone = summarize(_both([0.0], [10], [4], policy="static", max_batch_size=8, max_model_len=64))
    assert alone["seats_offered"] == 8 and alone["seat_utilization"] == 1 / 8 and alone["held_seat_fraction"] == 0.0
    s = summarize(_static_135(None))
    assert s["seat_utilization"] == pytest.approx(9 / 15) and s["held_seat_fraction"] == pytest.approx(6 / 15)


def test_run_summary_reports_the_resolved_semantics() -> None:
    """``summary.json`` carries what the run followed: the vLLM release and tier of its limits, the delivery."""
    result = run_simulation(RunConfig.model_validate({"policy": "chunked", "num_prompts": 20, "request_rate": 50}))
    s = result.summary
    assert s["vllm_defaults"]["release"] == "0.33.0" and s["stream"] is True
    assert s["config"]["scheduler"]["max_num_seqs"] == 1024 and s["config"]["kv_watermark"] == 0.0
    d = engine_defaults("0.33.0", "chunked", 80, "h100-sxm", 8192)
    assert dataclasses.astuple(d)[3:5] == (8192, 1024)


# ---- vLLM rules found by running its scheduler (tests/test_vllm_conformance.py) ---------------------------------


@pytest.mark.parametrize("cap_alone", [False, True])
def test_a_lone_request_is_not_cut_to_the_threshold(cap_alone: bool) -> None:
    """vLLM ``vllm/v1/core/sched/scheduler.py`` (0.31.0 on): ``long_prefill_token_threshold`` applies only while more
    than one request is running or waiting; before 0.31.0 (``cap_lone_prefill``) it cut every chunk.

    Budget 8, threshold 2, 1 s per iteration. A (prompt 8, 1 output) arrives alone at 0, B (prompt 4, 1 output) at 5.
    - 0.31+: A prefills its 8 at once (first token at 1); B, alone at 5, its 4 (done at 6).
    - before: A takes 2 a step (done at 4); B 2+2 (done at 7)."""
    rec = _both([0.0, 5.0], [8, 4], [1, 1], policy="chunked", max_num_batched_tokens=8, max_num_seqs=4,
                long_prefill_token_threshold=2, max_model_len=64, cap_lone_prefill=cap_alone)  # fmt: skip
    f = request_frame(rec)
    assert list(f.finish_s) == ([4.0, 7.0] if cap_alone else [1.0, 6.0])


def test_the_adaptive_threshold_is_floored_at_a_fair_share_of_the_budget() -> None:
    """vLLM 0.31.0's ``long_prefill_token_threshold_adaptive``: the cap is at least ``max_num_batched_tokens //
    (running + waiting)``. Budget 12, threshold 2: A and B (prompts 12, 1 output) at 0 take 6 each (12 // 2), so both
    finish at 2; without the floor, 2 each a step (done at 6)."""
    common = dict(policy="chunked", max_num_batched_tokens=12, max_num_seqs=4, long_prefill_token_threshold=2,
                  max_model_len=64)  # fmt: skip
    adaptive = request_frame(_both([0.0, 0.0], [12, 12], [1, 1], long_prefill_token_threshold_adaptive=True, **common))
    plain = request_frame(_both([0.0, 0.0], [12, 12], [1, 1], **common))
    assert list(adaptive.finish_s) == [2.0, 2.0] and list(plain.finish_s) == [6.0, 6.0]


def test_the_adaptive_threshold_needs_a_threshold_and_vllm_0_31() -> None:
    with pytest.raises(ValueError, match="long_prefill_token_threshold_adaptive=true floors"):
        SchedulerConfig(policy="chunked", long_prefill_token_threshold_adaptive=True)
    config = RunConfig.model_validate(
        {
            "policy": "chunked",
            "long_prefill_token_threshold": 64,
            "num_prompts": 2,
            "long_prefill_token_threshold_adaptive": True,
            "vllm_defaults": "0.30.0",
        }  # fmt: skip
    )
    with pytest.raises(ValueError, match="vLLM has it from 0.31.0"):
        build_replica(config)
    assert not build_replica(config.model_copy(update={"vllm_defaults": "0.31.0"})).config.scheduler.cap_lone_prefill
    older = config.model_copy(update={"vllm_defaults": "0.30.0", "scheduler": config.scheduler.model_copy(
        update={"long_prefill_token_threshold_adaptive": False})})  # fmt: skip
    assert build_replica(older).config.scheduler.cap_lone_prefill  # 0.30: the threshold cuts a lone request too


def test_the_null_block_is_not_given_to_requests() -> None:
    """vLLM's ``BlockPool`` keeps one of ``num_gpu_blocks`` as its null block (``vllm/v1/core/block_pool.py``): a cache
    of N blocks holds N - 1 blocks of requests. With ``num_gpu_blocks_override=4`` and blocks of 16 tokens, a request of
    64 tokens is refused (it would need all 4) and one of 48 runs."""
    base = {"policy": "chunked", "num_gpu_blocks_override": 4, "block_size": 16, "max_model_len": 64, "num_prompts": 1,
            "output_len": 1, "record_batches": False}  # fmt: skip
    refused = run_simulation(RunConfig.model_validate(base | {"input_len": 63}))
    runs = run_simulation(RunConfig.model_validate(base | {"input_len": 47}))
    assert refused.summary["completed"] == 0 and refused.summary["rejected_by_reason"] == {"exceeds_kv_cache": 1}
    assert runs.summary["completed"] == 1
    assert runs.memory.usable_blocks == 3 and runs.memory.max_tokens == 64  # vLLM reports the pool's size
