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
from servimg.core.errors import LockError, ServimgError
from servimg.core.platform import Platform
from servimg.definitions.lock import (
    LOCK_VERSION,
    Lock,
    PackageLock,
    lock_to_definition,
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

    @classmethod
    def load(cls, path: Path) -> PlatformLocks:
        found = load_any(path)
        if not isinstance(found, PlatformLocks):
            raise LockError(
                f"{path} is a single-platform lock, but the definition lists base.platforms",
                hint=f"run `servimg lock {lock_to_definition(path)}`",
            )
        return found

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
