"""The final filesystem state of an image, read straight from its layer tarballs (no container).

OCI image-spec "Applying Changesets": layers apply in order; `.wh.<name>` deletes `<name>` (and its
subtree) from LOWER layers; `.wh..wh..opq` in a directory hides every lower-layer child of it; a
non-directory replacing a directory removes the subtree. Paths are normalised, and an entry naming `..`
or an absolute path outside the root is refused rather than interpreted.

Hostile layers (docs/reliability.md): a hardlink is resolved when its layer is applied, to a node already
in this or a lower layer, as `tar -x` would; one whose target escapes the root, is missing or is a
directory is refused. GNU sparse members are refused (their stored bytes are not the file's content).
Duplicate entries: the last one wins, as when the runtime unpacks the layer. Device nodes and FIFOs are
kept as nodes (what the image carries is passed through untouched) but have no readable content.
"""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from servimg.core.errors import LayerError
from servimg.oci.layer import OPAQUE_MARKER, WHITEOUT_PREFIX, normalize_path

MAX_SYMLINK_HOPS = 40


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


class LayeredFS:
    """Read-only view of the merged layers. `layers` are uncompressed tar files, lowest first."""

    def __init__(self, layers: Sequence[Path]) -> None:
        self.layers = tuple(layers)
        self._nodes: dict[str, Node] = {"": Node("", -1, tarfile.DIRTYPE, 0o755, 0, "", 0)}
        self._children: dict[str, set[str]] = {"": set()}
        for index, layer in enumerate(self.layers):
            self._apply_layer(index, layer)

    # -- building the index -------------------------------------------------------------------------
    def _apply_layer(self, index: int, layer: Path) -> None:
        members = self._read_members(index, layer)
        for path, kind in members[0]:
            if kind == "opaque":
                for child in list(self._children.get(path, ())):
                    self._remove(child)
            else:
                self._remove(path)
        for node in members[1]:
            self._add(self._link_target(index, layer, node) if node.is_hardlink else node)

    def _link_target(self, index: int, layer: Path, node: Node) -> Node:
        """A hardlink becomes a copy of its target's node (same data, type and mode: one inode)."""
        target = self._nodes.get(node.linkname)
        where = f"layer {index} ({layer.name}): hardlink {node.path!r} -> {node.linkname!r}"
        if target is None or not node.linkname:
            raise LayerError(
                f"{where}: the target is not in this or a lower layer",
                hint="the layer is corrupt or hostile; a hardlink must name a file that precedes it",
            )
        if target.is_dir:
            raise LayerError(f"{where}: the target is a directory", hint="a hardlink must name a file")
        return replace(target, path=node.path)

    def _read_members(self, index: int, layer: Path) -> tuple[list[tuple[str, str]], list[Node]]:
        deletions: list[tuple[str, str]] = []
        nodes: list[Node] = []
        try:
            with tarfile.open(layer, mode="r:") as tar:
                for info in tar:
                    path = self._member_path(index, layer, info.name, "entry")
                    if info.issparse():
                        raise LayerError(
                            f"layer {index} ({layer.name}): {info.name!r} is a GNU sparse member",
                            hint="servimg reads layers without unpacking them and refuses sparse entries; "
                            "rebuild the base layer without --sparse",
                        )
                    parent, _, base = path.rpartition("/")
                    if base == OPAQUE_MARKER:
                        deletions.append((parent, "opaque"))
                    elif base.startswith(WHITEOUT_PREFIX):
                        target = posixpath.join(parent, base[len(WHITEOUT_PREFIX) :])
                        deletions.append((target, "whiteout"))
                    elif path:
                        linkname = info.linkname
                        if info.islnk():
                            linkname = self._member_path(index, layer, linkname, f"hardlink {path!r} target")
                        nodes.append(
                            Node(path, index, info.type, info.mode, info.size, linkname, info.offset_data)
                        )
        except tarfile.TarError as exc:
            raise LayerError(f"layer {index} ({layer.name}) is not a readable tar: {exc}") from exc
        return deletions, nodes

    @staticmethod
    def _member_path(index: int, layer: Path, name: str, what: str) -> str:
        try:
            return normalize_path(name)
        except LayerError as exc:
            raise exc.context(f"layer {index} ({layer.name}): {what} {name!r}") from None

    def _remove(self, path: str) -> None:
        for child in list(self._children.pop(path, ())):
            self._remove(child)
        if self._nodes.pop(path, None) is not None:
            parent = path.rpartition("/")[0]
            self._children.get(parent, set()).discard(path)

    def _add(self, node: Node) -> None:
        old = self._nodes.get(node.path)
        if old is not None and old.is_dir and not node.is_dir:
            self._remove(node.path)  # a file replacing a directory hides the whole subtree
        self._ensure_parents(node.path, node.layer)
        self._nodes[node.path] = node
        self._children[node.path.rpartition("/")[0]].add(node.path)
        if node.is_dir:
            self._children.setdefault(node.path, set())

    def _ensure_parents(self, path: str, layer: int) -> None:
        parent = path.rpartition("/")[0]
        if parent in self._nodes and self._nodes[parent].is_dir:
            return
        if parent in self._nodes:
            self._remove(parent)
        self._ensure_parents(parent, layer)
        self._nodes[parent] = Node(parent, layer, tarfile.DIRTYPE, 0o755, 0, "", 0)
        self._children.setdefault(parent, set())
        self._children[parent.rpartition("/")[0]].add(parent)

    # -- queries ------------------------------------------------------------------------------------
    def lstat(self, path: str) -> Node | None:
        return self._nodes.get(normalize_path(path))

    def exists(self, path: str) -> bool:
        return self.lstat(path) is not None

    def listdir(self, path: str) -> list[str]:
        return sorted(p.rpartition("/")[2] for p in self._children.get(normalize_path(path), ()))

    def walk(self, prefix: str = "") -> Iterator[Node]:
        """Every node under `prefix` (inclusive), depth-first in sorted order."""
        start = normalize_path(prefix)
        node = self._nodes.get(start)
        if node is None:
            return
        yield node
        for child in sorted(self._children.get(start, ())):
            yield from self.walk(child)

    def resolve(self, path: str) -> str:
        """Resolve symlinks component by component as the container would, confined to the root.

        Absolute link targets are relative to the image root; `..` never climbs above it. Raises on
        loops. Returns the resolved path, which may not exist.
        """
        parts = [p for p in path.split("/") if p not in ("", ".")]
        resolved: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = "/".join([*resolved, part])
            node = self._nodes.get(candidate)
            if node is not None and node.is_symlink:
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise LayerError(
                        f"too many levels of symbolic links resolving {path!r}",
                        hint="the base image has a symlink loop on this path; fix or replace the base",
                    )
                target = node.linkname
                if target.startswith("/"):
                    resolved = []
                parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                continue
            resolved.append(part)
        return "/".join(resolved)

    def _file_node(self, path: str, follow: bool) -> Node:
        real = self.resolve(path) if follow else normalize_path(path)
        node = self._nodes.get(real)
        if node is None:
            raise FileNotFoundError(path)
        if not node.is_file:
            if node.is_dir:
                raise IsADirectoryError(path)
            raise LayerError(
                f"{path!r} is not a regular file (tar type {node.type!r})",
                hint="the base image has a device node, FIFO or symlink where a file is expected",
            )
        return node

    def read(self, path: str, *, follow: bool = True) -> bytes:
        """Content of a regular file (following symlinks; hardlinks were resolved when applied)."""
        node = self._file_node(path, follow)
        with self.layers[node.layer].open("rb") as fh:
            fh.seek(node.offset_data)
            return fh.read(node.size)

    def copy_to(self, path: str, out: BinaryIO, *, follow: bool = True) -> int:
        """Stream a regular file's content to `out` (no whole-file buffering); returns its size."""
        node = self._file_node(path, follow)
        remaining = node.size
        with self.layers[node.layer].open("rb") as fh:
            fh.seek(node.offset_data)
            while remaining:
                block = fh.read(min(remaining, 1 << 20))
                if not block:
                    raise LayerError(f"{path!r}: layer {node.layer} ends inside the file's data")
                out.write(block)
                remaining -= len(block)
        return node.size

    def read_or_none(self, path: str) -> bytes | None:
        try:
            return self.read(path)
        except (FileNotFoundError, IsADirectoryError):
            return None
