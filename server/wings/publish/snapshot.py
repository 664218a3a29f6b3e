"""A consistent local copy of one committed generation, taken in milliseconds and uploaded after.

The caller holds the index's writer lock while `stage_snapshot` runs, so nothing commits, and no
tidy rewrites or prunes a search table, while it copies: the database through SQLite's online
backup API (one read transaction: exactly one committed generation), and the LanceDB files as
hard links (Lance never changes a data file in place, and a link keeps a file's bytes after a
later tidy deletes its name). The upload then runs without the lock, from the links.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from canopy.health import DB_NAME

__all__ = ["StagedSnapshot", "stage_snapshot"]

LANCE_DIR = "lance"


@dataclass(frozen=True)
class StagedSnapshot:
    folder: Path  # an index folder: canopy.sqlite and lance/
    generation: int
    lance_versions: dict[str, int]
    snapshot_ns: int  # when it was taken (time.time_ns, under the writer lock)

    def files(self) -> list[Path]:
        return sorted(p for p in self.folder.rglob("*") if p.is_file())


def stage_snapshot(index_dir: Path, folder: Path) -> StagedSnapshot:
    """Copy the committed generation of `index_dir` into the new folder `folder` (the caller
    holds the writer lock)."""
    folder.mkdir(parents=True)
    taken = time.time_ns()
    src = sqlite3.connect(f"file:{index_dir / DB_NAME}?mode=ro", uri=True)
    dst = sqlite3.connect(folder / DB_NAME)
    try:
        src.backup(dst)
        # One self-contained file: a replica opens it without a WAL beside it.
        dst.execute("PRAGMA journal_mode=DELETE")
        meta = dict(dst.execute("SELECT key, value FROM meta WHERE key IN "
                                "('generation', 'lance_versions')").fetchall())
    finally:
        dst.close()
        src.close()
    lance = index_dir / LANCE_DIR
    for path in sorted(lance.rglob("*")) if lance.is_dir() else []:
        if not path.is_file():
            continue
        target = folder / LANCE_DIR / path.relative_to(lance)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:  # a filesystem without hard links: copy (still under the lock)
            shutil.copy2(path, target)
    return StagedSnapshot(folder, int(meta.get("generation", 0)),
                          {k: int(v) for k, v in json.loads(meta.get("lance_versions") or "{}")
                           .items()}, taken)
