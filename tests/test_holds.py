"""Backend.evidence / Backend.holds: whether a place still holds an image as its write left it (what the
action cache asks before it replays a build), for every kind of place."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import fakebase as fb
from servimg.backends import transport
from servimg.backends.target import Target
from servimg.core.digest import Digest
from servimg.oci.image import Image
from servimg.oci.store import BlobStore

TAG = "v1"


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Image, BlobStore]:
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    cache = tmp_path / "cache"
    layout = tmp_path / "out"
    assert fb.main(["lock", str(definition), "--cache", str(cache), "--quiet"]) == 0
    argv = ["build", str(definition), "--to", f"oci:{layout}:{TAG}", "--cache", str(cache), "--quiet"]
    assert fb.main(argv) == 0
    store = BlobStore(cache)
    return layout, transport.fetch(f"oci:{layout}:{TAG}", store, lambda _: None), store


def _flip_in_place(path: Path) -> None:
    with path.open("r+b") as fh:
        byte = fh.read(1)
        fh.seek(0)
        fh.write(bytes([byte[0] ^ 0x5A]))


def test_a_layout_holds_its_image_until_a_blob_is_written_in_place(built: tuple[Path, Image, Any]) -> None:
    layout, image, _ = built
    target = Target.layout(layout, TAG)
    backend = transport.backend(target)
    evidence = transport.evidence(target, image)
    assert evidence is not None
    json.dumps(evidence)  # kept by the action cache as JSON
    assert backend.holds(target, image.digest, evidence)
    assert not backend.holds(Target.layout(layout, "other"), image.digest, evidence), "another tag"
    assert not backend.holds(target, Digest.of_bytes(b"another manifest"), evidence), "another image"
    _flip_in_place(layout / "blobs" / "sha256" / image.layer_descriptors[-1].digest.hex)
    assert not backend.holds(target, image.digest, evidence), "same size, same inode: the ctime moved"


def test_a_layout_with_no_index_holds_nothing(tmp_path: Path) -> None:
    target = Target.layout(tmp_path / "absent", TAG)
    assert transport.backend(target).holds(target, Digest.of_bytes(b"m"), {"blobs": []}) is False


def test_an_archive_offers_no_evidence_and_holds_nothing(built: tuple[Path, Image, BlobStore]) -> None:
    layout, image, store = built
    archive = layout.parent / "image.tar"
    target = Target.parse(f"docker-archive:{archive}")
    transport.publish(image, target, store, lambda _: None, tag="servimg/x:1")
    assert transport.evidence(target, image) is None
    assert transport.backend(target).holds(target, image.digest, {}) is False


@pytest.mark.registry
def test_a_registry_holds_an_image_while_its_tag_names_it(
    built: tuple[Path, Image, BlobStore], registry: Any
) -> None:
    _, image, store = built
    target = Target.parse(f"{registry.host}/holds/{os.getpid()}:{TAG}")
    transport.publish(image, target, store, lambda _: None)
    backend = transport.backend(target)
    assert transport.evidence(target, image) is None, "a tag can move at any time: nothing to keep"
    assert backend.holds(target, image.digest, {})
    assert not backend.holds(target, Digest.of_bytes(b"another manifest"), {})
    assert not backend.holds(Target.parse(f"{registry.host}/holds/{os.getpid()}:absent"), image.digest, {})
    assert not backend.holds(Target.parse("127.0.0.1:9/holds/x:1"), image.digest, {}), "unreachable: False"
