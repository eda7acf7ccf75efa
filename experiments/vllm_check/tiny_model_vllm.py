"""A Llama checkpoint with random weights and an offline tokenizer, for ``vllm serve`` on a CPU: runs in the vLLM venv
(``transformers``, ``tokenizers``, ``torch``), never imports ferry, downloads nothing.

    .venv-vllm/bin/python experiments/vllm_check/tiny_model_vllm.py OUT_DIR [--preset tiny|wide] [--seed 0]
        [--hidden-size N] [--intermediate-size N] [--num-hidden-layers N] [--num-attention-heads N]
        [--num-key-value-heads N] [--vocab-size N] [--max-position-embeddings N] [--dtype bfloat16]

Writes ``OUT_DIR/config.json``, ``model.safetensors`` and a word-level tokenizer (``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``): token ``w<i>`` is id ``i``, ids 0-2 are ``<unk>``, ``<s>``,
``</s>``. The weights are drawn from ``torch.manual_seed(seed)`` with the config's ``initializer_range``: the same
arguments give the same files. Its tokens are meaningless; its timing is that of a real Llama of its shape.

Presets (sizes in the config's units: features, layers, heads, tokens):

=======  ======  ============  ======  =====  ========  =====  ===========
preset   hidden  intermediate  layers  heads  kv heads  vocab  parameters
=======  ======  ============  ======  =====  ========  =====  ===========
tiny     256     768           4       4      2         8192   ~7.4 M
wide     1024    2816          4       16     4         8192   ~62 M
=======  ======  ============  ======  =====  ========  =====  ===========

The vocabulary is at least 8000 ids, the range ferry's client draws its token-id prompts from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PRESETS: dict[str, dict[str, int]] = {
    "tiny": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 8192,
        "max_position_embeddings": 4096,
    },
    "wide": {
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "vocab_size": 8192,
        "max_position_embeddings": 4096,
    },
}
SIZES = tuple(PRESETS["tiny"])
SPECIAL = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2
MIN_VOCAB = 8000  # ferry's client draws token-id prompts from [100, 8000)


def config_of(preset: str, overrides: dict[str, int | None], dtype: str) -> dict[str, Any]:
    """The Llama ``config.json`` of ``preset`` with ``overrides`` (None: the preset's). ValueError names the field."""
    if preset not in PRESETS:
        raise ValueError(f"--preset {preset!r}: one of {', '.join(PRESETS)}")
    sizes = PRESETS[preset] | {k: v for k, v in overrides.items() if v is not None}
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if sizes["hidden_size"] % sizes["num_attention_heads"]:
        raise ValueError(
            f"--hidden-size {sizes['hidden_size']} is not a multiple of --num-attention-heads "
            f"{sizes['num_attention_heads']}"
        )
    if sizes["num_attention_heads"] % sizes["num_key_value_heads"]:
        raise ValueError(
            f"--num-attention-heads {sizes['num_attention_heads']} is not a multiple of --num-key-value-heads "
            f"{sizes['num_key_value_heads']}"
        )
    if sizes["vocab_size"] < MIN_VOCAB:
        raise ValueError(f"--vocab-size must be >= {MIN_VOCAB} (ferry's token-id prompts), got {sizes['vocab_size']}")
    if dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"--dtype {dtype!r}: one of bfloat16, float16, float32")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **sizes,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": dtype,
    }


def write_tokenizer(out: Path, vocab_size: int, max_len: int) -> None:
    """A word-level tokenizer over ``w0 .. w<vocab_size-1>`` (the first ids named by ``SPECIAL``), split on spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {(SPECIAL[i] if i < len(SPECIAL) else f"w{i}"): i for i in range(vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL[0]))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token=SPECIAL[0],
        bos_token=SPECIAL[1],
        eos_token=SPECIAL[2],
        model_max_length=max_len,
    )
    fast.save_pretrained(str(out))


def build(out: Path, config: dict[str, Any], seed: int) -> int:
    """Write the checkpoint and tokenizer into ``out``; returns the parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**config)).to(getattr(torch, config["torch_dtype"]))
    model.save_pretrained(str(out), safe_serialization=True)
    # save_pretrained may restate the config in its own words; keep ours (what vLLM and ferry read)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer(out, config["vocab_size"], config["max_position_embeddings"])
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="folder to write the checkpoint into")
    p.add_argument("--preset", default="tiny", help=f"sizes to start from: {', '.join(PRESETS)} (default tiny)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--dtype", default="bfloat16", help="the weights' dtype (default bfloat16)")
    for name in SIZES:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help="override the preset's")
    args = p.parse_args(argv)
    try:
        config = config_of(args.preset, {n: getattr(args, n) for n in SIZES}, args.dtype)
    except ValueError as exc:
        print(f"tiny_model_vllm: error: {exc}", file=sys.stderr)
        return 2
    n = build(args.out, config, args.seed)
    print(json.dumps({"out": str(args.out), "parameters": n, "config": config}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
