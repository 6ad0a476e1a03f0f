"""A running command's hold on its cache, so that a prune never removes what it reads or writes.

Every command that uses a cache holds `<cache>/lock` shared (flock) from start to end, and names itself
in `<cache>/holds/<pid>-<nonce>` (a file it keeps flocked: a process that died leaves a file nobody
holds, which `holders` removes). `servimg cache prune` takes the lock exclusively: it waits for, or
refuses with the names of, the running commands, and a command that starts meanwhile waits for the
prune to end. flock locks belong to an open file and end with the process, so a crash never leaves
the cache held. Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from servimg.cache.layout import CacheLayout
from servimg.core.errors import ServimgError


@dataclass(frozen=True)
class Holder:
    """A running command that holds the cache."""

    pid: int
    command: str


class CacheBusy(ServimgError):
    """Running commands hold the cache."""


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


@contextlib.contextmanager
def held(root: Path) -> Iterator[None]:
    """Hold the cache at `root` shared while the block runs (waiting while a prune runs). A cache that
    cannot be locked (read-only, not ours) is used unheld: holding is for pruning, never a condition."""
    layout = CacheLayout(root)
    try:
        layout.holds.mkdir(parents=True, exist_ok=True)
        lock = _open(layout.lock)
    except OSError:
        yield
        return
    mine = layout.holds / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"  # one per command, even in one process
    name = -1
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        with contextlib.suppress(OSError):
            name = _open(mine)
            fcntl.flock(name, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(name, 0)
            os.write(name, " ".join(["servimg", *sys.argv[1:]]).encode()[:4096])
        yield
    finally:
        if name >= 0:
            with contextlib.suppress(OSError):
                mine.unlink()
            os.close(name)
        os.close(lock)


def holders(root: Path) -> list[Holder]:
    """The running commands holding the cache at `root` (sorted by pid); a stale name is removed."""
    found = []
    directory = CacheLayout(root).holds
    for path in sorted(directory.iterdir()) if directory.is_dir() else ():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = path.name.partition("-")[0]
            found.append(Holder(int(pid) if pid.isdigit() else -1, _text(fd)))
        else:  # nobody holds it: its process ended without removing it
            with contextlib.suppress(OSError):
                path.unlink()
        finally:
            os.close(fd)
    return sorted(found, key=lambda h: h.pid)


def _text(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode("utf-8", "replace")
    except OSError:
        return "?"


@contextlib.contextmanager
def exclusive(root: Path, *, wait: float = 0.0) -> Iterator[None]:
    """Hold the cache at `root` alone while the block runs: no command runs meanwhile (those starting
    wait). CacheBusy, naming the holders, when others still hold it after `wait` seconds."""
    layout = CacheLayout(root)
    layout.root.mkdir(parents=True, exist_ok=True)
    lock = _open(layout.lock)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise _busy(root, wait) from None
                time.sleep(0.2)
        yield
    finally:
        os.close(lock)


def _busy(root: Path, wait: float) -> CacheBusy:
    running = holders(root)
    waited = f" after waiting {wait:g}s" if wait else ""
    return CacheBusy(
        f"{len(running) or 'some'} running servimg command(s) hold the cache {root}{waited}",
        problems=[f"pid {h.pid}: {h.command}" for h in running],
        hint="prune when they end, or wait for them: `servimg cache prune --wait SECONDS`",
    )
