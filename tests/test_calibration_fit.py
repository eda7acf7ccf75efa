"""Fitting profiles to measurements (no torch): the solver, the fit on data with known answers, held-out scoring, the
calibrated profile the cost model reads back, and fitting from measurements taken elsewhere (raw CSV, Vidur layout)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from costmodel import CostModel, IterationShape, ModelSpec, load_hardware, load_model
from costmodel.calibration.fit import (
    ClassFit,
    Flat,
    Side,
    Term,
    WorkCounter,
    dump_terms,
    fit_classes,
    held_out,
    load_terms,
    nnls,
)
from costmodel.calibration.harness import ROW_COLUMNS
from costmodel.calibration.profile import fit_profile
from costmodel.calibration.refit import fit_vidur
from costmodel.hardware import MEASURED, OP_CLASSES
from experiments.cli import main

SPEC = load_model("tiny-llama")
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GEMMS = ("qkv_proj", "o_proj", "mlp_gate_up", "mlp_down", "lm_head")
ELEMENTWISE = ("embedding", "norm", "rope", "mlp_act")

# a made-up CPU: 50 GFLOP/s GEMMs with 150 us of fixed cost, 8 GB/s memory; per-class rates of its own
TRUE = {
    "gemm": ClassFit(Side(1 / 50e9, 150e-6), Side(1 / 8e9, 20e-6)),
    "attention_prefill": ClassFit(Side(1 / 30e9, 80e-6), Side(1 / 6e9, 10e-6)),
    "attention_decode": ClassFit(Side(1 / 5e9, 100e-6), Side(1 / 6e9, 150e-6)),
    "elementwise": ClassFit(Side(1 / 4e9, 15e-6), Side(1 / 16e9, 6e-6)),
}
OVERHEAD = (3e-4, 2e-4, 5e-5)  # per iteration, per layer, per sequence (s)


def test_nnls_matches_the_best_feasible_active_set() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        a = rng.normal(size=(40, 5)) * rng.uniform(1e-3, 1e3, size=5)  # badly scaled columns, as in the fit
        b = rng.normal(size=40)
        x = nnls(a, b)
        assert (x >= 0).all()
        best = math.inf
        for mask in itertools.product([False, True], repeat=5):
            m = np.array(mask)
            if not m.any():
                continue
            z = np.zeros(5)
            z[m] = np.linalg.lstsq(a[:, m], b, rcond=None)[0]
            if (z >= 0).all():
                best = min(best, float(np.linalg.norm(a @ z - b)))
        assert np.linalg.norm(a @ x - b) == pytest.approx(min(best, float(np.linalg.norm(b))), rel=1e-6)


def test_held_out_alternates_within_each_series() -> None:
    keys = [("a",)] * 5 + [("b",)] * 3
    order = [(5,), (1,), (4,), (2,), (3,), (30,), (10,), (20,)]
    held = held_out(keys, order)
    # a sorted: 1 2 3 4 5 -> hold 2, 4; b sorted: 10 20 30 -> hold 20
    assert held.tolist() == [False, False, True, True, False, False, False, True]


def test_terms_round_trip_through_json() -> None:
    terms = (Term("gemm", 1e9, 2e6, 1.0), Term("elementwise", 0.0, 4e3, 2.0))
    assert load_terms(dump_terms(terms)) == terms
    with pytest.raises(ValueError, match="kernels list"):
        load_terms("not json")


def _kernel_rows() -> list[tuple[tuple[Term, ...], str, int, int]]:
    """(terms, kernel, size, context) of a quick-grid-like set of kernel measurements of tiny-llama."""
    work = WorkCounter(SPEC, "float32")
    out = []
    for name in GEMMS + ELEMENTWISE:
        for t in TOKENS:
            out.append((work.terms(IterationShape.of(decode=[(t, 0)]), {name: 1}), name, t, 0))
    for ctx in (0, 128, 512):
        for n in (16, 64, 256, 512):
            out.append(
                (
                    work.terms(IterationShape.of(prefill=[(n, ctx)]), {"attention_prefill": 1}),
                    "attention_prefill",
                    n,
                    ctx,
                )
            )
    for ctx in (32, 128, 512):
        for b in (1, 4, 16, 32):
            out.append(
                (work.terms(IterationShape.of(decode=[(b, ctx)]), {"attention_decode": 1}), "attention_decode", b, ctx)
            )
    return out


def at_depth(depth: int) -> ModelSpec:
    return dataclasses.replace(SPEC, num_hidden_layers=depth)


def test_fit_recovers_known_curves_from_exact_times() -> None:
    rows = [r[0] for r in _kernel_rows()]
    measured = Flat(rows).predict(TRUE)
    prior = {c: ClassFit(Side(1 / 100e9, 0.0), Side(1 / 10e9, 0.0)) for c in OP_CLASSES}
    fitted, _ = fit_classes(rows, measured, prior)
    assert np.abs(Flat(rows).predict(fitted) / measured - 1).max() < 1e-6
    # the GEMMs of this grid reach both sides of the roofline: both are identified
    assert 1 / fitted["gemm"].compute.per_unit_s == pytest.approx(50e9, rel=1e-4)
    assert 1 / fitted["gemm"].memory.per_unit_s == pytest.approx(8e9, rel=1e-4)
    assert fitted["gemm"].compute.fixed_s == pytest.approx(150e-6, rel=1e-3)


def test_fit_respects_a_known_peak() -> None:
    rows = [r[0] for r in _kernel_rows()]
    measured = Flat(rows).predict(TRUE)
    prior = {c: ClassFit(Side(1 / 100e9, 0.0), Side(1 / 10e9, 0.0)) for c in OP_CLASSES}
    peak = 40e9  # slower than the true 50 GFLOP/s: the fit may not go faster
    fitted, _ = fit_classes(rows, measured, prior, {("gemm", "compute"): 1 / peak})
    assert fitted["gemm"].compute.per_unit_s >= 1 / peak * (1 - 1e-12)


def test_frozen_parameters_keep_the_prior_and_the_rest_still_fit() -> None:
    """A parameter named in ``frozen`` stays at the prior's value (whole iterations of one model cannot tell it from
    the host overheads); the others are fitted around it: from the true curves with one value frozen at its truth,
    the rest come back exactly."""
    rows = [r[0] for r in _kernel_rows()]
    measured = Flat(rows).predict(TRUE)
    prior = {c: ClassFit(Side(1 / 100e9, 0.0), Side(1 / 10e9, 0.0)) for c in OP_CLASSES}
    prior["gemm"] = ClassFit(Side(1 / 100e9, TRUE["gemm"].compute.fixed_s), Side(1 / 10e9, 0.0))
    fitted, _ = fit_classes(rows, measured, prior, frozen=frozenset({("gemm", "compute", "h")}))
    assert fitted["gemm"].compute.fixed_s == prior["gemm"].compute.fixed_s
    assert 1 / fitted["gemm"].compute.per_unit_s == pytest.approx(50e9, rel=1e-4)
    assert np.abs(Flat(rows).predict(fitted) / measured - 1).max() < 1e-6
    # frozen at a wrong value, that value is kept and the fit is worse, not silently moved
    prior["gemm"] = ClassFit(Side(1 / 100e9, 0.0), Side(1 / 10e9, 0.0))
    wrong, _ = fit_classes(rows, measured, prior, frozen=frozenset({("gemm", "compute", "h")}))
    assert wrong["gemm"].compute.fixed_s == 0.0
    assert np.abs(Flat(rows).predict(wrong) / measured - 1).max() > 1e-3


def iteration_shape(b: int, ctx: int) -> IterationShape:
    """b decodes at ctx, with a 64-token prompt alongside when b is odd."""
    return IterationShape.of(decode=[(b, ctx)], prefill=[(64, 0)] if b % 2 else None)


def synthetic_raw(noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Raw measurements as `ferry calibrate` writes them, timed by TRUE (and OVERHEAD for iterations)."""
    rng = np.random.default_rng(seed)
    kernels = _kernel_rows()
    times = Flat([k[0] for k in kernels]).predict(TRUE) * np.exp(rng.normal(0.0, noise, len(kernels)))
    base = {c: 0 for c in ("num_tokens", "batch_size", "chunk", "context", "seqs", "repeats", "sets")}
    base |= {"device": "a test CPU", "dtype": "float32", "model": "tiny-llama", "layers": 4, "shape": ""}
    base |= {"flops": 0.0, "bytes": 0.0, "min_s": 0.0, "max_s": 0.0}
    records = []
    for (terms, op, size, ctx), t in zip(kernels, times, strict=True):
        records.append(
            base
            | {"op": op, "op_class": terms[0].op_class, "num_tokens": size, "context": ctx, "median_s": t}
            | {"kernels": dump_terms(terms)}
        )
    # whole iterations at two depths
    for depth in (4, 2):
        work = WorkCounter(at_depth(depth), "float32")
        for b in (1, 2, 4, 8, 16, 24):
            for ctx in (64, 300):
                shape = iteration_shape(b, ctx)
                terms = work.terms(shape)
                t = Flat([terms]).predict(TRUE)[0]
                t += OVERHEAD[0] + OVERHEAD[1] * depth + OVERHEAD[2] * shape.num_seqs
                t *= math.exp(rng.normal(0.0, noise))
                records.append(
                    base
                    | {"op": "iteration", "op_class": "iteration", "layers": depth, "seqs": shape.num_seqs}
                    | {"num_tokens": shape.num_tokens, "median_s": t, "kernels": dump_terms(terms)}
                )
    records.append(base | {"op": "copy", "op_class": "bandwidth", "bytes": 8e9 * 0.05, "median_s": 0.05})
    records.append(base | {"op": "memory", "op_class": "capacity", "bytes": float(16 << 30), "median_s": 1.0})
    records.append(base | {"op": "empty", "op_class": "launch", "median_s": 5e-6})
    raw = pd.DataFrame(records, columns=list(ROW_COLUMNS))
    raw["kernels"] = raw["kernels"].fillna("[]")
    raw["software"] = json.dumps({"torch": "test"})
    raw["date"] = "2026-01-01"
    raw["settings"] = json.dumps({"device": "cpu", "dtype": "float32", "threads": "1", "base": "none"})
    return raw


def test_a_fit_of_exact_data_predicts_held_out_points_exactly() -> None:
    result = fit_profile(synthetic_raw(), name="test-cpu", base=None, measurements="raw.csv")
    errors = result.errors.set_index("op_class")
    assert set(errors.index) == {*OP_CLASSES, "iteration"}
    assert (errors["median"] < 1e-3).all() and (errors["held_out"] > 0).all()
    hw = result.profile
    assert hw.kind == "calibrated" and hw.name == "test-cpu"
    assert hw.provenance.measurements == "raw.csv" and hw.provenance.held_out_error is not None
    assert hw.overheads.per_iteration_s.value == pytest.approx(OVERHEAD[0], rel=0.05)
    assert hw.overheads.per_layer_s.value == pytest.approx(OVERHEAD[1], rel=0.05)
    assert hw.overheads.per_sequence_s.value == pytest.approx(OVERHEAD[2], rel=0.05)
    assert hw.efficiency.gemm.compute.source == MEASURED
    for c in OP_CLASSES:  # the peaks were raised to the fastest fitted rate: every max stays <= 1
        assert hw.efficiency.of(c).compute.max <= 1 and hw.efficiency.of(c).memory.max <= 1


def test_the_cost_model_reads_back_what_the_fit_predicts() -> None:
    """The written profile, through CostModel, times each iteration as the fit did: the conversion from fitted
    seconds per FLOP and fixed seconds to max and half_size is exact."""
    result = fit_profile(synthetic_raw(noise=0.05), name="test-cpu", base=None, measurements="raw.csv")
    rows = result.rows[result.rows["op"] == "iteration"]
    for depth, ctx, b in ((4, 300, 8), (2, 64, 1)):
        cost = CostModel(at_depth(depth), result.profile, dtype="float32")
        shape = iteration_shape(b, ctx)
        terms = dump_terms(WorkCounter(at_depth(depth), "float32").terms(shape))
        match = rows[(rows["layers"] == depth) & (rows["kernels"] == terms)]
        assert len(match) == 1
        assert cost.iteration_time(shape) == pytest.approx(float(match["predicted_s"].iloc[0]), rel=1e-9)


def test_noisy_data_fits_within_its_noise() -> None:
    result = fit_profile(synthetic_raw(noise=0.05, seed=1), name="t", base=None, measurements="raw.csv")
    assert (result.errors["median"] < 0.08).all(), result.errors


def test_a_datasheet_base_keeps_its_rates_and_every_max_at_most_one() -> None:
    raw = synthetic_raw()
    base = load_hardware("h100-sxm.datasheet")  # far faster than TRUE: the fit stays below its peaks trivially
    result = fit_profile(raw, name="anchored", base=base, measurements="raw.csv")
    hw = result.profile
    assert hw.peak_tflops == base.peak_tflops and hw.memory_bandwidth_gbps == base.memory_bandwidth_gbps
    assert hw.interconnect == base.interconnect
    assert hw.efficiency.gemm.compute.source == MEASURED
    assert hw.efficiency.gemm.compute.max < 0.01  # 50 GFLOP/s of 67 TFLOP/s fp32


def test_one_dtype_at_a_time() -> None:
    raw = synthetic_raw()
    raw.loc[raw.index[0], "dtype"] = "bfloat16"
    with pytest.raises(ValueError, match="one dtype at a time"):
        fit_profile(raw, name="t", base=None, measurements="raw.csv")


def test_calibrate_from_a_raw_csv_writes_a_profile_ferry_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw_path = tmp_path / "cpu.raw.csv"
    synthetic_raw(noise=0.02).to_csv(raw_path, index=False)
    out = tmp_path / "refit.yaml"
    assert main(["calibrate", "--from-measurements", str(raw_path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "held-out error" in printed and "iteration" in printed
    hw = load_hardware(str(out))
    assert hw.kind == "calibrated" and hw.provenance.measurements == str(raw_path)
    assert hw.provenance.settings and hw.provenance.settings["threads"] == "1"
    assert main(["iteration", "--model", "tiny-llama", "--hardware", str(out), "--dtype", "float32",
                 "--decode", "8@256", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["time_s"] > 0


def test_calibrate_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["calibrate", "--from-measurements", str(bad), "--out", str(tmp_path / "x.yaml")]) == 2
    assert "not a raw CSV" in capsys.readouterr().err
    assert main(["calibrate", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "--model" in capsys.readouterr().err


# ---- Vidur's layout, made up --------------------------------------------------------------------------------------

VIDUR_MODELS = {  # name -> (n_embd, n_head, n_kv_head, n_expanded_embd)
    "meta-llama/Llama-2-7b-hf": (4096, 32, 32, 11008),
    "meta-llama/Meta-Llama-3-8B": (4096, 32, 8, 14336),
}


def _write_vidur(root: Path, device: str, hardware: str, scale: float) -> None:
    """mlp.csv files whose times are ferry's own prediction with ``hardware``'s datasheet profile, times ``scale``
    (a device that is uniformly slower than its datasheet says)."""
    profile = load_hardware(hardware)
    for name, (h, nq, nkv, inter) in VIDUR_MODELS.items():
        spec = ModelSpec(
            name=name, hidden_size=h, num_hidden_layers=1, num_attention_heads=nq, num_key_value_heads=nkv,
            head_dim=h // nq, intermediate_size=inter, vocab_size=32000, max_position_embeddings=1 << 30,
            torch_dtype="float16",
        )  # fmt: skip
        cost = CostModel(spec, profile, dtype="float16")
        rows = []
        for t in range(8, 1025, 8):
            ks = {k.name: k.time_s for k in cost.kernels(IterationShape.of(prefill=[(t, 0)]))}
            ms = {
                "attn_pre_proj": ks["qkv_proj"],
                "attn_post_proj": ks["o_proj"],
                "mlp_up_proj": ks["mlp_gate_up"],
                "mlp_act": ks["mlp_act"],
                "mlp_down_proj": ks["mlp_down"],
                "input_layernorm": ks["norm"] / 2,
                "post_attention_layernorm": ks["norm"] / 2,
                "add": ks["norm"],
                "attn_rope": ks["rope"],
                "emb": ks["embedding"],
            }
            row = {"n_head": nq, "n_kv_head": nkv, "n_embd": h, "n_expanded_embd": inter, "vocab_size": 32000}
            row |= {"use_gated_mlp": True, "num_tokens": t, "num_tensor_parallel_workers": 1}
            row |= {f"time_stats.{k}.median": v * 1e3 * scale for k, v in ms.items()}
            rows.append(row)
        path = root / "compute" / device / name / "mlp.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(path, index=False)


def test_fit_on_one_model_transfers_to_the_others_and_to_another_device(tmp_path: Path) -> None:
    _write_vidur(tmp_path, "a100", "a100-80g.datasheet", scale=1.3)
    _write_vidur(tmp_path, "h100", "h100-sxm.datasheet", scale=1.3)
    report = fit_vidur(tmp_path, hardware="a100-80g", models=["Llama-2-7b"], name="a100-from-vidur")
    assert report.hardware == "a100-80g.datasheet" and report.fitted > 0  # the device's datasheet profile
    assert (report.fit.errors["median"] < 0.02).all(), report.fit.errors
    table = report.transfer.set_index(["rows", "op_class"])
    # other model on the fitted device, and both models on the other: before ~ 1 - 1/1.3 = 23% off, after ~ 0
    for key in (
        ("a100-80g.datasheet (fitted series, held out)", "gemm"),
        ("a100-80g.datasheet", "gemm"),
        ("h100-sxm.datasheet (transferred)", "gemm"),
    ):
        assert table.loc[key, "before_median"] == pytest.approx(1 - 1 / 1.3, abs=0.02)
        assert table.loc[key, "after_median"] < 0.03


def test_calibrate_from_vidur_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_vidur(tmp_path, "a100", "a100-80g.datasheet", scale=1.2)
    out = tmp_path / "a100.calibrated.yaml"
    args = ["calibrate", "--from-measurements", str(tmp_path), "--model", "Llama-2-7b", "--out", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "before" in printed and "after" in printed
    data = yaml.safe_load(out.read_text())
    assert data["kind"] == "calibrated" and data["provenance"]["settings"]["hardware"] == "a100-80g.datasheet"
    assert load_hardware(str(out)).efficiency.gemm.compute.source == MEASURED
