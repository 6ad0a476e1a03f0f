"""The merged state of a chain of layers, on disk, keyed by the chain's ordered diffIDs.

Merging the layer indexes of an 830 MB base still touches every path (tens of thousands of nodes), so
the result is kept too: one SQLite file per chain under `<cache>/fs-index/<format>/<key>.sqlite`, where
the key is the sha256 of the index format and the ordered diffIDs (the same layers in another order, or
one more layer, are another chain). A build then asks for the few dozen rows it needs (`node`,
`children`, `dirs_named` through indexed columns) instead of loading the tree: the cost no longer grows
with the base. The file is written whole under a temp name and renamed into place, and opened
read-only and immutable; one that cannot be read as this format is ignored and made again.

Paths are stored as UTF-8 bytes with surrogate escapes (tar member names need not be UTF-8).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tarfile
import tempfile
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

from servimg.cache.layout import INDEX_FORMAT, CacheLayout, chain_key
from servimg.core.atomic import sync_dir
from servimg.core.digest import Digest
from servimg.oci.layerindex import Node

_SCHEMA = """
CREATE TABLE meta (chain TEXT NOT NULL, format TEXT NOT NULL);
CREATE TABLE nodes (
    path BLOB PRIMARY KEY, parent BLOB, name BLOB NOT NULL, layer INTEGER NOT NULL, type BLOB NOT NULL,
    mode INTEGER NOT NULL, size INTEGER NOT NULL, linkname BLOB NOT NULL, offset_data INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX nodes_by_parent ON nodes (parent);
CREATE INDEX nodes_by_name ON nodes (name);
"""
_COLUMNS = "path, layer, type, mode, size, linkname, offset_data"


def table_path(cache_root: Path, diff_ids: Sequence[Digest]) -> Path:
    return CacheLayout(cache_root).fs_index / INDEX_FORMAT / f"{chain_key(diff_ids).hex}.sqlite"


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _s(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class SqliteTable:
    """A chain's merged nodes, read on demand from its SQLite file (the `NodeTable` of a cached view)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def node(self, path: str) -> Node | None:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM nodes WHERE path = ?", (_b(path),)).fetchone()
        return None if row is None else _node(row)

    def children(self, path: str) -> Iterable[str]:
        rows = self._db.execute("SELECT path FROM nodes WHERE parent = ?", (_b(path),))
        return [_s(raw) for (raw,) in rows]

    def dirs_named(self, names: Collection[str]) -> list[str]:
        wanted = sorted({_b(n) for n in names})
        marks = ",".join("?" * len(wanted))
        rows = self._db.execute(
            f"SELECT path FROM nodes WHERE name IN ({marks}) AND type = ?", (*wanted, tarfile.DIRTYPE)
        )
        return sorted(_s(raw) for (raw,) in rows)

    def symlinks_in(self, path: str) -> set[str]:
        rows = self._db.execute(
            "SELECT path FROM nodes WHERE parent = ? AND type = ?", (_b(path), tarfile.SYMTYPE)
        )
        return {_s(raw) for (raw,) in rows}

    def below(self, path: str) -> Iterable[Node]:
        return [_node(row) for row in self._below(_COLUMNS, path)]

    def paths_below(self, path: str) -> Iterable[str]:
        return [_s(raw) for (raw,) in self._below("path", path)]

    def _below(self, columns: str, path: str) -> sqlite3.Cursor:
        # Byte order: every path under `a/b` starts with `a/b/`, and `a/b0` is the first that cannot.
        if not path:
            return self._db.execute(f"SELECT {columns} FROM nodes WHERE path > ?", (b"",))
        low = _b(path + "/")
        return self._db.execute(
            f"SELECT {columns} FROM nodes WHERE path > ? AND path < ?", (low, low[:-1] + b"0")
        )


def _node(row: tuple[bytes, int, bytes, int, int, bytes, int]) -> Node:
    path, layer, kind, mode, size, linkname, offset = row
    return Node(_s(path), layer, bytes(kind), mode, size, _s(linkname), offset)


def open_table(cache_root: Path, diff_ids: Sequence[Digest]) -> SqliteTable | None:
    """The chain's table, or None when it was never written (or is unreadable as this format)."""
    path = table_path(cache_root, diff_ids)
    if not path.is_file():
        return None
    try:
        db = sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False)
        meta = db.execute("SELECT chain, format FROM meta").fetchone()
    except sqlite3.Error:
        return None
    if meta != (chain_key(diff_ids).hex, INDEX_FORMAT):
        db.close()
        return None
    return SqliteTable(db)


def write_table(cache_root: Path, diff_ids: Sequence[Digest], nodes: Iterable[Node]) -> None:
    """Write the chain's merged nodes; the file appears whole under its name or not at all."""
    path = table_path(cache_root, diff_ids)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".sqlite", dir=path.parent)
    os.close(fd)
    try:
        with contextlib.closing(sqlite3.connect(tmp)) as db:
            db.executescript("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;" + _SCHEMA)
            db.execute("INSERT INTO meta VALUES (?, ?)", (chain_key(diff_ids).hex, INDEX_FORMAT))
            db.executemany(
                "INSERT INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    (
                        _b(n.path),
                        None if not n.path else _b(n.path.rpartition("/")[0]),
                        _b(n.path.rpartition("/")[2]),
                        n.layer,
                        n.type,
                        n.mode,
                        n.size,
                        _b(n.linkname),
                        n.offset_data,
                    )
                    for n in nodes
                ),
            )
            db.commit()
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sync_dir(path.parent)
