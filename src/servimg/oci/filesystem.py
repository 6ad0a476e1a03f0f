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

import contextlib
import sqlite3
import tarfile
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

from servimg.core.digest import Digest
from servimg.core.errors import LayerError
from servimg.oci import fsindex
from servimg.oci.layer import normalize_path
from servimg.oci.layerindex import OPAQUE, IndexCache, LayerIndex, Node

if TYPE_CHECKING:
    from servimg.oci.image import Layer
    from servimg.oci.store import BlobStore

MAX_SYMLINK_HOPS = 40


class NodeTable(Protocol):
    """The merged state of a chain of layers: nodes by normalised path, and each directory's children."""

    def node(self, path: str) -> Node | None: ...

    def children(self, path: str) -> Iterable[str]:
        """Full paths of the direct children of `path` (nothing for a non-directory or a missing path)."""
        ...

    def dirs_named(self, names: Collection[str]) -> list[str]:
        """Every directory whose last component is one of `names`, sorted."""
        ...

    def below(self, path: str) -> Iterable[Node]:
        """Every node strictly under directory `path`, in no particular order."""
        ...

    def paths_below(self, path: str) -> Iterable[str]:
        """The paths of `below(path)` alone (no node built for each: a caller that only filters names)."""
        ...

    def symlinks_in(self, path: str) -> set[str]:
        """Full paths of the direct children of `path` that are symbolic links."""
        ...


ROOT = Node("", -1, tarfile.DIRTYPE, 0o755, 0, "", 0)


class _Merge:
    """The changeset algorithm over layer indexes, in memory (the table a chain is built into once)."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {"": ROOT}
        self.kids: dict[str, set[str]] = {"": set()}

    def apply(self, position: int, layer: Path, index: LayerIndex) -> None:
        for path, kind in index.deletions:
            if kind == OPAQUE:
                for child in list(self.kids.get(path, ())):
                    self._remove(child)
            else:
                self._remove(path)
        for m in index.members:
            node = Node(m.path, position, m.type, m.mode, m.size, m.linkname, m.offset_data)
            self._add(self._link_target(position, layer, node) if node.is_hardlink else node)

    def _link_target(self, position: int, layer: Path, node: Node) -> Node:
        """A hardlink becomes a copy of its target's node (same data, type and mode: one inode)."""
        target = self.nodes.get(node.linkname)
        where = f"layer {position} ({layer.name}): hardlink {node.path!r} -> {node.linkname!r}"
        if target is None or not node.linkname:
            raise LayerError(
                f"{where}: the target is not in this or a lower layer",
                hint="the layer is corrupt or hostile; a hardlink must name a file that precedes it",
            )
        if target.is_dir:
            raise LayerError(f"{where}: the target is a directory", hint="a hardlink must name a file")
        return replace(target, path=node.path)

    def _remove(self, path: str) -> None:
        for child in list(self.kids.pop(path, ())):
            self._remove(child)
        if self.nodes.pop(path, None) is not None:
            parent = path.rpartition("/")[0]
            self.kids.get(parent, set()).discard(path)

    def _add(self, node: Node) -> None:
        old = self.nodes.get(node.path)
        if old is not None and old.is_dir and not node.is_dir:
            self._remove(node.path)  # a file replacing a directory hides the whole subtree
        self._ensure_parents(node.path, node.layer)
        self.nodes[node.path] = node
        self.kids[node.path.rpartition("/")[0]].add(node.path)
        if node.is_dir:
            self.kids.setdefault(node.path, set())

    def _ensure_parents(self, path: str, layer: int) -> None:
        parent = path.rpartition("/")[0]
        if parent in self.nodes and self.nodes[parent].is_dir:
            return
        if parent in self.nodes:
            self._remove(parent)
        self._ensure_parents(parent, layer)
        self.nodes[parent] = Node(parent, layer, tarfile.DIRTYPE, 0o755, 0, "", 0)
        self.kids.setdefault(parent, set())
        self.kids[parent.rpartition("/")[0]].add(parent)

    # -- NodeTable ----------------------------------------------------------------------------------
    def node(self, path: str) -> Node | None:
        return self.nodes.get(path)

    def children(self, path: str) -> Iterable[str]:
        return self.kids.get(path, ())

    def dirs_named(self, names: Collection[str]) -> list[str]:
        return sorted(p for p, n in self.nodes.items() if n.is_dir and p.rpartition("/")[2] in names)

    def symlinks_in(self, path: str) -> set[str]:
        return {c for c in self.kids.get(path, ()) if self.nodes[c].is_symlink}

    def below(self, path: str) -> Iterable[Node]:
        return (self.nodes[p] for p in self.paths_below(path))

    def paths_below(self, path: str) -> Iterable[str]:
        stack = list(self.kids.get(path, ()))
        while stack:
            child = stack.pop()
            yield child
            stack.extend(self.kids.get(child, ()))


class LayeredFS:
    """Read-only view of the merged layers. `layers` are uncompressed tar files, lowest first.

    Built in memory from the layers' indexes (read from the tars unless given), or over a `table` that
    already holds the merged state (`cached`: the chain's table on disk, nothing read from the tars)."""

    def __init__(
        self,
        layers: Sequence[Path],
        indexes: Sequence[LayerIndex] | None = None,
        *,
        table: NodeTable | None = None,
    ) -> None:
        self.layers = tuple(layers)
        if table is None:
            merge = _Merge()
            for position, layer in enumerate(self.layers):
                index = indexes[position] if indexes is not None else LayerIndex.read(layer, position)
                merge.apply(position, layer, index)
            table = merge
        self._table = table

    @classmethod
    def cached(
        cls, layers: Sequence[tuple[Path, Digest]], cache_root: Path, *, keep_chain: bool = True
    ) -> LayeredFS:
        """The view of `layers` (uncompressed tar, diffID), lowest first, through two caches under
        `cache_root`: each layer's index by its diffID (`oci.layerindex`) and the merged table of the
        whole chain by its ordered diffIDs (`oci.fsindex`). A warm chain opens one SQLite file and reads
        only the rows a caller asks for; the tars are opened only to read file contents. Without
        `keep_chain` a new chain is merged in memory and not written (a table is tens of MB: worth it for
        a base every build reads, not for each image a push or check reads once)."""
        paths = [path for path, _ in layers]
        diff_ids = [diff_id for _, diff_id in layers]
        table = fsindex.open_table(cache_root, diff_ids)
        if table is not None:
            return cls(paths, table=table)
        indexes = IndexCache(cache_root)
        merge = _Merge()
        for position, (layer, diff_id) in enumerate(layers):
            merge.apply(position, layer, indexes.index(layer, diff_id, position))
        if keep_chain:
            with contextlib.suppress(
                OSError, sqlite3.Error
            ):  # a cache that cannot be written only costs time
                fsindex.write_table(cache_root, diff_ids, merge.nodes.values())
        return cls(paths, table=merge)

    @classmethod
    def of_layers(cls, layers: Sequence[Layer], store: BlobStore, *, keep_chain: bool = False) -> LayeredFS:
        """The merged view of image `layers` (lowest first) whose blobs are in `store`, through the
        store's index caches (`cached`): each layer of a 4.5 GB base is indexed once by its diffID, not
        on every push or check of an image on it."""
        chain = [
            (store.uncompressed(layer.descriptor.digest, layer.diff_id), layer.diff_id) for layer in layers
        ]
        return cls.cached(chain, store.root, keep_chain=keep_chain)

    # -- queries ------------------------------------------------------------------------------------
    def lstat(self, path: str) -> Node | None:
        return self._table.node(normalize_path(path))

    def exists(self, path: str) -> bool:
        return self.lstat(path) is not None

    def listdir(self, path: str) -> list[str]:
        return sorted(p.rpartition("/")[2] for p in self._table.children(normalize_path(path)))

    def dirs_named(self, names: Collection[str]) -> list[str]:
        """Every directory whose name is one of `names` (e.g. the site-packages dirs), sorted."""
        return self._table.dirs_named(names)

    def below(self, prefix: str) -> Iterable[Node]:
        """Every node strictly under `prefix`, unordered (a range query on a cached view; `walk` when the
        order matters)."""
        return self._table.below(normalize_path(prefix))

    def paths_below(self, prefix: str) -> Iterable[str]:
        """The paths of `below(prefix)`, without their nodes."""
        return self._table.paths_below(normalize_path(prefix))

    def symlinks_in(self, path: str) -> set[str]:
        """Full paths of the symbolic links directly in directory `path` (one query: for a caller that
        would otherwise `lstat` each of its files only to learn whether it is a link)."""
        return self._table.symlinks_in(normalize_path(path))

    def walk(self, prefix: str = "") -> Iterator[Node]:
        """Every node under `prefix` (inclusive), depth-first in sorted order."""
        start = normalize_path(prefix)
        node = self._table.node(start)
        if node is None:
            return
        yield node
        for child in sorted(self._table.children(start)):
            yield from self.walk(child)

    def resolve(self, path: str) -> str:
        """Resolve symlinks component by component as the container would, confined to the root.

        Absolute link targets are relative to the image root; `..` never climbs above it. Raises on
        loops. Returns the resolved path, which may not exist.
        """
        return self._resolve(path, [])

    def resolution_path(self, path: str) -> list[str]:
        """Every path `resolve` looks up on the way (each symlink it follows, then the result): another
        layer that changes none of them cannot change what `path` resolves to."""
        visited: list[str] = []
        visited.append(self._resolve(path, visited))
        return visited

    def _resolve(self, path: str, visited: list[str]) -> str:
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
            node = self._table.node(candidate)
            if node is not None and node.is_symlink:
                visited.append(candidate)
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
        node = self._table.node(real)
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
