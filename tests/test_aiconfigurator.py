"""NVIDIA's measured kernel database as ferry reads it (``costmodel.calibration.aiconfigurator``): on small tables the
test writes itself in the package's layout, and on the real package where it is installed (``ferry[measured]``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from costmodel.calibration.aiconfigurator import load_measured, read_tables
from costmodel.calibration.vidur import predict
from costmodel.model_spec import load_model
from experiments.cli import main


def _write(root: Path, family: str, name: str, frame: pd.DataFrame, system: str = "h100_sxm") -> None:
    folder = root / "data" / system / family / "vllm" / "0.24.0"
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(folder / f"{name}.parquet")


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """A tiny database: llama-3-8b's QKV GEMM (two kernels for fp8, one for bf16), one prefill and one decode
    attention shape measured by two kernels each, latencies in ms as the package stores them."""
    root = tmp_path / "systems"
    root.mkdir()
    (root / "query_versions.yaml").write_text(
        "defaults:\n  vllm: {current: '0.24.0'}\n  sglang: {current: '0.5.14'}\n  trtllm: {current: '1.3.0rc20'}\n"
        "overrides:\n  a100_sxm:\n    vllm: {current: '0.14.0'}\n"
    )
    gemm = pd.DataFrame(
        {
            "gemm_dtype": ["bfloat16"] * 3 + ["fp8"] * 3,
            "m": [1, 128, 1024, 1, 1, 128],
            "n": [6144] * 6,
            "k": [4096] * 6,
            "latency": [0.02, 0.024, 0.065, 0.015, 0.9, 0.018],
            "kernel_source": ["linear"] * 3 + ["cutlass", "slow", "cutlass"],
        }
    )
    _write(root, "gemm", "gemm_perf", gemm)
    attention = {"num_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "kv_cache_dtype": "bfloat16",
                 "window_size": 0, "attn_dtype": "bfloat16", "beam_width": 1}  # fmt: skip

    def rows(*values: tuple[int, int, int, float, str]) -> pd.DataFrame:
        keys = ("batch_size", "isl", "step", "latency", "kernel_source")
        return pd.DataFrame([attention | dict(zip(keys, v, strict=True)) for v in values])

    context = rows((2, 512, 0, 0.05, "fa3"), (1, 64, 0, 0.01, "fa3"), (2, 512, 0, 9.0, "fa4"))
    _write(root, "attention", "context_attention_perf", context)
    generation = rows((1, 1, 127, 0.0117, "fa3"), (8, 1, 1023, 0.03, "fa3"), (1, 1, 127, 5.0, "fa4"))
    _write(root, "attention", "generation_attention_perf", generation)
    return root


def test_tables_are_read_in_seconds_with_each_dtypes_usual_kernel(database: Path) -> None:
    t = read_tables("h100_sxm", root=database)
    assert t.version == "0.24.0"
    assert sorted(t.gemm["kernel_source"].unique()) == ["cutlass", "linear"]  # fp8's lone "slow" row dropped
    assert t.gemm.loc[t.gemm["m"] == 1024, "latency_s"].item() == pytest.approx(65e-6)
    assert (t.context["kernel_source"] == "fa3").all() and (t.generation["kernel_source"] == "fa3").all()


def test_rows_are_the_shapes_a_model_runs(database: Path) -> None:
    rows = load_measured(read_tables("h100_sxm", root=database), models=("llama-3-8b",), tps=(1, 2))
    spec = load_model("llama-3-8b")
    assert spec.num_attention_heads == 32 and spec.num_key_value_heads == 8  # the heads the tables hold at tp 1
    one = rows[rows["tp"] == 1]
    qkv = one[one["op"] == "qkv_proj"].sort_values("num_tokens")
    assert list(qkv["num_tokens"]) == [1, 128, 1024]  # bf16 only; n = (32 + 2 x 8) x 128, k = 4096
    assert list(qkv["measured_s"]) == pytest.approx([20e-6, 24e-6, 65e-6])
    decode = one[one["op"] == "attention_decode"].sort_values("batch_size")
    assert list(decode["kv_cache_size"]) == [127, 1023]  # context before the step: isl + step - 1
    prefill = one[one["op"] == "attention_prefill"].sort_values("batch_size")
    assert list(prefill["prefill_chunk_size"]) == [64, 512] and list(prefill["num_tokens"]) == [64, 1024]
    assert rows[rows["tp"] == 2].empty  # no table row has 16 heads and 4 KV heads, nor a tp-2 GEMM shape
    predicted = predict(rows)
    assert (predicted["predicted_s"] > 0).all()
    # two prompts of 512 tokens: ferry times both, as the measured kernel did (not one)
    two = predicted[(predicted["op"] == "attention_prefill") & (predicted["batch_size"] == 2)]
    one_prompt = predict(two.assign(batch_size=1, num_tokens=512))
    assert two["predicted_s"].item() > 1.2 * one_prompt["predicted_s"].item()


def test_unknown_systems_and_frameworks_are_one_line_errors(database: Path) -> None:
    with pytest.raises(ValueError, match="system='x100': the database has no such system .*h100_sxm"):
        read_tables("x100", root=database)
    with pytest.raises(ValueError, match="framework='tgi'"):
        read_tables("h100_sxm", "tgi", root=database)
    with pytest.raises(ValueError, match="no gemm/gemm_perf.parquet"):
        read_tables("h100_sxm", "sglang", root=database)


installed = importlib.util.find_spec("aiconfigurator_core") is not None


@pytest.mark.skipif(not installed, reason="aiconfigurator-core is not installed (pip install 'ferry[measured]')")
def test_the_real_database(capsys: pytest.CaptureFixture) -> None:
    """aiconfigurator-core 0.12.0's H100 SXM tables for vLLM 0.24.0, read and scored."""
    t = read_tables("h100_sxm")
    assert t.version == "0.24.0"
    qkv = t.gemm[(t.gemm["gemm_dtype"] == "bfloat16") & (t.gemm["n"] == 6144) & (t.gemm["k"] == 4096)]
    assert qkv.loc[qkv["m"] == 1, "latency_s"].item() == pytest.approx(19.9e-6, rel=0.02)  # 0.0199 ms
    assert main(["validate-kernels", "--aiconfigurator", "h100_sxm", "--model", "llama-3-8b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ops = {r["op"] for r in out["results"]}
    assert ops == {"qkv_proj", "o_proj", "mlp_gate_up", "mlp_down", "attention_prefill", "attention_decode"}
    assert all(np.isfinite(r["median_abs_rel_error"]) and r["n"] > 50 for r in out["results"])
    assert "aiconfigurator-core h100_sxm vllm 0.24.0" in out["source"]


@pytest.mark.skipif(not installed, reason="aiconfigurator-core is not installed (pip install 'ferry[measured]')")
def test_calibrate_names_the_databases_systems_not_ferrys_profiles(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:  # fmt: skip
    """An unknown system is refused with the database's systems (it listed ferry's profile names); a system the
    database has but ferry has no datasheet of (b60) asks for --base, before any fit."""
    out = str(tmp_path / "p.yaml")
    assert main(["calibrate", "--from-aiconfigurator", "nosuch", "--framework", "vllm", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "the database has no such system" in err and "b60" in err and "h100_sxm" in err and "h100-sxm" not in err
    assert main(["calibrate", "--from-aiconfigurator", "b60", "--framework", "vllm", "--out", out]) == 2
    assert "no datasheet profile of this device (b60.datasheet)" in capsys.readouterr().err
