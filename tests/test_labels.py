"""`org.opencontainers.image.base.name` is an image reference (the annotations spec: distribution's
grammar), never a servimg transport string; where the base came from is `io.servimg.base.ref`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fakebase as fb
from fakebase import on_host
from servimg.backends import transport
from servimg.core.reference import Reference
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.naming import BASE_REF_LABEL, base_reference
from servimg.oci.store import BlobStore

BASE_NAME = "org.opencontainers.image.base.name"


@pytest.mark.parametrize(
    ("ref", "name"),
    [
        ("docker-daemon:servimg/demo-base:bookworm-d9cfba30a85c", "servimg/demo-base:bookworm-d9cfba30a85c"),
        ("127.0.0.1:5000/servimg/base:1", "127.0.0.1:5000/servimg/base:1"),
        ("docker-daemon:sha256:" + "a" * 64, None),  # an image ID is no reference
        ("oci:/tmp/layout:t", None),
        ("docker-archive:/tmp/base.tar", None),
    ],
)
def test_base_name_is_a_reference_or_absent(tmp_path: Path, ref: str, name: str | None) -> None:
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    path = fb.make_repo(tmp_path / "repo", base)
    path.write_text(path.read_text().replace(f"  ref: {base.ref}\n", f"  ref: {ref}\n"))
    found = base_reference(ImageDefinition.load(path))
    assert found == name
    if found is not None:
        Reference.parse(found)  # what `docker image inspect` and every registry client parse


def test_a_built_image_carries_the_transport_in_its_own_label(tmp_path: Path) -> None:
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    cache = ["--cache", str(tmp_path / "cache")]
    assert fb.main(["lock", str(definition), *cache]) == 0
    assert fb.main(["build", str(definition), "--to", f"oci:{tmp_path / 'out'}", *cache]) == 0
    image = transport.fetch(f"oci:{tmp_path / 'out'}", on_host(BlobStore(tmp_path / "cache")))
    labels = json.loads(image.config_bytes)["config"]["Labels"]
    assert BASE_NAME not in labels  # a layout base has no reference
    assert labels[BASE_REF_LABEL] == base.ref
    assert labels["org.opencontainers.image.base.digest"] == str(base.image.digest)
