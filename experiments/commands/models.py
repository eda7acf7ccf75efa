"""`ferry models`: the built-in models (``costmodel/models/*.json``) and their key facts, as ferry's cost model reads
them: parameters (total, and active for MoE), layers, hidden size, attention, KV-cache bytes per token at the
model's default dtype, the longest context, the formats, the experts.

Every number comes from ``costmodel.model_spec`` (``ModelSpec``'s own counts, the ones ``CostModel`` and the memory
plan use), not from the model cards; nothing here loads the engine or pandas, so the list prints at once."""

from __future__ import annotations

import argparse
import json
from typing import Any

from experiments.commands.listing import size, table

PARAMS = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1.0, ""))
BYTES = ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "models",
        help="list the built-in models with their parameters, attention, KV bytes per token and context",
        description="List every built-in model (--model NAME) with the facts ferry's cost model reads from its "
        "config: parameters (total; active per token for MoE), layers, hidden size, attention (GQA query/KV heads, "
        "MLA, sliding or chunked windows), KV-cache bytes per token at the model's default dtype, the longest "
        "context (max_position_embeddings), the formats under --dtype auto, and the routed experts.",
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of objects instead of the table")
    p.set_defaults(func=main)


def facts(name: str) -> dict[str, Any]:
    """One built-in model's facts, with stable keys (``--json``): counts in elements, sizes in bytes, lengths in
    tokens; ``None`` where the model has no such part (no experts, no window)."""
    from costmodel.model_spec import MODELS_DIR, load_model

    m = load_model(name)
    dtypes = m.dtypes()
    hf_id = json.loads((MODELS_DIR / f"{name}.json").read_text()).get("_name_or_path")
    window = m.window_layer_ids
    return {
        "name": name,
        "hf_id": hf_id,
        "params": m.num_params(),
        "active_params": m.num_active_params(),
        "layers": m.num_hidden_layers,
        "hidden_size": m.hidden_size,
        "attention": "mla" if m.is_mla else "mha" if m.num_key_value_heads == m.num_attention_heads else "gqa",
        "query_heads": m.num_attention_heads,
        "kv_heads": None if m.is_mla else m.num_key_value_heads,
        "head_dim": m.head_dim,
        "kv_lora_rank": m.kv_lora_rank or None,
        "qk_rope_head_dim": m.qk_rope_head_dim or None,
        "window": m.sliding_window if window else None,
        "window_kind": ("chunked" if m.chunked_attention else "sliding") if window else None,
        "window_layers": len(window),
        "kv_bytes_per_token": int(m.kv_bytes_per_token()),  # whole bytes: the KV formats are 1, 2 or 4 bytes
        "kv_cache_dtype": dtypes.kv_cache,
        "max_context": m.max_position_embeddings,
        "torch_dtype": m.torch_dtype,
        "dtype": dtypes.activation,
        "weight_format": dtypes.weight,
        "weight_bytes": round(m.weight_bytes(dtypes)),
        "experts": m.num_local_experts if m.is_moe else None,
        "experts_per_token": m.num_experts_per_tok if m.is_moe else None,
        "shared_experts": bool(m.shared_expert_intermediate_size) if m.is_moe else None,
        "moe_layers": len(m.moe_layer_ids),
    }


def all_facts() -> list[dict[str, Any]]:
    """Every built-in model's facts, by name."""
    from costmodel.model_spec import builtin_models

    return [facts(name) for name in builtin_models()]


def attention_text(f: dict[str, Any]) -> str:
    """``GQA 32/8`` (query/KV heads), ``MHA 32``, ``MLA 128, latent 512+64``; a window and the layers it covers."""
    if f["attention"] == "mla":
        text = f"MLA {f['query_heads']}, latent {f['kv_lora_rank']}+{f['qk_rope_head_dim']}"
    elif f["attention"] == "mha":
        text = f"MHA {f['query_heads']}"
    else:
        text = f"GQA {f['query_heads']}/{f['kv_heads']}"
    if f["window"]:
        where = "" if f["window_layers"] == f["layers"] else f" ({f['window_layers']}/{f['layers']} layers)"
        text += f", {'chunk' if f['window_kind'] == 'chunked' else 'window'} {f['window']:,}{where}"
    return text


def experts_text(f: dict[str, Any]) -> str:
    """``256 top-8 +shared (58/61 layers)``, or ``-`` for a dense model."""
    if f["experts"] is None:
        return "-"
    text = f"{f['experts']} top-{f['experts_per_token']}" + (" +shared" if f["shared_experts"] else "")
    return text + ("" if f["moe_layers"] == f["layers"] else f" ({f['moe_layers']}/{f['layers']} layers)")


def dtype_text(f: dict[str, Any]) -> str:
    """The activations' format, and the KV cache's where it differs."""
    return f["dtype"] + ("" if f["kv_cache_dtype"] == f["dtype"] else f", KV {f['kv_cache_dtype']}")


COLUMNS = (("model", "<"), ("params", ">"), ("active", ">"), ("layers", ">"), ("hidden", ">"), ("attention", "<"),
           ("KV/token", ">"), ("context", ">"), ("dtype", "<"), ("weights", "<"), ("experts", "<"))  # fmt: skip


def render(rows: list[dict[str, Any]]) -> str:
    cells = [
        [f["name"], size(f["params"], PARAMS), size(f["active_params"], PARAMS) if f["experts"] else "-",
         str(f["layers"]), f"{f['hidden_size']:,}", attention_text(f), size(f["kv_bytes_per_token"], BYTES),
         f"{f['max_context']:,}", dtype_text(f), f"{size(f['weight_bytes'], BYTES)} {f['weight_format']}",
         experts_text(f)]
        for f in rows
    ]  # fmt: skip
    note = ("attention: query/KV heads; KV/token: the KV-cache bytes one token holds, all layers, at the dtype shown "
            "(of sliding and full layers, the full ones: what ferry charges); --json: every field")  # fmt: skip
    return table(COLUMNS, cells) + "\n" + note


def main(args: argparse.Namespace) -> int:
    rows = all_facts()
    print(json.dumps(rows, indent=1) if args.json else render(rows))
    return 0
