"""The local Docker Engine as a base source (`docker save`) and a sink (thin `docker load`), via the SDK.

The tag is applied only after the engine reports the complete image under the expected ID (= config
digest), so a failed or interrupted load never moves a tag.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servimg.backends.archive import read_archive, write_archive
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, ServimgError
from servimg.oci.image import Image
from servimg.oci.store import BlobStore


def client() -> Any:
    """A docker SDK client from the environment (DOCKER_HOST …), or a clear error."""
    try:
        import docker

        c = docker.from_env(timeout=600)
        c.ping()
        return c
    except Exception as exc:  # the SDK raises several unrelated types for "no engine"
        raise BackendError(
            f"cannot reach the Docker Engine: {exc}",
            hint="start dockerd (e.g. `dockerd &`) or choose another sink with --to oci:DIR",
        ) from exc


def engine_available() -> bool:
    try:
        client()
    except BackendError:
        return False
    return True


class _ChunkStream(io.RawIOBase):
    """Adapt the SDK's chunk generator to a readable stream for tarfile's streaming mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def read_engine(ref: str, store: BlobStore) -> Image:
    """`docker save` the image and read it like a docker-archive (manifest re-created canonically)."""
    c = client()
    try:
        engine_image = c.images.get(ref)
    except Exception as exc:
        raise BackendError(
            f"the Docker Engine has no image {ref!r}: {exc}",
            hint="build or pull the base first (demo: `servimg base demo`)",
        ) from exc
    config_digest = Digest.parse(engine_image.id)
    cached = _cached(config_digest, store)
    if cached is not None:
        return cached
    stream = io.BufferedReader(_ChunkStream(iter(engine_image.save(named=False))), buffer_size=1 << 20)
    image = read_archive(stream, store)
    _remember(image, store)
    return image


def _index_path(config_digest: Digest, store: BlobStore) -> Path:
    return store.root / "engine" / config_digest.hex


def _cached(config_digest: Digest, store: BlobStore) -> Image | None:
    """An engine image already read once: same image ID (= config digest) means the same content, so
    skip the multi-GB `docker save` when every blob is still in the store."""
    try:
        manifest_digest = Digest.parse(_index_path(config_digest, store).read_text().strip())
        image = Image.parse(store.read(manifest_digest), store.read(config_digest))
    except (OSError, ServimgError):
        return None
    # With sizes: a blob truncated under its name is dropped, and the base is read from the engine again.
    if all(store.has(d.digest, d.size) for d in image.layer_descriptors):
        return image
    return None


def _remember(image: Image, store: BlobStore) -> None:
    path = _index_path(image.config_digest, store)
    path.parent.mkdir(exist_ok=True)
    # A unique temp name: two builds reading the same base concurrently must not share one.
    atomic_write(path, str(image.digest).encode(), 0o644)


def image_id(ref: str) -> Digest | None:
    try:
        return Digest.parse(client().images.get(ref).id)
    except BackendError:
        raise
    except Exception:
        return None


def has_image(config_digest: Digest) -> bool:
    return image_id(str(config_digest)) == config_digest


def load(image: Image, store: BlobStore, *, tag: str | None, base_config: Digest | None = None) -> str:
    """Load `image` into the engine; thin (only layers the engine lacks) when it holds the base.

    Returns "present" (nothing sent), "thin" or "full". Tags only after verifying that the engine holds
    the image under the expected ID (= config digest).
    """
    c = client()
    if has_image(image.config_digest):
        _tag(c, image, tag)
        return "present"
    thin = base_config is not None and has_image(base_config)
    skip: frozenset[Digest] = frozenset()
    if thin:
        base = c.images.get(str(base_config))
        skip = frozenset(Digest.parse(d) for d in base.attrs["RootFS"]["Layers"])
    with tempfile.TemporaryFile(dir=store.root / "tmp") as fh:
        write_archive(image, fh, store, skip_layers=skip)
        fh.seek(0)
        try:
            c.api.load_image(fh, quiet=True)
        except Exception as exc:
            raise BackendError(
                f"docker load failed: {exc}", hint="see the dockerd log; no tag was moved"
            ) from exc
    loaded = image_id(str(image.config_digest))
    if loaded != image.config_digest:
        raise BackendError(
            f"docker load did not produce image {image.config_digest}",
            hint="the engine rejected the image; no tag was moved",
        )
    _tag(c, image, tag)
    return "thin" if thin else "full"


def _tag(c: Any, image: Image, tag: str | None) -> None:
    if tag:
        repo, _, name = tag.rpartition(":") if ":" in tag.rpartition("/")[2] else (tag, "", "latest")
        if not c.api.tag(str(image.config_digest), repo, name, force=True):
            raise BackendError(f"could not tag {image.config_digest} as {tag}")


def remove(config_digest: Digest) -> None:
    """Remove an untagged image servimg loaded (used when the loaded image failed verification)."""
    # Best effort: it may be in use or already gone; nothing was tagged either way.
    with contextlib.suppress(Exception):
        client().images.remove(str(config_digest), force=False, noprune=False)
