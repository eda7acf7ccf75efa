"""Measured iterations of any engine as fitting rows: the table ``ferry calibrate --from-iterations`` reads.

An engine ferry does not run (vLLM, SGLang, TensorRT-LLM, llama.cpp, another implementation) is known from the outside
by its iterations: what each one computed and how long it took. One row per iteration, CSV or Parquet:

============================  ========  =====================================================================
column                        required  meaning
============================  ========  =====================================================================
``duration_s``                yes       the iteration's measured wall time (seconds), step start to tokens out
``num_decode_seqs``           yes       sequences taking a one-token decode step (count)
``decode_context_tokens``     \\*        their cached tokens before the step, summed (tokens)
``mean_decode_context``       \\*        or the same as a mean per decode sequence (tokens)
``num_prefill_seqs``          no        prompt chunks computed (count; default 0)
``prefill_tokens``            no        their new prompt tokens, summed (tokens; default 0)
``prefill_context_tokens``    no        their tokens already cached before the chunk, summed (tokens; default 0)
``prefill_chunks``            no        exact chunks as JSON ``[[new_tokens, context_tokens], ...]`` (overrides the
                                        three columns above when present and not empty)
``prefill_sampled``           no        chunks that complete their prompt and sample a token (default: all)
============================  ========  =====================================================================

\\* one of the two when ``num_decode_seqs`` is above 0. Other columns are kept and ignored (``start_s``, ``forward_s``
of ``ferry serve --iterations-log``). Aggregated columns are spread evenly over the sequences (the cost model is
linear in each decode's context and nearly so in a chunk's size, so sums lose little); ``prefill_chunks`` is exact.

``to_raw`` turns the table into rows of the raw calibration format (``op_class == "iteration"``, each row's kernels
counted by ferry's cost model for the model and dtype given), which ``costmodel.calibration.profile.fit_profile``
fits as whole iterations: efficiency curves and host overheads together, every other iteration held out.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from costmodel.calibration.fit import WorkCounter, dump_terms
from costmodel.calibration.profile import FitResult, fit_profile
from costmodel.hardware import HardwareProfile
from costmodel.model_spec import ModelSpec
from costmodel.shape import IterationShape

REQUIRED = ("duration_s", "num_decode_seqs")
OPTIONAL_COUNTS = ("num_prefill_seqs", "prefill_tokens", "prefill_context_tokens")
COLUMNS = (
    "duration_s",
    "num_decode_seqs",
    "decode_context_tokens",
    "mean_decode_context",
    *OPTIONAL_COUNTS,
    "prefill_chunks",
    "prefill_sampled",
)


def read_iterations(path: str | Path) -> pd.DataFrame:
    """The iteration table at ``path`` (``.csv``, ``.parquet``/``.pq``), checked (``check_iterations``)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--from-iterations: no file {path}")
    if path.suffix.lower() in (".parquet", ".pq"):
        frame = pd.read_parquet(path)
    else:
        try:
            frame = pd.read_csv(path)
        except (pd.errors.ParserError, UnicodeDecodeError) as exc:
            raise ValueError(f"--from-iterations: {path} is not a CSV table ({exc})") from None
    return check_iterations(frame, str(path))


def check_iterations(frame: pd.DataFrame, where: str = "iteration table") -> pd.DataFrame:
    """``frame`` with its counts filled in and checked; a ValueError names the column and the first bad row."""
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{where}: missing column(s) {', '.join(missing)}; an iteration table needs {', '.join(REQUIRED)} and "
            "decode_context_tokens or mean_decode_context (see costmodel/calibration/iterations.py)"
        )
    if frame.empty:
        raise ValueError(f"{where}: no iterations")
    out = frame.reset_index(drop=True).copy()
    for name in OPTIONAL_COUNTS:
        if name not in out.columns:
            out[name] = 0
    if "prefill_chunks" in out.columns:
        chunks = [_chunks(v, where, i) for i, v in enumerate(out["prefill_chunks"])]
        for i, got in enumerate(chunks):
            if got is not None:
                out.loc[i, "num_prefill_seqs"] = len(got)
                out.loc[i, "prefill_tokens"] = sum(n for n, _ in got)
                out.loc[i, "prefill_context_tokens"] = sum(c for _, c in got)
    numeric = ["duration_s", "num_decode_seqs", *OPTIONAL_COUNTS]
    decode_ctx = next((c for c in ("decode_context_tokens", "mean_decode_context") if c in out.columns), None)
    if decode_ctx is not None:
        numeric.append(decode_ctx)
    elif (pd.to_numeric(out["num_decode_seqs"], errors="coerce").fillna(0) > 0).any():
        raise ValueError(f"{where}: decode steps need decode_context_tokens (summed) or mean_decode_context")
    for name in numeric:
        values = pd.to_numeric(out[name], errors="coerce")
        bad = values.isna() | (values < 0) | ~np.isfinite(values.fillna(0.0))
        if name == "duration_s":
            bad |= values <= 0
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise ValueError(
                f"{where}: column {name} row {i}: {out[name].iloc[i]!r} is not a "
                f"{'positive number of seconds' if name == 'duration_s' else 'count >= 0'}"
            )
        out[name] = values
    if decode_ctx == "mean_decode_context":
        out["decode_context_tokens"] = out["mean_decode_context"] * out["num_decode_seqs"]
    elif decode_ctx is None:
        out["decode_context_tokens"] = 0
    empty = (out["num_decode_seqs"] + out["prefill_tokens"]) <= 0
    if empty.any():
        raise ValueError(f"{where}: row {int(np.flatnonzero(empty.to_numpy())[0])} computes no token")
    chunkless = (out["prefill_tokens"] > 0) & (out["num_prefill_seqs"] <= 0)
    if chunkless.any():
        raise ValueError(f"{where}: row {int(np.flatnonzero(chunkless.to_numpy())[0])} has prefill tokens but no seqs")
    return out


def _chunks(value: object, where: str, row: int) -> list[tuple[int, int]] | None:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return None
    try:
        pairs = json.loads(value) if isinstance(value, str) else value
        got = [(int(n), int(c)) for n, c in pairs]  # type: ignore[union-attr]
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{where}: prefill_chunks row {row}: not [[new, context], ...]: {value!r} ({exc})") from None
    if any(n <= 0 or c < 0 for n, c in got):
        raise ValueError(f"{where}: prefill_chunks row {row}: new tokens must be > 0 and context >= 0: {value!r}")
    return got or None


def _spread(total: float, parts: int) -> np.ndarray:
    """``total`` tokens over ``parts`` sequences as evenly as integers allow (the remainder to the first ones)."""
    base, extra = divmod(int(round(total)), parts)
    return np.array([base + (1 if i < extra else 0) for i in range(parts)], dtype=np.int64)


def shapes_of(frame: pd.DataFrame) -> list[IterationShape]:
    """Each checked row's ``IterationShape`` (exact chunks where given, sums spread evenly otherwise)."""
    shapes = []
    has_chunks = "prefill_chunks" in frame.columns
    for i, row in enumerate(frame.itertuples(index=False)):
        chunks = _chunks(row.prefill_chunks, "table", i) if has_chunks else None
        if chunks is not None:
            new = np.array([n for n, _ in chunks], dtype=np.int64)
            ctx = np.array([c for _, c in chunks], dtype=np.int64)
        else:
            seqs = int(row.num_prefill_seqs) if row.prefill_tokens > 0 else 0
            new = _spread(row.prefill_tokens, seqs) if seqs else np.zeros(0, dtype=np.int64)
            ctx = _spread(row.prefill_context_tokens, seqs) if seqs else np.zeros(0, dtype=np.int64)
        decodes = int(row.num_decode_seqs)
        dec = _spread(row.decode_context_tokens, decodes) if decodes else np.zeros(0, dtype=np.int64)
        sampled = getattr(row, "prefill_sampled", None)
        sampled = len(new) if sampled is None or pd.isna(sampled) else min(int(sampled), len(new))
        shapes.append(IterationShape(new, ctx, dec, sampled))
    return shapes


def to_raw(frame: pd.DataFrame, spec: ModelSpec, dtype: str, *, source: str, model: str | None = None) -> pd.DataFrame:
    """The checked iteration table as raw calibration rows (``harness.ROW_COLUMNS``, and ``prefills``: the prompt
    chunks of each, which ``per_prefill_s`` is fitted on): whole iterations of ``spec`` in ``dtype``, their kernels
    counted by the cost model; ``source`` names where they were measured."""
    from costmodel.calibration.harness import ROW_COLUMNS

    work = WorkCounter(spec, dtype)
    seconds = frame["duration_s"].to_numpy(dtype=float)
    rows = [
        iteration_row(shape, float(t), work, device=source, dtype=dtype, model=model or spec.name,
                      layers=spec.num_hidden_layers)
        for shape, t in zip(shapes_of(frame), seconds, strict=True)
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=[*ROW_COLUMNS, "prefills"])


def fit_iterations(
    frame: pd.DataFrame,
    *,
    spec: ModelSpec,
    dtype: str,
    base: HardwareProfile,
    name: str,
    source: str,
    measurements: str,
    held: np.ndarray | None = None,
    settings: dict[str, str] | None = None,
) -> FitResult:
    """Fit a profile to a checked iteration table (``check_iterations``): ``base``'s device rates, efficiency curves
    and host overheads fitted to the iterations not held out (default: every other one in table order), scored on
    the held-out ones. ``source`` names the engine measured (the profile's device), ``measurements`` the file."""
    raw = to_raw(frame, spec, dtype, source=source)
    raw["software"] = json.dumps({"engine": source})
    settings = {"fit": "iterations", "base": base.name, "model": spec.name, "dtype": dtype} | (settings or {})
    return fit_profile(
        raw,
        name=name,
        base=base,
        measurements=measurements,
        settings=settings,
        description=f"{source}, fitted to its measured iterations ({spec.name}, {dtype})",
        held=held,
    )


def iteration_row(
    shape: IterationShape,
    seconds: float,
    work: WorkCounter,
    *,
    device: str,
    dtype: str,
    model: str,
    layers: int,
    host_s: float = 0.0,
) -> dict[str, object]:
    """One whole iteration as a raw calibration row: its kernels counted by ``work``, ``seconds`` measured, of which
    ``host_s`` outside the forward pass (0: not timed apart)."""
    terms = work.terms(shape)
    return {
        "device": device,
        "dtype": dtype,
        "model": model,
        "layers": layers,
        "op": "iteration",
        "op_class": "iteration",
        "num_tokens": shape.num_tokens,
        "batch_size": shape.num_decode_seqs,
        "chunk": shape.num_prefill_tokens,
        "context": int(shape.prefill_ctx.sum() + shape.decode_ctx.sum()),
        "seqs": shape.num_seqs,
        "prefills": len(shape.prefill_new),  # prompt chunks (per_prefill_s)
        "shape": shape_text(shape),
        "flops": sum(t.count * t.flops for t in terms),
        "bytes": sum(t.count * t.bytes for t in terms),
        "median_s": seconds,
        "min_s": seconds,
        "max_s": seconds,
        "repeats": 1,
        "sets": 1,
        "kernels": dump_terms(terms),
        "host_s": host_s,
    }


def shape_text(shape: IterationShape) -> str:
    """``prefill=N@C,...;decode=C,...`` (new tokens at cached context; decode contexts)."""
    prefill = ",".join(f"{n}@{c}" for n, c in zip(shape.prefill_new.tolist(), shape.prefill_ctx.tolist(), strict=True))
    return f"prefill={prefill};decode={','.join(str(c) for c in shape.decode_ctx.tolist())}"
