"""Which FILES differ between two images, layers or directory trees (not only which digests).

Why: when a rebuild that should be bit-identical gives another digest, the digest says only *that* it
differs. This module says *what*: which config keys, which layer, and in that layer which paths, and
which of their facts (content, size, mode, owner, mtime, link target) changed. That names the build step
to fix (an mtime that escaped SOURCE_DATE_EPOCH, a uid from the build machine, a file that is not
deterministic).

A layer is reduced to a `LayerListing`: one `FileEntry` per path, with the facts a tar header and the
file content carry. Listings have a canonical text form (`render_listing`, one tab-separated line per
path, sorted), so a listing can be stored next to a build and compared later without the layer.
Listings are read from an uncompressed tar stream (never extracted) or from a directory (lstat, links
not followed). Comparison (`diff_listings`, `compare_images`) is pure; only `listing_from_tar`,
`listing_from_dir` and `diff_images` read.

What a listing does NOT capture, so two layers can differ with no path listed: entry order, duplicate
entries (the last one wins, as when a runtime unpacks the layer), uname/gname, pax records (atime,
ctime, xattrs) and padding. `explain` says so when it happens.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, Literal

from servimg.core.digest import Digest
from servimg.core.errors import LayerError, ServimgError, StoreError
from servimg.oci.image import Image, Layer
from servimg.oci.layer import normalize_path
from servimg.oci.store import BlobStore

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


# -- comparing listings ---------------------------------------------------------------------------------
What = Literal["added", "removed", "changed"]


@dataclass(frozen=True)
class Change:
    """One path that differs: added (only in B), removed (only in A) or changed (`fields` say which
    facts, in `FIELDS` order)."""

    path: str
    what: What
    before: FileEntry | None
    after: FileEntry | None
    fields: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "what": self.what,
            "fields": list(self.fields),
            "before": self.before.as_dict() if self.before else None,
            "after": self.after.as_dict() if self.after else None,
        }


def changed_fields(a: FileEntry, b: FileEntry) -> tuple[str, ...]:
    return tuple(name for name in FIELDS if getattr(a, name) != getattr(b, name))


def diff_listings(a: LayerListing, b: LayerListing) -> tuple[Change, ...]:
    """Every path that is not the same in `a` and `b`, sorted by path."""
    before, after = a.by_path(), b.by_path()
    changes: list[Change] = []
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        if old is None:
            changes.append(Change(path, "added", None, new))
        elif new is None:
            changes.append(Change(path, "removed", old, None))
        elif fields := changed_fields(old, new):
            changes.append(Change(path, "changed", old, new, fields))
    return tuple(changes)


def _short(entry: FileEntry) -> str:
    if entry.kind == "f":
        return entry.digest[:8] + "…"
    if entry.kind in "lh":
        return repr(entry.digest)
    return entry.digest or "none"


_DIGEST_LABEL = {"f": "sha256", "l": "target", "h": "link to", "c": "device", "b": "device"}


def _field_text(name: str, a: FileEntry, b: FileEntry) -> str:
    if name == "kind":
        return f"kind {KINDS[a.kind]} → {KINDS[b.kind]}"
    if name == "mode":
        return f"mode {a.mode:04o} → {b.mode:04o}"
    if name == "digest":
        label_a = _DIGEST_LABEL.get(a.kind, "content")
        label_b = _DIGEST_LABEL.get(b.kind, "content")
        if label_a == label_b:
            return f"{label_a} {_short(a)} → {_short(b)}"
        return f"{label_a} {_short(a)} → {label_b} {_short(b)}"
    return f"{name} {getattr(a, name)} → {getattr(b, name)}"


def _entry_text(entry: FileEntry) -> str:
    parts = [KINDS[entry.kind]]
    if entry.kind == "f":
        parts.append(f"size {entry.size}")
    parts.append(f"mode {entry.mode:04o}")
    if entry.kind in _DIGEST_LABEL:
        parts.append(f"{_DIGEST_LABEL[entry.kind]} {_short(entry)}")
    return ", ".join(parts)


def describe(change: Change) -> str:
    """One human line, e.g. `etc/shadow: changed size 502 → 503, sha256 1a2b3c4d… → 5e6f7a8b…` (the
    path escaped, so a newline in a name cannot forge a second line)."""
    path = escape(change.path)
    if change.before is not None and change.after is not None:
        details = ", ".join(_field_text(name, change.before, change.after) for name in change.fields)
        return f"{path}: changed {details}"
    entry = change.after if change.after is not None else change.before
    assert entry is not None
    return f"{path}: {change.what} {_entry_text(entry)}"


# -- comparing images -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class KeyChange:
    """A manifest or config key whose value differs; values as canonical JSON text, None when absent."""

    key: str
    before: str | None
    after: str | None

    def as_dict(self) -> dict[str, object]:
        return {"key": self.key, "before": self.before, "after": self.after}


def _json_text(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def json_changes(
    a: Mapping[str, object],
    b: Mapping[str, object],
    *,
    nested: tuple[str, ...] = (),
    skip: tuple[str, ...] = (),
) -> tuple[KeyChange, ...]:
    """The top-level keys whose values differ (keys in `nested` compared one level deeper, as
    `config.Env`), sorted. Values are compared as JSON, so key order and whitespace do not count."""
    out: list[KeyChange] = []
    for key in sorted(a.keys() | b.keys()):
        if key in skip:
            continue
        old, new = a.get(key), b.get(key)
        if key in nested and isinstance(old, dict) and isinstance(new, dict):
            out.extend(KeyChange(f"{key}.{c.key}", c.before, c.after) for c in json_changes(old, new))
        elif key not in a or key not in b or _json_text(old) != _json_text(new):
            out.append(
                KeyChange(key, _json_text(old) if key in a else None, _json_text(new) if key in b else None)
            )
    return tuple(out)


LayerStatus = Literal["identical", "changed", "added", "removed"]


@dataclass(frozen=True)
class LayerDiff:
    """Layer `index` of A against layer `index` of B. `a`/`b` is None where that image has fewer
    layers; then every path of the other one is listed as added (or removed)."""

    index: int
    a: Layer | None
    b: Layer | None
    changes: tuple[Change, ...] = ()

    @property
    def status(self) -> LayerStatus:
        if self.a is None:
            return "added"
        if self.b is None:
            return "removed"
        return "identical" if self.a.diff_id == self.b.diff_id else "changed"

    @property
    def blob_differs(self) -> bool:
        """Same content, other blob (compression, media type, annotations): still another digest."""
        return self.a is not None and self.b is not None and self.a.descriptor != self.b.descriptor

    def as_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "status": self.status,
            "a": _layer_dict(self.a),
            "b": _layer_dict(self.b),
            "blob_differs": self.blob_differs,
            "changes": [c.as_dict() for c in self.changes],
        }


def _layer_dict(layer: Layer | None) -> dict[str, object] | None:
    if layer is None:
        return None
    d = layer.descriptor
    return {
        "diff_id": str(layer.diff_id),
        "digest": str(d.digest),
        "size": d.size,
        "media_type": d.media_type,
    }


@dataclass(frozen=True)
class ImageFileDiff:
    """Two images compared: manifest keys (besides config and layers), config keys, layer by layer."""

    a: Digest
    b: Digest
    a_config: Digest
    b_config: Digest
    manifest: tuple[KeyChange, ...]
    config: tuple[KeyChange, ...]
    layers: tuple[LayerDiff, ...]

    @property
    def identical(self) -> bool:
        return self.a == self.b

    @property
    def differing_layers(self) -> tuple[LayerDiff, ...]:
        return tuple(x for x in self.layers if x.status != "identical" or x.blob_differs)

    def as_dict(self) -> dict[str, object]:
        return {
            "identical": self.identical,
            "a": str(self.a),
            "b": str(self.b),
            "a_config": str(self.a_config),
            "b_config": str(self.b_config),
            "manifest": [c.as_dict() for c in self.manifest],
            "config": [c.as_dict() for c in self.config],
            "layers": [x.as_dict() for x in self.layers],
        }


def compare_images(a: Image, b: Image, listing_of: Callable[[Layer], LayerListing]) -> ImageFileDiff:
    """Compare two image values; `listing_of` is asked only for layers whose diffIDs differ (or that
    one image lacks), so identical layers are never read."""
    layers_a, layers_b = a.layers, b.layers
    empty = LayerListing()
    diffs: list[LayerDiff] = []
    for index in range(max(len(layers_a), len(layers_b))):
        la = layers_a[index] if index < len(layers_a) else None
        lb = layers_b[index] if index < len(layers_b) else None
        if la is not None and lb is not None and la.diff_id == lb.diff_id:
            diffs.append(LayerDiff(index, la, lb))
            continue
        before = listing_of(la) if la is not None else empty
        after = listing_of(lb) if lb is not None else empty
        diffs.append(LayerDiff(index, la, lb, diff_listings(before, after)))
    return ImageFileDiff(
        a.digest,
        b.digest,
        a.config_digest,
        b.config_digest,
        json_changes(a.manifest, b.manifest, skip=("config", "layers")),
        json_changes(a.config, b.config, nested=("config",)),
        tuple(diffs),
    )


def store_listing(store: BlobStore) -> Callable[[Layer], LayerListing]:
    """`listing_of` for `compare_images`: a layer's uncompressed tar from `store`, verified by diffID."""

    def listing_of(layer: Layer) -> LayerListing:
        digest = layer.descriptor.digest
        if not store.has(digest):
            raise StoreError(
                f"layer blob {digest} is not in the cache {store.root}",
                hint="fetch the image first (servimg diff --files fetches both references)",
            )
        with store.uncompressed(digest, layer.diff_id).open("rb") as fh:
            try:
                return listing_from_tar(fh)
            except ServimgError as exc:
                raise exc.context(f"layer {digest.short}") from None

    return listing_of


def diff_images(a: Image, b: Image, store: BlobStore) -> ImageFileDiff:
    """Compare two images whose blobs are in `store` (as `transport.fetch` leaves them)."""
    return compare_images(a, b, store_listing(store))


# -- explaining -----------------------------------------------------------------------------------------
def _d(digest: Digest) -> str:
    return f"{digest.algorithm}:{digest.short}…"


def _clip(value: str, start: int, width: int) -> str:
    head = "…" if start > 0 else ""
    tail = "…" if start + width < len(value) else ""
    return head + value[start : start + width] + tail


def _values(change: KeyChange, width: int = 60) -> str:
    """`before → after`, each clipped to `width` characters around where they first differ (two long
    diffID lists differ far from their common start)."""
    if change.before is None or change.after is None:
        before = "(absent)" if change.before is None else _clip(change.before, 0, width)
        after = "(absent)" if change.after is None else _clip(change.after, 0, width)
        return f"{before} → {after}"
    common = next(
        (i for i, (x, y) in enumerate(zip(change.before, change.after, strict=False)) if x != y),
        min(len(change.before), len(change.after)),
    )
    start = max(0, common - width // 3) if max(len(change.before), len(change.after)) > width else 0
    return f"{_clip(change.before, start, width)} → {_clip(change.after, start, width)}"


def _layer_head(x: LayerDiff) -> str:
    if x.a is not None and x.b is not None:
        if x.a.diff_id == x.b.diff_id:
            return f"layer {x.index} (diffID {_d(x.a.diff_id)})"
        return f"layer {x.index} (diffID {_d(x.a.diff_id)} ≠ {_d(x.b.diff_id)})"
    only, layer = ("A", x.a) if x.a is not None else ("B", x.b)
    assert layer is not None
    return f"layer {x.index} (only in {only}, diffID {_d(layer.diff_id)})"


def _layer_lines(x: LayerDiff, limit: int) -> list[str]:
    head = _layer_head(x)
    if x.status == "identical":
        if not x.blob_differs:
            return [f"{head}: identical"]
        assert x.a is not None and x.b is not None
        return [
            f"{head}: identical content, but blob {_d(x.a.descriptor.digest)} ≠ {_d(x.b.descriptor.digest)} "
            f"({x.a.descriptor.media_type} → {x.b.descriptor.media_type}): compression or annotations differ"
        ]
    if x.status == "changed" and not x.changes:
        return [
            f"{head}: no path differs: the tars differ in entry order, duplicate entries, uname/gname, "
            "pax records (atime, ctime, xattrs) or padding"
        ]
    count = len(x.changes)
    what = {"changed": "differ", "added": "added", "removed": "removed"}[x.status]
    lines = [f"{head}: {count} path{'' if count == 1 else 's'} {what}"]
    lines.extend(f"  {describe(c)}" for c in x.changes[:limit])
    if count > limit:
        lines.append(f"  … and {count - limit} more")
    return lines


def explain(diff: ImageFileDiff, limit: int = 40) -> list[str]:
    """Human lines saying why the two images differ: manifest, config, then each layer (at most `limit`
    described changes per layer, then "… and N more")."""
    if diff.identical:
        return [f"identical: manifest {diff.a}"]
    lines = [f"manifest {_d(diff.a)} ≠ {_d(diff.b)}"]
    lines.extend(f"  manifest.{c.key}: {_values(c)}" for c in diff.manifest)
    if diff.a_config != diff.b_config:
        if diff.config:
            lines.append(
                f"config {_d(diff.a_config)} ≠ {_d(diff.b_config)}: {len(diff.config)} key(s) differ"
            )
            lines.extend(f"  {c.key}: {_values(c)}" for c in diff.config)
        else:
            lines.append(
                f"config {_d(diff.a_config)} ≠ {_d(diff.b_config)}: same JSON, other bytes (key order or "
                "whitespace)"
            )
    else:
        lines.append(f"config {_d(diff.a_config)}: identical")
    for x in diff.layers:
        lines.extend(_layer_lines(x, limit))
    if not diff.manifest and not diff.differing_layers and diff.a_config == diff.b_config:
        lines.append(
            "config and layers are identical: the manifests differ only in their bytes (serialisation)"
        )
    return lines


def summary(diff: ImageFileDiff) -> str:
    """One short line: what differs (for a FAIL line)."""
    if diff.identical:
        return "identical"
    parts: list[str] = []
    if diff.manifest:
        parts.append(f"manifest ({len(diff.manifest)} key(s))")
    if diff.a_config != diff.b_config:
        parts.append(f"config ({len(diff.config)} key(s))")
    for x in diff.differing_layers:
        if x.status == "identical":
            parts.append(f"layer {x.index} blob")
        elif x.status == "changed":
            parts.append(f"layer {x.index} ({len(x.changes)} path(s))")
        else:
            parts.append(f"layer {x.index} only in {'B' if x.status == 'added' else 'A'}")
    return "images differ: " + (", ".join(parts) if parts else "manifest bytes only")


class ImagesDiffer(ServimgError):
    """`servimg diff --files` found a difference; `as_dict` carries the structured diff for --json."""

    def __init__(self, diff: ImageFileDiff, limit: int = 40) -> None:
        super().__init__(
            summary(diff),
            hint="the explanation names each differing path (the first `limit` per layer); --json lists all",
        )
        self.diff = diff
        self.limit = limit

    def as_dict(self) -> dict[str, object]:
        return {
            **super().as_dict(),
            "diff": self.diff.as_dict(),
            "explanation": explain(self.diff, self.limit),
        }
