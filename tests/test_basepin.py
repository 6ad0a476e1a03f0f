"""servimg.bases.pinned: a base that differs from its pin is explained file by file (fast, no root)."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from fakebase import on_host
from servimg.bases import pinned as basepin
from servimg.bases.assemble import image_from_trees, venv_base_config
from servimg.bases.pinned import BaseDriftError, BasePin
from servimg.oci.image import Image
from servimg.oci.listing import parse_listing
from servimg.oci.store import BlobStore

EPOCH = 1767225600


def _image(tmp: Path, store: BlobStore, shadow: str, tag: str) -> Image:
    trees = []
    for name, files in (
        ("debian", {"etc/shadow": shadow, "etc/hostname": "localhost\n"}),
        ("venv", {"opt/venv/pyvenv.cfg": "home = /usr/bin\n"}),
    ):
        root = tmp / tag / name
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        for path in [root, *root.rglob("*")]:
            os.utime(path, (EPOCH, EPOCH))
        trees.append((name, root))
    return image_from_trees(
        trees,
        on_host(store, lambda _: None),
        mtime=EPOCH,
        prefix=tag,
        config=lambda ids: venv_base_config(
            source_date_epoch=EPOCH, diff_ids=ids, labels={}, history=["a", "b"]
        ),
    )


def _pin(tmp: Path, store: BlobStore, image: Image) -> Path:
    directory = tmp / "pins"
    directory.mkdir()
    pin = BasePin.of("toy", "k" * 64, image)
    for name, data in basepin.pin_files(pin, image, store).items():
        (directory / name).write_bytes(data)
    return directory


def test_the_pinned_image_passes_and_the_pin_round_trips(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "cache")
    image = _image(tmp_path, store, "root:*:20454:0:99999:7:::\n", "a")
    directory = _pin(tmp_path, store, image)
    logged: list[str] = []
    basepin.check("toy", "k" * 64, image, on_host(store, logged.append), directory)
    assert "is the pinned digest" in logged[-1]
    loaded = basepin.load("toy", directory)
    assert loaded == BasePin.of("toy", "k" * 64, image)
    listing = parse_listing(gzip.decompress((directory / "toy.debian.files.gz").read_bytes()))
    assert {e.path for e in listing} >= {"etc/shadow", "etc/hostname"}


def test_a_drift_names_the_layer_and_each_differing_path(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "cache")
    directory = _pin(tmp_path, store, _image(tmp_path, store, "root:*:20454:0:99999:7:::\n", "a"))
    drifted = _image(tmp_path, store, "root:*:20788:0:99999:7:::\n", "b")  # the build day leaked in
    with pytest.raises(BaseDriftError) as info:
        basepin.check("toy", "k" * 64, drifted, on_host(store, lambda _: None), directory)
    problems = info.value.problems
    assert any(
        line.startswith("layer 0 (debian): diffID") and "1 path(s) differ" in line for line in problems
    )
    assert any("etc/shadow" in line and "sha256" in line for line in problems)
    assert any(line.startswith("layer 1 (venv): identical") for line in problems)
    assert "servimg base toy --repin" in info.value.hint and "diff --files" in info.value.hint


def test_another_recipe_has_no_pin_to_compare_with(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "cache")
    image = _image(tmp_path, store, "x\n", "a")
    directory = _pin(tmp_path, store, image)
    logged: list[str] = []
    basepin.check(
        "toy", "z" * 64, _image(tmp_path, store, "y\n", "b"), on_host(store, logged.append), directory
    )
    assert "no pinned digest" in logged[-1]
