"""`ferry explore`'s HTTP application (Starlette): the page, its static files, and two JSON endpoints.

- ``GET /``: the page (``static/index.html``); ``GET /static/FILE``: its script and style; ``GET /fonts/FILE``:
  NanumGothic for its Korean labels (nothing is fetched from anywhere else).
- ``GET /api/options?lang=en|ko``: the controls (key, label, kind, bounds, the policies that read each), the defaults,
  the words the drawing prints and the metrics' labels, in that language.
- ``GET /api/run?KEY=VALUE&...``: one simulation of those settings (the page's own query string) as the JSON of
  ``drawing.run_json``; 422 with ``{"error": {"field": KEY or null, "message": ...}}`` for settings it cannot run
  (more work than ``--max-run-tokens`` included), 503 with the same shape and ``Retry-After`` when too many runs wait.

Simulations run in worker threads, so the server answers while one runs, in two lanes by their work (``Plan.tokens``,
counted before they start): a small run (at most a tenth of the limit) never waits behind a large one. At most
``SMALL_RUNNING`` small and ``LARGE_RUNNING`` large runs simulate at once; the others wait their turn, and one whose
client has gone (the page drops the run it no longer waits for) leaves the line without running; past
``SMALL_WAITING`` or ``LARGE_WAITING`` waiting, a run is answered 503. The last ``CACHED_RUNS`` results are kept by
settings, so flipping back to an earlier setting answers at once. Unexpected errors answer 500 in the same shape and
log one line (``experiments.http_limits.Guard``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import io
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from experiments.explore.drawing import METRICS, settings_json
from experiments.explore.payload import KEYS, READ_BY, SYNTHETIC_ONLY, Explorer, Plan, SettingError, Settings
from experiments.explore.words import control_label, help_text, metric_label, unit, word, words
from experiments.http_limits import DEFAULT_MAX_REQUEST_BODY_BYTES, Guard
from experiments.teach.labels import LANGS
from policies.config import BUILTIN_POLICIES

STATIC = Path(str(resources.files("experiments.explore") / "static"))
SMALL_SHARE = 10  # a run of at most max_run_tokens / SMALL_SHARE tokens is small: it has a lane of its own
# small runs simulating at once, and waiting for a turn (a small run takes well under a second: a classroom's burst)
SMALL_RUNNING, SMALL_WAITING = 2, 32
# large runs simulating at once, and waiting: a page waits for one run at a time (it drops the one it no longer waits
# for), so two waiting lets two pages share a server; more would pile up minutes of work behind a running one
LARGE_RUNNING, LARGE_WAITING = 1, 2
RETRY_AFTER_S = 5  # the Retry-After of a 503 for a full lane (s): about one large run
POLL_S = 0.05  # how often a waiting run looks for its turn and for its client having gone (s)
CACHED_RUNS = 64  # results kept, by canonical settings
FONTS = ("NanumGothic.ttf", "NanumGothicBold.ttf")  # the page's Hangul (explore.css names them)

# (kind, bounds, unit) of each control; the labels come from words.py in the page's language
_KINDS: dict[str, dict[str, Any]] = {
    "workload": {"kind": "select"},
    "policy": {"kind": "select"},
    "max_batch_size": {"kind": "number", "min": 1, "max": 1024, "step": 1, "unit": "requests"},
    "max_delay_ms": {"kind": "range", "min": 0, "max": 500, "step": 5, "unit": "ms"},
    "max_num_seqs": {"kind": "number", "min": 1, "max": 1024, "step": 1, "unit": "sequences"},
    "max_num_batched_tokens": {"kind": "number", "min": 1, "max": 1_048_576, "step": 64, "unit": "tokens"},
    "long_prefill_token_threshold": {"kind": "number", "min": 0, "max": 1_048_576, "step": 64, "unit": "tokens"},
    "mix_prefill_decode": {"kind": "checkbox"},
    "request_rate": {"kind": "number", "min": 0.1, "step": 1, "unit": "req/s"},
    "num_prompts": {"kind": "number", "min": 1, "max": 2000, "step": 1, "unit": "requests"},
    "input_len": {"kind": "text", "unit": "tokens"},
    "output_len": {"kind": "text", "unit": "tokens"},
    "seed": {"kind": "number", "min": 0, "step": 1},
    "model": {"kind": "select"},
    "hardware": {"kind": "select"},
    "max_model_len": {"kind": "number", "min": 1, "step": 256, "unit": "tokens"},
}
assert tuple(_KINDS) == KEYS
GROUPS = (
    ("group_policy", ("policy", "max_batch_size", "max_delay_ms", "max_num_seqs", "max_num_batched_tokens",
                      "long_prefill_token_threshold", "mix_prefill_decode")),
    ("group_workload", ("workload", "request_rate", "num_prompts", "input_len", "output_len", "seed")),
    ("group_replica", ("model", "hardware", "max_model_len")),
)  # fmt: skip


class Busy(Exception):
    """Too many runs of this size wait already."""


class Lane:
    """Runs of one size: at most ``running`` simulating at once, at most ``waiting`` waiting for a turn."""

    def __init__(self, name: str, running: int, waiting: int) -> None:
        self.name = name
        self.most_running, self.most_waiting = running, waiting
        self.running = self.waiting = 0
        self.started = 0  # runs that have had a turn, since the server started
        self._lock = threading.Lock()

    def _try(self) -> bool:
        with self._lock:
            if self.running < self.most_running:
                self.running += 1
                self.started += 1
                return True
            return False

    async def enter(self, request: Request) -> bool:
        """Wait for a turn (then ``leave`` after the run); False if the client left first; ``Busy`` if the line is
        full."""
        if self._try():
            return True
        with self._lock:
            if self.waiting >= self.most_waiting:
                raise Busy(f"{self.waiting} {self.name} runs are waiting already: try again in a few seconds")
            self.waiting += 1
        try:
            while not self._try():
                if await request.is_disconnected():
                    return False
                await asyncio.sleep(POLL_S)
            return True
        finally:
            with self._lock:
                self.waiting -= 1

    def leave(self) -> None:
        with self._lock:
            self.running -= 1


class Runs:
    """The simulations behind the page: a lane for small runs and one for large ones, the last ``CACHED_RUNS``
    kept."""

    def __init__(self, explorer: Explorer) -> None:
        self.explorer = explorer
        self.small = Lane("small", SMALL_RUNNING, SMALL_WAITING)
        self.large = Lane("large", LARGE_RUNNING, LARGE_WAITING)
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def lane(self, plan: Plan) -> Lane:
        return self.small if plan.tokens * SMALL_SHARE <= self.explorer.max_run_tokens else self.large

    def cached(self, settings: Settings) -> dict[str, Any] | None:
        key = settings.model_dump_json()
        with self._lock:
            result = self._cache.get(key)
            if result is not None:
                self._cache.move_to_end(key)
            return result

    def keep(self, settings: Settings, result: dict[str, Any]) -> None:
        with self._lock:
            self._cache[settings.model_dump_json()] = result
            while len(self._cache) > CACHED_RUNS:
                self._cache.popitem(last=False)

    async def json(self, settings: Settings, request: Request) -> dict[str, Any] | None:
        """The page's JSON of ``settings``: kept, or simulated in its lane; None if the client left before its turn."""
        result = self.cached(settings)
        if result is not None:
            return result
        plan = await run_in_threadpool(self.explorer.plan, settings)
        lane = self.lane(plan)
        if not await lane.enter(request):
            return None
        try:
            result = await run_in_threadpool(self.explorer.run, settings, plan)
        finally:
            lane.leave()
        self.keep(settings, result)
        return result


def options(explorer: Explorer, lang: str) -> dict[str, Any]:
    """What the page builds its controls and labels from, in ``lang``."""
    choices: dict[str, list[dict[str, str]]] = {
        "policy": [{"value": p, "label": word(p, lang)} for p in BUILTIN_POLICIES],
        "model": [{"value": m, "label": m} for m in explorer.models],
        "hardware": [{"value": h, "label": h} for h in explorer.hardware],
        "workload": [{"value": "synthetic", "label": word("synthetic", lang)}]
        + ([{"value": "scenario", "label": word("scenario", lang)}] if explorer.scenario is not None else []),
    }
    controls = []
    for key in KEYS:
        control: dict[str, Any] = {"key": key, "label": control_label(key, lang), **_KINDS[key]}
        control["read_by"] = list(READ_BY[key]) if key in READ_BY else None
        control["when_workload"] = "synthetic" if key in SYNTHETIC_ONLY else None
        control["help"] = help_text(key, lang)
        if "unit" in control:
            control["unit"] = unit(control["unit"], lang)
        if key in choices:
            control["choices"] = choices[key]
        controls.append(control)
    scenario = explorer.scenario
    return {
        "lang": lang,
        "title": word("title", lang) + (f": {scenario.title.get(lang)}" if scenario is not None else ""),
        "point": scenario.point.get(lang) if scenario is not None and scenario.point is not None else None,
        "defaults": settings_json(explorer.defaults),
        "controls": controls,
        "groups": [{"label": word(label, lang), "keys": list(keys)} for label, keys in GROUPS],
        "words": words(lang),
        "metrics": [metric_label(key, lang) for key, _ in METRICS],
    }


@functools.cache
def korean_font(name: str) -> bytes | None:
    """A NanumGothic file of the koreanize-matplotlib package (a dependency of ferry, for `ferry teach --lang ko`),
    so the Korean page has Hangul on any machine; None if ``name`` is not one of ``FONTS``. Browsers' font checker
    (OTS) refuses these files for their empty ``TSI*`` tables (VTT hinting sources, unused when drawing), so they
    are dropped with fontTools (matplotlib's own dependency) before serving."""
    if name not in FONTS:
        return None
    spec = importlib.util.find_spec("koreanize_matplotlib")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "fonts" / name
    if not path.is_file():
        return None
    from fontTools.ttLib import TTFont

    font = TTFont(path, lazy=False)
    for tag in [t for t in font.keys() if t.startswith("TSI")]:
        del font[tag]
    out = io.BytesIO()
    font.save(out)
    return out.getvalue()


def build_app(
    explorer: Explorer,
    on_ready: Callable[[], None] | None = None,
    max_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
) -> Starlette:
    """The ASGI app over ``explorer``; ``on_ready`` is called once it has started (before its first request); a
    request body longer than ``max_body_bytes`` (bytes; the page sends none) is refused unread (413)."""
    runs = Runs(explorer)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if on_ready is not None:
            on_ready()
        yield

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    async def get_options(request: Request) -> Response:
        lang = request.query_params.get("lang", "en")
        if lang not in LANGS:
            return JSONResponse(SettingError(None, f"lang {lang!r}: choose one of {', '.join(LANGS)}").to_json(), 422)
        return JSONResponse(options(explorer, lang))

    async def run(request: Request) -> Response:
        try:
            result = await runs.json(explorer.parse(dict(request.query_params)), request)
        except SettingError as exc:
            return JSONResponse(exc.to_json(), status_code=422)
        except Busy as exc:
            headers = {"Retry-After": str(RETRY_AFTER_S)}
            return JSONResponse(SettingError(None, str(exc)).to_json(), status_code=503, headers=headers)
        if result is None:  # the client left before the run's turn: nobody to answer
            return Response(status_code=204)
        return JSONResponse(result)

    async def font(request: Request) -> Response:
        data = await run_in_threadpool(korean_font, request.path_params["name"])
        if data is None:
            return Response("no such font", status_code=404, media_type="text/plain")
        return Response(data, media_type="font/ttf", headers={"Cache-Control": "max-age=86400"})

    guard = Middleware(Guard, max_body_bytes=max_body_bytes, name="ferry explore",
                       error_body=lambda status, message: SettingError(None, message).to_json())  # fmt: skip
    app = Starlette(
        middleware=[guard],
        routes=[
            Route("/fonts/{name}", font),
            Route("/", page),
            Route("/api/options", get_options),
            Route("/api/run", run),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        lifespan=lifespan,
    )
    app.state.runs = runs  # what runs and waits, for a look from outside
    return app
