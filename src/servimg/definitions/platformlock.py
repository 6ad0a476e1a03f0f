"""The lock of a multi-platform definition: one complete lock per platform, under one digest.

Each platform is resolved as a single-platform definition (`ImageDefinition.for_platform`): its base
(manifest, config, diffIDs, and the index it was picked from), its interpreter, its packages' RECORDs and
its overlays' files are that platform's own, because two architectures' wheels differ. The file pins them
all (`platforms`, keyed by `os/arch`) with the whole definition's sha256, canonical JSON like every lock;
its digest names the image index (the `{lock12}` of the index tag), each child image carries its own
platform's lock. `servimg build` re-resolves every platform and refuses a drift with its platform named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from servimg import __version__
from servimg.core import canonical, fields
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest
from servimg.core.errors import LockError, ServimgError
from servimg.core.platform import Platform
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import (
    LOCK_VERSION,
    Lock,
    PackageLock,
    check_drift,
    lock_path_for,
    read_lock_json,
)

_UNKNOWN = "unknown key (locks are written by `servimg lock`, never by hand)"


@dataclass(frozen=True)
class PlatformLocks(canonical.Canonical):
    name: str
    definition_sha256: str
    platforms: Mapping[str, Lock]  # `os/arch` → that platform's lock
    tool: Mapping[str, str] = field(default_factory=lambda: {"name": "servimg", "version": __version__})
    lock_version: int = LOCK_VERSION

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "definition_sha256": self.definition_sha256,
            "platforms": {p: self.platforms[p].to_json() for p in sorted(self.platforms)},
            "tool": dict(self.tool),
            "lock_version": self.lock_version,
        }

    def of(self, platform: Platform) -> Lock:
        """One platform's lock, or LockError naming the platforms this lock has."""
        found = self.platforms.get(str(platform))
        if found is None:
            raise LockError(
                f"the lock has no {platform} part (it pins {', '.join(sorted(self.platforms))})",
                hint="run `servimg lock` after changing base.platforms",
            )
        return found

    @property
    def packages(self) -> tuple[PackageLock, ...]:
        """The packages the tag template reads (`{vllm}`): every platform pins the same versions."""
        return self.platforms[min(self.platforms)].packages

    @classmethod
    def from_json(cls, data: object, origin: str = "<lock>") -> PlatformLocks:
        return fields.read_all(
            _platform_locks,
            data,
            lambda problems: LockError(
                f"{origin}: malformed multi-platform lock ({len(problems)} problem(s))",
                problems=problems,
                hint="do not edit locks by hand; regenerate with `servimg lock`",
            ),
        )

    def pretty_bytes(self) -> bytes:
        return canonical.dumps_pretty(self.to_json())

    def write(self, path: Path) -> None:
        """Atomically replace `path` (a failed write never leaves a truncated lock)."""
        atomic_write(path, self.pretty_bytes(), 0o644)


def _platform_key(value: object, path: str, problems: list[str]) -> str:
    text = fields.text()(value, path, problems)
    try:
        Platform.parse(text)
    except ServimgError as exc:  # not a platform servimg builds
        raise fields.Invalid(exc.message) from None
    return text


def _lock(value: object, path: str, problems: list[str]) -> Lock:
    try:
        return Lock.from_json(value, path)
    except LockError as exc:
        problems.extend(exc.problems)
        raise fields.Invalid() from None


_platform_locks = fields.record(
    PlatformLocks,
    {
        "name": fields.text(),
        "definition_sha256": fields.text(),
        "platforms": fields.mapping(_platform_key, _lock),
        "tool": fields.mapping(fields.text(), fields.text()),
        "lock_version": fields.exact_integer,
    },
    unknown=_UNKNOWN,
)


def load_any(path: Path) -> Lock | PlatformLocks:
    """The lock file at `path`, read once: a multi-platform lock (its `platforms` key) or one platform's."""
    data = read_lock_json(path)
    if isinstance(data, dict) and "platforms" in data:
        return PlatformLocks.from_json(data, str(path))
    return Lock.from_json(data, str(path))


# What a lock file pins, by whether it is a multi-platform lock (the refusal names both shapes).
_SHAPE = {False: "one platform (base.platform)", True: "several platforms (base.platforms)"}


@dataclass(frozen=True)
class Locks:
    """A definition's lock in the one shape a build takes: N >= 1 platforms, each asked for its `Lock`
    (`part`). `written` is what the lock file holds: one platform's `Lock` exactly as it always was (so no
    lock's bytes or digest move), or the `PlatformLocks` over several. Only an index asks which: `index`
    is the lock an index is built from, None for one platform."""

    written: Lock | PlatformLocks

    @classmethod
    def made(cls, definition: ImageDefinition, parts: Mapping[Platform, Lock]) -> Locks:
        """The lock every platform's resolution makes, in the shape the definition asks for."""
        if not definition.multi_platform:
            (only,) = parts.values()
            return cls(only)
        by_platform = {str(p): lock for p, lock in parts.items()}
        return cls(PlatformLocks(definition.name, definition.digest.hex, by_platform))

    @classmethod
    def read(cls, definition: ImageDefinition, definition_path: Path) -> Locks:
        """The written lock, read once; refused when its shape is not the definition's (one platform or
        many) or it is of another lock version."""
        path = lock_path_for(definition_path)
        locks = cls(load_any(path))
        if (many := locks.index is not None) != definition.multi_platform:
            raise LockError(
                f"{path} locks {_SHAPE[many]}, {definition_path} builds {_SHAPE[not many]}",
                hint=f"run `servimg lock {definition_path}` to lock it as it is now",
            )
        if locks.written.lock_version != LOCK_VERSION:
            raise LockError(
                f"{path}: lock version {locks.written.lock_version} is not {LOCK_VERSION}",
                hint=f"run `servimg lock {definition_path}` to regenerate it",
            )
        return locks

    @property
    def index(self) -> PlatformLocks | None:
        return self.written if isinstance(self.written, PlatformLocks) else None

    def part(self, platform: Platform) -> Lock:
        """`platform`'s lock (a single-platform lock is its one platform's whole)."""
        return self.written.of(platform)

    @property
    def digest(self) -> Digest:
        return self.written.digest

    @property
    def definition_sha256(self) -> str:
        return self.written.definition_sha256

    @property
    def packages(self) -> tuple[PackageLock, ...]:
        return self.written.packages

    def check_drift(
        self,
        actual: Locks,
        definition_path: Path,
        definitions: tuple[Mapping[str, object] | None, Mapping[str, object]] | None = None,
    ) -> None:
        """Refuse inputs that moved since the lock was written (`definitions.lock.check_drift`)."""
        check_drift(self.written, actual.written, definition_path, definitions)
