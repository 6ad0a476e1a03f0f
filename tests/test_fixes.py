"""Overlays say what they fix (issue 41): `fixes:` validated and carried into the lock and the signed
provenance; `servimg fixes` and `check --require-fix` prove a fix from this digest's trusted evidence only
(the overlay in the image's lock, a verified provenance naming its patch, a verified verify result that
passed its sentinels), and say what a proof lacks; a ladder receipt's witness shows where it ran.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fakebase as fb
import test_provenance as tp
from fakebase import on_host
from servimg.core import fixid
from servimg.core.digest import Digest
from servimg.core.errors import DefinitionError
from servimg.core.findings import FAIL, PASS, Finding, Status
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import Lock
from servimg.judging import check, fixes
from servimg.judging.policy import Policy, PolicyError
from servimg.reports.matrix import HEADERS, MatrixRow, ladder_runs
from servimg.signing import dsse
from servimg.statements import attest
from servimg.statements import derived as provenance
from servimg.statements.derived import ImageFacts, Invocation
from test_provenance import _envelope, _evidence, _found, _statement

FIX = "vllm-project/vllm#54505"


@pytest.fixture(scope="module")
def facts() -> ImageFacts:
    return tp.facts.__wrapped__()  # type: ignore[attr-defined, no-any-return]


@pytest.fixture(scope="module")
def image(facts: ImageFacts) -> Any:
    return tp.image.__wrapped__(facts)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def key() -> dsse.SigningKey:
    return dsse.SigningKey.generate()


OVERLAY = "vllm-cpu-mamba2-prefix-caching"


def test_fix_ids_are_one_of_the_accepted_forms() -> None:
    assert [fixid.kind(x) for x in (FIX, "CVE-2025-12345", "GHSA-2c2j-9gv5-cj73")] == [
        "upstream",
        "cve",
        "ghsa",
    ]
    for bad in ("vllm#1", "CVE-25-1", "GHSA-aaaa-bbbb-cccc", "https://github.com/a/b/pull/1", "a/b#0"):
        assert fixid.kind(bad) is None, bad
    assert fixid.is_advisory("CVE-2025-12345") and not fixid.is_advisory(FIX)


def test_a_malformed_fix_is_refused_with_the_accepted_forms() -> None:
    text = (Path(__file__).resolve().parent.parent / "images" / "demo.yaml").read_text()
    bad = text.replace("    fixes: [vllm-project/vllm#54505]", "    fixes: [PR-54505]", 1)
    assert bad != text
    with pytest.raises(DefinitionError) as refused:
        ImageDefinition.parse(bad.encode())
    assert any("'PR-54505' is not a fix id: use OWNER/REPO#NUMBER" in p for p in refused.value.problems)


def test_fixes_are_left_out_when_empty_and_carried_when_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A definition and a lock without fixes keep their bytes; with them, the lock carries them."""
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    cache = str(tmp_path / "cache")
    assert fb.main(["lock", str(definition), "--cache", cache, "--quiet"]) == 0
    lock_file = definition.with_name("tiny.lock.json")
    assert all("fixes" not in o for o in json.loads(lock_file.read_text())["overlays"])
    text = definition.read_text()
    with_fix = text.replace("    sha256:", f"    fixes: [{FIX}, CVE-2025-12345]\n    sha256:", 1)
    assert with_fix != text
    definition.write_text(with_fix)
    # Issue 48 item 4: a fix no sentinel can prove is refused where it is written, and nothing moves.
    before = lock_file.read_bytes()
    assert fb.main(["lock", str(definition), "--cache", cache]) == 1
    said = capsys.readouterr()
    assert "overlays[0].fixes: overlay 'tiny-fix' says it fixes" in said.out + said.err
    assert "has no sentinel to prove it by" in said.out + said.err
    assert lock_file.read_bytes() == before, "the lock was not rewritten"
    sentinel = "    sentinels: [{module: tinypkg.mod, qualname: answer, const: 42}]\n    sha256:"
    definition.write_text(with_fix.replace("    sha256:", sentinel, 1))
    assert fb.main(["lock", str(definition), "--cache", cache, "--quiet"]) == 0
    locked = Lock.load(lock_file)
    assert locked.overlays[0].fixes == (FIX, "CVE-2025-12345")
    assert "fixes" in ImageDefinition.load(definition).to_json()["overlays"][0]  # type: ignore[index]


def _with_fix(facts: ImageFacts) -> ImageFacts:
    overlays = tuple(
        dataclasses.replace(o, fixes=(FIX,)) if o.id == OVERLAY else o for o in facts.lock.overlays
    )
    return dataclasses.replace(facts, lock=dataclasses.replace(facts.lock, overlays=overlays))


class _Report:
    """A verify report whose SENTINEL rows passed (or not) for the overlay's sentinels."""

    def __init__(self, facts: ImageFacts, sentinel: Status) -> None:
        spec = next(o for o in facts.definition["overlays"] if o["id"] == OVERLAY)  # type: ignore[index, union-attr]
        subjects = {f"{s['module']}:{s['qualname']}" for s in spec["sentinels"]}  # type: ignore[index]
        rows = [Finding("SENTINEL", sentinel, subject, "m") for subject in sorted(subjects)]
        self.findings = (Finding("SOURCE_SHA", PASS, "m", "ok"), *rows)
        self.lock_digest = facts.lock.digest
        self.spec_sha256 = facts.spec_sha256
        self.audit = False
        self.interpreter = {"version": "3.11.2"}


def _signed(image: Any, facts: ImageFacts, signer: dsse.SigningKey, sentinel: Status = PASS) -> list[Any]:
    trusted = [signer.public_key] if signer is not None else []
    prov = provenance.provenance_predicate(facts, Invocation("id"), provenance.DEFAULT_BUILDER_ID)
    verify = provenance.verify_predicate(_Report(facts, sentinel), facts)  # type: ignore[arg-type]
    return [
        _found(_envelope(_statement(image, attest.PROVENANCE_V1, prov), signer), "provenance", trusted, 1),
        _found(
            _envelope(_statement(image, attest.TEST_RESULT_V01, verify), signer), "test-result", trusted, 2
        ),
    ]


def test_the_provenance_names_what_each_overlay_fixes(facts: ImageFacts) -> None:
    prov = provenance.provenance_predicate(_with_fix(facts), Invocation("id"), provenance.DEFAULT_BUILDER_ID)
    patches = provenance.provenance_dependencies(prov, provenance.ROLE_PATCH)
    by_overlay = {p["annotations"]["overlay"]: p["annotations"] for p in patches}  # type: ignore[index]
    assert by_overlay[OVERLAY]["fixes"] == [FIX]
    assert all("fixes" not in a for o, a in by_overlay.items() if o != OVERLAY)


def test_a_fix_is_proven_by_trusted_evidence_only(
    facts: ImageFacts,
    image: Any,
    key: dsse.SigningKey,
) -> None:
    fixed = _with_fix(facts)
    policy = Policy().merged(fixes=[FIX])
    ev = _evidence(image, fixed, _signed(image, fixed, key))
    (proof,) = fixes.prove(ev, check.accepted(policy, ev), fixes.carried(ev))
    assert proof.holds and proof.overlay == OVERLAY and proof.in_provenance, proof
    report = check.evaluate(policy, ev)
    rows = [r for r in report.findings if r.code == "FIX"]
    assert [r.status for r in rows] == [PASS] and FIX in rows[0].message, rows
    # The same statements signed by a key nobody trusts: the fix is not proven, and the row says why.
    other = dsse.SigningKey.generate()
    untrusted = _evidence(
        image, fixed, [dataclasses.replace(f, signature="untrusted") for f in _signed(image, fixed, other)]
    )
    failed = [r for r in check.evaluate(policy, untrusted).findings if r.code == "FIX"]
    assert failed[0].status == FAIL and "not proven" in failed[0].message, failed
    # A verify result whose sentinel FAILed: signed and trusted, but it does not prove the fix.
    missing = _evidence(image, fixed, _signed(image, fixed, key, sentinel=Status.FAIL))
    lacking = [r for r in check.evaluate(policy, missing).findings if r.code == "FIX"]
    assert lacking[0].status == FAIL and "no verified verify result passed sentinel" in lacking[0].message
    # A fix no overlay of this image carries.
    absent = check.evaluate(Policy().merged(fixes=["CVE-2025-99999"]), ev)
    (row,) = [r for r in absent.findings if r.code == "FIX"]
    assert row.status == FAIL and "no overlay of this image's lock says it fixes it" in row.message


def test_require_fix_refuses_a_malformed_id(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="is not a fix id"):
        Policy().merged(fixes=["PR-1"])
    policy = tmp_path / "p.yaml"
    policy.write_text("require_fixes: [vllm-project/vllm#54505, nope]\n")
    with pytest.raises(PolicyError) as refused:
        Policy.load(policy)
    assert any("'nope' is not a fix id" in p for p in refused.value.problems)
    policy.write_text(f"require_fixes: [{FIX}]\n")
    assert Policy.load(policy).fixes == (FIX,) and Policy.load(policy).to_json()["require_fixes"] == [FIX]


def test_a_ladder_receipt_says_which_sentinels_its_serving_processes_ran() -> None:
    receipt = (
        Path(__file__).resolve().parent.parent / "docs" / "receipts" / "cpu-hybrid-demo" / "receipt.json"
    )
    parsed = provenance.LadderReceipt.parse(receipt.read_bytes())
    assert "vllm.model_executor.layers.mamba.ops.cpu.mamba_ssm:_servimg_chunk_states_cpu" in parsed.witnessed
    doc = json.loads(receipt.read_text())
    config = provenance.Digest.parse(doc["image"]["config_digest"])
    predicate = provenance.ladder_predicate(parsed, config, config)
    annotations = provenance.test_config(predicate)["annotations"]  # type: ignore[index]
    assert "vllm.v1.core.sched.scheduler:_servimg_check_computed_tokens" in annotations["witnessed"]


def test_servimg_fixes_lists_each_fix_with_its_evidence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a real build pushed into an OCI layout with its signed attestations: `servimg fixes` proves the
    declared fix with the signer's key, and without it says the evidence is not counted (exit 1);
    `check --require-fix` agrees."""
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    text = definition.read_text().replace(
        "    sha256:",
        f"    fixes: [{FIX}]\n"
        "    sentinels: [{module: tinypkg.mod, qualname: f, name: _fixed, absent_in_base: false}]\n"
        "    sha256:",
        1,
    )
    definition.write_text(text)
    cache = str(tmp_path / "cache")
    built, pushed = f"oci:{tmp_path / 'built'}", f"oci:{tmp_path / 'pushed'}:v1"
    report = tmp_path / "verify.json"
    rows = [{"code": "SENTINEL", "status": "PASS", "subject": "tinypkg.mod:f", "message": "in 1 of 1"}]
    report.write_text(json.dumps({"checks": rows}))
    keys = tmp_path / "keys"
    for argv in (
        ["key", "generate", "--out", str(keys)],
        ["lock", str(definition)],
        ["build", str(definition), "--to", built],
        ["push", built, pushed, "--key", str(keys / "servimg.key"), "--report", str(report)],
    ):
        assert fb.main([*argv, "--cache", cache, "--quiet"]) == 0, argv
    capsys.readouterr()

    def run(*argv: str) -> tuple[int, dict[str, Any]]:
        code = fb.main([*argv, "--cache", cache, "--json"])
        return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    code, proven = run("fixes", pushed, "--key", str(keys / "servimg.pub"))
    assert code == 0 and proven["fixes"][0]["proven"] and proven["fixes"][0]["overlay"] == "tiny-fix", proven
    code, unkeyed = run("fixes", pushed)
    assert code == 1 and unkeyed["status"] == "FAIL" and FIX in unkeyed["message"], unkeyed
    capsys.readouterr()
    assert fb.main(["fixes", pushed, "--cache", cache]) == 1
    shown = capsys.readouterr().out
    assert "not counted: " in shown and "no trusted key was given" in shown, shown
    code, required = run("check", pushed, "--key", str(keys / "servimg.pub"), "--require-fix", FIX)
    assert code == 0 and any(
        r["what"] == f"fix {FIX}" and r["verdict"] == "PASS" for r in required["rows"]
    ), required
    code, other = run("check", pushed, "--key", str(keys / "servimg.pub"), "--require-fix", "CVE-2025-99999")
    assert code == 1, other


@pytest.mark.registry
def test_the_matrix_says_which_pairing_is_qualified_from_signed_evidence_without_a_layer(
    registry: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`servimg matrix HOST/REPO`: one row per digest (its tags together), the ladder run on it with the
    families and connector arms it covered, the fix its evidence proves — from signed statements only,
    and not one layer blob read from the registry; without the key, nothing counts and it FAILs."""
    from test_faults import FaultProxy

    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    definition.write_text(
        definition.read_text().replace(
            "    sha256:",
            f"    fixes: [{FIX}]\n"
            "    sentinels: [{module: tinypkg.mod, qualname: f, name: _fixed, absent_in_base: false}]\n"
            "    sha256:",
            1,
        )
    )
    cache = str(tmp_path / "cache")
    keys = tmp_path / "keys"
    report = tmp_path / "verify.json"
    rows = [{"code": "SENTINEL", "status": "PASS", "subject": "tinypkg.mod:f", "message": "in 1 of 1"}]
    report.write_text(json.dumps({"checks": rows}))
    with FaultProxy(registry.host) as proxy:
        repo = f"{proxy.host}/matrix/{tmp_path.name[-8:].lower().replace('_', '-')}"
        built = f"oci:{tmp_path / 'built'}"
        for argv in (
            ["key", "generate", "--out", str(keys)],
            ["lock", str(definition)],
            ["build", str(definition), "--to", built],
            ["push", built, f"{repo}:v1", "--key", str(keys / "servimg.key"), "--report", str(report)],
            ["push", built, f"{repo}:stable", "--key", str(keys / "servimg.key"), "--report", str(report)],
        ):
            assert fb.main([*argv, "--cache", cache, "--quiet"]) == 0, argv
        image = provenance_image(built, cache)
        receipt = tmp_path / "receipt.json"
        arm_args = ["--kv-transfer-config", '{"kv_connector": "LMCacheMPConnector"}']
        receipt.write_text(
            json.dumps(
                {
                    "ladder": "cpu-smoke",
                    "verdict": "PASS",
                    "image": {"digest": str(image.digest), "config_digest": str(image.config_digest)},
                    "arms": [
                        {
                            "id": "lmcache-cold",
                            "verdict": "PASS",
                            "spec": {"model_family": "gdn", "args": arm_args},
                        }
                    ],
                    "finished_at": "2026-12-04T00:00:00Z",
                }
            )
        )
        attest_argv = ["attest", f"{repo}:v1", "--predicate-type", "test-result", "--file", str(receipt)]
        assert fb.main([*attest_argv, "--key", str(keys / "servimg.key"), "--cache", cache, "--quiet"]) == 0
        layers = {str(d.digest) for d in image.layer_descriptors}
        before = len(proxy.log)
        capsys.readouterr()
        assert fb.main(["matrix", repo, "--key", str(keys / "servimg.pub"), "--cache", cache, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        requests = proxy.log[before:]
        read = [path for _, path, _ in requests if any(layer in path for layer in layers)]
        assert not read, f"the matrix read layer blobs: {read}"
        # Issue 48 item 7: each statement is read once, whatever number of formats carry it (a referrer's
        # envelope and the `.att` layer are one blob), and nothing addressed by digest is fetched twice.
        by_digest = Counter(path for method, path, _ in requests if method == "GET" and "sha256:" in path)
        assert [p for p, n in by_digest.items() if n > 1] == [], by_digest
        assert not any(method == "GET" and ".sig" in path for method, path, _ in requests), "no .sig read"
        capsys.readouterr()
        assert fb.main(["matrix", repo, "--cache", cache, "--markdown"]) == 1, "no key: nothing counts"
        assert "none counted" in capsys.readouterr().out
    (row,) = doc["rows"]
    assert row["digest"] == str(image.digest) and row["tags"] == ["stable", "v1"], row
    (run,) = row["ladders"]
    assert (run["ladder"], run["verdict"], run["families"], run["connector_arms"], run["device"]) == (
        "cpu-smoke",
        "PASS",
        ["gdn"],
        ["lmcache-cold"],
        "cpu",
    )
    assert row["fixes_proven"] == [FIX] and doc["qualified"] == 1


def provenance_image(layout: str, cache: str) -> Any:
    from servimg.backends import transport
    from servimg.oci.store import BlobStore

    return transport.fetch(layout, on_host(BlobStore(Path(cache)), lambda _: None))


def test_the_matrix_reads_an_oci_layout_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`servimg matrix oci:DIR`: each tagged image of a layout, its manifest and config hashed, its
    attestations from the layout, no layer read; without the key nothing counts and it FAILs."""
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    cache, keys = str(tmp_path / "cache"), tmp_path / "keys"
    report = tmp_path / "verify.json"
    report.write_text(
        json.dumps({"checks": [{"code": "SOURCE", "status": "PASS", "subject": "s", "message": "m"}]})
    )
    built, pushed = f"oci:{tmp_path / 'built'}", tmp_path / "pushed"
    for argv in (
        ["key", "generate", "--out", str(keys)],
        ["lock", str(definition)],
        ["build", str(definition), "--to", built],
        ["push", built, f"oci:{pushed}:v1", "--key", str(keys / "servimg.key"), "--report", str(report)],
        ["push", built, f"oci:{pushed}:stable", "--key", str(keys / "servimg.key"), "--report", str(report)],
    ):
        assert fb.main([*argv, "--cache", cache, "--quiet"]) == 0, argv
    image = provenance_image(built, cache)
    for layer in image.layer_descriptors:  # the matrix must not need them
        (pushed / "blobs" / "sha256" / layer.digest.hex).unlink()
    capsys.readouterr()
    assert (
        fb.main(["matrix", f"oci:{pushed}", "--key", str(keys / "servimg.pub"), "--cache", cache, "--json"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (row,) = doc["rows"]
    assert (
        row["digest"] == str(image.digest)
        and row["tags"] == ["stable", "v1"]
        and row["signed_attestations"] >= 2
    )
    assert row["ladders"] == [] and doc["qualified"] == 0, "no ladder ran: not qualified, and said so"
    assert fb.main(["matrix", f"oci:{pushed}", "--cache", cache]) == 1


RECEIPTS = Path(__file__).resolve().parent.parent / "docs" / "receipts"


def _connector_run(receipt_file: str) -> Any:
    """The matrix's view of a kept connector-ladder receipt, through the test-result a push attaches."""
    receipt = provenance.LadderReceipt.parse((RECEIPTS / receipt_file).read_bytes())
    config = Digest.parse(receipt.image_digests[-1])
    (run,) = ladder_runs([provenance.ladder_predicate(receipt, config, config)])
    return run


def test_the_matrix_says_which_pairing_corrupts_with_a_connector() -> None:
    """Issue 47 item 7, from the kept receipts of the connector ladder (docs/ladder.md): the seed base
    (vllm-cpu 0.26.0) failed its three connector arms on the GDN hybrid, the seed image passed them."""

    def row(run: Any) -> MatrixRow:
        return MatrixRow("sha256:" + "0" * 64, ("t",), "linux/amd64", "vllm-cpu 0.26.0", "lmcache 0.5.2",
                         (run,), (), 1, 0)  # fmt: skip

    unfixed, fixed = (
        _connector_run("cpu-connector-seed-base.json"),
        _connector_run("cpu-connector-seed-image.json"),
    )
    assert (unfixed.verdict, unfixed.families) == ("FAIL", ("gdn",))
    assert unfixed.connector_failed == ("connector-cold", "connector-warm", "connector-restart")
    assert (fixed.verdict, fixed.connector_failed) == ("PASS", ())
    headers = ["families", "connector"]

    def cells(r: MatrixRow) -> list[str]:
        return [r.cells()[HEADERS.index(h)] for h in headers]

    assert cells(row(unfixed)) == ["GDN hybrid (FAIL)", "FAIL 3/3 arms"]
    assert cells(row(fixed)) == ["GDN hybrid", "PASS"]
    assert not row(unfixed).qualified and row(fixed).qualified
