"""A content-addressed blob store on disk (the cache every backend reads into and writes from).

Layout mirrors an OCI image layout's `blobs/sha256/<hex>`. Every write goes to a unique temp file in the
same directory and is renamed into place only after its digest verified, so a killed build leaves at
worst a stray `.tmp-*` file that the next run ignores, never a corrupt blob under a valid name. A blob
truncated under its valid name anyway (power loss before writeback) is caught by `has(digest, size)`,
removed and fetched again. Gzip layers are decompressed with a bound (layer.decompression_limit).

Every write into the store passes through one `Tap` (the identity unless one is given): the seam for
fault injection, so tests freeze a build inside a blob or diff write (then kill it) without patching.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, TypeAlias

from servimg.cache.layout import CacheLayout
from servimg.cache.location import default_cache_dir
from servimg.core.context import Context
from servimg.core.digest import Digest
from servimg.core.errors import LayerError, StoreError, host_error
from servimg.oci import integrity
from servimg.oci.layer import open_uncompressed

Tap = Callable[[Path, BinaryIO], BinaryIO]
"""Given the directory a write goes into (`<root>/blobs/sha256`, `<root>/diffs/sha256`, or `<root>/tmp`
for a layer the build writes) and the temp file's stream, the stream to write through instead; whatever
it passes on must reach the temp file."""


def no_tap(directory: Path, stream: BinaryIO) -> BinaryIO:
    return stream


@dataclass(frozen=True)
class BadBlob:
    """A file in the store whose bytes do not hash to its name."""

    kind: str  # "blobs" (as fetched or built) or "diffs" (a layer's uncompressed copy)
    name: Digest
    actual: Digest
    size: int


@dataclass(frozen=True)
class StoreAudit:
    """What `BlobStore.audit` found: how many files it hashed, which did not match, whether they went."""

    root: Path
    checked: int
    bad: tuple[BadBlob, ...]
    repaired: bool

    @property
    def ok(self) -> bool:
        return not self.bad or self.repaired


class BlobStore:
    def __init__(self, root: Path | None = None, *, tap: Tap = no_tap) -> None:
        self.root = root or default_cache_dir()
        self.layout = CacheLayout(self.root)  # where every section of the cache lies
        self.tap = tap
        (self.layout.blobs / "sha256").mkdir(parents=True, exist_ok=True)
        (self.layout.diffs / "sha256").mkdir(parents=True, exist_ok=True)

    def tapped(self, tap: Tap) -> BlobStore:
        """The same store (same root, same blobs) with every write passing through `tap`."""
        return BlobStore(self.root, tap=tap)

    def path(self, digest: Digest) -> Path:
        return self.layout.blobs / digest.algorithm / digest.hex

    def has(self, digest: Digest, size: int | None = None) -> bool:
        """Whether the blob is cached. With `size`, a cached file of another size (truncated by a crash
        or a full disk) is removed and reported missing, so the caller fetches it again (repair)."""
        path = self.path(digest)
        if size is None:
            return path.is_file()
        try:
            actual = path.stat().st_size
        except FileNotFoundError:
            return False
        if actual != size:
            path.unlink(missing_ok=True)
            return False
        return True

    def evict(self, digest: Digest) -> None:
        """Remove a blob (one whose bytes no longer match its name) and its uncompressed copies, so the
        next read fetches it again from its source."""
        self.path(digest).unlink(missing_ok=True)

    def audit(self, *, repair: bool = False) -> StoreAudit:
        """Re-hash every blob and uncompressed layer copy against its name (`servimg cache verify`);
        with `repair`, remove the ones that do not match (the next read fetches them again)."""
        checked, bad = 0, []
        for kind in ("blobs", "diffs"):
            for path in sorted((self.root / kind / "sha256").iterdir()):
                if path.name.startswith(".") or not path.is_file():
                    continue  # a temp file of a write in progress (or killed): not a blob yet
                checked += 1
                actual, size = integrity.rehash(path)
                if actual.hex != path.name:
                    bad.append(BadBlob(kind, Digest("sha256", path.name), actual, size))
                    if repair:
                        path.unlink(missing_ok=True)
        return StoreAudit(self.root, checked, tuple(bad), repair)

    def read(self, digest: Digest) -> bytes:
        try:
            data = self.path(digest).read_bytes()
        except FileNotFoundError as exc:
            raise StoreError(f"blob {digest} is not in the cache {self.root}") from exc
        digest.verify(data, f"cached blob {digest.short}")
        return data

    def put_bytes(self, data: bytes) -> Digest:
        digest = Digest.of_bytes(data)
        if not self.has(digest):
            with self._writer(self.path(digest).parent) as (fh, tmp):
                fh.write(data)
            os.replace(tmp, self.path(digest))
        return digest

    def put_stream(self, stream: IO[bytes], expected: Digest | None = None) -> tuple[Digest, int]:
        """Copy a stream in, hashing as it goes; refuse (and keep nothing) when it is not `expected`."""
        sha = hashlib.sha256()
        size = 0
        with self._writer(self.path(Digest("sha256", "0" * 64)).parent) as (fh, tmp):
            while block := stream.read(1 << 20):
                sha.update(block)
                size += len(block)
                fh.write(block)
        digest = Digest("sha256", sha.hexdigest())
        if expected is not None and digest != expected:
            tmp.unlink(missing_ok=True)
            raise _mismatch(expected, digest)
        if self.has(digest, size):
            # Same name, same size, same content: keep the file already there, so the hard links a base
            # layout shares with it stay one copy on disk (a replace would split them).
            tmp.unlink(missing_ok=True)
        else:
            os.replace(tmp, self.path(digest))
        return digest, size

    def put_file(
        self, src: Path, expected: Digest | None = None, *, link: bool = False
    ) -> tuple[Digest, int]:
        """Copy `src` in, or with `link` hard-link it (verified first) where it is on the store's
        filesystem: a multi-GB base layer that already sits in an immutable layout (the cache's own base,
        a Nix store path) then costs no second copy on disk and no write (the CI disk ran out)."""
        if link:
            linked = self._link_verified(src, expected)
            if linked is not None:
                return linked
        with src.open("rb") as fh:
            return self.put_stream(fh, expected)

    def _link_verified(self, src: Path, expected: Digest | None) -> tuple[Digest, int] | None:
        sha, size = hashlib.sha256(), 0
        with src.open("rb") as fh:
            while block := fh.read(1 << 20):
                sha.update(block)
                size += len(block)
        digest = Digest("sha256", sha.hexdigest())
        if expected is not None and digest != expected:
            raise _mismatch(expected, digest)
        if self.has(digest, size):
            return digest, size
        fd, name = tempfile.mkstemp(prefix=".link-", dir=self.path(digest).parent)
        os.close(fd)
        tmp = Path(name)
        try:
            tmp.unlink()
            os.link(src, tmp)
            os.replace(tmp, self.path(digest))
        except OSError:
            return None  # another filesystem, or links refused: the caller copies
        finally:
            tmp.unlink(missing_ok=True)
        return digest, size

    def adopt(self, src: Path, digest: Digest) -> None:
        """Move an already-verified file into the store under `digest` (atomic rename when `src` is on
        the same filesystem, so concurrent builds adopting the same blob never see a partial file)."""
        if self.has(digest):
            src.unlink(missing_ok=True)
            return
        try:
            os.replace(src, self.path(digest))
        except OSError:
            with self._writer(self.path(digest).parent) as (fh, tmp), src.open("rb") as source:
                shutil.copyfileobj(source, fh)
            os.replace(tmp, self.path(digest))
            src.unlink(missing_ok=True)

    def uncompressed(self, digest: Digest, diff_id: Digest) -> Path:
        """An uncompressed copy of a layer blob (random access for the layered reader), verified by diffID."""
        blob = self.path(digest)
        with blob.open("rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                # An uncompressed layer IS its tar: its diffID must be its digest.
                if digest != diff_id:
                    raise LayerError(
                        f"layer {digest.short} is an uncompressed tar, so its diffID must be {digest}, "
                        f"but the image config says {diff_id}",
                        hint="the layer does not match the image config; the image is corrupt or tampered",
                    )
                return blob
        target = self.layout.diffs / diff_id.algorithm / diff_id.hex
        if target.is_file():
            return target
        sha = hashlib.sha256()
        with open_uncompressed(blob) as src, self._writer(target.parent) as (fh, tmp):
            while block := src.read(1 << 20):
                sha.update(block)
                fh.write(block)
        if sha.hexdigest() != diff_id.hex:
            tmp.unlink(missing_ok=True)
            raise LayerError(
                f"layer {digest.short}: uncompressed content is sha256:{sha.hexdigest()}, "
                f"but the image config says diffID {diff_id}",
                hint="the layer does not match the image config; the image is corrupt or tampered",
            )
        os.replace(tmp, target)
        return target

    @contextmanager
    def _writer(self, directory: Path) -> Iterator[tuple[BinaryIO, Path]]:
        """A temp file in `directory`, removed on any failure; the caller renames it. Not `atomic_write`:
        a blob's name is its digest, known (and checked) only once every byte is written, and a blob is
        not fsynced (a short one is caught by `has(digest, size)` and fetched again)."""
        try:
            fd, name = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        except OSError as exc:
            raise host_error(exc, "writing the cache", where=self.root) from None
        tmp = Path(name)
        try:
            with os.fdopen(fd, "wb") as fh:
                yield self.tap(directory, fh), tmp
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the cache filled, not the source we read
                raise host_error(exc, "writing the cache", where=self.root) from None
            raise
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def _mismatch(expected: Digest, got: Digest) -> StoreError:
    return StoreError(
        f"blob digest mismatch: expected {expected}, got {got}",
        hint="the source altered the content; fetch it again from a trusted source",
    )


# What the rooms below `assembly/` (the proof, the seams' protocols, the backends) take: the command's one
# Context (`core.context`) with its blob store, whatever its seams. The build's Context is one.
Io: TypeAlias = Context[BlobStore, object]
