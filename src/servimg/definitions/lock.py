"""The lock (`images/<name>.lock.json`): every resolved input pinned, canonical JSON.

`servimg lock` writes it; `servimg build` re-resolves the same facts and refuses any drift, naming the
drifted field. The default tag is derived from the lock digest, so a tag names exactly one set of inputs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from servimg import __version__
from servimg.core import canonical, fields
from servimg.core import jsonview as jv
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest
from servimg.core.errors import LockError
from servimg.core.fields import Reader
from servimg.core.platform import Platform

LOCK_VERSION = 1


@dataclass(frozen=True)
class BaseLock:
    ref: str
    manifest_digest: Digest
    config_digest: Digest
    diff_ids: tuple[Digest, ...]
    created: str
    index_digest: Digest | None = None  # the pinned multi-platform index, when the pin named one


@dataclass(frozen=True)
class InterpreterLock:
    path: str
    resolved: str
    version: str
    magic: str
    cache_tag: str
    opt_levels: tuple[int, ...]
    pycache_prefix: str | None


@dataclass(frozen=True)
class PackageLock:
    import_name: str
    distribution: str
    version: str
    site_packages: str
    dist_info: str
    record_sha256: str


@dataclass(frozen=True)
class FileLock:
    path: str
    pre_sha256: str | None
    post_sha256: str | None
    mode: int


@dataclass(frozen=True)
class OverlayLock:
    id: str
    package: str
    patch: str
    patch_sha256: str
    files: tuple[FileLock, ...]
    sentinels_absent_in_base: tuple[str, ...] = ()
    # The definition's `fixes:` (core.fixid), carried into the image's lock and the provenance; left out
    # when empty so that every existing lock keeps its bytes.
    fixes: tuple[str, ...] = field(default=(), metadata={"omit_default": True})


@dataclass(frozen=True)
class LadderLock:
    """The smoke ladder the image carries (definition `ladder:`): its YAML and its probe set, both
    by repository path and sha256, and the directory the image holds them in."""

    path: str
    sha256: str
    probes_path: str
    probes_sha256: str
    image_dir: str = "/opt/servimg/ladder"


@dataclass(frozen=True)
class Lock(canonical.Canonical):
    name: str
    definition_sha256: str
    base: BaseLock
    interpreter: InterpreterLock
    packages: tuple[PackageLock, ...]
    overlays: tuple[OverlayLock, ...]
    source_date_epoch: int
    tool: Mapping[str, str] = field(default_factory=lambda: {"name": "servimg", "version": __version__})
    lock_version: int = LOCK_VERSION
    # The bundled ladder. Left out of the JSON when absent, so locks of definitions without a
    # `ladder:` (images/demo.lock.json) keep their exact bytes and digest.
    ladder: LadderLock | None = None

    def to_json(self) -> dict[str, object]:
        data = dict(jv.obj(canonical.plain(self)))  # tuples → lists, digests as text: plain JSON only
        if data.get("ladder") is None:
            data.pop("ladder", None)
        return data

    @property
    def changed_files(self) -> tuple[str, ...]:
        """The files the overlays changed (patched, added or deleted), each once: the one count of
        "changed files" every command prints (the layer holds more: their bytecode, servimg's files)."""
        return tuple(sorted({f.path for o in self.overlays for f in o.files}))

    def of(self, platform: Platform) -> Lock:
        """One platform's part: a single-platform lock is its definition's one platform whole (the plan
        refuses a lock whose shape is not its definition's), as `PlatformLocks.of` answers for several."""
        return self

    def package(self, import_name: str) -> PackageLock:
        for pkg in self.packages:
            if pkg.import_name == import_name:
                return pkg
        raise LockError(f"package {import_name!r} is not in the lock", hint="run `servimg lock`")

    @classmethod
    def from_json(cls, data: object, origin: str = "<lock>") -> Lock:
        """Validate strictly: every problem collected, unknown keys refused, no value coerced (a lock is
        machine-written, so anything else means tampering or a newer tool)."""
        return fields.read_all(
            _lock,
            data,
            lambda problems: LockError(
                f"{origin}: malformed lock ({len(problems)} problem(s))",
                problems=problems,
                hint="do not edit locks by hand; regenerate with `servimg lock`",
            ),
        )

    @classmethod
    def load(cls, path: Path) -> Lock:
        lock = cls.from_json(read_lock_json(path), str(path))
        if lock.lock_version != LOCK_VERSION:
            raise LockError(
                f"{path}: lock version {lock.lock_version} is not {LOCK_VERSION}",
                hint="regenerate with `servimg lock`",
            )
        return lock

    def pretty_bytes(self) -> bytes:
        """The lock file's bytes (canonical JSON, indented)."""
        return canonical.dumps_pretty(self.to_json())

    def write(self, path: Path) -> None:
        """Atomically replace `path` (a failed write never leaves a truncated lock)."""
        atomic_write(path, self.pretty_bytes(), 0o644)


# -- reading ------------------------------------------------------------------------------------------
_UNKNOWN = "unknown key (locks are written by `servimg lock`, never by hand)"
_string = fields.text()
_optional_string = fields.optional(_string)


def _strings(*names: str) -> dict[str, Reader[Any]]:
    return dict.fromkeys(names, _string)


_base = fields.record(
    BaseLock,
    {
        **_strings("ref", "created"),
        "manifest_digest": fields.digest,
        "config_digest": fields.digest,
        "diff_ids": fields.items(fields.digest),
        "index_digest": fields.optional(fields.digest),
    },
    unknown=_UNKNOWN,
)
_interpreter = fields.record(
    InterpreterLock,
    {
        **_strings("path", "resolved", "version", "magic", "cache_tag"),
        "opt_levels": fields.items(fields.exact_integer),
        "pycache_prefix": _optional_string,
    },
    unknown=_UNKNOWN,
)
_package = fields.record(
    PackageLock,
    _strings("import_name", "distribution", "version", "site_packages", "dist_info", "record_sha256"),
    unknown=_UNKNOWN,
)
_file = fields.record(
    FileLock,
    {
        "path": _string,
        "pre_sha256": _optional_string,
        "post_sha256": _optional_string,
        "mode": fields.exact_integer,
    },
    unknown=_UNKNOWN,
)
_overlay = fields.record(
    OverlayLock,
    {
        **_strings("id", "package", "patch", "patch_sha256"),
        "files": fields.items(_file),
        "sentinels_absent_in_base": fields.items(_string),
        "fixes": fields.items(_string),
    },
    unknown=_UNKNOWN,
)
_ladder = fields.record(
    LadderLock, _strings("path", "sha256", "probes_path", "probes_sha256", "image_dir"), unknown=_UNKNOWN
)
_lock = fields.record(
    Lock,
    {
        **_strings("name", "definition_sha256"),
        "base": _base,
        "interpreter": _interpreter,
        "packages": fields.items(_package),
        "overlays": fields.items(_overlay),
        "source_date_epoch": fields.exact_integer,
        "tool": fields.mapping(_string, _string),
        "lock_version": fields.exact_integer,
        "ladder": fields.optional(_ladder),
    },
    unknown=_UNKNOWN,
)


def read_lock_json(path: Path) -> object:
    """A lock file's JSON (one platform's `Lock`, or `definitions.platformlock.PlatformLocks`), or LockError
    saying what to run."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise LockError(
            f"no lock at {path}", hint=f"run `servimg lock {lock_to_definition(path)}` first"
        ) from None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise LockError(f"{path}: not valid JSON: {exc}", hint="regenerate with `servimg lock`") from None


def lock_path_for(definition: Path) -> Path:
    return definition.with_name(definition.name.removesuffix(".yaml").removesuffix(".yml") + ".lock.json")


def lock_to_definition(lock: Path) -> Path:
    return lock.with_name(lock.name.removesuffix(".lock.json") + ".yaml")


def drift(
    locked: object, actual: object, path: str = "", names: tuple[str, str] = ("locked", "now")
) -> list[str]:
    """Every field where JSON value `actual` differs from `locked`, as `path: locked A, now B` lines
    (`names` words the two sides: `check --lock` compares a lock file with an image's lock)."""
    if isinstance(locked, dict) and isinstance(actual, dict):
        out: list[str] = []
        for key in sorted(set(locked) | set(actual)):
            out += drift(locked.get(key), actual.get(key), f"{path}.{key}" if path else str(key), names)
        return out
    if isinstance(locked, list) and isinstance(actual, list) and len(locked) == len(actual):
        return [
            line
            for i, (a, b) in enumerate(zip(locked, actual, strict=True))
            for line in drift(a, b, f"{path}[{i}]", names)
        ]
    if locked != actual:
        return [f"{path}: {names[0]} {_short(locked)}, {names[1]} {_short(actual)}"]
    return []


def definition_fields(
    problems: list[str],
    definitions: tuple[Mapping[str, object] | None, Mapping[str, object]] | None,
    definition_path: Path,
) -> list[str]:
    """`definition_sha256` moved: the definition's fields that moved (from the definition as locked,
    remembered in the cache by its sha256), or, without it, where to look."""
    moved = [p for p in problems if p.split(":")[0].endswith("definition_sha256")]
    if not moved or definitions is None:
        return problems
    rest = [p for p in problems if p not in moved]
    before, now = definitions
    if before is None:
        note = (
            f"{moved[0]} (the definition as locked is not in this cache: `git diff {definition_path}` "
            "shows what moved)"
        )
        return [note, *rest]
    return [*(f"definition.{line}" for line in drift(dict(before), dict(now))), *rest]


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 100 else text[:97] + "..."


def check_drift(
    locked: LockFile,
    actual: LockFile,
    definition_path: Path,
    definitions: tuple[Mapping[str, object] | None, Mapping[str, object]] | None = None,
) -> None:
    """Refuse a lock that no longer matches its inputs, naming every field that moved: the one drift
    check of both shapes (one platform's `Lock`; `PlatformLocks`, whose fields each name their platform).
    `definitions` (the definition as locked, when remembered, and as it is now) names the definition's
    own fields instead of its sha256."""
    problems = [p for p in drift(locked.to_json(), actual.to_json()) if not _written_by(p)]
    problems = definition_fields(problems, definitions, definition_path)
    if problems:
        moved = sorted({p.split(".")[1] for p in problems if p.startswith("platforms.")})
        raise LockError(
            f"inputs drifted from the lock ({len(problems)} field(s)"
            + (f"; platform(s) {', '.join(moved)}" if moved else "")
            + ")",
            problems=[p.removeprefix("platforms.") for p in problems],
            hint=f"if the change is intended, run `servimg lock {definition_path}` and review the diff",
        )


class LockFile(Protocol):
    """What a lock file holds, either shape: its canonical JSON."""

    def to_json(self) -> dict[str, object]: ...


def _written_by(problem: str) -> bool:
    """The tool that wrote a lock is no input: `tool.`, or a platform's `platforms.<os/arch>.tool.`."""
    return problem.startswith("tool.") or (
        problem.startswith("platforms.") and problem.split(".", 2)[-1].startswith("tool.")
    )
