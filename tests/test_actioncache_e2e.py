"""The action cache on a real build (the tiny test image on the cached bookworm test base, an OCI-layout
base inside the cache, the warm runner, the real probe): `servimg build` run again replays the same OK
line without building; an edited definition (one comment more), the destination removed and the base
layout's index changed each make it build again (never a replay of the old result)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import _require
from servimg.bases import catalog as bases
from servimg.builder import warmroot
from servimg.builder.pipeline import lock
from servimg.cli import main
from servimg.oci.store import BlobStore
from tinyimage import prepare_repo

pytestmark = [pytest.mark.root]

REPLAYED = "(action cache;"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    _require(warmroot.available(), "needs overlayfs in a private mount namespace")
    store = BlobStore()
    base = bases.build_base(bases.pinned_recipe("test-bookworm"), store, print, targets=[])
    root = tmp_path_factory.mktemp("actioncache") / "repo"
    path = prepare_repo(root, base)
    lock(path, store, print, runner="warm")
    yield path, base


def _build(
    path: Path, out: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    """(exit status, the OK/FAIL lines on stdout, the log on stderr: a replay says so there)."""
    monkeypatch.chdir(path.parent.parent)
    code = main(["build", "images/tiny.yaml", "--to", f"oci:{out}", "--runner", "warm"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _digest(out: str) -> str:
    return next(line.split()[1] for line in out.splitlines() if line.strip().startswith("digest:"))


def test_a_rebuild_replays_and_every_change_builds_again(
    tiny: tuple[Path, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SERVIMG_NO_RESULT_CACHE", raising=False)
    path, base = tiny
    out = tmp_path / "out"
    code, first, err = _build(path, out, capsys, monkeypatch)
    assert code == 0 and REPLAYED not in err, err
    code, again, err = _build(path, out, capsys, monkeypatch)
    assert code == 0 and REPLAYED in err and again == first, err

    text = path.read_text()
    path.write_text(text + "# a comment\n")  # another byte, the same definition: built, same image
    code, edited, err = _build(path, out, capsys, monkeypatch)
    assert code == 0 and REPLAYED not in err and "verified:" in err and _digest(edited) == _digest(first)
    code, same, err = _build(path, out, capsys, monkeypatch)  # unchanged since: replayed
    assert code == 0 and REPLAYED in err and same == edited, err

    shutil.rmtree(out)  # the destination no longer holds it: built again, same digest
    code, rebuilt, err = _build(path, out, capsys, monkeypatch)
    assert code == 0 and REPLAYED not in err and _digest(rebuilt) == _digest(first), err

    layout, _, tag = str(base["oci_ref"]).removeprefix("oci:").rpartition(":")
    index = Path(layout) / "index.json"
    saved = index.read_bytes()
    try:
        doc = json.loads(saved)
        for m in doc["manifests"]:
            if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == tag:
                m["annotations"]["org.opencontainers.image.ref.name"] = "moved-away"
        index.write_text(json.dumps(doc))  # the base layout's index changed: the build must look again
        code, moved, err = _build(path, out, capsys, monkeypatch)
        # …and decides (the layout still holds the pinned digest, which is what the build reads by)
        assert code == 0 and REPLAYED not in err and "verified:" in err and _digest(moved) == _digest(first)
    finally:
        index.write_bytes(saved)
