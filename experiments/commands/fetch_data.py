"""`ferry fetch-data`: download the public measurements and traces some examples and studies read, into the folder
they read them from (``../shared/data`` beside the clone, by default), each file checked against its SHA-256.

The files are Vidur's (microsoft/vidur, MIT licence, MLSys 2024): the Azure LLM inference trace 2023 as Vidur
processed it, arXiv-summarisation lengths, and per-operator GPU measurements; and ShareGPT conversation lengths as
Sarathi-Serve ships them (microsoft/sarathi-serve, MIT licence). Each is taken from a pinned commit, so the bytes are
the ones ferry's examples were run on (``experiments/public_data.sha256``; ``sha256sum -c`` checks a copy too).
``compute/a100/attention-all-models.csv`` (the A100 attention table of two examples) is not fetched: it is not in
Vidur's current tree, which keeps one ``attention.csv`` per model instead.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path

VIDUR = "https://raw.githubusercontent.com/microsoft/vidur/7d47513363ec447a741ac5e47241580b47724fbf/"
SARATHI = "https://raw.githubusercontent.com/microsoft/sarathi-serve/72339db5b120614033b317880ad3a05a5e4c9415/"
TIMEOUT_S = 60.0  # the longest wait for a file's next bytes
DEFAULT_DEST = Path("../shared/data")  # where the docs' examples read them from

CHECKSUMS = "public_data.sha256"  # beside this package's modules, in `sha256sum` format: "DIGEST  PLACE" per line


def files() -> dict[str, str]:
    """Each file's place under the destination -> its SHA-256 (of the pinned commit's bytes)."""
    text = (resources.files("experiments") / CHECKSUMS).read_text()
    return {place: digest for digest, place in (line.split() for line in text.splitlines() if line.strip())}


def source(name: str) -> str:
    """The URL of one of ``files()`` at its pinned commit."""
    if name.startswith("traces/sharegpt"):
        return SARATHI + "data/processed_traces/" + name.removeprefix("traces/")
    if name.startswith("traces/"):
        return VIDUR + "data/processed_traces/" + name.removeprefix("traces/")
    return VIDUR + "data/profiling/" + name.removeprefix("vidur-profiling/")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fetch-data",
        help="download the public traces and measurements the examples read (Vidur's, Sarathi-Serve's)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--dest", type=Path, default=DEFAULT_DEST, help=f"folder to fill (default {DEFAULT_DEST})")
    p.add_argument(
        "--mirror",
        default=None,
        metavar="URL",
        help="fetch every file from URL/<its place under --dest> instead (another copy of the folder: file:// too)",
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    fetched = kept = 0
    for name, digest in files().items():
        path = args.dest / name
        if path.is_file():
            if _sha256(path.read_bytes()) != digest:
                raise ValueError(f"{path} is there with other contents than the published file; move it away first")
            kept += 1
            continue
        url = args.mirror.rstrip("/") + "/" + name if args.mirror else source(name)
        data = _download(url)
        if _sha256(data) != digest:
            raise ValueError(f"{url}: its SHA-256 is not the published file's ({digest[:12]}...); nothing written")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_bytes(data)
        os.replace(partial, path)  # whole or not at all
        fetched += 1
        print(f"ferry fetch-data: {path} ({len(data) / 1e6:.1f} MB)", file=sys.stderr)
    print(f"{fetched} files fetched, {kept} already there, into {args.dest}")
    return 0


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:  # noqa: S310 (https or the user's mirror)
            return bytes(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ValueError(f"{url}: cannot download ({type(exc).__name__}: {reason})") from None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
