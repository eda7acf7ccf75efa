"""Engine-overhead presets: they load with a public source for every value, replace a datasheet profile's overheads and
nothing else, order the engines as their designs say, and reach a run through the config, the flag and a sweep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import pytest

import costmodel.engines as engines
from costmodel import CostModel, HardwareProfile, IterationShape, builtin_hardware, load_hardware, load_model
from costmodel.engines import apply_engine, get_engine, list_engines, load_engines, parse_engines
from experiments.cli import main
from experiments.runner.config import RunConfig
from experiments.studies import engine_overheads as study
from experiments.sweep.spec import SweepSpec, expand

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SMALL = ["--model", "llama-3-8b", "--hardware", "h100-sxm.datasheet", "--num-prompts", "30", "--request-rate", "20",
         "--input-len", "uniform:16:256", "--output-len", "uniform:8:48", "--seed", "5"]  # fmt: skip


def decode_s(hardware: HardwareProfile, batch: int, context: int = 1024) -> float:
    return CostModel(load_model("llama-3-8b"), hardware).iteration_time(IterationShape.of(decode=[(batch, context)]))


def book_data() -> dict[str, Any]:
    """The built-in presets file as a mapping, to break."""
    return load_engines().model_dump()


def test_the_presets_load_and_are_not_hardware_profiles() -> None:
    assert {"vllm-v1", "eager", "trt-llm"} <= set(list_engines())
    assert "engines" not in builtin_hardware()  # engines.yaml sits beside the profiles but is not one
    with pytest.raises(ValueError, match="unknown hardware"):
        load_hardware("engines")


def test_every_value_cites_a_public_page_and_says_how_it_was_derived() -> None:
    book = load_engines()
    for name, preset in book.engines.items():
        values = preset.quantities()
        assert {"per_iteration_s", "per_sequence_s", "per_layer_s"} <= set(values), name
        for field, q in values.items():
            assert "https://" in book.sources[q.source], f"{name}.{field}"
            assert q.note.strip() and q.value >= 0, f"{name}.{field}"


@pytest.mark.parametrize("name", list_engines())
def test_apply_engine_changes_the_overheads_only(name: str) -> None:
    base = load_hardware("h100-sxm.datasheet")
    hw = apply_engine(base, name)
    preset = get_engine(name)
    ov = hw.overheads
    assert ov.per_iteration_s.value == pytest.approx(preset.per_iteration_s.value)
    assert ov.per_sequence_s.value == preset.per_sequence_s.value
    assert ov.per_layer_s.value == preset.per_layer_s.value
    assert hw.model_dump(exclude={"overheads", "provenance"}) == base.model_dump(exclude={"overheads", "provenance"})
    # the provenance keeps the profile's sources, adds the preset's, and says which preset replaced the overheads
    assert base.provenance.sources.items() <= hw.provenance.sources.items()
    assert ov.per_iteration_s.source in hw.provenance.sources
    assert repr(name) in hw.provenance.notes
    assert base.overheads != ov  # and the profile it came from is untouched
    assert load_hardware("h100-sxm.datasheet") == base


def test_apply_engine_refuses_measured_overheads_only() -> None:
    data = load_hardware("h100-sxm.datasheet").model_dump()
    data["kind"] = "calibrated"
    data["provenance"].update(device="NVIDIA H100", software={"torch": "2.4"}, date="2025-01-01", measurements="m.csv")
    data["overheads"]["per_iteration_s"]["source"] = "measured"
    calibrated = HardwareProfile.model_validate(data)
    with pytest.raises(ValueError, match="calibrated profile whose overheads were measured"):
        apply_engine(calibrated, "vllm-v1")
    # efficiencies fitted to kernels alone (Vidur's published ones) keep the datasheet's assumed overheads: a preset
    # replaces only assumptions there
    vidur = load_hardware("h100-sxm.vidur")
    assert vidur.kind == "calibrated" and all(
        q.source == "assumption" for q in (vidur.overheads.per_iteration_s, vidur.overheads.per_sequence_s)
    )
    fitted = apply_engine(vidur, "vllm-v1")
    assert fitted.efficiency == vidur.efficiency and fitted.overheads != vidur.overheads


@pytest.mark.parametrize("name", ["h100-sxm.vidur", "a100-80g.vidur"])
def test_vidur_fitted_profiles_say_what_they_were_fitted_on(name: str) -> None:
    hw = load_hardware(name)
    assert "vidur-profiling" in hw.provenance.sources
    errors = hw.provenance.held_out_error or {}
    assert errors["gemm"]["n"] > 1000 and errors["gemm"]["median"] < 0.1  # fitted series' held-out half
    base = load_hardware(name.removesuffix(".vidur"))
    assert (hw.peaks(), hw.bandwidth) == (base.peaks(), base.bandwidth)  # the device's rates


@pytest.mark.parametrize("device", ["h100-sxm.datasheet", "a100-80g.datasheet"])
def test_vllm_v1_decodes_a_large_batch_faster_than_the_datasheet_default(device: str) -> None:
    base = load_hardware(device)
    assert decode_s(apply_engine(base, "vllm-v1"), 256) < decode_s(base, 256)


@pytest.mark.parametrize("device", ["h100-sxm.datasheet", "a100-80g.datasheet"])
def test_eager_is_slower_than_vllm_v1_at_every_batch_size(device: str) -> None:
    base = load_hardware(device)
    eager, v1 = apply_engine(base, "eager"), apply_engine(base, "vllm-v1")
    for batch in BATCHES:
        assert decode_s(eager, batch) > decode_s(v1, batch), batch


def test_a_per_step_gpu_cost_is_added_to_the_per_iteration_term(monkeypatch: pytest.MonkeyPatch) -> None:
    data = book_data()
    gpu = {"value": 3e-4, "source": "vllm-v1-blog", "note": "a fixed GPU cost, for the test"}
    data["engines"]["vllm-v1"]["per_step_gpu_s"] = gpu
    book = parse_engines(data)
    monkeypatch.setattr(engines, "load_engines", lambda path=None: book)
    hw = apply_engine(load_hardware("h100-sxm.datasheet"), "vllm-v1")
    assert hw.overheads.per_iteration_s.value == pytest.approx(book.engines["vllm-v1"].per_iteration_s.value + 3e-4)
    assert "fixed GPU cost" in hw.overheads.per_iteration_s.note


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["engines"]["eager"]["per_layer_s"].update(source="a-blog"), "engines.eager.per_layer_s.source"),
        (lambda d: d["engines"]["eager"].pop("per_sequence_s"), "engines.eager.per_sequence_s: Field required"),
        (lambda d: d["engines"]["eager"]["per_layer_s"].update(value=-1), "engines.eager.per_layer_s.value"),
        (lambda d: d["engines"]["eager"]["per_layer_s"].update(note=""), "engines.eager.per_layer_s.note"),
        (lambda d: d["provenance"]["sources"].update(x="a title without an address"), "provenance.sources.x"),
        (lambda d: d["engines"]["eager"].update(colour="green"), "engines.eager.colour"),
    ],
)
def test_a_bad_presets_file_names_the_field(edit: Any, message: str) -> None:
    data = book_data()
    edit(data)
    with pytest.raises(ValueError, match="invalid engine presets") as info:
        parse_engines(data, "engines.yaml")
    assert message in str(info.value)


def test_an_unknown_preset_is_refused_naming_the_field_and_the_presets() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        RunConfig(engine_overheads="vllm-v9")
    text = str(info.value)
    assert "engine_overheads" in text and "unknown engine overhead preset 'vllm-v9'" in text
    assert all(name in text for name in list_engines())
    with pytest.raises(ValueError, match="known: eager, "):
        get_engine("nope")
    assert RunConfig(engine_overheads=" vLLM-V1 ").engine_overheads == "vllm-v1"


def test_ferry_run_with_engine_overheads_runs_and_records_the_preset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", *SMALL, "--engine-overheads", "vllm-v1", "--out", str(tmp_path / "v1")]) == 0
    assert "(vllm-v1 overheads)" in capsys.readouterr().out
    assert main(["run", *SMALL, "--out", str(tmp_path / "default")]) == 0
    v1 = json.loads((tmp_path / "v1" / "summary.json").read_text())
    default = json.loads((tmp_path / "default" / "summary.json").read_text())
    assert v1["config"]["engine_overheads"] == "vllm-v1"
    assert "engine_overheads" not in default["config"]  # written only when set: older configs keep their form
    assert v1["mean_tpot_ms"] < default["mean_tpot_ms"]  # ~0.15 ms per step instead of ~1 ms + 40 us per sequence
    # the summary's config reproduces the run, preset included
    assert main(["run", "--config", str(tmp_path / "v1" / "summary.json"), "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert again["config"]["engine_overheads"] == "vllm-v1" and again["mean_tpot_ms"] == v1["mean_tpot_ms"]


def test_ferry_run_refuses_an_unknown_preset_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *SMALL, "--engine-overheads", "fast", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "engine_overheads: unknown engine overhead preset 'fast'; known: eager" in err


def test_a_sweep_varies_the_preset() -> None:
    spec = SweepSpec.model_validate({"base": {"num_prompts": 10}, "grid": {"engine_overheads": [None, "vllm-v1"]}})
    points = expand(spec)
    assert [p.config.engine_overheads for p in points if p.config] == [None, "vllm-v1"]
    assert points[0].hash != points[1].hash


def test_ferry_iteration_takes_the_preset(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["iteration", "--model", "llama-3-8b", "--hardware", "h100-sxm.datasheet", "--decode", "256@1024", "--json"]
    assert main(args) == 0
    default = json.loads(capsys.readouterr().out)
    assert main([*args, "--engine-overheads", "vllm-v1"]) == 0
    v1 = json.loads(capsys.readouterr().out)
    assert v1["overhead"]["time_s"] < default["overhead"]["time_s"] and v1["time_s"] < default["time_s"]


def test_the_study_keeps_chosen_and_held_out_points_apart(capsys: pytest.CaptureFixture[str]) -> None:
    assert study.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert out.index("CHOSEN FROM") < out.index("HELD OUT")
    # NVIDIA's performance tables and NIM benchmark pages are checks only: no preset cites them
    cited = " ".join(load_engines().sources.values()).lower()
    assert "perf-overview" not in cited and "docs.nvidia.com/nim" not in cited
    assert "perf-overview" in study.TRTLLM_SOURCE
