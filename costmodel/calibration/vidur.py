"""Measured kernel times in Vidur's profiling format, set beside ferry's predictions of the same kernels.

Vidur (microsoft/vidur, MLSys 2024) publishes per-operator GPU times of one transformer layer, in milliseconds, fp16,
without host overhead:
- ``compute/<device>/<org>/<model>/mlp.csv``: the token-parallel operators at ``num_tokens`` tokens and
  ``num_tensor_parallel_workers``-way tensor parallelism, one ``time_stats.<op>.median`` column per operator;
- ``compute/<device>/attention-all-models.csv``: the attention kernel, prefill (one chunk of ``prefill_chunk_size``
  new tokens on ``kv_cache_size`` cached) or decode (``batch_size`` sequences at ``kv_cache_size``).
Its ``a100`` is the A100-SXM4 80GB (Vidur's device config lists 80 GB) and its ``h100`` the H100 80GB SXM (DGX H100).

``load_vidur`` reads them into one row per (measured shape, ferry operator) with the measured seconds and the model
shape; ``predict`` adds ferry's FLOPs, bytes and seconds for the same kernels (one layer, no overheads); ``errors``
summarises relative errors. The calibration harness fits the hardware profile's efficiency curves to the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from costmodel.hardware import HardwareProfile, load_hardware
from costmodel.model_spec import ModelSpec
from costmodel.roofline import CostModel
from costmodel.shape import IterationShape

# Vidur's device directory -> ferry's datasheet profile of that GPU (what the measurements are scored against and
# fitted from; ``a100-80g`` and ``h100-sxm`` themselves are fitted to NVIDIA's kernel database)
VIDUR_HARDWARE = {"a100": "a100-80g.datasheet", "h100": "h100-sxm.datasheet"}

# ferry operator -> (Vidur columns whose medians add up to it, ferry kernels with their instances per layer)
LINEAR_OPS: dict[str, tuple[tuple[str, ...], dict[str, int]]] = {
    "qkv_proj": (("attn_pre_proj",), {"qkv_proj": 1}),
    "o_proj": (("attn_post_proj",), {"o_proj": 1}),
    "mlp": (("mlp_up_proj", "mlp_act", "mlp_down_proj"), {"mlp_gate_up": 1, "mlp_act": 1, "mlp_down": 1}),
    # ferry's two norms fuse the residual adds (vLLM's fused_add_rms_norm); Vidur times two plain norms and one add
    "norms": (("input_layernorm", "post_attention_layernorm", "add"), {"norm": 2}),
    "rope": (("attn_rope",), {"rope": 1}),
    "embedding": (("emb",), {"embedding": 1}),
}
ATTENTION_OPS = {"attention_prefill": "attn_prefill", "attention_decode": "attn_decode"}
# the kernels each linear row times: Vidur's operators, and the single GEMMs other databases time apart
LINEAR_KERNELS = {op: kernels for op, (_, kernels) in LINEAR_OPS.items()} | {
    "mlp_gate_up": {"mlp_gate_up": 1},
    "mlp_down": {"mlp_down": 1},
}

COLUMNS = [
    "model",
    "hardware",
    "tp",
    "op",
    "num_tokens",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "measured_s",
    # model shape (what the spec is built from)
    "n_embd",
    "n_head",
    "n_kv_head",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
]


def _spec(row: pd.Series) -> ModelSpec:
    """A one-layer fp16 spec with the measured model's shapes (layers do not matter for one kernel)."""
    heads = int(row["n_head"])
    return ModelSpec(
        name=str(row["model"]),
        hidden_size=int(row["n_embd"]),
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=int(row["n_kv_head"]),
        head_dim=int(row["n_embd"]) // heads,
        intermediate_size=int(row["n_expanded_embd"]),
        vocab_size=int(row["vocab_size"]),
        max_position_embeddings=1 << 30,
        torch_dtype="float16",
        gated_mlp=bool(row["use_gated_mlp"]),
    )


# shape columns every row must hold as a whole number >= 1 (``tp`` and the token counts; attention's batch and
# chunk may be 0 where they do not apply, its context too)
_POSITIVE = ("tp", "n_embd", "n_head", "n_kv_head", "n_expanded_embd", "vocab_size")
_NON_NEGATIVE = ("num_tokens", "batch_size", "prefill_chunk_size", "kv_cache_size")


def _read_checked(path: Path, hardware: str, model: str | None = None) -> pd.DataFrame:
    """Read one profile CSV (linear operators of ``model``, or attention when ``model`` is None) and check its
    shapes; any problem is a ValueError naming the file (and the row, column and value where there is one), never a
    KeyError or a codec error."""
    try:
        raw = pd.read_csv(path)
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ValueError(f"{path}: not a readable CSV file ({type(exc).__name__}: {exc})") from None
    try:
        frame = _read_attention(raw, hardware) if model is None else _read_linear(raw, model, hardware)
    except KeyError as exc:
        raise ValueError(f"{path}: missing column {exc.args[0]!r}; is this one of Vidur's compute profiles?") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: a column does not hold what Vidur's profiles hold: {exc}") from None
    for col in _POSITIVE + _NON_NEGATIVE:
        values = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=np.float64)
        low = 1 if col in _POSITIVE else 0
        bad = ~np.isfinite(values) | (values < low) | (values != np.round(values))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            value = frame[col].iloc[i]
            value = value.item() if isinstance(value, np.generic) else value
            raise ValueError(f"{path}: row {i}: column {col!r} is {value!r}, expected a whole number >= {low}")
    measured = pd.to_numeric(frame["measured_s"], errors="coerce")
    return frame.assign(measured_s=measured)


def _read_linear(raw: pd.DataFrame, model: str, hardware: str) -> pd.DataFrame:
    frames = []
    for op, (cols, _) in LINEAR_OPS.items():
        medians = [f"time_stats.{c}.median" for c in cols]
        if not all(m in raw.columns for m in medians):
            continue
        frames.append(
            pd.DataFrame(
                {
                    "model": model,
                    "hardware": hardware,
                    "tp": raw["num_tensor_parallel_workers"].astype(int),
                    "op": op,
                    "num_tokens": raw["num_tokens"].astype(int),
                    "batch_size": 0,
                    "prefill_chunk_size": 0,
                    "kv_cache_size": 0,
                    "measured_s": raw[medians].sum(axis=1, min_count=len(medians)) * 1e-3,
                    "n_embd": raw["n_embd"],
                    "n_head": raw["n_head"],
                    "n_kv_head": raw["n_kv_head"],
                    "n_expanded_embd": raw["n_expanded_embd"],
                    "vocab_size": raw["vocab_size"],
                    "use_gated_mlp": raw["use_gated_mlp"].astype(bool),
                }
            )
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def _read_attention(raw: pd.DataFrame, hardware: str) -> pd.DataFrame:
    prefill = raw["is_prefill"].astype(str).str.lower() == "true"
    frames = []
    for op, col in ATTENTION_OPS.items():
        median = f"time_stats.{col}.median"
        if median not in raw.columns:
            continue
        sel = raw[prefill if op == "attention_prefill" else ~prefill]
        model = (
            "attention n_embd="
            + sel["n_embd"].astype(str)
            + " q="
            + sel["n_q_head"].astype(str)
            + " kv="
            + sel["n_kv_head"].astype(str)
        )
        frames.append(
            pd.DataFrame(
                {
                    "model": model,
                    "hardware": hardware,
                    "tp": sel["num_tensor_parallel_workers"].astype(int),
                    "op": op,
                    "num_tokens": np.where(
                        sel["is_prefill"].astype(str).str.lower() == "true",
                        sel["prefill_chunk_size"],
                        sel["batch_size"],
                    ),
                    "batch_size": sel["batch_size"].astype(int),
                    "prefill_chunk_size": sel["prefill_chunk_size"].astype(int),
                    "kv_cache_size": sel["kv_cache_size"].astype(int),
                    "measured_s": sel[median] * 1e-3,
                    "n_embd": sel["n_embd"],
                    "n_head": sel["n_q_head"],
                    "n_kv_head": sel["n_kv_head"],
                    "n_expanded_embd": 4 * sel["n_embd"],  # not used by attention
                    "vocab_size": 32000,  # not used by attention
                    "use_gated_mlp": True,
                }
            )
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)


def load_vidur(data_dir: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """Every measurement under ``data_dir/compute`` on a device ferry has a profile for, one row per (shape, op);
    and the files skipped (with why). Rows with no measurement (NaN or <= 0) are dropped."""
    root = Path(data_dir)
    compute = root / "compute"
    if not compute.is_dir():
        raise ValueError(
            f"{root}: no compute/ directory here; expected Vidur's profiling layout (compute/<device>/...)"
        )
    frames, skipped = [], []
    for device_dir in sorted(p for p in compute.iterdir() if p.is_dir()):
        hardware = VIDUR_HARDWARE.get(device_dir.name)
        files = sorted(device_dir.rglob("*.csv"))
        if hardware is None:
            skipped += [f"{f.relative_to(root)} (no ferry profile for device {device_dir.name!r})" for f in files]
            continue
        for f in files:
            if f.name == "mlp.csv":
                frame = _read_checked(f, hardware, model=str(f.parent.relative_to(device_dir)))
            elif f.name.startswith("attention"):
                frame = _read_checked(f, hardware)
            else:
                skipped.append(f"{f.relative_to(root)} (not a compute profile ferry reads)")
                continue
            if frame.empty:
                skipped.append(f"{f.relative_to(root)} (none of the operator columns ferry reads)")
            else:
                frames.append(frame)
    if not frames:
        raise ValueError(f"{root}: found no Vidur compute profiles (compute/<a100|h100>/<org>/<model>/mlp.csv)")
    df = pd.concat(frames, ignore_index=True)
    df = df[df["measured_s"].notna() & (df["measured_s"] > 0)].reset_index(drop=True)
    return df, skipped


def spec_of(row: pd.Series) -> ModelSpec:
    """The one-layer fp16 model spec of a measured row (its shape columns)."""
    return _spec(row)


def row_keys(group: pd.DataFrame) -> Iterator[tuple[int, tuple[str, int, int, int, int]]]:
    """(row index, (op, tokens, batch, chunk, context)) of each measured row: what ``row_shape`` takes."""
    columns = ("op", "num_tokens", "batch_size", "prefill_chunk_size", "kv_cache_size")
    for idx, op, tokens, batch, chunk, ctx in zip(group.index, *(group[c] for c in columns), strict=True):
        yield int(idx), (str(op), int(tokens), int(batch), int(chunk), int(ctx))


def row_shape(op: str, tokens: int, batch: int, chunk: int, ctx: int) -> tuple[IterationShape, dict[str, int]]:
    """The iteration shape whose kernels a measured row timed, and those kernels with their instances per row."""
    if op == "attention_decode":
        return IterationShape.of(decode=[(batch, ctx)]), {"attention_decode": 1}
    if op == "attention_prefill":  # ``batch`` prompts of ``chunk`` tokens each (Vidur's are one at a time)
        return IterationShape.of(prefill=[(chunk, ctx)] * max(batch, 1)), {"attention_prefill": 1}
    return IterationShape.of(prefill=[(tokens, 0)]), LINEAR_KERNELS[op]


def predict(df: pd.DataFrame, profiles: dict[str, HardwareProfile] | None = None) -> pd.DataFrame:
    """``df`` with ferry's ``flops``, ``bytes`` and ``predicted_s`` for each row's kernels: one layer, fp16, the row's
    tensor parallelism, no host overhead or communication (Vidur times those separately)."""
    profiles = dict(profiles or {})
    df = df.reset_index(drop=True)  # positions below index the result arrays
    out = df.copy()
    flops = np.zeros(len(df))
    nbytes = np.zeros(len(df))
    seconds = np.zeros(len(df))
    shape_cols = ["model", "hardware", "tp", "n_embd", "n_head", "n_kv_head", "n_expanded_embd", "vocab_size"]
    for _, group in df.groupby(shape_cols + ["use_gated_mlp"], sort=False):
        first = group.iloc[0]
        hw_name = str(first["hardware"])
        if hw_name not in profiles:
            profiles[hw_name] = load_hardware(hw_name)
        cm = CostModel(_spec(first), profiles[hw_name], tp=int(first["tp"]), dtype="float16")
        cache: dict[tuple[str, int, int, int, int], tuple[float, float, float]] = {}
        for idx, key in row_keys(group):
            if key not in cache:
                shape, wanted = row_shape(*key)
                ks = [k for k in cm.kernels(shape) if k.name in wanted]
                cache[key] = (
                    sum(wanted[k.name] * k.flops for k in ks),
                    sum(wanted[k.name] * k.bytes for k in ks),
                    sum(wanted[k.name] * k.time_s for k in ks),
                )
            flops[idx], nbytes[idx], seconds[idx] = cache[key]
    out["flops"] = flops
    out["bytes"] = nbytes
    out["predicted_s"] = seconds
    out["rel_error"] = out["predicted_s"] / out["measured_s"] - 1.0
    return out


def errors(predicted: pd.DataFrame) -> pd.DataFrame:
    """Per (model, hardware, op): rows, median and p90 of |relative error|, and the median signed error (bias:
    > 0 when ferry predicts too slow)."""
    g = predicted.assign(abs_error=predicted["rel_error"].abs()).groupby(["model", "hardware", "op"], sort=True)
    return pd.DataFrame(
        {
            "n": g.size(),
            "median_abs_rel_error": g["abs_error"].median(),
            "p90_abs_rel_error": g["abs_error"].quantile(0.9),
            "median_rel_error": g["rel_error"].median(),
        }
    ).reset_index()
