"""Where images come from and go to: the table from a reference's kind to its backend.

`docker-daemon:` (engine), `oci:` (layout), `docker-archive:` (archive) or a registry ref; each backend
(`backends.target.Backend`) does its own I/O. `fetch`, `publish` and `check_reachable` only look the
backend up, so every command that reads or writes an image (build, verify, push, check, attach) reaches
a place of one kind the same way.
"""

from __future__ import annotations

from typing import Unpack

from servimg.backends import archive, engine, layout, registry
from servimg.backends.target import Backend, Target, WriteOptions
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.core.progress import NULL, Log, Progress
from servimg.oci.image import Image
from servimg.oci.store import BlobStore

__all__ = ["BACKENDS", "Target", "backend", "check_reachable", "fetch", "is_engine_ref", "kind_of", "publish"]

BACKENDS: dict[str, Backend] = {
    "engine": engine.BACKEND,
    "oci": layout.BACKEND,
    "archive": archive.BACKEND,
    "registry": registry.BACKEND,
}


def backend(target: Target) -> Backend:
    return BACKENDS[target.kind]


def is_engine_ref(ref: str) -> bool:
    """`docker-daemon:X`, an image ID, or a plain `name[:tag]` without a registry host."""
    if ref.startswith("docker-daemon:") or ref.startswith("sha256:"):
        return True
    if ref.startswith(("oci:", "docker-archive:")):
        return False
    first = ref.split("/", 1)[0]
    return "/" not in ref or not ("." in first or ":" in first or first == "localhost")


def kind_of(ref: str) -> str:
    """The kind of backend `ref` names: a plain `name[:tag]` or an image ID is the engine's."""
    return "engine" if is_engine_ref(ref) else Target.parse(ref).kind


def fetch(
    ref: str, store: BlobStore, log: Log, expected: Digest | None = None, progress: Progress = NULL
) -> Image:
    """Fetch an image (manifest, config, all layer blobs) into `store` from wherever `ref` points."""
    target = Target.parse(ref)
    return backend(target).read(target, store, log, expected=expected, progress=progress)


def publish(image: Image, target: Target, store: BlobStore, log: Log, **options: Unpack[WriteOptions]) -> str:
    """Write `image` to `target` (its name last); returns a human description of where it went."""
    return backend(target).write(image, target, store, log, options)


def check_reachable(target: Target) -> None:
    """Fail before any work when the sink cannot possibly accept the image."""
    try:
        backend(target).check_reachable(target)
    except ServimgError as exc:
        raise exc.context(f"target {target.kind} {target.location}".rstrip()) from None
