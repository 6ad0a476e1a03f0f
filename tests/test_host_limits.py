"""A user's mistake or a machine's limit is a clear FAIL that names the path and the way out, never "a bug
in servimg", and nothing is left half-written (issue 48 item 6).

Every path argument of the commands that take one is given the wrong kind of thing (a file where a
directory belongs, a directory where a file belongs, a path under a file, a missing parent); then a real
small file system (an 6 MiB ext4 image, loop-mounted) fills in the middle of a write, as the cache
(`--cache`, what SERVIMG_CACHE names) and as an OCI layout destination; and the same file system
remounted read-only is written to. Real parts: the fake base (tests/fakebase.py: an OCI layout with a real
package tree), the real CLI, a real kernel file system.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import fakebase as fb
from conftest import _require

BUG = ("internal error", "bug in servimg", "Traceback")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = fb.main(argv)
    said = capsys.readouterr()
    return code, said.out + said.err


def refused(argv: list[str], path: Path | str, capsys: pytest.CaptureFixture[str], *words: str) -> str:
    code, said = run(argv, capsys)
    assert code == 1, said
    assert not any(b in said for b in BUG), said
    assert str(path) in said, said
    for word in words:
        assert word in said, said
    return said


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A locked definition on the fake base; returns the definition path."""
    definition = fb.make_repo(
        tmp_path / "repo", fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    )
    assert fb.main(["lock", str(definition), "--cache", str(tmp_path / "cache"), "--quiet"]) == 0
    return definition


def test_every_path_argument_of_the_wrong_kind_is_named_with_the_way_out(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    missing = tmp_path / "missing" / "deeper"
    cache = ["--cache", str(tmp_path / "cache")]
    lock_file = repo.with_name("tiny.lock.json")
    locked = lock_file.read_bytes()
    cases: list[tuple[list[str], Path, tuple[str, ...]]] = [
        (["key", "generate", "--out", str(a_file)], a_file, ("already exists",)),
        (
            ["key", "generate", "--out", str(a_file / "keys")],
            a_file / "keys",
            ("a file is where a directory",),
        ),
        (["cache", "status", "--cache", str(a_file)], a_file, ("a file is where a directory", "--cache")),
        (["lock", str(a_dir), *cache], a_dir, ()),
        (["lock", str(missing), *cache], missing, ()),
        (["build", str(repo), "--to", f"oci:{a_file}", *cache], a_file, ()),
        (["build", str(repo), "--to", f"oci:{a_file / 'layout'}", *cache], a_file, ("(a file)",)),
        (["overlay", "edit", str(repo), "tinypkg", "--dir", str(a_file), *cache], a_file, ()),
        (["check", f"oci:{a_file}", *cache], a_file, ()),
        (["vex", f"oci:{a_dir}", "--out", str(a_dir), *cache], a_dir, ()),
        (
            [
                "policy",
                "export",
                "--out",
                str(a_file),
                "--registry",
                "r:5000",
                "--kyverno",
                "--key",
                str(a_dir),
            ],
            a_dir,
            (),
        ),
        (
            ["attest", f"oci:{a_dir}", "--predicate-type", "test-result", "--file", str(a_dir), *cache],
            a_dir,
            (),
        ),
        (["init", "--base", f"oci:{a_file}", "--name", "x", *cache], a_file, ()),
    ]
    for argv, path, words in cases:
        refused(argv, path, capsys, *words)
    assert lock_file.read_bytes() == locked, "no lock was rewritten"
    assert a_file.read_text() == "not a directory\n" and not list(a_dir.iterdir()), "nothing written over"


# ------------------------------------------------------------------------------- a real small file system


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB ext4 file system, loop-mounted (root and a loop device needed: CI has both)."""
    _require(os.geteuid() == 0 and shutil.which("mkfs.ext4") is not None, "needs root and mkfs.ext4")
    image, mount = tmp_path / "small.img", tmp_path / "small"
    mount.mkdir()
    subprocess.run(["truncate", "-s", "6M", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    done = subprocess.run(["mount", "-o", "loop", str(image), str(mount)], capture_output=True, text=True)
    _require(done.returncode == 0, f"cannot loop-mount here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def _written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if "lost+found" not in p.parts)


def test_a_disk_that_fills_mid_write_is_named_and_leaves_nothing_half_written(
    tmp_path: Path, small_fs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A base whose one layer (8 MiB, incompressible) cannot fit: the write fails in the middle.
    big = fb.F("opt/weights.bin", os.urandom(8 * 2**20))
    base = fb.make_base(tmp_path / "base", [fb.tar([*fb.package_members(), big])])
    definition = fb.make_repo(tmp_path / "repo", base)
    assert fb.main(["lock", str(definition), "--cache", str(tmp_path / "cache"), "--quiet"]) == 0
    locked = definition.with_name("tiny.lock.json").read_bytes()

    # The destination fills: an OCI layout on the small file system.
    layout = small_fs / "layout"
    argv = ["build", str(definition), "--to", f"oci:{layout}", "--cache", str(tmp_path / "cache")]
    said = refused(argv, layout, capsys, "no space left", "servimg cache prune --max-size")
    assert _written(small_fs) == [], f"nothing half-written: {_written(small_fs)}"

    # The cache fills (--cache is what SERVIMG_CACHE names): the base cannot be ingested.
    cache = small_fs / "cache"
    said = refused(["lock", str(definition), "--cache", str(cache)], cache, capsys, "no space left")
    assert "writing the cache" in said and "SERVIMG_CACHE" in said
    leftovers = [p for p in _written(small_fs) if ".tmp" in p]
    assert leftovers == [], f"no partial blob stays: {leftovers}"
    assert definition.with_name("tiny.lock.json").read_bytes() == locked, "the lock was not rewritten"


def test_a_read_only_place_is_named(
    tmp_path: Path, small_fs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (small_fs / "keys").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    refused(
        ["key", "generate", "--out", str(small_fs / "new-keys")], small_fs / "new-keys", capsys, "read-only"
    )
    definition = fb.make_repo(
        tmp_path / "repo", fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    )
    cache = ["--cache", str(tmp_path / "cache")]
    assert fb.main(["lock", str(definition), *cache, "--quiet"]) == 0
    capsys.readouterr()
    refused(
        ["build", str(definition), "--to", f"oci:{small_fs / 'layout'}", *cache],
        small_fs,
        capsys,
        "read-only",
    )
    refused(["cache", "status", "--cache", str(small_fs / "cache")], small_fs / "cache", capsys, "read-only")
