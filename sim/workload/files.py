"""Opening a trace or length file whatever its name says: compression (gzip, bz2, xz, a one-file zip) and text
encoding (UTF-8 with or without BOM, UTF-16/UTF-32 with BOM) are told by the first bytes; anything else is refused
with a ``ValueError`` naming the file. ``sim.workload.traces`` reads the formats on top of these.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import pandas as pd


# compression, told by the first bytes (not the name); pandas and the standard library read all four
_COMPRESSIONS = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "xz"), (b"PK\x03\x04", "zip"))
# text encoding, told by the byte-order mark; UTF-32-LE's mark starts with UTF-16-LE's, so it is tried first
_BOMS = (
    (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xff\xfe\x00\x00", "utf-32"),
    (b"\x00\x00\xfe\xff", "utf-32"),
    (b"\xff\xfe", "utf-16"),
    (b"\xfe\xff", "utf-16"),
)
# what a damaged compressed file raises while it is read
DAMAGED = (OSError, EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile)


@contextmanager
def binary(path: Path, compression: str | None) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed."""
    if compression == "zip":
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
            if len(members) != 1:
                raise ValueError(f"{path}: a zip archive of {len(members)} files; a trace must be its only file")
            with archive.open(members[0]) as f:
                yield f
    elif compression is not None:
        module = {"gzip": gzip, "bz2": bz2, "xz": lzma}[compression]
        with module.open(path, "rb") as f:
            yield cast(IO[bytes], f)
    else:
        with open(path, "rb") as f:
            yield f


def sniff(path: Path, where: str) -> tuple[str | None, str]:
    """(compression, text encoding) of a file, from its first bytes; refuses what is neither."""
    with open(path, "rb") as f:
        magic = f.read(6)
    compression = next((name for start, name in _COMPRESSIONS if magic.startswith(start)), None)
    try:
        with binary(path, compression) as f:
            head = f.read(4096)
    except DAMAGED as exc:
        raise ValueError(f"{where}: starts like {compression} data but cannot be decompressed ({exc})") from None
    encoding = next((name for bom, name in _BOMS if head.startswith(bom)), "utf-8")
    if encoding.startswith("utf-8") and b"\x00" in head:
        raise ValueError(
            f"{where}: has NUL bytes in its first 4 kB, so it is not UTF-8 text: binary data, or UTF-16/32 "
            "text without a byte-order mark (save it as UTF-8)"
        )
    return compression, encoding


def undecodable(where: str, encoding: str, exc: UnicodeDecodeError) -> ValueError:
    bad = exc.object[exc.start : exc.start + 4]
    name = encoding.removesuffix("-sig").upper()
    return ValueError(f"{where}: is not {name} text ({exc.reason}: {bad!r}); save it as UTF-8")


# a field after the last column (a trailing comma) is ignored; without index_col=False pandas would take the first
# field of such a first row as the index and shift every column by one
CSV_OPTIONS: dict[str, Any] = {"skipinitialspace": True, "index_col": False}


def read_frame(path: Path, where: str, **options: object) -> pd.DataFrame:
    """``pd.read_csv`` of a file whose compression and encoding ``sniff`` tells; what pandas raises about the
    file becomes a ``ValueError`` naming it. An empty file is an empty frame."""
    import pandas as pd

    compression, encoding = sniff(path, where)
    try:
        return pd.read_csv(path, compression=compression, encoding=encoding, **CSV_OPTIONS, **options)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except UnicodeDecodeError as exc:
        raise undecodable(where, encoding, exc) from None
    except DAMAGED as exc:
        if compression is None:
            raise
        raise ValueError(f"{where}: damaged {compression} data ({exc})") from None
    except ValueError as exc:  # pandas' ParserError and kin, which do not name the file
        raise ValueError(f"{where}: cannot read it as CSV: {str(exc).strip()}") from None


@contextmanager
def open_text(path: Path, where: str) -> Iterator[io.TextIOWrapper]:
    """The file as text lines; a line that is not valid text in its encoding keeps its bad bytes as lone
    surrogates (``surrogateescape``), which the reader refuses, naming the line."""
    compression, encoding = sniff(path, where)
    with binary(path, compression) as raw:
        yield io.TextIOWrapper(raw, encoding=encoding, errors="surrogateescape")


def is_jsonl(path: Path) -> bool:
    """Named ``*.jsonl``, or that and a compression's suffix (``*.jsonl.gz``)."""
    suffixes = [s.lower() for s in path.suffixes]
    compressed = suffixes[-1:] in ([".gz"], [".bz2"], [".xz"], [".zip"])
    return bool(suffixes) and (suffixes[-1] == ".jsonl" or (compressed and suffixes[-2:-1] == [".jsonl"]))
