"""The two static teaching figures: why batching helps (the roofline's story in numbers) and the three limits of an
iteration (which requests ride and why the others wait); both drawn in English and Korean."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

from experiments.teach.batching import batching_table, draw_why_batching
from experiments.teach.limits import draw_limits, limits_layout

MODEL, GPU = "llama-3-8b", "h100-sxm"


@pytest.fixture(scope="module")
def table():  # noqa: ANN201
    return batching_table(MODEL, GPU)


def test_decode_batching_follows_the_roofline(table) -> None:  # noqa: ANN001
    decode = table[table["kind"] == "decode"].sort_values("batch")
    assert list(decode["batch"]) == [1, 2, 3, 4, 8, 16, 32, 64, 128, 256]
    assert (decode["tokens"] == decode["batch"]).all()
    assert np.all(np.diff(decode["tokens_per_s"]) > 0), "throughput grows with the batch"
    assert np.all(np.diff(decode["time_per_token_ms"]) < 0), "time per token shrinks with the batch"
    assert np.all(np.diff(decode["arithmetic_intensity"]) > 0), "decode climbs the bandwidth slope"
    one, three = (decode[decode["batch"] == b].iloc[0] for b in (1, 3))
    assert three["seconds"] < 3 * one["seconds"], "three decodes read the weights once, not three times"


def test_prefill_is_far_denser_than_a_single_decode(table) -> None:  # noqa: ANN001
    prefill = table[table["kind"] == "prefill"].iloc[0]
    one = table[(table["kind"] == "decode") & (table["batch"] == 1)].iloc[0]
    assert prefill["tokens"] == 1024
    assert prefill["arithmetic_intensity"] > 100 * one["arithmetic_intensity"]
    for column in ("achieved_flops", "tokens_per_s"):
        assert np.allclose(table[column], table["flops" if column == "achieved_flops" else "tokens"] / table["seconds"])


def test_batching_table_refuses_a_prompt_longer_than_the_model() -> None:
    with pytest.raises(ValueError, match="prompt_tokens=100000"):
        batching_table(MODEL, GPU, prompt_tokens=100_000)


def test_a_prompt_over_the_token_budget_waits_for_tokens() -> None:
    layout = limits_layout(4, 4096, 4096, [(3000, 500), (1500, 2000), (200, 300)])
    assert [r["name"] for r in layout["seated"]] == ["A"]
    assert [(r["name"], r["reason"]) for r in layout["waiting"]] == [("B", "tokens"), ("C", "queue")]
    assert layout["batched_tokens"] == 3000 and layout["free_seats"] == 3 and layout["free_tokens"] == 1096


def test_a_fourth_request_waits_for_a_seat() -> None:
    layout = limits_layout(3, 4096, 4096, [(500, 100), (500, 100), (500, 100), (100, 100)])
    assert [r["seat"] for r in layout["seated"]] == [1, 2, 3]
    (fourth,) = layout["waiting"]
    assert (fourth["name"], fourth["reason"], fourth["limits"]) == ("D", "seats", ("seats",))
    assert layout["batched_tokens"] == 1500


def test_default_limits_example() -> None:
    layout = limits_layout()
    assert layout["batched_tokens"] == sum(r["prompt"] for r in layout["seated"]) <= 4096
    assert len(layout["seated"]) == 3 and max(r["length"] for r in layout["seated"]) <= 4096
    assert [(r["name"], r["reason"]) for r in layout["waiting"]] == [("D", "seats")]


@pytest.mark.parametrize(
    ("budget", "requests", "named"),
    [
        (4096, [(3000, 2000)], "max_model_len=4096"),
        (2048, [(100, 100)], "max_num_batched_tokens=2048"),
        (4096, [(0, 10)], "prompt=0"),
    ],
)
def test_limits_refuse_inconsistent_requests(budget: int, requests: list[tuple[int, int]], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        limits_layout(3, budget, 4096, requests)


def test_limits_refuse_a_limit_below_one() -> None:
    with pytest.raises(ValueError, match="max_num_seqs=0"):
        limits_layout(max_num_seqs=0)


def _check_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 20_000
    pixels = image.imread(path)
    height, width = pixels.shape[:2]
    assert width >= 800 and height >= 400
    rgb = np.round(pixels[..., :3] * 255).astype(np.int64).reshape(-1, 3)
    colours = np.unique(rgb @ np.array([1 << 16, 1 << 8, 1]))  # one integer per colour: fast to count
    assert len(colours) >= 4


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_figures_are_drawn(tmp_path: Path, lang: str) -> None:
    paths = draw_why_batching(MODEL, GPU, lang, tmp_path) + draw_limits(lang, tmp_path)
    names = sorted(p.name for p in paths)
    assert names == ["limits.png", "limits.svg", "why-batching.png", "why-batching.svg"]
    for path in paths:
        assert path.is_file()
        if path.suffix == ".png":
            _check_png(path)
