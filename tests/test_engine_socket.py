"""A `docker-daemon:` base read before is taken from the store after ONE plain API call on the engine's
unix socket (`GET /images/REF/json`: its image ID), without the SDK and its ping; anything else (another
ID, no such image, no socket) goes the SDK's way, with its errors. A stand-in engine answers on a unix
socket here (the real engine is exercised by every docker-marked build)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import fakebase as fb
import standin_engine
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
