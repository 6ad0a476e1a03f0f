"""A place is a closed sum (`backends.target`): one parser, one printer, and what a place can hold or
names asked of the place, never its kind (issue 49)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakebase import F, main, make_base, on_host, package_members, read_json, tar
from servimg.backends import transport
from servimg.backends.archive import read_archive
from servimg.backends.resolve import Resolved
from servimg.backends.target import (
    ArchiveTarget,
    EngineTarget,
    Holds,
    LayoutTarget,
    RegistryTarget,
    Target,
)
from servimg.core.context import Log
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, ImageError
from servimg.core.platform import Platform
from servimg.oci.image import Image
from servimg.oci.index import ImageIndex, IndexedImages
from servimg.oci.store import BlobStore

DIGEST = Digest("sha256", "a" * 64)

SPELLINGS = [
    ("docker", EngineTarget, "docker"),
    ("engine", EngineTarget, "docker"),
    ("docker-daemon:servimg/demo:v1", EngineTarget, "docker-daemon:servimg/demo:v1"),
    ("oci:/out/demo", LayoutTarget, "oci:/out/demo"),
    ("oci:/out/demo:v1", LayoutTarget, "oci:/out/demo:v1"),
    ("docker-archive:/out/demo.tar", ArchiveTarget, "docker-archive:/out/demo.tar"),
    ("docker://127.0.0.1:5000/demo:v1", RegistryTarget, "127.0.0.1:5000/demo:v1"),
    ("127.0.0.1:5000/demo:v1", RegistryTarget, "127.0.0.1:5000/demo:v1"),
]


@pytest.mark.parametrize(("text", "kind", "printed"), SPELLINGS)
def test_one_parser_one_printer(text: str, kind: type[Target], printed: str) -> None:
    place = Target.parse(text)
    assert type(place) is kind and place.text() == printed
    assert Target.parse(place.text()) == place


def test_the_sum_is_closed() -> None:
    with pytest.raises(TypeError, match="sum of its kinds"):
        Target("somewhere")
    with pytest.raises(BackendError, match="not a target"):
        Target.parse("nowhere")
    # Same location, another kind: another place.
    assert Target.parse("oci:/x") != Target.parse("docker-archive:/x")


def test_what_each_place_holds() -> None:
    held = {
        text: {h for h in Holds if Target.parse(text).holds(h)}
        for text in ("docker", "oci:/l", "docker-archive:/a.tar", "r.example/x")
    }
    assert held == {
        "docker": {Holds.RUNNABLE},
        "oci:/l": {Holds.ATTESTATIONS, Holds.INDEX, Holds.TAGS},
        "docker-archive:/a.tar": set(),
        "r.example/x": {Holds.ATTESTATIONS, Holds.INDEX, Holds.SIMPLE_SIGNATURES, Holds.TAGS},
    }


def test_what_a_place_names() -> None:
    registry = Target.parse("r.example/team/x:v1")
    assert registry.named_tag == "v1" and registry.image_reference == "r.example/team/x:v1"
    assert registry.digest_ref(DIGEST) == f"r.example/team/x@{DIGEST}"
    assert registry.untagged() == Target.parse("r.example/team/x")
    assert Target.parse(f"r.example/x@{DIGEST}").named_tag is None

    layout = Target.parse("oci:/out/demo:v1")
    assert layout.named_tag == "v1" and layout.image_reference is None and layout.digest_ref(DIGEST) is None
    assert layout.untagged() == Target.layout("/out/demo")
    assert layout.is_layout_in(Path("/out")) and not layout.is_layout_in(Path("/elsewhere"))

    engine = Target.parse("docker-daemon:servimg/demo:v1")
    assert engine.named_tag == "v1" and engine.image_reference == "servimg/demo:v1"
    assert engine.is_engine_image_of("servimg/demo") and not engine.is_engine_image_of("servimg/other")
    assert Target.engine_image("sha256:" + "b" * 64).image_reference is None  # an ID names no reference

    # docker load refuses a bare tag in RepoTags: the engine and an archive take REPOSITORY:TAG.
    names = {
        t: Target.parse(t).name_for("servimg/demo", "v1") for t in ("docker", "docker-archive:/a", "oci:/l")
    }
    assert names == {"docker": "servimg/demo:v1", "docker-archive:/a": "servimg/demo:v1", "oci:/l": "v1"}


def test_check_resolves_its_ref_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`check` asks whether REF names an index and judges the image from one resolution (it resolved
    twice: once to look for an index, once to locate the image)."""
    layout = make_base(tmp_path / "layout", [tar(package_members())]).layout
    calls: list[str] = []
    resolve = transport.resolve

    def counted(text: str, log: Log) -> Resolved:
        calls.append(text)
        return resolve(text, log)

    monkeypatch.setattr(transport, "resolve", counted)
    code = main(["check", f"oci:{layout}", "--cache", str(tmp_path / "cache")])
    assert code == 1, "no attestation in the layout: the check fails, having judged the image"
    assert calls == [f"oci:{layout}"]


def _two_platform_images(tmp_path: Path) -> tuple[BlobStore, dict[Platform, Image]]:
    """Two one-layer images (amd64, arm64) with their blobs in one store."""
    store = BlobStore(tmp_path / "store")
    images = {}
    for arch in ("amd64", "arm64"):
        base = make_base(
            tmp_path / arch, [tar([F("etc/arch", arch.encode())])], config_extra={"architecture": arch}
        )
        for descriptor in base.image.layer_descriptors:
            store.put_bytes(base.blob(descriptor.digest).read_bytes())
        store.put_bytes(base.image.config_bytes)
        images[Platform.parse(f"linux/{arch}")] = base.image
    return store, images


def test_what_a_tag_names_is_published_by_one_call(tmp_path: Path) -> None:
    """`transport.publish` takes one image or an index with its children (`Backend.write_index`): a layout
    gets every child and then the index under the tag; an archive, a place of one image, the one child the
    options name, and says so (issue 49: one recursion, as go-containerregistry's `remote.Push`)."""
    store, images = _two_platform_images(tmp_path)
    indexed = IndexedImages(ImageIndex.of(images), images)
    arm64 = Platform.parse("linux/arm64")
    io = on_host(store)

    where = transport.publish(indexed, Target.parse(f"oci:{tmp_path / 'l'}:multi"), io, tag="ignored")
    assert where == f"oci:{tmp_path / 'l'}:multi@{indexed.digest}"
    [entry] = read_json(tmp_path / "l" / "index.json")["manifests"]
    assert entry["digest"] == str(indexed.digest), "the index is named; its children are reached through it"
    for child in indexed.ordered:
        assert (tmp_path / "l" / "blobs" / "sha256" / child.digest.hex).is_file()

    archive = tmp_path / "one.tar"
    said = transport.publish(
        indexed, Target.parse(f"docker-archive:{archive}"), io, tag="t:1", platform=arm64
    )
    assert "linux/arm64 only" in said and "a docker-archive holds one image" in said, said
    assert read_archive(archive, BlobStore(tmp_path / "s2")).config_digest == images[arm64].config_digest

    only_arm = IndexedImages(ImageIndex.of({arm64: images[arm64]}), {arm64: images[arm64]})
    with pytest.raises(BackendError, match="has no linux/amd64 image for a docker-archive"):
        transport.publish(
            only_arm, Target.parse(f"docker-archive:{archive}"), io, platform=Platform.parse("linux/amd64")
        )

    single = transport.publish(images[arm64], Target.parse(f"oci:{tmp_path / 's'}:one"), io)
    assert single == f"oci:{tmp_path / 's'}:one"


def test_an_index_with_another_images_children_is_refused(tmp_path: Path) -> None:
    _, images = _two_platform_images(tmp_path)
    amd64, arm64 = Platform.parse("linux/amd64"), Platform.parse("linux/arm64")
    with pytest.raises(ImageError, match="not the index") as refused:
        IndexedImages(ImageIndex.of(images), {amd64: images[arm64]})
    assert list(refused.value.problems) == ["linux/amd64: another image", "linux/arm64: missing"]


def test_every_backend_writes_an_index() -> None:
    for name, backend in transport.BACKENDS.items():
        assert callable(getattr(backend, "write_index", None)), name
