"""Bases are pure functions of pinned inputs: proof on the real bootstrap (root, mmdebstrap, faketime).

1. The demo base (the serving base: Debian 12 + vLLM for CPU + LMCache, 181 wheels), built in another
   process under another clock (libfaketime, days ahead, reaching into the chroot), umask, time zone,
   locale, HOME, cache directory and working directory, has exactly the digest pinned in verify/bases (and
   images/demo.yaml); a drift fails with the file-level report.
2. The test can fail: with the clamps disabled, the same shifted clock changes the tree (the shadow day
   written by passwd's maintainer script inside the chroot is the faked day).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from fakebase import on_host
from servimg.bases import catalog as bases
from servimg.bases import debian, debpins
from servimg.bases import pinned as basepin
from servimg.bases.assemble import base_image
from servimg.bases.demo import tree_manifest
from servimg.definitions.definition import ImageDefinition
from servimg.oci.store import BlobStore

pytestmark = [pytest.mark.demo, pytest.mark.root]

FAKETIME = debian.FaketimeClock("+0d").path
needs_build = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mmdebstrap") is None or not Path(FAKETIME).is_file(),
    reason="needs root, mmdebstrap and faketime",
)

BUILD = """
import json, sys
from servimg.bases import catalog as bases
from servimg.bases import debian
from servimg.assembly.context import Context
from servimg.assembly.defaults import default_seams, probe_host
from servimg.oci.store import BlobStore
clock = debian.FaketimeClock(sys.argv[2]) if sys.argv[2] != "-" else debian.SystemClock()
ctx = Context(BlobStore(), print, seams=default_seams(probe_host()))
result = bases.build_base(sys.argv[1], ctx, targets=[], clock=clock)
print("RESULT " + json.dumps(result))
"""


def _seed_cache(shared: BlobStore, fresh: Path) -> None:
    """A new cache directory that already holds the pinned downloads (hard links): nothing to fetch."""
    for sub in ("debs", "wheels"):
        source, dest = shared.root / sub, fresh / sub
        dest.mkdir(parents=True)
        for path in source.glob("*") if source.is_dir() else ():
            if path.is_file() and not path.name.startswith("."):
                try:
                    os.link(path, dest / path.name)
                except OSError:
                    shutil.copyfile(path, dest / path.name)


def _build_elsewhere(tmp_path: Path, base: str, shift: str | None) -> dict[str, Any]:
    """Build `base` in a child process that differs from this one in everything the host can vary
    (with `shift`, also the clock)."""
    cache = tmp_path / "another cache"
    _seed_cache(BlobStore(), cache)
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "SERVIMG_CACHE": str(cache),
        "TZ": "Pacific/Chatham",
        "LANG": "de_DE.UTF-8",
        "LC_ALL": "de_DE.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    if shift is not None:
        # The builder itself runs under the shifted clock too, not only the processes it starts.
        env.update(debian.FaketimeClock(shift).env())
    proc = subprocess.run(
        [sys.executable, "-c", BUILD, base, shift or "-"],
        cwd=cwd,
        env=env,
        umask=0o077,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    shutil.rmtree(cache, ignore_errors=True)  # gigabytes for the demo base
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line.removeprefix("RESULT ")))


@needs_build
def test_demo_base_under_another_clock_umask_tz_locale_home_cache_and_cwd_has_the_pinned_digest(
    tmp_path: Path, demo_base: dict[str, Any]
) -> None:
    pinned = basepin.load("demo")
    assert pinned is not None
    started = time.monotonic()
    shifted = _build_elsewhere(tmp_path, "demo", "+23d")
    print(f"demo base under +23d: {time.monotonic() - started:.0f}s, {shifted['digest']}")
    assert shifted["digest"] == str(pinned.digest) == demo_base["digest"]
    assert str(ImageDefinition.load(REPO / "images/demo.yaml").base.digest) == shifted["digest"]


@needs_build
def test_without_the_clamps_the_shifted_clock_reaches_the_tree(tmp_path: Path) -> None:
    """Proof that the test above could fail: the faked clock reaches maintainer scripts in the chroot."""
    pins = debpins.load_pins("test-bookworm")
    shift_days = 40
    clock = debian.FaketimeClock(f"+{shift_days}d")
    epoch = bases.pinned_recipe("test-bookworm").source_date_epoch
    cache = BlobStore().root / "debs"
    raw, clamped = tmp_path / "raw", tmp_path / "clamped"
    today = int(time.time()) // 86400
    debian.build_rootfs(pins, raw, cache, debian.BuildOptions(epoch, clock, neutralise=False), lambda _: None)
    debian.build_rootfs(pins, clamped, cache, debian.BuildOptions(epoch, clock), lambda _: None)

    raw_day = int((raw / "etc/shadow").read_text().split("\n")[0].split(":")[2])
    assert raw_day in (today + shift_days, today + shift_days + 1), "the faked day reached passwd's postinst"
    assert (clamped / "etc/shadow").read_text().split("\n")[0].split(":")[2] == str(epoch // 86400)
    a, b = tree_manifest(raw), tree_manifest(clamped)
    differing = [p for p in sorted(a.keys() | b.keys()) if a.get(p) != b.get(p)]
    assert "etc/shadow" in differing and "etc/apt/sources.list" in differing
    assert len(differing) > 100, "mtimes and the timestamp pycs differ without the clamps"


@needs_build
def test_test_bases_have_their_pinned_digests() -> None:
    store = BlobStore()
    for suite in ("bookworm", "trixie"):
        image = base_image(bases.pinned_recipe(f"test-{suite}"), on_host(store, lambda _: None))
        pinned = basepin.load(f"test-{suite}")
        assert pinned is not None and image.digest == pinned.digest
