"""`servimg overlay edit|save` (issue 29): author an overlay from an edited tree, like patch-package. On
the demo: edit vLLM's installed files (as the definition's overlays leave them), change one function of
the scheduler, save — an exact patch with a/ and b/ roots, added to the definition with a proposed
sentinel that the image's interpreter found absent in the base, locked — then build and verify: PASS,
the sentinel present in the loaded bytecode. A second save with nothing changed is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import copy_checkout, docker
from servimg.cli import main
from servimg.definitions.definition import ImageDefinition

pytestmark = [pytest.mark.docker, pytest.mark.demo, pytest.mark.root]
SCHEDULER = "vllm/v1/core/sched/scheduler.py"
DEF_LINE = "    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:\n"
ADDED = '        self._servimg_schedule_calls = getattr(self, "_servimg_schedule_calls", 0) + 1\n'


def run(*argv: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    main([*argv, "--json"])
    return dict(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))


def test_edit_change_save_build_verify(
    demo_base: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = tmp_path / "repo"
    copy_checkout(repo)
    definition, tree = repo / "images" / "demo.yaml", tmp_path / "edit"
    edited = run(
        "overlay", "edit", str(definition), "vllm", "--dir", str(tree), "--with-stack", capsys=capsys
    )
    stack = "vllm-cpu-mamba2-prefix-caching, vllm-computed-tokens-gate"
    assert edited["status"] == "OK" and edited["stack"] == stack, edited
    source = (tree / SCHEDULER).read_text()
    assert "_servimg_check_computed_tokens" in source, "the stack's overlay is in the edited tree"
    assert DEF_LINE in source
    (tree / SCHEDULER).write_text(source.replace(DEF_LINE, DEF_LINE + ADDED, 1))

    saved = run(
        "overlay", "save", str(definition), "vllm", "--dir", str(tree), "--id", "count-calls", capsys=capsys
    )
    assert saved["status"] == "OK", saved
    assert saved["sentinels"] == "vllm.v1.core.sched.scheduler:Scheduler.schedule:_servimg_schedule_calls"
    patch = (repo / "overlays" / "vllm" / "count-calls.patch").read_text()
    assert patch.startswith(f"--- a/{SCHEDULER}\n+++ b/{SCHEDULER}\n") and f"+{ADDED}" in patch
    overlay = ImageDefinition.load(definition).overlays[-1]
    assert overlay.id == "count-calls" and overlay.sentinels[0].absent_in_base
    lock = json.loads((repo / "images" / "demo.lock.json").read_text())
    key = "vllm.v1.core.sched.scheduler:Scheduler.schedule:name=_servimg_schedule_calls"
    assert lock["overlays"][-1]["sentinels_absent_in_base"] == [key], "absent in the base, checked at lock"

    built = run("build", str(definition), "--to", "docker", capsys=capsys)
    assert built["status"] == "OK", built
    verified = run("verify", built["config_digest"], capsys=capsys)
    assert verified["status"] == "OK", verified
    rows = [
        c for c in verified["checks"] if c["code"] == "SENTINEL" and "_servimg_schedule_calls" in c["message"]
    ]
    assert rows and rows[0]["status"] == "PASS", [c for c in verified["checks"] if c["code"] == "SENTINEL"]
    docker("rmi", f"servimg/vllm:{built['tag']}", check=False)

    again = run(
        "overlay", "save", str(definition), "vllm", "--dir", str(tree), "--id", "again", capsys=capsys
    )
    assert again["status"] == "FAIL" and "no change" in again["message"], again
    assert not (repo / "overlays" / "vllm" / "again.patch").exists()
