"""docker-archive tarballs (`docker save` / `docker load` format: manifest.json + config + layer tars).

`docker load` needs `manifest.json` (docs/design.md, "Decisions already taken"); an OCI layout alone is not
enough for Docker Engine 20.10. A thin archive omits the files of layers the engine already holds:
the engine looks each layer chain up by diffID before it opens the file (moby image/tarexport/load.go).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO

from servimg.backends.referrers import Referrers, ReferrersError
from servimg.backends.target import ReadOptions, Target, WriteOptions, one_child, only_child_said
from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.core.errors import BackendError
from servimg.oci.image import OCI_LAYER, OCI_LAYER_GZIP, Descriptor, Image, Layer
from servimg.oci.index import IndexedImages
from servimg.oci.store import BlobStore, Io


def write_archive(
    image: Image,
    out: BinaryIO,
    store: BlobStore,
    *,
    tags: Sequence[str] = (),
    skip_layers: frozenset[Digest] = frozenset(),
) -> None:
    """Stream a docker-archive of `image`. Layers whose diffID is in `skip_layers` are listed, not sent."""
    config_name = f"{image.config_digest.hex}.json"
    layer_names = [f"{layer.diff_id.hex}/layer.tar" for layer in image.layers]
    manifest = [{"Config": config_name, "RepoTags": list(tags), "Layers": layer_names}]
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, config_name, image.config_bytes)
        for layer, name in zip(image.layers, layer_names, strict=True):
            if layer.diff_id in skip_layers:
                continue
            # docker load accepts gzip or plain layer files; hand it the blob as it is.
            path = store.path(layer.descriptor.digest)
            info = tarfile.TarInfo(name)
            info.size = path.stat().st_size
            info.mode = 0o644
            with path.open("rb") as fh:
                tar.addfile(info, fh)
        _add_bytes(tar, "manifest.json", canonical.dumps(manifest))


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def read_archive(path_or_stream: Path | BinaryIO, store: BlobStore, *, tag: str | None = None) -> Image:
    """Read a docker-archive (from a file or a `docker save` stream) into `store`.

    The manifest is re-created canonically around the exact config bytes, with one descriptor per layer
    as stored (plain tar or gzip), so the same archive always yields the same manifest digest.
    """
    entries: dict[str, Path | bytes] = {}
    try:
        if isinstance(path_or_stream, Path):
            with path_or_stream.open("rb") as fh, tarfile.open(fileobj=fh, mode="r|*") as tar:
                _ingest(tar, entries, store)
        else:
            with tarfile.open(fileobj=path_or_stream, mode="r|*") as tar:
                _ingest(tar, entries, store)
    except tarfile.TarError as exc:
        raise BackendError(f"not a readable docker-archive: {exc}") from exc
    return _assemble(entries, store, tag)


def _ingest(tar: tarfile.TarFile, entries: dict[str, Path | bytes], store: BlobStore) -> None:
    """Small JSON members are kept in memory; layer files go straight into the blob store."""
    for member in tar:
        if not member.isfile():
            continue
        stream = tar.extractfile(member)
        assert stream is not None
        if member.name.endswith(".json") or member.name == "repositories":
            entries[member.name] = stream.read()
        else:
            digest, _ = store.put_stream(stream)
            entries[member.name] = store.path(digest)


def _assemble(entries: dict[str, Path | bytes], store: BlobStore, tag: str | None) -> Image:
    raw = entries.get("manifest.json")
    if not isinstance(raw, bytes):
        raise BackendError("docker-archive has no manifest.json", hint="was it written by `docker save`?")
    items = _json(raw, "manifest.json")
    if not isinstance(items, list) or not all(_is_item(m) for m in items):
        raise BackendError(
            "docker-archive manifest.json is not a list of {Config, RepoTags, Layers} objects",
            hint="was it written by `docker save`?",
        )
    chosen = [m for m in items if tag is None or tag in (m.get("RepoTags") or [])]
    if len(chosen) != 1:
        raise BackendError(
            f"docker-archive holds {len(items)} images; cannot pick {tag or 'one'}",
            hint="name the image with docker-archive:FILE:TAG",
        )
    item = chosen[0]
    config_bytes = entries.get(item["Config"])
    if not isinstance(config_bytes, bytes):
        raise BackendError(f"docker-archive is missing its config {item['Config']}")
    config = _json(config_bytes, item["Config"])
    rootfs = config.get("rootfs") if isinstance(config, dict) else None
    raw_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(raw_ids, list) or len(raw_ids) != len(item["Layers"]):
        raise BackendError(
            f"docker-archive config {item['Config']} lists {len(raw_ids or [])} diff_ids "
            f"for {len(item['Layers'])} layers",
            hint="the archive is corrupt or tampered",
        )
    diff_ids = [Digest.parse(d) for d in raw_ids]
    layers: list[Layer] = []
    for name, diff_id in zip(item["Layers"], diff_ids, strict=True):
        blob = entries.get(name)
        if not isinstance(blob, Path):
            raise BackendError(
                f"docker-archive is missing layer {name}", hint="the archive is thin or corrupt"
            )
        digest = Digest("sha256", blob.name)
        gz = blob.open("rb").read(2) == b"\x1f\x8b"
        if not gz and digest != diff_id:
            raise BackendError(f"layer {name} hashes to {digest}, config says diffID {diff_id}")
        layers.append(
            Layer(Descriptor(OCI_LAYER_GZIP if gz else OCI_LAYER, digest, os.path.getsize(blob)), diff_id)
        )
    store.put_bytes(config_bytes)
    image = Image.assemble(config_bytes, layers)
    for layer in layers:
        store.uncompressed(layer.descriptor.digest, layer.diff_id)
    store.put_bytes(image.manifest_bytes)
    return image


def _json(data: bytes, what: str) -> object:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BackendError(f"docker-archive {what} is not valid JSON: {exc}") from None


def _is_item(item: object) -> bool:
    return (
        isinstance(item, dict)
        and isinstance(item.get("Config"), str)
        and isinstance(item.get("Layers"), list)
        and all(isinstance(n, str) for n in item["Layers"])
        and isinstance(item.get("RepoTags") or [], list)
    )


def write_archive_file(image: Image, dest: Path, store: BlobStore, tag: str | None) -> None:
    """Write the archive beside `dest` under a temp name and rename it into place: never half a file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            write_archive(image, fh, store, tags=[tag] if tag else [])
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ArchiveBackend:
    """`docker-archive:FILE`: read like `docker save` output, written whole (with the tag as RepoTag)."""

    def read(self, target: Target, io: Io, how: ReadOptions) -> Image:
        return read_archive(Path(target.location), io.store)  # every layer is streamed and hashed anyway

    def write(self, image: Image, target: Target, io: Io, options: WriteOptions) -> str:
        write_archive_file(image, Path(target.location), io.store, options.get("tag"))
        return f"docker-archive:{target.location}"

    def write_index(self, indexed: IndexedImages, target: Target, io: Io, options: WriteOptions) -> str:
        platform, child = one_child(indexed, options, "a docker-archive")
        where = self.write(child, target, io, options)
        return only_child_said(where, platform, indexed, "a docker-archive holds one image")

    def check_reachable(self, target: Target) -> None:
        return None

    def referrers(self, target: Target) -> AbstractContextManager[Referrers]:
        raise ReferrersError(
            f"{target.text()}: attestations cannot live in a docker-archive file",
            hint="push to HOST/REPO[:TAG] or oci:DIR[:TAG]",
        )


BACKEND = ArchiveBackend()
