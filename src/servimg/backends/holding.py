"""Whether a place still holds an image as a write left it, answered before anything heavy is loaded.

The action cache replays a warm rebuild before the command's own modules are imported (docs/benchmarks.md,
the replay's budget; tests/test_architecture.py keeps the store, the pipeline and every third-party package
off that path). So the answer for each place the cache records lives here, on the standard library and the
engine's socket, and the backends' `Backend.holds` is this same code: one way to tell, two callers.
`Backend.evidence` (layout: `blob_evidence`) records at write time what these functions check.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from servimg.backends.enginesocket import socket_image_id
from servimg.backends.target import Target
from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.oci.image import REF_NAME

Holds = Callable[[Target, Digest, Mapping[str, object]], bool]


def engine_holds(target: Target, digest: Digest, evidence: Mapping[str, object]) -> bool:
    """Whether the engine gives `target`'s name the image ID `digest` (one request over its socket)."""
    found = socket_image_id(target.location)
    return found is not None and found == digest


def layout_holds(target: Target, digest: Digest, evidence: Mapping[str, object]) -> bool:
    """Whether the layout's index names manifest `digest` by the target's tag, the manifest blob hashes
    to it, and every blob `evidence` lists is the file its fingerprint recorded (or, for one recorded
    within its clock tick, hashes to its name)."""
    root = Path(target.location)
    try:
        index = jv.obj(json.loads((root / "index.json").read_bytes()), "index.json")
        manifests = jv.objs(index["manifests"], "index.manifests")
        tagged = [m for m in manifests if jv.member(m, "annotations", REF_NAME) == target.tag]
        if len(tagged) != 1 or tagged[0].get("digest") != str(digest):
            return False
        blobs = root / "blobs" / "sha256"
        if Digest.of_file(str(blobs / digest.hex)) != digest:
            return False
        return all(_blob_holds(blobs, jv.seq(entry)) for entry in jv.seq(evidence["blobs"], "blobs"))
    except (OSError, ValueError, KeyError, ServimgError):
        return False


HOLDS: dict[str, Holds] = {"engine": engine_holds, "oci": layout_holds}


def holds(target: Target, digest: Digest, evidence: Mapping[str, object]) -> bool:
    """Whether `target` still holds `digest` as `evidence` says; False for a kind no replay records."""
    check = HOLDS.get(target.kind)
    return check is not None and check(target, digest, evidence)


def blob_evidence(root: Path, named: Sequence[tuple[Digest, int]]) -> dict[str, object]:
    """The layout's blobs `named` ((digest, size)) each with the stat fingerprint it has now."""
    blobs = root / "blobs" / "sha256"
    now = _file_clock(blobs)
    return {"blobs": [[str(d), size, *_fingerprint(blobs / d.hex, now)] for d, size in named]}


def _blob_holds(blobs: Path, entry: Sequence[object]) -> bool:
    if len(entry) != 5:
        return False  # recorded before blobs had fingerprints: build again
    digest, size, *fingerprint = entry
    named = Digest.parse(str(digest))
    path = blobs / named.hex
    if path.stat().st_size != size:
        return False
    if None in fingerprint:  # recorded within the tick it was written in: hashed instead
        return Digest.of_file(str(path)) == named
    return [*_stat_fingerprint(path)] == fingerprint  # written in place (or replaced) since: build again


def _fingerprint(path: Path, now: int) -> tuple[int, int, int] | tuple[None, None, None]:
    """(inode, mtime_ns, ctime_ns): every write into a file through the kernel moves its ctime, which no
    caller can set back (utime sets only atime and mtime), and a replaced file is another inode. A layout
    blob whose fingerprint is unchanged since the build wrote and hashed it still holds those bytes,
    short of a disk fault (`servimg verify` and `servimg cache verify` hash everything for that).

    The kernel stamps files from a coarse clock (a tick of milliseconds): a blob whose ctime is this very
    tick (`now`) could be written again within it without its ctime moving, so it gets no fingerprint and
    is re-hashed by the replay instead (git's "racily clean" entries)."""
    fingerprint = _stat_fingerprint(path)
    return (None, None, None) if fingerprint[2] >= now else fingerprint


def _stat_fingerprint(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns


def _file_clock(directory: Path) -> int:
    """The clock the kernel stamps files with, now, on `directory`'s file system (an unnamed temp file)."""
    with tempfile.TemporaryFile(dir=directory) as fh:
        return os.fstat(fh.fileno()).st_ctime_ns
