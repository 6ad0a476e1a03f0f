"""Which FILES differ between two images, layers or directory trees (not only which digests).

Why: when a rebuild that should be bit-identical gives another digest, the digest says only *that* it
differs. This module says *what*: which config keys, which layer, and in that layer which paths, and
which of their facts (content, size, mode, owner, mtime, link target) changed. That names the build step
to fix (an mtime that escaped SOURCE_DATE_EPOCH, a uid from the build machine, a file that is not
deterministic).

A layer is reduced to a `LayerListing` (`oci.listing`: one `FileEntry` per path, in a canonical text
form). Comparison (`diff_listings`, `compare_images`) is pure; only `diff_images` reads (the listings of
the store's layers). What a listing does not capture, `explain` says when it matters.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from servimg.core.digest import Digest
from servimg.core.errors import ServimgError, StoreError
from servimg.oci.image import Image, Layer
from servimg.oci.listing import FIELDS, KINDS, FileEntry, LayerListing, escape, listing_from_tar
from servimg.oci.store import BlobStore

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
