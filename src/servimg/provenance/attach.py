"""Provenance that travels with the digest: push an image with its attestations, attach later results,
promote by policy.

Order is the guarantee. `push`: blobs, the manifest by digest, every attestation (its subject is that
manifest), and only then the tag. A tag therefore never exists without the attestations it was pushed
with, and a push killed at any point leaves no tag; running it again reuses what arrived (blobs, the
manifest, attestations whose envelope is already attached) and finishes. `promote` moves its tag only
after the policy passed and the VSA is attached.

Attaching never changes the image: each attach is bracketed by a HEAD of the image manifest by digest,
and a different answer (digest or size) stops everything with an error.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypedDict, Unpack

from servimg.backends import registry, transport
from servimg.backends.referrers import Referrers
from servimg.backends.registryclient import RegistryClient
from servimg.backends.registryreferrers import RegistryReferrers
from servimg.backends.target import Target, WriteOptions
from servimg.builder.pipeline import build
from servimg.builder.seams import DEFAULT, ProbeVerifier, Seams, Verified, verify_or_refuse
from servimg.builder.verify import VerifyFailed, VerifyReport
from servimg.core.digest import Digest
from servimg.core.errors import BuildError, ServimgError
from servimg.core.progress import NULL, Log, Progress
from servimg.core.reference import Reference, is_valid_tag
from servimg.oci.image import Descriptor, Image
from servimg.oci.store import BlobStore
from servimg.provenance import attest, binding, dsse, referrers, sbom
from servimg.provenance import rebuild as rebuilds
from servimg.provenance import statements as provenance
from servimg.provenance.check import CheckFailed, CheckReport, Policy, evaluate, gather
from servimg.provenance.evidence import Located, locate, top_layer
from servimg.provenance.policy import REBUILD_V1
from servimg.provenance.statements import ImageFacts, Invocation


class AttachError(ServimgError):
    """An image or result could not be pushed, attached or promoted."""


@dataclass(frozen=True)
class Attached:
    kind: str
    artifact: str
    signed: bool
    reused: bool

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "artifact": self.artifact, "signed": self.signed, "reused": self.reused}


@dataclass(frozen=True)
class Pushed:
    digest: Digest
    config_digest: Digest
    destination: str
    tag: str | None
    attached: tuple[Attached, ...]
    note: str | None = None  # what was deliberately not attached, and why

    def as_dict(self) -> dict[str, object]:
        return {
            "digest": str(self.digest),
            "config_digest": str(self.config_digest),
            "destination": self.destination,
            "tag": self.tag,
            "attestations": [a.as_dict() for a in self.attached],
            **({"note": self.note} if self.note else {}),
        }


@dataclass(frozen=True)
class Envelope:
    """A signed (or deliberately unsigned) statement ready to attach."""

    kind: str
    predicate_type: str
    data: bytes
    signed: bool


def envelope(statement: bytes, key: dsse.SigningKey | None) -> tuple[bytes, bool]:
    """DSSE envelope bytes: signed with `key`, or unsigned (which `check` reports) when key is None."""
    if key is not None:
        return attest.sign_statement(statement, key).to_bytes(), True
    attest.parse_statement(statement)
    return dsse.Envelope(attest.PAYLOAD_TYPE, statement, ()).to_bytes(), False


def _make(kind: str, predicate_type: str, statement: bytes, key: dsse.SigningKey | None) -> Envelope:
    data, signed = envelope(statement, key)
    return Envelope(kind, predicate_type, data, signed)


# ------------------------------------------------------------------------------------------------ facts


def image_facts(image: Image, store: BlobStore, log: Log) -> ImageFacts:
    return provenance.read_facts(top_layer(image, store, log))


def build_statements(
    image: Image,
    facts: ImageFacts,
    report: VerifyReport,
    key: dsse.SigningKey | None,
    store: BlobStore,
    *,
    invocation: Invocation,
    builder: str | None = None,
) -> list[Envelope]:
    """The provenance, the verify test-result and the SBOM of `image` (every layer in `store`), as
    envelopes (deterministic when the invocation has no times: ed25519 signatures are, so a rerun
    attaches nothing new)."""
    name = provenance.subject_name(facts)
    subjects = provenance.subjects(name, image.digest, image.config_digest)
    prov = provenance.provenance_predicate(facts, invocation, provenance.builder_id(builder))
    verify = provenance.verify_predicate(report, facts)
    bom = sbom.build_sbom(image, facts, sbom.image_filesystem(image, store), name)
    return [
        _make("sbom", attest.CYCLONEDX_BOM, attest.statement(subjects, attest.CYCLONEDX_BOM, bom), key),
        _make(
            "provenance", attest.PROVENANCE_V1, attest.statement(subjects, attest.PROVENANCE_V1, prov), key
        ),
        _make(
            "test-result",
            attest.TEST_RESULT_V01,
            attest.statement(subjects, attest.TEST_RESULT_V01, verify),
            key,
        ),
    ]


# ------------------------------------------------------------------------------------------------ push


class PushOptions(TypedDict, total=False):
    """What `push` and `push_image` take beside the image and the destination."""

    key: dsse.SigningKey | None
    report: VerifyReport | None  # the probe runs when it is None
    builder: str | None
    invocation: Invocation | None
    tag: str | None
    progress: Progress
    unsigned: bool  # without a key, attach unsigned attestations even beside signed ones


def push(image_ref: str, dest: str, store: BlobStore, log: Log, **options: Unpack[PushOptions]) -> Pushed:
    """`servimg push IMAGE REPO[:TAG]` (or `oci:DIR[:TAG]`): the image, its signed provenance and its
    verify result. `report` (a VerifyReport) is used instead of running the probe when given."""
    image = transport.fetch_argument(image_ref, store, log, progress=options.get("progress", NULL))
    return push_image(image, dest, store, log, **options)


def push_image(
    image: Image,
    dest: str,
    store: BlobStore,
    log: Log,
    *,
    key: dsse.SigningKey | None = None,
    report: VerifyReport | None = None,
    builder: str | None = None,
    invocation: Invocation | None = None,
    tag: str | None = None,
    progress: Progress = NULL,
    unsigned: bool = False,
) -> Pushed:
    """Push an image value whose blobs are in `store` (see `push`) to a registry or an OCI layout: the
    places attestations can live beside the image.

    Without a key, a digest that already carries signed attestations at the destination gets none of
    the unsigned ones (`check` would only report them, ignored): the image and tag are pushed and the
    result says so; `unsigned` attaches them anyway."""
    target = Target.parse(dest)
    if not target.holds_attestations:
        raise AttachError(
            f"{dest}: attestations cannot live in a {target.kind}",
            hint="push to HOST/REPO[:TAG] or oci:DIR[:TAG]",
        )
    facts = image_facts(image, store, log)
    binding.refuse_rebinding(binding.tag_of(dest) or tag, facts.definition, facts.lock_digest, "push under")
    if report is None:  # the same verifier a build runs (cached verdicts, split where it can)
        report = verify_or_refuse(
            ProbeVerifier(), image, store, log, base_config=None, consequence="nothing was pushed"
        )
    elif not report.ok:
        raise VerifyFailed(report, subject=image.digest.short, consequence="nothing was pushed")
    invocation = invocation or Invocation(f"servimg-push:{image.digest}", command=("servimg", "push"))
    envelopes = build_statements(image, facts, report, key, store, invocation=invocation, builder=builder)
    note = None
    if key is None and not unsigned:
        signed = signed_attestations(target, image.digest)
        if signed:
            note = (
                f"attached nothing unsigned: {image.digest} already carries {signed} signed "
                "attestation(s) here (sign with --key; --unsigned attaches unsigned ones anyway)"
            )
            log(note)
            envelopes = []
    if target.is_layout:
        pushed = _push_layout(image, target, store, log, envelopes, tag)
    else:
        pushed = _push_registry(image, dest, store, log, envelopes, tag, progress)
    return replace(pushed, note=note)


def signed_attestations(target: Target, subject: Digest) -> int:
    """How many attestations of `subject` at the destination carry at least one signature (whoever's:
    an unsigned push beside any signed evidence adds only noise). Unreadable entries are not counted."""
    with transport.referrers(target) as place:
        listed, _ = place.discover(subject)
        return _count_signed(listed, lambda a: referrers.fetch_envelope(place, subject, a))


def _count_signed(listed: Sequence[Mapping[str, object]], fetch: Callable[[Digest], bytes]) -> int:
    count = 0
    for descriptor in listed:
        try:
            count += bool(dsse.Envelope.parse(fetch(Digest.parse(str(descriptor.get("digest"))))).signatures)
        except ServimgError:
            continue
    return count


def _push_registry(
    image: Image,
    dest: str,
    store: BlobStore,
    log: Log,
    envelopes: Sequence[Envelope],
    tag: str | None,
    progress: Progress,
) -> Pushed:
    """Blobs and the manifest by digest (`backends.registry`), every attestation, the tag last."""
    ref = Reference.parse(dest)
    if ref.digest is not None:
        raise AttachError(f"{dest}: push to a repository (and tag), not a digest")
    chosen = ref.tag or tag
    with RegistryClient(ref.registry) as client:
        registry.write_image(client, ref.repository, image, store, log, progress=progress)
        subject = _subject(image)
        attached = [_attach_confirmed(client, ref.repository, subject, e, log) for e in envelopes]
        if chosen:
            registry.put_tag(client, ref.repository, chosen, image, log)
            _confirm(client, ref.repository, chosen, subject, "after tagging")
    where = f"{ref.name}" + (f":{chosen}" if chosen else "") + f"@{image.digest}"
    return Pushed(image.digest, image.config_digest, where, chosen, tuple(attached))


def _subject(image: Image) -> Descriptor:
    return Descriptor(image.media_type, image.digest, len(image.manifest_bytes))


def _confirm(client: RegistryClient, repo: str, reference: str, subject: Descriptor, when: str) -> None:
    """HEAD the image manifest: it must still be exactly `subject` (attaching never changes it)."""
    head = client.head_manifest(repo, reference)
    if head is None or head[0] != subject.digest or head[2] != subject.size:
        found = f"{head[0]} ({head[2]} bytes)" if head is not None else "nothing"
        raise AttachError(
            f"{repo}@{reference} {when}: the registry answers {found}, "
            f"expected {subject.digest} ({subject.size} bytes)",
            hint="something rewrote the image manifest; do not trust this registry's copy",
        )


def _attach_confirmed(
    client: RegistryClient, repo: str, subject: Descriptor, env: Envelope, log: Log
) -> Attached:
    """`_attach` in a registry repository, the image manifest confirmed to be exactly the subject before
    and after (attaching never changes it)."""
    _confirm(client, repo, str(subject.digest), subject, "before attaching")
    attached = _attach(RegistryReferrers(client, repo), subject, env, log)
    _confirm(client, repo, str(subject.digest), subject, "after attaching")
    return attached


def _attach(place: Referrers, subject: Descriptor, env: Envelope, log: Log) -> Attached:
    """Attach one envelope unless the same envelope is already attached (idempotent reruns)."""
    artifact_type = attest.artifact_type(env.kind)
    existing = referrers.already_attached(place, subject.digest, artifact_type, Digest.of_bytes(env.data))
    if existing is not None:
        log(f"{env.kind}: already attached as {existing.short}")
        return Attached(env.kind, str(existing), env.signed, True)
    annotations = referrers.attestation_annotations(env.predicate_type, provenance.now())
    digest = referrers.attach(place, subject, env.data, artifact_type, annotations)
    log(f"{env.kind}: attached as {digest.short} ({'signed' if env.signed else 'UNSIGNED'})")
    return Attached(env.kind, str(digest), env.signed, False)


def _push_layout(
    image: Image, target: Target, store: BlobStore, log: Log, envelopes: Sequence[Envelope], tag: str | None
) -> Pushed:
    root = Path(target.location)
    chosen = target.tag or tag
    transport.publish(image, Target.layout(root, chosen), store, log, tag=chosen)
    with transport.referrers(Target.layout(root)) as place:
        attached = tuple(_attach(place, _subject(image), e, log) for e in envelopes)
    return Pushed(image.digest, image.config_digest, Target.layout(root, chosen).text(), chosen, attached)


# ---------------------------------------------------------------------------------------- build --sign


@dataclass(frozen=True)
class AttestingSink:
    """The signed route as a sink of the one pipeline (`builder.pipeline.build`): the verified image is
    pushed with the signed provenance of this very build (its invocation: id, start, end, command) and
    its verify result (`push_image`). `attached` collects what was attached, for the command's result."""

    key: dsse.SigningKey | None
    command: tuple[str, ...]
    builder: str | None = None
    started: str = dataclasses.field(default_factory=provenance.now)
    attached: list[Attached] = dataclasses.field(default_factory=list)

    def check(self, target: Target) -> None:
        if not target.holds_attestations:
            raise BuildError(
                f"--sign needs a registry or an OCI layout target, not {target.kind}",
                hint="attestations live beside the image: --to HOST/REPO[:TAG] or --to oci:DIR[:TAG]",
            )
        transport.check_reachable(target)

    def publish(
        self, image: Image, target: Target, store: BlobStore, log: Log, **options: Unpack[WriteOptions]
    ) -> str:
        raise BuildError("a signed build publishes only a verified image", hint="build without verify=False")

    def publish_verified(
        self, verified: Verified, target: Target, store: BlobStore, log: Log, **options: Unpack[WriteOptions]
    ) -> str:
        image, report = verified.image, verified.report
        store.put_bytes(image.config_bytes)  # push_image reads every blob from the store
        invocation = Invocation(f"urn:uuid:{uuid.uuid4()}", self.started, provenance.now(), self.command)
        pushed = push_image(
            image,
            target.text(),
            store,
            log,
            key=self.key,
            report=report,
            builder=self.builder,
            invocation=invocation,
            tag=options.get("tag"),
            progress=options.get("progress") or NULL,
        )
        self.attached.extend(pushed.attached)
        return pushed.destination


def build_and_push(
    definition_path: Path,
    store: BlobStore,
    log: Log,
    *,
    to: str,
    key: dsse.SigningKey | None,
    runner: str = "auto",
    tag: str | None = None,
    builder: str | None = None,
    progress: Progress = NULL,
    seams: Seams = DEFAULT,
) -> dict[str, object]:
    """`servimg build DEF --to REPO|oci:DIR --sign KEY`: the one build pipeline, verified once, published
    by an `AttestingSink` (the image with the signed provenance of this very build and its verify result)."""
    if not to:
        raise BuildError("--sign needs --to", hint="--to HOST/REPO[:TAG] or --to oci:DIR[:TAG]")
    sink = AttestingSink(key, ("servimg", "build", definition_path.name, "--to", to, "--sign"), builder)
    result = build(
        definition_path,
        store,
        log,
        to=to,
        runner=runner,
        tag=tag,
        progress=progress,
        seams=dataclasses.replace(seams, sink=sink),
    )
    return {**result.as_dict(), "attestations": [a.as_dict() for a in sink.attached]}


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
    store: BlobStore,
    log: Log,
    *,
    key: dsse.SigningKey | None = None,
    repo: str | None = None,
    remote: bool = False,
) -> Attached:
    """`servimg attest REF --predicate-type T --file F`: attach a later result to the image REF names."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise AttachError(f"cannot read {file}: {exc.strerror}") from None
    located = locate(ref, store, log, repo=repo, remote=remote)
    kind_type, predicate = predicate_from_file(data, predicate_type, located.digest, located.config_digest)
    kind = attest.kind_of(kind_type)
    subjects = provenance.subjects(located.name, located.digest, located.config_digest)
    env = _make(kind, kind_type, attest.statement(subjects, kind_type, predicate), key)
    return _attach_located(located, env, log)


def attest_rebuild(
    located: Located,
    result: rebuilds.Rebuilt,
    key: dsse.SigningKey,
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
    env = _make("rebuild", REBUILD_V1, attest.statement(subjects, REBUILD_V1, predicate), key)
    return _attach_located(located, env, log)


def _attach_located(located: Located, env: Envelope, log: Log) -> Attached:
    subject = _subject(located.image)
    if located.layout is not None:
        with transport.referrers(Target.layout(located.layout)) as place:
            return _attach(place, subject, env, log)
    with located.client() as client:
        return _attach_confirmed(client, str(located.repository), subject, env, log)


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
    store: BlobStore,
    log: Log,
    policy: Policy,
    *,
    key: dsse.SigningKey | None = None,
    verifier: str | None = None,
    deep: bool = False,
    repo: str | None = None,
    remote: bool = False,
) -> Promoted:
    """Check REF against `policy`; only if it passes, attach a VSA and then move `tag` to the digest."""
    if not is_valid_tag(tag):
        raise AttachError(f"invalid tag {tag!r}", hint="tags are 1-128 of [A-Za-z0-9_.-]")
    located = locate(ref, store, log, repo=repo, remote=remote)
    if located.registry is None:
        raise AttachError(f"{ref} is not in a registry; promotion moves a registry tag")
    evidence = gather(located, store, log, policy, deep=deep)
    if evidence.facts is not None:
        facts = evidence.facts
        binding.refuse_rebinding(tag, facts.definition, facts.lock_digest, f"promote {located.name} to")
    report = evaluate(policy, evidence)
    if not report.ok:
        raise CheckFailed(report, f"{located.name}:{tag} was not moved")
    subjects = provenance.subjects(located.name, located.digest, located.config_digest)
    predicate = vsa_predicate(report, located, policy, verifier or provenance.DEFAULT_VERIFIER_ID)
    env = _make("vsa", attest.VSA_V1, attest.statement(subjects, attest.VSA_V1, predicate), key)
    with located.client() as client:
        subject = _subject(located.image)
        vsa = _attach_confirmed(client, str(located.repository), subject, env, log)
        registry.put_tag(client, str(located.repository), tag, located.image, log)
        _confirm(client, str(located.repository), tag, subject, "after promotion")
    return Promoted(report, tag, vsa)
