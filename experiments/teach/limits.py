"""The three limits of an iteration (the chapter's figure 6-5): max batch size, max batched tokens, max model length.

- max batch size (vLLM's ``max_num_seqs``): seats; at most this many requests ride in one iteration.
- max batched tokens (``max_num_batched_tokens``): the tokens all of them together may compute in one iteration.
- max model length (``max_model_len``): the longest one request may ever be, prompt and output together.

The drawing is one iteration that prefills whole prompts (no chunked prefill), filled first come, first served as
vLLM's scheduler does: requests take seats in arrival order while a seat is free and the batched tokens stay within
the budget; the first that does not fit waits, and everyone behind it waits too. ``limits_layout`` returns exactly
the numbers ``draw_limits`` prints, so a test can check the drawing's story.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator, StrMethodFormatter

from experiments.teach import labels, style

Request = tuple[int, int]  # (prompt tokens, output tokens it will go on to make), tokens
# three requests fill the three seats with 3,900 of 4,096 tokens; B is as long as the model allows; D finds no seat,
# and its 900-token prompt would not fit the token budget either
REQUESTS: tuple[Request, ...] = ((2000, 1000), (1200, 2896), (700, 300), (900, 1000))
WAIT_REASONS = ("seats", "tokens", "queue")  # no free seat; over the token budget; behind a request that waits

LABELS: dict[str, tuple[str, str]] = {
    "title": ("One iteration under three limits", "반복 한 번에 걸리는 세 가지 제한"),
    "subtitle": (
        "{seqs_label} {seqs} · {tokens_label} {tokens:,} · {len_label} {len:,} · whole prompts (no chunked prefill)",
        "{seqs_label} {seqs} · {tokens_label} {tokens:,} · {len_label} {len:,} · 프롬프트 통째로 (청크 분할 없음)",
    ),
    "seat_n": ("seat {n}", "좌석 {n}"),
    "queued": ("waiting", "대기"),
    "bracket": ("{label} = {n}", "{label} = {n}"),
    "request_len": ("{name}: {prompt:,} + {output:,} = {length:,}", "{name}: {prompt:,} + {output:,} = {length:,}"),
    "empty_seat": ("empty seat", "빈 좌석"),
    "why_seats": ("waits: no free seat ({used} of {seats} taken)", "대기: 빈 좌석 없음 ({seats}석 중 {used}석 사용)"),
    "why_tokens": (
        "waits: {total:,} + {prompt:,} = {sum:,} > {budget:,} tokens",
        "대기: {total:,} + {prompt:,} = {sum:,} > {budget:,} 토큰",
    ),
    "why_queue": ("waits behind {first} (first come, first served)", "{first} 뒤에서 대기 (선착순)"),
    "model_len_line": ("{label} {n:,}: prompt + output of one request", "{label} {n:,}: 요청 하나의 프롬프트 + 출력"),
    "budget_line": ("{label} {n:,}", "{label} {n:,}"),
    "batched_row": ("this iteration", "이번 반복"),
    "batched_sum": (
        "{names}: {parts} = {total:,} ≤ {budget:,} tokens",
        "{names}: {parts} = {total:,} ≤ {budget:,} 토큰",
    ),
    "overflow": (
        "+ {name}: {total:,} + {prompt:,} = {sum:,} > {budget:,} tokens",
        "+ {name}: {total:,} + {prompt:,} = {sum:,} > {budget:,} 토큰",
    ),
    "tokens_axis": ("tokens", "토큰"),
    "legend_prompt": ("prompt: computed in this iteration (prefill)", "프롬프트: 이번 반복에서 계산 (프리필)"),
    "legend_output": ("output: made later, one token per iteration (decode)", "출력: 이후 반복마다 한 토큰씩 (디코드)"),
    "legend_waiting": ("waiting for a later iteration", "다음 반복을 기다리는 요청"),
}
_text = partial(labels.text, own=LABELS)  # this figure's words first, then the shared ones


# ---------------------------------------------------------------------------------------------------------------------
# the decisions


def _check(max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int, requests: Sequence[Request]) -> None:
    """ValueError naming the first value that makes the picture inconsistent."""
    for name, value in (
        ("max_num_seqs", max_num_seqs),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("max_model_len", max_model_len),
    ):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    if max_num_batched_tokens < max_model_len:
        raise ValueError(
            f"max_num_batched_tokens={max_num_batched_tokens} < max_model_len={max_model_len}: without chunked "
            "prefill a whole prompt must fit in one iteration (vLLM refuses to start with these)"
        )
    if not 1 <= len(requests) <= len(string.ascii_uppercase):
        raise ValueError(
            f"requests: give 1 to {len(string.ascii_uppercase)} (prompt, output) pairs, got {len(requests)}"
        )
    for name, (prompt, output) in zip(string.ascii_uppercase, requests, strict=False):
        if prompt < 1 or output < 1:
            raise ValueError(f"request {name}: prompt={prompt} and output={output} must both be >= 1 token")
        if prompt + output > max_model_len:
            raise ValueError(
                f"request {name}: prompt {prompt} + output {output} = {prompt + output} tokens > "
                f"max_model_len={max_model_len}: no request may be longer than the model allows"
            )
        if prompt > max_num_batched_tokens:
            raise ValueError(
                f"request {name}: prompt {prompt} tokens > max_num_batched_tokens={max_num_batched_tokens}: without "
                "chunked prefill it could never be scheduled"
            )


def limits_layout(
    max_num_seqs: int = 3,
    max_num_batched_tokens: int = 4096,
    max_model_len: int = 4096,
    requests: Sequence[Request] = REQUESTS,
) -> dict[str, Any]:
    """Which requests ride in one iteration under the three limits, first come, first served (all counts in tokens).

    ``requests`` are ``(prompt, output)`` token pairs in arrival order, named A, B, C, ... Returns the limits as
    given, and ``seated``: one dict per request in the iteration (name, prompt, output, length = prompt + output,
    seat 1.., start = batched tokens before it); ``waiting``: one dict per request left out (name, prompt, output,
    length, ``reason`` = "seats" (no free seat), "tokens" (its prompt would take the batched tokens over the budget)
    or "queue" (an earlier request waits), and ``limits``, every limit it would break); ``batched_tokens`` (the sum
    of the seated prompts), ``free_seats`` and ``free_tokens``. ValueError for inputs that cannot be drawn honestly:
    a request longer than ``max_model_len``, a prompt over ``max_num_batched_tokens``, a limit below 1.
    """
    _check(max_num_seqs, max_num_batched_tokens, max_model_len, requests)
    seated: list[dict[str, Any]] = []
    waiting: list[dict[str, Any]] = []
    total = 0
    for name, (prompt, output) in zip(string.ascii_uppercase, requests, strict=False):
        entry: dict[str, Any] = {"name": name, "prompt": prompt, "output": output, "length": prompt + output}
        broken = [
            limit
            for limit, hit in (
                ("seats", len(seated) >= max_num_seqs),
                ("tokens", total + prompt > max_num_batched_tokens),
            )
            if hit
        ]
        if waiting or broken:
            waiting.append({**entry, "reason": "queue" if waiting else broken[0], "limits": tuple(broken)})
        else:
            seated.append({**entry, "seat": len(seated) + 1, "start": total})
            total += prompt
    return {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_model_len": max_model_len,
        "seated": seated,
        "waiting": waiting,
        "batched_tokens": total,
        "free_seats": max_num_seqs - len(seated),
        "free_tokens": max_num_batched_tokens - total,
    }


# ---------------------------------------------------------------------------------------------------------------------
# the drawing

BAR = 0.62  # bar height (rows)
OUTPUT_ALPHA = 0.45


def _width(layout: dict[str, Any]) -> float:
    """The x extent (tokens): the longest line or bar, and room for the numbers written right of it."""
    everything = [layout["max_model_len"], layout["max_num_batched_tokens"]]
    if layout["waiting"]:
        everything.append(layout["batched_tokens"] + layout["waiting"][0]["prompt"])
    return max(everything) * 1.5


def _why(entry: dict[str, Any], layout: dict[str, Any], lang: str) -> str:
    reason = entry["reason"]
    if reason == "seats":
        return _text("why_seats", lang, used=len(layout["seated"]), seats=layout["max_num_seqs"])
    if reason == "tokens":
        total, budget = layout["batched_tokens"], layout["max_num_batched_tokens"]
        return _text(
            "why_tokens", lang, total=total, prompt=entry["prompt"], sum=total + entry["prompt"], budget=budget
        )
    return _text("why_queue", lang, first=layout["waiting"][0]["name"])


def _request_bar(ax: Axes, y: float, entry: dict[str, Any], waits: bool, pad: float) -> None:
    """One request as prompt (solid) then output (hatched); greyed and dashed when it waits."""
    prompt_colour = style.COLORS["waiting"] if waits else style.COLORS["prefill"]
    output_colour = style.COLORS["waiting"] if waits else style.COLORS["decode"]
    line = "--" if waits else "-"
    ax.barh(y, entry["prompt"], height=BAR, color=prompt_colour, edgecolor=style.EDGE, ls=line, lw=1.5)
    ax.barh(
        y,
        entry["output"],
        left=entry["prompt"],
        height=BAR,
        color=output_colour,
        alpha=OUTPUT_ALPHA,
        hatch="//",
        edgecolor=style.EDGE,
        ls=line,
        lw=1.5,
    )


def _draw_rows(ax: Axes, layout: dict[str, Any], lang: str) -> None:
    """The seats (and the requests left waiting under them), the bracket and the max-model-length line."""
    width = _width(layout)
    pad = width * 0.008
    seats = layout["max_num_seqs"]
    column = layout["max_model_len"] + 2 * pad  # each request's numbers, in a column right of the max-length line
    for n in range(seats):
        y = n
        ax.text(-pad, y, _text("seat_n", lang, n=n + 1), ha="right", va="center")
        if n < len(layout["seated"]):
            entry = layout["seated"][n]
            _request_bar(ax, y, entry, waits=False, pad=pad)
            ax.text(column, y, _text("request_len", lang, **entry), va="center")
        else:
            ax.barh(
                y, layout["max_model_len"], height=BAR, fill=False, ls=":", edgecolor="grey"
            )  # room for one request
            ax.text(pad * 3, y, _text("empty_seat", lang), va="center", color="dimgrey", style="italic")
    for j, entry in enumerate(layout["waiting"]):
        y = seats + 0.4 + j
        ax.text(-pad, y, _text("queued", lang), ha="right", va="center", color="dimgrey")
        _request_bar(ax, y, entry, waits=True, pad=pad)
        note = f"{_text('request_len', lang, **entry)}\n{_why(entry, layout, lang)}"
        ax.text(column, y, note, va="center", color="dimgrey")
    _bracket(ax, -width * 0.085, 0, seats - 1, _text("bracket", lang, label=_text("max_batch_size", lang), n=seats))
    model_len = layout["max_model_len"]
    ax.axvline(model_len, color=style.COLORS["idle"], lw=2.5)
    label = _text("model_len_line", lang, label=_text("max_model_len", lang), n=model_len)
    ax.text(model_len - pad, -0.75, label, ha="right", va="center", color=style.COLORS["idle"])
    ax.set_ylim(seats + len(layout["waiting"]) - 0.1, -1.05)


def _bracket(ax: Axes, x: float, top: float, bottom: float, label: str) -> None:
    """A square bracket at ``x`` (tokens) spanning rows ``top``..``bottom``, ``label`` written along it."""
    y0, y1 = top - BAR / 2, bottom + BAR / 2
    tick = abs(x) * 0.08
    ax.plot([x + tick, x, x, x + tick], [y0, y0, y1, y1], color=style.EDGE, lw=2, clip_on=False)
    ax.text(x - tick, (y0 + y1) / 2, label, rotation=90, ha="right", va="center")


def _draw_budget(ax: Axes, layout: dict[str, Any], lang: str) -> None:
    """This iteration's batched tokens as one stacked bar against the max-batched-tokens line."""
    width = _width(layout)
    pad = width * 0.008
    budget, total = layout["max_num_batched_tokens"], layout["batched_tokens"]
    ax.text(-pad, 0, _text("batched_row", lang), ha="right", va="center")
    for entry in layout["seated"]:
        ax.barh(0, entry["prompt"], left=entry["start"], height=BAR, color=style.COLORS["prefill"], edgecolor="white")
        ax.text(entry["start"] + entry["prompt"] / 2, 0, entry["name"], ha="center", va="center", color="white")
    end = total
    first = layout["waiting"][0] if layout["waiting"] else None
    if first is not None:
        ax.barh(
            0, first["prompt"], left=total, height=BAR, color=style.COLORS["waiting"], edgecolor=style.EDGE, ls="--"
        )
        ax.text(total + first["prompt"] / 2, 0, first["name"], ha="center", va="center", color="dimgrey")
        end = total + first["prompt"]
    names = " + ".join(e["name"] for e in layout["seated"])
    parts = " + ".join(f"{e['prompt']:,}" for e in layout["seated"])
    summed = _text("batched_sum", lang, names=names, parts=parts, total=total, budget=budget)
    ax.text(max(end, budget) + pad, 0, summed, va="bottom" if first is not None and end > budget else "center")
    if first is not None and end > budget:
        over = _text("overflow", lang, name=first["name"], total=total, prompt=first["prompt"], sum=end, budget=budget)
        ax.text(max(end, budget) + pad, 0.03, over, va="top", color="dimgrey")
    ax.axvline(budget, color=style.EDGE, lw=2.5)
    label = _text("budget_line", lang, label=_text("max_num_batched_tokens", lang), n=budget)
    ax.text(budget - pad, -0.62, label, ha="right", va="center")
    ax.set_ylim(0.55, -0.95)


def _frame(ax: Axes, width: float, axis: bool) -> None:
    """Tokens from 0 on x (drawn when ``axis``), no y axis: the rows are named in the margin left of x = 0."""
    ax.set_xlim(-width * 0.17, width)
    ax.set_xticks([t for t in MaxNLocator(nbins=7).tick_values(0, width) if 0 <= t <= width])
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.spines["bottom"].set_bounds(0, width)
    ax.spines["bottom"].set_visible(axis)
    ax.tick_params(bottom=axis, labelbottom=axis)
    ax.axvline(0, color=style.EDGE, lw=1)


def draw_limits(
    lang: str,
    out: Path,
    max_num_seqs: int = 3,
    max_num_batched_tokens: int = 4096,
    max_model_len: int = 4096,
    requests: Sequence[Request] = REQUESTS,
) -> list[Path]:
    """Draw ``out/limits.png`` and ``.svg`` (slide size) in ``lang``: one iteration as a bar per request (prompt
    computed now, output to come) in at most ``max_num_seqs`` seats, the ``max_model_len`` line that caps one
    request, and the batched tokens against ``max_num_batched_tokens``, with the requests that wait greyed and the
    reason written beside them. The numbers printed are those of ``limits_layout``. Returns the two paths."""
    layout = limits_layout(max_num_seqs, max_num_batched_tokens, max_model_len, requests)
    width = _width(layout)
    with style.language(lang):
        fig = Figure(figsize=style.SLIDE, layout="constrained")
        rows, budget = fig.subplots(2, 1, sharex=True, height_ratios=(max_num_seqs + len(layout["waiting"]) + 1, 1.6))
        _draw_rows(rows, layout, lang)
        _draw_budget(budget, layout, lang)
        _frame(rows, width, axis=False)
        _frame(budget, width, axis=True)
        budget.set_xlabel(_text("tokens_axis", lang))
        subtitle = _text(
            "subtitle",
            lang,
            seqs_label=_text("max_batch_size", lang),
            seqs=max_num_seqs,
            tokens_label=_text("max_num_batched_tokens", lang),
            tokens=max_num_batched_tokens,
            len_label=_text("max_model_len", lang),
            len=max_model_len,
        )
        fig.suptitle(f"{_text('title', lang)}\n{subtitle}", fontsize=16)
        fig.legend(handles=_legend(lang), loc="outside lower center", ncol=3, frameon=False)
        return style.save(fig, out, "limits")


def _legend(lang: str) -> list[Patch]:
    return [
        Patch(facecolor=style.COLORS["prefill"], edgecolor=style.EDGE, label=_text("legend_prompt", lang)),
        Patch(
            facecolor=style.COLORS["decode"],
            alpha=OUTPUT_ALPHA,
            hatch="//",
            edgecolor=style.EDGE,
            label=_text("legend_output", lang),
        ),
        Patch(facecolor=style.COLORS["waiting"], edgecolor=style.EDGE, ls="--", label=_text("legend_waiting", lang)),
    ]
