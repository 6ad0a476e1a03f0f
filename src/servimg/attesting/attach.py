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
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypedDict, Unpack

from servimg.assembly.context import Context
from servimg.assembly.pipeline import build
from servimg.assembly.plan import BuildPlan
from servimg.assembly.release import PlatformImage, ProvenRelease, Release
from servimg.assembly.seams import Staged
from servimg.backends import registry, transport
from servimg.backends.referrers import Referrers
from servimg.backends.registryclient import RegistryClient
from servimg.backends.registryreferrers import RegistryReferrers
from servimg.backends.target import Holds, LayoutTarget, RegistryTarget, Target
from servimg.core.context import Log
from servimg.core.digest import Digest
from servimg.core.errors import BuildError, ServimgError
from servimg.core.reference import Reference
from servimg.formats import cosign, referrers
from servimg.formats.publish import DEFAULT_FORMATS, Attached, Envelope, publish
from servimg.judging import indexcheck
from servimg.judging.evidence import top_layer
from servimg.oci.image import Descriptor, Image
from servimg.oci.index import ImageIndex
from servimg.oci.store import BlobStore
from servimg.proof.verifier import verify_or_refuse
from servimg.proof.verify import VerifyFailed, VerifyReport
from servimg.signing import dsse, gpgsign
from servimg.statements import attest, binding, sbom, vex
from servimg.statements import derived as provenance
from servimg.statements.derived import ImageFacts, Invocation


class AttachError(ServimgError):
    """An image or result could not be pushed, attached or promoted."""


@dataclass(frozen=True)
class Pushed:
    digest: Digest
    config_digest: Digest
    destination: str
    tag: str | None
    attached: tuple[Attached, ...]
    note: str | None = None  # what was deliberately not attached, and why
    gpg: tuple[gpgsign.GpgSigned, ...] = ()
    signatures: tuple[str, ...] = ()  # cosign simple signatures of the manifest (`.sig` layers)

    def as_dict(self) -> dict[str, object]:
        return {
            "digest": str(self.digest),
            "config_digest": str(self.config_digest),
            "destination": self.destination,
            "tag": self.tag,
            "attestations": [a.as_dict() for a in self.attached],
            **({"signatures": list(self.signatures)} if self.signatures else {}),
            **({"gpg_signatures": [g.as_dict() for g in self.gpg]} if self.gpg else {}),
            **({"note": self.note} if self.note else {}),
        }


def envelope(statement: bytes, key: dsse.Signer | None) -> tuple[bytes, bool]:
    """DSSE envelope bytes: signed with `key`, or unsigned (which `check` reports) when key is None."""
    if key is not None:
        return attest.sign_statement(statement, key).to_bytes(), True
    attest.parse_statement(statement)
    return dsse.Envelope(attest.PAYLOAD_TYPE, statement, ()).to_bytes(), False


def make_envelope(kind: str, predicate_type: str, statement: bytes, key: dsse.Signer | None) -> Envelope:
    data, signed = envelope(statement, key)
    return Envelope(kind, predicate_type, data, signed)


# ------------------------------------------------------------------------------------------------ facts


def image_facts(image: Image, ctx: Context) -> ImageFacts:
    return provenance.read_facts(top_layer(image, ctx))


def build_statements(
    image: Image,
    facts: ImageFacts,
    report: VerifyReport,
    key: dsse.Signer | None,
    store: BlobStore,
    *,
    invocation: Invocation,
    builder: str | None = None,
    pulled_from: str | None = None,
) -> list[Envelope]:
    """The provenance, the verify test-result and the SBOM of `image` (every layer in `store`), as
    envelopes (deterministic when the invocation has no times: ed25519 signatures are, so a rerun
    attaches nothing new). `pulled_from` is the registry repository it is published to (VEX names it)."""
    name = provenance.subject_name(facts)
    subjects = provenance.subjects(name, image.digest, image.config_digest)
    prov = provenance.provenance_predicate(facts, invocation, provenance.builder_id(builder))
    verify = provenance.verify_predicate(report, facts)
    bom = sbom.build_sbom(image, facts, sbom.image_filesystem(image, store), name)
    document = vex.openvex(facts, name, image.digest, provenance.builder_id(builder), pulled_from=pulled_from)
    vex_envelopes = (
        [
            make_envelope(
                "vex", attest.OPENVEX_V020, attest.statement(subjects, attest.OPENVEX_V020, document), key
            )
        ]
        if document is not None
        else []
    )
    return [
        *vex_envelopes,
        make_envelope(
            "sbom", attest.CYCLONEDX_BOM, attest.statement(subjects, attest.CYCLONEDX_BOM, bom), key
        ),
        make_envelope(
            "provenance", attest.PROVENANCE_V1, attest.statement(subjects, attest.PROVENANCE_V1, prov), key
        ),
        make_envelope(
            "test-result",
            attest.TEST_RESULT_V01,
            attest.statement(subjects, attest.TEST_RESULT_V01, verify),
            key,
        ),
    ]


# ------------------------------------------------------------------------------------------------ push


class PushOptions(TypedDict, total=False):
    """What `push` and `push_image` take beside the image and the destination."""

    key: dsse.Signer | None
    report: VerifyReport | None  # the context's verifier seam is asked for one when it is None
    builder: str | None
    invocation: Invocation | None
    tag: str | None
    unsigned: bool  # without a key, attach unsigned attestations even beside signed ones
    formats: frozenset[str]  # formats.cosign.FORMATS to write (default: all)
    gpg: GpgPlan | None  # containers/image GPG simple signatures too


def push(image_ref: str, dest: str, ctx: Context, **options: Unpack[PushOptions]) -> Pushed:
    """`servimg push IMAGE REPO[:TAG]` (or `oci:DIR[:TAG]`): the image, its signed provenance and its
    verify result. `report` (a VerifyReport) is used instead of the context's verifier when given."""
    image = transport.fetch_argument(image_ref, ctx, progress=ctx.progress)
    return push_image(image, Target.parse(dest), ctx, **options)


def push_image(
    image: Image,
    target: Target,
    ctx: Context,
    *,
    key: dsse.Signer | None = None,
    report: VerifyReport | None = None,
    builder: str | None = None,
    invocation: Invocation | None = None,
    tag: str | None = None,
    unsigned: bool = False,
    formats: frozenset[str] = DEFAULT_FORMATS,
    gpg: GpgPlan | None = None,
) -> Pushed:
    """Push an image value whose blobs are in the context's store (see `push`) to a registry or an OCI
    layout: the places attestations can live beside the image. Without `report`, the context's verifier
    seam proves it first (`Seams.verifier`: the build's own).

    Without a key, a digest that already carries signed attestations at the destination gets none of
    the unsigned ones (`check` would only report them, ignored): the image and tag are pushed and the
    result says so; `unsigned` attaches them anyway."""
    dest = target.text()
    if not target.holds(Holds.ATTESTATIONS):
        raise AttachError(
            f"{dest}: attestations cannot live in {target.described}",
            hint="push to HOST/REPO[:TAG] or oci:DIR[:TAG]",
        )
    if gpg is not None and not target.holds(Holds.SIMPLE_SIGNATURES):
        raise AttachError(
            f"{dest}: GPG simple signatures are for images in a registry (containers/image keeps none for "
            "an OCI layout)",
            hint="push to HOST/REPO[:TAG] with --gpg-key, or leave --gpg-key out",
        )
    store, log = ctx.store, ctx.log
    facts = image_facts(image, ctx)
    binding.refuse_rebinding(target.named_tag or tag, facts.definition, facts.lock_digest, "push under")
    if report is None:  # the verifier a build runs: the one seam
        report = verify_or_refuse(
            ctx.seams.verifier, image, ctx, base_config=None, consequence="nothing was pushed"
        )
    elif not report.ok:
        raise VerifyFailed(report, subject=image.digest.short, consequence="nothing was pushed")
    invocation = invocation or Invocation(f"servimg-push:{image.digest}", command=("servimg", "push"))
    pulled_from = None if target.reference is None else vex.repository_url(target.reference)
    envelopes = build_statements(
        image, facts, report, key, store, invocation=invocation, builder=builder, pulled_from=pulled_from
    )
    if key is not None:
        envelopes = _not_yet_stated(target, image.digest, envelopes, key, log)
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
    publishing = Publishing(envelopes, key, formats, gpg)
    push = _PUSHES[type(target)]  # a place that holds attestations: checked above
    return replace(push(image, target, ctx, publishing, tag), note=note)


@dataclass(frozen=True)
class Publishing:
    """What a push publishes beside the image, before its tag moves: the attestations, and with a key
    the manifest's own cosign signature (`.sig`), each in the chosen formats."""

    envelopes: Sequence[Envelope]
    key: dsse.Signer | None
    formats: frozenset[str]
    gpg: GpgPlan | None = None

    def publish(
        self, place: Referrers, subject: Descriptor, name: str, log: Log
    ) -> tuple[tuple[Attached, ...], tuple[str, ...]]:
        """The attestations as attached, and the manifest's cosign signatures (`.sig`)."""
        signer = (self.key, name) if self.key is not None else None
        return publish(place, subject, self.envelopes, self.formats, signer, log)


@dataclass(frozen=True)
class GpgPlan:
    """`--gpg-key FPR [--lookaside DIR]`: containers/image simple signatures of each pushed reference."""

    signer: gpgsign.GpgSigner
    lookaside: gpgsign.Lookaside | None = None


@dataclass(frozen=True)
class _GpgSignature:
    """A GPG signature made before anything was pushed (a key that cannot sign stops the push first)."""

    plan: GpgPlan
    reference: str
    digest: Digest
    data: bytes
    to_registry: bool


def gpg_prepare(
    plan: GpgPlan | None, client: RegistryClient, reference: str, *digests: Digest
) -> tuple[_GpgSignature, ...]:
    """A signature of each manifest in `digests` under `reference`, made before anything is pushed (the
    registry asked once whether it keeps them itself)."""
    if plan is None:
        return ()
    to_registry = client.supports_signatures()
    if plan.lookaside is None and not to_registry:
        raise AttachError(
            f"--gpg-key: {client.registry} does not store signatures (no X-Registry-Supports-Signatures), "
            "and no --lookaside DIR was given",
            hint="pass --lookaside DIR (serve it over HTTP and name it in registries.d: "
            "`servimg policy export --runtime containers`)",
        )
    return tuple(
        _GpgSignature(plan, reference, d, plan.signer.sign(gpgsign.atomic_payload(reference, d)), to_registry)
        for d in digests
    )


def gpg_write(
    prepared: Sequence[_GpgSignature], client: RegistryClient, repository: str, log: Log
) -> tuple[gpgsign.GpgSigned, ...]:
    out = []
    for signature in prepared:
        lookaside = signature.plan.lookaside
        if lookaside is not None:
            there = lookaside.signatures(repository, signature.digest)
            found = gpgsign.existing(signature.plan.signer, there, signature.reference, signature.digest)
            path = found or lookaside.add(repository, signature.digest, signature.data)
            log(f"gpg signature of {signature.reference}: {path}" + (" (already there)" if found else ""))
            out.append(gpgsign.GpgSigned(signature.reference, str(path), found is not None))
        if signature.to_registry:
            name = f"{signature.digest}@{uuid.uuid4().hex}"
            client.put_signature(repository, signature.digest, name, signature.data)
            out.append(gpgsign.GpgSigned(signature.reference, f"registry:{name}", False))
    return tuple(out)


def _signed_identity(ref: Reference, tag: str | None, digest: Digest) -> str:
    """The docker reference a GPG signature names: the tag pushed (containers/image's default
    `matchRepoDigestOrExact` wants exactly the pulled reference), else the digest."""
    return f"{ref.name}:{tag}" if tag else f"{ref.name}@{digest}"


def _not_yet_stated(
    target: Target, subject: Digest, envelopes: Sequence[Envelope], key: dsse.Signer, log: Log
) -> list[Envelope]:
    """The envelopes to publish, each one this key already made about `subject` at the destination
    replaced by the copy that is there.

    A push is idempotent (issue 48 item 5): pushing the same image again, or pushing what `build --sign`
    already published, states nothing new, so nothing new is attached, even where the signature bytes
    would differ (ECDSA is randomised; a build's provenance carries its own invocation id and times).
    Publishing the copy that is there reports it as already attached, and completes any format it is
    still missing from. The same statement is `attest.statement_identity`: what it says, without when or
    by which command it was said. Only envelopes this key verifiably signed count: anyone may attach
    bytes claiming to be ours."""
    stated = _stated_by(target, subject, key.public_key)
    out = []
    for envelope in envelopes:
        identity = attest.statement_identity(dsse.Envelope.parse(envelope.data).payload)
        there = stated.get(identity) if identity is not None else None
        if there is not None and there != envelope.data:
            log(
                f"{envelope.kind}: this key already stated the same about {subject.short} here: kept as it is"
            )
            envelope = replace(envelope, data=there)
        out.append(envelope)
    return out


def _stated_by(target: Target, subject: Digest, key: dsse.VerifyKey) -> dict[bytes, bytes]:
    """The statements about `subject` at `target` that `key` verifiably signed: identity → envelope."""
    out: dict[bytes, bytes] = {}
    with transport.referrers(target) as place:
        listed, _ = place.discover(subject)
        for descriptor in listed:
            if descriptor.get("artifactType") == cosign.BUNDLE_V03:
                continue  # a bundle wraps the same envelope as a referrer of its own
            try:
                data = referrers.fetch_envelope(place, subject, Digest.parse(str(descriptor.get("digest"))))
                envelope = dsse.Envelope.parse(data)
            except ServimgError:
                continue  # unreadable or foreign: `check` reports it; here it simply states nothing
            if dsse.verify(envelope, [key]).verified:
                identity = attest.statement_identity(envelope.payload)
                if identity is not None:
                    out.setdefault(identity, data)
    return out


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
    image: Image, target: Target, ctx: Context, publishing: Publishing, tag: str | None
) -> Pushed:
    """Blobs and the manifest by digest (`backends.registry`), every attestation and signature, the
    tag last."""
    ref = target.registry_ref
    if ref.digest is not None:
        raise AttachError(f"{target.text()}: push to a repository (and tag), not a digest")
    chosen = ref.tag or tag
    with RegistryClient(ref.registry) as client:
        gpg = gpg_prepare(publishing.gpg, client, _signed_identity(ref, chosen, image.digest), image.digest)
        registry.write_image(client, ref.repository, image, ctx, progress=ctx.progress)
        subject = subject_descriptor(image)
        attached, signatures = publish_confirmed(
            client, ref.repository, subject, publishing, ref.name, ctx.log
        )
        signed = gpg_write(gpg, client, ref.repository, ctx.log)
        if chosen:
            registry.put_tag(client, ref.repository, chosen, image, ctx.log)
            confirm_unchanged(client, ref.repository, chosen, subject, "after tagging")
    where = f"{ref.name}" + (f":{chosen}" if chosen else "") + f"@{image.digest}"
    return Pushed(
        image.digest, image.config_digest, where, chosen, attached, gpg=signed, signatures=signatures
    )


def subject_descriptor(image: Image) -> Descriptor:
    return Descriptor(image.media_type, image.digest, len(image.manifest_bytes))


def confirm_unchanged(
    client: RegistryClient, repo: str, reference: str, subject: Descriptor, when: str
) -> None:
    """HEAD the image manifest: it must still be exactly `subject` (attaching never changes it)."""
    head = client.head_manifest(repo, reference)
    if head is None or head[0] != subject.digest or head[2] != subject.size:
        found = f"{head[0]} ({head[2]} bytes)" if head is not None else "nothing"
        raise AttachError(
            f"{repo}@{reference} {when}: the registry answers {found}, "
            f"expected {subject.digest} ({subject.size} bytes)",
            hint="something rewrote the image manifest; do not trust this registry's copy",
        )


def publish_confirmed(
    client: RegistryClient, repo: str, subject: Descriptor, publishing: Publishing, name: str, log: Log
) -> tuple[tuple[Attached, ...], tuple[str, ...]]:
    """`publishing` in a registry repository, the image manifest confirmed to be exactly the subject
    before and after (attaching never changes it)."""
    confirm_unchanged(client, repo, str(subject.digest), subject, "before attaching")
    attached = publishing.publish(RegistryReferrers(client, repo), subject, name, log)
    confirm_unchanged(client, repo, str(subject.digest), subject, "after attaching")
    return attached


def _push_layout(
    image: Image, target: Target, ctx: Context, publishing: Publishing, tag: str | None
) -> Pushed:
    root = Path(target.location)
    chosen = target.tag or tag
    transport.publish(image, Target.layout(root, chosen), ctx, tag=chosen)
    with transport.referrers(Target.layout(root)) as place:
        attached, signatures = publishing.publish(
            place, subject_descriptor(image), Target.layout(root).text(), ctx.log
        )
    where = Target.layout(root, chosen).text()
    return Pushed(image.digest, image.config_digest, where, chosen, attached, signatures=signatures)


# How each place that holds attestations takes an image with them: a registry in one client session,
# the manifest confirmed unchanged around the attaching (and GPG signatures, which only a registry keeps);
# a layout by its backend and its referrers.
_Push = Callable[[Image, Target, Context, Publishing, str | None], Pushed]
_PUSHES: dict[type[Target], _Push] = {RegistryTarget: _push_registry, LayoutTarget: _push_layout}


# ---------------------------------------------------------------------------------------- build --sign


@dataclass(frozen=True)
class AttestingSink:
    """The signed route as a sink of the one pipeline (`assembly.pipeline.build`): the verified image is
    pushed with the signed provenance of this very build (its invocation: id, start, end, command) and
    its verify result (`push_image`). `attached` collects what was attached, for the command's result."""

    key: dsse.Signer | None
    command: tuple[str, ...]
    builder: str | None = None
    started: str = dataclasses.field(default_factory=provenance.now)
    attached: list[Attached] = dataclasses.field(default_factory=list)
    formats: frozenset[str] = DEFAULT_FORMATS
    gpg: GpgPlan | None = None

    def check(self, target: Target) -> None:
        if not target.holds(Holds.ATTESTATIONS):
            raise BuildError(
                f"--sign needs a registry or an OCI layout target, not {target.described}",
                hint="attestations live beside the image: --to HOST/REPO[:TAG] or --to oci:DIR[:TAG]",
            )
        if self.gpg is not None and not target.holds(Holds.SIMPLE_SIGNATURES):
            raise BuildError(
                f"--gpg-key: GPG simple signatures are for images in a registry, not {target.described} "
                "(containers/image keeps none for an OCI layout)",
                hint="build --to HOST/REPO[:TAG] with --gpg-key, or leave --gpg-key out",
            )
        transport.check_reachable(target)

    def stage(self, release: Release, ctx: Context) -> Staged | None:
        return None  # nothing is pushed before the release is proven

    def publish(self, proven: ProvenRelease, staged: Staged | None, ctx: Context) -> str:
        """One proven image with its attestations, or every child with its own and then the index with
        its provenance naming the children, the tag last."""
        if proven.index is None:
            (one,) = proven.images
            return self._push(one, proven.target, ctx, tag=proven.tag, gpg=self.gpg)
        return self._push_index(proven.index, proven.images, proven.target, ctx, tag=proven.tag)

    def _push(
        self, child: PlatformImage, target: Target, ctx: Context, *, tag: str | None, gpg: GpgPlan | None
    ) -> str:
        image, report = child.image, child.report
        if report is None:
            raise BuildError("a signed build publishes only verified images", hint="build with verify")
        ctx.store.put_bytes(image.config_bytes)  # push_image reads every blob from the store
        invocation = Invocation(f"urn:uuid:{uuid.uuid4()}", self.started, provenance.now(), self.command)
        pushed = push_image(
            image,
            target,
            ctx,
            key=self.key,
            report=report,
            builder=self.builder,
            invocation=invocation,
            tag=tag,
            formats=self.formats,
            gpg=gpg,
        )
        self.attached.extend(pushed.attached)
        return pushed.destination

    def _push_index(
        self, index: ImageIndex, children: Sequence[PlatformImage], target: Target, ctx: Context, *, tag: str
    ) -> str:
        """Every child with its own provenance, verify result and SBOM (by digest, no tag), then the index,
        its own provenance naming the children, the GPG signatures (`--gpg-key`), and the tag last (each
        written once)."""
        # Signed first: a key that cannot sign stops it before anything is pushed.
        signatures = self._gpg_prepare_index(index, children, target, tag)
        untagged = target.untagged()
        for child in children:
            self._push(child, untagged, ctx, tag=None, gpg=None)
        transport.name_index(index, untagged, tag=None)
        invocation = Invocation(f"urn:uuid:{uuid.uuid4()}", self.started, provenance.now(), self.command)
        name = index_name(children, ctx)
        builder = provenance.builder_id(self.builder)
        statement = indexcheck.index_statement(index, children, name, invocation, builder)
        envelopes = [make_envelope("provenance", attest.PROVENANCE_V1, statement, self.key)]
        with transport.referrers(untagged) as place:
            published, _ = Publishing(envelopes, self.key, self.formats).publish(
                place, index.descriptor, name, ctx.log
            )
        self.attached.extend(published)
        if signatures:
            ref = target.registry_ref
            with RegistryClient(ref.registry) as client:
                gpg_write(signatures, client, ref.repository, ctx.log)
        return transport.name_index(index, target, tag=tag)

    def _gpg_prepare_index(
        self, index: ImageIndex, children: Sequence[PlatformImage], target: Target, tag: str
    ) -> tuple[_GpgSignature, ...]:
        """The GPG simple signatures of the index and of every child, each naming the tag the index is
        pushed as. containers/image judges a `signedBy` policy on the index a pulled tag names and again
        on the child it copies, each against that tag (`copy.Image`; skopeo `copy --all --sign-by` signs
        both so); a child pulled by digest accepts any identity in its repository."""
        if self.gpg is None:
            return ()
        ref = target.registry_ref  # a registry: `check` refused any other place with --gpg-key
        identity = _signed_identity(ref, ref.tag or tag, index.digest)
        digests = (index.digest, *(c.image.digest for c in children))
        with RegistryClient(ref.registry) as client:
            return gpg_prepare(self.gpg, client, identity, *digests)


def index_name(children: Sequence[PlatformImage], ctx: Context) -> str:
    """The subject name of the index's statement: the repository its children's provenance names."""
    return provenance.subject_name(image_facts(children[0].image, ctx))


def build_and_push(
    definition_path: Path,
    ctx: Context,
    *,
    to: str,
    key: dsse.Signer | None,
    runner: str = "auto",
    tag: str | None = None,
    builder: str | None = None,
    formats: frozenset[str] = DEFAULT_FORMATS,
    gpg: GpgPlan | None = None,
) -> dict[str, object]:
    """`servimg build DEF --to REPO|oci:DIR --sign KEY`: the one build pipeline, proven once, published
    by an `AttestingSink` (the image with the signed provenance of this very build and its verify result;
    for several platforms every child so, then the index with its own)."""
    if not to:
        raise BuildError("--sign needs --to", hint="--to HOST/REPO[:TAG] or --to oci:DIR[:TAG]")
    plan = BuildPlan.make(
        definition_path, to=to, tag=tag, runner=runner, cache_root=ctx.store.root, host=ctx.seams.host
    )
    command = ("servimg", "build", definition_path.name, "--to", to, "--sign")
    sink = AttestingSink(key, command, builder, formats=formats, gpg=gpg)
    result = build(plan, dataclasses.replace(ctx, seams=dataclasses.replace(ctx.seams, sink=sink)))
    return {**result.as_dict(), "attestations": [a.as_dict() for a in sink.attached]}
