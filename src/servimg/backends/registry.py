"""The registry backend: an image read from (index refused, every blob re-hashed) and written to an OCI
distribution registry (blobs skipped or mounted, the manifest's exact bytes by digest, the tag last).

Why our own client (`backends.registryclient`, its HTTP details in `backends.registrywire`, authorization
in `backends.registryauth`): Docker Engine 20.10's `docker push` rewrites an OCI manifest into Docker
schema 2, which changes its digest. A publisher that promises "this digest is what was built" must PUT the
manifest's exact bytes, and must re-hash everything it reads back. Section names ("§Pushing blobs" …) are
those of the distribution spec's `spec.md`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from servimg.backends.referrers import Referrers
from servimg.backends.registryclient import RegistryClient
from servimg.backends.registryreferrers import RegistryReferrers
from servimg.backends.target import ReadOptions, Target, WriteOptions
from servimg.core.context import NULL, Advance, CountingReader, Log, Progress
from servimg.core.digest import Digest
from servimg.core.errors import RegistryError
from servimg.core.platform import Platform, texts
from servimg.core.reference import Reference, is_valid_repository
from servimg.oci.image import (
    INDEX_TYPES,
    Descriptor,
    Image,
)
from servimg.oci.index import ImageIndex, IndexedImages
from servimg.oci.store import Io

# ----------------------------------------------------------------------------------------------- images


def read_image(
    client: RegistryClient,
    repository: str,
    reference: str,
    *,
    expected: Digest | None = None,
    platform: Platform | None = None,
) -> tuple[Image, str]:
    """One single-platform image's manifest and config (both re-hashed) and the manifest's media type.

    An index stands for one of its children only when `platform` says which; without it, it is refused
    with its platforms named (`platform_manifest` picks for a definition's base)."""
    name = f"{client.registry}/{repository}" + ("@" if ":" in reference else ":") + reference
    data, media_type, digest = client.get_manifest(repository, reference)
    if expected is not None and digest != expected:
        raise RegistryError(f"{name} resolved to {digest}, not the pinned {expected}")
    if media_type in INDEX_TYPES:
        index = ImageIndex.parse(data, name)
        if platform is None:
            raise RegistryError(
                f"{name} is a multi-platform index ({digest}) of {texts(index.platforms)}",
                hint="choose one with --platform (or name the platform's manifest by digest, REPO@sha256:…)",
            )
        child = index.child(platform)
        data, media_type, digest = client.get_manifest(repository, str(child.digest))
        if digest != child.digest or media_type in INDEX_TYPES:
            raise RegistryError(f"{name}: the {platform} entry {child.digest} is not served as listed")
    config = Descriptor.from_json(_manifest_object(data, name).get("config"), "manifest.config")
    return Image.parse(data, client.get_blob(repository, config.digest)), media_type


def read_index(ref_text: str) -> ImageIndex | None:
    """The multi-platform index `ref_text` names (its exact bytes, re-hashed), or None for one image."""
    ref = Reference.parse(ref_text)
    with RegistryClient(ref.registry) as client:
        data, media_type, _ = client.get_manifest(ref.repository, str(ref.reference))
    return ImageIndex.parse(data, ref_text) if media_type in INDEX_TYPES else None


def _manifest_object(data: bytes, name: str) -> dict[str, object]:
    """A manifest a registry served (which may be anything at all) as a JSON object."""
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError):
        manifest = None
    if not isinstance(manifest, dict):
        raise RegistryError(f"{name}: the registry served a manifest that is not a JSON object")
    return manifest


def platform_manifest(ref_text: str, pinned: Digest, platform: str = "linux/amd64") -> Digest:
    """The single-platform manifest a pinned digest stands for: itself, or, when the pin is a
    multi-platform index (what `docker pull` shows for official images), the entry for `platform`."""
    ref = Reference.parse(ref_text)
    with RegistryClient(ref.registry) as client:
        data, media_type, digest = client.get_manifest(ref.repository, str(pinned))
    if media_type not in INDEX_TYPES:
        return digest
    index = ImageIndex.parse(data, f"{ref_text}@{pinned}")
    wanted = Platform(*platform.split("/", 1))
    if wanted not in index.platforms:
        raise RegistryError(
            f"{ref_text}@{pinned} is an index without a {platform} manifest "
            f"(it has {texts(index.platforms)})",
            hint="pin the digest of an image built for this platform",
        )
    return index.child(wanted).digest


def pull(ref_text: str, io: Io, how: ReadOptions | None = None) -> Image:
    """The image `ref_text` (or the pinned `how.expected` digest in its repository), every blob in the
    context's store.

    With `how.rehash` every layer is fetched from the registry and hashed even when the store holds it
    (`check --deep`, `verify`: what the registry serves is what is checked, not the local copy)."""
    ref = Reference.parse(ref_text)
    how = how or ReadOptions()
    store, log, expected, progress = io.store, io.log, how.expected, how.progress
    with RegistryClient(ref.registry) as client:
        image, _ = read_image(
            client, ref.repository, str(expected or ref.reference), expected=expected, platform=how.platform
        )
        for i, desc in enumerate(image.layer_descriptors):
            if how.rehash and store.has(desc.digest, desc.size):
                log(f"re-fetching layer {desc.digest.short} ({desc.size / 1e6:.1f} MB) to hash it")
                with progress.transfer(f"hash {desc.digest.short}", desc.size) as advance:
                    try:
                        client.hash_blob(ref.repository, desc.digest)
                    except RegistryError as exc:
                        raise exc.context(f"layer {i}") from None
                    advance(desc.size)
            elif not store.has(desc.digest, desc.size):
                log(f"pulling layer {desc.digest.short} ({desc.size / 1e6:.1f} MB)")
                with progress.transfer(f"pull {desc.digest.short}", desc.size) as advance:
                    client.download_blob(ref.repository, desc.digest, store.path(desc.digest))
                    advance(desc.size)
    store.put_bytes(image.config_bytes)
    store.put_bytes(image.manifest_bytes)
    return image


def write_image(
    client: RegistryClient,
    repository: str,
    image: Image,
    io: Io,
    *,
    mount_from: str | None = None,
    progress: Progress = NULL,
) -> None:
    """Blobs first (skipped when present; mounted from another repository of this registry that holds
    them, OCI distribution §Mounting a blob; else uploaded), then the manifest by digest with its exact
    bytes. No tag: the caller tags last, once everything the tag promises is there."""
    store, log = io.store, io.log
    store.put_bytes(image.config_bytes)  # a freshly assembled image's config may exist only as bytes
    sources = MountSources(client, repository, mount_from)
    done: dict[str, int] = {}
    for desc in [*image.layer_descriptors, image.config_descriptor]:
        source, how = None, "exists"
        if not client.has_blob(repository, desc.digest):
            source = sources.holding(desc.digest)
            with progress.transfer(f"push {desc.digest.short}", desc.size) as advance:
                opener = _opener(store.path(desc.digest), advance)
                how = client.push_blob(repository, desc.digest, desc.size, opener, mount_from=source)
        said = f"mounted from {source}" if how == "mounted" else how
        done[said] = done.get(said, 0) + 1
        log(f"blob {desc.digest.short}: {said}")
    log("blobs: " + ", ".join(f"{n} {how}" for how, n in sorted(done.items())))
    client.put_manifest(repository, str(image.digest), image.manifest_bytes, image.media_type)


class MountSources:
    """The other repositories of this registry a missing blob may be mounted from instead of uploaded
    (`docker push` does the same): the one named (`mount_from`), then the registry's own listing
    (`/v2/_catalog`, asked once and only when a blob is missing). A blob is mounted from the first that
    holds it (HEAD); a registry that refuses the mount answers with an upload session, and it uploads."""

    def __init__(self, client: RegistryClient, repository: str, named: str | None) -> None:
        self._client, self._repository, self._named = client, repository, named
        self._listed: list[str] | None = None

    def holding(self, digest: Digest) -> str | None:
        for candidate in self._candidates():
            if self._client.has_blob(candidate, digest):
                return candidate
        return None

    def _candidates(self) -> list[str]:
        if self._listed is None:
            listed = [
                r for r in self._client.repositories() if r != self._repository and is_valid_repository(r)
            ]
            self._listed = list(dict.fromkeys([*([self._named] if self._named else []), *listed]))
        return self._listed


def _opener(path: Path, advance: Advance) -> Callable[[], BinaryIO]:
    def open_blob() -> BinaryIO:
        return CountingReader(path.open("rb"), advance)  # type: ignore[return-value]

    return open_blob


def push(
    image: Image,
    ref_text: str,
    io: Io,
    *,
    tag: str | None = None,
    mount_from: str | None = None,
    progress: Progress = NULL,
) -> str:
    """Blobs, the manifest by digest, the tag last (the ref's own tag wins over `tag`)."""
    ref = Reference.parse(ref_text)
    chosen = ref.tag or tag
    with RegistryClient(ref.registry) as client:
        write_image(client, ref.repository, image, io, mount_from=mount_from, progress=progress)
        if chosen:
            put_tag(client, ref.repository, chosen, image, io.log)
    return f"{ref.registry}/{ref.repository}" + (f":{chosen}" if chosen else "") + f"@{image.digest}"


TAG_SETTLE_LOOKS, TAG_SETTLE_WAIT = 10, 0.1


def put_tag(client: RegistryClient, repository: str, tag: str, image: Image, log: Log) -> None:
    """Point `tag` at the image (its manifest's exact bytes). A refused PUT is no failure when the tag
    names exactly this manifest anyway: a concurrent push of the same image tagged it first, and
    distribution refuses the second of two simultaneous writes of one tag (seen: 400 under load)."""
    try:
        client.put_manifest(repository, tag, image.manifest_bytes, image.media_type)
    except RegistryError:
        # The concurrent write that won may still be landing: look again for a moment before deciding.
        for _ in range(TAG_SETTLE_LOOKS):
            head = client.head_manifest(repository, tag)
            if head is not None and head[0] == image.digest:
                log(f"tag {tag}: already names {image.digest.short} (a concurrent push tagged it)")
                return
            if head is not None:
                raise
            time.sleep(TAG_SETTLE_WAIT)
        client.put_manifest(repository, tag, image.manifest_bytes, image.media_type)


def put_index(client: RegistryClient, ref: Reference, index: ImageIndex, tag: str | None) -> str:
    """The index's manifest by digest, then `tag`: its children are in `ref`'s repository already."""
    for reference in (str(index.digest), *([tag] if tag else [])):
        client.put_manifest(ref.repository, reference, index.index_bytes, index.media_type)
    where = f"{ref.registry}/{ref.repository}" + (f":{tag}" if tag else "")
    return f"{where}@{index.digest}"


class RegistryBackend:
    """`HOST[:PORT]/REPO[:TAG]` through servimg's own distribution client."""

    def read(self, target: Target, io: Io, how: ReadOptions) -> Image:
        return pull(target.location, io, how)

    def write(self, image: Image, target: Target, io: Io, options: WriteOptions) -> str:
        progress = options.get("progress", NULL)
        mount_from = options.get("mount_from")
        return push(
            image,
            target.location,
            io,
            tag=options.get("tag"),
            mount_from=mount_from,
            progress=progress,
        )

    def write_index(self, indexed: IndexedImages, target: Target, io: Io, options: WriteOptions) -> str:
        ref = target.registry_ref
        with RegistryClient(ref.registry) as client:
            for child in indexed.ordered:
                write_image(client, ref.repository, child, io, progress=options.get("progress", NULL))
            return put_index(client, ref, indexed.index, ref.tag or options.get("tag"))

    def check_reachable(self, target: Target) -> None:
        with RegistryClient(target.registry_ref.registry) as client:
            client.ping()

    @contextlib.contextmanager
    def referrers(self, target: Target) -> Iterator[Referrers]:
        ref = target.registry_ref
        with RegistryClient(ref.registry) as client:
            yield RegistryReferrers(client, ref.repository)


BACKEND = RegistryBackend()
