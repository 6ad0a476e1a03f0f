"""A layer as a listing: one `FileEntry` per path, with the facts a tar header and the file content carry.

Listings have a canonical text form (`render_listing`, one tab-separated line per path, sorted), so a
listing can be stored next to a build and compared later without the layer (`oci.treediff` compares
them). Listings are read from an uncompressed tar stream (never extracted, `listing_from_tar`) or from a
directory (lstat, links not followed, `listing_from_dir`).

What a listing does NOT capture, so two layers can differ with no path listed: entry order, duplicate
entries (the last one wins, as when a runtime unpacks the layer), uname/gname, pax records (atime,
ctime, xattrs) and padding. `treediff.explain` says so when it happens.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import stat
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from servimg.core.errors import LayerError
from servimg.oci.layer import normalize_path

ROOT = "."
"""The path of a tar's own root entry (`./`): its mode and owner matter when a runtime unpacks it."""

KINDS: Mapping[str, str] = {
    "f": "file",
    "d": "directory",
    "l": "symlink",
    "h": "hardlink",
    "c": "char device",
    "b": "block device",
    "p": "fifo",
}
"""Entry kinds (one letter each, as in the listing line) and the words `describe` uses for them."""

FIELDS = ("kind", "size", "digest", "mode", "uid", "gid", "mtime")
"""The compared facts, most telling first: content before metadata, mtime (most often noise) last."""

_CHUNK = 1 << 20
_TAR_KINDS: Mapping[bytes, str] = {
    tarfile.REGTYPE: "f",
    tarfile.AREGTYPE: "f",
    tarfile.CONTTYPE: "f",
    tarfile.DIRTYPE: "d",
    tarfile.SYMTYPE: "l",
    tarfile.LNKTYPE: "h",
    tarfile.CHRTYPE: "c",
    tarfile.BLKTYPE: "b",
    tarfile.FIFOTYPE: "p",
}
_ESCAPE = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_UNESCAPE = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
_ESCAPE_RE = re.compile(r"\\(.?)", re.DOTALL)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_DEVICE_RE = re.compile(r"[0-9]+,[0-9]+")
_MODE_RE = re.compile(r"[0-7]{4}")
_UINT_RE = re.compile(r"[0-9]+")
_INT_RE = re.compile(r"-?[0-9]+")


def escape(text: str) -> str:
    """Escape backslash, tab, newline and CR, so a path or link target fits in one tab-separated field
    of one line whatever bytes it holds."""
    return text.translate(_ESCAPE)


def unescape(text: str) -> str:
    """Invert `escape`; raise ValueError on an escape `escape` never writes (a corrupt listing)."""

    def one(match: re.Match[str]) -> str:
        char = match.group(1)
        if char not in _UNESCAPE:
            raise ValueError(f"bad escape {match.group(0)!r} (only \\\\, \\t, \\n, \\r)")
        return _UNESCAPE[char]

    return _ESCAPE_RE.sub(one, text)


# -- entries ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileEntry:
    """The facts of one path in a layer or tree that make its bytes in a layer what they are.

    `digest` is what identifies the entry's content for its kind: the sha256 hex of a regular file, the
    target of a symlink or hardlink, "major,minor" of a device, "" for directories and FIFOs. `size` is
    0 for everything but regular files (a hardlink's tar header carries no data)."""

    path: str
    kind: str
    mode: int
    uid: int
    gid: int
    size: int
    mtime: int
    digest: str

    def line(self) -> str:
        """The canonical listing line (no newline): path, kind, mode (4 octal digits), uid, gid, size,
        mtime, digest, tab-separated; path and digest escaped (`escape`)."""
        return "\t".join(
            (
                escape(self.path),
                self.kind,
                f"{self.mode & 0o7777:04o}",
                str(self.uid),
                str(self.gid),
                str(self.size),
                str(self.mtime),
                escape(self.digest),
            )
        )

    @classmethod
    def from_line(cls, line: str) -> FileEntry:
        """Parse one `line()`; raise LayerError naming every malformed field."""
        entry, problems = _parse_line(line)
        if entry is None:
            raise LayerError(f"malformed listing line {line!r}", problems=problems)
        return entry

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "kind": self.kind,
            "mode": f"{self.mode:04o}",
            "uid": self.uid,
            "gid": self.gid,
            "size": self.size,
            "mtime": self.mtime,
            "digest": self.digest,
        }


def _parse_line(line: str) -> tuple[FileEntry | None, list[str]]:
    """(entry, []) or (None, every problem of the line): the collect-then-raise-once validator."""
    fields = line.split("\t")
    if len(fields) != 8:
        return None, [f"expected 8 tab-separated fields, got {len(fields)}"]
    raw_path, kind, mode, uid, gid, size, mtime, raw_digest = fields
    problems: list[str] = []
    path = digest = ""
    try:
        path = unescape(raw_path)
    except ValueError as exc:
        problems.append(f"path: {exc}")
    else:
        problems.extend(_path_problems(path))
    try:
        digest = unescape(raw_digest)
    except ValueError as exc:
        problems.append(f"digest: {exc}")
    if kind not in KINDS:
        problems.append(f"kind {kind!r} is not one of {' '.join(KINDS)}")
    if not _MODE_RE.fullmatch(mode):
        problems.append(f"mode {mode!r} is not 4 octal digits")
    for name, value, pattern in (("uid", uid, _UINT_RE), ("gid", gid, _UINT_RE), ("size", size, _UINT_RE)):
        if not pattern.fullmatch(value):
            problems.append(f"{name} {value!r} is not a non-negative integer")
    if not _INT_RE.fullmatch(mtime):
        problems.append(f"mtime {mtime!r} is not an integer")
    if kind in KINDS and not problems:
        problems.extend(_kind_problems(kind, int(size), digest))
    if problems:
        return None, problems
    return FileEntry(path, kind, int(mode, 8), int(uid), int(gid), int(size), int(mtime), digest), []


def _path_problems(path: str) -> list[str]:
    if path == ROOT:
        return []
    if not path:
        return ["path is empty"]
    try:
        normal = normalize_path(path)
    except LayerError as exc:
        return [f"path {path!r}: {exc.message}"]
    return [] if normal == path else [f"path {path!r} is not normalised (expected {normal!r})"]


def _kind_problems(kind: str, size: int, digest: str) -> list[str]:
    problems: list[str] = []
    if kind != "f" and size != 0:
        problems.append(f"size {size} of a {KINDS[kind]} must be 0")
    if kind == "f" and not _SHA256_RE.fullmatch(digest):
        problems.append(f"digest {digest!r} of a file is not 64 lowercase hex characters")
    elif kind in "cb" and not _DEVICE_RE.fullmatch(digest):
        problems.append(f"digest {digest!r} of a device is not MAJOR,MINOR")
    elif kind in "dp" and digest:
        problems.append(f"digest of a {KINDS[kind]} must be empty, not {digest!r}")
    elif kind == "h" and not digest:
        problems.append("a hardlink needs its target as digest")
    return problems


# -- listings -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerListing:
    """Every path of one layer (or tree), sorted by path, each path once. Build with `of()`."""

    entries: tuple[FileEntry, ...] = ()

    def __post_init__(self) -> None:
        for before, after in zip(self.entries, self.entries[1:], strict=False):
            if not before.path < after.path:
                raise LayerError(
                    f"listing is not sorted by path, each path once: {before.path!r} then {after.path!r}",
                    hint="build a LayerListing with LayerListing.of(entries)",
                )

    @classmethod
    def of(cls, entries: Iterable[FileEntry]) -> LayerListing:
        """Sort by path; a path listed twice keeps its LAST entry (what unpacking the tar leaves)."""
        by_path = {e.path: e for e in entries}
        return cls(tuple(by_path[p] for p in sorted(by_path)))

    def __iter__(self) -> Iterator[FileEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def by_path(self) -> dict[str, FileEntry]:
        return {e.path: e for e in self.entries}


def _hash_stream(stream: IO[bytes]) -> tuple[str, int]:
    sha = hashlib.sha256()
    size = 0
    while block := stream.read(_CHUNK):
        sha.update(block)
        size += len(block)
    return sha.hexdigest(), size


def listing_from_tar(fileobj: BinaryIO) -> LayerListing:
    """List an uncompressed tar stream, hashing each file's content as it passes (never extracting, one
    forward pass: a pipe or a gzip reader is as good as a file). Whiteouts (`.wh.*`) are listed as the
    files they are in the tar: a layer's listing is its changeset, not the merged filesystem."""
    entries: list[FileEntry] = []
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as tar:
            for info in tar:
                entries.append(_tar_entry(tar, info))
    except tarfile.TarError as exc:
        raise LayerError(
            f"not a readable uncompressed tar: {exc}", hint="decompress the layer first"
        ) from exc
    return LayerListing.of(entries)


def _tar_entry(tar: tarfile.TarFile, info: tarfile.TarInfo) -> FileEntry:
    try:
        path = normalize_path(info.name) or ROOT
    except LayerError as exc:
        raise exc.context(f"tar entry {info.name!r}") from None
    kind = _TAR_KINDS.get(info.type)
    if kind is None:
        raise LayerError(
            f"tar entry {info.name!r} has unsupported type {info.type!r}",
            hint="a layer holds files, directories, links, devices and FIFOs only",
        )
    size = 0
    digest = ""
    if kind == "f":
        data = tar.extractfile(info)
        assert data is not None  # a regular member always has a data stream
        digest, size = _hash_stream(data)
    elif kind == "l":
        digest = info.linkname
    elif kind == "h":
        try:
            digest = normalize_path(info.linkname)
        except LayerError as exc:
            raise exc.context(f"hardlink {info.name!r} target") from None
    elif kind in "cb":
        digest = f"{info.devmajor},{info.devminor}"
    return FileEntry(path, kind, info.mode & 0o7777, info.uid, info.gid, size, math.floor(info.mtime), digest)


def listing_from_dir(root: Path) -> LayerListing:
    """List every path under `root` (not `root` itself), by lstat: symlinks are listed, never followed.
    Hardlinked files are listed as regular files, each with its content, as servimg's layer writer
    writes them. Sockets cannot be in a layer: every one found is named, and the listing refused."""
    entries: list[FileEntry] = []
    problems: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            full = Path(dirpath, name)
            rel = full.relative_to(root).as_posix()
            entry = _dir_entry(full, rel)
            if entry is None:
                problems.append(f"{rel}: a socket or other file type a layer cannot hold")
            else:
                entries.append(entry)
    if problems:
        raise LayerError(f"cannot list {root}", problems=problems, hint="remove sockets first")
    return LayerListing.of(entries)


def _dir_entry(full: Path, rel: str) -> FileEntry | None:
    st = full.lstat()
    mode = st.st_mode
    size = 0
    digest = ""
    if stat.S_ISREG(mode):
        kind = "f"
        with full.open("rb") as fh:
            digest, size = _hash_stream(fh)
    elif stat.S_ISDIR(mode):
        kind = "d"
    elif stat.S_ISLNK(mode):
        kind, digest = "l", os.readlink(full)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = "c" if stat.S_ISCHR(mode) else "b"
        digest = f"{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
    elif stat.S_ISFIFO(mode):
        kind = "p"
    else:
        return None
    return FileEntry(
        rel, kind, stat.S_IMODE(mode), st.st_uid, st.st_gid, size, math.floor(st.st_mtime), digest
    )


def render_listing(listing: LayerListing) -> bytes:
    """The canonical bytes of a listing: one `line()` per entry, sorted, each ending in a newline. Names
    that are not UTF-8 survive (surrogateescape), so the bytes round-trip through `parse_listing`."""
    return b"".join((e.line() + "\n").encode("utf-8", "surrogateescape") for e in listing)


def parse_listing(data: bytes) -> LayerListing:
    """Parse `render_listing` output; collect every malformed, unsorted or repeated line, raise once."""
    text = data.decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the trailing newline; a missing one is tolerated
    entries: list[FileEntry] = []
    problems: list[str] = []
    previous: str | None = None
    for number, line in enumerate(lines, start=1):
        entry, line_problems = _parse_line(line)
        problems.extend(f"line {number}: {p}" for p in line_problems)
        if entry is None:
            continue
        if previous is not None and not previous < entry.path:
            problems.append(
                f"line {number}: {entry.path!r} is not after {previous!r} (sorted, each path once)"
            )
        previous = entry.path
        entries.append(entry)
    if problems:
        raise LayerError(
            f"malformed layer listing ({len(problems)} problem(s))",
            problems=problems,
            hint="a listing is what render_listing writes: 8 tab-separated fields per line, sorted by path",
        )
    return LayerListing(tuple(entries))
