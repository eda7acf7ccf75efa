"""The default (full) calibration grid runs to its end on a Llama-shaped model other than tiny-llama (needs torch).

`ferry calibrate --grid smoke` times every series of the full grid (each token-parallel kernel, prefill attention at
each of its contexts, decode attention at each of its contexts, the executor's serving runs) at a few small sizes,
briefly, with the input pool shrunk with the sizes so that input sets fill it, wrap around and outgrow it as they do
at full size. What must hold: the whole command runs (a crash anywhere in the full grid's structure shows here), every
series is measured, and no two inputs of one kernel call share memory (attention writes the new keys and values into
its KV cache input, and torch refuses, or silently mis-computes, a write into another input of the same call).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from costmodel import load_hardware  # noqa: E402
from costmodel.calibration import grids, harness  # noqa: E402
from costmodel.calibration.timing import Pool  # noqa: E402
from costmodel.hardware import OP_CLASSES  # noqa: E402
from costmodel.model_spec import load_model  # noqa: E402
from experiments.cli import main  # noqa: E402

# a second Llama shape, unlike tiny-llama's (hidden 512, 4 layers, GQA 8/2): the one the full grid crashed on
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 768,
    "vocab_size": 8192,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "torch_dtype": "float32",
}


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps(CONFIG))
    return path


def test_the_smoke_grid_has_every_series_of_the_full_grid() -> None:
    smoke, full = grids.SMOKE, grids.FULL
    assert smoke.prefill_contexts == full.prefill_contexts and smoke.decode_contexts == full.decode_contexts
    for sizes, of in (
        (smoke.tokens, full.tokens),
        (smoke.prefill_chunks, full.prefill_chunks),
        (smoke.decode_batches, full.decode_batches),
    ):
        assert len(sizes) >= 2 and set(sizes) <= set(of) and min(sizes) == min(of)
    assert smoke.passes == full.passes and smoke.budget_s < full.budget_s
    assert grids.GRIDS["smoke"] is smoke and grids.GRIDS["full"] is full


def _span(t: torch.Tensor) -> tuple[int, int, int]:
    """(storage address, first element, one past the last element) a tensor reaches, from its offset and strides."""
    reach = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    return t.untyped_storage().data_ptr(), t.storage_offset(), t.storage_offset() + reach


@pytest.mark.parametrize("cache_mib", [1, 8, 32])
def test_no_two_inputs_of_a_kernel_call_share_memory(config: Path, cache_mib: int) -> None:
    """Every input set of every point of the smoke grid, made as `measure_model` makes them (same order, passes and
    pool), for several last-level cache sizes (they set how many sets rotate, so where each set falls)."""
    grid = grids.SMOKE
    pool = Pool(torch.device("cpu"), torch.float32, cache_mib << 20, seed=0, size_bytes=grid.pool_bytes)
    series = harness.grid_series(load_model(str(config)), grid, pool.item)
    for _ in range(grid.passes):
        for points in series:
            for point in points:
                for inputs in pool.sets(point.make, point.set_bytes):
                    spans = [_span(t) for t in inputs if isinstance(t, torch.Tensor)]
                    for i, (ptr, lo, hi) in enumerate(spans):
                        for other, first, end in spans[:i]:
                            assert ptr != other or hi <= first or end <= lo, (point.op, point.num_tokens, point.context)


def test_the_full_grid_runs_on_a_second_model(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "cpu.smoke.yaml"
    args = ["calibrate", "--device", "cpu", "--threads", "1", "--dtype", "float32", "--model", str(config)]
    assert main([*args, "--grid", "smoke", "--out", str(out)]) == 0
    raw = pd.read_csv(out.with_name("cpu.smoke.raw.csv"))
    kernels = raw[raw["op_class"].isin(OP_CLASSES)]
    for op in harness.TOKEN_KERNELS:
        sizes = [n for n in grids.SMOKE.tokens if op != "lm_head" or n <= harness.MAX_SAMPLED]
        assert sorted(kernels.loc[kernels["op"] == op, "num_tokens"]) == sizes, op
    prefill = kernels[kernels["op"] == "attention_prefill"]
    decode = kernels[kernels["op"] == "attention_decode"]
    assert set(prefill["context"]) == set(grids.FULL.prefill_contexts)
    assert set(decode["context"]) == set(grids.FULL.decode_contexts)
    assert set(kernels["op"]) == {*harness.TOKEN_KERNELS, "attention_prefill", "attention_decode"}
    assert (kernels["repeats"] >= grids.SMOKE.min_repeats).all()
    assert sorted(raw.loc[raw["op"] == "iteration", "layers"].unique()) == [4, 8]
    hw = load_hardware(str(out))
    assert hw.kind == "calibrated" and hw.provenance.settings is not None
    assert hw.provenance.settings["grid"] == "smoke"
