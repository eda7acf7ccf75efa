"""Why batching helps (the chapter's figures 6-1, prefill against decode, and 6-2, a batch of three decodes reads the
weights once), drawn from ferry's own cost model.

A decode step makes one token per sequence but streams every weight of the model from DRAM: at batch 1 it does ~1 FLOP
per byte and sits far down the bandwidth slope of the roofline. A batch of b decodes reads the weights once for b
tokens, so its arithmetic intensity, and with it the FLOP/s it attains, grows ~b-fold until the KV caches (which grow
with b too) and the ridge point stop it. A prefill of a whole prompt already reuses each weight for every prompt token
and sits near the compute roof. Nothing here is hard-coded: every number comes from ``CostModel.explain`` and
``CostModel.iteration_time``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from costmodel import CostModel, IterationShape, load_hardware, load_model
from experiments.teach import labels, style

BATCHES = (1, 2, 3, 4, 8, 16, 32, 64, 128, 256)
MARK = 3  # the chapter's max batch size
TERA = 1e12

# this figure's words, (english, korean); a key not here is looked up in experiments.teach.labels
LABELS: dict[str, tuple[str, str]] = {
    "title": ("Why batching helps: {model} on {gpu}", "배치가 왜 도움이 되는가: {gpu}의 {model}"),
    "subtitle": (
        "one iteration each; decode requests have {ctx:,} tokens in the KV cache",
        "모두 반복 한 번; 디코드 요청마다 KV 캐시에 {ctx:,} 토큰",
    ),
    "roof_title": ("(a) roofline: where each iteration sits", "(a) 루프라인: 반복 한 번이 놓이는 자리"),
    "tps_title": ("(b) throughput grows with batch size", "(b) 배치가 커지면 처리량이 늘어남"),
    "tpt_title": ("(c) time per token shrinks", "(c) 토큰당 시간은 줄어듦"),
    "intensity": ("arithmetic intensity (FLOP / byte)", "산술 집약도 (FLOP / 바이트)"),
    "achieved": ("achieved TFLOP/s (FLOPs / iteration time)", "달성 TFLOP/s (FLOP / 반복 시간)"),
    "batch_axis": ("decode batch size", "디코드 배치 크기"),
    "tokens_per_s": ("throughput (output tokens/s)", "처리량 (출력 토큰/s)"),
    "time_per_token": ("time per token (ms)", "토큰당 시간 (ms)"),
    "peak": ("peak compute {tflops:,.0f} TFLOP/s", "최대 연산 성능 {tflops:,.0f} TFLOP/s"),
    "bandwidth": ("memory bandwidth {tbps:.2f} TB/s", "메모리 대역폭 {tbps:.2f} TB/s"),
    "ridge": ("ridge point\n{x:.0f} FLOP/B", "리지 포인트\n{x:.0f} FLOP/B"),
    "compute_bound": ("compute-bound", "연산 병목"),
    "memory_bound": ("memory-bandwidth-bound", "메모리 대역폭 병목"),
    "batch_n": ("batch {n}", "배치 {n}"),
    "prefill_n": ("prefill of {n:,} tokens", "프리필 {n:,} 토큰"),
    "prefill_short": ("prefill\n{n:,} tokens", "프리필\n{n:,} 토큰"),
    "decode_series": ("decode, batch {lo}–{hi}", "디코드, 배치 {lo}–{hi}"),
    "mark_tps": (
        "max batch size {n}:\n{tps:,.0f} tokens/s (×{gain:.1f})",
        "최대 배치 크기 {n}:\n{tps:,.0f} 토큰/s (×{gain:.1f})",
    ),
    "mark_tpt": (
        "batch {n}: one {ms:.1f} ms iteration\nmakes {n} tokens → {per:.2f} ms each\n"
        "(batch 1: {ms1:.1f} ms for 1 token)",
        "배치 {n}: {ms:.1f} ms 반복 한 번에\n토큰 {n}개 → 개당 {per:.2f} ms\n(배치 1: {ms1:.1f} ms에 토큰 1개)",
    ),
}
_text = partial(labels.text, own=LABELS)  # this figure's words first, then the shared ones


# ---------------------------------------------------------------------------------------------------------------------
# the numbers


def _row(cm: CostModel, kind: str, batch: int, tokens: int, shape: IterationShape) -> dict[str, float | int | str]:
    """One iteration's numbers: FLOPs and bytes of its GPU operators (summed over operators, per GPU) and its time."""
    breakdown = cm.explain(shape)
    seconds = cm.iteration_time(shape)
    return {
        "kind": kind,
        "batch": batch,
        "tokens": tokens,
        "seconds": seconds,
        "flops": breakdown.flops,
        "bytes": breakdown.bytes,
        "arithmetic_intensity": breakdown.flops / breakdown.bytes,
        "achieved_flops": breakdown.flops / seconds,
        "tokens_per_s": tokens / seconds,
        "time_per_token_ms": seconds / tokens * 1e3,
    }


def _table(cm: CostModel, batches: Sequence[int], prompt_tokens: int, context_tokens: int) -> pd.DataFrame:
    """``batching_table`` for a cost model already built; ValueError naming a length the model cannot hold."""
    longest = cm.model.max_position_embeddings
    if prompt_tokens < 1 or prompt_tokens > longest:
        raise ValueError(f"prompt_tokens={prompt_tokens} must be in [1, {longest}] ({cm.model.name}'s longest)")
    if context_tokens < 0 or context_tokens + 1 > longest:
        raise ValueError(f"context_tokens={context_tokens} must be in [0, {longest - 1}] ({cm.model.name})")
    if not batches or min(batches) < 1:
        raise ValueError(f"batches={tuple(batches)} must be decode batch sizes >= 1")
    rows = [_row(cm, "prefill", 1, prompt_tokens, IterationShape.of(prefill=[(prompt_tokens, 0)]))]
    rows += [_row(cm, "decode", b, b, IterationShape.of(decode=[(b, context_tokens)])) for b in sorted(set(batches))]
    return pd.DataFrame(rows)


def batching_table(
    model: str,
    hardware: str,
    batches: Sequence[int] = BATCHES,
    prompt_tokens: int = 1024,
    context_tokens: int = 1024,
    tp: int = 1,
) -> pd.DataFrame:
    """The numbers of the why-batching figure, from ferry's cost model: one row for a single prefill of
    ``prompt_tokens`` (nothing cached), then one per decode batch size b (b sequences, each with ``context_tokens``
    in its KV cache, each making one token).

    Columns: ``kind`` ("prefill"/"decode"); ``batch`` (sequences); ``tokens`` (tokens computed in the iteration: the
    prompt for the prefill, one per sequence for a decode); ``seconds`` (``CostModel.iteration_time``, host overheads
    included, s); ``flops`` and ``bytes`` (the GPU operators' FLOPs and DRAM bytes summed over operators, per GPU, as
    ``CostModel.explain`` counts them); ``arithmetic_intensity`` (FLOP/byte); ``achieved_flops`` (flops / seconds,
    FLOP/s); ``tokens_per_s`` (tokens / seconds); ``time_per_token_ms`` (seconds / tokens, ms).
    """
    cm = CostModel(load_model(model), load_hardware(hardware), tp=tp)
    return _table(cm, batches, prompt_tokens, context_tokens)


# ---------------------------------------------------------------------------------------------------------------------
# the figure


def _gpu_name(cm: CostModel) -> str:
    """The device as its profile describes it ("NVIDIA H100 80GB SXM5"), else the profile's name."""
    return cm.hardware.description or cm.hardware.name


def _draw_roof(ax: Axes, cm: CostModel, table: pd.DataFrame, lang: str) -> None:
    """The datasheet roofline, min(peak FLOP/s, bandwidth x intensity), log-log, with its two regions named."""
    peak = cm.hardware.peak_flops(cm.gemm_dtype)
    bw = cm.hardware.bandwidth
    ridge = peak / bw
    lo = min(0.5, float(table["arithmetic_intensity"].min()) / 2)
    hi = max(ridge * 14, float(table["arithmetic_intensity"].max()) * 10)  # room for the prefill's label on its right
    xs = np.geomspace(lo, hi, 200)
    ax.plot(xs, np.minimum(peak, bw * xs) / TERA, color=style.EDGE, lw=2.5, zorder=2)
    ax.axvline(ridge, color="grey", ls=":", lw=1.2, zorder=1)
    ax.text(ridge * 1.08, peak / TERA / 30, _text("ridge", lang, x=ridge), color="dimgrey", fontsize=11, va="top")
    ax.text(hi / 1.1, peak / TERA * 1.12, _text("peak", lang, tflops=peak / TERA), ha="right", va="bottom")
    # above the slope, left of the decode points, along the parallel line y = 2.5 bw x: its direction in data units
    # is (1, y/x), which matplotlib turns into the on-screen angle at every draw (transform_rotates_text)
    x_bw = ridge / 100
    y_bw = 2.5 * bw * x_bw / TERA
    ax.text(
        x_bw,
        y_bw,
        _text("bandwidth", lang, tbps=bw / TERA),
        rotation=float(np.degrees(np.arctan(y_bw / x_bw))),
        transform_rotates_text=True,
        rotation_mode="anchor",
    )
    bottom = ax.get_xaxis_transform()  # x in data, y in axes fraction
    region: dict[str, Any] = {"style": "italic", "color": "dimgrey", "transform": bottom, "va": "bottom"}
    ax.text(ridge / 1.15, 0.03, "← " + _text("memory_bound", lang), ha="right", **region)
    ax.text(ridge * 1.15, 0.03, _text("compute_bound", lang) + " →", ha="left", **region)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(float(table["achieved_flops"].min()) / TERA / 4, peak / TERA * 3)
    for axis in (ax.xaxis, ax.yaxis):  # 0.1, 1, 10, 1,000 rather than powers of ten (no mathtext minus to miss)
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))


def _draw_points(ax: Axes, table: pd.DataFrame, lang: str, marks: Sequence[int]) -> None:
    """The prefill point and the decode points (FLOP/byte, TFLOP/s), with batch sizes ``marks`` labelled."""
    decode = table[table["kind"] == "decode"]
    prefill = table[table["kind"] == "prefill"].iloc[0]
    x, y = decode["arithmetic_intensity"], decode["achieved_flops"] / TERA
    series = _text("decode_series", lang, lo=int(decode["batch"].min()), hi=int(decode["batch"].max()))
    ax.plot(x, y, "-o", color=style.COLORS["decode"], mec=style.EDGE, ms=8, lw=1.5, zorder=3, label=series)
    for _, row in decode[decode["batch"].isin(marks)].iterrows():
        b, point = int(row["batch"]), (row["arithmetic_intensity"], row["achieved_flops"] / TERA)
        if b == MARK:
            _ring(ax, *point)
        ax.annotate(
            _text("batch_n", lang, n=b),
            point,
            xytext=(14, -14),
            textcoords="offset points",
            ha="left",
            va="top",
            fontsize=12,
            color=style.COLORS["idle"] if b == MARK else "black",
        )
    label = _text("prefill_n", lang, n=int(prefill["tokens"]))
    short = _text("prefill_short", lang, n=int(prefill["tokens"]))
    ax.plot(
        prefill["arithmetic_intensity"],
        prefill["achieved_flops"] / TERA,
        "s",
        color=style.COLORS["prefill"],
        mec=style.EDGE,
        ms=11,
        zorder=3,
        label=label,
    )
    ax.annotate(
        short,
        (prefill["arithmetic_intensity"], prefill["achieved_flops"] / TERA),
        xytext=(14, 0),
        textcoords="offset points",
        ha="left",
        va="center",
        fontsize=12,
    )
    ax.legend(loc="upper left", framealpha=0.95)


def _batch_axis(ax: Axes, batches: Sequence[int]) -> None:
    """Batch sizes on a log2 x axis, each one labelled."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(batches))
    ax.set_xticklabels([str(b) for b in batches])
    ax.minorticks_off()
    ax.grid(True, which="major", alpha=0.25)


def _log_ticks(ax: Axes, values: pd.Series) -> None:
    """Label a log y axis at 1-2-5 steps covering ``values``, written as plain numbers (no powers of ten)."""
    lo, hi = float(values.min()), float(values.max())
    decades = range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1)
    ticks = [m * 10.0**e for e in decades for m in (1, 2, 5) if lo / 1.3 <= m * 10.0**e <= hi * 1.3]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{t:,g}" for t in ticks])
    ax.minorticks_off()


def _one_and_mark(decode: pd.DataFrame) -> tuple[pd.Series, pd.Series] | None:
    """The batch-1 and batch-``MARK`` decode rows, or None when the table lacks either."""
    if not {1, MARK} <= set(decode["batch"]):
        return None
    return decode[decode["batch"] == 1].iloc[0], decode[decode["batch"] == MARK].iloc[0]


def _draw_throughput(ax: Axes, table: pd.DataFrame, lang: str) -> None:
    """Decode output tokens/s against batch size (log-log), batch ``MARK`` ringed with its gain over batch 1."""
    decode = table[table["kind"] == "decode"]
    ax.plot(decode["batch"], decode["tokens_per_s"], "-o", color=style.COLORS["decode"], mec=style.EDGE, ms=7)
    ax.set_yscale("log")
    _log_ticks(ax, decode["tokens_per_s"])
    ax.set_ylim(bottom=float(decode["tokens_per_s"].min()) / 2.5)  # room for the note under the curve
    ax.set_ylabel(_text("tokens_per_s", lang))
    ax.set_title(_text("tps_title", lang), loc="left")
    pair = _one_and_mark(decode)
    if pair is not None:
        one, mark = pair
        gain = mark["tokens_per_s"] / one["tokens_per_s"]
        note = _text("mark_tps", lang, n=MARK, tps=mark["tokens_per_s"], gain=gain)
        _mark(ax, MARK, mark["tokens_per_s"], note, above=False)
    _batch_axis(ax, list(decode["batch"]))


def _draw_time_per_token(ax: Axes, table: pd.DataFrame, lang: str) -> None:
    """Decode ms per token against batch size (log-log), batch ``MARK`` ringed: one iteration, ``MARK`` tokens."""
    decode = table[table["kind"] == "decode"]
    ax.plot(decode["batch"], decode["time_per_token_ms"], "-o", color=style.COLORS["decode"], mec=style.EDGE, ms=7)
    ax.set_yscale("log")
    _log_ticks(ax, decode["time_per_token_ms"])
    ax.set_ylim(top=float(decode["time_per_token_ms"].max()) * 2.5)  # room for the note over the curve
    ax.set_ylabel(_text("time_per_token", lang))
    ax.set_xlabel(_text("batch_axis", lang))
    ax.set_title(_text("tpt_title", lang), loc="left")
    pair = _one_and_mark(decode)
    if pair is not None:
        one, mark = pair
        note = _text(
            "mark_tpt",
            lang,
            n=MARK,
            ms=mark["seconds"] * 1e3,
            per=mark["time_per_token_ms"],
            ms1=one["seconds"] * 1e3,
        )
        _mark(ax, MARK, mark["time_per_token_ms"], note, above=True)
    _batch_axis(ax, list(decode["batch"]))


def _ring(ax: Axes, x: float, y: float) -> None:
    """A red ring around the point (x, y): the chapter's max batch size."""
    ax.plot([x], [y], "o", ms=16, mfc="none", mec=style.COLORS["idle"], mew=2.5, zorder=4)


def _mark(ax: Axes, x: float, y: float, note: str, above: bool) -> None:
    """Ring the point at batch ``x`` and write ``note`` to its right, above or below the curve."""
    _ring(ax, x, y)
    offset, va = ((16, 10), "bottom") if above else ((16, -10), "top")
    ax.annotate(note, (x, y), xytext=offset, textcoords="offset points", va=va, fontsize=11)


def draw_why_batching(
    model: str,
    hardware: str,
    lang: str,
    out: Path,
    *,
    batches: Sequence[int] = BATCHES,
    prompt_tokens: int = 1024,
    context_tokens: int = 1024,
    tp: int = 1,
) -> list[Path]:
    """Draw ``out/why-batching.png`` and ``.svg`` (slide size) in ``lang``: (a) the GPU's roofline with the prefill
    and the decode iterations on it, (b) decode throughput (output tokens/s) and (c) time per token (ms) against the
    decode batch size, batch 3 (the chapter's max batch size) marked. Returns the two paths."""
    cm = CostModel(load_model(model), load_hardware(hardware), tp=tp)
    table = _table(cm, batches, prompt_tokens, context_tokens)
    decode_batches = sorted(set(batches))
    marks = [b for b in (decode_batches[0], MARK, decode_batches[-1]) if b in decode_batches]
    with style.language(lang):
        fig = Figure(figsize=style.SLIDE, layout="constrained")
        grid = fig.add_gridspec(2, 2, width_ratios=(1.15, 1))
        roof = fig.add_subplot(grid[:, 0])
        tps = fig.add_subplot(grid[0, 1])
        tpt = fig.add_subplot(grid[1, 1], sharex=tps)
        _draw_roof(roof, cm, table, lang)
        _draw_points(roof, table, lang, marks)
        roof.set_xlabel(_text("intensity", lang))
        roof.set_ylabel(_text("achieved", lang))
        roof.set_title(_text("roof_title", lang), loc="left")
        _draw_throughput(tps, table, lang)
        tps.tick_params(labelbottom=False)
        _draw_time_per_token(tpt, table, lang)
        title = _text("title", lang, model=cm.model.name, gpu=_gpu_name(cm))
        fig.suptitle(f"{title}\n{_text('subtitle', lang, ctx=context_tokens)}", fontsize=16)
        return style.save(fig, out, "why-batching")
