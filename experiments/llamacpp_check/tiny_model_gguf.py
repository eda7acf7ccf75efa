"""A Llama with random weights in GGUF, for ``llama-server``: the shapes of ``tiny_model_vllm.py``'s presets, written
with the ``gguf`` package that ships inside the llama.cpp it is served by (``install_server.sh`` copies its
``gguf-py`` beside the server; ``real_server.build_model`` puts it on ``PYTHONPATH``). Downloads nothing.

    PYTHONPATH=.llamacpp/gguf-py python experiments/llamacpp_check/tiny_model_gguf.py OUT_DIR \\
        [--preset tiny|wide] [--seed 0] [--dtype bfloat16|float16]

Writes ``OUT_DIR/model.gguf`` and ``OUT_DIR/config.json`` (the HF config ``tiny_model_vllm.config_of`` gives for the
preset: what ``ferry probe --model-config`` counts FLOPs and bytes from). The GGUF holds what llama.cpp's ``llama``
architecture reads (``src/llama-model.cpp``, ``LLM_ARCH_LLAMA``): the sizes, ``rms_norm_eps`` 1e-5, RoPE base 10000
over the whole head, and the tensors ``token_embd``, ``blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
ffn_norm, ffn_gate, ffn_up, ffn_down}``, ``output_norm``, ``output``. Matrices are in ``--dtype`` (bfloat16 by
default: GGML's ``BF16``, file type ``MOSTLY_BF16``), the norms' weights in float32 (as llama.cpp's converter keeps
1-D tensors). Weights are drawn from ``numpy.random.default_rng(seed)``, normal with the config's
``initializer_range`` (0.02), norms 1: the same arguments give the same file.

The vocabulary is a SentencePiece one (``tokenizer.ggml.model = llama``) of ``vocab_size`` pieces: ``<unk>``,
``<s>``, ``</s>`` (ids 0-2, as in ``tiny_model_vllm.py``), then ``▁w<i>`` for id i, every one a whole word. It has
no byte pieces (``<0x..>``) on purpose: a byte piece above 0x7f is half a UTF-8 character, which llama-server holds
back until the character completes (``tools/server/server-context.cpp``, ``process_token``: no chunk is streamed for
it), so a random model that emitted one would stream two tokens in one chunk. No BOS is added to a prompt
(``add_bos_token`` false): a prompt of token ids is computed as sent. Its tokens are meaningless; its timing is that
of a real Llama of its shape.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from experiments.vllm_check.tiny_model_vllm import PRESETS, SPECIAL, config_of

DTYPES = ("bfloat16", "float16")
WORD = "\u2581w{}"  # SentencePiece's word boundary, then w<i>: piece i reads " w<i>"


def _matrix(rng: np.random.Generator, rows: int, cols: int, std: float) -> np.ndarray:
    return rng.normal(0.0, std, size=(rows, cols)).astype(np.float32)


def tensors(config: dict[str, Any], seed: int) -> list[tuple[str, np.ndarray]]:
    """The model's tensors in GGUF names, float32, shaped as PyTorch's ``(out_features, in_features)`` (the writer
    reverses them into GGML's order), drawn in a fixed order from ``seed``."""
    rng = np.random.default_rng(seed)
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head = hidden // config["num_attention_heads"]
    kv = head * config["num_key_value_heads"]
    std = float(config["initializer_range"])
    ones = np.ones(hidden, dtype=np.float32)
    out = [("token_embd.weight", _matrix(rng, vocab, hidden, std))]
    for n in range(config["num_hidden_layers"]):
        out += [
            (f"blk.{n}.attn_norm.weight", ones),
            (f"blk.{n}.attn_q.weight", _matrix(rng, hidden, hidden, std)),
            (f"blk.{n}.attn_k.weight", _matrix(rng, kv, hidden, std)),
            (f"blk.{n}.attn_v.weight", _matrix(rng, kv, hidden, std)),
            (f"blk.{n}.attn_output.weight", _matrix(rng, hidden, hidden, std)),
            (f"blk.{n}.ffn_norm.weight", ones),
            (f"blk.{n}.ffn_gate.weight", _matrix(rng, inter, hidden, std)),
            (f"blk.{n}.ffn_up.weight", _matrix(rng, inter, hidden, std)),
            (f"blk.{n}.ffn_down.weight", _matrix(rng, hidden, inter, std)),
        ]
    out += [("output_norm.weight", ones), ("output.weight", _matrix(rng, vocab, hidden, std))]
    return out


def write(out: Path, config: dict[str, Any], seed: int) -> int:
    """Write ``out/model.gguf`` and ``out/config.json``; returns the parameter count."""
    import gguf

    out.mkdir(parents=True, exist_ok=True)
    half = gguf.GGMLQuantizationType.BF16 if config["torch_dtype"] == "bfloat16" else gguf.GGMLQuantizationType.F16
    ftype = gguf.LlamaFileType.MOSTLY_BF16 if half == gguf.GGMLQuantizationType.BF16 else gguf.LlamaFileType.MOSTLY_F16
    hidden, heads, vocab = config["hidden_size"], config["num_attention_heads"], config["vocab_size"]
    path = out / "model.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"ferry random Llama ({hidden}x{config['num_hidden_layers']})")
    w.add_file_type(int(ftype))
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    w.add_rope_freq_base(float(config["rope_theta"]))
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list([*SPECIAL, *(WORD.format(i) for i in range(len(SPECIAL), vocab))])
    w.add_token_scores([0.0] * len(SPECIAL) + [-float(i) for i in range(len(SPECIAL), vocab)])
    kinds = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    w.add_token_types([int(k) for k in kinds] + [int(gguf.TokenType.NORMAL)] * (vocab - len(SPECIAL)))
    w.add_unk_token_id(0)
    w.add_bos_token_id(config["bos_token_id"])
    w.add_eos_token_id(config["eos_token_id"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    n = 0
    for name, t in tensors(config, seed):
        n += t.size
        if t.ndim == 1:
            w.add_tensor(name, t)
        else:
            w.add_tensor(name, gguf.quants.quantize(t, half), raw_dtype=half)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="folder to write model.gguf and config.json into")
    p.add_argument("--preset", default="tiny", help=f"sizes: {', '.join(PRESETS)} (default tiny)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--dtype", default="bfloat16", help=f"the matrices' dtype: {', '.join(DTYPES)} (default bfloat16)")
    args = p.parse_args(argv)
    try:
        if args.dtype not in DTYPES:
            raise ValueError(f"--dtype {args.dtype!r}: one of {', '.join(DTYPES)}")
        config = config_of(args.preset, {}, args.dtype)
    except ValueError as exc:
        print(f"tiny_model_gguf: error: {exc}", file=sys.stderr)
        return 2
    n = write(args.out, config, args.seed)
    print(json.dumps({"out": str(args.out), "parameters": n, "config": config}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
