"""`ferry explore` in a real headless browser (Debian's chromium, driven by Playwright): load the page, move the max
delay control, and check that the boxes drawn and the numbers shown are what the simulation returns for the new
settings; a bad combination shows its error beside its control; the Korean page speaks Korean. Screenshots are kept
in ``artifacts/explore/`` (or ``$FERRY_ARTIFACTS``).

Without chromium or Playwright the tests skip, saying what to install, unless ``FERRY_REQUIRE_BROWSER=1`` (as
``.ci/run`` sets), where that is a failure."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import ROOT, serving

CHROMIUM = os.environ.get("FERRY_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("FERRY_ARTIFACTS", ROOT / "artifacts")) / "explore"


def _need(reason: str) -> None:
    if os.environ.get("FERRY_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving([], tmp_path_factory.mktemp("explore") / "stderr.txt", command="explore") as (_, address):
        yield address


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ModuleNotFoundError:
        _need("the browser test needs Playwright: pip install -e '.[dev]'")
    if not Path(CHROMIUM).exists():
        _need(f"the browser test needs Debian's chromium at {CHROMIUM}: apt-get install chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield page
    context.close()
    assert not [e for e in errors if "422" not in e], errors  # a refused setting's 422 is the page's business


def _drawn_runs(page: Any, runs: int) -> None:
    """Wait until the page has drawn its ``runs``-th run and has nothing in flight."""
    page.wait_for_function(f"document.body.dataset.runs === '{runs}' && document.body.dataset.busy === '0'")


def _boxes(page: Any, selector: str) -> list[tuple[str, int, str, int]]:
    """The computing boxes drawn in ``selector``: (request, iteration, phase, tokens), sorted."""
    got = page.eval_on_selector_all(
        f"{selector} .box",
        "els => els.map(e => [e.dataset.request, +e.dataset.iteration, e.dataset.phase, +e.dataset.tokens])",
    )
    return sorted(tuple(b) for b in got if b[2] in ("prefill", "prefill_chunk", "decode"))


def _simulated(url: str, query: dict[str, str]) -> dict[str, Any]:
    got = httpx.get(url + "api/run", params=query, timeout=60)
    assert got.status_code == 200, got.text
    return got.json()


def _expected(run: dict[str, Any]) -> list[tuple[str, int, str, int]]:
    return sorted(
        (s["request"], s["iteration"], s["kind"], s["tokens"])
        for s in run["spans"]
        if s["kind"] in ("prefill", "prefill_chunk", "decode")
    )


def _shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def test_moving_max_delay_redraws_what_the_simulation_returns(page: Any, url: str) -> None:
    start = {"policy": "dynamic", "max_batch_size": "4"}
    page.goto(url + "?policy=dynamic&max_batch_size=4")
    _drawn_runs(page, 1)
    before = _simulated(url, start | {"max_delay_ms": "0"})
    assert _boxes(page, "#timeline") == _expected(before)
    _shot(page, "max-delay-0.png")

    page.locator("#max_delay_ms").fill("200")  # the slider, moved: input and change events
    _drawn_runs(page, 2)
    after = _simulated(url, start | {"max_delay_ms": "200"})
    assert _expected(after) != _expected(before)  # the boat now waits to fill: other batches
    assert _boxes(page, "#timeline") == _expected(after)
    assert _boxes(page, "#timeline-before") == _expected(before)  # the run before, beside it
    for key in ("ttft_mean_ms", "e2el_p90_ms", "mean_batch_size", "gpu_idle_ms"):
        shown = float(page.get_attribute(f"#metric-{key}", "data-value"))
        assert shown == pytest.approx(after["metrics"][key], rel=1e-9)
        was = float(page.get_attribute(f"#before-{key}", "data-value"))
        assert was == pytest.approx(before["metrics"][key], rel=1e-9)
    assert after["metrics"]["mean_batch_size"] > before["metrics"]["mean_batch_size"]  # fuller boats
    assert "max_delay_ms=200" in page.url  # the address holds the settings
    seats = page.eval_on_selector_all("#seats .seat-box", "els => els.length")
    assert seats > 0
    _shot(page, "max-delay-200.png")

    page.goto(page.url)  # the link reopens the same settings
    _drawn_runs(page, 1)
    assert page.input_value("#max_delay_ms") == "200"
    assert _boxes(page, "#timeline") == _expected(after)


def test_a_bad_combination_shows_its_error_beside_the_control(page: Any, url: str) -> None:
    page.goto(url + "?policy=continuous&max_num_seqs=4")
    _drawn_runs(page, 1)
    drawn = _boxes(page, "#timeline")
    page.locator("#max_num_batched_tokens").fill("256")  # a whole prompt no longer fits one iteration
    page.wait_for_function("document.body.dataset.error === 'max_num_batched_tokens'")
    error = page.locator("#error-max_num_batched_tokens")
    assert error.is_visible() and "max_num_batched_tokens=256 is smaller than max_model_len" in error.inner_text()
    assert page.get_attribute("#max_num_batched_tokens", "aria-invalid") == "true"
    assert _boxes(page, "#timeline") == drawn  # the last drawing stays
    _shot(page, "error.png")

    page.select_option("#policy", "chunked")  # the same budget is fine with chunked prefill
    _drawn_runs(page, 2)
    assert not page.locator("#error-max_num_batched_tokens").inner_text().strip()
    chunked = _simulated(url, {"policy": "chunked", "max_num_seqs": "4", "max_num_batched_tokens": "256"})
    assert _boxes(page, "#timeline") == _expected(chunked)
    assert any(b[2] == "prefill_chunk" for b in _expected(chunked))


def test_the_korean_page(page: Any, url: str) -> None:
    page.goto(url + "?lang=ko&policy=chunked&max_num_batched_tokens=256")
    _drawn_runs(page, 1)
    text = page.inner_text("body")
    assert "디코드" in text and "청크" in text and "최대 배치 토큰 수" in text
    faces = page.evaluate(
        """Promise.all(['400', '700'].map(w => document.fonts.load(w + ' 16px "ferry Hangul"', '배치')))
             .then(() => [...document.fonts].filter(f => f.family === 'ferry Hangul').map(f => f.status))"""
    )
    assert faces == ["loaded", "loaded"], faces  # Hangul drawn from the server's font, on any machine
    _shot(page, "korean.png")
