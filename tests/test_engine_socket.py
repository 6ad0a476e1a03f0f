"""A `docker-daemon:` base read before is taken from the store after ONE plain API call on the engine's
unix socket (`GET /images/REF/json`: its image ID), without the SDK and its ping; anything else (another
ID, no such image, no socket) goes the SDK's way, with its errors. A stand-in engine answers on a unix
socket here (the real engine is exercised by every docker-marked build). What a `--to docker` sink asks
(ping, inspect, load, tag) goes over the real engine's socket without importing the SDK; a load the
engine refuses is an error that moves no tag; no socket is the SDK's way, with its error."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fakebase as fb
import standin_engine
from conftest import _require, docker_available
from servimg.backends import engine
from servimg.core.errors import BackendError
from servimg.oci.image import Image
from servimg.oci.store import BlobStore


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Image, BlobStore, list[str]]]:
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    store = BlobStore(tmp_path / ".base-store")  # make_base's store: it holds the layers
    store.put_bytes(base.image.manifest_bytes)
    store.put_bytes(base.image.config_bytes)
    seen: list[str] = []
    server = standin_engine.serve(tmp_path / "engine.sock", {"servimg/x:1": base.image.config_digest}, seen)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'engine.sock'}")
    monkeypatch.delenv("DOCKER_TLS_VERIFY", raising=False)
    try:
        yield base.image, store, seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_base_read_before_costs_one_plain_call(served: tuple[Image, BlobStore, list[str]]) -> None:
    image, store, seen = served
    # What the first read (`docker save`) leaves: the engine's image ID → the manifest digest.
    (store.root / "engine").mkdir()
    (store.root / "engine" / image.config_digest.hex).write_text(str(image.digest))
    assert engine.read_engine("servimg/x:1", store) == image
    assert seen == ["/images/servimg/x:1/json"], "no ping, no SDK: one call"


def test_anything_else_goes_the_sdks_way(served: tuple[Image, BlobStore, list[str]]) -> None:
    _, store, seen = served
    with pytest.raises(BackendError):  # the stand-in is no full engine: the SDK's ping is refused
        engine.read_engine("servimg/x:1", store)  # known ID, but never read into this store
    assert seen[0] == "/images/servimg/x:1/json" and len(seen) > 1, "then the SDK asked"
    seen.clear()
    with pytest.raises(BackendError):
        engine.read_engine("servimg/absent:1", store)
    assert seen[0] == "/images/servimg/absent:1/json"


# -- the sink's calls (inspect, load, tag, ping) on the real engine, without the SDK ------------------
_LOAD_WITHOUT_SDK = """
import json, sys
from pathlib import Path
from servimg.backends import engine
from servimg.core.digest import Digest
from servimg.oci.image import Image
from servimg.oci.store import BlobStore
store = BlobStore(Path(sys.argv[1]))
image = Image.parse(store.read(Digest.parse(sys.argv[2])), store.read(Digest.parse(sys.argv[3])))
engine.BACKEND.check_reachable(None)
how = engine.load(image, store, tag=sys.argv[4])
sdk = sorted(m for m in sys.modules if m.split(".")[0] in ("docker", "requests", "urllib3"))
print(json.dumps({"how": how, "sdk": sdk, "id": str(engine.image_id(sys.argv[4]))}))
"""


def _unique_base(root: Path, **options: Any) -> fb.Base:
    """A fake base no engine holds yet: its last layer carries a fresh name."""
    marker = fb.tar([fb.F(f"opt/{uuid.uuid4().hex}", b"x")])
    return fb.make_base(root, [fb.tar(fb.package_members()), marker], **options)


def _remove(name: str) -> None:
    subprocess.run(["docker", "rmi", "-f", name], capture_output=True, check=False)


@pytest.mark.docker
def test_a_load_and_its_tag_go_over_the_socket_without_the_sdk(tmp_path: Path) -> None:
    _require(docker_available(), "needs a running Docker Engine")
    base = _unique_base(tmp_path / "base")
    name = f"servimg-test/socket-load:{uuid.uuid4().hex[:12]}"
    store = tmp_path / ".base-store"
    BlobStore(store).put_bytes(base.image.manifest_bytes)
    BlobStore(store).put_bytes(base.image.config_bytes)
    try:
        argv = [store, base.image.digest, base.image.config_digest, name]
        proc = subprocess.run(
            [sys.executable, "-c", _LOAD_WITHOUT_SDK, *map(str, argv)], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        answer = json.loads(proc.stdout)
        assert answer == {"how": "full", "sdk": [], "id": str(base.image.config_digest)}
        assert engine.image_id(name) == base.image.config_digest, "the SDK sees the same tag"
    finally:
        _remove(name)


@pytest.mark.docker
def test_a_load_the_engine_refuses_is_an_error_and_moves_no_tag(tmp_path: Path) -> None:
    _require(docker_available(), "needs a running Docker Engine")
    honest = _unique_base(tmp_path / "honest")
    lying = fb.make_base(
        tmp_path / "base",
        [fb.tar(fb.package_members()), fb.tar([fb.F("opt/other", b"y")])],
        diff_ids=[honest.image.diff_ids[0], honest.image.diff_ids[1]],  # the second one lies
    )
    name = f"servimg-test/socket-refused:{uuid.uuid4().hex[:12]}"
    store = BlobStore(tmp_path / ".base-store")
    with pytest.raises(BackendError, match=r"docker load failed|did not produce image") as err:
        engine.load(lying.image, store, tag=name)
    assert "no tag was moved" in err.value.hint
    assert engine.image_id(name) is None


def test_no_socket_goes_the_sdks_way_with_its_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")
    with pytest.raises(BackendError, match="cannot reach the Docker Engine") as err:
        engine.BACKEND.check_reachable(None)  # type: ignore[arg-type]
    assert "--to oci:DIR" in err.value.hint
