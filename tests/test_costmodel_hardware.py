"""Hardware profiles: the built-ins load and cite their sources; bad files fail with errors that name the field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from costmodel import HardwareProfile, builtin_hardware, load_hardware
from costmodel.hardware import ASSUMPTION, NOT_PROFILES, PROFILES_DIR, parse_hardware

DEVICES = ["a100-40g", "a100-80g", "h100-sxm", "h100-pcie", "h200", "l40s", "b200", "mi300x"]
DEVICES += ["b300", "gb200", "gb300", "rtx-pro-6000"]
SHIPPED = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml") if p.stem not in NOT_PROFILES)  # a new one included


def profile_data(name: str = "h100-sxm.datasheet") -> dict[str, Any]:
    return yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())


# the datasheet profiles: the devices without measured kernels (NAME.yaml) and the bases of those with them
# (NAME.datasheet.yaml); NAME.vidur.yaml is fitted to Vidur's measurements, NAME[.ENGINE].yaml to NVIDIA's database
DATASHEETS = [name for name in SHIPPED if profile_data(name)["kind"] == "datasheet"]
MEASURED_KERNELS = [name for name in SHIPPED if profile_data(name).get("kernel_tables")]


def test_every_device_the_issue_names_ships() -> None:
    assert set(DEVICES) <= set(builtin_hardware())


def test_every_system_of_the_database_ships_for_every_engine_with_its_datasheet() -> None:
    systems = ["a100-80g", "h100-sxm", "h200", "b200", "b300", "gb200", "gb300", "l40s", "rtx-pro-6000"]
    expected = {f"{d}{e}" for d in systems for e in ("", ".sglang", ".trtllm")}
    assert set(MEASURED_KERNELS) == expected
    assert {f"{d}.datasheet" for d in systems} <= set(DATASHEETS)


@pytest.mark.parametrize("name", MEASURED_KERNELS)
def test_profiles_fitted_to_the_database_say_what_and_how_well(name: str) -> None:
    hw = load_hardware(name)
    tables = hw.kernel_tables
    assert hw.kind == "calibrated" and tables is not None and tables.package_version == "0.12.0"
    assert tables.framework == (name.split(".")[1] if "." in name else "vllm")
    datasheet = load_hardware(name.split(".")[0] + ".datasheet")
    assert hw.peaks() == datasheet.peaks() and hw.bandwidth == datasheet.bandwidth  # the device rates: its datasheet's
    assert hw.memory_bytes == datasheet.memory_bytes and hw.link_bandwidth == datasheet.link_bandwidth
    for cls in ("gemm", "attention_prefill", "attention_decode"):
        eff = hw.efficiency.of(cls)
        assert eff.compute.source == eff.memory.source == "measured" and "held-out error median" in eff.compute.note
        assert eff.floor_s is not None and eff.floor_s.source == "measured"
        assert 0 < tables.held_out_error[cls]["median"] < 0.1  # type: ignore[index]
        assert hw.provenance.held_out_error and cls in hw.provenance.held_out_error
    assert hw.efficiency.elementwise.compute.source == ASSUMPTION  # not in the database
    sources = {hw.overheads.per_iteration_s.source, hw.overheads.per_sequence_s.source}
    assert all(s.startswith("engine:") for s in sources)  # the engine's preset, cited
    origin = hw.origin()
    assert origin.startswith(f"measured: aiconfigurator-core 0.12.0 {tables.system} {tables.framework}")
    assert "engine preset" in origin


@pytest.mark.parametrize("name", DATASHEETS)
def test_builtin_profiles_load_and_cite_every_datasheet_number(name: str) -> None:
    hw = load_hardware(name)
    assert hw.name == name and hw.kind == "datasheet"
    sources = set(hw.provenance.sources)
    device_numbers = [hw.memory_capacity_gib, hw.memory_bandwidth_gbps, hw.interconnect.bandwidth_gbps]
    device_numbers += list(hw.peak_tflops.values())
    for q in device_numbers:
        assert q.source in sources and q.value > 0
    assert all(("http" in s or "datasheet" in s.lower()) for s in hw.provenance.sources.values())
    # the efficiencies are assumptions until calibrated
    for cls in ("gemm", "attention_prefill", "attention_decode", "elementwise"):
        assert hw.efficiency.of(cls).compute.source == ASSUMPTION
        assert hw.efficiency.of(cls).memory.source == ASSUMPTION
    assert hw.peak_flops("bfloat16") >= hw.peak_flops("float32")


def test_datasheet_numbers_of_h100_sxm() -> None:
    hw = load_hardware("H100-SXM")  # case-insensitive
    assert hw.peak_flops("bfloat16") == 989.5e12  # dense: half the datasheet's 1,979 with sparsity
    assert hw.peak_flops("fp8") == 1979e12
    assert hw.bandwidth == 3.35e12
    assert hw.memory_bytes == 80 * 2**30


@pytest.mark.parametrize("name", DEVICES)
def test_ridge_point_is_peak_flops_over_bandwidth(name: str) -> None:
    hw = load_hardware(name)
    assert hw.ridge_point("bfloat16") == hw.peak_flops("bfloat16") / hw.bandwidth
    assert hw.ridge_point() == pytest.approx(
        hw.peak_tflops["bf16"].value * 1e12 / (hw.memory_bandwidth_gbps.value * 1e9)
    )


def test_a100_has_no_fp8_rate() -> None:
    with pytest.raises(ValueError, match="no fp8 rate"):
        load_hardware("a100-80g").peak_flops("fp8")


def test_unknown_hardware_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown hardware 'tpu-v5'.*h100-sxm"):
        load_hardware("tpu-v5")
    with pytest.raises(ValueError, match="does not exist"):
        load_hardware("/no/such/profile.yaml")


def test_a_profile_by_path_yaml_or_json(tmp_path) -> None:
    data = profile_data()
    data["name"] = "my-h100"
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "mine.json").write_text(json.dumps(data))
    assert load_hardware(str(tmp_path / "mine.yaml")).name == "my-h100"
    assert load_hardware(str(tmp_path / "mine.json")) == load_hardware(str(tmp_path / "mine.yaml"))


def test_dropped_in_profiles_are_found_by_name(tmp_path, monkeypatch) -> None:
    data = profile_data("a100-80g")
    data["name"] = "lab-a100"
    (tmp_path / "lab-a100.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("FERRY_HWPROFILES", str(tmp_path))
    assert "lab-a100" in builtin_hardware()
    assert load_hardware("lab-a100").name == "lab-a100"


def _broken(edit) -> dict[str, Any]:
    data = copy.deepcopy(profile_data())
    edit(data)
    return data


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(kind="measured"), "kind"),
        (lambda d: d.update(colour="green"), "colour: Extra inputs are not permitted"),
        (lambda d: d["efficiency"]["gemm"]["compute"].update(max=1.5), "efficiency.gemm.compute.max"),
        (lambda d: d["efficiency"]["gemm"]["memory"].update(half_size=-1), "efficiency.gemm.memory.half_size"),
        (lambda d: d["peak_tflops"].pop("bf16"), "needs fp32, bf16 and fp16"),
        (lambda d: d["peak_tflops"]["bf16"].update(source="a-blog"), "peak_tflops.bf16.source='a-blog'"),
        (lambda d: d["memory_bandwidth_gbps"].update(source=ASSUMPTION), "memory_bandwidth_gbps is a device rate"),
        (lambda d: d.update(kind="calibrated"), "provenance.device"),
        (lambda d: d["overheads"].pop("per_sequence_s"), "overheads.per_sequence_s: Field required"),
        (lambda d: d["memory_capacity_gib"].update(value="lots"), "memory_capacity_gib.value"),
    ],
)
def test_bad_profiles_name_the_field(edit, message: str) -> None:
    with pytest.raises(ValueError, match="invalid hardware profile") as info:
        parse_hardware(_broken(edit), "test.yaml")
    assert message in str(info.value)


def test_a_calibrated_profile_with_its_provenance_loads() -> None:
    def calibrate(d: dict[str, Any]) -> None:
        d["kind"] = "calibrated"
        d["provenance"].update(
            device="NVIDIA H100 80GB HBM3",
            software={"torch": "2.4.0", "cuda": "12.4"},
            date="2025-01-01",
            measurements="hwprofiles/h100-sxm-kernels.csv",
        )
        d["efficiency"]["gemm"]["compute"].update(max=0.71, source="measured")

    hw = parse_hardware(_broken(calibrate))
    assert isinstance(hw, HardwareProfile) and hw.kind == "calibrated"


def test_invalid_yaml_file(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_hardware(str(path))
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        load_hardware(str(path))


@pytest.mark.parametrize("name", DATASHEETS)
def test_assumed_curves_follow_the_stated_rule(name: str) -> None:
    """A datasheet profile's assumed efficiency curves pay ~4 us per kernel: half_size = 4 us x rate x max, the rate
    being the bf16 peak (the fp32 peak for elementwise kernels) or the memory bandwidth. A profile copied from another
    device without recomputing them fails here."""
    hw = load_hardware(name)
    for cls in ("gemm", "attention_prefill", "attention_decode", "elementwise"):
        peak = hw.peak_flops("float32" if cls == "elementwise" else "bfloat16")
        for side, rate in (("compute", peak), ("memory", hw.memory_bandwidth_gbps.value * 1e9)):
            curve = getattr(hw.efficiency.of(cls), side)
            assert curve.half_size == pytest.approx(4e-6 * rate * curve.max, rel=0.02), (cls, side)
