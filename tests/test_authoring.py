"""`servimg overlay edit|save|drop` (issues 29, 40): author an overlay from an edited tree, like
patch-package. On the demo: edit vLLM's installed files (as the definition's overlays leave them), change
one function of the scheduler, save — an exact patch with a/ and b/ roots, added to the definition with a
proposed sentinel that the image's interpreter found absent in the base, locked — then build and verify:
PASS, the sentinel present in the loaded bytecode. A second save with nothing changed is refused; an
edit that does not compile is refused with its file and line, nothing written; an overlay another one
depends on cannot be dropped; dropping them in order gives back exactly the lock of before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import copy_checkout, docker
from servimg.cli import main
from servimg.definitions.definition import PLACEHOLDER_DESCRIPTION, ImageDefinition

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
    lock_file = repo / "images" / "demo.lock.json"
    first = {p: p.read_bytes() for p in (definition, lock_file)}
    edited = run(
        "overlay", "edit", str(definition), "vllm", "--dir", str(tree), "--with-stack", capsys=capsys
    )
    stack = "vllm-cpu-mamba2-prefix-caching, vllm-computed-tokens-gate"
    assert edited["status"] == "OK" and edited["stack"] == stack, edited
    source = (tree / SCHEDULER).read_text()
    assert "_servimg_check_computed_tokens" in source, "the stack's overlay is in the edited tree"
    assert DEF_LINE in source
    (tree / SCHEDULER).write_text(source.replace(DEF_LINE, DEF_LINE + ADDED, 1))

    # Without --description: saved with the placeholder, not locked; lock and build refuse it until the
    # description says what the overlay fixes.
    saved = run(
        "overlay", "save", str(definition), "vllm", "--dir", str(tree), "--id", "count-calls", capsys=capsys
    )
    assert saved["status"] == "OK" and "placeholder" in saved["lock"], saved
    for command in (["lock", str(definition)], ["build", str(definition), "--to", "docker"]):
        refused = run(*command, capsys=capsys)
        assert refused["status"] == "FAIL" and "placeholder description" in refused["message"], refused
    text = definition.read_text()
    assert PLACEHOLDER_DESCRIPTION in text
    definition.write_text(text.replace(PLACEHOLDER_DESCRIPTION, "counts the scheduler's calls (a test)"))
    assert run("lock", str(definition), capsys=capsys)["status"] == "OK"
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

    # An edit that does not compile: refused with its file, line and message; nothing is written.
    kept = {p: p.read_bytes() for p in (definition, lock_file)}
    source = (tree / SCHEDULER).read_text()
    line = source[: source.index(DEF_LINE)].count("\n") + 1
    (tree / SCHEDULER).write_text(source.replace(DEF_LINE, DEF_LINE.replace(":\n", "\n"), 1))
    broken = run(
        "overlay", "save", str(definition), "vllm", "--dir", str(tree), "--id", "broken", capsys=capsys
    )
    assert broken["status"] == "FAIL" and "do not compile" in broken["message"], broken
    assert any(p.startswith(f"{tree / SCHEDULER}:{line}: SyntaxError") for p in broken["problems"]), broken
    assert not (repo / "overlays" / "vllm" / "broken.patch").exists()
    assert {p: p.read_bytes() for p in kept} == kept, "nothing written"
    (tree / SCHEDULER).write_text(source)

    # A second overlay whose hunk's context is the first one's line: the first cannot be dropped alone.
    more = "        self._servimg_schedule_more = True\n"
    (tree / SCHEDULER).write_text(source.replace(ADDED, ADDED + more, 1))
    # Issue 48: an id in use names the way out; a malformed fix id says what is allowed. Nothing written.
    taken = run(
        "overlay", "save", str(definition), "vllm", "--dir", str(tree), "--id", "count-calls", capsys=capsys
    )
    assert taken["status"] == "FAIL" and f"servimg overlay drop {definition} count-calls" in taken["hint"]
    bad = run(
        "overlay",
        "save",
        str(definition),
        "vllm",
        "--dir",
        str(tree),
        "--id",
        "more",
        "--description",
        "d",
        "--fixes",
        "GHSA-0000-1111-aaaa",
        capsys=capsys,
    )
    assert bad["status"] == "FAIL" and "23456789cfghjmpqrvwx" in bad["problems"][0], bad
    assert {p: p.read_bytes() for p in kept} == kept and not (repo / "overlays/vllm/more.patch").exists()
    saved_more = run(
        "overlay",
        "save",
        str(definition),
        "vllm",
        "--dir",
        str(tree),
        "--id",
        "more",
        "--description",
        "sets a second attribute (a test)",
        "--fixes",
        "vllm-project/vllm#99999",
        "--upstream",
        "https://github.com/vllm-project/vllm/pull/99999",
        capsys=capsys,
    )
    assert saved_more["status"] == "OK", saved_more
    entry = ImageDefinition.load(definition).overlays[-1]
    assert entry.fixes == ("vllm-project/vllm#99999",), "written by save: no YAML edited by hand"
    assert entry.upstream == ("https://github.com/vllm-project/vllm/pull/99999",)
    assert json.loads(lock_file.read_text())["overlays"][-1]["fixes"] == ["vllm-project/vllm#99999"]
    kept = {p: p.read_bytes() for p in (definition, lock_file)}
    refused = run("overlay", "drop", str(definition), "count-calls", capsys=capsys)
    assert refused["status"] == "FAIL" and "no longer applies without it" in refused["message"], refused
    assert {p: p.read_bytes() for p in kept} == kept and (repo / "overlays/vllm/count-calls.patch").exists()
    unknown = run("overlay", "drop", str(definition), "no-such", capsys=capsys)
    assert unknown["status"] == "FAIL" and "vllm-computed-tokens-gate" in unknown["hint"], unknown

    # Dropped in order (the dependent first): the definition and the lock are exactly as before the saves.
    for overlay_id in ("more", "count-calls"):
        dropped = run("overlay", "drop", str(definition), overlay_id, capsys=capsys)
        assert dropped["status"] == "OK", dropped
        assert not (repo / "overlays" / "vllm" / f"{overlay_id}.patch").exists()
    assert {p: p.read_bytes() for p in first} == first, "drop undoes save, byte for byte"
