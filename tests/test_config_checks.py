"""Impossible or mistyped values in a model's config.json, a hardware profile and the flags that size a shape: each
is refused where it is read, in one line naming the field and the value, with status 2, by every command that reads
it (`ferry iteration`, `run`, `plan`, `roofline`), never a traceback and never a run on numbers read as something
else. The configs are the published ones of each family (``tests.test_model_families``) with one field changed."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from costmodel import CostModel, load_hardware, load_model
from experiments.cli import main
from tests.test_model_families import DEEPSEEK_V3, LLAMA4_SCOUT, QWEN3_MOE

DENSE: dict[str, Any] = {
    "model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}  # fmt: skip
COMPRESSED = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}


def _scout(**text: Any) -> dict[str, Any]:
    return {**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"], **text}}


# (config, what the one line must name)
CASES = {
    # tracebacks before
    "deepseek moe_layer_freq 0": ({**DEEPSEEK_V3, "moe_layer_freq": 0}, "moe_layer_freq=0"),
    "qwen-moe decoder_sparse_step 0": ({**QWEN3_MOE, "decoder_sparse_step": 0}, "decoder_sparse_step=0"),
    "compressed-tensors weights as a list": (
        {**DENSE, "quantization_config": {**COMPRESSED, "config_groups": {"group_0": {"weights": [{"num_bits": 4}]}}}},
        "config_groups' weights must be objects",
    ),
    "compressed-tensors group as a list": (
        {**DENSE, "quantization_config": {**COMPRESSED, "config_groups": {"group_0": [{"num_bits": 4}]}}},
        "config_groups must map group names to objects",
    ),
    "Infinity as a size": ({**DENSE, "hidden_size": float("inf")}, "hidden_size=inf"),
    "llama-4 no_rope_layers too short": (_scout(no_rope_layers=[1, 1, 0]), "no_rope_layers must list"),
    "numeric torch_dtype": ({**DENSE, "torch_dtype": 16}, "torch_dtype=16"),
    # read as something else before
    "negative expert width": ({**DEEPSEEK_V3, "moe_intermediate_size": -2048}, "moe_intermediate_size=-2048"),
    "zero expert width": ({**QWEN3_MOE, "moe_intermediate_size": 0}, "moe_intermediate_size=0"),
    "negative expert count": ({**DEEPSEEK_V3, "n_routed_experts": -8}, "n_routed_experts=-8"),
    "no expert per token": ({**QWEN3_MOE, "num_experts_per_tok": 0}, "num_experts_per_tok=0"),
    "kv_lora_rank 0": ({**DEEPSEEK_V3, "kv_lora_rank": 0}, "kv_lora_rank=0"),
    "kv_lora_rank negative": ({**DEEPSEEK_V3, "kv_lora_rank": -512}, "kv_lora_rank=-512"),
    "negative qk_nope_head_dim": ({**DEEPSEEK_V3, "qk_nope_head_dim": -128}, "qk_nope_head_dim=-128"),
    "negative v_head_dim": ({**DEEPSEEK_V3, "v_head_dim": -128}, "v_head_dim=-128"),
    "negative n_shared_experts": ({**DEEPSEEK_V3, "n_shared_experts": -1}, "n_shared_experts=-1"),
    "negative q_lora_rank": ({**DEEPSEEK_V3, "q_lora_rank": -1536}, "q_lora_rank=-1536"),
    "negative first_k_dense_replace": ({**DEEPSEEK_V3, "first_k_dense_replace": -3}, "first_k_dense_replace=-3"),
    "negative decoder_sparse_step": ({**QWEN3_MOE, "decoder_sparse_step": -1}, "decoder_sparse_step=-1"),
    "negative sliding_window": ({**DENSE, "sliding_window": -4096}, "sliding_window=-4096"),
    "negative attention_chunk_size": (_scout(attention_chunk_size=-8192), "attention_chunk_size=-8192"),
    "negative vocab_size": ({**DENSE, "vocab_size": -1000}, "vocab_size=-1000"),
    "vocab_size 0": ({**DENSE, "vocab_size": 0}, "vocab_size=0"),
    "modules_to_not_convert as a string": (
        {**DENSE, "quantization_config": {"quant_method": "fp8", "modules_to_not_convert": "lm_head"}},
        "modules_to_not_convert must be a list",
    ),
    "moe_layer_freq as strings": ({**DEEPSEEK_V3, "moe_layer_freq": ["1"] * 61}, "moe_layer_freq[0]='1'"),
    # unclear before
    "bits as a word": ({**DENSE, "quantization_config": {"quant_method": "gptq", "bits": "four"}}, "bits='four'"),
    "NaN as a size": ({**DENSE, "intermediate_size": float("nan")}, "intermediate_size=nan"),
    "intermediate_size -1": ({**DENSE, "intermediate_size": -1}, "intermediate_size=-1 must be >= 1"),
    "max_position_embeddings 0": ({**DENSE, "max_position_embeddings": 0}, "max_position_embeddings=0 must be >= 1"),
}


def _write(tmp_path: Path, config: dict[str, Any]) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))  # Python's json writes inf and nan as JSON allows them
    return folder


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``ferry argv``: status 2 and one line on stderr, which is returned."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("case", list(CASES))
def test_an_impossible_model_field_is_refused_by_name(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    config, named = CASES[case]
    model = str(_write(tmp_path, config))
    with pytest.raises(ValueError, match="config.json") as info:
        load_model(model)
    assert named in str(info.value) and "\n" not in str(info.value)
    err = _refused(["iteration", "--model", model, "--hardware", "h100-sxm", "--decode", "1@128"], capsys)
    assert named in err and err.startswith("ferry iteration: error: model 'model'"), err


@pytest.mark.parametrize("case", ["deepseek moe_layer_freq 0", "negative expert width", "numeric torch_dtype"])
def test_run_and_plan_refuse_it_alike(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same line from `ferry run` and from `ferry plan`, before any simulation (plan: status 2, not a candidate
    dropped with exit 0)."""
    config, named = CASES[case]
    model = str(_write(tmp_path, config))
    run = _refused(["run", "--model", model, "--num-prompts", "2", "--out", str(tmp_path / "run")], capsys)
    plan = _refused(["plan", "--model", model, "--request-rate", "2", "--num-prompts", "10", "--slo",
                     "ttft_p99_ms=2000", "--out", str(tmp_path / "plan")], capsys)  # fmt: skip
    assert named in run and named in plan
    assert not (tmp_path / "run").exists() and not (tmp_path / "plan").exists()


def test_a_profile_number_that_is_not_finite_is_refused_by_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    text = (Path(__file__).parents[1] / "hwprofiles" / "h100-sxm.yaml").read_text()
    assert "memory_capacity_gib:\n  value: 80.0" in text
    for i, bad in enumerate((".inf", ".nan")):
        profile = tmp_path / f"h100-{i}.yaml"
        profile.write_text(text.replace("memory_capacity_gib:\n  value: 80.0", f"memory_capacity_gib:\n  value: {bad}"))
        err = _refused(["run", "--hardware", str(profile), "--num-prompts", "2", "--out", str(tmp_path / "o")], capsys)
        assert "memory_capacity_gib.value" in err and "finite" in err, err


def test_roofline_context_beyond_the_model_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """As `ferry iteration` refuses it; a context too large for a C long included."""
    for context in ("1000000000000000000000", "100000000", "8192"):
        err = _refused(["roofline", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--context", context, "--out",
                        str(tmp_path / "r.png")], capsys)  # fmt: skip
        assert f"--context {context}" in err and "max_position_embeddings=8192" in err, err
    assert main(["roofline", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--context", "8191", "--out",
                 str(tmp_path / "r.png")]) == 0  # fmt: skip


def test_a_plan_whose_every_candidate_cannot_run_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every candidate dropped before a simulation (70B weights on one 80 GB GPU): the table says why, plan.json
    keeps it, and the status is 2 with one line, as the docs promise, not 0."""
    argv = ["plan", "--model", "llama-3-70b", "--hardware", "a100-80g", "--request-rate", "2", "--num-prompts", "10",
            "--slo", "ttft_p99_ms=2000", "--jobs", "1", "--out", str(tmp_path / "plan")]  # fmt: skip
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "does not fit" in captured.out
    err = captured.err.strip().splitlines()[-1]
    assert err.startswith("ferry plan: error: llama-3-70b: no candidate could run (a100-80g: "), err
    assert "does not fit" in err, err
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())["candidates"][0]["reason"].startswith("does not")


@pytest.mark.parametrize(
    "argv",
    [["calibrate", "--from-aiconfigurator", "h100_sxm", "--framework", "vllm"],
     ["probe", "--url", "http://127.0.0.1:9/v1", "--model", "tiny-llama"],  # nothing listens there: never reached
     ["calibrate", "--from-iterations", "missing.csv", "--model", "tiny-llama", "--base", "h100-sxm"],
     ["run", "--num-prompts", "2"]],
)  # fmt: skip
def test_an_out_that_cannot_be_written_is_refused_before_the_work(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    """Under a file, or on a file system that takes no file (/proc): one line naming --out, before the fit, the
    experiments or the simulation (which would otherwise be lost)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    name = "run" if argv[0] == "run" else "p.yaml"
    places = ((a_file / name, "is a file, where a folder must be"), (Path("/proc/ferry") / name, "cannot write"))
    for out, why in places:
        err = _refused([*argv, "--out", str(out)], capsys)
        assert err.startswith(f"ferry {argv[0]}: error: --out {out}: ") and why in err, err


# ---- profiles that name measured kernel tables -------------------------------------------------------------------

PROFILES = Path(__file__).parents[1] / "hwprofiles"
has_tables = importlib.util.find_spec("aiconfigurator_core") is not None


def _profile(tmp_path: Path, base: str, old: str, new: str) -> str:
    """``base``'s profile with ``old`` replaced by ``new`` in its kernel_tables block."""
    text = (PROFILES / f"{base}.yaml").read_text()
    head, tables = text.split("\nkernel_tables:\n")
    assert old in tables
    path = tmp_path / f"{base}.yaml"
    path.write_text(head + "\nkernel_tables:\n" + tables.replace(old, new, 1))
    return str(path)


@pytest.mark.skipif(not has_tables, reason="aiconfigurator-core is not installed (pip install 'ferry[measured]')")
@pytest.mark.parametrize(
    ("old", "new", "lacks"),
    [("  version: 0.24.0\n", "  version: 9.9.9\n", "no h100_sxm vllm 9.9.9 gemm_perf table"),
     ("  system: h100_sxm\n", "  system: nosuch\n", "no system 'nosuch'"),
     ("  comm_version: 0.24.0\n", "  comm_version: 0.0.1\n", "no h100_sxm vllm 0.0.1 custom_allreduce_perf table")],
)  # fmt: skip
def test_a_profile_says_its_tables_are_not_used_when_the_database_lacks_them(
    tmp_path: Path, old: str, new: str, lacks: str
) -> None:  # fmt: skip
    """Tables the installed database lacks (a system, an engine version, an all-reduce version): the profile's origin
    says they are not here and the fitted curves time the kernels, as the cost model does (it said "interpolated")."""
    hw = load_hardware(_profile(tmp_path, "h100-sxm", old, new))
    origin = hw.origin()
    assert "not here" in origin and lacks in origin and "interpolated" not in origin, origin
    cost = CostModel(load_model("llama-3-8b"), hw, tp=2)
    assert cost.timing.startswith("the curves fitted to") and lacks in cost.timing, cost.timing
    assert load_hardware("h100-sxm").origin().startswith("measured: aiconfigurator-core 0.12.0 h100_sxm vllm 0.24.0")


@pytest.mark.parametrize(
    ("base", "old", "new", "said"),
    [("h100-sxm", "  package: aiconfigurator-core\n", "  package: other-db\n", "kernel_tables.package"),
     ("a100-80g", "  system: a100_sxm\n", "  system: b200_sxm\n", "holds b200's kernels, and this profile (a100-80g)"),
     ("h100-sxm", "      median: 0.028761826843327065\n", "      median: -0.5\n", "held_out_error.gemm.median=-0.5")],
)  # fmt: skip
def test_a_profile_claiming_tables_it_cannot_use_is_refused(
    tmp_path: Path, base: str, old: str, new: str, said: str
) -> None:  # fmt: skip
    """A package other than the one ferry reads (it was printed and ignored), another GPU's tables (an A100 timed from
    B200 kernels without a word), a negative held-out error (printed as -100%): refused, naming the field."""
    with pytest.raises(ValueError, match=re.escape(said)):
        load_hardware(_profile(tmp_path, base, old, new))


@pytest.mark.parametrize("flag", ["nvfp4", "fp4", "mxfp4"])
def test_a_4_bit_float_format_on_an_unquantized_checkpoint_is_refused(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    """vLLM makes NVFP4 or MXFP4 weights only from a checkpoint quantized offline: `--quantization nvfp4` on a bf16
    checkpoint (accepted before, and on an H100 timed as 4-bit weights without a word) is refused by every command."""
    for argv in (["run", "--num-prompts", "2", "--out", str(tmp_path / "r")],
                 ["iteration", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--decode", "1@128"]):  # fmt: skip
        err = _refused([*argv, "--quantization", flag], capsys)
        assert "only from a checkpoint quantized offline" in err and "llama-3-8b's holds bfloat16" in err, err
