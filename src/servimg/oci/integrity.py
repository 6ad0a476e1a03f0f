"""Bytes are proven where they are relied on (docs/design.md, "Decisions": bytes are proven, never trusted).

Three things servimg does with a blob it holds, each proving the bytes on the way:

- `copy_verified`: hand a blob to a destination (an OCI layout) as a file of its own: never a hard link,
  so no writer of the destination (a tool that writes in place, `open(p, "r+b")`; root ignores 0444)
  reaches the blob store or any other destination. A reflink (FICLONE: btrfs, XFS) is used where the file
  system has one, which shares no writable data either (copy-on-write); elsewhere (ext4) a copy. Either
  way the source is hashed on the way out, so a store blob whose bytes no longer match its name is never
  handed on: it is named, removed from the store, and the caller fails.
- `rehash`: the sha256 and size of a file, read once.
- `prove_layers`: every layer of an image in the store against its digest AND its diffID (`verify` and
  `check` rely on exactly these bytes: they are hashed now, not trusted because they were hashed once).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from servimg.core.digest import Digest
from servimg.core.errors import LayerError, StoreError
from servimg.oci.image import Image

if TYPE_CHECKING:
    from servimg.oci.store import BlobStore

FICLONE = 0x40049409  # linux/fs.h _IOW(0x94, 9, int)
BLOCK = 1 << 20
BLOB_MODE = 0o644  # what other OCI tools write (skopeo, umoci): read by all, written by the owner only
_NO_REFLINK = frozenset({errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS})


def rehash(path: Path) -> tuple[Digest, int]:
    """sha256 and size of the file at `path`, read once."""
    sha, size = hashlib.sha256(), 0
    with path.open("rb") as fh:
        while block := fh.read(BLOCK):
            sha.update(block)
            size += len(block)
    return Digest("sha256", sha.hexdigest()), size


def matches(path: Path, digest: Digest, size: int | None = None) -> bool:
    """Whether the file at `path` exists and hashes to `digest` (and has `size`, when given)."""
    try:
        if size is not None and path.stat().st_size != size:
            return False
        return rehash(path)[0] == digest
    except OSError:
        return False


def copy_verified(src: Path, dest: Path, digest: Digest) -> str:
    """Write the blob `src` (named `digest`) to the new file `dest` (mode 0644), sharing no writable inode
    with it; returns "reflink" or "copy". The source is hashed while it is read: when it does not hash to
    `digest`, `dest` is not written and StoreError names the blob. `dest` must not exist."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, BLOB_MODE)
    try:
        os.fchmod(fd, BLOB_MODE)  # O_CREAT's mode goes through the umask
        with src.open("rb") as source:
            how = _reflink(source.fileno(), fd, src, digest) or _copy(source, fd, src, digest)
    except BaseException:
        os.close(fd)
        dest.unlink(missing_ok=True)
        raise
    os.close(fd)
    return how


def link_verified(src: Path, dest: Path, digest: Digest) -> bool:
    """Hard-link the blob `src` at `dest` after hashing it; False where links are refused (another file
    system). Only for a layout that is the cache's own (`layout.write_layout(store_owned=True)`), never for
    a destination."""
    actual, _ = rehash(src)
    if actual != digest:
        raise corrupt_blob(src, digest, actual)
    try:
        os.link(src, dest)
    except OSError:
        return False
    return True


def _reflink(src_fd: int, dest_fd: int, src: Path, digest: Digest) -> str | None:
    """Clone the extents (copy-on-write) after hashing the source; None where the file system cannot."""
    try:
        fcntl.ioctl(dest_fd, FICLONE, src_fd)
    except OSError as exc:
        if exc.errno in _NO_REFLINK:
            return None
        raise
    actual, _ = rehash(src)
    if actual != digest:
        raise corrupt_blob(src, digest, actual)
    return "reflink"


def _copy(source: BinaryIO, dest_fd: int, src: Path, digest: Digest) -> str:
    """Copy in the kernel (copy_file_range: no trip through user space) while a second thread hashes
    the source from the page cache: the two overlap, so the copy costs about what the slower of them
    does (docs/benchmarks.md, "Integrity"). A file system without copy_file_range gets read/write."""
    hashed: list[Digest | BaseException] = []

    def hash_source() -> None:
        try:
            hashed.append(rehash(src)[0])
        except BaseException as exc:  # handed to the caller below
            hashed.append(exc)

    thread = threading.Thread(target=hash_source, name="servimg-hash", daemon=True)
    thread.start()
    try:
        _kernel_copy(source.fileno(), dest_fd, os.fstat(source.fileno()).st_size)
    finally:
        thread.join()
    actual = hashed[0]
    if isinstance(actual, BaseException):
        raise actual
    if actual != digest:
        raise corrupt_blob(src, digest, actual)
    return "copy"


def _kernel_copy(src_fd: int, dest_fd: int, size: int) -> None:
    left = size
    try:
        while left > 0:
            copied = os.copy_file_range(src_fd, dest_fd, left)
            if copied == 0:
                break  # the source is shorter than it was: the hash says what it is
            left -= copied
        return
    except OSError as exc:
        if exc.errno not in _NO_REFLINK or left != size:
            raise
    while block := os.read(src_fd, BLOCK):
        view = memoryview(block)
        while view:
            view = view[os.write(dest_fd, view) :]


def corrupt_blob(path: Path, digest: Digest, actual: Digest) -> StoreError:
    return StoreError(
        f"blob {digest} at {path} does not match its name: its bytes hash to {actual}",
        hint="the file was written in place or the disk corrupted it; run `servimg cache verify --repair` "
        "and read the image again from its source",
    )


def prove_layers(image: Image, store: BlobStore) -> None:
    """Every layer blob of `image` in `store` hashed against its digest, and against its diffID: an
    uncompressed layer IS its tar (digest = diffID); a compressed one's uncompressed copy is re-derived
    when missing (store.uncompressed verifies it) and re-hashed when present. Raises LayerError naming
    the layer (its index and digest)."""
    for index, layer in enumerate(image.layers):
        desc = layer.descriptor
        path = store.path(desc.digest)
        try:
            actual, size = rehash(path)
        except FileNotFoundError:
            raise LayerError(f"layer {index} ({desc.digest}) is not in the blob store") from None
        if actual != desc.digest or size != desc.size:
            store.evict(desc.digest)
            raise LayerError(
                f"layer {index} blob {desc.digest} does not match its digest "
                f"(its {size} bytes hash to {actual}; the manifest says {desc.size} bytes)",
                hint="the blob was altered at rest; read the image again from its source",
            )
        uncompressed = store.uncompressed(desc.digest, layer.diff_id)
        if uncompressed != path:
            derived, _ = rehash(uncompressed)
            if derived != layer.diff_id:
                with contextlib.suppress(OSError):
                    uncompressed.unlink()
                raise LayerError(
                    f"layer {index} ({desc.digest}): its uncompressed copy hashes to {derived}, "
                    f"the config says diffID {layer.diff_id}",
                    hint="the cached copy was altered at rest and is removed; run the command again",
                )
