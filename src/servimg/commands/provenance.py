"""The provenance commands: `servimg push`, `attest`, `check`, `promote`, `show` and `diff`."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from servimg.attesting import attach, later
from servimg.backends import transport
from servimg.commands.platformref import index_at, one_platform
from servimg.commands.signed import formats, gpg_plan, signing_key
from servimg.core import jsonview as jv
from servimg.core.atomic import write_output
from servimg.core.canonical import dumps_pretty
from servimg.core.errors import ServimgError, UsageError
from servimg.core.findings import Findings
from servimg.core.platform import Platform
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt, tally
from servimg.judging import fixes as fixproof
from servimg.judging import indexcheck
from servimg.judging.check import (
    CheckFailed,
    Policy,
    Rebuild,
    accepted,
    check,
    gather,
    not_counted,
    predicate_type,
)
from servimg.judging.evidence import CheckError, Evidence, collect, locate_ref, place_of
from servimg.oci import treediff
from servimg.proof.verify import VerifyReport
from servimg.reports import card
from servimg.reports import matrix as qualified
from servimg.signing import keys
from servimg.signing.dsse import Signer
from servimg.statements.attest import OPENVEX_V020
from servimg.statements.vex import advisories


def policy_of(flags: params.PolicyFlags, trusted: Sequence[Path]) -> Policy:
    """The policy file (or the default policy) with the command line's flags on top."""
    loaded = Policy.load(flags.file) if flags.file is not None else Policy()
    return loaded.merged(
        ladders=flags.ladders,
        keys=trusted,
        builders=flags.builders,
        threshold=flags.threshold,
        allow_unsigned=flags.allow_unsigned,
        rebuilds=flags.rebuilds,
        tag_binding=flags.tag_binding,
        lock=flags.lock,
        fixes=flags.fixes,
    )


def push(p: params.Push, ctx: Context) -> Iterator[Outcome]:
    def run() -> Outcome:
        report = None
        if p.report is not None:
            report = VerifyReport.from_json(json.loads(p.report.read_bytes()))
        pushed = attach.push(
            p.image,
            p.dest,
            ctx,
            key=signing_key(p.key),
            report=report,
            builder=p.builder_id,
            unsigned=p.unsigned,
            formats=formats(p.publish),
            gpg=gpg_plan(p.publish),
        )
        return Outcome(p.image, pushed.as_dict())

    yield attempt(p.image, run)


def attest(p: params.Attest, ctx: Context) -> Iterator[Outcome]:
    def run() -> Outcome:
        attached = later.attest_file(
            p.ref,
            predicate_type(p.predicate_type),
            p.file,
            ctx,
            key=signing_key(p.key),
            repo=p.lookup.repo,
            remote=p.lookup.remote,
            formats=formats(p.publish),
        )
        return Outcome(p.ref, attached.as_dict())

    yield attempt(p.ref, run)


def check_ref(p: params.Check, ctx: Context) -> Iterator[Outcome]:
    """Does REF satisfy the policy? One row per requirement; FAIL when any row fails. With a rebuild
    and `attach`, its signed result is attached beside the image whatever it was."""

    def run() -> Outcome:
        if p.rebuild is not None and not p.rebuild.requested:
            raise UsageError("--definition, --attach and --rebuilder-id go with --rebuild")
        signer = _rebuild_signer(p.lookup.keys) if p.rebuild is not None and p.rebuild.attach else None
        policy = policy_of(p.policy, p.lookup.keys)
        # Resolved once: whether it names an index, and the image judged, come from this one answer.
        place = place_of(p.ref, ctx.log, remote=p.lookup.remote)
        index = index_at(place) if p.rebuild is None else None
        if index is not None:
            found = indexcheck.check_index(
                place.ref,
                index,
                ctx,
                policy,
                deep=p.policy.deep,
                only=Platform.optional(p.platform),
            )
            summary: dict[str, object] = {"digest": str(found.digest or ""), "summary": tally(found.counts())}
            failed = None if found.ok else CheckFailed(found)
            return Outcome(p.ref, summary, dict(found.as_dict()), found, error=failed)
        report, evidence = check(
            place,
            ctx,
            policy,
            deep=p.policy.deep,
            repo=p.lookup.repo,
            rebuild=Rebuild(p.rebuild.definition) if p.rebuild is not None else None,
        )
        brief: dict[str, object] = {"digest": str(report.digest or ""), "summary": tally(report.counts())}
        full: dict[str, object] = dict(report.as_dict())
        if evidence.rebuild is not None:
            full["rebuild"] = evidence.rebuild.as_dict()
            brief["rebuild_seconds"] = round(evidence.rebuild.seconds, 1)
        if signer is not None and evidence.rebuild is not None and p.rebuild is not None:
            attached = later.attest_rebuild(
                evidence.located, evidence.rebuild, signer, ctx.log, rebuilder=p.rebuild.rebuilder_id
            )
            full["attestation"] = brief["attestation"] = attached.as_dict()
        error = None if report.ok else CheckFailed(report)
        return Outcome(p.ref, brief, full, report, error=error)

    yield attempt(p.ref, run)


def _rebuild_signer(paths: Sequence[Path]) -> Signer:
    """The one private key among the --key files: it signs the rebuild attestation (and, as every
    --key, is trusted)."""
    found = []
    for path in paths:
        try:
            found.append(keys.load_signing(path))
        except ServimgError:
            continue  # a public key: trusted only
    if len(found) != 1:
        raise UsageError(
            f"--attach signs the rebuild with a private key: {len(found)} among the --key files",
            hint="pass exactly one --key PRIVATE_KEY (its public half is then trusted too)",
        )
    return found[0]


def promote(p: params.Promote, ctx: Context) -> Iterator[Outcome]:
    """Move a promotion tag only if the policy passes, after attaching a verification summary."""

    def run() -> Outcome:
        try:
            promoted = later.promote(
                p.ref,
                p.tag,
                ctx,
                policy_of(p.policy, p.lookup.keys),
                key=signing_key(p.sign),
                verifier=p.verifier_id,
                deep=p.policy.deep,
                repo=p.lookup.repo,
                remote=p.lookup.remote,
                formats=formats(p.publish),
                gpg=gpg_plan(p.publish),
            )
        except CheckFailed as exc:
            return Outcome(p.ref, findings=exc.report, error=exc)
        brief = {"tag": promoted.tag, "vsa": promoted.vsa.artifact}
        return Outcome(p.ref, brief, promoted.as_dict(), promoted.report)

    yield attempt(p.ref, run)


def evidence(ref: str, lookup: params.Lookup, ctx: Context) -> Evidence:
    """What `show` and `diff` read: REF located, its attestations checked against the trusted keys."""
    located = locate_ref(ref, ctx, repo=lookup.repo, remote=lookup.remote)
    return collect(located, ctx, trusted=keys.load_trusted(lookup.keys))


def show(p: params.Show, ctx: Context) -> Iterator[Outcome]:
    """The provenance card. As Markdown it is a document on stdout: no OK line after it (a FAIL line
    still says what went wrong)."""

    def run() -> Outcome:
        ref = one_platform(p.ref, Platform.optional(p.platform), ctx.log, what="show")
        shown = card.card(evidence(ref, p.lookup, ctx))
        document = shown.markdown() if p.markdown else shown.text()
        return Outcome(
            p.ref, {"digest": str(shown.digest)}, shown.as_dict(), document=document, quiet_ok=p.markdown
        )

    yield attempt(p.ref, run)


def diff(p: params.Diff, ctx: Context) -> Iterator[Outcome]:
    """What differs between two images: their provenance cards, or (`files`) config and files layer by
    layer, in which case a difference is a FAIL."""
    target = f"{p.a} {p.b}"

    def files() -> Outcome:
        a = transport.fetch_argument(p.a, ctx)
        b = transport.fetch_argument(p.b, ctx)
        result = treediff.diff_images(a, b, ctx.store)
        if result.identical:
            return Outcome(target, {"identical": True, "digest": str(result.a)}, result.as_dict())
        explanation = "\n".join(treediff.explain(result, p.limit))
        return Outcome(target, explanation=explanation, error=treediff.ImagesDiffer(result, p.limit))

    def provenance() -> Outcome:
        a = card.card(evidence(p.a, p.lookup, ctx))
        b = card.card(evidence(p.b, p.lookup, ctx))
        result = card.diff(a, b)
        brief = {"identical": result.identical, "differences": len(result.differences)}
        return Outcome(target, brief, result.as_dict(), document=result.text())

    yield attempt(target, files if p.files else provenance)


class FixesReport(Findings):
    """One row per fix the image carries: proven by this digest's trusted evidence, or what it lacks."""

    def title(self) -> str:
        return "fixes"


def fixes(p: params.Fixes, ctx: Context) -> Iterator[Outcome]:
    """`servimg fixes REF`: every fix the image's lock says its overlays carry, and the evidence for each
    from this digest's signed attestations (servimg.judging.fixes); FAIL when one is not proven."""

    def run() -> Outcome:
        policy = policy_of(params.PolicyFlags(file=p.policy), p.lookup.keys)
        located = locate_ref(p.ref, ctx, repo=p.lookup.repo, remote=p.lookup.remote)
        evidence = gather(located, ctx, policy)
        if evidence.facts is None:
            raise CheckError(
                f"{p.ref} carries no lock of its own: {evidence.facts_problem}",
                hint="only an image built by `servimg build` says which fixes it carries",
            )
        asked = fixproof.carried(evidence)
        proofs = fixproof.prove(evidence, accepted(policy, evidence), asked, not_counted(policy, evidence))
        report = FixesReport(tuple(proof.finding() for proof in proofs))
        proven = sum(proof.holds for proof in proofs)
        fields: dict[str, object] = {
            "digest": str(located.digest),
            "fixes": f"{proven} of {len(proofs)} proven"
            if proofs
            else "none declared (no overlay says what it fixes)",
        }
        as_json = {**fields, "fixes": [proof.as_dict() for proof in proofs]}
        unproven = [proof.fix for proof in proofs if not proof.holds]
        error = (
            CheckError(
                f"{len(unproven)} fix(es) not proven by this digest's trusted evidence: "
                + ", ".join(unproven),
                hint="each FAIL row says what the proof lacks"
                + ("" if p.lookup.keys or p.policy else "; pass the signer's key with --key"),
            )
            if unproven
            else None
        )
        return Outcome(p.ref, fields, as_json, report if proofs else None, error=error)

    yield attempt(p.ref, run)


def vex(p: params.Vex, ctx: Context) -> Iterator[Outcome]:
    """`servimg vex REF`: the OpenVEX document this digest's trusted evidence carries (servimg.statements.vex:
    one statement per advisory an overlay fixes), printed and with --out written where a scanner reads it
    (`trivy image --vex FILE`). FAIL when no trusted OpenVEX statement is about this image."""

    def run() -> Outcome:
        policy = policy_of(params.PolicyFlags(file=p.policy), p.lookup.keys)
        located = locate_ref(p.ref, ctx, repo=p.lookup.repo, remote=p.lookup.remote)
        evidence = gather(located, ctx, policy)
        documents = [s.predicate for _, s in accepted(policy, evidence) if s.predicate_type == OPENVEX_V020]
        if not documents:
            declared = [a.id for a in advisories(evidence.facts)] if evidence.facts is not None else []
            raise CheckError(
                f"{p.ref} ({located.digest}): no trusted OpenVEX statement is about this image"
                + (
                    f" (its overlays fix {', '.join(declared)})"
                    if declared
                    else " (no overlay of its lock fixes an advisory: `fixes:` with CVE-… or GHSA-… ids)"
                ),
                hint="pass the signer's key with --key; `servimg push IMAGE HOST/REPO --key KEY` attaches "
                "the VEX of an image whose overlays fix an advisory",
            )
        document = documents[0]
        data = dumps_pretty(document)
        if p.out is not None:
            write_output(p.out, data)
        said = [
            f"{jv.member(s, 'vulnerability', 'name')}: {s.get('status')} in "
            + ", ".join(str(jv.obj(x).get("@id")) for x in jv.seq(s.get("products") or []))
            for s in jv.seq(document.get("statements") or [])
            if isinstance(s, dict)
        ]
        fields: dict[str, object] = {"digest": str(located.digest), "statements": said}
        if p.out is not None:
            fields["written"] = str(p.out)
        return Outcome(p.ref, fields, {**fields, "openvex": document})

    yield attempt(p.ref, run)


def matrix(p: params.Matrix, ctx: Context) -> Iterator[Outcome]:
    """`servimg matrix HOST/REPO|oci:DIR`: one row per image digest, from its signed evidence only
    (servimg.reports.matrix); FAIL when the repository holds no evidence a given key verifies."""

    def run() -> Outcome:
        policy = policy_of(params.PolicyFlags(file=p.policy), p.lookup.keys)
        rows = qualified.rows_of(p.repository, policy, ctx.log)
        document = qualified.markdown(rows) if p.markdown else qualified.text(rows)
        fields: dict[str, object] = {
            "digests": len(rows),
            "qualified": sum(row.qualified for row in rows),
        }
        as_json = {**fields, "rows": [row.as_dict() for row in rows]}
        unproven = [row for row in rows if row.not_counted and not row.signed]
        if unproven:
            fields["not verified"] = "; ".join(
                f"{', '.join(row.tags)} ({row.digest}): {row.not_counted} attestation(s), none verifies"
                for row in unproven
            )
        error = None
        if not any(row.signed for row in rows):
            unverified = sum(row.not_counted for row in rows)
            error = CheckError(
                f"no image in {p.repository} has servimg evidence a given key verifies"
                + (f" ({unverified} attestation(s) found, none counted)" if unverified else ""),
                hint="pass the signer's public key with --key "
                "(`servimg push` and `servimg ladder --attach` sign them)",
            )
        return Outcome(p.repository, fields, as_json, document=document, error=error)

    yield attempt(p.repository, run)
