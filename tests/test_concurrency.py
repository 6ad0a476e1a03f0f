"""Concurrency and interruption (docs/reliability.md): builds in parallel processes sharing one cache (and one
output layout) never corrupt it or lose a tag; a build interrupted by SIGINT or SIGKILL at a chosen
point leaves a cache the next build accepts, and a blob truncated under its valid name is repaired.

The builds are real `servimg` CLI processes (tests/fakebase.py as the entry point: the CLI with the
host's Python standing in for the fake base's interpreter). Interruption points are made deterministic
with FAKEBASE_STALL: the process freezes there and writes a marker; the test then sends the signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import fakebase as fb
from servimg.backends.layout import REF_NAME


def _shared_layer() -> bytes:
    """A few MB that both bases carry (gzip'd): concurrent builds write the same blob and diff."""
    block = os.urandom(4096)
    return fb.tar([fb.D("opt"), fb.F("opt/shared.bin", block * 1500)])


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two definitions over two different bases that share a large gzip'd layer, locked."""
    root = tmp_path_factory.mktemp("repos")
    shared = _shared_layer()
    out: dict[str, Path] = {}
    for name, mode in (("alpha", 0o644), ("beta", 0o755)):
        layers = [shared, fb.tar(fb.package_members(mod_mode=mode))]
        base = fb.make_base(root / f"base-{name}", layers, gzip_layers=[True, False])
        out[name] = fb.make_repo(root / name, base, name=name)
        _cli("lock", str(out[name]), "--cache", str(root / "lock-cache"), "--quiet").check_returncode()
    return out


_env, _popen, _cli = fb.cli_env, fb.cli_popen, fb.cli_run


def _build(definition: Path, out: Path, cache: Path, **env: str) -> subprocess.Popen[str]:
    return _popen("build", str(definition), "--to", f"oci:{out}", "--cache", str(cache), "--json", **env)


def _result(proc: subprocess.Popen[str]) -> dict[str, str]:
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stdout + stderr
    result: dict[str, str] = json.loads(stdout.strip().splitlines()[-1])
    return result


def _strays(cache: Path) -> list[str]:
    return sorted(
        str(p.relative_to(cache)) for p in cache.rglob("*") if p.name.startswith(".") or ".partial" in p.name
    )


def _reference(repos: dict[str, Path], tmp_path: Path) -> dict[str, str]:
    """The digests each definition builds to, alone, in a cache of its own."""
    return {
        name: _result(_build(d, tmp_path / f"ref-{name}", tmp_path / f"ref-cache-{name}"))["digest"]
        for name, d in repos.items()
    }


def test_parallel_builds_share_one_cache_and_one_layout(repos: dict[str, Path], tmp_path: Path) -> None:
    expected = _reference(repos, tmp_path)
    cache, out = tmp_path / "cache", tmp_path / "out" / "all"
    # alpha twice (same lock: same layer file names, same blobs) and beta, all at once.
    procs = [_build(repos[name], out, cache) for name in ("alpha", "beta", "alpha")]
    results = [_result(p) for p in procs]
    assert [r["digest"] for r in results] == [expected["alpha"], expected["beta"], expected["alpha"]]
    assert fb.cache_is_sound(cache) == []
    assert _strays(cache) == [], "no temp file left behind by a completed build"
    index = fb.read_json(out / "index.json")
    tagged = {m["annotations"][REF_NAME]: m["digest"] for m in index["manifests"]}
    assert sorted(tagged.values()) == sorted({expected["alpha"], expected["beta"]}), "no tag lost"
    for digest in tagged.values():
        manifest = fb.read_json(out / "blobs" / digest.replace(":", "/"))
        for desc in [manifest["config"], *manifest["layers"]]:
            assert (out / "blobs" / desc["digest"].replace(":", "/")).stat().st_size == desc["size"]


# Where a build can be frozen and killed: inside a blob write, inside a diff (decompression) write,
# while writing the overlay layer, and while publishing the output layout.
STALLS = {
    "blob-write": "writer:blobs",
    "diff-write": "writer:diffs",
    "layer-write": "layer",
    "layout-publish": "publish",
}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
@pytest.mark.parametrize("where", sorted(STALLS))
def test_an_interrupted_build_leaves_a_cache_the_next_build_accepts(
    where: str, sig: signal.Signals, repos: dict[str, Path], tmp_path: Path
) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out" / "alpha"
    marker = tmp_path / "stalled"
    proc = _build(repos["alpha"], out, cache, FAKEBASE_STALL=STALLS[where], FAKEBASE_MARKER=str(marker))
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the build never reached the stall point"
        time.sleep(0.02)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    if sig == signal.SIGINT:
        assert proc.returncode == 130, stdout + stderr
        assert "interrupted; nothing was published" in stderr
        assert _strays(cache) == [], "SIGINT cleans its temp files up"
    else:
        assert proc.returncode == -signal.SIGKILL
    assert not out.exists(), "nothing published, no tag"
    assert fb.cache_is_sound(cache) == [], "never a corrupt blob under a valid name"
    again = _result(_build(repos["alpha"], out, cache))
    assert (
        again["digest"] == _result(_build(repos["alpha"], tmp_path / "ref", tmp_path / "ref-cache"))["digest"]
    )
    assert fb.cache_is_sound(cache) == []


def test_a_blob_truncated_under_its_name_is_repaired(repos: dict[str, Path], tmp_path: Path) -> None:
    """What a crash without fsync (power loss) can leave: the right name, too few bytes."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    first = _result(_build(repos["alpha"], out / "one", cache))
    base = fb.Base(repos["alpha"].parents[2] / "base-alpha", None)  # type: ignore[arg-type]
    index = fb.read_json(base.layout / "index.json")
    manifest = fb.read_json(base.layout / "blobs" / index["manifests"][0]["digest"].replace(":", "/"))
    for desc in manifest["layers"]:
        path = cache / "blobs" / desc["digest"].replace(":", "/")
        path.write_bytes(path.read_bytes()[: desc["size"] // 2])
    assert fb.cache_is_sound(cache) != []
    again = _result(_build(repos["alpha"], out / "two", cache))
    assert again["digest"] == first["digest"]
    assert fb.cache_is_sound(cache) == [], "the truncated blobs were fetched again"
