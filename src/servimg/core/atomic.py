"""One way to replace a file: a reader (or a crash) sees the old bytes or the new ones, never a part.

Locks, keys, receipts, pins and index files are all written here: a unique temp file in the same
directory (concurrent writers never share one), chmod, write, fsync, rename over the target, then fsync the
directory so that the rename itself survives a power loss.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from servimg.core.errors import HostError, host_error


@contextlib.contextmanager
def atomic_stream(path: Path, mode: int = 0o644, *, durable: bool = True) -> Iterator[BinaryIO]:
    """Replace `path` with what is written to the yielded stream, atomically (the parent must exist).

    `durable=False` skips the fsyncs, for a file that a crash may leave short without harm because every
    reader checks it anyway (a layer blob headed for the blob store, whose size is checked on each use)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            yield fh
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        sync_dir(path.parent)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Atomically replace `path` with `data` (file mode `mode`; the parent directory must exist)."""
    with atomic_stream(path, mode) as fh:
        fh.write(data)


def write_output(path: Path, data: bytes, mode: int = 0o644) -> None:
    """A file the user named (`--out FILE`), replaced atomically; a path of the wrong kind or a missing
    parent is refused before anything is written, and a failed write leaves the old file as it was."""
    if path.is_dir():
        raise HostError(f"{path} is a directory, where a file belongs", hint="name a file, not a directory")
    if not path.parent.is_dir():
        what = "is not a directory" if path.parent.exists() else "does not exist"
        raise HostError(
            f"{path}: its parent {path.parent} {what}", hint=f"mkdir -p {path.parent}, or name another file"
        )
    try:
        atomic_write(path, data, mode)
    except OSError as exc:
        raise host_error(exc, f"writing {path}") from None


def sync_dir(directory: Path) -> None:
    """fsync a directory (its entries: a rename into it); a file system that refuses is not an error."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
