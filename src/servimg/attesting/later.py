"""What is said of an image after it was pushed: a result attested from a file (`servimg attest`), a
rebuild's statement (`check --rebuild --attest`), and promotion by policy (`servimg promote`: the VSA
attached, then the tag moved), each signed and attached beside the digest it names."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from servimg.assembly.context import Context
from servimg.attesting.attach import (
    AttachError,
    GpgPlan,
    Publishing,
    confirm_unchanged,
    gpg_prepare,
    gpg_write,
    make_envelope,
    publish_confirmed,
    subject_descriptor,
)
from servimg.backends import registry, transport
from servimg.backends.target import Target
from servimg.core.context import Log
from servimg.core.digest import Digest
from servimg.core.reference import is_valid_tag
from servimg.formats.publish import DEFAULT_FORMATS, Attached, Envelope
from servimg.judging import rebuild as rebuilds
from servimg.judging.check import CheckFailed, CheckReport, Policy, evaluate, gather
from servimg.judging.evidence import Located, locate_ref
from servimg.judging.policy import REBUILD_V1
from servimg.signing import dsse
from servimg.statements import attest, binding
from servimg.statements import derived as provenance

# ------------------------------------------------------------------------------------------------ attest


def predicate_from_file(
    data: bytes, predicate_type: str, manifest: Digest, config: Digest
) -> tuple[str, dict[str, object]]:
    """What `servimg attest --file` attaches: a ladder receipt (made into a test-result), an in-toto
    statement about this image (its predicate), or a bare predicate of `predicate_type`."""
    try:
        doc = json.loads(data)
    except ValueError:
        raise AttachError("the file is not JSON") from None
    if not isinstance(doc, dict):
        raise AttachError("the file is not a JSON object")
    if doc.get("_type") == attest.STATEMENT_TYPE:
        parsed = attest.parse_statement(data)
        if not (parsed.covers(manifest) or parsed.covers(config)):
            raise AttachError(
                f"the statement is about {', '.join(str(d) for _, d in parsed.subjects)}, not {manifest}",
                hint="attach a statement to the image it is about",
            )
        return parsed.predicate_type, dict(parsed.predicate)
    if predicate_type == attest.TEST_RESULT_V01 and "verdict" in doc:
        receipt = provenance.LadderReceipt.parse(data)
        return predicate_type, provenance.ladder_predicate(receipt, manifest, config)
    return predicate_type, doc


def attest_file(
    ref: str,
    predicate_type: str,
    file: Path,
    ctx: Context,
    *,
    key: dsse.Signer | None = None,
    repo: str | None = None,
    remote: bool = False,
    formats: frozenset[str] = DEFAULT_FORMATS,
) -> Attached:
    """`servimg attest REF --predicate-type T --file F`: attach a later result to the image REF names."""
    log = ctx.log
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise AttachError(f"cannot read {file}: {exc.strerror}") from None
    located = locate_ref(ref, ctx, repo=repo, remote=remote)
    kind_type, predicate = predicate_from_file(data, predicate_type, located.digest, located.config_digest)
    kind = attest.kind_of(kind_type)
    subjects = provenance.subjects(located.name, located.digest, located.config_digest)
    env = make_envelope(kind, kind_type, attest.statement(subjects, kind_type, predicate), key)
    return _attach_located(located, env, log, formats)


def attest_rebuild(
    located: Located,
    result: rebuilds.Rebuilt,
    key: dsse.Signer,
    log: Log,
    *,
    rebuilder: str | None = None,
) -> Attached:
    """`check --rebuild --attach --key`: a signed statement of this rebuild's result (match or not)
    about the image REF names, beside it."""
    if result.problem is not None:
        raise AttachError(f"nothing was rebuilt, so nothing is attached: {result.problem}")
    predicate = rebuilds.rebuild_predicate(
        result, rebuilder or rebuilds.DEFAULT_REBUILDER_ID, provenance.now()
    )
    subjects = provenance.subjects(located.name, located.digest, located.config_digest)
    env = make_envelope("rebuild", REBUILD_V1, attest.statement(subjects, REBUILD_V1, predicate), key)
    return _attach_located(located, env, log, DEFAULT_FORMATS)


def _attach_located(
    located: Located, env: Envelope, log: Log, formats: frozenset[str], key: dsse.Signer | None = None
) -> Attached:
    subject = subject_descriptor(located.image)
    publishing = Publishing((env,), key, formats)
    if located.layout is not None:
        with transport.referrers(Target.layout(located.layout)) as place:
            return publishing.publish(place, subject, located.name, log)[0][0]
    with located.client() as client:
        return publish_confirmed(client, str(located.repository), subject, publishing, located.name, log)[0][
            0
        ]


# ------------------------------------------------------------------------------------------------ promote


@dataclass(frozen=True)
class Promoted:
    report: CheckReport
    tag: str
    vsa: Attached

    def as_dict(self) -> dict[str, object]:
        return {"tag": self.tag, "vsa": self.vsa.as_dict(), "check": self.report.as_dict()}


def vsa_predicate(report: CheckReport, located: Located, policy: Policy, verifier: str) -> dict[str, object]:
    """A SLSA verification summary of a passed check: the policy (by digest) and the attestations the
    verdict rested on. Level 1: provenance exists and verifies; servimg makes no hosted-builder claim."""
    return attest.verification_summary(
        verifier_id=verifier,
        time_verified=provenance.now(),
        resource_uri=f"{located.name}@{located.digest}",
        policy={"uri": policy.uri, "digest": {"sha256": provenance.canonical_sha256(policy.to_json())}},
        verification_result="PASSED",
        verified_levels=["SLSA_BUILD_LEVEL_1"],
        input_attestations=[
            {"uri": f"{located.name}@{a}", "digest": {"sha256": a.removeprefix("sha256:")}}
            for a in report.used
        ],
    )


def promote(
    ref: str,
    tag: str,
    ctx: Context,
    policy: Policy,
    *,
    key: dsse.Signer | None = None,
    verifier: str | None = None,
    deep: bool = False,
    repo: str | None = None,
    remote: bool = False,
    formats: frozenset[str] = DEFAULT_FORMATS,
    gpg: GpgPlan | None = None,
) -> Promoted:
    """Check REF against `policy` (`deep`: a fresh probe run by the context's verifier seam); only if it
    passes, attach a VSA and then move `tag` to the digest."""
    log = ctx.log
    if not is_valid_tag(tag):
        raise AttachError(f"invalid tag {tag!r}", hint="tags are 1-128 of [A-Za-z0-9_.-]")
    located = locate_ref(ref, ctx, repo=repo, remote=remote)
    if located.registry is None:
        raise AttachError(f"{ref} is not in a registry; promotion moves a registry tag")
    evidence = gather(located, ctx, policy, deep=deep)
    if evidence.facts is not None:
        facts = evidence.facts
        binding.refuse_rebinding(tag, facts.definition, facts.lock_digest, f"promote {located.name} to")
    report = evaluate(policy, evidence)
    if not report.ok:
        raise CheckFailed(report, f"{located.name}:{tag} was not moved")
    subjects = provenance.subjects(located.name, located.digest, located.config_digest)
    predicate = vsa_predicate(report, located, policy, verifier or provenance.DEFAULT_VERIFIER_ID)
    env = make_envelope("vsa", attest.VSA_V1, attest.statement(subjects, attest.VSA_V1, predicate), key)
    with located.client() as client:
        subject = subject_descriptor(located.image)
        publishing = Publishing((env,), key, formats)
        gpg_signature = gpg_prepare(gpg, client, f"{located.name}:{tag}", located.digest)
        vsa = publish_confirmed(client, str(located.repository), subject, publishing, located.name, log)[0][0]
        gpg_write(gpg_signature, client, str(located.repository), log)
        registry.put_tag(client, str(located.repository), tag, located.image, log)
        confirm_unchanged(client, str(located.repository), tag, subject, "after promotion")
    return Promoted(report, tag, vsa)
