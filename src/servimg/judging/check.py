"""`servimg check REF`: is this image what its attestations say it is, by a policy? With reasons.

Three stages, I/O only in the first two, which `judging.evidence` runs: `locate` (REF to exact,
re-hashed manifest and config bytes) and `collect` (the attestations, their signatures tried, the image's
own statements about itself, a fresh probe run with `deep`). This module is the third: `evaluate` (pure)
applies a `Policy` to the evidence and returns a `CheckReport`: rows of (what, verdict, why), each a
`Finding`. The report passes only when no row is FAIL. `check` runs the three as one call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from servimg.assembly.context import Context
from servimg.backends.resolve import Resolved
from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.core.findings import FAIL, PASS, WARN, Finding, Findings
from servimg.formats.cosignread import CosignSignature
from servimg.judging import fixes
from servimg.judging import rebuild as rebuilds
from servimg.judging.evidence import (
    Evidence,
    Found,
    Located,
    collect,
    locate,
    place_of,
    row,
    row_dict,
)
from servimg.judging.policy import (
    BUILDERS_BY_DEFAULT,
    KIND_NAMES,
    REBUILD_V1,
    REQUIREMENTS,
    Policy,
    Trust,
    keyids_by_type,
    predicate_type,
)
from servimg.oci.image import Layer
from servimg.statements import attest, binding, sbom
from servimg.statements import derived as provenance
from servimg.statements.derived import ChangedFile

BASE_LABEL = "org.opencontainers.image.base.digest"
LOCK_LABEL = "io.servimg.lock.digest"
MAX_LISTED = 6
__all__ = ["KIND_NAMES", "REQUIREMENTS", "Policy", "predicate_type"]  # re-exported from .policy


# ------------------------------------------------------------------------------------------------ report


@dataclass(frozen=True)
class CheckReport(Findings):
    """The rows `evaluate` gave; passes only when no row is FAIL (WARN is reported, never failing)."""

    counted = (PASS, WARN, FAIL)
    ref: str = ""
    digest: Digest | None = None  # None: the image was not found
    config_digest: Digest | None = None
    policy: Mapping[str, object] = field(default_factory=dict)
    used: tuple[str, ...] = ()  # artifact digests of the attestations the verdict rests on

    def title(self) -> str:
        return f"check: {self.ref} ({self.digest})"

    def as_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "ref": self.ref,
            "digest": str(self.digest or ""),
            "config_digest": str(self.config_digest or ""),
            "summary": self.counts(),
            "rows": [row_dict(r) for r in self.findings],
            "policy": dict(self.policy),
            "used": list(self.used),
        }


class CheckFailed(ServimgError):
    """The policy did not pass; carries the report."""

    def __init__(self, report: CheckReport, consequence: str = "") -> None:
        failures = report.failures()
        super().__init__(
            f"{len(failures)} check(s) failed" + (f"; {consequence}" if consequence else ""),
            problems=[f"{r.subject}: {r.message}" for r in failures],
            hint="each FAIL row says why; `servimg show` prints the provenance card",
        )
        self.report = report

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "report": self.report.as_dict()}


# ------------------------------------------------------------------------------------------------ evaluate


def accepted(policy: Policy, evidence: Evidence) -> list[tuple[Found, attest.Statement]]:
    """The attestations the verdict may rest on: bound, signed as the policy demands, about this image,
    of an allowed predicate type."""
    return [(f, s) for f, _, usable in _judged(policy, evidence) for s in [f.statement] if s and usable]


def _judged(policy: Policy, evidence: Evidence) -> list[tuple[Found, list[Finding], bool]]:
    return [(f, *_judge(policy, evidence, f)) for f in evidence.found]


def _judge(policy: Policy, ev: Evidence, f: Found) -> tuple[list[Finding], bool]:
    """The rows for one attestation, and whether the policy may rest on it.

    Evidence that does not verify is not a verdict (cosign's rule; docs/policy.md): an attestation that
    cannot be fetched or is bound to another image, an unsigned envelope, a signature by no trusted key
    (or one that claims a trusted key and fails), a statement about another image, an unreadable payload
    is reported as a WARN row ("ignored: …") and not counted. Anyone who may push may attach, so such
    bytes must not be able to fail a properly signed tag; the policy's requirements alone decide whether
    what does verify is enough. `unsigned: forbid` makes an unsigned envelope a FAIL."""
    kind = attest.artifact_kind(f.artifact_type)
    what = f"attestation {kind} {f.short}"
    if f.problem is not None:
        return [_ignored(what, f.problem)], False
    signature = _signature_row(policy, ev, f, what)
    if signature.status != PASS and not (signature.status == WARN and _accepted_unverified(policy, f)):
        return [signature], False
    if f.statement is None:
        return [signature, _ignored(what, f"not an in-toto statement: {f.statement_problem}")], False
    statement = f.statement
    loc = ev.located
    if not (statement.covers(loc.digest) or statement.covers(loc.config_digest)):
        about = ", ".join(str(d) for _, d in statement.subjects)
        why = f"the statement is about {about}, not this image ({loc.digest}, config {loc.config_digest})"
        return [signature, _ignored(what, why)], False
    if statement.predicate_type not in policy.predicates:
        why = f"predicate type {statement.predicate_type} is not allowed by the policy; ignored"
        return [signature, row(what, WARN, why)], False
    allowed = dict(ev.typed_trust).get(statement.predicate_type)
    if allowed is not None and f.signature == "verified" and len(set(f.keyids) & set(allowed)) < ev.threshold:
        signers = ", ".join(k[:12] for k in f.keyids)
        why = (
            f"signed by {signers}, which the policy does not trust for {statement.predicate_type} "
            f"(trusted for it: {', '.join(k[:12] for k in allowed) or 'none'})"
        )
        return [_ignored(what, why)], False
    declared = attest.KINDS.get(statement.predicate_type)
    if declared is not None and attest.artifact_type(declared) != f.artifact_type:
        why = f"artifactType {f.artifact_type} but the statement is a {declared}"
        return [signature, _ignored(what, why)], False
    covered = "manifest" if statement.covers(loc.digest) else "config"
    message = f"{_describe(statement)}; subject = this image's {covered} digest; found as {f.found_as}"
    good = row(what, PASS, message)
    if signature.status == WARN:
        return [signature, good], True
    return [replace(good, message=f"{good.message}; {signature.message}")], True


def _ignored(what: str, why: str) -> Finding:
    return row(what, WARN, f"ignored: {why}; not counted")


def _accepted_unverified(policy: Policy, f: Found) -> bool:
    """Unsigned mode (`--allow-unsigned`) rests on unsigned envelopes and on signatures no key checks."""
    return policy.allow_unsigned and f.signature in ("unsigned", "no-keys")


def _signature_row(policy: Policy, ev: Evidence, f: Found, what: str) -> Finding:
    keys = ", ".join(k[:12] for k in f.hints) or "none"
    trusted = ", ".join(k[:12] for k in ev.trusted) or "none"
    if f.signature == "verified":
        return row(what, PASS, f"signed by trusted key(s) {', '.join(k[:12] for k in f.keyids)}")
    if f.signature == "unsigned":
        if policy.allow_unsigned:
            return row(what, WARN, "unsigned envelope (accepted: unsigned mode)")
        if policy.unsigned == "forbid":
            return row(
                what, FAIL, "unsigned envelope: the policy forbids unsigned evidence (unsigned: forbid)"
            )
        return _ignored(what, "unsigned envelope, no signature to verify")
    if f.signature == "no-keys":
        if policy.allow_unsigned:
            return row(
                what, WARN, f"signature not verified: no trusted key given (unsigned mode; keyid hint {keys})"
            )
        return _ignored(what, f"signed (keyid hint {keys}) but no trusted key was given (--key PUB)")
    if f.signature == "forged":
        return _ignored(
            what,
            f"signature claims trusted key {keys} but does not verify: forged, "
            "or the payload was altered after signing",
        )
    if f.signature == "threshold":
        return _ignored(what, f"only {len(f.keyids)} of the required {ev.threshold} trusted key(s) signed")
    return _ignored(what, f"signed by a key that is not trusted (keyid hint {keys}); trusted: {trusted}")


def _cosign_signature_row(signature: CosignSignature) -> Finding:
    """cosign's simple signature of the manifest (`.sig`): reported, never required; like every piece
    of evidence that does not verify, a bad one is ignored (anyone who may push may write the tag)."""
    what = f"cosign signature {signature.layer.removeprefix('sha256:')[:12]}"
    if signature.status == "verified":
        return row(what, PASS, f"{signature.why}; its payload names this manifest digest (cosign .sig)")
    return _ignored(what, signature.why)


def _describe(statement: attest.Statement) -> str:
    p = statement.predicate
    if statement.predicate_type == attest.PROVENANCE_V1:
        return f"SLSA provenance from builder {provenance.builder_of(p)}"
    if statement.predicate_type == attest.TEST_RESULT_V01:
        ladder = provenance.ladder_name(p)
        what = f"ladder {ladder}" if ladder else ("verify" if provenance.is_verify_result(p) else "test")
        return f"test-result ({what}): {p.get('result')}"
    if statement.predicate_type == attest.VSA_V1:
        return f"verification summary: {p.get('verificationResult')} by {jv.member(p, 'verifier', 'id')}"
    if statement.predicate_type == attest.REBUILD_V1:
        verdict = "bit-identical" if p.get("match") is True else "MISMATCH"
        return f"rebuild by {rebuilds.rebuilder_of(p)}: {verdict}"
    return f"predicate {statement.predicate_type}"


def evaluate(policy: Policy, ev: Evidence) -> CheckReport:
    """Apply `policy` to the evidence (pure). Every requirement yields a row; FAIL rows say why."""
    loc = ev.located
    rows: list[Finding] = list(loc.notes)
    judged = _judged(policy, ev)
    rows.append(row("attestations", PASS if ev.found else WARN, f"{len(ev.found)} found via {ev.discovery}"))
    for _, attestation_rows, _ in judged:
        rows += attestation_rows
    rows += [_cosign_signature_row(s) for s in ev.signatures]
    if policy.allow_unsigned:
        rows.append(
            row("signatures", WARN, "unsigned mode: unsigned or unverified attestations are accepted")
        )
    good = [(f, s) for f, _, usable in judged for s in [f.statement] if s is not None and usable]
    why_not = _not_counted(judged)
    provs = [s for _, s in good if s.predicate_type == attest.PROVENANCE_V1]
    tests = [(f, s) for f, s in good if s.predicate_type == attest.TEST_RESULT_V01]
    rows += _image_rows(ev)
    if "provenance" in policy.require or provs:
        rows += _provenance_rows(policy, ev, provs, _why_not(why_not.get("provenance", [])))
    if "verify" in policy.require:
        verified = [s for _, s in tests if provenance.is_verify_result(s.predicate)]
        rows.append(_verify_row(ev, verified, _why_not(why_not.get("test-result", []))))
    rows += _ladder_rows(policy, tests, _why_not(why_not.get("test-result", [])))
    if policy.fixes:
        rows += [p.finding() for p in fixes.prove(ev, good, policy.fixes, why_not)]
    if "vsa" in policy.require:
        vsas = [s for _, s in good if s.predicate_type == attest.VSA_V1]
        passed = [s for s in vsas if s.predicate.get("verificationResult") == "PASSED"]
        rows.append(
            row("vsa", PASS, f"{len(passed)} passing verification summary(ies)")
            if passed
            else row("vsa", FAIL, "no verified, PASSED verification summary for this image")
        )
    for uri in (r for r in policy.require if r not in REQUIREMENTS):
        hits = [s for _, s in good if s.predicate_type == uri]
        rows.append(row(f"requires {uri}", PASS if hits else FAIL, f"{len(hits)} verified attestation(s)"))
    boms = [s for _, s in good if s.predicate_type == attest.CYCLONEDX_BOM]
    if "sbom" in policy.require or boms:
        rows.append(_sbom_row(ev, boms))
    if ev.deep is not None or ev.deep_problem is not None:
        rows.append(_deep_row(ev))
    rows += _binding_rows(policy, ev, provs)
    if ev.rebuild is not None:
        rows.append(ev.rebuild.row())
    if policy.rebuilds:
        attested = [(f.keyids, s.predicate) for f, s in good if s.predicate_type == REBUILD_V1]
        rows.append(rebuilds.count_rows(policy.rebuilds, attested, loc.digest))
    used = tuple(sorted({f.artifact for f, _ in good}))
    return CheckReport(
        tuple(rows),
        ref=loc.ref,
        digest=loc.digest,
        config_digest=loc.config_digest,
        policy=policy.to_json(),
        used=used,
    )


def lock_sources(ev: Evidence, provs: Sequence[attest.Statement]) -> binding.LockSources:
    """The image's lock digest as its label, its own lock and each verified provenance state it."""
    stated = [
        str(jv.member(s.predicate, "buildDefinition", "internalParameters", "lockDigest")) for s in provs
    ]
    facts = ev.facts
    return binding.LockSources(
        ev.located.image.labels.get(LOCK_LABEL), facts.lock_digest if facts else None, tuple(stated)
    )


def _binding_rows(policy: Policy, ev: Evidence, provs: Sequence[attest.Statement]) -> list[Finding]:
    """Tag ↔ lock, and (`--lock`) the repository's lock file ↔ the image's lock."""
    sources = lock_sources(ev, provs)
    templates = binding.templates_of(ev.facts.definition if ev.facts else None)
    rows = [binding.tag_row(binding.tag_of(ev.located.ref), templates, sources, policy.tag_binding)]
    if ev.lock_file is not None:
        path, wanted = ev.lock_file
        rows.append(binding.lock_row(path, wanted, sources, ev.facts.lock if ev.facts else None))
    return rows


def _image_rows(ev: Evidence) -> list[Finding]:
    """What the image says about itself, with or without attestations: label, lock, changes manifest."""
    if ev.facts is None:
        return [row("lock", FAIL, f"cannot read the lock inside the image: {ev.facts_problem}")]
    facts, labels = ev.facts, ev.located.image.labels
    rows = []
    label, locked = labels.get(BASE_LABEL), str(facts.lock.base.manifest_digest)
    if label is None:
        rows.append(row("base label", FAIL, f"the image has no {BASE_LABEL} label"))
    elif label != locked:
        rows.append(
            row("base label", FAIL, f"label {BASE_LABEL} says {label}, the lock in the image says {locked}")
        )
    else:
        rows.append(row("base label", PASS, f"label = lock in the image = {locked}"))
    lock_label = labels.get(LOCK_LABEL)
    if lock_label != str(facts.lock_digest):
        rows.append(
            row(
                "lock label",
                FAIL,
                f"label {LOCK_LABEL} says {lock_label}, the lock in the image is {facts.lock_digest}",
            )
        )
    if ev.layer_changes is None:
        why = f"cannot re-derive the changed files from the overlay layer: {ev.facts_problem}"
        rows.append(row("changes manifest", FAIL, why))
    else:
        diff = _changes_diff(facts.changes, ev.layer_changes, "the manifest", "the overlay layer")
        rows.append(
            row(
                "changes manifest",
                FAIL,
                f"/{provenance.CHANGES_FILE} disagrees with the overlay layer: {diff}",
            )
            if diff
            else row(
                "changes manifest",
                PASS,
                f"{len(facts.changes)} layer entries, as in the overlay layer: the "
                f"{len(facts.lock.changed_files)} file(s) the overlays changed, their bytecode and "
                "servimg's own files",
            )
        )
    return rows


def not_counted(policy: Policy, evidence: Evidence) -> dict[str, list[str]]:
    """Per attestation kind, why each one found of it did not count (`servimg fixes` says so too)."""
    return _not_counted(_judged(policy, evidence))


def _not_counted(judged: Sequence[tuple[Found, list[Finding], bool]]) -> dict[str, list[str]]:
    reasons: dict[str, list[str]] = {}
    for f, found_rows, usable in judged:
        if usable or not found_rows:
            continue
        why = found_rows[-1].message.removeprefix("ignored: ").removesuffix("; not counted")
        reasons.setdefault(attest.artifact_kind(f.artifact_type), []).append(why)
    return reasons


def _why_not(reasons: Sequence[str]) -> str:
    """The tail of a FAIL row for want of verified evidence: why the ones found did not count (a wrong key
    shows on the FAIL line, not only in the WARN rows above it)."""
    return f": {len(reasons)} found, not counted: " + "; ".join(dict.fromkeys(reasons)) if reasons else ""


def _provenance_rows(
    policy: Policy, ev: Evidence, provs: Sequence[attest.Statement], why_not: str = ""
) -> list[Finding]:
    if not provs:
        message = f"no verified provenance attestation for {ev.located.digest}{why_not}"
        return [row("provenance", FAIL, message)]
    rows = [row("provenance", PASS, f"{len(provs)} verified provenance attestation(s)")]
    for statement in provs:
        rows += _one_provenance(policy, ev, statement.predicate)
    return rows


def _builder_row(policy: Policy, builder: str | None) -> Finding:
    """Which builder the provenance names, whether it is trusted, and who chose to trust it. servimg's
    placeholder id, trusted only because nobody named a builder, is a WARN: no one vouched for it."""
    trusted = ", ".join(policy.builders)
    if builder not in policy.builders:
        return row(
            "builder",
            FAIL,
            f"builder {builder} is not trusted (trusted: {trusted}, by {policy.builders_from})",
        )
    if builder == provenance.DEFAULT_BUILDER_ID and policy.builders_from == BUILDERS_BY_DEFAULT:
        return row(
            "builder",
            WARN,
            f"{builder} is servimg's placeholder builder id, trusted only by default: nobody set a builder "
            "id at push (--builder-id or $SERVIMG_BUILDER_ID) nor named one here (--builder, or builders: "
            "in a policy)",
        )
    return row("builder", PASS, f"{builder} is trusted (by {policy.builders_from})")


def _one_provenance(policy: Policy, ev: Evidence, p: Mapping[str, object]) -> list[Finding]:
    rows = [_builder_row(policy, provenance.builder_of(p))]
    facts = ev.facts
    if facts is None:
        return [
            *rows,
            row("provenance vs image", FAIL, "no lock in the image to compare the provenance with"),
        ]
    lock, labels = facts.lock, ev.located.image.labels
    bases = [
        provenance.sha256_of(d) for d in provenance.provenance_dependencies(p, provenance.ROLE_BASE_MANIFEST)
    ]
    want = lock.base.manifest_digest.hex
    label = labels.get(BASE_LABEL, "").removeprefix("sha256:")
    if bases == [want] and label == want:
        rows.append(row("base digest", PASS, f"provenance = label = lock = sha256:{want}"))
    else:
        shown = ", ".join(f"sha256:{b}" for b in bases if b) or "none"
        rows.append(
            row(
                "base digest",
                FAIL,
                f"provenance says {shown}, label says sha256:{label or '-'}, lock says sha256:{want}",
            )
        )
    patches = {
        str(jv.member(d, "annotations", "overlay")): provenance.sha256_of(d)
        for d in provenance.provenance_dependencies(p, provenance.ROLE_PATCH)
    }
    locked = {o.id: o.patch_sha256 for o in lock.overlays}
    rows.append(_mapping_row("patches", patches, locked, "overlay"))
    dists = {
        str(d.get("name")): provenance.sha256_of(d)
        for d in provenance.provenance_dependencies(p, provenance.ROLE_DIST)
    }
    rows.append(
        _mapping_row(
            "dists", dists, {f"{k.distribution}=={k.version}": k.record_sha256 for k in lock.packages}, "dist"
        )
    )
    probes = [provenance.sha256_of(d) for d in provenance.provenance_dependencies(p, provenance.ROLE_PROBE)]
    specs = [
        provenance.sha256_of(d) for d in provenance.provenance_dependencies(p, provenance.ROLE_PROBE_SPEC)
    ]
    if probes == [facts.probe_sha256] and specs == [facts.spec_sha256]:
        rows.append(
            row("probe", PASS, f"probe.py sha256:{facts.probe_sha256[:12]}… and its spec as in the image")
        )
    else:
        rows.append(
            row(
                "probe",
                FAIL,
                f"provenance names probe {probes} / spec {specs}; "
                f"the image has {facts.probe_sha256} / {facts.spec_sha256}",
            )
        )
    listed = provenance.provenance_byproducts(p)
    diff = _changes_diff(listed, facts.changes, "the provenance", "the image's manifest")
    if ev.layer_changes is not None:
        diff = diff or _changes_diff(
            listed, ev.layer_changes, "the provenance byproducts", "the overlay layer"
        )
    rows.append(
        row("changed files", FAIL, diff)
        if diff
        else row(
            "changed files",
            PASS,
            f"{len(listed)} byproducts = the overlay layer's entries (re-derived; the "
            f"{len(ev.facts.lock.changed_files) if ev.facts else 0} file(s) the overlays changed among them)",
        )
    )
    return rows


def _mapping_row(
    what: str, attested: Mapping[str, str | None], locked: Mapping[str, str], noun: str
) -> Finding:
    problems = []
    for key in sorted(set(attested) | set(locked)):
        if key not in locked:
            problems.append(f"{noun} {key} is in the provenance, not in the lock")
        elif key not in attested:
            problems.append(f"{noun} {key} is in the lock, not in the provenance")
        elif attested[key] != locked[key]:
            problems.append(f"{noun} {key}: provenance sha256:{attested[key]}, lock sha256:{locked[key]}")
    if problems:
        return row(what, FAIL, _listed(problems))
    return row(what, PASS, f"{len(locked)} {noun}(s): provenance = lock in the image")


def _changes_diff(
    left: Iterable[ChangedFile], right: Iterable[ChangedFile], left_name: str, right_name: str
) -> str:
    a = {c.path: c for c in left}
    b = {c.path: c for c in right}
    problems = []
    for path in sorted(set(a) | set(b)):
        if path not in b:
            problems.append(f"{path} is in {left_name}, not in {right_name}")
        elif path not in a:
            problems.append(f"{path} is in {right_name}, not in {left_name}")
        elif a[path].key() != b[path].key() or a[path].kind_differs(b[path]):
            problems.append(f"{path}: {right_name} has {_file(b[path])}, {left_name} says {_file(a[path])}")
    return _listed(problems)


def _file(c: ChangedFile) -> str:
    return f"{c.describe()} mode {c.mode:04o}"


def _listed(problems: Sequence[str]) -> str:
    if len(problems) <= MAX_LISTED:
        return "; ".join(problems)
    return "; ".join(problems[:MAX_LISTED]) + f"; … and {len(problems) - MAX_LISTED} more"


def _verify_row(ev: Evidence, results: Sequence[attest.Statement], why_not: str = "") -> Finding:
    if not results:
        return row("verify", FAIL, f"no verified test-result from `servimg verify` for this image{why_not}")
    spec = ev.facts.spec_sha256 if ev.facts is not None else None
    mine = [s for s in results if provenance.sha256_of(provenance.test_config(s.predicate) or {}) == spec]
    if not mine:
        return row("verify", FAIL, f"the verify result(s) ran another probe spec than the image's ({spec})")
    failed = [s for s in mine if s.predicate.get("result") == "FAILED"]
    if failed:
        tests = [str(t) for s in failed for t in jv.seq(s.predicate.get("failedTests") or [])]
        return row("verify", FAIL, f"verify FAILED: {_listed(tests)}")
    p = mine[0].predicate
    counts = (
        f"{len(jv.seq(p.get('passedTests') or []))} passed, {len(jv.seq(p.get('warnedTests') or []))} warned"
    )
    return row("verify", PASS, f"{p.get('result')}: {counts} (the image's own probe spec)")


def _sbom_row(ev: Evidence, boms: Sequence[attest.Statement]) -> Finding:
    """The SBOM must describe this image as its own lock does: every locked distribution at its version,
    each overlay as a pedigree patch pinned to the patch's sha256, the interpreter."""
    if not boms:
        return row("sbom", FAIL, f"no verified SBOM attestation for {ev.located.digest}")
    if ev.facts is None:
        return row("sbom", FAIL, f"cannot compare the SBOM with the image's lock: {ev.facts_problem}")
    problems = [p for s in boms for p in sbom.problems(s.predicate, ev.located.image, ev.facts)]
    if problems:
        return row("sbom", FAIL, f"the SBOM disagrees with the image's lock: {_listed(problems)}")
    return row("sbom", PASS, f"CycloneDX {sbom.SPEC_VERSION}: {sbom.summary(boms[0].predicate).line()}")


def _ladder_rows(
    policy: Policy, tests: Sequence[tuple[Found, attest.Statement]], why_not: str = ""
) -> list[Finding]:
    by_name: dict[str, list[tuple[Found, attest.Statement]]] = {}
    for f, s in tests:
        name = provenance.ladder_name(s.predicate)
        if name is not None:
            by_name.setdefault(name, []).append((f, s))
    rows = []
    for name in sorted(set(policy.ladders) | set(by_name)):
        required = name in policy.ladders
        results = by_name.get(name, [])
        if not results:
            rows.append(
                row(
                    f"ladder {name}",
                    FAIL,
                    f"required ladder {name}: no verified test-result attestation{why_not}",
                )
            )
            continue
        latest = max(results, key=lambda fs: (_finished(fs[1]), fs[0].created or ""))[1]
        config = provenance.test_config(latest.predicate) or {}
        verdict = str(jv.obj(config.get("annotations") or {}).get("verdict", latest.predicate.get("result")))
        accepted = policy.accepted_verdicts(name) if required else ("PASS",)
        passed = verdict in accepted and (latest.predicate.get("result") == "PASSED" or verdict != "PASS")
        receipt = (provenance.sha256_of(config) or "")[:12]
        why = f"{verdict} (receipt sha256:{receipt}…, latest of {len(results)})"
        if passed and verdict != "PASS":
            why += f"; the policy accepts {', '.join(accepted)} for it"
        rows.append(row(f"ladder {name}", PASS if passed else (FAIL if required else WARN), why))
    return rows


def _finished(statement: attest.Statement) -> str:
    config = provenance.test_config(statement.predicate) or {}
    return str(jv.member(config, "annotations", "finished_at") or "")


def _deep_row(ev: Evidence) -> Finding:
    if ev.deep is None:
        return row("deep: probe", FAIL, f"could not run the probe: {ev.deep_problem}")
    report = ev.deep
    counts = report.counts()
    if report.ok:
        return row(
            "deep: probe", PASS, f"fresh run: {counts.get('PASS', 0)} PASS, {counts.get('WARN', 0)} WARN"
        )
    return row(
        "deep: probe",
        FAIL,
        "fresh run: " + _listed([f"{c.code} {c.subject}: {c.message}" for c in report.failures()]),
    )


# ------------------------------------------------------------------------------------------------ one call


@dataclass(frozen=True)
class Rebuild:
    """`--rebuild [--definition PATH]`: rebuild the image here; the checkout's definition gives the
    overlay files (default images/<name>.yaml), the context's seams the runner."""

    definition: Path | None


def gather(
    located: Located,
    ctx: Context,
    policy: Policy,
    *,
    deep: bool = False,
    rebuild: Rebuild | None = None,
    trust: Trust | None = None,
) -> Evidence:
    """Every piece of evidence the policy asks for: attestations verified against every key it names
    (`trust`: the policy's files as read once by the caller, else read here), the lock file, a fresh
    probe run by the context's verifier seam (`deep`), a rebuild with its seams."""
    trust = trust or Trust.of(policy)
    evidence = collect(located, ctx, trusted=trust.keys, threshold=policy.threshold, deep=deep)
    lock_file = (str(policy.lock), trust.lock) if policy.lock is not None and trust.lock is not None else None
    evidence = replace(evidence, typed_trust=keyids_by_type(policy, trust.keyid_of), lock_file=lock_file)
    if rebuild is None:
        return evidence
    return replace(evidence, rebuild=_rebuild(policy, evidence, rebuild, ctx))


def _rebuild(policy: Policy, ev: Evidence, request: Rebuild, ctx: Context) -> rebuilds.Rebuilt:
    located, store = ev.located, ctx.store
    if ev.facts is None:
        return rebuilds.Rebuilt(
            located.digest, problem=f"the image carries no servimg files: {ev.facts_problem}"
        )
    provs = [s for _, s in accepted(policy, ev) if s.predicate_type == attest.PROVENANCE_V1]
    if not provs and not policy.allow_unsigned:
        why = (
            "no verified provenance names the definition and lock to rebuild from "
            "(--allow-unsigned: rebuild from the image's own files)"
        )
        return rebuilds.Rebuilt(located.digest, problem=why)

    def fetch_layer(layer: Layer) -> None:
        if located.registry is not None and located.repository is not None:
            with located.client() as client:
                client.download_blob(
                    located.repository, layer.descriptor.digest, store.path(layer.descriptor.digest)
                )

    predicate = provs[0].predicate if provs else None
    return rebuilds.rebuild(
        located.image,
        ev.facts,
        predicate,
        request.definition,
        ctx,
        fetch_layer=fetch_layer,
    )


def check(
    ref: str | Resolved,
    ctx: Context,
    policy: Policy,
    *,
    deep: bool = False,
    repo: str | None = None,
    remote: bool = False,
    rebuild: Rebuild | None = None,
    trust: Trust | None = None,
) -> tuple[CheckReport, Evidence]:
    """REF (as typed, or where `place_of` resolved it) judged by `policy` (`trust`: its files as the
    caller read them): the report, and the evidence."""
    found = ref if isinstance(ref, Resolved) else place_of(ref, ctx.log, remote=remote)
    located = locate(found, ctx, repo=repo)
    evidence = gather(located, ctx, policy, deep=deep, rebuild=rebuild, trust=trust)
    return evaluate(policy, evidence), evidence
