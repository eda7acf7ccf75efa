"""The kernels, the real model and the real-time executor (needs torch; skipped without it): each kernel against a
plain reference, the model's chunked and batched iterations against one whole prompt, and the executor serving
ferry's policies (arrivals respected, preemption recomputes the same tokens)."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import policies  # noqa: E402
from costmodel.calibration import kernels as K  # noqa: E402
from experiments.real.executor import Executor, replay  # noqa: E402
from experiments.real.llama import Llama  # noqa: E402
from sim.kvcache import KVCacheManager  # noqa: E402
from sim.request import RequestTable, Status  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: int) -> torch.Tensor:
    """Plain softmax attention of n queries at positions ctx..ctx+n-1 over keys 0..ctx+n-1 (causal), with GQA:
    q [n, Hq, d], k and v [ctx + n, Hkv, d]."""
    n, hq, d = q.shape
    group = hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
    allowed = torch.arange(k.shape[0])[None, :] <= (ctx + torch.arange(n))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def test_prefill_attention_on_cached_context_is_causal_attention() -> None:
    g = torch.Generator().manual_seed(0)
    hq, hkv, d, ctx, n = 8, 2, 16, 7, 5
    keys = torch.randn(ctx + n, hkv, d, generator=g)
    values = torch.randn(ctx + n, hkv, d, generator=g)
    q = torch.randn(n, hq, d, generator=g)
    kc, vc = K.kv_cache(3, hkv, 32, d, CPU, torch.float32)
    kc[1, :, :ctx] = keys[:ctx].transpose(0, 1)  # the cached part, in slot 1
    vc[1, :, :ctx] = values[:ctx].transpose(0, 1)
    out = K.prefill_attention(q, keys[ctx:], values[ctx:], kc, vc, slot=1, ctx=ctx)
    torch.testing.assert_close(out, reference_attention(q, keys, values, ctx))
    # the chunk's K and V were written into the slot
    torch.testing.assert_close(kc[1, :, ctx : ctx + n], keys[ctx:].transpose(0, 1))
    # a whole prompt (no context) too
    out0 = K.prefill_attention(q, keys[:n], values[:n], kc, vc, slot=0, ctx=0)
    torch.testing.assert_close(out0, reference_attention(q, keys[:n], values[:n], 0))


def test_decode_attention_sees_each_sequence_own_cache_only() -> None:
    g = torch.Generator().manual_seed(1)
    hq, hkv, d = 4, 2, 8
    lengths = [3, 9, 1]  # cached tokens per sequence
    slots = [2, 0, 1]
    kc, vc = K.kv_cache(3, hkv, 16, d, CPU, torch.float32)
    kc.normal_(generator=g)  # junk past each sequence's end must be masked out
    vc.normal_(generator=g)
    q = torch.randn(3, hq, d, generator=g)
    k_new = torch.randn(3, hkv, d, generator=g)
    v_new = torch.randn(3, hkv, d, generator=g)
    expected = []
    for i, (slot, length) in enumerate(zip(slots, lengths, strict=True)):
        keys = torch.cat([kc[slot, :, :length].transpose(0, 1), k_new[i : i + 1]])
        values = torch.cat([vc[slot, :, :length].transpose(0, 1), v_new[i : i + 1]])
        expected.append(reference_attention(q[i : i + 1], keys, values, length)[0])
    out = K.decode_attention(
        q, k_new, v_new, kc, vc, torch.tensor(slots), torch.tensor(lengths), max_position=max(lengths)
    )
    torch.testing.assert_close(out, torch.stack(expected))


def test_rope_rotates_pairs_by_position() -> None:
    rot = K.rope_tables(64, 16, 10000.0, CPU)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 3, 16, generator=g)
    # position 0 is the identity; every rotation keeps each pair's length
    torch.testing.assert_close(K.rope(x, rot[:1]), x)
    y = K.rope(x, rot[5:6])
    torch.testing.assert_close(y.view(1, 3, 8, 2).norm(dim=-1), x.view(1, 3, 8, 2).norm(dim=-1))
    # a query at m and a key at n score by m - n alone
    q, k = torch.randn(1, 1, 16, generator=g), torch.randn(1, 1, 16, generator=g)
    s1 = (K.rope(q, rot[10:11]) * K.rope(k, rot[7:8])).sum()
    s2 = (K.rope(q, rot[33:34]) * K.rope(k, rot[30:31])).sum()
    torch.testing.assert_close(s1, s2)
    # 16-bit formats take the real-arithmetic path to the same rotation
    torch.testing.assert_close(K.rope(x.bfloat16(), rot[5:6]).float(), y, atol=3e-2, rtol=3e-2)


def test_norm_and_activation() -> None:
    x, r, w = torch.randn(4, 8), torch.randn(4, 8), torch.rand(8)
    normed, residual = K.add_rms_norm(x, r, w, 1e-5)
    torch.testing.assert_close(residual, x + r)
    torch.testing.assert_close(normed, (x + r) * torch.rsqrt((x + r).pow(2).mean(-1, keepdim=True) + 1e-5) * w)
    gu = torch.randn(3, 10)
    torch.testing.assert_close(K.silu_mul(gu), torch.nn.functional.silu(gu[:, :5]) * gu[:, 5:])


@pytest.fixture(scope="module")
def model() -> Llama:
    torch.set_num_threads(1)
    return Llama.build("tiny-llama", "cpu", "float32", max_len=128, layers=2)


def test_chunks_and_batched_decodes_equal_one_whole_prompt(model: Llama) -> None:
    model.reserve_slots(4)
    toks = torch.randint(0, model.spec.vocab_size, (50,), generator=torch.Generator().manual_seed(3)).tolist()
    whole = model.forward(model.step([], [(0, 0, toks[:41])], [True]), logits=True)
    model.forward(model.step([], [(1, 0, toks[:16])], [False]))
    model.forward(model.step([], [(1, 16, toks[16:40])], [False]))
    # slot 2 prefills 30 tokens in the same iteration as slot 1's decode
    model.forward(model.step([], [(2, 0, toks[:30])], [True]))
    out = model.forward(model.step([(1, 40, toks[40]), (2, 30, toks[30])], [], [True, True]), logits=True)
    whole31 = model.forward(model.step([], [(3, 0, toks[:31])], [True]), logits=True)
    torch.testing.assert_close(out[0], whole[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out[1], whole31[0], atol=1e-4, rtol=1e-4)


def _serve(
    model: Llama, kv_blocks: int, arrivals: list[float], prompts: list[int], outputs: list[int], full_isl: bool = True
) -> tuple:
    requests = RequestTable(np.array(arrivals), np.array(prompts), np.array(outputs))
    config = policies.SchedulerConfig(
        policy="chunked",
        max_num_seqs=4,
        max_num_batched_tokens=32,
        max_model_len=120,
        scheduler_reserve_full_isl=full_isl,
    )
    executor = Executor(model, requests, np.random.default_rng(7), slots=2)
    run = replay(requests, policies.get(config), executor, KVCacheManager(kv_blocks, 4, len(requests)), 120)
    return run, executor


def test_the_executor_serves_every_request_in_real_time(model: Llama) -> None:
    arrivals = [0.0, 0.0, 0.05, 0.3]
    run, executor = _serve(model, 1000, arrivals, [20, 45, 8, 30], [6, 3, 5, 4])
    reqs = run.records.requests
    assert (reqs.status == Status.FINISHED).all()
    assert (reqs.first_scheduled >= reqs.arrival).all()  # nobody is served before they arrive
    assert (reqs.first_token > reqs.first_scheduled).all()
    assert [len(t) for t in executor.tokens] == [26, 48, 13, 34]  # prompt + every sampled token
    it = run.records.iterations.to_frame()
    assert (it["end"] > it["start"]).all() and (it["start"].iloc[1:].to_numpy() >= it["end"].iloc[:-1].to_numpy()).all()
    assert len(run.shapes) == len(it)
    assert not executor.slot_of  # every slot given back


def test_preemption_recomputes_the_same_tokens(model: Llama) -> None:
    """Greedy sampling is deterministic: a request preempted by recompute (its KV dropped, its prompt and
    generated tokens computed again) produces the tokens it would have without preemption."""
    args = ([0.0, 0.0, 0.0], [40, 40, 40], [12, 12, 12])
    roomy, roomy_exec = _serve(model, 1000, *args)
    # 30 blocks of 4 tokens: not enough for three at once; admitting on the first chunk alone lets all three in
    tight, tight_exec = _serve(model, 30, *args, full_isl=False)
    assert tight.records.requests.preemptions.sum() > 0
    assert roomy.records.requests.preemptions.sum() == 0
    assert tight_exec.tokens == roomy_exec.tokens
