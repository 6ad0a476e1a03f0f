"""OCI image layout directories (image-spec "OCI Image Layout"): read a base from one, write images to one.

Writes never leave a half-written layout: a new layout is assembled in a sibling temp directory and
renamed into place; adding to an existing layout writes blobs first (content-addressed, harmless if
interrupted) and replaces `index.json` atomically last, under an flock on the layout directory so that
concurrent writers never lose each other's tags. Reading refuses a manifest that names a missing blob or
a blob of another size.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from servimg.backends.target import Target, WriteOptions
from servimg.core import canonical
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest
from servimg.core.errors import BackendError
from servimg.core.progress import Log, Progress
from servimg.oci.image import INDEX_TYPES, OCI_INDEX, OCI_MANIFEST, REF_NAME, Descriptor, Image
from servimg.oci.store import BlobStore

LAYOUT_FILE = b'{"imageLayoutVersion":"1.0.0"}'


def read_layout(
    root: Path,
    store: BlobStore,
    *,
    tag: str | None = None,
    digest: Digest | None = None,
    link: bool = False,
) -> Image:
    """Load the manifest selected by `digest` or `tag` (or the only one) and copy its blobs into `store`.

    Blobs are hard-linked instead (each verified first) when `link` says the layout is the caller's own
    and never rewritten (servimg's base cache), or when a blob has no write bit at all (a Nix store path,
    a read-only layout): a copy would only double the disk a multi-GB base takes."""
    index = _read_index(root)
    desc = _select(index, root, tag, digest)
    manifest_bytes = _read_blob(root, desc.digest)
    if desc.media_type in INDEX_TYPES:
        raise BackendError(
            f"{root}: {desc.digest} is an image index, not a single-platform manifest",
            hint="select the platform manifest by digest (oci:DIR@sha256:…)",
        )
    try:
        manifest = json.loads(manifest_bytes)
    except (ValueError, RecursionError) as exc:
        raise BackendError(f"{root}: manifest {desc.digest} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise BackendError(f"{root}: manifest {desc.digest} is not a JSON object")
    config = Descriptor.from_json(manifest.get("config"), "manifest.config")
    image = Image.parse(manifest_bytes, _read_blob(root, config.digest))
    for i, layer in enumerate(image.layer_descriptors):
        if store.has(layer.digest, layer.size):
            continue
        source = root / "blobs" / layer.digest.algorithm / layer.digest.hex
        if not source.is_file():
            raise BackendError(
                f"{root}: manifest.layers[{i}] names blob {layer.digest}, which is missing from the layout",
                hint="the layout is incomplete; copy it again from its source",
            )
        _, size = store.put_file(source, layer.digest, link=link or _read_only(source))
        if size != layer.size:
            raise BackendError(
                f"{root}: manifest.layers[{i}] says {layer.size} bytes, blob {layer.digest.short} has {size}",
                hint="the manifest's descriptor is wrong; the image is corrupt or tampered",
            )
    store.put_bytes(manifest_bytes)
    store.put_bytes(image.config_bytes)
    return image


def _read_only(path: Path) -> bool:
    return path.stat().st_mode & 0o222 == 0


def _read_index(root: Path) -> dict[str, Any]:
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


def _select(index: dict[str, Any], root: Path, tag: str | None, digest: Digest | None) -> Descriptor:
    descs = [Descriptor.from_json(d, f"index.manifests[{i}]") for i, d in enumerate(index["manifests"])]
    if digest is not None:
        found = [d for d in descs if d.digest == digest]
    elif tag is not None:
        found = [d for d in descs if dict(d.annotations).get(REF_NAME) == tag]
    else:
        found = descs
    if len(found) != 1:
        names = sorted(dict(d.annotations).get(REF_NAME, str(d.digest)) for d in descs)
        want = str(digest or tag or "the only image")
        raise BackendError(
            f"{root}: cannot select {want}; the layout holds {names}",
            hint="name one with oci:DIR:TAG or oci:DIR@sha256:…",
        )
    return found[0]


def _read_blob(root: Path, digest: Digest) -> bytes:
    path = root / "blobs" / digest.algorithm / digest.hex
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise BackendError(f"{root}: blob {digest} is missing", hint="the layout is incomplete") from exc
    digest.verify(data, f"{root}: blob {digest.short}")
    return data


def write_layout(image: Image, root: Path, store: BlobStore, *, tag: str | None) -> None:
    """Write `image` (manifest, config, layers from `store`) into the layout at `root`."""
    if root.exists() and not (root / "index.json").is_file():
        raise BackendError(
            f"{root} exists and is not an OCI image layout", hint="choose a new directory or remove it"
        )
    if root.exists():
        with _locked(root):
            _add_to_layout(image, root, store, tag)
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        (tmp / "oci-layout").write_bytes(LAYOUT_FILE)
        _add_to_layout(
            image, tmp, store, tag, index={"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
        )
        try:
            os.replace(tmp, root)
        except OSError:
            if not (root / "index.json").is_file():
                raise
            # Another writer created the layout first: add to it instead (under its lock).
            shutil.rmtree(tmp, ignore_errors=True)
            with _locked(root):
                _add_to_layout(image, root, store, tag)
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
    image: Image, root: Path, store: BlobStore, tag: str | None, index: dict[str, Any] | None = None
) -> None:
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    for layer in image.layer_descriptors:
        _copy_blob(store.path(layer.digest), blobs / layer.digest.hex)
    _write_blob(blobs / image.config_digest.hex, image.config_bytes)
    _write_blob(blobs / image.digest.hex, image.manifest_bytes)
    index = index if index is not None else _read_index(root)
    entry = Descriptor(
        OCI_MANIFEST if image.media_type == OCI_MANIFEST else image.media_type,
        image.digest,
        len(image.manifest_bytes),
        ((REF_NAME, tag),) if tag else (),
    ).to_json()
    kept = [
        m
        for m in index["manifests"]
        if not (tag and (m.get("annotations") or {}).get(REF_NAME) == tag) and m != entry
    ]
    index["manifests"] = sorted([*kept, entry], key=canonical.dumps)
    _write_file(root / "index.json", canonical.dumps(index))


def add_artifact(root: Path, blobs: Sequence[bytes], descriptor: Mapping[str, Any]) -> None:
    """Add an artifact (its blobs, then its manifest's `descriptor` in index.json) to an existing layout,
    under the layout's lock like every other index.json update, so no concurrent writer loses an entry."""
    _read_index(root)
    with _locked(root):
        for blob in blobs:
            _write_blob(root / "blobs" / "sha256" / Digest.of_bytes(blob).hex, blob)
        index = _read_index(root)
        kept = [
            m
            for m in index["manifests"]
            if not (isinstance(m, dict) and m.get("digest") == descriptor["digest"])
        ]
        index["manifests"] = sorted([*kept, dict(descriptor)], key=canonical.dumps)
        _write_file(root / "index.json", canonical.dumps(index))


def _unique_tmp(dest: Path) -> Path:
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    os.close(fd)
    return Path(name)


def _copy_blob(src: Path, dest: Path) -> None:
    """Put the store's blob into the layout unless the layout holds it already: a blob of another size
    under its name (a copy cut short, a truncated file) is replaced, so a rebuild into the layout mends it."""
    with contextlib.suppress(OSError):
        if dest.stat().st_size == src.stat().st_size:
            return
    tmp = _unique_tmp(dest)
    try:
        tmp.unlink()
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _write_blob(dest: Path, data: bytes) -> None:
    if not dest.exists():
        _write_file(dest, data)


def _write_file(dest: Path, data: bytes) -> None:
    """Atomically replace `dest` (unique temp name: concurrent writers never share a temp file)."""
    atomic_write(dest, data, 0o644)


class LayoutBackend:
    """`oci:DIR[:TAG]`: the tag in the target wins over the build's tag; nothing to reach beforehand."""

    def read(
        self, target: Target, store: BlobStore, log: Log, *, expected: Digest | None, progress: Progress
    ) -> Image:
        return read_layout(Path(target.location), store, tag=target.tag, digest=expected)

    def write(self, image: Image, target: Target, store: BlobStore, log: Log, options: WriteOptions) -> str:
        chosen = target.tag or options.get("tag")
        write_layout(image, Path(target.location), store, tag=chosen)
        return f"oci:{target.location}" + (f":{chosen}" if chosen else "")

    def check_reachable(self, target: Target) -> None:
        return None


BACKEND = LayoutBackend()
