"""What the cache holds, and pruning it: `servimg cache status|prune` and the SERVIMG_CACHE_MAX_SIZE cap.

Sizes are counted per inode (a base layout's blobs are hard links to blobs/: counted once), in apparent
bytes. An entry was last used at the later of its access and modification times (`_last_used` says
how for a directory); on a `relatime` mount a read moves the access time at most once a
day, which is the resolution least-recently-used pruning needs. A pruned directory is first renamed
into tmp/ (atomic), so no reader ever sees half an entry. Prune only under `cache.hold.exclusive`.
Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from servimg.cache.layout import SECTIONS, CacheLayout


@dataclass(frozen=True)
class Entry:
    section: str
    path: Path
    size: int  # bytes of inodes not already counted for an earlier entry
    used: float  # last use, seconds since the epoch
    inodes: frozenset[tuple[int, int, int]] = frozenset()  # (device, inode, bytes) of its files


@dataclass(frozen=True)
class SectionUsage:
    name: str
    what: str
    entries: int
    size: int


@dataclass(frozen=True)
class Usage:
    root: Path
    sections: tuple[SectionUsage, ...]

    @property
    def size(self) -> int:
        return sum(s.size for s in self.sections)

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.sections)


@dataclass(frozen=True)
class Pruned:
    before: int
    after: int
    removed: tuple[Entry, ...]

    @property
    def freed(self) -> int:
        return self.before - self.after


def _files(path: Path) -> Iterator[os.stat_result]:
    """lstat of `path` and, for a directory, of everything below it (symlinks not followed)."""
    top = path.lstat()
    yield top
    if not stat.S_ISDIR(top.st_mode):
        return
    for directory, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):
                yield os.lstat(os.path.join(directory, name))


def tree_size(path: Path) -> int:
    """Bytes of the regular files at and below `path`, each inode once (hard links counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for s in _files(path):
        if stat.S_ISREG(s.st_mode) and (s.st_dev, s.st_ino) not in seen:
            seen.add((s.st_dev, s.st_ino))
            total += s.st_size
    return total


def _last_used(path: Path) -> float:
    """When `path` was last used: a file's later of access and modification time; a directory's latest
    modification, or its direct files' access. A directory's own access time is not use: listing it
    (as `servimg cache status` does) moves it. Whatever uses a directory as a whole marks it (a warm root:
    servimg.proof.warmroot)."""
    top = path.lstat()
    if not stat.S_ISDIR(top.st_mode):
        return max(top.st_atime, top.st_mtime)
    times = [top.st_mtime]
    with contextlib.suppress(OSError), os.scandir(path) as children:
        for child in children:
            with contextlib.suppress(OSError):
                s = child.stat(follow_symlinks=False)
                times.append(max(s.st_atime, s.st_mtime) if stat.S_ISREG(s.st_mode) else s.st_mtime)
    return max(times)


def entries(root: Path) -> list[Entry]:
    """Every entry of every section (CacheLayout), its bytes counted once per inode across the cache."""
    seen: set[tuple[int, int]] = set()
    found = []
    for section in SECTIONS:
        for path in sorted(root.glob(section.entries)):
            size = 0
            inodes = set()
            try:
                for s in _files(path):
                    if not stat.S_ISREG(s.st_mode):
                        continue
                    inodes.add((s.st_dev, s.st_ino, s.st_size))
                    if (s.st_dev, s.st_ino) not in seen:
                        seen.add((s.st_dev, s.st_ino))
                        size += s.st_size
                found.append(Entry(section.name, path, size, _last_used(path), frozenset(inodes)))
            except OSError:  # removed meanwhile
                continue
    return found


def usage(root: Path, found: Iterable[Entry] | None = None) -> Usage:
    listed = list(entries(root) if found is None else found)
    return Usage(
        root,
        tuple(
            SectionUsage(
                s.name,
                s.what,
                sum(1 for e in listed if e.section == s.name),
                sum(e.size for e in listed if e.section == s.name),
            )
            for s in SECTIONS
        ),
    )


def _groups(found: list[Entry]) -> list[list[Entry]]:
    """Entries that share an inode (a base layout and the blobs/ names of its blobs), together: removing
    one of them frees nothing while another keeps the bytes, so they are used and removed as one."""
    parent = list(range(len(found)))

    def top(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[int, int, int], int] = {}
    for i, entry in enumerate(found):
        for inode in entry.inodes:
            j = first.setdefault(inode, i)
            parent[top(i)] = top(j)
    grouped: dict[int, list[Entry]] = {}
    for i, entry in enumerate(found):
        grouped.setdefault(top(i), []).append(entry)
    return list(grouped.values())


def plan(found: list[Entry], max_size: int) -> list[Entry]:
    """The entries to remove, least recently used first (hard-linked entries as one, at their latest
    use), until the rest fit in `max_size` bytes. Stale work in tmp/ goes first (no command runs while
    a prune does)."""
    total = sum(e.size for e in found)
    chosen: list[Entry] = []
    order = sorted(
        _groups(found),
        key=lambda g: (all(e.section != "tmp" for e in g), max(e.used for e in g), str(g[0].path)),
    )
    for group in order:
        if total <= max_size:
            break
        chosen += group
        total -= sum(e.size for e in group)
    return chosen


def prune(root: Path, max_size: int, *, dry_run: bool = False) -> Pruned:
    """Remove least recently used entries until the cache fits in `max_size` bytes (0: every entry).
    Call only while holding the cache exclusively (servimg.cache.hold.exclusive)."""
    found = entries(root)
    chosen = plan(found, max_size)
    going = {e.path for e in chosen}
    kept = {inode for e in found if e.path not in going for inode in e.inodes}  # what stays on disk
    if not dry_run:
        for entry in chosen:
            _remove(root, entry.path)
    return Pruned(sum(e.size for e in found), sum(inode[2] for inode in kept), tuple(chosen))


def _remove(root: Path, path: Path) -> None:
    """Unlink a file; rename a directory out of its section (atomic), then delete it."""
    if not stat.S_ISDIR(path.lstat().st_mode):
        path.unlink(missing_ok=True)
        return
    graveyard = CacheLayout(root).tmp / f".pruning-{uuid.uuid4().hex}"
    graveyard.parent.mkdir(parents=True, exist_ok=True)
    target = path
    with contextlib.suppress(OSError):
        path.rename(graveyard)
        target = graveyard
    _rmtree(target)


def _rmtree(path: Path) -> None:
    """shutil.rmtree that also removes what read-only directories hold (a warm root keeps the base's
    modes: a 0555 directory's children cannot be unlinked until it is writable)."""

    def writable_then_retry(function: object, failed: str, _exc: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)

    shutil.rmtree(path, onerror=writable_then_retry)
