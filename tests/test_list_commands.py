"""`ferry models` and `ferry hardware`: every built-in is listed, each number is the cost model's own (a model's KV
bytes per token is what ``CostModel`` charges, a profile's rates and origin are what ``load_hardware`` reads),
``--json`` parses, and neither loads the engine or pandas. The glossary under `ferry run`'s table: one line per
group of terms it shows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from costmodel.hardware import builtin_hardware, load_hardware
from costmodel.model_spec import builtin_models, load_model
from costmodel.prices import load_prices, price_of
from costmodel.roofline import CostModel
from experiments.cli import main

ROOT = Path(__file__).resolve().parents[1]


def listed(capsys: pytest.CaptureFixture, *argv: str) -> list[dict]:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_built_in_model_is_listed_with_the_cost_models_numbers(capsys: pytest.CaptureFixture) -> None:
    rows = {r["name"]: r for r in listed(capsys, "models")}
    assert sorted(rows) == builtin_models()
    keys = set(next(iter(rows.values())))
    assert all(set(r) == keys for r in rows.values())  # the same keys for every model
    device = load_hardware("b200.datasheet")  # every weight format has a rate there (nvfp4 too)
    for name, row in rows.items():
        m = load_model(name)
        cm = CostModel(m, device, tables=False)
        assert row["kv_bytes_per_token"] == cm.kv_bytes_per_token(), name  # one GPU holds every layer's KV
        assert row["params"] == m.num_params() and row["active_params"] == m.num_active_params()
        assert row["max_context"] == m.max_position_embeddings and row["layers"] == m.num_hidden_layers
        assert row["dtype"] == cm.dtypes.activation and row["weight_format"] == cm.dtypes.weight
        assert row["weight_bytes"] == pytest.approx(cm.weight_bytes_per_gpu(), rel=1e-9)
    # the figures the model spec's docstring works out by hand
    assert rows["llama-3-8b"]["kv_bytes_per_token"] == 131072 and rows["llama-2-7b"]["kv_bytes_per_token"] == 524288
    assert rows["deepseek-v3"]["kv_bytes_per_token"] == 70272 and rows["gpt-oss-120b"]["kv_bytes_per_token"] == 36864
    assert rows["mixtral-8x7b"].items() >= {"experts": 8, "experts_per_token": 2, "shared_experts": False}.items()
    assert rows["llama-3-8b"]["experts"] is None and rows["llama-3-8b"]["active_params"] == rows["llama-3-8b"]["params"]
    assert (rows["deepseek-v3"]["attention"], rows["llama-2-7b"]["attention"], rows["llama-3-8b"]["attention"]) == (
        "mla", "mha", "gqa")  # fmt: skip
    assert rows["gpt-oss-120b"]["window_layers"] == 18 and rows["llama-4-scout"]["window_kind"] == "chunked"


def test_the_models_table(capsys: pytest.CaptureFixture) -> None:
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines[2:] if line and not line.startswith("attention:")]
    assert names == builtin_models()
    row = {line.split()[0]: line for line in lines}
    assert "MLA 128, latent 512+64" in row["deepseek-v3"] and "256 top-8 +shared (58/61 layers)" in row["deepseek-v3"]
    assert "GQA 32/8" in row["llama-3-8b"] and " 128 KiB " in row["llama-3-8b"] and " 8,192 " in row["llama-3-8b"]
    assert "GQA 64/8, window 128 (18/36 layers)" in row["gpt-oss-120b"]


def test_every_built_in_profile_is_listed_as_it_is_read(capsys: pytest.CaptureFixture) -> None:
    rows = listed(capsys, "hardware")
    assert sorted(r["name"] for r in rows) == builtin_hardware()
    prices = load_prices()
    for row in rows:
        h = load_hardware(row["name"])
        assert row["memory_gib"] == h.memory_capacity_gib.value and row["kind"] == h.kind
        assert row["peak_tflops"] == {k: q.value for k, q in h.peak_tflops.items()}
        assert row["memory_bandwidth_gbps"] == h.memory_bandwidth_gbps.value
        assert row["link_bandwidth_gbps"] == h.interconnect.bandwidth_gbps.value
        assert row["domain_gpus"] == h.interconnect.domain_gpus and row["origin"] == h.origin()
        assert row["usd_per_gpu_hour"] == price_of(prices, row["name"]).usd_per_gpu_hour
    by_name = {r["name"]: r for r in rows}
    assert by_name["gb200"]["domain_gpus"] == 72 and by_name["h100-sxm"]["peak_tflops"]["fp8"] == 1979
    assert by_name["h100-sxm"]["numbers"].startswith("measured vllm ")
    assert by_name["h100-sxm.datasheet"]["numbers"].startswith("datasheet")
    assert by_name["h100-sxm.vidur"]["numbers"].startswith("calibrated: ")
    # grouped by device, its default profile first
    devices = [r["device"] for r in rows]
    assert devices == sorted(devices)
    for device in set(devices):
        assert next(r for r in rows if r["device"] == device)["variant"] == ""


def test_hardware_narrowed_to_devices_prints_each_origin(capsys: pytest.CaptureFixture) -> None:
    assert main(["hardware", "h100-sxm", "mi300x"]) == 0
    out = capsys.readouterr().out
    assert f"  h100-sxm: {load_hardware('h100-sxm').origin()}" in out
    assert "h100-sxm.sglang" in out and "mi300x" in out and "b200" not in out
    assert main(["hardware", "no-such-gpu"]) == 2
    assert "unknown hardware no-such-gpu; built-ins: a100-40g" in capsys.readouterr().err


def test_both_print_without_the_engine_or_pandas() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from experiments.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['models']) == 0 and main(['hardware', '--json']) == 0\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('numba', 'pandas', 'sim', 'simpy', 'policies'))\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---- `ferry run`'s glossary ------------------------------------------------------------------------------------------


def test_the_run_table_glosses_its_terms(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from experiments.commands.summary_table import terms

    args = ["--num-prompts", "20", "--request-rate", "8", "--input-len", "64", "--output-len", "8"]
    assert (
        main(["run", "--model", "llama-3-8b", "--hardware", "h100-sxm.datasheet", *args, "--out", str(tmp_path)]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    rule = max(k for k, line in enumerate(lines) if set(line) == {"="})
    notes = [line for line in lines[rule + 1 :] if line.startswith("*")]
    assert len(notes) == 2 and lines[rule + 1 : rule + 3] == notes  # right under the table
    assert "seat utilization: " in notes[0] and "held seats: " in notes[0]
    assert "engine: " in notes[1] and "ITL exact: every token gap kept" in notes[1]
    assert notes[1].endswith("(docs/concepts/glossary.md)")
    # only the terms whose rows the table has
    assert terms({"Engine"}, "histogram (quantiles within 0.5%)") == [
        "* engine: the simulator loop that ran (reference or compiled, same records); ITL histogram (quantiles "
        "within 0.5%): the token gaps binned, not kept each (docs/concepts/glossary.md)"
    ]
    assert terms({"Seat utilization"}, "exact") == [
        "* seat utilization: share of the seats taken by requests still generating (docs/concepts/glossary.md)"
    ]
    assert terms(set(), "exact") == []
