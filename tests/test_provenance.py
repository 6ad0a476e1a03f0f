"""Provenance statements, the check policy, the card and keys, as pure functions (no engine, no registry).

The same code paths run for real in tests/test_tamper.py; here each verdict and reason is pinned on
synthetic evidence so that a change of wording or logic shows up in milliseconds.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from fakebase import HOST_SEAMS
from servimg.assembly.context import Context
from servimg.backends.target import Target
from servimg.core.digest import Digest, sha256_hex
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import Lock
from servimg.judging import check, evidence
from servimg.judging.check import FAIL, PASS, WARN, Policy, evaluate
from servimg.judging.evidence import Evidence, Located, found_from
from servimg.judging.policy import PolicyError
from servimg.oci.image import OCI_LAYER, Descriptor, Image, Layer
from servimg.oci.layer import Entry, Kind, write_layer
from servimg.reports.card import card, diff
from servimg.signing import dsse, keys
from servimg.statements import attest
from servimg.statements import derived as provenance
from servimg.statements.derived import ChangedFile, ImageFacts, Invocation, LadderReceipt, ProvenanceError

SCHEDULER = "/opt/venv/lib/python3.11/site-packages/vllm/v1/core/sched/scheduler.py"


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def facts() -> ImageFacts:
    lock = Lock.load(REPO / "images" / "demo.lock.json")
    definition = ImageDefinition.load(REPO / "images" / "demo.yaml").to_json()
    changes = (ChangedFile(SCHEDULER, "a" * 64, 0o644), ChangedFile(SCHEDULER + "c", None, 0o644))
    return ImageFacts(lock, definition, "d" * 64, changes, "c" * 64, "e" * 64, "f" * 64)


@pytest.fixture(scope="module")
def image(facts: ImageFacts) -> Image:
    diff_id = Digest.of_bytes(b"layer")
    labels = {
        check.BASE_LABEL: str(facts.lock.base.manifest_digest),
        check.LOCK_LABEL: str(facts.lock.digest),
    }
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": [str(diff_id)]},
    }
    return Image.create(config, [Layer(Descriptor(OCI_LAYER, diff_id, 5), diff_id)])


@pytest.fixture(scope="module")
def key() -> dsse.SigningKey:
    return dsse.SigningKey.generate()


class _Report:
    """The fields of a VerifyReport the test-result needs."""

    def __init__(self, facts: ImageFacts, statuses: tuple[str, ...] = ("PASS", "PASS", "WARN")) -> None:
        from servimg.core.findings import Finding, Status

        self.findings = tuple(Finding("SOURCE_SHA", Status(s), f"m{i}", "ok") for i, s in enumerate(statuses))
        self.lock_digest: Digest | None = facts.lock.digest
        self.spec_sha256 = facts.spec_sha256
        self.audit = False
        self.interpreter = {"version": "3.11.2"}


# The store a failure before any read never reaches.
NO_STORE = Context(None, print, seams=HOST_SEAMS)  # type: ignore[arg-type]


def _statement(
    image: Image, predicate_type: str, predicate: dict[str, Any], other: Image | None = None
) -> bytes:
    target = other or image
    return attest.statement(
        provenance.subjects("servimg/vllm", target.digest, target.config_digest), predicate_type, predicate
    )


def _envelope(statement: bytes, key: dsse.SigningKey | None) -> bytes:
    if key is None:
        return dsse.Envelope(attest.PAYLOAD_TYPE, statement, ()).to_bytes()
    return attest.sign_statement(statement, key).to_bytes()


def _found(envelope: bytes, kind: str, trusted: list[dsse.VerifyKey], n: int = 0) -> evidence.Found:
    descriptor = {"digest": f"sha256:{n:064x}", "artifactType": attest.artifact_type(kind)}
    return found_from(descriptor, "fallback tag", lambda _: envelope, trusted, 1)


def _evidence(image: Image, facts: ImageFacts, found: list[evidence.Found], **more: Any) -> Evidence:
    ref = "reg.invalid/servimg/vllm:t"
    located = Located(ref, Target.parse(ref), image, "reg.invalid", "servimg/vllm")
    return Evidence(located, tuple(found), "fallback tag", facts, None, facts.changes, (), 1, **more)


def _clean(image: Image, facts: ImageFacts, key: dsse.SigningKey) -> list[evidence.Found]:
    trusted = [key.public_key]
    prov = provenance.provenance_predicate(facts, Invocation("id"), provenance.DEFAULT_BUILDER_ID)
    verify = provenance.verify_predicate(_Report(facts), facts)
    return [
        _found(_envelope(_statement(image, attest.PROVENANCE_V1, prov), key), "provenance", trusted, 1),
        _found(_envelope(_statement(image, attest.TEST_RESULT_V01, verify), key), "test-result", trusted, 2),
    ]


def _fails(report: check.CheckReport) -> list[str]:
    return [f"{r.subject}: {r.message}" for r in report.findings if r.status == FAIL]


# ------------------------------------------------------------------------------------------------ statements


def test_provenance_pins_every_input_and_validates(facts: ImageFacts, image: Image) -> None:
    p = provenance.provenance_predicate(
        facts, Invocation("inv-1", command=("servimg", "push")), "https://b/1"
    )
    parsed = attest.parse_statement(_statement(image, attest.PROVENANCE_V1, p))
    assert parsed.covers(image.digest) and parsed.covers(image.config_digest)
    build = p["buildDefinition"]
    assert build["externalParameters"] == facts.definition
    roles = [provenance.role_of(d) for d in build["resolvedDependencies"]]
    assert roles.count("patch") == len(facts.lock.overlays) == 3
    assert roles.count("dist") == len(facts.lock.packages)
    assert {"base-manifest", "base-config", "probe", "probe-spec"} <= set(roles)
    assert provenance.provenance_byproducts(p) == facts.changes
    assert p["runDetails"]["metadata"] == {"invocationId": "inv-1"}, "no time nobody measured"
    assert (
        provenance.provenance_predicate(
            facts, Invocation("inv-1", command=("servimg", "push")), "https://b/1"
        )
        == p
    )


def test_builder_id_is_overridable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert provenance.builder_id() == provenance.DEFAULT_BUILDER_ID
    monkeypatch.setenv(provenance.BUILDER_ENV, "https://ci.example/builder")
    assert provenance.builder_id() == "https://ci.example/builder"
    assert provenance.builder_id("https://x/y") == "https://x/y"


def test_verify_result_is_about_this_image_only(facts: ImageFacts) -> None:
    p = provenance.verify_predicate(_Report(facts), facts)
    assert p["result"] == "WARNED" and provenance.is_verify_result(p)
    foreign = _Report(facts)
    foreign.lock_digest = Digest("sha256", "9" * 64)
    with pytest.raises(ProvenanceError, match="not about this image"):
        provenance.verify_predicate(foreign, facts)


@pytest.mark.parametrize(
    ("verdict", "arms", "result"),
    [
        ("PASS", [], "PASSED"),
        ("PASS", [{"id": "control"}, {"id": "warm", "verdict": "PASS"}], "PASSED"),
        ("FAIL", [{"id": "warm", "verdict": "FAIL"}], "FAILED"),
        ("NOT_EXERCISED", [], "FAILED"),
        ("PASS", [{"id": "cold", "verdict": "NOT_EXERCISED"}], "FAILED"),  # inconsistent: fail closed
    ],
)
def test_ladder_receipts(image: Image, verdict: str, arms: list[dict[str, str]], result: str) -> None:
    data = json.dumps({"ladder": "smoke", "verdict": verdict, "arms": arms}).encode()
    p = provenance.ladder_predicate(LadderReceipt.parse(data), image.digest, image.config_digest)
    assert p["result"] == result
    assert provenance.ladder_name(p) == "smoke"
    assert provenance.sha256_of(provenance.test_config(p) or {}) == sha256_hex(data)


def test_ladder_receipt_refusals(image: Image) -> None:
    with pytest.raises(ProvenanceError, match="not a ladder receipt"):
        LadderReceipt.parse(b'{"verdict": "MAYBE"}')
    body = {"ladder": {"name": "s"}, "verdict": "FAIL"}
    sealed = {**body, "sha256": sha256_hex(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())}
    assert LadderReceipt.parse(json.dumps(sealed).encode()).verdict == "FAIL"
    with pytest.raises(ProvenanceError, match="edited after sealing"):
        LadderReceipt.parse(json.dumps({**sealed, "verdict": "PASS"}).encode())
    other = json.dumps(
        {"ladder": {"name": "s"}, "verdict": "PASS", "image": {"digest": "sha256:" + "1" * 64}}
    )
    with pytest.raises(ProvenanceError, match="not this image"):
        provenance.ladder_predicate(LadderReceipt.parse(other.encode()), image.digest, image.config_digest)


def test_changes_are_re_derived_from_the_layer(tmp_path: Path) -> None:
    entries = [
        Entry("opt/venv/x.py", Kind.FILE, 0o644, data=b"x = 1\n"),
        Entry("opt/venv/__pycache__/x.cpython-311.pyc", Kind.WHITEOUT),
        Entry("opt/servimg/lock.json", Kind.FILE, 0o644, data=b"{}"),
        Entry("opt/venv", Kind.DIR, 0o755),
        Entry("var/lib/servimg/witness", Kind.DIR, 0o1777),  # created empty: listed, as the manifest does
    ]
    write_layer(entries, tmp_path / "layer.tar", mtime=0)
    assert provenance.layer_changes(tmp_path / "layer.tar") == (
        ChangedFile("/opt/venv/__pycache__/x.cpython-311.pyc", None, 0o644, provenance.DELETED),
        ChangedFile("/opt/venv/x.py", sha256_hex(b"x = 1\n"), 0o644, provenance.FILE),
        ChangedFile("/var/lib/servimg/witness", None, 0o1777, provenance.DIRECTORY),
    )


def test_a_created_directory_is_no_deletion_and_old_attestations_still_read() -> None:
    """The manifest names each entry's kind: the witness dir the layer creates is a directory in the
    card, the check rows and the attestation (only a deletion is annotated `deleted`); an attestation
    made before kinds were recorded (a directory annotated `deleted`, no kind) still reads and agrees."""
    manifest = [
        {"path": "/opt/venv/x.py", "kind": "file", "mode": 0o644, "sha256": "a" * 64},
        {"path": "/opt/venv/y.pyc", "kind": "whiteout", "mode": 0o644, "sha256": None},
        {"path": "/var/lib/servimg/witness", "kind": "dir", "mode": 0o1777, "sha256": None},
    ]
    changes = provenance.parse_changes(manifest)
    assert [c.kind for c in changes] == [provenance.FILE, provenance.DELETED, provenance.DIRECTORY]
    assert [c.describe() for c in changes[1:]] == ["deleted", "directory"]
    assert [ChangedFile.from_json(c.to_json(), "x") for c in changes] == list(changes)
    entries = [attest.changed_file(c.path, c.sha256, c.mode, c.kind) for c in changes]
    assert entries[2]["annotations"] == {"mode": "1777", "kind": "directory"}, "a directory is not deleted"
    assert entries[1]["annotations"] == {"mode": "0644", "kind": "deleted", "deleted": True}
    predicate = {
        "runDetails": {
            "byproducts": [
                {**e, "annotations": {**e["annotations"], "role": "changed-file"}} for e in entries
            ]
        }
    }
    assert provenance.provenance_byproducts(predicate) == changes
    # Before kinds: the directory was written as a deletion. It reads back without a kind, and a
    # comparison with the image's manifest sees no difference (the key has no kind; kinds are compared
    # only where both sides recorded one).
    legacy = [attest.changed_file(c.path, c.sha256, c.mode) for c in changes]
    assert legacy[2]["annotations"] == {"mode": "1777", "deleted": True}
    old = provenance.provenance_byproducts(
        {
            "runDetails": {
                "byproducts": [
                    {**e, "annotations": {**e["annotations"], "role": "changed-file"}} for e in legacy
                ]
            }
        }
    )
    assert [c.kind for c in old] == [None, None, None]
    assert [c.key() for c in old] == [c.key() for c in changes]
    assert not any(a.kind_differs(b) for a, b in zip(old, changes, strict=True))
    assert changes[1].kind_differs(changes[2]) is True


def test_a_changes_manifest_of_another_format_is_named_and_refused() -> None:
    with pytest.raises(ProvenanceError, match="format 2; this servimg reads format 1") as caught:
        provenance.parse_changes({"format": 2, "changes": []})
    assert "newer servimg" in caught.value.hint
    with pytest.raises(ProvenanceError, match=r"changes.json\[0\] is malformed"):
        provenance.parse_changes([{"path": "/x", "kind": "teleport", "mode": 0, "sha256": None}])


# ------------------------------------------------------------------------------------------------ policy


def test_clean_evidence_passes(facts: ImageFacts, image: Image, key: dsse.SigningKey) -> None:
    clean = _evidence(image, facts, _clean(image, facts, key))
    # servimg's placeholder builder id, trusted only because nobody named a builder: a WARN that says so.
    by_default = evaluate(Policy(), clean)
    (builder,) = [r for r in by_default.findings if r.subject == "builder"]
    assert by_default.ok and builder.status == WARN and "placeholder" in builder.message, builder
    report = evaluate(Policy().merged(builders=[provenance.DEFAULT_BUILDER_ID]), clean)
    assert report.ok, _fails(report)
    (builder,) = [r for r in report.findings if r.subject == "builder"]
    assert builder.message.endswith("is trusted (by --builder)"), builder
    assert len(report.used) == 2
    assert {r.subject for r in report.findings if r.status == PASS} >= {
        "provenance",
        "builder",
        "base digest",
        "patches",
        "dists",
        "probe",
        "changed files",
        "verify",
    }


# Signed by a trusted key and about this image, but wrong: the verdict FAILs with its reason.
JUDGED = [
    ("builder", "builder https://evil.invalid/b is not trusted"),
    ("patch", "overlay vllm-cpu-mamba2-prefix-caching: provenance sha256:"),
    ("byproducts", "/planted.pyc is in the provenance, not in the image's manifest"),
    ("verify-failed", "verify FAILED: SOURCE_SHA m1"),
]
# Evidence that does not verify (cosign's rule): reported and ignored, never a verdict either way.
IGNORED = [
    ("forged", "signature claims trusted key"),
    ("unsigned", "unsigned envelope, no signature to verify"),
    ("other-subject", "the statement is about"),
    (
        "wrong-type",
        "artifactType application/vnd.in-toto.provenance+dsse but the statement is a test-result",
    ),
]


@pytest.mark.parametrize(("tamper", "reason"), JUDGED + IGNORED)
def test_each_tamper_is_reported_with_its_reason(
    facts: ImageFacts, image: Image, key: dsse.SigningKey, tamper: str, reason: str
) -> None:
    trusted = [key.public_key]
    prov = provenance.provenance_predicate(facts, Invocation("id"), provenance.DEFAULT_BUILDER_ID)
    verify = provenance.verify_predicate(_Report(facts), facts)
    other = Image.create({"config": {}, "rootfs": {"type": "layers", "diff_ids": []}}, [])
    builders: dict[str, Callable[[], evidence.Found]] = {
        "forged": lambda: _found(
            _forge(_envelope(_statement(image, attest.PROVENANCE_V1, prov), key)), "provenance", trusted
        ),
        "unsigned": lambda: _found(
            _envelope(_statement(image, attest.PROVENANCE_V1, prov), None), "provenance", trusted
        ),
        "other-subject": lambda: _found(
            _envelope(_statement(image, attest.PROVENANCE_V1, prov, other), key), "provenance", trusted
        ),
        "builder": lambda: _found(
            _envelope(
                _statement(image, attest.PROVENANCE_V1, _with_builder(prov, "https://evil.invalid/b")), key
            ),
            "provenance",
            trusted,
        ),
        "patch": lambda: _found(
            _envelope(_statement(image, attest.PROVENANCE_V1, _with_patch(facts)), key), "provenance", trusted
        ),
        "byproducts": lambda: _found(
            _envelope(_statement(image, attest.PROVENANCE_V1, _with_extra_file(facts)), key),
            "provenance",
            trusted,
        ),
        "verify-failed": lambda: _found(
            _envelope(
                _statement(
                    image,
                    attest.TEST_RESULT_V01,
                    provenance.verify_predicate(_Report(facts, ("PASS", "FAIL")), facts),
                ),
                key,
            ),
            "test-result",
            trusted,
        ),
        "wrong-type": lambda: _found(
            _envelope(_statement(image, attest.TEST_RESULT_V01, verify), key), "provenance", trusted
        ),
    }
    found = [*_clean(image, facts, key), builders[tamper]()]
    report = evaluate(Policy(), _evidence(image, facts, found))
    if (tamper, reason) in JUDGED:
        assert not report.ok
        assert any(reason in line for line in _fails(report)), _fails(report)
        return
    # Beside the signed evidence, what does not verify is a WARN ("ignored: …"), and the check passes.
    assert report.ok, _fails(report)
    warned = [f.message for f in report.findings if f.status == WARN]
    assert any(reason in m and m.startswith("ignored: ") and m.endswith("not counted") for m in warned), (
        warned
    )
    # Alone, it proves nothing: the requirements fail for want of verified evidence, not because of it;
    # the FAIL line says why what was found did not count (issue 40: a wrong key is the first reason).
    alone = evaluate(Policy(), _evidence(image, facts, [builders[tamper]()]))
    fails = _fails(alone)
    assert not alone.ok and all("no verified" in line for line in fails), fails
    assert any(reason in line.partition("not counted: ")[2] for line in fails), fails


def test_unsigned_forbid_fails_an_unsigned_envelope(
    facts: ImageFacts, image: Image, key: dsse.SigningKey, tmp_path: Path
) -> None:
    prov = provenance.provenance_predicate(facts, Invocation("id"), provenance.DEFAULT_BUILDER_ID)
    unsigned = _found(_envelope(_statement(image, attest.PROVENANCE_V1, prov), None), "provenance", [])
    found = [*_clean(image, facts, key), unsigned]
    assert evaluate(Policy(), _evidence(image, facts, found)).ok
    strict = tmp_path / "strict.yaml"
    strict.write_text("unsigned: forbid\n")
    report = evaluate(Policy.load(strict), _evidence(image, facts, found))
    assert not report.ok
    assert any("the policy forbids unsigned evidence (unsigned: forbid)" in m for m in _fails(report))
    assert not any("--allow-unsigned" in m for m in _fails(report)), "the hint never lowers the bar"
    both = tmp_path / "both.yaml"
    both.write_text("unsigned: forbid\nallow_unsigned: true\n")
    with pytest.raises(PolicyError, match="1 problem"):
        Policy.load(both)


def _forge(envelope: bytes) -> bytes:
    parsed = dsse.Envelope.parse(envelope)
    altered = parsed.payload.replace(b"servimg.invalid/builder", b"servimg.invalid/b-forged")
    return dsse.Envelope(parsed.payload_type, altered, parsed.signatures).to_bytes()


def _with_builder(p: dict[str, Any], builder: str) -> dict[str, Any]:
    return {**p, "runDetails": {**p["runDetails"], "builder": {"id": builder}}}


def _with_patch(facts: ImageFacts) -> dict[str, Any]:
    first = replace(facts.lock.overlays[0], patch_sha256="0" * 64)
    lock = replace(facts.lock, overlays=(first, *facts.lock.overlays[1:]))
    return provenance.provenance_predicate(
        replace(facts, lock=lock), Invocation("id"), provenance.DEFAULT_BUILDER_ID
    )


def _with_extra_file(facts: ImageFacts) -> dict[str, Any]:
    changes = (*facts.changes, ChangedFile("/planted.pyc", "b" * 64, 0o644))
    return provenance.provenance_predicate(
        replace(facts, changes=changes), Invocation("id"), provenance.DEFAULT_BUILDER_ID
    )


def test_an_untrusted_signer_is_reported_and_not_counted(
    facts: ImageFacts, image: Image, key: dsse.SigningKey
) -> None:
    """Stale attestations by another key (an old run's key, another team's CI) sit beside the trusted
    ones in the registry: they are a WARN each and never decide the verdict, either way."""
    trusted = [key.public_key]
    prov = provenance.provenance_predicate(facts, Invocation("id"), provenance.DEFAULT_BUILDER_ID)
    stranger = _envelope(_statement(image, attest.PROVENANCE_V1, prov), dsse.SigningKey.generate())
    beside = evaluate(
        Policy(),
        _evidence(image, facts, [*_clean(image, facts, key), _found(stranger, "provenance", trusted)]),
    )
    assert beside.ok, _fails(beside)
    warned = [r.message for r in beside.findings if r.status == WARN]
    assert any("signed by a key that is not trusted" in m and m.endswith("not counted") for m in warned), (
        warned
    )
    alone = evaluate(Policy(), _evidence(image, facts, [_found(stranger, "provenance", trusted)]))
    assert not alone.ok
    assert any(line.startswith("provenance:") for line in _fails(alone)), _fails(alone)


def test_unsigned_mode_reports_but_accepts(facts: ImageFacts, image: Image, key: dsse.SigningKey) -> None:
    unsigned = [
        _found(
            _envelope(
                _statement(
                    image,
                    attest.PROVENANCE_V1,
                    provenance.provenance_predicate(facts, Invocation("i"), provenance.DEFAULT_BUILDER_ID),
                ),
                None,
            ),
            "provenance",
            [],
        ),
        _found(
            _envelope(
                _statement(image, attest.TEST_RESULT_V01, provenance.verify_predicate(_Report(facts), facts)),
                None,
            ),
            "test-result",
            [],
        ),
    ]
    assert not evaluate(Policy(), _evidence(image, facts, unsigned)).ok
    report = evaluate(Policy(allow_unsigned=True), _evidence(image, facts, unsigned))
    assert report.ok, _fails(report)
    assert any(r.subject == "signatures" and r.status == WARN for r in report.findings)


def test_label_and_lock_are_compared_without_attestations(facts: ImageFacts, image: Image) -> None:
    config = json.loads(image.config_bytes)
    config["config"]["Labels"][check.BASE_LABEL] = "sha256:" + "0" * 64
    relabeled = Image.create(config, image.layers)
    report = evaluate(Policy(), _evidence(relabeled, facts, []))
    reasons = _fails(report)
    assert any(r.startswith("base label: label") for r in reasons)
    assert any(r.startswith("provenance: no verified provenance") for r in reasons)
    assert any(r.startswith("verify: no verified test-result") for r in reasons)


def test_required_ladders(facts: ImageFacts, image: Image, key: dsse.SigningKey) -> None:
    def ladder(verdict: str, when: str, n: int) -> evidence.Found:
        data = json.dumps({"ladder": "smoke", "verdict": verdict, "finished_at": when}).encode()
        p = provenance.ladder_predicate(LadderReceipt.parse(data), image.digest, image.config_digest)
        return _found(
            _envelope(_statement(image, attest.TEST_RESULT_V01, p), key), "test-result", [key.public_key], n
        )

    policy = Policy(ladders=("smoke",))
    clean = _clean(image, facts, key)
    assert "ladder smoke: required ladder smoke: no verified test-result attestation" in _fails(
        evaluate(policy, _evidence(image, facts, clean))
    )
    later_pass = [
        *clean,
        ladder("FAIL", "2026-01-01T00:00:00Z", 3),
        ladder("PASS", "2026-01-02T00:00:00Z", 4),
    ]
    assert evaluate(policy, _evidence(image, facts, later_pass)).ok, "the latest receipt decides"
    later_fail = [
        *clean,
        ladder("PASS", "2026-01-01T00:00:00Z", 3),
        ladder("NOT_EXERCISED", "2026-01-02T00:00:00Z", 4),
    ]
    assert any(
        r.startswith("ladder smoke: NOT_EXERCISED")
        for r in _fails(evaluate(policy, _evidence(image, facts, later_fail)))
    )
    not_required = evaluate(Policy(), _evidence(image, facts, later_fail))
    assert not_required.ok and any(
        r.subject == "ladder smoke" and r.status == WARN for r in not_required.findings
    )


def test_disallowed_predicate_types_are_ignored_not_trusted(
    facts: ImageFacts, image: Image, key: dsse.SigningKey
) -> None:
    policy = Policy(predicates=(attest.TEST_RESULT_V01,))
    report = evaluate(policy, _evidence(image, facts, _clean(image, facts, key)))
    assert any(
        "is not allowed by the policy; ignored" in r.message and r.status == WARN for r in report.findings
    )
    assert any(
        line.startswith("provenance: no verified provenance attestation for " + str(image.digest))
        and "is not allowed by the policy" in line
        for line in _fails(report)
    ), _fails(report)


def test_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("require: [provenance, vsa]\nladders: [smoke]\nkeys: [k.pub]\nthreshold: 1\n")
    policy = Policy.load(path)
    assert policy.require == ("provenance", "vsa") and policy.keys == (tmp_path / "k.pub",)
    merged = policy.merged(ladders=["cold"], builders=["https://b"], allow_unsigned=True)
    assert merged.ladders == ("smoke", "cold") and merged.builders == ("https://b",) and merged.allow_unsigned
    path.write_text("requires: [provenance]\n")
    with pytest.raises(PolicyError, match="problem"):
        Policy.load(path)
    path.write_text("require: [spdx]\n")
    with pytest.raises(PolicyError, match="unknown requirement"):
        Policy.load(path)
    path.write_text("require: [sbom]\n")
    assert Policy.load(path).require == ("sbom",)


# ------------------------------------------------------------------------------------------------ card, keys


def test_card_and_diff(facts: ImageFacts, image: Image, key: dsse.SigningKey) -> None:
    shown = card(_evidence(image, facts, _clean(image, facts, key)))
    assert shown.source == "signed provenance (verified)"
    assert [o.id for o in shown.overlays] == [o.id for o in facts.lock.overlays]
    assert all(o.sentinels for o in shown.overlays)
    assert "# Provenance card" in shown.markdown() and "sentinel:" in shown.text()
    assert diff(shown, shown).identical
    unverified = card(_evidence(image, facts, _clean(image, facts, key)[:0]))
    assert unverified.source.startswith("the image's own")
    extra = (*(shown.layer_files or ()), ChangedFile("/x", None, 0o644))
    changed = diff(shown, replace(shown, layer_files=extra))
    assert [d.item for d in changed.differences] == ["/x"]


def test_keys(tmp_path: Path) -> None:
    pair = keys.generate(tmp_path / "k")
    assert pair.private.stat().st_mode & 0o777 == 0o600
    assert pair.public.stat().st_mode & 0o777 == 0o644
    with pytest.raises(dsse.DsseError, match="refusing to overwrite"):
        keys.generate(tmp_path / "k")
    from_private = keys.load_trusted([pair.private])
    assert from_private == keys.load_trusted([pair.public]) and from_private[0].keyid == pair.keyid
    assert "PRIVATE" not in repr(keys.load_signing(pair.private))


def test_a_private_key_is_never_written_where_git_would_track_it(tmp_path: Path) -> None:
    """Inside a git work tree `key generate` writes only to an ignored path; otherwise it refuses before
    writing anything, and says how (issue 40: the guide's keys/ was committed by `git add -A`)."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    with pytest.raises(
        dsse.DsseError, match="not ignored: `git add -A` would commit the signing key"
    ) as refused:
        keys.generate(repo / "keys")
    assert "--out ~/.config/servimg/keys" in (refused.value.hint or "")
    assert not (repo / "keys").exists(), "nothing was written"
    # The hint's own command works as written although keys/ was never created (issue 48).
    command = re.search(r"\((echo .*)\)$", refused.value.hint or "")
    assert command is not None, refused.value.hint
    subprocess.run(["bash", "-c", command.group(1)], check=True)
    pair = keys.generate(repo / "keys")
    assert pair.private.is_file()
    assert keys.generate(tmp_path / "outside").private.is_file(), "outside a work tree: no question asked"


def test_threshold_needs_distinct_trusted_signers(
    facts: ImageFacts, image: Image, key: dsse.SigningKey
) -> None:
    second = dsse.SigningKey.generate()
    statement = _statement(image, attest.VSA_V1, _vsa(image))
    once = attest.sign_statement(statement, key)
    descriptor = {"digest": "sha256:" + "7" * 64, "artifactType": attest.artifact_type("vsa")}
    trusted = [key.public_key, second.public_key]
    found = found_from(descriptor, "api", lambda _: once.to_bytes(), trusted, 2)
    assert found.signature == "threshold" and found.statement is None
    twice = dsse.countersign(once, second).to_bytes()
    assert found_from(descriptor, "api", lambda _: twice, trusted, 2).signature == "verified"
    with pytest.raises(evidence.CheckError, match="threshold 3 exceeds"):
        evidence.collect(_evidence(image, facts, []).located, NO_STORE, trusted=trusted, threshold=3)


def _vsa(image: Image) -> dict[str, Any]:
    return attest.verification_summary(
        verifier_id="https://v/1",
        time_verified="2026-01-01T00:00:00Z",
        resource_uri=f"reg/x@{image.digest}",
        policy={"uri": "servimg:policy/default"},
        verification_result="PASSED",
        verified_levels=["SLSA_BUILD_LEVEL_1"],
    )
