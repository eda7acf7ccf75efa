"""How the teaching figures look: one colour per thing a request can be doing, the font for each language, slide
sizes, and saving each figure as PNG and SVG.

Korean labels need a font with Hangul. ferry depends on ``koreanize-matplotlib`` only for the NanumGothic files it
ships (it is never imported: importing it would change matplotlib's settings for the whole process); a system font
with Hangul (Noto Sans CJK, Nanum, Un) is used if that package is missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

# what a request is doing in an iteration, or between iterations (colour-blind-safe Okabe-Ito hues)
COLORS = {
    "prefill": "#0072B2",  # blue
    "prefill_chunk": "#56B4E9",  # sky blue
    "decode": "#E69F00",  # orange
    "waiting": "#D9D9D9",  # light grey
    "held": "#CC79A7",  # reddish purple
    "stalled": "#F0E442",  # yellow: seated, but the iteration has no work for it
    "empty": "#FFFFFF",
    "idle": "#B22222",  # the GPU idle between iterations
}
EDGE = "#333333"
SLIDE = (12.0, 6.75)  # inches: a 16:9 slide at 160 dpi is 1920 x 1080
DPI = 160
KOREAN_FAMILIES = ("NanumGothic", "Noto Sans CJK KR", "Noto Sans KR", "Noto Sans CJK JP", "UnDotum", "Baekmuk Gulim")


def korean_font() -> str:
    """The family name of a font with Hangul, registered with matplotlib; raises ValueError naming what to install."""
    spec = importlib.util.find_spec("koreanize_matplotlib")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = Path(folder) / "fonts" / "NanumGothic.ttf"
            if path.is_file():
                for face in sorted(path.parent.glob("NanumGothic*.ttf")):  # regular, bold, extra bold, light
                    font_manager.fontManager.addfont(str(face))
                return font_manager.FontProperties(fname=str(path)).get_name()
    installed = {f.name for f in font_manager.fontManager.ttflist}
    for family in KOREAN_FAMILIES:
        if family in installed:
            return family
    raise ValueError(
        "--lang ko needs a font with Hangul, and none was found: ferry installs koreanize-matplotlib for its "
        "NanumGothic (pip install koreanize-matplotlib), or install a system font (Debian: fonts-nanum or "
        "fonts-noto-cjk)"
    )


@contextmanager
def language(lang: str) -> Iterator[None]:
    """matplotlib settings for figures in ``lang``: the font, sizes readable on a slide, SVG text as paths."""
    family = korean_font() if lang == "ko" else "DejaVu Sans"
    with plt.rc_context(
        {
            "font.family": [family, "DejaVu Sans"],
            "font.size": 13,
            "axes.titlesize": 15,
            "axes.labelsize": 13,
            "legend.fontsize": 11,
            "xtick.labelsize": 11,
            "ytick.labelsize": 11,
            "axes.unicode_minus": False,  # NanumGothic has no U+2212
            "svg.fonttype": "path",
            "svg.hashsalt": "ferry",  # the same figure makes the same SVG
            "figure.dpi": 100,
        }
    ):
        yield


def save(fig: Figure, out: Path, stem: str) -> list[Path]:
    """Write ``fig`` as ``out/stem.png`` and ``out/stem.svg``; closes it; returns the two paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.png", out / f"{stem}.svg"]
    tight = None if fig.get_layout_engine() is not None else "tight"  # a laid-out figure needs no second pass
    fig.savefig(paths[0], dpi=DPI, bbox_inches=tight, metadata={"Software": None})
    fig.savefig(paths[1], bbox_inches=tight, metadata={"Date": None})
    plt.close(fig)
    return paths
