"""Every base servimg builds itself, by name, and the one deliberate way to move their pins: re-pin.

``servimg base NAME`` builds (or takes from the cache) one of `BASES` and checks it against the digest
committed in ``verify/bases/NAME.lock.json``. ``servimg base NAME --repin`` is the only command that
changes what a base is made of: it resolves the base's request (suite, variant, includes) against the live
Debian archive, pins the closure, builds the base from those pins, and then rewrites exactly the files that
depend on it — the pin file, the base's lock and file listings, and each definition in ``images/`` that
names the base with its lock — all computed first and written only when everything succeeded. The
reviewer's diff shows what moved.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from servimg.bases import assemble as demo
from servimg.bases import cpu_vllm, debian
from servimg.bases import pinned as basepin
from servimg.bases import tiny as testbase
from servimg.bases.debian import DebianError, DebianPins
from servimg.bases.demo import DemoRecipe
from servimg.build.pipeline import lock as lock_definition
from servimg.core.atomic import atomic_write
from servimg.core.progress import Log
from servimg.oci.image import Image
from servimg.oci.store import BlobStore

MIRROR = "http://deb.debian.org/debian"
PY_VENV = ("python3", "python3-venv")


def _request(suite: str, *include: str) -> DebianPins:
    return DebianPins(suite=suite, mirror=MIRROR, variant="minbase", include=include, release="", packages=())


@dataclass(frozen=True)
class LocalBase:
    """One locally built base: its Debian request, how its recipe, image and engine tag are made."""

    name: str
    engine_name: str
    request: DebianPins
    recipe: Callable[[DebianPins], Any]
    image: Callable[..., Image]
    tag: Callable[[Any], str]

    def pinned_recipe(self) -> Any:
        """The recipe from the committed pins, refusing pins made for another request."""
        pins = debian.load_pins(self.name)
        wanted = (self.request.suite, self.request.variant, self.request.include)
        if (pins.suite, pins.variant, pins.include) != wanted:
            raise DebianError(
                f"verify/bases/{self.name}.debian.txt pins {pins.suite}/{pins.variant} {pins.include}, but "
                f"the {self.name} base asks for {wanted[0]}/{wanted[1]} {wanted[2]}",
                hint=f"re-pin it: servimg base {self.name} --repin",
            )
        return self.recipe(pins)


BASES: Mapping[str, LocalBase] = {
    "demo": LocalBase(
        name="demo",
        engine_name=demo.DEMO_BASE_NAME,
        request=_request("bookworm", *PY_VENV, "ca-certificates"),
        recipe=lambda pins: DemoRecipe(debian_pins=pins),
        image=demo.demo_base_image,
        tag=demo.demo_base_tag,
    ),
    "cpu-vllm": LocalBase(
        name="cpu-vllm",
        engine_name=cpu_vllm.CPU_VLLM_BASE_NAME,
        request=_request("bookworm", *PY_VENV, "python3-dev", "g++", "libnuma1", "ca-certificates"),
        recipe=lambda pins: cpu_vllm.CpuVllmRecipe(wheels=cpu_vllm.load_pins(), debian_pins=pins),
        image=cpu_vllm.base_image,
        tag=cpu_vllm.base_tag,
    ),
    "test-bookworm": LocalBase(
        name="test-bookworm",
        engine_name=testbase.TEST_BASE_NAME,
        request=_request("bookworm", "python3"),
        recipe=testbase.TinyBaseRecipe,
        image=testbase.tiny_base_image,
        tag=testbase.tiny_base_tag,
    ),
    "test-trixie": LocalBase(
        name="test-trixie",
        engine_name=testbase.TEST_BASE_NAME,
        request=_request("trixie", "python3"),
        recipe=testbase.TinyBaseRecipe,
        image=testbase.tiny_base_image,
        tag=testbase.tiny_base_tag,
    ),
}


def get(name: str) -> LocalBase:
    if name not in BASES:
        raise DebianError(f"no base named {name!r}", hint=f"choose one of: {', '.join(sorted(BASES))}")
    return BASES[name]


def build_base(
    name: str,
    store: BlobStore,
    log: Log,
    *,
    targets: Sequence[str] | None = None,
    workdir: Path | None = None,
    clock: debian.Clock | None = None,
) -> dict[str, Any]:
    """Build (or reuse) a base from its committed pins, check its pinned digest, publish it.

    `clock` is the seam the reproducibility tests use to build under another clock."""
    base = get(name)
    recipe = base.pinned_recipe()
    image = base.image(recipe, store, log, workdir, clock=clock)
    tag = base.tag(recipe)
    published = demo.publish_base(image, tag, targets, store, log)
    return {
        "base": name,
        "digest": str(image.digest),
        "config_digest": str(image.config_digest),
        "tag": tag,
        "ref": f"docker-daemon:{tag}",
        "published": published,
        "pinned": str(recipe.debian_pins.release),
    }


# ---------------------------------------------------------------------------------------------- re-pin


def repin(
    name: str,
    store: BlobStore,
    log: Log,
    *,
    repo: Path = debian.REPO_ROOT,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """Re-pin one base deliberately; returns what moved. Nothing is written unless every step succeeded."""
    base = get(name)
    pin_dir = repo / "verify" / "bases"
    try:
        old = debian.load_pins(name, pin_dir)
    except DebianError:
        old = None
    work = Path(tempfile.mkdtemp(prefix="servimg-repin-", dir=workdir))
    try:
        log(f"{name}: resolving {' '.join(base.request.include)} on {base.request.suite} from {MIRROR}")
        pins = debian.resolve_pins(base.request, work, store.root / "debs", log)
        recipe = base.recipe(pins)
        image = base.image(recipe, store, log, work, check_pin=False)
        pin = basepin.BasePin.of(name, recipe.cache_key(), image)
        files: dict[Path, bytes] = {debian.pin_path(name, pin_dir): pins.render().encode()}
        files.update({pin_dir / n: data for n, data in basepin.pin_files(pin, image, store).items()})
        tag = base.tag(recipe)
        dependents = _dependents(repo, base.engine_name)
        if dependents:
            demo.publish_base(image, tag, ["docker"], store, log)
        for definition in dependents:
            files.update(
                _relock(repo, definition, f"docker-daemon:{tag}", str(image.digest), work, store, log)
            )
        for path, data in sorted(files.items()):
            _write_atomically(path, data)
        return {
            "base": name,
            "release": pins.release,
            "digest": str(image.digest),
            "tag": tag,
            "moved": moved(old, pins),
            "written": sorted(str(p.relative_to(repo)) for p in files),
        }
    finally:
        debian.unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)


def moved(old: DebianPins | None, new: DebianPins) -> list[str]:
    """One line per package whose pin changed: `name: old → new` (added / removed too)."""
    before = {p.name: p.version for p in old.packages} if old else {}
    after = {p.name: p.version for p in new.packages}
    return [
        f"{n}: {before.get(n, '(not pinned)')} → {after.get(n, '(removed)')}"
        for n in sorted(before.keys() | after.keys())
        if before.get(n) != after.get(n)
    ]


def _dependents(repo: Path, engine_name: str) -> list[Path]:
    """Definitions in images/ whose base is this base in the engine (`docker-daemon:NAME:…`)."""
    found = []
    for path in sorted((repo / "images").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        ref = str((doc.get("base") or {}).get("ref", ""))
        if ref.startswith(f"docker-daemon:{engine_name}:"):
            found.append(path)
    return found


_REF = re.compile(r"^(?P<indent>\s+)ref:\s*\S+\s*$", re.M)
_DIGEST = re.compile(r"^(?P<indent>\s+)digest:\s*sha256:[0-9a-f]{64}\s*$", re.M)


def _relock(
    repo: Path, definition: Path, ref: str, digest: str, work: Path, store: BlobStore, log: Log
) -> dict[Path, bytes]:
    """The definition with the new base ref and digest (only those two lines change) and its new lock,
    computed in a copy of images/ and overlays/ so that nothing in the repository is touched yet."""
    text = definition.read_text(encoding="utf-8")
    new, refs = _REF.subn(lambda m: f"{m['indent']}ref: {ref}", text, count=1)
    new, digests = _DIGEST.subn(lambda m: f"{m['indent']}digest: {digest}", new, count=1)
    if refs != 1 or digests != 1:
        raise DebianError(f"{definition}: cannot find its base ref and digest lines to re-pin")
    copy = work / "repo"
    if not copy.exists():
        shutil.copytree(repo / "images", copy / "images")
        shutil.copytree(repo / "overlays", copy / "overlays")
    target = copy / "images" / definition.name
    target.write_text(new, encoding="utf-8")
    log(f"re-locking {definition.relative_to(repo)} on {ref}")
    lock_definition(target, store, log)
    lock_file = target.with_name(target.name.removesuffix(".yaml") + ".lock.json")
    return {
        definition: new.encode(),
        definition.with_name(lock_file.name): lock_file.read_bytes(),
    }


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data, 0o644)
