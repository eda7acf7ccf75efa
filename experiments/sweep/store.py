"""Where a sweep keeps its results: one small JSON file per finished point, written whole or not at all (a point
is either stored or absent, so a sweep killed at any moment loses only the points in flight), and the table of them
all, ``results.parquet``, rebuilt from those files."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

POINTS = "points"  # the folder of finished points, one <hash>.json each
TABLE = "results.parquet"
SIDECAR = "sweep.json"
# bookkeeping columns, first in the table
FIRST = ("point", "hash", "status", "error", "seed", "wall_s", "ferry_version", "mode")


class Store:
    """The finished points of a sweep in ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.folder = out / POINTS
        self.table = out / TABLE

    def done(self) -> set[str]:
        """Hashes of the points already stored."""
        if not self.folder.is_dir():
            return set()
        return {p.stem for p in self.folder.glob("*.json")}

    def put(self, row: dict[str, Any]) -> None:
        """Store one finished point (whole: a temporary name, then an atomic rename)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{row['hash']}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
        tmp.write_text(json.dumps(row, default=_plain, allow_nan=True))
        os.replace(tmp, path)

    def rows(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.folder.glob("*.json"))] if self.folder.is_dir() else []

    def write_table(self, swept: list[str], hashes: list[str], csv: bool = False) -> pd.DataFrame:
        """``results.parquet`` from the stored points of this sweep (``hashes``, in expansion order): one row each,
        swept parameters as columns, then every metric; the swept names in the schema's metadata. Returns the
        table written (at ``self.table``)."""
        order = {h: k for k, h in enumerate(hashes)}
        rows = [r for r in self.rows() if r["hash"] in order]
        rows.sort(key=lambda r: order[r["hash"]])
        frame = pd.DataFrame(rows)
        if len(frame):
            frame["point"] = [order[h] for h in frame["hash"]]
        columns = [c for c in FIRST if c in frame.columns] + [c for c in swept if c in frame.columns and c not in FIRST]
        frame = frame[columns + [c for c in frame.columns if c not in columns]]
        table = pa.Table.from_pandas(frame, preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"ferry.swept": json.dumps(swept)})
        tmp = self.table.with_name(f".{self.table.name}.partial")
        pq.write_table(table, tmp)
        os.replace(tmp, self.table)
        if csv:
            frame.to_csv(self.out / "results.csv", index=False)
        return frame


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, float) and math.isinf(value):
        return str(value)
    return str(value)
