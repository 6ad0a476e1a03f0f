"""The local test base: Debian minbase + python3 + /opt/venv holding one tiny pure-Python wheel.

The planted-defect suite (tests/test_planted.py) and the witness tests need real images on more than one
interpreter (Debian 12 `bookworm`: python3.11, Debian 13 `trixie`: python3.13) without vLLM's weight. The
Debian layer is built the way the demo base's is (`demo_base.build_debian_layer`: mmdebstrap from the
packages pinned in ``verify/bases/test-<suite>.debian.txt``, neutralised) plus one more layer:

``venv`` layer
    Only ``opt/venv``: a venv made by the image's own ``python3 -m venv --without-pip``; ``tinypkg 1.0``
    installed from a real wheel built here (`tiny_wheel`: stdlib ``zipfile``, stored entries, fixed
    timestamps, a RECORD with sha256 of every file) by a minimal PEP 427 installer (`install_wheel`: RECORD
    hashes verified, INSTALLER written, RECORD rewritten, nothing outside the site dir); timestamp pycs
    compiled by the image's interpreter; every mtime ``source_date_epoch``.

The image is cached in the BlobStore as an OCI layout keyed by the recipe (like `demo.demo_base_image`)
and published to the engine as ``servimg/test-base:<suite>-<key12>``; its digest is pinned in
``verify/bases/test-<suite>.lock.json``. Needs root, mmdebstrap and the Debian archive on the first build of
each suite (later builds read the pinned packages from the cache).
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import posixpath
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servimg.backends.transport import Target, publish
from servimg.bases.assemble import cached_base, debian_history, image_from_trees, venv_base_config
from servimg.bases.debian import Clock, DebianPins, OnPinnedDebian, SystemClock, load_pins
from servimg.bases.demo import (
    VENV,
    DemoRecipe,
    _chroot,
    _publish,
    _reset_mtimes,
    _safe_rmtree,
    build_debian_layer,
    resolve_in_root,
    venv_layer,
)
from servimg.core import canonical
from servimg.core.digest import sha256_hex
from servimg.core.errors import BaseBuildError
from servimg.core.progress import Log
from servimg.oci.image import Image
from servimg.oci.store import BlobStore

# Bump when the build procedure or the package changes the output for the same recipe.
TINY_FORMAT = 2
TEST_BASE_NAME = "servimg/test-base"
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


# ---------------------------------------------------------------------------------------------- base


@dataclass(frozen=True)
class TinyBaseRecipe(OnPinnedDebian):
    """Every input of a test base, all pinned in the repository; equal recipes give identical trees."""

    debian_pins: DebianPins
    source_date_epoch: int = 1767225600  # 2026-01-01T00:00:00Z

    @property
    def base_name(self) -> str:
        """The name of its pins and pinned digest in verify/bases (test-<suite>)."""
        return f"test-{self.suite}"

    def debian(self) -> DemoRecipe:
        return DemoRecipe(debian_pins=self.debian_pins, wheels=(), source_date_epoch=self.source_date_epoch)

    def cache_key(self) -> str:
        doc = {
            "format": TINY_FORMAT,
            "recipe": dataclasses.asdict(self),
            "wheel": sha256_hex(tiny_wheel()),
        }
        return sha256_hex(canonical.dumps(doc))


BOOKWORM = TinyBaseRecipe(load_pins("test-bookworm"))  # Debian 12: python3.11
TRIXIE = TinyBaseRecipe(load_pins("test-trixie"))  # Debian 13: python3.13
RECIPES = {"bookworm": BOOKWORM, "trixie": TRIXIE}


def build_tiny_rootfs(
    recipe: TinyBaseRecipe, workdir: Path, log: Log = print, *, deb_cache: Path, clock: Clock | None = None
) -> tuple[Path, Path, str]:
    """Build the test base into `(workdir/"debian", workdir/"venv", "3.X")`, replacing earlier ones."""
    clock = clock or SystemClock()
    workdir.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".test-base-", dir=workdir))
    started = time.monotonic()
    try:
        debian, venv = build / "debian", build / "venv"
        build_debian_layer(recipe.debian(), debian, log, deb_cache=deb_cache, clock=clock)
        version = _python_version(debian)
        _build_tiny_venv(recipe, debian, venv, version, log, clock)
        result = _publish(build, workdir)
        log(f"test base ({recipe.suite}, python{version}) built in {time.monotonic() - started:.0f}s")
        return result[0], result[1], version
    finally:
        if build.exists():
            _safe_rmtree(build)


def _python_version(rootfs: Path) -> str:
    resolved = resolve_in_root(rootfs, "/usr/bin/python3")
    name = posixpath.basename(resolved)
    if not name.startswith("python3."):
        raise BaseBuildError(f"/usr/bin/python3 resolves to {resolved}, not a python3.X binary")
    return name.removeprefix("python")


def _build_tiny_venv(
    recipe: TinyBaseRecipe, rootfs: Path, layer: Path, version: str, log: Log, clock: Clock
) -> None:
    with venv_layer(rootfs, layer, recipe.source_date_epoch) as venv_dir:
        _chroot(
            rootfs,
            ["python3", "-m", "venv", "--without-pip", VENV],
            log=log,
            what="python3 -m venv",
            clock=clock,
        )
        site = f"{VENV}/lib/python{version}/site-packages"
        with tempfile.TemporaryDirectory(prefix="servimg-wheel-") as tmp:
            wheel = Path(tmp) / WHEEL_FILENAME
            wheel.write_bytes(tiny_wheel())
            installed = install_wheel(wheel, rootfs / site.lstrip("/"))
        log(f"installed {WHEEL_FILENAME}: {len(installed)} files into {site}")
        _reset_mtimes(venv_dir, recipe.source_date_epoch)
        compile_cmd = [
            f"{VENV}/bin/python",
            "-m",
            "compileall",
            "-q",
            "-f",
            "--invalidation-mode",
            "timestamp",
        ]
        _chroot(
            rootfs,
            [*compile_cmd, site],
            log=log,
            what="compileall",
            env={"PATH": "/usr/bin:/bin"},
            clock=clock,
        )


def tiny_base_tag(recipe: TinyBaseRecipe) -> str:
    return f"{TEST_BASE_NAME}:{recipe.suite}-{recipe.cache_key()[:12]}"


def tiny_base_config(recipe: TinyBaseRecipe, version: str, diff_ids: Sequence[str]) -> dict[str, Any]:
    return venv_base_config(
        source_date_epoch=recipe.source_date_epoch,
        diff_ids=diff_ids,
        labels={
            "org.opencontainers.image.title": "servimg test base",
            "io.servimg.test.recipe": recipe.cache_key(),
            "io.servimg.test.python": version,
        },
        history=[
            debian_history(recipe.debian_pins),
            f"python3 -m venv --without-pip {VENV} && install {WHEEL_FILENAME}",
        ],
    )


def tiny_base_image(
    recipe: TinyBaseRecipe,
    store: BlobStore,
    log: Log,
    workdir: Path | None = None,
    *,
    clock: Clock | None = None,
    check_pin: bool = True,
) -> Image:
    """Build (or reuse from the cache) the test base as an OCI layout keyed by the recipe."""

    def build(work: Path) -> Image:
        log(f"test base {recipe.suite}: mmdebstrap + {WHEEL_FILENAME} (under a minute on first run)")
        debian_dir, venv_dir, version = build_tiny_rootfs(
            recipe, work, log, deb_cache=store.root / "debs", clock=clock
        )
        return image_from_trees(
            [("debian", debian_dir), ("venv", venv_dir)],
            store,
            log,
            mtime=recipe.source_date_epoch,
            prefix=f"test-{recipe.cache_key()[:12]}",
            config=lambda diff_ids: tiny_base_config(recipe, version, diff_ids),
        )

    cache = store.root / "test-base" / recipe.cache_key()
    pinned = (recipe.base_name, recipe.cache_key()) if check_pin else None
    return cached_base(
        cache,
        store,
        log,
        f"test base {recipe.suite}",
        build,
        tag=recipe.suite,
        workdir=workdir,
        pinned=pinned,
    )


def tiny_base(
    store: BlobStore, log: Log = print, recipe: TinyBaseRecipe = TRIXIE, *, engine: bool = True
) -> dict[str, Any]:
    """The test base for `recipe`, built or cached, and (with `engine`) loaded into the Docker Engine
    under `tiny_base_tag`. Returns its digests, tag, refs, layout dir and python version."""
    image = tiny_base_image(recipe, store, log)
    tag = tiny_base_tag(recipe)
    if engine:
        publish(image, Target("engine", ""), store, log, tag=tag)
    cached = store.root / "test-base" / recipe.cache_key()
    return {
        "suite": recipe.suite,
        "digest": str(image.digest),
        "config_digest": str(image.config_digest),
        "tag": tag,
        "ref": f"docker-daemon:{tag}",
        "oci_ref": f"oci:{cached}:{recipe.suite}",
        "layout": str(cached),
        "python": image.labels["io.servimg.test.python"],
        "site_packages": f"{VENV}/lib/python{image.labels['io.servimg.test.python']}/site-packages",
    }
