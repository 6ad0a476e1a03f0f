"""Deterministic layer tarballs (OCI image-spec "Layer" / changeset format).

Why our own writer: Python's `tarfile` "w:gz" stamps the gzip header with the current time and file name,
and a naive walk emits entries in directory order with real uids/mtimes, so two builds give two digests
(docs/design.md, "Decisions already taken"). Here every entry is sorted by path, owned by uid/gid 0 with empty
user/group names, stamped with one fixed mtime, has normalised modes, and carries no atime/ctime. gzip,
when asked for, is written with mtime 0, no file name and a fixed compression level.
"""

from __future__ import annotations

import enum
import gzip
import hashlib
import io
import os
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from servimg.core.atomic import atomic_stream
from servimg.core.digest import Digest
from servimg.core.errors import LayerError
from servimg.oci.image import OCI_LAYER, OCI_LAYER_GZIP

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
GZIP_LEVEL = 6
_CHUNK = 1 << 20


class Kind(enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    HARDLINK = "hardlink"
    CHAR = "char"
    BLOCK = "block"
    FIFO = "fifo"
    WHITEOUT = "whiteout"
    OPAQUE = "opaque"


@dataclass(frozen=True)
class Entry:
    """One changeset entry. `path` is relative to the image root, POSIX, no leading slash."""

    path: str
    kind: Kind
    mode: int = 0o644
    data: bytes | None = None
    source: Path | None = None
    linkname: str = ""
    devmajor: int = 0
    devminor: int = 0
    mtime: int | None = None  # None: the layer's fixed mtime; else clamped to it (SOURCE_DATE_EPOCH rule)

    @property
    def size(self) -> int:
        if self.kind is not Kind.FILE:
            return 0
        if self.data is not None:
            return len(self.data)
        assert self.source is not None
        return self.source.stat().st_size


@dataclass(frozen=True)
class LayerBlob:
    """A written layer: its diffID (sha256 of the uncompressed tar), blob digest/size and media type."""

    diff_id: Digest
    digest: Digest
    size: int
    media_type: str


def normalize_path(path: str) -> str:
    """Canonical in-layer path: relative, no `.`/empty components. Refuses `..` (escape)."""
    # str.split, not PurePosixPath: called once per tar member of every base layer indexed.
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise LayerError(f"path escapes the image root: {path!r}", hint="layer paths may not contain '..'")
    return "/".join(parts)


def normalized_mode(kind: Kind, mode: int) -> int:
    """Permission bits only; whiteouts are always 0644 files (no setuid/sticky games in what we write)."""
    if kind in (Kind.WHITEOUT, Kind.OPAQUE):
        return 0o644
    return stat.S_IMODE(mode) & 0o7777


def _tarinfo(entry: Entry, mtime: int) -> tarfile.TarInfo:
    name = entry.path
    if entry.kind is Kind.WHITEOUT:
        parent, _, base = name.rpartition("/")
        name = f"{parent}/{WHITEOUT_PREFIX}{base}" if parent else f"{WHITEOUT_PREFIX}{base}"
    elif entry.kind is Kind.OPAQUE:
        name = f"{name}/{OPAQUE_MARKER}" if name else OPAQUE_MARKER
    info = tarfile.TarInfo(name + ("/" if entry.kind is Kind.DIR else ""))
    info.mtime = mtime if entry.mtime is None else min(entry.mtime, mtime)
    info.mode = normalized_mode(entry.kind, entry.mode)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = {
        Kind.FILE: tarfile.REGTYPE,
        Kind.WHITEOUT: tarfile.REGTYPE,
        Kind.OPAQUE: tarfile.REGTYPE,
        Kind.DIR: tarfile.DIRTYPE,
        Kind.SYMLINK: tarfile.SYMTYPE,
        Kind.HARDLINK: tarfile.LNKTYPE,
        Kind.CHAR: tarfile.CHRTYPE,
        Kind.BLOCK: tarfile.BLKTYPE,
        Kind.FIFO: tarfile.FIFOTYPE,
    }[entry.kind]
    info.linkname = entry.linkname
    info.devmajor, info.devminor = entry.devmajor, entry.devminor
    info.size = entry.size
    return info


def sort_key(entry: Entry) -> tuple[str, int]:
    """Sort by path; an opaque marker sorts right after its directory, before the directory's children."""
    return (entry.path, 0 if entry.kind is Kind.DIR else 1)


def write_tar(entries: Iterable[Entry], out: BinaryIO, *, mtime: int) -> None:
    """Write a deterministic uncompressed tar of `entries` (any input order) to `out`."""
    ordered = sorted(entries, key=sort_key)
    seen: set[tuple[str, str]] = set()
    for entry in ordered:
        key = (entry.path, entry.kind.value)
        if key in seen:
            raise LayerError(f"duplicate layer entry {entry.path!r}", hint="each path may appear once")
        seen.add(key)
    # PAX only where a field needs it (long or non-ASCII names); fixed encoding keeps bytes stable.
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
        for entry in ordered:
            info = _tarinfo(entry, mtime)
            if entry.kind is Kind.FILE:
                if entry.data is not None:
                    tar.addfile(info, io.BytesIO(entry.data))
                else:
                    assert entry.source is not None
                    with entry.source.open("rb") as fh:
                        tar.addfile(info, fh)
            else:
                tar.addfile(info)


class _HashingWriter(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to an underlying file."""

    def __init__(self, sink: BinaryIO) -> None:
        self.sink = sink
        self.sha = hashlib.sha256()
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha.update(data)
        self.count += len(data)
        self.sink.write(data)
        return len(data)


def write_layer(
    entries: Iterable[Entry],
    dest: Path,
    *,
    mtime: int,
    compress: bool = False,
    through: Callable[[BinaryIO], BinaryIO] | None = None,
) -> LayerBlob:
    """Write a layer blob to `dest` (atomically: a unique temp file then rename) and return its digests.

    The temp name is unique per call, so two processes writing the same layer never share a file. No
    fsync: the blob goes into the blob store, which checks every blob's size before using it. `through`
    wraps the temp file's stream (the blob store's tap, when the layer is written into its cache)."""
    with atomic_stream(dest, 0o600, durable=False) as raw:
        blob = _HashingWriter(through(raw) if through else raw)
        if compress:
            # filename="" → no FNAME field; mtime=0 → no build time in the header.
            with gzip.GzipFile(filename="", mode="wb", fileobj=blob, mtime=0, compresslevel=GZIP_LEVEL) as gz:
                diff = _HashingWriter(gz)  # type: ignore[arg-type]
                write_tar(entries, diff, mtime=mtime)  # type: ignore[arg-type]
            diff_id = Digest("sha256", diff.sha.hexdigest())
        else:
            write_tar(entries, blob, mtime=mtime)  # type: ignore[arg-type]
            diff_id = Digest("sha256", blob.sha.hexdigest())
    media = OCI_LAYER_GZIP if compress else OCI_LAYER
    return LayerBlob(diff_id, Digest("sha256", blob.sha.hexdigest()), blob.count, media)


def entries_from_dir(root: Path) -> Iterator[Entry]:
    """Entries for every path under `root` (not following symlinks). Hardlinked files are written as
    independent regular files: cheaper to reason about and still deterministic."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = Path(dirpath, name)
            rel = full.relative_to(root).as_posix()
            yield _entry_for(full, rel)


def _entry_for(full: Path, rel: str) -> Entry:
    st = full.lstat()
    mode = st.st_mode
    # Keep each file's own mtime (clamped by the writer): Debian's stdlib pycs record their sources'
    # mtimes, so flattening them would make the whole stdlib bytecode stale.
    mtime = int(st.st_mtime)
    if stat.S_ISLNK(mode):
        return Entry(rel, Kind.SYMLINK, 0o777, linkname=os.readlink(full), mtime=mtime)
    if stat.S_ISDIR(mode):
        return Entry(rel, Kind.DIR, mode, mtime=mtime)
    if stat.S_ISREG(mode):
        return Entry(rel, Kind.FILE, mode, source=full, mtime=mtime)
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = Kind.CHAR if stat.S_ISCHR(mode) else Kind.BLOCK
        dev = (os.major(st.st_rdev), os.minor(st.st_rdev))
        return Entry(rel, kind, mode, devmajor=dev[0], devminor=dev[1], mtime=mtime)
    if stat.S_ISFIFO(mode):
        return Entry(rel, Kind.FIFO, mode, mtime=mtime)
    raise LayerError(f"cannot put {rel!r} in a layer: unsupported file type", hint="remove sockets first")


# Bounded decompression (docs/reliability.md, "gzip bomb"): a layer may expand to at most
# MAX_EXPANSION_RATIO × its compressed size + EXPANSION_ALLOWANCE, and never past MAX_LAYER_BYTES.
# Real layers expand 2-10× (wheels, shared objects, text); deflate's ceiling is ~1032×, reached only by
# runs of identical bytes. SERVIMG_MAX_EXPANSION_RATIO / SERVIMG_MAX_LAYER_BYTES raise the limits for a
# legitimate base that trips them.
MAX_EXPANSION_RATIO = 100
EXPANSION_ALLOWANCE = 64 << 20
MAX_LAYER_BYTES = 64 << 30


def decompression_limit(compressed_size: int) -> int:
    """The most uncompressed bytes a gzip layer blob of `compressed_size` bytes may produce."""
    ratio = int(os.environ.get("SERVIMG_MAX_EXPANSION_RATIO") or MAX_EXPANSION_RATIO)
    ceiling = int(os.environ.get("SERVIMG_MAX_LAYER_BYTES") or MAX_LAYER_BYTES)
    return min(ceiling, compressed_size * ratio + EXPANSION_ALLOWANCE)


class _Bounded(io.RawIOBase):
    """A read-only stream that refuses (LayerError) to produce more than `limit` bytes."""

    def __init__(self, inner: BinaryIO, limit: int, what: str) -> None:
        self._inner = inner
        self._limit = limit
        self._count = 0
        self._what = what

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b)
        want = min(len(view), self._limit - self._count + 1)
        data = self._inner.read(want)
        self._count += len(data)
        if self._count > self._limit:
            raise LayerError(
                f"{self._what}: decompresses to more than {self._limit} bytes (the limit is "
                f"{MAX_EXPANSION_RATIO}x its compressed size + {EXPANSION_ALLOWANCE >> 20} MiB); "
                "refusing a possible gzip bomb",
                hint="if the base is trusted, raise SERVIMG_MAX_EXPANSION_RATIO / SERVIMG_MAX_LAYER_BYTES",
            )
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._inner.close()
        super().close()


def open_uncompressed(path: Path, *, bounded: bool = True) -> BinaryIO:
    """Open a layer blob as an uncompressed tar stream, detecting gzip by its magic bytes.

    A gzip stream is bounded by `decompression_limit` (unless `bounded=False`); reading past it raises
    LayerError. Corrupt gzip data raises LayerError too, never a bare zlib/EOF error."""
    fh = path.open("rb")
    magic = fh.read(2)
    fh.seek(0)
    if magic != b"\x1f\x8b":
        return fh
    what = f"layer blob {path.name[:19]}"
    stream: BinaryIO = _GzipErrors(gzip.GzipFile(fileobj=fh, mode="rb"), what)  # type: ignore[assignment]
    if bounded:
        limit = decompression_limit(os.fstat(fh.fileno()).st_size)
        stream = io.BufferedReader(_Bounded(stream, limit, what))
    return stream


class _GzipErrors(io.RawIOBase):
    """Turn a truncated or corrupt gzip stream's errors into one LayerError."""

    def __init__(self, inner: gzip.GzipFile, what: str) -> None:
        self._inner = inner
        self._what = what

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        try:
            return self._inner.read(size)
        except (OSError, EOFError, zlib.error) as exc:
            raise LayerError(
                f"{self._what}: corrupt gzip stream ({exc})", hint="the blob is truncated or not gzip"
            ) from None

    def readinto(self, b: Any) -> int:
        data = self.read(len(memoryview(b)))
        memoryview(b)[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._inner.close()
        super().close()


def diff_id_of(path: Path) -> Digest:
    """sha256 of the uncompressed tar (the diffID recorded in the image config)."""
    with open_uncompressed(path) as stream:
        return Digest.of_stream(stream)
