"""The action cache (servimg.builder.actioncache): a build recorded with what it read and where it went is
replayed only while every one of those still holds, and never otherwise. Each test records one "build"
(a function reading a definition, a patch and listing a directory, inside `recording`) into a real OCI
layout written here, then changes exactly one thing and looks it up again. The last tests go through
`servimg.cli.main`: a hit prints the recorded OK line without building (the definition here cannot be
built: a miss is a FAIL)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import standin_engine
from servimg import cli
from servimg.backends import holding
from servimg.backends.target import Target
from servimg.builder import actioncache, resultstore
from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.oci.image import REF_NAME

TAG = "demo-1"
BASE_ID = Digest.of_bytes(b"base config")


@dataclass
class World:
    repo: Path
    cache: Path
    layout: Path
    action: actioncache.Action
    published: actioncache.Published
    engine: dict[str, Digest]

    def build(self) -> bool:
        """What a build reads, recorded, then remembered with its destination."""
        with actioncache.recording() as reads:
            (self.repo / "images" / "d.yaml").read_bytes()
            with open(self.repo / "overlays" / "fix.patch", "rb") as fh:
                fh.read()
            os.listdir(self.repo / "verify")
            (self.cache / "blobs-read-through-the-cache").read_bytes()  # under the cache: not an input
        return actioncache.remember(self.cache, self.action, reads, self.published)

    def hit(self) -> dict[str, object] | None:
        return actioncache.lookup(self.cache, self.action)


def _blob(layout: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def _layout(layout: Path) -> tuple[str, list[tuple[str, int]]]:
    (layout / "blobs" / "sha256").mkdir(parents=True)
    blobs = [_blob(layout, b'{"config": 1}'), _blob(layout, b"layer bytes")]
    manifest = json.dumps({"config": {"digest": blobs[0][0]}, "layers": [{"digest": blobs[1][0]}]}).encode()
    digest, size = _blob(layout, manifest)
    annotations = {REF_NAME: TAG}
    index = {"manifests": [{"digest": digest, "size": size, "annotations": annotations}]}
    (layout / "index.json").write_text(json.dumps(index))
    return digest, blobs


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    repo = tmp_path / "repo"
    for d in ("images", "overlays", "verify"):
        (repo / d).mkdir(parents=True)
    (repo / "images" / "d.yaml").write_text("name: d\n")
    (repo / "overlays" / "fix.patch").write_text("--- a\n+++ b\n")
    (repo / "verify" / "probes.json").write_text("{}")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "blobs-read-through-the-cache").write_bytes(b"x")
    layout = tmp_path / "out"
    manifest, blobs = _layout(layout)
    engine = {"servimg/base:1": BASE_ID}
    server = standin_engine.serve(tmp_path / "engine.sock", engine, [])
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'engine.sock'}")
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    monkeypatch.delenv(resultstore.OFF, raising=False)
    monkeypatch.chdir(repo)
    fields = {"digest": manifest, "destination": f"oci:{layout}:{TAG}", "changed_files": 1, "b": 2, "a": 1}
    published = actioncache.Published(
        fields,
        actioncache.sink(
            Target.layout(layout, TAG),
            Digest.parse(manifest),
            holding.blob_evidence(layout, [(Digest.parse(d), size) for d, size in blobs]),
        ),
        layout,
        base_engine=("servimg/base:1", str(BASE_ID)),
    )
    action = actioncache.Action(Path("images/d.yaml"), f"oci:{layout}", "auto", None)
    w = World(repo, cache, layout, action, published, engine)
    assert w.build()
    try:
        yield w
    finally:
        server.shutdown()
        server.server_close()


def test_the_same_build_is_replayed_with_its_fields_in_their_order(world: World) -> None:
    hit = world.hit()
    assert hit == dict(world.published.fields)
    assert hit is not None and list(hit) == list(world.published.fields)  # the OK line's order


def test_what_was_recorded_is_exactly_the_files_read_and_the_listing(world: World) -> None:
    value = resultstore.read(world.cache, actioncache.ACTION, world.action.key(world.cache))
    assert value is not None
    repo = world.repo.resolve()
    assert [f[0] for f in value["files"]] == [str(repo / "images/d.yaml"), str(repo / "overlays/fix.patch")]
    assert [d[0] for d in value["dirs"]] == [str(repo / "verify")]


def test_a_changed_byte_of_an_input_rebuilds(world: World) -> None:
    patch = world.repo / "overlays" / "fix.patch"
    patch.write_text(patch.read_text().replace("+++ b", "+++ c"))  # same size, another byte
    assert world.hit() is None


def test_a_file_added_to_a_listed_directory_rebuilds(world: World) -> None:
    (world.repo / "verify" / "more.json").write_text("{}")
    assert world.hit() is None


def test_a_deleted_input_rebuilds(world: World) -> None:
    (world.repo / "overlays" / "fix.patch").unlink()
    assert world.hit() is None


@pytest.mark.parametrize("name", ["SERVIMG_MAX_LAYER_BYTES", "DOCKER_CONFIG", "XDG_CACHE_HOME"])
def test_a_changed_environment_variable_rebuilds(
    world: World, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "1")
    assert world.hit() is None
    monkeypatch.delenv(name)
    assert world.hit() is not None


def test_path_does_not_steer_it(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nowhere:" + os.environ.get("PATH", ""))
    assert world.hit() is not None


def test_another_argument_or_working_directory_is_another_action(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    for other in (
        actioncache.Action(world.action.definition, world.action.to, "chroot", None),
        actioncache.Action(world.action.definition, world.action.to, "auto", "t1"),
        actioncache.Action(world.action.definition, f"oci:{world.layout}:x", "auto", None),
    ):
        assert actioncache.lookup(world.cache, other) is None
    monkeypatch.chdir(world.repo / "images")
    assert world.hit() is None


def test_a_moved_engine_base_tag_rebuilds(world: World) -> None:
    world.engine["servimg/base:1"] = Digest.of_bytes(b"another base")
    assert world.hit() is None
    del world.engine["servimg/base:1"]
    assert world.hit() is None


def test_a_destination_that_no_longer_holds_the_result_rebuilds(world: World) -> None:
    index = json.loads((world.layout / "index.json").read_text())
    index["manifests"][0]["annotations"][REF_NAME] = "other"  # the tag moved away
    (world.layout / "index.json").write_text(json.dumps(index))
    assert world.hit() is None


def test_a_truncated_blob_in_the_destination_rebuilds(world: World) -> None:
    digest = str(jv.seq(jv.seq(jv.obj(world.published.sink["evidence"])["blobs"])[1])[0])
    (world.layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).write_bytes(b"layer")
    assert world.hit() is None


def test_a_blob_written_in_place_at_its_size_rebuilds(world: World) -> None:
    """Same inode, same size, mtime set back: the write moved ctime, which nothing can set back."""
    digest = str(jv.seq(jv.seq(jv.obj(world.published.sink["evidence"])["blobs"])[1])[0])
    blob = world.layout / "blobs" / "sha256" / digest.removeprefix("sha256:")
    before = blob.stat()
    with blob.open("r+b") as fh:
        fh.write(b"X")
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert blob.stat().st_ino == before.st_ino and blob.stat().st_size == before.st_size
    assert world.hit() is None


def test_a_deleted_destination_rebuilds(world: World) -> None:
    for path in sorted(world.layout.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    assert world.hit() is None


def test_the_engine_destination_must_give_the_tag_the_image_id(world: World) -> None:
    image = Digest.of_bytes(b"image config")
    sink = actioncache.sink(Target.engine_image("servimg/vllm:demo-1"), image, {})
    published = actioncache.Published({"digest": "d"}, sink, None, base_engine=None)
    assert world.build() and actioncache.remember(world.cache, world.action, actioncache.Reads(), published)
    assert world.hit() is None  # not tagged in the engine
    world.engine["servimg/vllm:demo-1"] = image
    assert world.hit() == {"digest": "d"}
    world.engine["servimg/vllm:demo-1"] = Digest.of_bytes(b"another image")
    assert world.hit() is None


def test_result_cache_off_or_bypassed_misses(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    with resultstore.bypassed():
        assert world.hit() is None
    monkeypatch.setenv(resultstore.OFF, "1")
    assert world.hit() is None


def test_an_edited_entry_is_never_replayed(world: World) -> None:
    path = resultstore.entry_path(world.cache, actioncache.ACTION, world.action.key(world.cache))
    doc = json.loads(path.read_text())
    doc["value"]["files"] = []  # forget the inputs: the value no longer has its sha256
    path.write_text(json.dumps(doc))
    assert world.hit() is None


def test_an_input_changed_while_the_build_ran_is_not_recorded(world: World) -> None:
    with actioncache.recording() as reads:
        patch = world.repo / "overlays" / "fix.patch"
        patch.read_bytes()
        patch.write_text("edited during the build\n")
    assert not actioncache.remember(world.cache, world.action, reads, world.published)


def test_a_layout_base_index_is_an_input_even_inside_the_cache(world: World) -> None:
    base = world.cache / "test-base" / "index.json"
    base.parent.mkdir()
    base.write_text('{"manifests": []}')
    published = actioncache.Published(
        world.published.fields, world.published.sink, world.layout, base_files=(base,)
    )
    with actioncache.recording() as reads:
        base.read_bytes()
    assert actioncache.remember(world.cache, world.action, reads, published)
    assert world.hit() is not None
    base.write_text('{"manifests": [1]}')  # the base layout's tag moved
    assert world.hit() is None


def test_servimg_code_is_in_the_key(tmp_path: Path) -> None:
    package = tmp_path / "servimg"
    package.mkdir()
    (package / "probe.py").write_text("x = 1\n")
    before = actioncache.code_sha256(package)
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "probe.cpython-312.pyc").write_bytes(b"\0")
    assert actioncache.code_sha256(package) == before  # bytecode caches are not code
    (package / "probe.py").write_text("x = 2\n")
    assert actioncache.code_sha256(package) != before


def _main(world: World, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(["build", "images/d.yaml", "--to", f"oci:{world.layout}", "--json", "--quiet"])
    return code, capsys.readouterr().out


def test_the_cli_replays_a_hit_without_building(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SERVIMG_CACHE", str(world.cache))
    action = actioncache.Action(Path("images/d.yaml"), f"oci:{world.layout}", "auto", None)
    world.action = action  # the key now holds SERVIMG_CACHE: record under it
    assert world.build()
    code, out = _main(world, capsys)
    assert code == 0
    assert json.loads(out) == {"status": "OK", "target": "images/d.yaml", **world.published.fields}
    (world.repo / "overlays" / "fix.patch").write_text("changed\n")
    code, out = _main(world, capsys)  # a miss builds: this definition cannot be
    assert code == 1 and json.loads(out)["status"] == "FAIL"


def test_a_build_that_cannot_be_recorded_is_still_a_build(world: World) -> None:
    """Recording runs after the image is published: whatever goes wrong there is a miss next time, never
    a failure now (fields JSON cannot hold; a working directory that is gone)."""
    odd = actioncache.Published({"digest": object()}, world.published.sink, world.layout)
    assert actioncache.remember(world.cache, world.action, actioncache.Reads(), odd) is False
    gone = world.repo / "gone"
    gone.mkdir()
    os.chdir(gone)
    gone.rmdir()
    assert actioncache.remember(world.cache, world.action, actioncache.Reads(), world.published) is False
    assert world.hit() is None
