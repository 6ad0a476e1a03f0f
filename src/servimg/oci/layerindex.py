"""What one layer holds, read once from its tar and kept by diffID.

A layer is content-addressed and immutable, so the list of its members (normalised path, tar type,
mode, size, link target, offset of the data in the uncompressed tar) and of its whiteouts / opaque
markers is a pure function of its diffID. `read` makes it in one pass over the tar headers, refusing
what `oci.filesystem` refuses (paths escaping the root, GNU sparse members, unreadable tars); `IndexCache`
keeps it under `<cache>/layer-index/<format>/sha256/<hex>.json`, so no build reads a base layer's headers
twice. Hardlinks are kept as members here; they are resolved when the layers are merged.
"""

from __future__ import annotations

import json
import posixpath
import tarfile
from dataclasses import dataclass
from pathlib import Path

from servimg.cache.layout import INDEX_FORMAT, CacheLayout
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest
from servimg.core.errors import LayerError
from servimg.oci.layer import OPAQUE_MARKER, WHITEOUT_PREFIX, normalize_path

OPAQUE, WHITEOUT = "opaque", "whiteout"


@dataclass(frozen=True)
class Member:
    """One tar member of a layer that is not a whiteout: its header facts and where its data starts."""

    path: str
    type: bytes
    mode: int
    size: int
    linkname: str
    offset_data: int


@dataclass(frozen=True)
class Node:
    """One path in the final state: which layer provides it, and its tar header facts."""

    path: str
    layer: int
    type: bytes
    mode: int
    size: int
    linkname: str
    offset_data: int

    @property
    def is_dir(self) -> bool:
        return self.type == tarfile.DIRTYPE

    @property
    def is_file(self) -> bool:
        return self.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)

    @property
    def is_symlink(self) -> bool:
        return self.type == tarfile.SYMTYPE

    @property
    def is_hardlink(self) -> bool:
        return self.type == tarfile.LNKTYPE


@dataclass(frozen=True)
class LayerIndex:
    """A layer's deletions (`(path, "opaque"|"whiteout")`, in tar order) and its other members."""

    deletions: tuple[tuple[str, str], ...]
    members: tuple[Member, ...]

    @classmethod
    def read(cls, layer: Path, position: int) -> LayerIndex:
        """One pass over the tar headers (`position` only names the layer in errors)."""
        deletions: list[tuple[str, str]] = []
        members: list[Member] = []
        try:
            with tarfile.open(layer, mode="r:") as tar:
                for info in tar:
                    path = _member_path(position, layer, info.name, "entry")
                    if info.issparse():
                        raise LayerError(
                            f"layer {position} ({layer.name}): {info.name!r} is a GNU sparse member",
                            hint="servimg reads layers without unpacking them and refuses sparse entries; "
                            "rebuild the base layer without --sparse",
                        )
                    parent, _, base = path.rpartition("/")
                    if base == OPAQUE_MARKER:
                        deletions.append((parent, OPAQUE))
                    elif base.startswith(WHITEOUT_PREFIX):
                        deletions.append((posixpath.join(parent, base[len(WHITEOUT_PREFIX) :]), WHITEOUT))
                    elif path:
                        linkname = info.linkname
                        if info.islnk():
                            linkname = _member_path(position, layer, linkname, f"hardlink {path!r} target")
                        members.append(
                            Member(path, info.type, info.mode, info.size, linkname, info.offset_data)
                        )
        except tarfile.TarError as exc:
            raise LayerError(f"layer {position} ({layer.name}) is not a readable tar: {exc}") from exc
        return cls(tuple(deletions), tuple(members))

    def to_bytes(self) -> bytes:
        # ensure_ascii: a member name that is not UTF-8 is kept surrogate-escaped by tarfile and must
        # round-trip; lists, not objects: an index of a big layer loads in milliseconds.
        doc = {
            "format": INDEX_FORMAT,
            "deletions": [list(d) for d in self.deletions],
            "members": [
                [m.path, m.type.decode("latin-1"), m.mode, m.size, m.linkname, m.offset_data]
                for m in self.members
            ],
        }
        return json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LayerIndex:
        doc = json.loads(data)
        if doc.get("format") != INDEX_FORMAT:
            raise ValueError(f"layer index format {doc.get('format')!r}, expected {INDEX_FORMAT}")
        return cls(
            tuple((str(p), str(k)) for p, k in doc["deletions"]),
            tuple(
                Member(path, kind.encode("latin-1"), mode, size, link, offset)
                for path, kind, mode, size, link, offset in doc["members"]
            ),
        )


def _member_path(position: int, layer: Path, name: str, what: str) -> str:
    try:
        return normalize_path(name)
    except LayerError as exc:
        raise exc.context(f"layer {position} ({layer.name}): {what} {name!r}") from None


@dataclass(frozen=True)
class IndexCache:
    """Layer indexes on disk by diffID. The caller vouches that `layer` IS the tar with that diffID (the
    blob store verifies every blob and decompressed diff before naming it)."""

    root: Path

    def path(self, diff_id: Digest) -> Path:
        return CacheLayout(self.root).layer_index / INDEX_FORMAT / diff_id.algorithm / f"{diff_id.hex}.json"

    def index(self, layer: Path, diff_id: Digest, position: int) -> LayerIndex:
        cached = self.path(diff_id)
        try:
            return LayerIndex.from_bytes(cached.read_bytes())
        except (OSError, ValueError, KeyError, TypeError):
            pass  # missing or unreadable: made again from the tar (an index is never trusted half-written)
        index = LayerIndex.read(layer, position)
        cached.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cached, index.to_bytes(), 0o644)
        return index
