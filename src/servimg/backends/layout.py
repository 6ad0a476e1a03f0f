"""OCI image layout directories (image-spec "OCI Image Layout"): read a base from one, write images to one.

Writes never leave a half-written layout: a new layout is assembled in a sibling temp directory and
renamed into place; adding to an existing layout writes blobs first (content-addressed, harmless if
interrupted) and replaces `index.json` atomically last, under an flock on the layout directory so that
concurrent writers never lose each other's tags. Reading refuses a manifest that names a missing blob or
a blob of another size.

A layout shares no writable inode with the blob store (docs/design.md, "bytes are proven"): its blobs are
files of their own (`integrity.copy_verified`: a reflink where the file system has one, else a copy, the
store's bytes hashed on the way out), mode 0644 in 0755 directories as other OCI tools write them. A write
into an existing layout re-hashes every blob it would keep and replaces one that does not match its name,
and says so ("mended"). Only the cache's own base layouts (`store_owned`) hard-link to the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence, Set
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servimg.backends.referrers import (
    Artifact,
    Referrers,
    ReferrersError,
    TagChange,
    is_artifact_tag,
    referrer_descriptor,
    valid_digest,
)
from servimg.backends.target import ReadOptions, Target, WriteOptions
from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, StoreError, host_error
from servimg.core.platform import Platform, texts
from servimg.oci import integrity
from servimg.oci.image import (
    DOCKER_MANIFEST,
    INDEX_TYPES,
    OCI_INDEX,
    OCI_MANIFEST,
    REF_NAME,
    Descriptor,
    Image,
)
from servimg.oci.index import ImageIndex, IndexedImages
from servimg.oci.store import BlobStore, Io

LAYOUT_FILE = b'{"imageLayoutVersion":"1.0.0"}'
DIR_MODE = 0o755


def read_layout(
    root: Path,
    store: BlobStore,
    *,
    tag: str | None = None,
    digest: Digest | None = None,
    link: bool = False,
    rehash: bool = False,
    platform: Platform | None = None,
) -> Image:
    """Load the manifest selected by `digest` or `tag` (or the only one) and copy its blobs into `store`.

    Manifest and config are always re-hashed. A layer blob the store already holds is not copied again;
    with `rehash` (verify, check: they rely on what the layout holds, not on the store's copy) every
    layer blob in the layout is hashed all the same, and one whose bytes do not match its digest fails
    the read, named. Blobs are hard-linked into the store (each verified first) only when `link` says the
    layout is the cache's own and never handed out (servimg's base cache), or when a blob has no write
    bit at all (a Nix store path, a read-only layout): a copy would only double the disk a multi-GB base
    takes."""
    index = _read_index(root)
    desc = _nested(index, root, digest) or _select(index, root, tag, digest)
    manifest_bytes = _read_blob(root, desc.digest)
    if desc.media_type in INDEX_TYPES:
        children = ImageIndex.parse(manifest_bytes, f"{root}@{desc.digest}")
        if platform is None:
            raise BackendError(
                f"{root}: {desc.digest} is a multi-platform index of {texts(children.platforms)}",
                hint="choose one with --platform (or select its manifest by digest, oci:DIR@sha256:…)",
            )
        desc = children.child(platform)
        manifest_bytes = _read_blob(root, desc.digest)
    try:
        manifest = json.loads(manifest_bytes)
    except (ValueError, RecursionError) as exc:
        raise BackendError(f"{root}: manifest {desc.digest} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise BackendError(f"{root}: manifest {desc.digest} is not a JSON object")
    config = Descriptor.from_json(manifest.get("config"), "manifest.config")
    image = Image.parse(manifest_bytes, _read_blob(root, config.digest))
    for i, layer in enumerate(image.layer_descriptors):
        source = root / "blobs" / layer.digest.algorithm / layer.digest.hex
        if store.has(layer.digest, layer.size):
            if rehash:
                _prove_layer_blob(root, i, source, layer)
            continue
        if not source.is_file():
            raise _missing(root, i, layer)
        try:
            _, size = store.put_file(source, layer.digest, link=link or _read_only(source))
        except StoreError as exc:
            raise _corrupt(root, i, layer, exc.message) from None
        if size != layer.size:
            raise BackendError(
                f"{root}: manifest.layers[{i}] says {layer.size} bytes, blob {layer.digest.short} has {size}",
                hint="the manifest's descriptor is wrong; the image is corrupt or tampered",
            )
    store.put_bytes(manifest_bytes)
    store.put_bytes(image.config_bytes)
    return image


def _prove_layer_blob(root: Path, i: int, source: Path, layer: Descriptor) -> None:
    try:
        actual, size = integrity.rehash(source)
    except FileNotFoundError:
        raise _missing(root, i, layer) from None
    if actual != layer.digest or size != layer.size:
        raise _corrupt(root, i, layer, f"its {size} bytes hash to {actual}")


def _missing(root: Path, i: int, layer: Descriptor) -> BackendError:
    return BackendError(
        f"{root}: manifest.layers[{i}] names blob {layer.digest}, which is missing from the layout",
        hint="the layout is incomplete; copy it again from its source",
    )


def _corrupt(root: Path, i: int, layer: Descriptor, why: str) -> BackendError:
    return BackendError(
        f"{root}: layer {i} blob {layer.digest} does not match its digest ({why})",
        hint="the layout's blob was altered at rest; write the image into the layout again "
        "(a build or `servimg push … oci:DIR` mends it) or copy the layout from its source",
    )


def _read_only(path: Path) -> bool:
    return path.stat().st_mode & 0o222 == 0


def _read_index(root: Path) -> dict[str, object]:
    try:
        index = json.loads((root / "index.json").read_bytes())
    except FileNotFoundError as exc:
        raise BackendError(
            f"{root} is not an OCI image layout (no index.json)",
            hint="point at a directory written by `servimg build --to oci:DIR`",
        ) from exc
    except (ValueError, RecursionError) as exc:
        raise BackendError(f"{root}/index.json is not valid JSON: {exc}") from None
    if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
        raise BackendError(f"{root}/index.json has no manifests list")
    return index


def tagged_images(root: Path) -> dict[Digest, list[str]]:
    """Every image manifest a layout names under a tag (`org.opencontainers.image.ref.name`), by digest;
    attestations and untagged entries are left out (`servimg matrix oci:DIR`)."""
    found: dict[Digest, list[str]] = {}
    for entry in jv.seq(_read_index(root).get("manifests") or [], "manifests"):
        item = jv.obj(entry, "manifests[]")
        notes = item.get("annotations")
        name = notes.get(REF_NAME) if isinstance(notes, dict) else None
        kind = item.get("mediaType")
        if (
            isinstance(name, str)
            and not is_artifact_tag(name)
            and kind in (OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX)
        ):
            found.setdefault(Digest.parse(jv.text(item.get("digest"), "digest")), []).append(name)
    return found


def read_manifest_and_config(root: Path, digest: Digest) -> Image:
    """One image of a layout by its manifest digest: its manifest and config, each hashed against its
    name; no layer is read."""
    manifest = _read_blob(root, digest)
    if Digest.of_bytes(manifest) != digest:
        raise BackendError(
            f"{root}: blob {digest} does not match its name", hint="write the image there again"
        )
    descriptor = jv.obj(jv.obj(json.loads(manifest), "manifest").get("config"), "config")
    config_digest = Digest.parse(jv.text(descriptor.get("digest"), "config.digest"))
    config = _read_blob(root, config_digest)
    if Digest.of_bytes(config) != config_digest:
        raise BackendError(f"{root}: blob {config_digest} does not match its name")
    return Image.parse(manifest, config)


def _select(index: dict[str, object], root: Path, tag: str | None, digest: Digest | None) -> Descriptor:
    """The index entry named by `digest`, else by `tag`, else the layout's one image: attestations share
    index.json with their image (an entry with an `artifactType`), so they are no candidates for it."""
    entries = jv.objs(index["manifests"], "index.manifests")
    descs = [Descriptor.from_json(d, f"index.manifests[{i}]") for i, d in enumerate(entries)]
    if digest is not None:
        found = [d for d in descs if d.digest == digest]
    elif tag is not None:
        found = [d for d in descs if dict(d.annotations).get(REF_NAME) == tag]
    else:
        found = [
            d
            for d, raw in zip(descs, entries, strict=True)
            if not raw.get("artifactType") and not is_artifact_tag(dict(d.annotations).get(REF_NAME, ""))
        ]
    if len(found) != 1:
        names = sorted(dict(d.annotations).get(REF_NAME, str(d.digest)) for d in descs)
        want = str(digest or tag or "the only image")
        raise BackendError(
            f"{root}: cannot select {want}; the layout holds {names}",
            hint="name one with oci:DIR:TAG or oci:DIR@sha256:…",
        )
    return found[0]


def _nested(index: dict[str, object], root: Path, digest: Digest | None) -> Descriptor | None:
    """The child manifest `digest` of an image index the layout lists (a multi-platform image's child is
    reached through its index, never listed in index.json itself); None when index.json lists `digest`,
    or no listed index has it."""
    if digest is None:
        return None
    entries = [
        Descriptor.from_json(d, "index.manifests[]") for d in jv.objs(index["manifests"], "index.manifests")
    ]
    if any(d.digest == digest for d in entries):
        return None
    for entry in entries:
        if entry.media_type in INDEX_TYPES:
            children = ImageIndex.parse(_read_blob(root, entry.digest), f"{root}@{entry.digest}")
            found = [e.descriptor for e in children.entries if e.descriptor.digest == digest]
            if found:
                return found[0]
    return None


def _read_blob(root: Path, digest: Digest) -> bytes:
    path = root / "blobs" / digest.algorithm / digest.hex
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise BackendError(f"{root}: blob {digest} is missing", hint="the layout is incomplete") from exc
    digest.verify(data, f"{root}: blob {digest.short}")
    return data


def write_layout(
    image: Image, root: Path, store: BlobStore, *, tag: str | None, store_owned: bool = False
) -> tuple[Digest, ...]:
    """Write `image` (manifest, config, layers from `store`) into the layout at `root`; returns the blobs
    that were already there with bytes that did not match their names and were replaced ("mended").

    `store_owned` is for a layout that is part of the cache itself and never handed out (a base cached by
    `cached_base`): its layers are hard links to the store's blobs (verified first), so a multi-GB base is
    on disk once. Every other layout gets files of its own."""
    if root.exists() and not (root / "index.json").is_file():
        raise BackendError(
            f"{root} exists and is not an OCI image layout", hint="choose a new directory or remove it"
        )
    if root.exists():
        with _locked(root):
            return _add_to_layout(image, root, store, tag, link=store_owned)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        os.chmod(tmp, DIR_MODE)  # mkdtemp makes it 0700; the layout is read by other tools and users
        (tmp / "oci-layout").write_bytes(LAYOUT_FILE)
        os.chmod(tmp / "oci-layout", integrity.BLOB_MODE)
        empty = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
        mended = _add_to_layout(image, tmp, store, tag, index_json=empty, link=store_owned)
        try:
            os.replace(tmp, root)
        except OSError:
            if not (root / "index.json").is_file():
                raise
            # Another writer created the layout first: add to it instead (under its lock).
            shutil.rmtree(tmp, ignore_errors=True)
            with _locked(root):
                return _add_to_layout(image, root, store, tag, link=store_owned)
        return mended
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """An exclusive flock on the layout directory itself: concurrent writers (two builds publishing to
    one layout) update index.json one at a time, so no tag is lost. No lock file is left behind."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _add_to_layout(
    image: Image,
    root: Path,
    store: BlobStore,
    tag: str | None,
    index_json: dict[str, object] | None = None,  # the layout's index.json as read; else read here
    *,
    link: bool = False,
) -> tuple[Digest, ...]:
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    for directory in (root / "blobs", blobs):
        os.chmod(directory, DIR_MODE)
    mended = [
        layer.digest
        for layer in image.layer_descriptors
        if _put_blob(store, layer.digest, layer.size, blobs / layer.digest.hex, link=link)
    ]
    mended += [
        digest
        for digest, data in ((image.config_digest, image.config_bytes), (image.digest, image.manifest_bytes))
        if _write_blob(blobs / digest.hex, digest, data)
    ]
    listing = _read_index(root) if index_json is None else index_json
    entry = Descriptor(
        OCI_MANIFEST if image.media_type == OCI_MANIFEST else image.media_type,
        image.digest,
        len(image.manifest_bytes),
        ((REF_NAME, tag),) if tag else (),
    ).to_json()
    kept = [
        m
        for m in jv.objs(listing["manifests"], "index.manifests")
        if not (tag and jv.member(m, "annotations", REF_NAME) == tag) and m != entry
    ]
    listing["manifests"] = sorted([*kept, entry], key=canonical.dumps)
    _write_file(root / "index.json", canonical.dumps(listing))
    return tuple(mended)


def write_index(
    index: ImageIndex,
    children: Sequence[Image],
    root: Path,
    store: BlobStore,
    *,
    tag: str | None,
    store_owned: bool = False,
) -> None:
    """Write a multi-platform index into the layout at `root`: each child's blobs and manifest, the
    index's bytes, and one index.json entry naming the index (with `tag`): the children are reached
    through it, so they get no entries of their own (an untagged entry a child had before is kept).
    `store_owned`: the cache's own layout (a multi-platform base), hard-linked as `write_layout` does."""
    held = set()
    if (root / "index.json").is_file():
        held = {str(m.get("digest")) for m in jv.objs(_read_index(root)["manifests"], "index.manifests")}
    for child in children:
        write_layout(child, root, store, tag=None, store_owned=store_owned)
    add_index(index, root, tag=tag, replacing={str(c.digest) for c in children} - held)


def add_index(index: ImageIndex, root: Path, *, tag: str | None, replacing: Set[str] = frozenset()) -> None:
    """The index's bytes and its index.json entry (with `tag`) in the layout that holds its children, under
    the layout's lock; untagged entries of the manifests in `replacing` (children just written) are
    dropped: the index reaches them."""
    with _locked(root):
        _write_blob(root / "blobs" / "sha256" / index.digest.hex, index.digest, index.index_bytes)
        current = _read_index(root)
        entry = Descriptor(
            index.media_type, index.digest, len(index.index_bytes), ((REF_NAME, tag),) if tag else ()
        )
        kept = [
            m
            for m in jv.objs(current["manifests"], "index.manifests")
            if not (tag and jv.member(m, "annotations", REF_NAME) == tag)
            and not (str(m.get("digest")) in replacing and not m.get("annotations"))
            and m != entry.to_json()
        ]
        current["manifests"] = sorted([*kept, entry.to_json()], key=canonical.dumps)
        _write_file(root / "index.json", canonical.dumps(current))


def read_index(root: Path, tag: str | None) -> ImageIndex | None:
    """The multi-platform index the layout's `tag` (or its only entry) names, or None for one image."""
    desc = _select(_read_index(root), root, tag, None)
    if desc.media_type not in INDEX_TYPES:
        return None
    return ImageIndex.parse(_read_blob(root, desc.digest), f"{root}@{desc.digest}")


def index_at(root: Path, digest: Digest) -> ImageIndex | None:
    """The index blob `digest` of the layout, or None when that blob is a single image's manifest."""
    data = _read_blob(root, digest)
    try:
        media = json.loads(data).get("mediaType")
    except (ValueError, AttributeError):
        return None
    return ImageIndex.parse(data, f"{root}@{digest}") if media in INDEX_TYPES else None


def add_artifact(root: Path, blobs: Sequence[bytes], descriptor: Mapping[str, object]) -> None:
    """Add an artifact (its blobs, then its manifest's `descriptor` in index.json) to an existing layout,
    under the layout's lock like every other index.json update, so no concurrent writer loses an entry."""
    _read_index(root)
    with _locked(root):
        for blob in blobs:
            digest = Digest.of_bytes(blob)
            _write_blob(root / "blobs" / "sha256" / digest.hex, digest, blob)
        index = _read_index(root)
        kept = [
            m
            for m in jv.seq(index["manifests"])
            if not (isinstance(m, dict) and m.get("digest") == descriptor["digest"])
        ]
        index["manifests"] = sorted([*kept, dict(descriptor)], key=canonical.dumps)
        _write_file(root / "index.json", canonical.dumps(index))


def _unique_tmp(dest: Path) -> Path:
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    return Path(name)


def _put_blob(store: BlobStore, digest: Digest, size: int, dest: Path, *, link: bool = False) -> bool:
    """Put the store's blob into the layout as a file of its own (never a hard link: a writer of the
    layout must not reach the store or any other layout), unless the layout holds it already. What is
    there is re-hashed first: a blob whose bytes do not match its name (written in place, cut short, a
    disk fault) is replaced, and True says so (mended)."""
    present = dest.exists()
    if present and integrity.matches(dest, digest, size):
        return False
    tmp = _unique_tmp(dest)
    try:
        tmp.unlink()
        try:
            if not (link and integrity.link_verified(store.path(digest), tmp, digest)):
                integrity.copy_verified(store.path(digest), tmp, digest)
        except StoreError:
            store.evict(digest)  # the store's copy is bad too: named, removed, never handed on
            raise
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return present


def _write_blob(dest: Path, digest: Digest, data: bytes) -> bool:
    """Write a small blob (config, manifest, artifact) unless the layout holds it with these bytes; True
    when a blob of that name was there with other bytes and is replaced (mended)."""
    try:
        if dest.read_bytes() == data:
            return False
        present = True
    except FileNotFoundError:
        present = False
    _write_file(dest, data)
    return present


def _write_file(dest: Path, data: bytes) -> None:
    """Atomically replace `dest` (unique temp name: concurrent writers never share a temp file)."""
    atomic_write(dest, data, 0o644)


class LayoutBackend:
    """`oci:DIR[:TAG]`: the tag in the target wins over the build's tag; nothing to reach beforehand."""

    def read(self, target: Target, io: Io, how: ReadOptions) -> Image:
        return read_layout(
            Path(target.location),
            io.store,
            tag=target.tag,
            digest=how.expected,
            rehash=how.rehash,
            platform=how.platform,
        )

    def write(self, image: Image, target: Target, io: Io, options: WriteOptions) -> str:
        chosen = target.tag or options.get("tag")
        try:
            mended = write_layout(image, Path(target.location), io.store, tag=chosen)
        except OSError as exc:  # a full disk, a read-only place: the destination's, named (issue 48)
            raise host_error(
                exc, f"writing the OCI layout {target.location}", where=target.location
            ) from None
        where = f"oci:{target.location}" + (f":{chosen}" if chosen else "")
        if mended:
            io.log(f"{where}: mended {len(mended)} blob(s) whose bytes did not match their names")
            return f"{where} (mended {len(mended)} corrupt blob(s): {', '.join(str(d) for d in mended)})"
        return where

    def write_index(self, indexed: IndexedImages, target: Target, io: Io, options: WriteOptions) -> str:
        chosen = target.tag or options.get("tag")
        write_index(indexed.index, indexed.ordered, Path(target.location), io.store, tag=chosen)
        return f"oci:{target.location}" + (f":{chosen}" if chosen else "") + f"@{indexed.digest}"

    def check_reachable(self, target: Target) -> None:
        return None

    def referrers(self, target: Target) -> AbstractContextManager[Referrers]:
        return contextlib.nullcontext(LayoutReferrers(Path(target.location)))


@dataclass(frozen=True)
class LayoutReferrers:
    """The artifacts in an OCI image layout that refer to its images (image-spec `image-layout.md`): each
    is a blob like any other, its descriptor in index.json (written under the layout's lock)."""

    root: Path

    def discover(self, subject: Digest) -> tuple[list[dict[str, object]], str]:
        """The index entries with an `artifactType` whose manifest names `subject` (a layout may hold
        several images and their artifacts, and an index entry only points: each manifest is read and
        re-hashed); one that cannot be read is listed, for the verifier to report."""
        if not (self.root / "index.json").is_file():
            return [], f"OCI layout {self.root}"
        out = []
        for entry in jv.seq(self._index()["manifests"]):
            if not (
                isinstance(entry, dict) and entry.get("artifactType") and valid_digest(entry.get("digest"))
            ):
                continue
            try:
                manifest = json.loads(self.blob(Digest.parse(entry["digest"])))
            except (ReferrersError, ValueError):
                out.append(dict(entry))
                continue
            if (
                jv.member(manifest, "subject", "digest") == str(subject)
                if isinstance(manifest, dict)
                else False
            ):
                out.append(dict(entry))
        return sorted(out, key=canonical.dumps), f"OCI layout {self.root}"

    def manifest(self, artifact: Digest) -> tuple[bytes, str]:
        return self.blob(artifact), OCI_MANIFEST

    def blob(self, digest: Digest) -> bytes:
        path = self.root / "blobs" / digest.algorithm / digest.hex
        try:
            data = path.read_bytes()
        except OSError:
            raise ReferrersError(f"{self.root}: blob {digest} is missing") from None
        if Digest.of_bytes(data) != digest:
            raise ReferrersError(f"{self.root}: blob {digest} does not hash to its name")
        return data

    def attach(self, subject: Digest, manifest: bytes, blobs: Sequence[bytes]) -> Digest:
        """The blobs and the manifest into `blobs/sha256/`, the artifact's descriptor added to index.json
        (replaced atomically last); the subject must be in this layout."""
        self._index()
        if not (self.root / "blobs" / "sha256" / subject.hex).is_file():
            raise ReferrersError(f"{self.root}: the subject {subject} is not in this layout")
        add_artifact(self.root, (*blobs, manifest), referrer_descriptor(manifest))
        return Digest.of_bytes(manifest)

    def tagged(self, tag: str) -> bytes | None:
        entry = _tag_entry(self._index(), tag)
        return None if entry is None else self.blob(Digest.parse(entry["digest"]))

    def update_tagged(self, tag_change: TagChange) -> Digest | None:
        """Exact under the layout's lock: read, update and replace the entry named by the tag as one
        step (`holds` has nothing to re-check: no other writer ran in between)."""
        tag = tag_change.tag
        self._index()
        with _locked(self.root):
            entry = _tag_entry(self._index(), tag)
            change = tag_change.update(None if entry is None else self.blob(Digest.parse(entry["digest"])))
            if change is None:
                return None
            for blob in (*change.blobs, change.manifest):
                digest = Digest.of_bytes(blob)
                _write_blob(self.root / "blobs" / "sha256" / digest.hex, digest, blob)
            digest = Digest.of_bytes(change.manifest)
            new = Descriptor(OCI_MANIFEST, digest, len(change.manifest), ((REF_NAME, tag),)).to_json()
            index = self._index()
            kept = [m for m in jv.seq(index["manifests"]) if not _named(m, tag)]
            index["manifests"] = sorted([*kept, new], key=canonical.dumps)
            _write_file(self.root / "index.json", canonical.dumps(index))
            return digest

    def commit(
        self, subject: Digest, artifacts: Sequence[Artifact], changes: Sequence[TagChange]
    ) -> tuple[list[Digest], list[Digest | None]]:
        """Each artifact and each tag change under the layout's lock: nothing to wait for."""
        digests = [self.attach(subject, a.manifest, a.blobs) for a in artifacts]
        return digests, [self.update_tagged(c) for c in changes]

    def _index(self) -> dict[str, object]:
        try:
            index = json.loads((self.root / "index.json").read_bytes())
        except (OSError, ValueError):
            raise ReferrersError(
                f"{self.root} is not a readable OCI image layout (index.json)",
                hint="write the image there first (`servimg build --to oci:DIR`)",
            ) from None
        if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
            raise ReferrersError(f"{self.root}/index.json has no manifests list")
        return index


def _named(entry: object, tag: str) -> bool:
    return isinstance(entry, dict) and jv.member(entry, "annotations", REF_NAME) == tag


def _tag_entry(index: Mapping[str, object], tag: str) -> dict[str, Any] | None:
    named = [m for m in jv.seq(index["manifests"]) if isinstance(m, dict) and _named(m, tag)]
    if not named or not valid_digest(named[0].get("digest")):
        return None
    return {str(k): v for k, v in named[0].items()}


BACKEND = LayoutBackend()
