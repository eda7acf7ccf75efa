"""`ferry iteration`, `ferry roofline` and `ferry validate-kernels` (on tiny CSVs in Vidur's format, written here)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import pytest

from costmodel import CostModel, IterationShape, ModelSpec, load_hardware, load_model
from experiments import iteration, roofline, validate_kernels


def ferry(argv: list[str]) -> int:
    """Run one of this issue's subcommands the way experiments.cli does (without the other commands' modules)."""
    parser = argparse.ArgumentParser(prog="ferry")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (iteration, roofline, validate_kernels):
        module.register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


BASE = ["iteration", "--model", "llama-3-8b", "--hardware", "h100-sxm"]


def test_iteration_json_contract(capsys) -> None:
    assert ferry([*BASE, "--prefill", "512@0", "--decode", "32@1024", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cm = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm"))
    assert out["time_s"] == cm.iteration_time(IterationShape.of(prefill=[(512, 0)], decode=[(32, 1024)]))
    names = [op["name"] for op in out["ops"]]
    assert {"qkv_proj", "o_proj", "mlp"} <= set(names)
    for op in out["ops"]:
        assert set(op) == {"name", "time_s", "flops", "bytes", "bound"}
        assert op["bound"] in ("compute", "memory")
    mlp = next(op for op in out["ops"] if op["name"] == "mlp")
    # all 32 layers of gate/up, activation and down over 544 tokens
    assert mlp["flops"] == pytest.approx(32 * 544 * (2 * 4096 * 2 * 14336 + 5 * 14336 + 2 * 14336 * 4096))
    assert out["model"] == "llama-3-8b" and out["tp"] == 1 and out["dtypes"]["kv_cache"] == "bfloat16"
    assert out["memory"]["fits"]
    plan = cm.memory_plan(max_num_batched_tokens=8192, max_num_seqs=1024)  # a default `vllm serve` on an H100
    assert out["memory"]["kv_cache_tokens"] == plan.max_tokens


@pytest.mark.parametrize(("model", "hardware", "tp"), [("llama-3-8b", "h100-sxm", 1), ("llama-3-70b", "a100-80g", 4)])
def test_iteration_and_run_report_one_kv_capacity(tmp_path, capsys, model: str, hardware: str, tp: int) -> None:
    """They disagreed (456,304 against 447,920 tokens for llama-3-8b on an H100): `ferry iteration` reserved
    activations for 2,048 tokens and 256 sequences, a default `ferry run` for vLLM's limits on the device."""
    assert ferry(["iteration", "--model", model, "--hardware", hardware, "--tp", str(tp), "--decode", "1@1",
                  "--json"]) == 0  # fmt: skip
    said = json.loads(capsys.readouterr().out)["memory"]["kv_cache_tokens"]
    from experiments.cli import main

    out = tmp_path / "run"
    assert main(["run", "--model", model, "--hardware", hardware, "-tp", str(tp), "--num-prompts", "5",
                 "--out", str(out)]) == 0  # fmt: skip
    memory = json.loads((out / "summary.json").read_text())["memory"]
    assert said == memory["num_gpu_blocks"] * memory["block_size"]


def test_iteration_says_when_the_model_does_not_fit(capsys) -> None:
    argv = ["iteration", "--model", "llama-3-70b", "--hardware", "a100-40g", "--decode", "1@1"]
    assert ferry(argv) == 0
    assert "DOES NOT FIT: llama-3-70b does not fit on a100-40g" in capsys.readouterr().out
    assert ferry([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["fits"] is False


def test_iteration_table(capsys) -> None:
    assert ferry([*BASE, "--decode", "1@1024", "--tp", "2", "--kv-cache-dtype", "fp8", "--quantization", "int4"]) == 0
    text = capsys.readouterr().out
    assert "predicted time:" in text and "memory-bound" in text
    for name in ("qkv_proj", "o_proj", "mlp", "attention_decode", "all-reduce x65", "host overhead"):
        assert name in text
    assert "KV cache fp8" in text and "weights int4" in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prefill", "512"], "expected NEW_TOKENS@CONTEXT"),
        (["--prefill", "0@0"], "at least 1"),
        (["--decode", "a@b"], "expected SEQUENCES@CONTEXT"),
        (["--decode", "8@-1"], "expected SEQUENCES@CONTEXT"),
        ([], "at least one --prefill"),
        (["--prefill", "4096@8000"], "max_position_embeddings=8192"),
        (["--decode", "1@1", "--dtype", "bf17"], "unknown dtype"),
        (["--decode", "1@1", "--tp", "3"], "tp=3"),
        (["--decode", "99999999999999999999@1"], "sequences in one iteration; at most"),  # numpy's words before
        (["--decode", "1@1", "--tp", "16"], "spans more than the 8 GPUs"),
    ],
)
def test_iteration_refuses_bad_input_clearly(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ferry([*BASE, *flags])


def test_roofline_writes_a_png(tmp_path, capsys) -> None:
    out = tmp_path / "fig" / "roofline.png"
    assert ferry(["roofline", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(out) in capsys.readouterr().out


def test_roofline_points_straddle_the_ridge() -> None:
    cm = CostModel(load_model("llama-3-8b"), load_hardware("h100-sxm"))
    pts = roofline.points(cm, 1024)
    assert all(p["intensity"] > cm.ridge_point for p in pts if p["kind"] == "prefill" and "128" not in p["label"])
    assert all(p["intensity"] < cm.ridge_point for p in pts if p["kind"] == "decode")


# ---------------------------------------------------------------------------------------------------------------------
# validate-kernels on a tiny Vidur-format directory

LLAMA2 = {"n_head": 32, "n_kv_head": 32, "n_embd": 4096, "n_expanded_embd": 11008, "vocab_size": 32000}
LINEAR_COLUMNS = {  # Vidur op -> ferry kernels it corresponds to (with instances)
    "attn_pre_proj": {"qkv_proj": 1},
    "attn_post_proj": {"o_proj": 1},
    "mlp_up_proj": {"mlp_gate_up": 1},
    "mlp_act": {"mlp_act": 1},
    "mlp_down_proj": {"mlp_down": 1},
    "input_layernorm": {"norm": 1},
    "post_attention_layernorm": {"norm": 1},
    "add": {},
    "attn_rope": {"rope": 1},
    "emb": {"embedding": 1},
}


def _ferry_ms(tokens: int, tp: int, hardware: str) -> dict[str, float]:
    spec = ModelSpec("Llama-2-7b-hf", 4096, 1, 32, 32, 128, 11008, 32000, 1 << 20, torch_dtype="float16")
    cm = CostModel(spec, load_hardware(hardware), tp=tp, dtype="float16")
    return {k.name: k.time_s * 1e3 for k in cm.kernels(IterationShape.of(prefill=[(tokens, 0)]))}


def write_vidur(root: Path, factor: float) -> None:
    """mlp.csv rows whose 'measured' times are ``factor`` x ferry's own prediction, plus an A40 file to skip."""
    for device, hardware in (("a100", "a100-80g.datasheet"), ("h100", "h100-sxm.datasheet")):
        rows = []
        for tokens, tp in ((1, 1), (64, 1), (512, 2), (4096, 4)):
            ms = _ferry_ms(tokens, tp, hardware)
            row: dict[str, float | int | bool] = {**LLAMA2, "use_gated_mlp": True, "num_tokens": tokens}
            row["num_tensor_parallel_workers"] = tp
            for col, kernels in LINEAR_COLUMNS.items():
                row[f"time_stats.{col}.median"] = factor * sum(n * ms[k] for k, n in kernels.items()) or 0.0
            rows.append(row)
        d = root / "compute" / device / "meta-llama" / "Llama-2-7b-hf"
        d.mkdir(parents=True)
        pd.DataFrame(rows).to_csv(d / "mlp.csv", index=False)
    a40 = root / "compute" / "a40" / "meta-llama" / "Llama-2-7b-hf"
    a40.mkdir(parents=True)
    (a40 / "mlp.csv").write_text("num_tokens\n1\n")


def write_vidur_attention(root: Path) -> None:
    spec = ModelSpec("attn", 8192, 1, 64, 8, 128, 28672, 32000, 1 << 20, torch_dtype="float16")
    cm = CostModel(spec, load_hardware("a100-80g.datasheet"), tp=2, dtype="float16")
    rows = []
    for prefill, batch, chunk, ctx in (
        (True, 1, 512, 0),
        (True, 1, 256, 1024),
        (False, 8, 0, 2048),
        (False, 64, 0, 100),
    ):
        s = IterationShape.of(prefill=[(chunk, ctx)]) if prefill else IterationShape.of(decode=[(batch, ctx)])
        op = "attention_prefill" if prefill else "attention_decode"
        ms = next(k.time_s for k in cm.kernels(s) if k.name == op) * 1e3
        rows.append(
            {
                "time_stats.attn_prefill.median": 3 * ms if prefill else None,
                "time_stats.attn_decode.median": None if prefill else 3 * ms,
                "n_embd": 8192,
                "n_q_head": 64,
                "n_kv_head": 8,
                "block_size": 16,
                "num_tensor_parallel_workers": 2,
                "max_model_len": 4096,
                "batch_size": batch,
                "prefill_chunk_size": chunk,
                "kv_cache_size": ctx,
                "is_prefill": prefill,
            }
        )
    pd.DataFrame(rows).to_csv(root / "compute" / "a100" / "attention-all-models.csv", index=False)


def test_validate_kernels_reports_relative_errors(tmp_path, capsys) -> None:
    write_vidur(tmp_path, factor=2.0)  # measured = 2 x predicted: ferry is 50% too fast everywhere
    write_vidur_attention(tmp_path)  # measured = 3 x predicted
    assert ferry(["validate-kernels", "--data", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    results = {(r["model"], r["hardware"], r["op"]): r for r in out["results"]}
    for hardware in ("a100-80g.datasheet", "h100-sxm.datasheet"):  # Vidur's devices are scored against datasheets
        for op in ("qkv_proj", "o_proj", "mlp", "rope", "embedding"):
            r = results[("meta-llama/Llama-2-7b-hf", hardware, op)]
            assert r["n"] == 4
            assert r["median_rel_error"] == pytest.approx(-0.5)
            assert r["median_abs_rel_error"] == pytest.approx(0.5)
            assert r["p90_abs_rel_error"] == pytest.approx(0.5)
    attn = {op: r for (m, hw, op), r in results.items() if m.startswith("attention")}
    assert attn["attention_prefill"]["n"] == 2 and attn["attention_decode"]["n"] == 2
    assert attn["attention_prefill"]["median_rel_error"] == pytest.approx(-2 / 3)
    assert attn["attention_decode"]["median_rel_error"] == pytest.approx(-2 / 3)
    assert any("a40" in s for s in out["skipped"])


def test_validate_kernels_table_and_filters(tmp_path, capsys) -> None:
    write_vidur(tmp_path, factor=1.0)
    assert ferry(["validate-kernels", "--data", str(tmp_path), "--model", "llama-2"]) == 0
    text = capsys.readouterr().out
    assert "meta-llama/Llama-2-7b-hf" in text and "qkv_proj" in text and "0.0%" in text
    with pytest.raises(ValueError, match="no measurements for models matching"):
        ferry(["validate-kernels", "--data", str(tmp_path), "--model", "gpt"])
    with pytest.raises(ValueError, match="no compute/ directory"):
        ferry(["validate-kernels", "--data", str(tmp_path / "nowhere")])
