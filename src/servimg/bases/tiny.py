"""The local test bases: Debian minbase + python3 + /opt/venv holding one tiny pure-Python wheel.

The planted-defect suite (tests/test_planted.py) and the witness tests need real images on more than one
interpreter (Debian 12 `bookworm`: python3.11, Debian 13 `trixie`: python3.13) without vLLM's weight. They
are built as every base is (`servimg.bases.demo.build_rootfs`: the Debian layer by mmdebstrap from the
packages pinned in ``verify/bases/test-<suite>.debian.txt``, neutralised); what differs is the `TEST` kind:

``venv`` layer
    Only ``opt/venv``: a venv made by the image's own ``python3 -m venv --without-pip``; ``tinypkg 1.0``
    installed from a real wheel built here (`tiny_wheel`: stdlib ``zipfile``, stored entries, fixed
    timestamps, a RECORD with sha256 of every file) by a minimal PEP 427 installer (`install_wheel`: RECORD
    hashes verified, INSTALLER written, RECORD rewritten, nothing outside the site dir); timestamp pycs
    compiled by the image's interpreter; every mtime ``source_date_epoch``. The interpreter is whatever
    the suite ships, recorded in the label ``io.servimg.test.python``.

The image is cached in the BlobStore as an OCI layout keyed by the recipe (`servimg.bases.assemble`) and
published to the engine as ``servimg/test-base:<suite>-<key12>``; its digest is pinned in
``verify/bases/test-<suite>.lock.json``. Needs root, mmdebstrap and the Debian archive on the first build of
each suite (later builds read the pinned packages from the cache).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import posixpath
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servimg.bases.demo import VENV
from servimg.bases.recipe import Kind, Recipe
from servimg.core.errors import BaseBuildError

PACKAGE = "tinypkg"
VERSION = "1.0"
DIST_INFO = f"{PACKAGE}-{VERSION}.dist-info"
WHEEL_FILENAME = f"{PACKAGE}-{VERSION}-py3-none-any.whl"
INSTALLER = "servimg-testbase"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)

# The package as upstream "released" it. tests/fixtures/overlays/tinypkg/admit-gate.patch applies to it.
TINY_SOURCES: dict[str, str] = {
    "tinypkg/__init__.py": '''"""tinypkg: a tiny pure-Python package, servimg's stand-in for vLLM."""

__version__ = "1.0"
''',
    "tinypkg/core.py": '''"""tinypkg.core: admits work up to a limit (the module servimg's tests patch)."""

from tinypkg.util import clamp

LIMIT = 3


def legacy_admit(n):
    assert n <= LIMIT, "over the limit"  # gone under python -O
    return n


class Scheduler:
    def __init__(self, limit=LIMIT):
        self.limit = limit

    def schedule(self, n):
        return clamp(legacy_admit(n), self.limit)
''',
    "tinypkg/util.py": '''"""tinypkg.util: helpers the overlay does not touch."""


def clamp(n, limit):
    return min(n, limit)
''',
}


# ---------------------------------------------------------------------------------------------- wheel


def record_hash(data: bytes) -> str:
    """A RECORD hash field (PEP 376/427): `sha256=<urlsafe base64, no padding>`."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _record(rows: Sequence[Sequence[str]]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        writer.writerow(row)
    return out.getvalue().encode()


def tiny_wheel() -> bytes:
    """`tinypkg-1.0-py3-none-any.whl`, byte for byte the same on every run (stored, fixed times)."""
    files: dict[str, bytes] = {name: text.encode() for name, text in sorted(TINY_SOURCES.items())}
    files[f"{DIST_INFO}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {VERSION}\nSummary: servimg test fixture package\n"
    ).encode()
    files[f"{DIST_INFO}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: servimg.testbase\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{DIST_INFO}/top_level.txt"] = f"{PACKAGE}\n".encode()
    rows = [[name, record_hash(data), str(len(data))] for name, data in files.items()]
    files[f"{DIST_INFO}/RECORD"] = _record([*rows, [f"{DIST_INFO}/RECORD", "", ""]])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in files.items():  # sources first, the dist-info (RECORD last) at the end
            info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
            info.create_system = 3
            info.external_attr = 0o100644 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def install_wheel(wheel: Path, site: Path, *, installer: str = INSTALLER) -> list[str]:
    """Install a pure-Python wheel into `site` (PEP 427 "Installing a wheel", purelib only): every file
    must be in RECORD with a matching hash; INSTALLER is added and RECORD rewritten. Returns the
    installed paths relative to `site`."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
        records = sorted({n.split("/", 1)[0] for n in names if n.endswith(".dist-info/RECORD")})
        if len(records) != 1:
            raise BaseBuildError(f"{wheel.name}: expected one .dist-info with a RECORD, found {records}")
        dist_info = records[0]
        record_name = f"{dist_info}/RECORD"
        rows = [r for r in csv.reader(io.StringIO(archive.read(record_name).decode())) if r]
        recorded = {r[0]: (r[1] if len(r) > 1 else "") for r in rows}
        problems = []
        for name in names:
            data = archive.read(name)
            parts = posixpath.normpath(name).split("/")
            if name.startswith("/") or ".." in parts or parts[0].endswith(".data"):
                problems.append(f"{name}: not a plain purelib path")
            elif name not in recorded:
                problems.append(f"{name}: not in RECORD")
            elif name != record_name and recorded[name] != record_hash(data):
                problems.append(f"{name}: hash differs from RECORD")
        if problems:
            raise BaseBuildError(f"{wheel.name} is not installable", problems=problems)
        for name in names:
            if name == record_name:
                continue
            dest = site / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(archive.read(name))
            dest.chmod(0o644)
    installer_data = f"{installer}\n".encode()
    (site / dist_info / "INSTALLER").write_bytes(installer_data)
    kept = [r for r in rows if r[0] != record_name]
    kept.append([f"{dist_info}/INSTALLER", record_hash(installer_data), str(len(installer_data))])
    (site / record_name).write_bytes(_record([*sorted(kept), [record_name, "", ""]]))
    (site / record_name).chmod(0o644)
    return sorted([*names, f"{dist_info}/INSTALLER"])


# ---------------------------------------------------------------------------------------------- kind


@dataclass(frozen=True)
class TinyWheel:
    """`tinypkg`, built from `TINY_SOURCES` and installed by `install_wheel` (the `SourceWheel` strategy)."""

    @property
    def filename(self) -> str:
        return WHEEL_FILENAME

    def build(self) -> bytes:
        return tiny_wheel()

    def install(self, wheel: Path, site: Path) -> list[str]:
        return install_wheel(wheel, site)


def _history(recipe: Recipe) -> str:
    return f"python3 -m venv --without-pip {VENV} && install {WHEEL_FILENAME}"


def _labels(recipe: Recipe, python: str) -> Mapping[str, str]:
    return {"io.servimg.test.python": python}


TEST = Kind(
    name="test",
    title="servimg test base",
    format=2,  # bump when the build procedure or the package changes the output for the same recipe
    history=_history,
    labels=_labels,
    source_wheel=TinyWheel(),
)
