"""Measured kernel tables in the cost model (``costmodel.kernel_tables``, ``formulas.table_time``) and the fit to the
database (``costmodel.calibration.measured``): on small tables this test writes itself in the package's layout, and on
the real package where it is installed (``ferry[measured]``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import CostModel, IterationShape, kerneldb, load_hardware, load_model
from costmodel import formulas as f
from costmodel import kernel_tables as kt
from costmodel.calibration.measured import Piecewise, fit_database, fit_piecewise, neighbour_spread
from costmodel.hardware import KernelTables
from experiments.cli import main

installed = importlib.util.find_spec("aiconfigurator_core") is not None
needs_package = pytest.mark.skipif(not installed, reason="aiconfigurator-core is not installed (ferry[measured])")

# ---- reading a table ------------------------------------------------------------------------------------------------


def one_table(xs: list[float], seconds: list[float], roofs: list[float]) -> kt.Tables:
    """A 1-D table over natural-log axis points ``xs`` with measured ``seconds`` and roofline ``roofs`` there."""
    lx, ls, lr = np.log(xs), np.log(seconds), np.log(roofs)
    return kt.pack({f.T_QKV: (lx, np.zeros(1), (ls - lr)[:, None], lr[:, None])})


def test_a_table_gives_the_measured_seconds_at_its_points_and_follows_the_roofline_beyond() -> None:
    t = one_table([1, 16, 256], [10e-6, 20e-6, 200e-6], [2e-6, 8e-6, 100e-6])
    at = lambda x, roof: f.table_time(t.toc, t.tab, f.T_QKV, math.log(x), 0.0, roof)  # noqa: E731
    for x, seconds in ((1, 10e-6), (16, 20e-6), (256, 200e-6)):
        assert at(x, 123.0) == pytest.approx(seconds, rel=1e-12)  # inside: the roofline passed in does not matter
    assert at(4, 1.0) == pytest.approx(math.sqrt(10e-6 * 20e-6), rel=1e-12)  # halfway in log space: geometric mean
    assert at(1024, 400e-6) == pytest.approx(400e-6 * 2.0, rel=1e-12)  # beyond: roofline x the last factor (200/100)
    assert at(0.5, 1e-6) == pytest.approx(1e-6 * 5.0, rel=1e-12)  # below the first point likewise (10/2)
    absent = kt.Tables()
    assert f.table_time(absent.toc, absent.tab, f.T_QKV, 1.0, 0.0, 7e-6) == 7e-6


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(1e-6, 1e-3), min_size=2, max_size=8), st.lists(st.floats(0.0, 12.0), min_size=2))
def test_seconds_that_grow_with_the_shape_read_as_a_time_that_grows(steps: list[float], xs: list[float]) -> None:
    points = np.exp(np.arange(len(steps)) * 1.3)
    seconds = np.cumsum(steps)  # measured seconds rising with the shape
    roofs = seconds * np.linspace(0.5, 0.9, len(steps))
    t = one_table(list(points), list(seconds), list(roofs))
    # the roofline beyond the table grows with the shape too (here: linearly from the last point's)
    xs = sorted(xs)
    read = [f.table_time(t.toc, t.tab, f.T_QKV, x, 0.0, roofs[-1] * math.exp(x) / points[-1]) for x in xs]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(read, read[1:], strict=False))


def test_a_two_dimensional_table_interpolates_bilinearly_in_logs() -> None:
    xs, ys = np.log([1.0, 4.0]), np.log([8.0, 64.0])
    seconds = np.log([[1e-5, 4e-5], [2e-5, 8e-5]])
    tables = kt.pack({f.T_DECODE: (xs, ys, seconds * 0.0, seconds)})
    mid = f.table_time(tables.toc, tables.tab, f.T_DECODE, math.log(2.0), math.log(np.sqrt(8 * 64)), 1.0)
    assert mid == pytest.approx(math.exp(seconds.mean()), rel=1e-12)


def test_bad_tables_are_refused() -> None:
    with pytest.raises(ValueError, match="axes must rise strictly"):
        kt.pack({f.T_QKV: (np.log([4.0, 2.0]), np.zeros(1), np.zeros((2, 1)), np.zeros((2, 1)))})


# ---- a database the test writes -------------------------------------------------------------------------------------

# the synthetic device: every kernel's time is a known function of its shape
GEMM_S = lambda m, n, k: 4e-6 + 2.0 * m * n * k / 5e14 + 2.0 * (n * k + m * (n + k)) / 2e12  # noqa: E731
PREFILL_S = lambda b, isl, heads, hd: 8e-6 + 2.0 * heads * hd * b * isl * (isl + 1) / 3e14  # noqa: E731
DECODE_S = lambda b, ctx, kvh, hd: 6e-6 + 4.0 * kvh * hd * b * ctx / 2e12  # noqa: E731
ALLREDUCE_S = lambda n, elements: 5e-6 + 2.0 * (n - 1) / n * 2.0 * elements / 2e11  # noqa: E731


def _write(root: Path, family: str, name: str, frame: pd.DataFrame) -> None:
    folder = root / "data" / "h100_sxm" / family / "vllm" / "0.24.0"
    folder.mkdir(parents=True, exist_ok=True)
    frame.assign(latency=frame["latency"] * 1e3).to_parquet(folder / f"{name}.parquet")  # stored in ms


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """GEMMs over m x n x k, prefill and decode attention of llama-3-8b's heads (and of 16 heads) over batch x
    length, all-reduces over 2 and 4 GPUs: latencies from the known functions above, in the package's layout."""
    root = tmp_path / "systems"
    root.mkdir()
    (root / "query_versions.yaml").write_text(
        "defaults:\n  vllm: {current: '0.24.0'}\n  sglang: {current: '0.5.14'}\n  trtllm: {current: '1.3.0rc20'}\n"
    )
    ms, sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024], [1024, 4096, 6144, 14336, 28672, 65536]
    grid = [(m, n, k) for m in ms for n in sizes for k in sizes]
    gemm = pd.DataFrame(grid, columns=["m", "n", "k"]).assign(gemm_dtype="bfloat16", kernel_source="linear")
    _write(root, "gemm", "gemm_perf", gemm.assign(latency=[GEMM_S(*g) for g in grid]))
    attention = []
    for heads, kvh in ((32, 8), (16, 2)):
        for b in (1, 2, 4, 8, 16):
            for isl in (16, 64, 256, 1024):
                attention.append({"num_heads": heads, "num_key_value_heads": kvh, "batch_size": b, "isl": isl,
                                  "step": 0, "latency": PREFILL_S(b, isl, heads, 128)})  # fmt: skip
    base = {"head_dim": 128, "kv_cache_dtype": "bfloat16", "window_size": 0, "kernel_source": "fa3"}
    _write(root, "attention", "context_attention_perf", pd.DataFrame(attention).assign(**base))
    generation = []
    for heads, kvh in ((32, 8), (16, 2)):
        for b in (1, 4, 16, 64):
            for step in (15, 127, 1023, 4095):
                generation.append({"num_heads": heads, "num_key_value_heads": kvh, "batch_size": b, "isl": 1,
                                   "step": step, "latency": DECODE_S(b, step + 1, kvh, 128)})  # fmt: skip
    _write(root, "attention", "generation_attention_perf", pd.DataFrame(generation).assign(**base))
    sizes = 4 ** np.arange(5, 15)
    reduce = [{"num_gpus": n, "message_size": e, "latency": ALLREDUCE_S(n, e)} for n in (2, 4) for e in sizes]
    reduce_frame = pd.DataFrame(reduce).assign(allreduce_dtype="bfloat16", kernel_source="graph")
    _write(root, "comm", "custom_allreduce_perf", reduce_frame)
    return root


@pytest.fixture
def measured_h100(database: Path, monkeypatch: pytest.MonkeyPatch):
    """h100-sxm's datasheet profile naming the test's database as its kernel tables."""
    monkeypatch.setattr(kerneldb, "data_root", lambda: database)
    monkeypatch.setattr(kerneldb, "unavailable", lambda version: None)
    ref = KernelTables(package_version="test", system="h100_sxm", framework="vllm", version="0.24.0",
                       comm_version="0.24.0")  # fmt: skip
    return load_hardware("h100-sxm.datasheet").model_copy(update={"kernel_tables": ref})


def kernel_s(cm: CostModel, shape: IterationShape, name: str) -> float:
    return next(k.time_s for k in cm.kernels(shape) if k.name == name)


def test_the_cost_model_times_measured_shapes_as_measured(measured_h100) -> None:
    spec = load_model("llama-3-8b")  # 32 heads, 8 KV heads of 128 at tp 1: measured
    cm = CostModel(spec, measured_h100)
    assert "interpolated" in cm.timing and not cm.tables.notes
    h, one = 4096, IterationShape.of(prefill=[(64, 0)])
    assert kernel_s(cm, one, "o_proj") == pytest.approx(GEMM_S(64, h, h), rel=1e-9)
    assert kernel_s(cm, one, "qkv_proj") == pytest.approx(GEMM_S(64, 6144, h), rel=1e-9)
    assert kernel_s(cm, one, "mlp_gate_up") == pytest.approx(GEMM_S(64, 28672, h), rel=1e-9)
    assert kernel_s(cm, IterationShape.of(prefill=[(256, 0)] * 4), "attention_prefill") == pytest.approx(
        PREFILL_S(4, 256, 32, 128), rel=1e-9
    )
    assert kernel_s(cm, IterationShape.of(decode=[(16, 127)]), "attention_decode") == pytest.approx(
        DECODE_S(16, 128, 8, 128), rel=1e-9
    )
    # at tp 2: k = 7168 of the down GEMM lies between measured sizes; 16/4 heads were not measured, 16/2 stand in
    cm2 = CostModel(spec, measured_h100, tp=2)
    assert kernel_s(cm2, one, "mlp_down") == pytest.approx(GEMM_S(64, h, 7168), rel=0.02)
    assert sum("16/2 heads of 128 stands in" in n for n in cm2.tables.notes) == 2
    # the all-reduces at tp 2: 65 of T x H bf16 activations
    assert cm2.explain(one).communication_s == pytest.approx(65 * ALLREDUCE_S(2, 64 * h), rel=1e-9)
    assert any("all-reduce: not measured over 8 GPUs" in n for n in CostModel(spec, measured_h100, tp=8).tables.notes)


def test_without_the_package_the_fitted_curves_time_it_and_say_why(measured_h100, monkeypatch) -> None:
    monkeypatch.setattr(kerneldb, "unavailable", lambda version: "aiconfigurator-core is not installed; pip install")
    cm = CostModel(load_model("llama-3-8b"), measured_h100)
    assert cm.tables.used == [] and "not installed" in cm.timing
    curves = CostModel(load_model("llama-3-8b"), measured_h100, tables=False)
    shape = IterationShape.of(prefill=[(300, 0)], decode=[(8, 500)])
    assert cm.iteration_time(shape) == curves.iteration_time(shape)
    hw = measured_h100.model_copy(update={"kind": "calibrated", "provenance": measured_h100.provenance.model_copy(
        update={"device": "d", "software": {"x": "1"}, "date": "2026-01-01", "measurements": "m"})})  # fmt: skip
    assert "not here (aiconfigurator-core is not installed" in hw.origin()


def test_fp8_quantization_and_an_fp8_kv_cache_use_their_own_tables(measured_h100) -> None:
    cm = CostModel(load_model("llama-3-8b"), measured_h100, quantization="fp8", kv_cache_dtype="fp8")
    notes = " ".join(cm.tables.notes)
    assert "no fp8 GEMM table" in notes and "no fp8 KV attention table" in notes  # the test database has bf16 only
    assert f.T_LM in cm.tables.used  # the LM head stays in the activations' format
    assert kt.gemm_format(cm.dtypes, cm.gemm_dtype) == "fp8"
    block = CostModel(load_model("llama-3-8b"), measured_h100, quantization="fp8_block")
    assert kt.gemm_format(block.dtypes, block.gemm_dtype) == "fp8_block" and block.gemm_dtype == "fp8_block"
    checkpoint = dataclasses.replace(load_model("llama-3-8b"), quantization="nvfp4")  # an NVFP4 checkpoint of it
    nvfp4 = CostModel(checkpoint, load_hardware("b200.datasheet"))
    assert nvfp4.gemm_dtype == "nvfp4" and kt.gemm_format(nvfp4.dtypes, nvfp4.gemm_dtype) == "nvfp4"
    hopper = CostModel(checkpoint, load_hardware("h100-sxm.datasheet"))
    assert hopper.gemm_dtype == "bfloat16"  # no fp4 rate on an H100: weight-only, in the activations' format
    with pytest.raises(ValueError, match="only from a checkpoint quantized offline"):  # vLLM makes none at load
        CostModel(load_model("llama-3-8b"), load_hardware("b200.datasheet"), quantization="nvfp4")


# ---- the fit ---------------------------------------------------------------------------------------------------------


def test_the_database_s_own_spread_compares_each_gemm_with_the_one_a_row_larger() -> None:
    rows = pd.DataFrame({
        "gemm_dtype": ["bfloat16"] * 5 + ["fp8"],
        "n": [64, 64, 64, 64, 128, 64], "k": [32] * 6, "m": [1, 2, 4, 5, 2, 3],
        "latency_s": [1.0, 1.1, 2.0, 1.0, 9.0, 50.0],
    })  # fmt: skip
    spread = neighbour_spread(rows)
    # pairs (1, 2) and (4, 5) of n=64: +10% and -50%; m=2 of n=128 has no neighbour, the fp8 row is not bf16
    assert spread["n"] == 2
    assert spread["median"] == pytest.approx(0.3) and spread["p90"] == pytest.approx(0.46)
    assert neighbour_spread(rows[rows["m"] != 5].iloc[[0, 2]])["n"] == 0


def test_a_piecewise_curve_with_a_floor_is_recovered_from_its_own_points() -> None:
    truth = Piecewise(a_c=1 / 6e14, h_c=2e-6, a_m=1 / 2.5e12, h_m=1e-6, floor=9e-6)
    rng = np.random.default_rng(0)
    flops = np.exp(rng.uniform(np.log(1e6), np.log(1e13), 400))
    nbytes = np.exp(rng.uniform(np.log(1e4), np.log(1e10), 400))
    t = truth.time(flops, nbytes)
    fit = fit_piecewise(flops, nbytes, t, 1 / 1e15, 1 / 3.35e12)
    assert np.median(np.abs(fit.time(flops, nbytes) / t - 1)) < 1e-3
    assert fit.floor == pytest.approx(9e-6, rel=0.02) and fit.a_c == pytest.approx(truth.a_c, rel=0.05)


def test_fitting_the_test_database_writes_a_profile_that_predicts_its_held_out_shapes(database: Path) -> None:
    fitted = fit_database("h100_sxm", "vllm", load_hardware("h100-sxm.datasheet"), name="t", root=database)
    errors = fitted.errors.set_index("op_class")
    assert set(errors.index) == {"gemm", "attention_prefill", "attention_decode", "all_reduce"}
    assert (errors["held_out"] > 0).all() and (errors["table_median"] < 0.05).all(), errors
    hw = fitted.profile
    assert hw.kernel_tables is not None and hw.kernel_tables.version == "0.24.0"
    assert hw.efficiency.gemm.floor_s is not None and hw.efficiency.gemm.compute.source == "measured"
    assert hw.overheads.per_iteration_s.source.startswith("engine:")  # vLLM V1's preset
    assert hw.peaks() == load_hardware("h100-sxm.datasheet").peaks()


# ---- the real package ------------------------------------------------------------------------------------------------


@needs_package
def test_the_shipped_profile_times_the_measured_h100_kernels_the_issue_names() -> None:
    cm = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm"))
    assert "interpolated" in cm.timing
    # a decode of one sequence at 128 tokens: 11.7 us a layer measured (the datasheet profile said 4.2 us)
    assert kernel_s(cm, IterationShape.of(decode=[(1, 127)]), "attention_decode") == pytest.approx(11.69e-6, rel=0.01)
    # 128 sequences at 4k context: 0.69 ms measured (the datasheet profile said 0.92 ms)
    assert kernel_s(cm, IterationShape.of(decode=[(128, 4095)]), "attention_decode") == pytest.approx(0.69e-3, rel=0.01)


@needs_package
def test_calibrate_from_the_real_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "h200.yaml"
    assert main(["calibrate", "--from-aiconfigurator", "h200_sxm", "--framework", "sglang", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "held-out error" in printed and "attention_decode" in printed and "all_reduce" in printed
    data = yaml.safe_load(out.read_text())
    assert data["kernel_tables"]["framework"] == "sglang" and data["kernel_tables"]["version"] == "0.5.14"
    held = data["kernel_tables"]["held_out_error"]
    assert held["gemm"]["median"] < 0.08 and held["attention_decode"]["median"] < 0.05
    assert load_hardware(str(out)).overheads.per_iteration_s.source == "engine:sglang-v04-blog"


def test_a_system_the_database_lacks_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if not installed:
        assert main(["calibrate", "--from-aiconfigurator", "h100_sxm", "--out", str(tmp_path / "x.yaml")]) == 2
        assert "pip install 'ferry[measured]'" in capsys.readouterr().err
        return
    assert main(["calibrate", "--from-aiconfigurator", "x100", "--base", "h100-sxm.datasheet",
                 "--out", str(tmp_path / "x.yaml")]) == 2  # fmt: skip
    assert "x100" in capsys.readouterr().err


@needs_package
@pytest.mark.parametrize(
    ("hardware", "extra"),
    [("l40s.sglang", {"tensor_parallel_size": 2, "kv_cache_dtype": "fp8"}),
     ("b200.trtllm", {"quantization": "fp8", "policy": "continuous"}),
     ("a100-80g", {"model": "llama-2-7b", "tensor_parallel_size": 4})],
)  # fmt: skip
def test_both_engines_time_from_the_tables_to_the_last_bit(hardware: str, extra: dict) -> None:
    from experiments.runner.config import RunConfig
    from experiments.runner.simulation import run_simulation

    fields = {"model": "llama-3-8b", "hardware": hardware, "policy": "chunked", "num_prompts": 200,
              "request_rate": 40.0, "input_len": "lognormal:median=300,sigma=1.0,max=3000",
              "output_len": "lognormal:median=100,sigma=0.8,max=600", "seed": 3} | extra  # fmt: skip
    runs = {e: run_simulation(RunConfig.model_validate(fields | {"engine": e})) for e in ("compiled", "reference")}
    fast, reference = (runs[e].records for e in ("compiled", "reference"))
    assert fast.iterations.to_frame().equals(reference.iterations.to_frame())
    assert np.array_equal(fast.requests.first_token, reference.requests.first_token)
    assert "measured: aiconfigurator-core" in runs["compiled"].summary["hardware_profile"]["origin"]
