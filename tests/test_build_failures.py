"""Failure semantics: every bad input gives one clear message and a non-zero exit, and leaves nothing
behind: no tag created or moved, no lock rewritten, no partial output directory (issue: build backbone §10).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import copy_checkout, docker
from servimg.cli import main
from servimg.definitions.definition import ImageDefinition

pytestmark = [pytest.mark.docker, pytest.mark.demo, pytest.mark.root]

DEMO = "images/demo.yaml"


@pytest.fixture
def repo(tmp_path: Path, demo_base: dict[str, Any]) -> Path:
    root = tmp_path / "repo"
    copy_checkout(root)
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def _repin(root: Path, patch: str) -> None:
    """Re-pin a patch's sha256 in the definition after editing it (so the failure is the intended one)."""
    digest = hashlib.sha256((root / patch).read_bytes()).hexdigest()
    text = (root / DEMO).read_text()
    text = re.sub(rf"(patch: {re.escape(patch)}\n\s+sha256: )[0-9a-f]{{64}}", rf"\g<1>{digest}", text)
    (root / DEMO).write_text(text)


def malformed_yaml(root: Path) -> None:
    (root / DEMO).write_text("name: demo\nbase: [unclosed\n")


def unknown_key(root: Path) -> None:
    _edit(root / DEMO, "packages:", "pakages_typo: {}\npackages:")


def duplicate_key(root: Path) -> None:
    _edit(root / DEMO, "repository:", "name: other\nrepository:")


def wrong_patch_sha(root: Path) -> None:
    with (root / "overlays/vllm/computed-tokens-gate.patch").open("ab") as fh:
        fh.write(b"\n")


def missing_base(root: Path) -> None:
    text = (root / DEMO).read_text()
    (root / DEMO).write_text(
        re.sub(r"ref: docker-daemon:\S+", "ref: docker-daemon:servimg/no-such-base:1", text)
    )


def base_digest_moved(root: Path) -> None:
    text = (root / DEMO).read_text()
    (root / DEMO).write_text(
        re.sub(r"digest: sha256:[0-9a-f]{64}", "digest: sha256:" + "0" * 64, text, count=1)
    )


def patch_does_not_apply(root: Path) -> None:
    patch = "overlays/vllm/computed-tokens-gate.patch"
    _edit(root / patch, " logger = init_logger(__name__)", " logger = init_logger(__name__)  # changed")
    _repin(root, patch)


def path_escape(root: Path) -> None:
    patch = "overlays/vllm/computed-tokens-gate.patch"
    text = (root / patch).read_text()
    text = text.replace("a/vllm/v1/core/sched/scheduler.py", "a/vllm/../../../../etc/passwd")
    (root / patch).write_text(
        text.replace("b/vllm/v1/core/sched/scheduler.py", "b/vllm/../../../../etc/passwd")
    )
    _repin(root, patch)


def interpreter_missing(root: Path) -> None:
    _edit(root / DEMO, "python: /opt/venv/bin/python", "python: /nope/bin/python")


def drifted_definition(root: Path) -> None:
    _edit(root / DEMO, "upstream: []", "upstream: [https://example.invalid/pull/1]")


CASES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    # name: (mutation, command, expected message fragment)
    "malformed-yaml": (malformed_yaml, "lock", "not valid YAML"),
    "unknown-key": (unknown_key, "lock", "pakages_typo: unknown key"),
    "duplicate-key": (duplicate_key, "lock", "duplicate key 'name'"),
    "wrong-patch-sha256": (wrong_patch_sha, "lock", "the definition pins"),
    "missing-base": (missing_base, "lock", "has no image"),
    "base-digest-moved": (base_digest_moved, "lock", "the definition pins sha256:000"),
    "patch-does-not-apply": (patch_does_not_apply, "lock", "hunk"),
    "path-escape": (path_escape, "lock", ".."),
    "interpreter-missing": (interpreter_missing, "lock", "interpreter /nope/bin/python not found"),
    "drift-needs-relock": (drifted_definition, "build", "drifted from the lock"),
}


def _tags(repository: str) -> list[str]:
    """Every tag of the repository with its image ID (sorted: equal creation times list in any order)."""
    return sorted(
        docker("images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}", repository).stdout.split("\n")
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_fails_clearly_and_leaves_nothing(
    case: str, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mutate, command, fragment = CASES[case]
    repository = ImageDefinition.load(repo / DEMO).repository
    lock_before = (repo / "images" / "demo.lock.json").read_bytes()
    tags_before = _tags(repository)
    mutate(repo)
    out_dir = repo / "out" / "demo"
    argv = [command, str(repo / DEMO)]
    if command == "build":
        argv += ["--to", f"oci:{out_dir}"]
    code = main(argv)
    printed = capsys.readouterr().out
    assert code == 1
    assert printed.startswith("FAIL: "), printed
    assert fragment in printed, printed
    assert "hint:" in printed, "every failure says what to do next"
    assert "Traceback" not in printed
    assert (repo / "images" / "demo.lock.json").read_bytes() == lock_before, "the lock was not rewritten"
    assert not out_dir.exists() and not list((repo / "out").glob("*")) if (repo / "out").exists() else True
    assert _tags(repository) == tags_before, "no tag created or moved"


@pytest.mark.registry
def test_unreachable_registry_fails_before_any_work(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["build", str(repo / DEMO), "--to", "127.0.0.1:1/servimg/vllm"])
    printed = capsys.readouterr().out
    assert code == 1 and printed.startswith("FAIL: ") and "hint:" in printed


def test_invalid_repository_name_is_refused_before_any_work(
    repo: Path, registry: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The distribution grammar refuses upper case; the error says so before anything is pushed."""
    code = main(["build", str(repo / DEMO), "--to", f"{registry.host}/UPPER/case"])
    printed = capsys.readouterr().out
    assert code == 1 and "FAIL" in printed
    assert registry.host in printed or "UPPER" in printed


def test_a_patch_that_does_not_compile_is_named_by_file_and_line(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A patched source the image's interpreter cannot compile fails the build with the file (as it lives in
    the image) and the line, not only the interpreter's message; nothing is written."""
    patch = "overlays/vllm/computed-tokens-gate.patch"
    _edit(repo / patch, "+def _servimg_check_computed_tokens(\n", "+def _servimg_check_computed_tokens\n")
    _repin(repo, patch)
    assert main(["lock", str(repo / DEMO)]) == 0, capsys.readouterr().out  # lock applies, never compiles
    capsys.readouterr()
    out_dir = repo / "out" / "demo"
    code = main(["build", str(repo / DEMO), "--to", f"oci:{out_dir}"])
    printed = capsys.readouterr().out
    assert code == 1 and printed.startswith("FAIL: ") and "failed to compile" in printed, printed
    assert re.search(r"/vllm/v1/core/sched/scheduler\.py:\d+: SyntaxError", printed), printed
    assert not out_dir.exists()
