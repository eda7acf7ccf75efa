"""KV-cache capacity: the memory plan against a hand computation, TP and dtype effects, and models that do not fit."""

from __future__ import annotations

import dataclasses

import pytest

from costmodel import CostModel, MemoryPlan, load_hardware, load_model
from costmodel.roofline import RUNTIME_RESERVE_BYTES

GiB = 2**30


def plan(model: str = "llama-3-8b", hardware: str = "h100-sxm", tp: int = 1, **kw: str) -> MemoryPlan:
    return CostModel(load_model(model), load_hardware(hardware), tp=tp, **kw).memory_plan()


def test_memory_plan_matches_a_hand_computation() -> None:
    p = plan()
    # Llama-3-8B in bf16 on an 80 GiB H100 at gpu_memory_utilization 0.9, blocks of 16 tokens
    memory = 80 * GiB
    usable = int(memory * 0.9)
    weights = 8_030_261_248 * 2  # every parameter in bf16
    # 2048 batched tokens x (2 H + q + 2 kv + gate/up 2 I + act I) bf16 elements, 256 fp32 logit rows, runtime reserve
    activations = 2048 * (2 * 4096 + 4096 + 2 * 1024 + 3 * 14336) * 2 + 256 * 128256 * 4 + RUNTIME_RESERVE_BYTES
    kv_per_token = 2 * 32 * 8 * 128 * 2  # 128 KiB
    kv_cache = usable - weights - activations
    assert p.gpu_memory_bytes == memory
    assert p.usable_bytes == usable
    assert p.weight_bytes_per_gpu == weights
    assert p.activation_reserve_bytes == activations
    assert p.kv_bytes_per_token == kv_per_token
    assert p.kv_cache_bytes == kv_cache
    assert p.num_gpu_blocks == kv_cache // (16 * kv_per_token)
    assert p.max_tokens == p.num_gpu_blocks * 16
    assert 400_000 < p.max_tokens < 500_000  # vLLM reports ~0.45M tokens of KV cache for this setup
    assert "blocks of 16 tokens" in p.describe()


def test_block_size_and_utilization_are_honoured() -> None:
    cm = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm"))
    small, big = cm.memory_plan(0.9, 16), cm.memory_plan(0.9, 32)
    assert big.num_gpu_blocks == small.kv_cache_bytes // (32 * small.kv_bytes_per_token)
    assert cm.memory_plan(0.5).max_tokens < small.max_tokens
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        cm.memory_plan(1.2)
    with pytest.raises(ValueError, match="block_size"):
        cm.memory_plan(0.9, 0)


def test_tp2_halves_per_gpu_weights_and_kv() -> None:
    one, two = plan(tp=1), plan(tp=2)
    assert two.weight_bytes_per_gpu == pytest.approx(one.weight_bytes_per_gpu / 2, rel=1e-3)
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.max_tokens > 2 * one.max_tokens  # the weights' share freed on each GPU also holds KV


def test_fp8_kv_cache_doubles_the_tokens_that_fit() -> None:
    bf16, fp8 = plan(), plan(kv_cache_dtype="fp8")
    assert fp8.kv_cache_bytes == bf16.kv_cache_bytes
    assert fp8.num_gpu_blocks == pytest.approx(2 * bf16.num_gpu_blocks, abs=1)


def test_quantized_weights_leave_more_room() -> None:
    freed = plan(quantization="int4").kv_cache_bytes - plan().kv_cache_bytes
    assert freed == pytest.approx(load_model("llama-3-8b").quantizable_params() * (2 - 0.5), abs=1)  # ~9.75 GiB


def test_a_model_that_does_not_fit_says_the_sizes() -> None:
    with pytest.raises(ValueError) as info:
        plan("llama-3-70b", "a100-40g")
    msg = str(info.value)
    assert "llama-3-70b does not fit on a100-40g at tp=1" in msg
    assert "131.4 GiB" in msg  # its bf16 weights
    assert "40.0 GiB" in msg and "36.0 GiB" in msg  # the device and what 0.9 of it leaves
    assert "tensor parallelism" in msg
    assert plan("llama-3-70b", "a100-40g", tp=8).num_gpu_blocks > 0  # spread over 8 GPUs it fits


def test_the_plan_is_a_value_the_engine_can_override() -> None:
    p = plan()
    q = dataclasses.replace(p, num_gpu_blocks=10)
    assert q.max_tokens == 160 and p.max_tokens > 160
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.num_gpu_blocks = 1  # type: ignore[misc]
