"""`ferry explore`'s HTTP application (Starlette): the page, its static files, and two JSON endpoints.

- ``GET /``: the page (``static/index.html``); ``GET /static/FILE``: its script and style; ``GET /fonts/FILE``:
  NanumGothic for its Korean labels (nothing is fetched from anywhere else).
- ``GET /api/options?lang=en|ko``: the controls (key, label, kind, bounds, the policies that read each), the defaults,
  the words the drawing prints and the metrics' labels, in that language.
- ``GET /api/run?KEY=VALUE&...``: one simulation of those settings (the page's own query string) as the JSON of
  ``payload.run_json``; 422 with ``{"error": {"field": KEY or null, "message": ...}}`` for settings it cannot run.

Simulations run in worker threads, at most ``MAX_RUNNING`` at once, so the server answers while one runs; the last
``CACHED_RUNS`` results are kept by settings, so flipping back to an earlier setting answers at once.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from experiments.explore.payload import KEYS, METRICS, READ_BY, SYNTHETIC_ONLY, Explorer, SettingError, Settings
from experiments.explore.words import control_label, help_text, metric_label, unit, word, words
from experiments.teach.labels import LANGS
from policies.config import BUILTIN_POLICIES

STATIC = Path(str(resources.files("experiments.explore") / "static"))
MAX_RUNNING = 2  # simulations at once (the page cancels what it no longer waits for; the server cannot)
CACHED_RUNS = 64  # results kept, by canonical settings
FONTS = ("NanumGothic.ttf", "NanumGothicBold.ttf")  # the page's Hangul (explore.css names them)

log = logging.getLogger("ferry.explore")

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


class Runs:
    """The simulations behind the page: at most ``MAX_RUNNING`` at once, the last ``CACHED_RUNS`` kept."""

    def __init__(self, explorer: Explorer) -> None:
        self.explorer = explorer
        self._slots = threading.BoundedSemaphore(MAX_RUNNING)
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def json(self, settings: Settings) -> dict[str, Any]:
        key = settings.model_dump_json()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        with self._slots:
            result = self.explorer.run(settings)
        with self._lock:
            self._cache[key] = result
            while len(self._cache) > CACHED_RUNS:
                self._cache.popitem(last=False)
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
        "defaults": explorer.defaults.model_dump(),
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


def build_app(explorer: Explorer, on_ready: Callable[[], None] | None = None) -> Starlette:
    """The ASGI app over ``explorer``; ``on_ready`` is called once it has started (before its first request)."""
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
            settings = explorer.parse(dict(request.query_params))
            return JSONResponse(await run_in_threadpool(runs.json, settings))
        except SettingError as exc:
            return JSONResponse(exc.to_json(), status_code=422)
        except Exception as exc:  # a bug of ours: one line on the page, the traceback in the server's log
            log.exception("ferry explore: the run of %s failed", dict(request.query_params))
            message = f"the simulation failed ({type(exc).__name__}: {exc}); the server's log has the details"
            return JSONResponse(SettingError(None, message).to_json(), status_code=500)

    async def font(request: Request) -> Response:
        data = await run_in_threadpool(korean_font, request.path_params["name"])
        if data is None:
            return Response("no such font", status_code=404, media_type="text/plain")
        return Response(data, media_type="font/ttf", headers={"Cache-Control": "max-age=86400"})

    return Starlette(
        routes=[
            Route("/fonts/{name}", font),
            Route("/", page),
            Route("/api/options", get_options),
            Route("/api/run", run),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        lifespan=lifespan,
    )
