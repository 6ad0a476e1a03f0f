"""Where images come from and go to: the table from a reference's kind to its backend.

`docker-daemon:` (engine), `oci:` (layout), `docker-archive:` (archive) or a registry ref; each backend
(`backends.target.Backend`) does its own I/O. `fetch`, `publish` and `check_reachable` only look the
backend up, so every command that reads or writes an image (build, verify, push, check, attach) reaches
a place of one kind the same way.

An IMAGE argument a user typed (verify, push, check, show, diff, ladder, attest, promote) goes through
`resolve` first (`backends.resolve`: engine name or short ID when the engine has it, else a registry),
which logs where it went. A definition's base ref and a `--to` sink are taken as written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Unpack

from servimg.backends import archive, engine, layout, registry
from servimg.backends import resolve as resolution
from servimg.backends.referrers import Referrers
from servimg.backends.registryclient import RegistryClient
from servimg.backends.resolve import Resolved
from servimg.backends.target import (
    Backend,
    EngineTarget,
    LayoutTarget,
    ReadOptions,
    RegistryTarget,
    Target,
    WriteOptions,
)
from servimg.core.context import NULL, Log, Progress
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, ServimgError
from servimg.core.platform import Platform
from servimg.oci.image import Image
from servimg.oci.index import ImageIndex, IndexedImages
from servimg.oci.store import Io

__all__ = [
    "BACKENDS",
    "Resolved",
    "Target",
    "backend",
    "check_reachable",
    "engine_name",
    "fetch",
    "fetch_argument",
    "is_explicit",
    "name_index",
    "publish",
    "read_index",
    "referrers",
    "resolve",
]

BACKENDS: dict[str, Backend] = {
    "engine": engine.BACKEND,
    "oci": layout.BACKEND,
    "archive": archive.BACKEND,
    "registry": registry.BACKEND,
}


def backend(target: Target) -> Backend:
    return BACKENDS[target.kind]


def resolve(text: str, log: Log) -> Resolved:
    """Where the IMAGE argument `text` points (`backends.resolve`), said in one log line unless it was
    written with its transport. The engine is asked only when the argument could name one of its images."""
    found = resolution.resolve(text, None if is_explicit(text) else engine.list_images())
    if not found.explicit:
        log(f"{text}: {found.why}")
    return found


def is_explicit(text: str) -> bool:
    """True when `text` names its transport (`docker-daemon:`, `oci:`, `docker-archive:`, `docker://`)."""
    return text.startswith((resolution.REGISTRY_PREFIX, "docker-daemon:", "oci:", "docker-archive:"))


def fetch_argument(text: str, io: Io, progress: Progress = NULL) -> Image:
    """`fetch` an IMAGE argument after resolving it."""
    found = resolve(text, io.log)
    with said_where(found):
        return fetch(found.ref, io, progress=progress)


@contextlib.contextmanager
def said_where(found: Resolved) -> Iterator[None]:
    """A failure reading an IMAGE argument that was not written with its transport says where it was
    looked for (a bare name the engine does not have is a Docker Hub reference), first."""
    try:
        yield
    except ServimgError as exc:
        if found.explicit:
            raise
        raise exc.context(found.why) from None


def engine_name(text: str, io: Io) -> str:
    """An engine name for the IMAGE argument `text` (commands that run containers): the engine's own
    image, or the image fetched from where it resolved and loaded (untagged) into the engine."""
    found = resolve(text, io.log)
    if isinstance(found.target, EngineTarget):
        return found.target.location
    with said_where(found):
        image = fetch(found.ref, io)
    if not engine.has_image(image.config_digest):
        io.log(f"loading {image.digest.short} into the Docker Engine (untagged) to run it")
        engine.load(image, io.store, tag=None)
    return str(image.config_digest)


def fetch(
    ref: str,
    io: Io,
    expected: Digest | None = None,
    progress: Progress = NULL,
    *,
    rehash: bool = False,
    platform: Platform | None = None,
) -> Image:
    """Fetch an image (manifest, config, all layer blobs) into the store from wherever `ref` points; with
    `rehash`, every blob is read from there and hashed even when the store holds it; `platform` picks
    the child of a multi-platform index."""
    target = Target.parse(ref)
    return backend(target).read(target, io, ReadOptions(expected, progress, rehash, platform))


def read_index(ref: str) -> ImageIndex | None:
    """The multi-platform index `ref` names (a registry tag or digest, an OCI layout's tag), or None when it
    names one image (the engine and a docker archive only ever hold single images)."""
    target = Target.parse(ref)
    if isinstance(target, RegistryTarget):
        return registry.read_index(target.location)
    if isinstance(target, LayoutTarget):
        return layout.read_index(Path(target.location), target.tag)
    return None


def platform_manifest(ref: str, pinned: Digest, platform: Platform) -> Digest:
    """The single-platform manifest a pinned digest stands for at `ref` (a registry or an OCI layout):
    itself, or the `platform` child when it names an index."""
    target = Target.parse(ref)
    if isinstance(target, RegistryTarget):
        return registry.platform_manifest(target.location, pinned, str(platform))
    found = layout.index_at(Path(target.location), pinned) if isinstance(target, LayoutTarget) else None
    return found.child(platform).digest if found is not None else pinned


def name_index(index: ImageIndex, target: Target, *, tag: str | None) -> str:
    """The index itself, its children already at `target` (a registry or an OCI layout): its manifest by
    digest, then `tag` (the target's own tag wins) last. A signed build calls it twice: untagged before
    the index's provenance is attached, tagged after."""
    if isinstance(target, RegistryTarget):
        ref = target.registry_ref
        with RegistryClient(ref.registry) as client:
            return registry.put_index(client, ref, index, ref.tag or tag)
    if isinstance(target, LayoutTarget):
        chosen = target.tag or tag
        layout.add_index(index, Path(target.location), tag=chosen)
        return f"oci:{target.location}" + (f":{chosen}" if chosen else "") + f"@{index.digest}"
    raise BackendError(
        f"{target.described} holds no image index",
        hint="write the index to a registry (HOST/REPO[:TAG]) or an OCI layout (oci:DIR[:TAG])",
    )


def publish(named: Image | IndexedImages, target: Target, io: Io, **options: Unpack[WriteOptions]) -> str:
    """Write what a tag names to `target`, its name last: one image, or an index's children and then the
    index (`Backend.write_index`; the engine and an archive take the one child `platform` names). Returns
    a human description of where it went."""
    if isinstance(named, IndexedImages):
        return backend(target).write_index(named, target, io, options)
    return backend(target).write(named, target, io, options)


def referrers(target: Target) -> AbstractContextManager[Referrers]:
    """The artifacts (attestations) beside the images at `target` (`Backend.referrers`): a registry
    repository or an OCI layout; ReferrersError for a place that cannot hold any."""
    return backend(target).referrers(target)


def check_reachable(target: Target) -> None:
    """Fail before any work when the sink cannot possibly accept the image."""
    try:
        backend(target).check_reachable(target)
    except ServimgError as exc:
        raise exc.context(f"target {target.kind} {target.location}".rstrip()) from None
