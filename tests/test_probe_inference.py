"""How `ferry probe` turns what a client sees into iterations, on streams made by hand (no server, no clock): a
server whose every iteration's time is known, seen from the client's side, must give back those iterations."""

from __future__ import annotations

import json

import numpy as np
import pytest

from experiments.real.client import Prompts, Stream
from experiments.real.probe_design import KINDS, ProbePlan, design
from experiments.real.probe_rows import WINDOW, decode_rows, mixed_rows, ttft_row


def stream(sent: float, chunks: list[float], prompt: int, usage: bool = True) -> Stream:
    s = Stream(sent, prompt, len(chunks), list(chunks))
    if usage:
        s.prompt_tokens, s.completion_tokens = prompt, len(chunks)
    return s


def step_time(batch: int, context: float) -> float:
    return 0.010 + 0.001 * batch + 1e-6 * batch * context  # the hand-made server's decode step (s)


def test_a_batch_decoding_together_gives_its_steps() -> None:
    prompt, tokens, batch = 100, 40, 4
    t, times = 0.5, []
    for k in range(tokens):  # every request decodes in every iteration: all chunks arrive together
        times.append(t)
        t += step_time(batch, prompt + k)
    streams = [stream(0.0, times, prompt) for _ in range(batch)]
    rows = decode_rows(streams)
    assert len(rows) == (tokens - 2) // WINDOW  # steady from each one's first decode to the first finish
    for row in rows:
        mean_ctx = row["decode_context_tokens"] / batch
        assert row["num_decode_seqs"] == batch
        assert row["duration_s"] == pytest.approx(step_time(batch, mean_ctx), rel=0.01)
        assert json.loads(row["prefill_chunks"]) == []


def test_streams_that_do_not_overlap_or_coalesce_give_no_rows() -> None:
    a = stream(0.0, [0.1 + 0.01 * k for k in range(20)], 50)
    b = stream(0.0, [1.0 + 0.01 * k for k in range(20)], 50)  # starts after a has finished
    assert decode_rows([a, b]) == []
    c = stream(0.0, [0.1 + 0.01 * k for k in range(20)], 50)
    c.completion_tokens = 25  # the server packed tokens into chunks: gaps are not steps
    assert decode_rows([c]) == []
    failed = stream(0.0, [], 50)
    failed.error = "HTTP 500: boom"
    assert decode_rows([a, failed]) == [] and ttft_row([failed]) is None


def test_a_prompt_into_running_decodes_gives_the_mixed_iteration() -> None:
    batch, prompt, inject = 3, 64, 200
    mixed = 0.080  # the iteration with the injected prompt and the decodes
    times, t = [], 0.2
    for k in range(30):
        times.append(t)
        t += mixed if k == 12 else step_time(batch, prompt + k)
    background = [stream(0.0, times, prompt) for _ in range(batch)]
    injected = stream(times[11] + 0.001, [times[13]], inject)  # sent during step 11, first token at the end of 12
    (row,) = mixed_rows(background, injected)
    assert row["duration_s"] == pytest.approx(mixed)
    assert json.loads(row["prefill_chunks"]) == [[inject, 0]] and row["prefill_sampled"] == 1
    assert row["num_decode_seqs"] == batch
    assert row["decode_context_tokens"] == pytest.approx(batch * (prompt + 12))


def test_a_chunked_prompt_is_shared_by_its_enlarged_gaps() -> None:
    batch, prompt, inject = 2, 64, 301
    times, t = [], 0.2
    for k in range(30):
        times.append(t)
        t += 0.06 if k in (12, 13) else step_time(batch, prompt + k)
    background = [stream(0.0, times, prompt) for _ in range(batch)]
    injected = stream(times[12] - 0.001, [times[14]], inject)
    rows = mixed_rows(background, injected)
    assert [json.loads(r["prefill_chunks"]) for r in rows] == [[[151, 0]], [[150, 151]]]
    assert [r["prefill_sampled"] for r in rows] == [0, 1]


def test_with_the_budget_known_the_prompts_iterations_are_the_last_enlarged_gaps_in_vllms_chunks() -> None:
    """A server taking a request in slows the step during which it arrives (its front end shares the machine):
    that enlarged gap is no prefill. With the budget known, the prompt's iterations are the last ones before its first
    token, in chunks of the budget less the running decodes (vLLM V1 schedules the decodes first)."""
    batch, prompt, inject, budget = 2, 64, 301, 256
    times, t = [], 0.2
    for k in range(30):
        times.append(t)
        t += {11: 0.03, 12: 0.07, 13: 0.05}.get(k, step_time(batch, prompt + k))  # 11: the request taken in
    background = [stream(0.0, times, prompt) for _ in range(batch)]
    injected = stream(times[11] - 0.001, [times[14]], inject)
    rows = mixed_rows(background, injected, budget)
    assert [json.loads(r["prefill_chunks"]) for r in rows] == [[[254, 0]], [[47, 254]]]
    assert [r["duration_s"] for r in rows] == pytest.approx([0.07, 0.05])
    assert [r["prefill_sampled"] for r in rows] == [0, 1]
    # a prompt that fits one iteration: only the gap that ends with its first token
    one = stream(times[11] - 0.001, [times[14]], 200)
    (row,) = mixed_rows(background, one, budget)
    assert json.loads(row["prefill_chunks"]) == [[200, 0]] and row["duration_s"] == pytest.approx(0.05)
    # more iterations than enlarged gaps seen: nothing is guessed
    assert mixed_rows(background, stream(times[11] - 0.001, [times[14]], 900), budget) == []


def test_ttft_is_the_median_of_the_repeats_and_counts_the_servers_tokens() -> None:
    repeats = [stream(1.0, [1.05], 128), stream(2.0, [2.04], 128), stream(3.0, [3.30], 128)]
    repeats[0].prompt_tokens = repeats[1].prompt_tokens = repeats[2].prompt_tokens = 129  # e.g. a BOS added
    row = ttft_row(repeats)
    assert row is not None and row["duration_s"] == pytest.approx(0.05) and row["client_requests"] == 1.0
    assert json.loads(row["prefill_chunks"]) == [[129, 0]]


def test_the_design_alternates_held_out_experiments_and_respects_the_limits() -> None:
    plan = ProbePlan(max_prompt=4096, max_concurrency=16)
    experiments = design(plan, max_model_len=2048)
    for kind in KINDS:
        mine = sorted((e for e in experiments if e.kind == kind), key=lambda e: e.size)
        assert len(mine) >= 2 and [e.held_out for e in mine][:2] == [False, True], kind
    assert max(e.prompt + e.max_tokens for e in experiments) <= 2048  # fits the server's max_model_len
    assert max(e.requests + (e.kind == "mixed") for e in experiments) <= 16  # at most max_concurrency at once
    with pytest.raises(ValueError, match="decode_tokens must be >= 16"):
        design(ProbePlan(decode_tokens=4), None)


def test_prompts_are_unique_and_exact() -> None:
    prompts = Prompts(np.random.default_rng(0))
    a, b = prompts.make(300), prompts.make(300)
    assert isinstance(a, list) and len(a) == 300 and a[:16] != b[:16]  # no shared prefix to cache
    assert all(100 <= x < 8000 for x in a)
    words = Prompts(np.random.default_rng(0), text=True).make(50)
    assert isinstance(words, str) and len(words.split()) == 50


def test_prompts_timed_as_one_iteration_fit_the_servers_token_budget() -> None:
    """With a 512-token budget, a TTFT prompt of 1,919 tokens would be chunked into four iterations and timed as one:
    the TTFT prompts, and a mixed experiment's prompt with one token of each running decode, fit the budget; decode
    and batch contexts are prefilled before they are timed, so they keep their sizes."""
    plan = ProbePlan(max_prompt=2048, max_concurrency=64)
    free = design(plan, max_model_len=2048)
    assert max(e.prompt for e in free if e.kind == "ttft") == 2048 - plan.decode_tokens - 1
    capped = design(plan, max_model_len=2048, max_num_batched_tokens=512)
    assert max(e.prompt for e in capped if e.kind == "ttft") == 512
    assert max(e.inject + e.requests for e in capped if e.kind == "mixed") <= 512
    assert [e.prompt for e in capped if e.kind == "decode"] == [e.prompt for e in free if e.kind == "decode"]
    own = design(ProbePlan(max_prompt=2048, max_num_batched_tokens=256), 2048, max_num_batched_tokens=512)
    assert max(e.prompt for e in own if e.kind == "ttft") == 256  # the flag's budget over the server's
    with pytest.raises(ValueError, match="--max-num-batched-tokens must be >= 16"):
        design(ProbePlan(max_num_batched_tokens=8), None)
    with pytest.raises(ValueError, match="--timeout must be a number of seconds > 0, got nan"):
        design(ProbePlan(timeout_s=float("nan")), None)
