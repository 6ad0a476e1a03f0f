"""Where images come from and go to: `docker-daemon:`, `oci:`, `docker-archive:`, or a registry ref.

Only dispatch lives here; each backend module does its own I/O. Every sink publishes its name last
(tag after the image is complete), so a failure never leaves a tag or a half-written output behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from servimg.backends import archive, engine, layout
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, ServimgError
from servimg.core.progress import NULL, Advance, CountingReader, Log, Progress
from servimg.oci.image import INDEX_TYPES, Descriptor, Image
from servimg.oci.store import BlobStore


@dataclass(frozen=True)
class Target:
    """A parsed `--to`/base location. kind: engine | oci | archive | registry."""

    kind: str
    location: str
    tag: str | None = None

    @classmethod
    def parse(cls, text: str) -> Target:
        if text in ("docker", "docker-daemon", "engine"):
            return cls("engine", "")
        for prefix, kind in (("docker-daemon:", "engine"), ("oci:", "oci"), ("docker-archive:", "archive")):
            if text.startswith(prefix):
                rest = text[len(prefix) :]
                if kind == "oci":
                    path, tag = layout.split_layout_ref(rest)
                    return cls(kind, str(path), tag)
                return cls(kind, rest)
        if "/" not in text:
            raise BackendError(
                f"not a target: {text!r}",
                hint="use docker, oci:DIR[:TAG], docker-archive:FILE or HOST[:PORT]/REPO[:TAG]",
            )
        return cls("registry", text)


def is_engine_ref(ref: str) -> bool:
    """`docker-daemon:X`, an image ID, or a plain `name[:tag]` without a registry host."""
    if ref.startswith("docker-daemon:") or ref.startswith("sha256:"):
        return True
    if ref.startswith(("oci:", "docker-archive:")):
        return False
    first = ref.split("/", 1)[0]
    return "/" not in ref or not ("." in first or ":" in first or first == "localhost")


def fetch(
    ref: str, store: BlobStore, log: Log, expected: Digest | None = None, progress: Progress = NULL
) -> Image:
    """Fetch an image (manifest, config, all layer blobs) into `store` from wherever `ref` points."""
    target = Target.parse(ref)
    if target.kind == "engine":
        log(f"reading {target.location} from the Docker Engine")
        return engine.read_engine(target.location, store)
    if target.kind == "oci":
        return layout.read_layout(Path(target.location), store, tag=target.tag, digest=expected)
    if target.kind == "archive":
        return archive.read_archive(Path(target.location), store)
    return pull(target.location, store, log, expected, progress)


def platform_manifest(ref_text: str, pinned: Digest, platform: str = "linux/amd64") -> Digest:
    """The single-platform manifest a pinned digest stands for: itself, or, when the pin is a
    multi-platform index (what `docker pull` shows for official images), the entry for `platform`."""
    from servimg.backends.registry import RegistryClient
    from servimg.core.reference import Reference

    ref = Reference.parse(ref_text)
    data, media_type, digest = RegistryClient(ref.registry).get_manifest(ref.repository, str(pinned))
    if media_type not in INDEX_TYPES:
        return digest
    os_name, _, arch = platform.partition("/")
    for entry in json.loads(data).get("manifests") or []:
        plat = entry.get("platform") or {}
        if plat.get("os") == os_name and plat.get("architecture") == arch and not plat.get("variant"):
            return Descriptor.from_json(entry, "index.manifests[]").digest
    raise BackendError(
        f"{ref_text}@{pinned} is an index without a {platform} manifest",
        hint="pin the digest of an image built for this platform",
    )


def pull(
    ref_text: str, store: BlobStore, log: Log, expected: Digest | None = None, progress: Progress = NULL
) -> Image:
    from servimg.backends.registry import RegistryClient
    from servimg.core.reference import Reference

    ref = Reference.parse(ref_text)
    client = RegistryClient(ref.registry)
    reference = str(expected or ref.reference)
    manifest_bytes, media_type, digest = client.get_manifest(ref.repository, reference)
    if media_type in INDEX_TYPES:  # callers resolve an index pin with platform_manifest() first
        raise BackendError(
            f"{ref_text} is a multi-platform index ({digest})",
            hint="pin the index in base.digest (servimg picks linux/amd64) or the platform manifest",
        )
    if expected is not None and digest != expected:
        raise BackendError(f"{ref_text} resolved to {digest}, not the pinned {expected}")
    config_digest = _config_digest(manifest_bytes, ref_text)
    image = Image.parse(manifest_bytes, client.get_blob(ref.repository, config_digest))
    for desc in image.layer_descriptors:
        if not store.has(desc.digest, desc.size):
            log(f"pulling layer {desc.digest.short} ({desc.size / 1e6:.1f} MB)")
            with progress.transfer(f"pull {desc.digest.short}", desc.size) as advance:
                client.download_blob(ref.repository, desc.digest, store.path(desc.digest))
                advance(desc.size)
    store.put_bytes(image.config_bytes)
    store.put_bytes(image.manifest_bytes)
    return image


def _config_digest(manifest_bytes: bytes, ref_text: str) -> Digest:
    """The config digest of a manifest a registry served (which may be anything at all)."""
    try:
        manifest = json.loads(manifest_bytes)
    except (ValueError, RecursionError):
        manifest = None
    if not isinstance(manifest, dict):
        raise BackendError(f"{ref_text}: the registry served a manifest that is not a JSON object")
    return Descriptor.from_json(manifest.get("config"), "manifest.config").digest


def publish(
    image: Image,
    target: Target,
    store: BlobStore,
    log: Log,
    *,
    tag: str | None,
    base_config: Digest | None = None,
    mount_from: str | None = None,
    progress: Progress = NULL,
) -> str:
    """Write `image` to `target`; returns a human description of where it went."""
    if target.kind == "engine":
        how = engine.load(image, store, tag=tag, base_config=base_config)
        return f"docker engine {tag or image.config_digest} ({how} load)"
    if target.kind == "oci":
        chosen = target.tag or tag
        layout.write_layout(image, Path(target.location), store, tag=chosen)
        return f"oci:{target.location}" + (f":{chosen}" if chosen else "")
    if target.kind == "archive":
        write_archive_file(image, Path(target.location), store, tag)
        return f"docker-archive:{target.location}"
    return push(image, target.location, store, log, tag=tag, mount_from=mount_from, progress=progress)


def write_archive_file(image: Image, dest: Path, store: BlobStore, tag: str | None) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            archive.write_archive(image, fh, store, tags=[tag] if tag else [])
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def push(
    image: Image,
    ref_text: str,
    store: BlobStore,
    log: Log,
    *,
    tag: str | None,
    mount_from: str | None = None,
    progress: Progress = NULL,
) -> str:
    """Blobs first (skipped/cross-mounted when present), manifest by digest, the tag last."""
    from servimg.backends.registry import RegistryClient
    from servimg.core.reference import Reference

    ref = Reference.parse(ref_text)
    chosen = ref.tag or tag
    client = RegistryClient(ref.registry)
    store.put_bytes(image.config_bytes)  # a freshly assembled image's config may exist only as bytes
    for desc in [*image.layer_descriptors, image.config_descriptor]:
        with progress.transfer(f"push {desc.digest.short}", desc.size) as advance:
            opener = _opener(store.path(desc.digest), advance)
            how = client.push_blob(ref.repository, desc.digest, desc.size, opener, mount_from=mount_from)
        log(f"blob {desc.digest.short}: {how}")
    client.put_manifest(ref.repository, str(image.digest), image.manifest_bytes, image.media_type)
    if chosen:
        client.put_manifest(ref.repository, chosen, image.manifest_bytes, image.media_type)
    return f"{ref.registry}/{ref.repository}" + (f":{chosen}" if chosen else "") + f"@{image.digest}"


def _opener(path: Path, advance: Advance) -> Callable[[], BinaryIO]:
    def open_blob() -> BinaryIO:
        return CountingReader(path.open("rb"), advance)  # type: ignore[return-value]

    return open_blob


def check_reachable(target: Target) -> None:
    """Fail before any work when the sink cannot possibly accept the image."""
    try:
        if target.kind == "engine":
            engine.client()
        elif target.kind == "registry":
            from servimg.backends.registry import RegistryClient
            from servimg.core.reference import Reference

            RegistryClient(Reference.parse(target.location).registry).ping()
    except ServimgError as exc:
        raise exc.context(f"target {target.kind} {target.location}".rstrip()) from None
