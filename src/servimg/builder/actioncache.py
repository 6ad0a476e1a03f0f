"""The action cache: `servimg build` run again exactly as before, into a destination that still holds
its result, answers from the record of the first run without importing the pipeline (a warm rebuild
costs the CLI's start and a few file reads, not the ≈0.5 s import of what a build needs).

Standard library and servimg.core only (plus the engine's plain socket question), so that the session
can ask it before loading anything else. An entry lives in `<cache>/results/action/v1/sha256/<key>.json`
(servimg.builder.resultstore: self-checking, written atomically).

The key (`Action.key`) is everything that can steer a build and is known before it runs: the sha256 of
servimg's own code (every file of the package, probe and compile script included), the interpreter
(version, executable) and the installed distributions (the `*.dist-info` names in the site dirs: their
versions), the working directory, the uid, the definition's absolute path, `--to`, `--runner`, `--tag`,
the cache root, and the environment that can steer a build: SERVIMG_*, DOCKER_*, HOME, XDG_CACHE_HOME,
SOURCE_DATE_EPOCH, FAKETIME* (not PATH).

The value is what the first run depended on beyond that, each checked again on a lookup:
- every file it opened for reading (a `sys.addaudithook` on "open", `recording`), with its size and
  sha256: definition, lock, patches, ladder and probe set, an OCI layout base's index.json, the
  engine's client config…; every directory it listed ("os.listdir", "os.scandir"), with the sha256 of
  its sorted names. Not recorded: reads under the cache root (content-addressed, checked where read),
  under the destination (checked below), servimg's code and the interpreter's installation (in the
  key), /proc, /sys, /dev, and files gone when the build ends (its own temporaries);
- the base, when it is an engine image (`docker-daemon:NAME`): the image ID the name has now, asked of
  the engine's socket (a moved tag is another ID);
- the destination: an OCI layout must list the manifest under the tag (one entry), the manifest blob
  must hash to its digest and every blob it names must be there with its size; the engine must give the
  tag the image's ID;
- the fields of the OK line (and --json) as a rerun prints them.

A build is recorded only when it ran with the default seams, into an OCI layout or the engine, from a
base that is not a registry's (a registry base's tag would need the network to check), and only when
nothing it read changed while it ran (an mtime at or after its start) and no input is over 64 MiB (an
archive base: hashing it would cost more than the build it saves). SERVIMG_NO_RESULT_CACHE (and
resultstore.bypassed) makes every lookup miss. Anything that does not check out is a miss, and the
command runs; a miss never fails a build.

What the audit hook cannot see: a file the build only asked about (`Path.exists`, `os.stat`) without
opening or listing it, and an environment variable outside the ones above.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servimg.backends import holding
from servimg.backends.target import Target
from servimg.builder import resultstore
from servimg.core import jsonview as jv
from servimg.core.digest import Digest

ACTION = "action"
PACKAGE_DIR = Path(__file__).resolve().parent.parent
# A recorded input larger than this makes the build not recorded: hashing it on every lookup would cost
# about what the build saves (a docker-archive base).
MAX_INPUT_BYTES = 64 << 20
_ENV_PREFIXES = ("SERVIMG_", "DOCKER_", "FAKETIME")
_ENV_NAMES = ("HOME", "XDG_CACHE_HOME", "SOURCE_DATE_EPOCH")
_NEVER_RECORDED = ("/proc", "/sys", "/dev")


# -- the key ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Action:
    """One `servimg build` of one definition, as the command line asked for it."""

    definition: Path
    to: str | None
    runner: str
    tag: str | None

    def key(self, cache_root: Path) -> dict[str, object]:
        return {
            "code_sha256": running_code_sha256(),
            "python": [sys.version, sys.executable],
            "distributions": distributions(),
            "cwd": os.getcwd(),
            "uid": os.getuid(),
            "definition": os.path.abspath(self.definition),
            "to": self.to,
            "runner": self.runner,
            "tag": self.tag,
            "cache": os.path.abspath(cache_root),
            "env": steering_env(os.environ),
        }


def code_sha256(package: Path = PACKAGE_DIR) -> str:
    """sha256 over every file of the servimg package (relative path and content), bytecode caches aside."""
    total = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        total.update(f"{path.relative_to(package)}\0{_sha256(path)}\n".encode())
    return total.hexdigest()


@functools.cache
def running_code_sha256() -> str:
    """`code_sha256` of the package this process imported, once per process: every build's key has it
    (≈17 ms), and the code a process runs does not change under it. A resident server computes it before
    it forks workers (servimg.resident: its identity changes with any file of the package)."""
    return code_sha256(PACKAGE_DIR)


def distributions() -> list[str]:
    """The installed distributions with their versions: the `*.dist-info` names of every site dir."""
    found: set[str] = set()
    for entry in sys.path:
        if entry.endswith(("site-packages", "dist-packages")):
            with contextlib.suppress(OSError):
                found |= {n for n in os.listdir(entry) if n.endswith(".dist-info")}
    return sorted(found)


def steering_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES}


# -- what a build read -----------------------------------------------------------------------------
@dataclass
class Reads:
    """The paths one build opened for reading and the directories it listed (as given: maybe relative)."""

    started_ns: int = field(default_factory=time.time_ns)
    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)


_active: list[Reads] = []
_hooked: list[bool] = []


def _reading(mode: object, flags: object) -> bool:
    if isinstance(mode, str):  # open(): "r", "rb", …
        return not any(c in mode for c in "wax+")
    return isinstance(flags, int) and flags & os.O_ACCMODE == os.O_RDONLY and not flags & os.O_CREAT


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _active:
        return
    if event == "open" and len(args) >= 3 and not isinstance(args[0], int) and _reading(args[1], args[2]):
        _active[-1].files.add(os.fsdecode(args[0]))
    elif event in ("os.listdir", "os.scandir") and args and not isinstance(args[0], int):
        _active[-1].dirs.add(os.fsdecode(args[0]) if args[0] is not None else ".")


@contextlib.contextmanager
def recording() -> Iterator[Reads]:
    """Collect what the code inside opens for reading and lists (an audit hook: added once, per process;
    it does nothing outside a recording)."""
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked.append(True)
    reads = Reads()
    _active.append(reads)
    try:
        yield reads
    finally:
        _active.remove(reads)


def _sha256(path: Path) -> str:
    return Digest.of_file(str(path)).hex


def _listing_sha256(path: Path) -> str:
    return hashlib.sha256("\0".join(sorted(os.listdir(path))).encode("utf-8", "surrogateescape")).hexdigest()


def _not_recorded(cache_root: Path, destination: Path | None) -> tuple[str, ...]:
    roots = {
        os.path.abspath(cache_root),
        str(PACKAGE_DIR),
        os.path.dirname(os.__file__),  # the standard library
        *_NEVER_RECORDED,
        *(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))),
    }
    if sys.prefix != sys.base_prefix:  # a virtual environment: all of it is the installation
        roots.add(sys.prefix)
    if destination is not None:
        roots.add(os.path.abspath(destination))
    return tuple(sorted(roots))


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def inputs(
    reads: Reads, cache_root: Path, destination: Path | None, forced: Sequence[Path] = ()
) -> dict[str, object] | None:
    """What the build read, hashed: {"files": [[path, size, sha256]], "dirs": [[path, sha256]]}, with the
    `forced` files whether read or not; None when it cannot be recorded (an input changed while the build
    ran, one is over MAX_INPUT_BYTES, or a forced one is missing)."""
    skip = _not_recorded(cache_root, destination)
    modules = {os.path.abspath(f) for m in list(sys.modules.values()) if (f := getattr(m, "__file__", None))}
    must = {os.path.abspath(p) for p in forced}
    if not all(os.path.isfile(p) for p in must):
        return None
    files = []
    for raw in sorted({os.path.abspath(p) for p in reads.files} | must):
        path = Path(raw)
        if raw not in must and (
            _under(raw, skip) or raw in modules or "__pycache__" in path.parts or not path.is_file()
        ):
            continue  # not an input, covered by the key or the sink check, or the build's own temporary
        stat = path.stat()
        if stat.st_size > MAX_INPUT_BYTES or stat.st_mtime_ns >= reads.started_ns:
            return None
        files.append([raw, stat.st_size, _sha256(path)])
    dirs = [
        [raw, _listing_sha256(Path(raw))]
        for raw in sorted({os.path.abspath(p) for p in reads.dirs})
        if not _under(raw, skip) and os.path.isdir(raw)
    ]
    return {"files": files, "dirs": dirs}


# -- the destination and the base, as a rerun would find them ------------------------------------------
def sink(target: Target, digest: Digest, evidence: Mapping[str, object]) -> dict[str, object]:
    """Where the build put its image: the place with the name it was given (`target.text()`), the digest
    it names the image by there, and what its backend recorded to tell later that it still does
    (`Backend.evidence`)."""
    return {"target": target.text(), "digest": str(digest), "evidence": dict(evidence)}


def sink_holds(sink: Mapping[str, object]) -> bool:
    """Whether the place still holds the image (`backends.holding`: `Backend.holds`'s own code)."""
    target = Target.parse(jv.text(sink["target"], "sink.target"))
    digest = Digest.parse(jv.text(sink["digest"], "sink.digest"))
    return holding.holds(target, digest, jv.obj(sink["evidence"], "sink.evidence"))


def base_holds(base: Mapping[str, object] | None) -> bool:
    if base is None:  # a base read from a file (a layout's index.json is among the inputs)
        return True
    engine_image = Target.engine_image(jv.text(base["engine"], "base.engine"))
    return holding.holds(engine_image, Digest.parse(jv.text(base["id"], "base.id")), {})


# -- record and lookup -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Published:
    """What a finished build hands the action cache: the OK line's fields as a rerun would print them,
    the engine base (name, image ID) when the base is an engine image, and the destination (`sink`)."""

    fields: Mapping[str, object]
    sink: Mapping[str, object]
    destination: Path | None  # a layout's directory: its reads are the sink's, checked by `sink_holds`
    base_engine: tuple[str, str] | None = None
    # The files that name the base (a layout's index.json, an archive): inputs even under the cache root.
    base_files: tuple[Path, ...] = ()


def remember(cache_root: Path, action: Action, reads: Reads, published: Published) -> bool:
    """Record a build that succeeded; False when it cannot be (see `inputs`) or the entry is not written.
    Never raises: the build has published its image already, and a record it cannot keep costs only a
    rebuild next time."""
    try:
        read = inputs(reads, cache_root, published.destination, published.base_files)
        if read is None:
            return False
        base = None
        if published.base_engine is not None:
            base = {"engine": published.base_engine[0], "id": published.base_engine[1]}
        # The fields as JSON text: canonical JSON would sort their keys; the OK line keeps their order.
        fields = json.dumps(published.fields)
        value = {**read, "base": base, "sink": dict(published.sink), "fields": fields}
        return resultstore.write(cache_root, ACTION, action.key(cache_root), value)
    except (OSError, ValueError, TypeError):  # an input gone mid-way, no working directory, odd fields
        return False


def lookup(cache_root: Path, action: Action) -> dict[str, object] | None:
    """The fields of the OK line of this very action's last build, when everything it depended on is as
    it was and the destination still holds its result; None (build it) otherwise."""
    try:
        value = resultstore.read(cache_root, ACTION, action.key(cache_root))
        if value is None:
            return None
        for path, size, sha in value["files"]:
            if os.stat(path).st_size != size or _sha256(Path(path)) != sha:
                return None
        for path, sha in value["dirs"]:
            if _listing_sha256(Path(path)) != sha:
                return None
        if not base_holds(value["base"]) or not sink_holds(value["sink"]):
            return None
        fields = json.loads(value["fields"])
        return fields if isinstance(fields, dict) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # gone, unreadable, no working directory, an entry of another shape: build it
