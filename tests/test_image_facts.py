"""Facts about the image come from the image (issue 29): whether the base's code already holds an
`absent_in_base` sentinel is answered by the image's own interpreter, like compile and probe. A base
newer than the host (here: a module with Python 3.12 syntax, which the host's 3.11 cannot compile) locks
when the image's interpreter is 3.12, and the host's compiler is never asked.

The "image" is tests/fakebase.py's fake base with a runner seam that runs another Python of this machine
(pyenv's 3.12 or later) as the image's interpreter: nothing of servimg is patched.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import sys
from pathlib import Path

import pytest

import fakebase as fb
from conftest import _require

NEWER = sorted(glob.glob("/root/.pyenv/versions/3.1[2-9]*/bin/python3"))
# PEP 695 (3.12): a SyntaxError for the host's 3.11 compiler.
BASE_MOD = b"type Ticket = int\n\n\nclass Scheduler:\n    def schedule(self):\n        return 41\n"
PATCH = (
    b"--- a/tinypkg/mod.py\n+++ b/tinypkg/mod.py\n"
    b"@@ -3,4 +3,4 @@\n \n class Scheduler:\n     def schedule(self):\n-        return 41\n"
    b"+        return _servimg_gate(41)\n"
)
SENTINEL_KEY = "tinypkg.mod:Scheduler.schedule:name=_servimg_gate"


def _repo(root: Path) -> Path:
    members = [
        fb.M(m.name, m.type, BASE_MOD, m.mode) if m.name.endswith("tinypkg/mod.py") else m
        for m in fb.package_members()
    ]
    base = fb.make_base(root / "base", [fb.tar(members)])
    definition = fb.make_repo(root / "repo", base, patch=PATCH)
    text = definition.read_text().replace(
        "    sha256:",
        "    sentinels:\n"
        "      - {module: tinypkg.mod, qualname: Scheduler.schedule, name: _servimg_gate,"
        " absent_in_base: true}\n    sha256:",
    )
    definition.write_text(text)
    return definition


def test_absent_in_base_is_decided_by_the_images_interpreter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sys.version_info < (3, 12), "the point: the host cannot compile what the image can"
    _require(bool(NEWER), "needs a Python newer than the host's (pyenv's 3.12+ on these machines)")
    definition = _repo(tmp_path)
    image_python = dataclasses.replace(fb.FAKE_SEAMS, runners=fb.HostRunners(NEWER[-1]))
    cache = str(tmp_path / "cache")
    assert fb.main(["lock", str(definition), "--cache", cache, "--json"], seams=image_python) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["status"] == "OK", out
    lock = json.loads(definition.with_suffix("").with_suffix(".lock.json").read_text())
    assert lock["overlays"][0]["sentinels_absent_in_base"] == [SENTINEL_KEY]
    assert lock["interpreter"]["version"].startswith("3.1") and lock["interpreter"]["version"] >= "3.12"

    # The same lock asked of the host's own compiler would fail; through a 3.11 "image" it fails the
    # same way, naming the module and the interpreter: the answer always comes from the image.
    fb.main(["lock", str(definition), "--cache", str(tmp_path / "other-cache"), "--json"])
    failed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert failed["status"] == "FAIL", failed
    assert "cannot compile the base's module(s)" in failed["message"], failed
    assert any(p.startswith("tinypkg.mod: SyntaxError") for p in failed["problems"]), failed
    assert hashlib.sha256(PATCH).hexdigest() in definition.read_text()
