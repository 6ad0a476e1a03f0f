"""Bytes are proven, not trusted (docs/reliability.md, "Integrity at rest"): a layout shares no inode with
the blob store, a write re-hashes what it keeps and mends what does not match, verify and check name a
blob that does not match its digest, and `servimg cache verify` finds (and `--repair` removes) corruption
in the store.

The builds are the real CLI over a fake base (tests/fakebase.py: the host's Python stands in for the
base's interpreter; nothing of servimg is patched). Corruption is what a tool that writes in place does:
one byte of a blob overwritten with `open(p, "r+b")`, the size unchanged.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

import fakebase as fb
from servimg.core.digest import Digest
from servimg.oci.integrity import rehash
from servimg.oci.store import BlobStore


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Any]:
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    cache = tmp_path / "cache"
    assert fb.main(["lock", str(definition), "--cache", str(cache), "--quiet"]) == 0
    return {"root": tmp_path, "definition": definition, "cache": cache, "store": BlobStore(cache)}


def build(world: dict[str, Any], layout: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out = json_of(world, "build", str(world["definition"]), "--to", f"oci:{layout}", capsys=capsys)
    assert out["status"] == "OK", out
    return out


def json_of(world: dict[str, Any], *argv: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    fb.main([*argv, "--cache", str(world["cache"]), "--json"])
    lines = capsys.readouterr().out.strip().splitlines()
    return dict(json.loads(lines[-1]))


def top_blob(layout: Path) -> Path:
    index = json.loads((layout / "index.json").read_bytes())
    manifest = json.loads((layout / "blobs" / "sha256" / index["manifests"][0]["digest"][7:]).read_bytes())
    return layout / "blobs" / "sha256" / manifest["layers"][-1]["digest"][7:]


def flip_in_place(path: Path) -> None:
    """What a tool that writes in place does: same file, same size, one byte changed."""
    with path.open("r+b") as fh:
        fh.seek(path.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x8B]))


def test_a_layout_shares_no_inode_with_the_store_and_has_the_modes_other_tools_write(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    layout = world["root"] / "out"
    build(world, layout, capsys)
    store: BlobStore = world["store"]
    blobs = sorted((layout / "blobs" / "sha256").iterdir())
    assert blobs
    for blob in blobs:
        st = blob.stat()
        assert stat.S_IMODE(st.st_mode) == 0o644, blob
        assert st.st_nlink == 1, f"{blob.name[:12]} is hard-linked"
        cached = store.path(Digest("sha256", blob.name))
        if cached.exists():
            assert cached.stat().st_ino != st.st_ino
        assert rehash(blob)[0].hex == blob.name
    for directory in (layout, layout / "blobs", layout / "blobs" / "sha256"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755, directory
    assert stat.S_IMODE((layout / "index.json").stat().st_mode) == 0o644


def test_a_blob_written_in_place_is_found_named_and_mended(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = world["root"] / "first", world["root"] / "second"
    build(world, first, capsys)
    build(world, second, capsys)
    corrupt = top_blob(first)
    digest = Digest("sha256", corrupt.name)
    flip_in_place(corrupt)

    # The store and the other layout keep their bytes: nothing is shared.
    store: BlobStore = world["store"]
    assert rehash(store.path(digest))[0] == digest
    assert rehash(top_blob(second))[0] == digest

    # verify and check of the corrupted layout FAIL and name the blob (before any probe runs).
    for command in ("verify", "check"):
        out = json_of(world, command, f"oci:{first}", capsys=capsys)
        assert out["status"] == "FAIL", out
        assert str(digest) in out["message"] and "does not match its digest" in out["message"], out

    # The next build into that layout mends it, and says so.
    mended = json_of(world, "build", str(world["definition"]), "--to", f"oci:{first}", capsys=capsys)
    assert mended["status"] == "OK", mended
    assert f"mended 1 corrupt blob(s): {digest}" in mended["destination"], mended
    assert rehash(corrupt)[0] == digest

    # Mended, the next build there has nothing to mend.
    again = json_of(world, "build", str(world["definition"]), "--to", f"oci:{first}", capsys=capsys)
    assert "mended" not in again["destination"], again


def test_a_replaced_small_blob_is_mended_too(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    layout = world["root"] / "out"
    built = build(world, layout, capsys)
    config = layout / "blobs" / "sha256" / str(built["config_digest"]).removeprefix("sha256:")
    config.write_bytes(b"{}")  # another writer's bytes under the config's name
    out = json_of(world, "build", str(world["definition"]), "--to", f"oci:{layout}", capsys=capsys)
    assert f"mended 1 corrupt blob(s): {built['config_digest']}" in out["destination"], out
    assert rehash(config)[0] == Digest.parse(str(built["config_digest"]))


def test_cache_verify_names_a_corrupt_blob_and_repair_removes_it(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    layout = world["root"] / "out"
    build(world, layout, capsys)
    healthy = json_of(world, "cache", "verify", capsys=capsys)
    assert healthy["status"] == "OK" and healthy["corrupt"] == 0 and healthy["checked"] > 0, healthy

    store: BlobStore = world["store"]
    digest = Digest("sha256", top_blob(layout).name)
    flip_in_place(store.path(digest))
    found = json_of(world, "cache", "verify", capsys=capsys)
    assert found["status"] == "FAIL" and found["message"].startswith("1 of "), found
    assert any(p.startswith(f"blobs/{digest}: ") for p in found["problems"]), found
    assert "--repair" in found["hint"]
    assert store.path(digest).exists(), "without --repair nothing is removed"

    repaired = json_of(world, "cache", "verify", "--repair", capsys=capsys)
    assert repaired["status"] == "OK" and repaired["removed"] == 1, repaired
    assert not store.path(digest).exists()
    assert json_of(world, "cache", "verify", capsys=capsys)["corrupt"] == 0


def test_a_corrupt_store_blob_is_never_handed_to_a_new_layout(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's bytes are hashed on their way out: a fresh layout never receives a blob that does
    not match its name (the failure names the blob and evicts it; the next build writes it anew)."""
    first = world["root"] / "first"
    build(world, first, capsys)
    store: BlobStore = world["store"]
    digest = Digest("sha256", top_blob(first).name)
    flip_in_place(store.path(digest))
    monkeypatch.setenv("SERVIMG_NO_RESULT_CACHE", "1")  # a build that does all its work
    fresh = world["root"] / "fresh"
    out = json_of(world, "build", str(world["definition"]), "--to", f"oci:{fresh}", capsys=capsys)
    assert out["status"] == "FAIL", out
    assert str(digest) in out["message"] and "does not match its name" in out["message"], out
    assert not fresh.exists(), "no half-written layout"
    assert not store.path(digest).exists(), "the bad copy is evicted"
    assert (
        build(world, fresh, capsys)["digest"]
        == json_of(world, "build", str(world["definition"]), "--to", f"oci:{first}", capsys=capsys)["digest"]
    )
    assert rehash(top_blob(fresh))[0] == digest
