"""A rebuild of an unchanged definition reuses the compiled bytecode (servimg.patching.resultcache): each
entry is keyed by every input that can change it, checked on read (a corrupt, edited or foreign entry is
ignored and written again), and the built digest never moves. No verdict is cached: every build runs the
whole probe.

On the fake base (tests/fakebase.py): the host's Python compiles (a runner that counts its runs)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import fakebase as fb
from servimg.assembly import pipeline
from servimg.assembly.context import Context
from servimg.assembly.plan import BuildPlan
from servimg.assembly.seams import Seams
from servimg.core import canonical
from servimg.core.digest import Digest, sha256_hex
from servimg.core.findings import Finding, Status
from servimg.oci.image import Image
from servimg.oci.store import BlobStore
from servimg.patching import resultcache
from servimg.patching.bytecode import CompileJob, InterpreterFacts
from servimg.proof.verify import VerifyReport


@dataclasses.dataclass
class CountingRunners:
    """RunnerChoice seam: the fake base's host runner, counting how often it really compiles."""

    runs: int = 0

    def choose(self, name: str, base: Image, fs: Any, store: Any) -> Any:
        outer = self

        class Counting(fb.FakeRunner):
            def run(self, jobs_dir: Path, interpreter: str) -> InterpreterFacts:
                outer.runs += 1
                return super().run(jobs_dir, interpreter)

        return Counting()


def _repo(tmp_path: Path) -> tuple[Path, BlobStore, CountingRunners, Seams]:
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    store = BlobStore(tmp_path / "cache")
    runners = CountingRunners()
    seams = dataclasses.replace(fb.FAKE_SEAMS, runners=runners)
    pipeline.lock(definition, Context(store, print, seams=seams), "auto")
    runners.runs = 0
    return definition, store, runners, seams


def _build(definition: Path, store: BlobStore, seams: Seams, out: Path) -> Digest:
    return pipeline.build(
        BuildPlan.make(definition, to=f"oci:{out}"), Context(store, print, seams=seams)
    ).digest


def _entries(store: BlobStore, kind: str) -> list[Path]:
    return sorted((store.root / "results" / kind).rglob("*.json"))


def test_an_unchanged_rebuild_compiles_nothing_and_builds_the_same_digest(tmp_path: Path) -> None:
    definition, store, runners, seams = _repo(tmp_path)
    first = _build(definition, store, seams, tmp_path / "a")
    assert runners.runs == 1 and len(_entries(store, resultcache.COMPILED)) == 1
    second = _build(definition, store, seams, tmp_path / "b")
    assert runners.runs == 1, "the second build took its pycs from the cache"
    assert second == first


def test_the_switch_makes_every_lookup_miss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    definition, store, runners, seams = _repo(tmp_path)
    first = _build(definition, store, seams, tmp_path / "a")
    monkeypatch.setenv(resultcache.OFF, "1")
    assert _build(definition, store, seams, tmp_path / "b") == first and runners.runs == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "edited pyc", "edited value", "foreign"])
def test_a_damaged_or_foreign_entry_is_ignored_and_written_again(tmp_path: Path, damage: str) -> None:
    definition, store, runners, seams = _repo(tmp_path)
    first = _build(definition, store, seams, tmp_path / "a")
    (entry,) = _entries(store, resultcache.COMPILED)
    good = entry.read_bytes()
    doc = json.loads(good)
    if damage == "garbage":
        entry.write_bytes(b"\x00not json")
    elif damage == "truncated":
        entry.write_bytes(good[: len(good) // 2])
    elif damage == "edited pyc":  # other bytes, value hash recomputed: only the pyc's own sha256 catches it
        item = doc["value"]["pycs"][0]
        item["data"] = "AAAA"
        doc["value_sha256"] = sha256_hex(canonical.dumps(doc["value"]))
        entry.write_bytes(json.dumps(doc).encode())
    elif damage == "edited value":
        doc["value"]["facts"]["version"] = "9.9.9"
        entry.write_bytes(json.dumps(doc).encode())
    else:  # another key's (valid) entry under this key's name
        doc["key"]["jobs"][0][1] = "0" * 64
        doc["value_sha256"] = sha256_hex(canonical.dumps(doc["value"]))
        entry.write_bytes(json.dumps(doc).encode())
    assert _build(definition, store, seams, tmp_path / "b") == first
    assert runners.runs == 2, f"{damage}: compiled again"
    assert entry.read_bytes() == good, "and the entry written whole again"


def test_the_compile_key_names_every_input() -> None:
    facts = InterpreterFacts("/usr/bin/python3.11", "3.11.2", "a70d0d0a", "cpython-311")
    jobs = [CompileJob("/site/a.py", b"x = 1\n", (0, 1)), CompileJob("/site/b.py", b"y = 2\n", (0,))]
    ids = [Digest.of_bytes(b"layer1"), Digest.of_bytes(b"layer2")]
    key = resultcache.compile_key(ids, "/usr/bin/python3", facts, "warm", jobs)
    assert resultcache.compile_key(ids, "/usr/bin/python3", facts, "warm", jobs[::-1]) == key, "job order"
    changed = [
        resultcache.compile_key(ids[::-1], "/usr/bin/python3", facts, "warm", jobs),
        resultcache.compile_key(ids[:1], "/usr/bin/python3", facts, "warm", jobs),
        resultcache.compile_key(ids, "/usr/bin/python3.11", facts, "warm", jobs),
        resultcache.compile_key(ids, "/usr/bin/python3", dataclasses.replace(facts, magic="x"), "warm", jobs),
        resultcache.compile_key(ids, "/usr/bin/python3", facts, "docker", jobs),
        resultcache.compile_key(
            ids, "/usr/bin/python3", facts, "warm", [jobs[0], CompileJob("/site/b.py", b"y = 3\n", (0,))]
        ),
        resultcache.compile_key(
            ids, "/usr/bin/python3", facts, "warm", [jobs[0], CompileJob("/site/b.py", b"y = 2\n", (0, 2))]
        ),
        resultcache.compile_key(
            ids, "/usr/bin/python3", facts, "warm", [jobs[0], CompileJob("/site/c.py", b"y = 2\n", (0,))]
        ),
    ]
    entries = {resultcache.entry_path(Path("/c"), resultcache.COMPILED, k) for k in [key, *changed]}
    assert len(entries) == 1 + len(changed)
    assert {"compile_script_sha256", "compile_args"} <= set(key)


def _built(tmp_path: Path) -> tuple[Image, BlobStore]:
    definition, store, _, seams = _repo(tmp_path)
    built = pipeline.build(
        BuildPlan.make(definition, to=f"oci:{tmp_path / 'a'}"), Context(store, print, seams=seams)
    )
    return built.images[0].image, store


def _passing(image: Image) -> VerifyReport:
    return VerifyReport((Finding("RECORD", Status.PASS, "tinypkg", "ok"),), image=str(image.digest))


def test_a_result_that_cannot_be_cached_is_still_the_result(tmp_path: Path) -> None:
    """A key canonical JSON cannot hold (a non-UTF-8 name) or an unwritable cache: no entry, no error."""
    odd = {"jobs": [["/site/\udcff.py", "0" * 64, [0]]]}
    assert resultcache.write(tmp_path, resultcache.COMPILED, odd, {"x": 1}) is False
    assert resultcache.read(tmp_path, resultcache.COMPILED, odd) is None
    blocked = tmp_path / "file"
    blocked.write_bytes(b"")
    assert resultcache.write(blocked, resultcache.COMPILED, {"a": 1}, {"x": 1}) is False


def test_inside_bypassed_every_lookup_misses(tmp_path: Path) -> None:
    """`servimg check --rebuild` rebuilds under `bypassed()`: it compiles again, whatever is cached."""
    definition, store, runners, seams = _repo(tmp_path)
    first = _build(definition, store, seams, tmp_path / "a")
    with resultcache.bypassed():
        assert _build(definition, store, seams, tmp_path / "b") == first
    # It compiles again, and asks the interpreter for its facts again: every kind of cached result goes
    # through cache.results, which bypassed() switches off.
    assert runners.runs == 3
    assert _build(definition, store, seams, tmp_path / "c") == first and runners.runs == 3
