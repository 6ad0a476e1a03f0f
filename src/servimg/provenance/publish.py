"""Publishing evidence beside an image, in every format a consumer reads (issue 31): servimg's own OCI
referrer of a DSSE envelope, cosign's `.att` tag layer, a sigstore bundle v0.3 referrer, and for the
manifest itself cosign's simple-signing `.sig` (formats: `provenance.cosign`; where: a `Referrers`
place, a registry repository or an OCI layout).

Adding never removes: a `.sig`/`.att` tag keeps every earlier layer (read-modify-write through
`Referrers.update_tagged`, which the place makes safe against a concurrent writer), a referrer is only
ever added, and what is already there (the same envelope, bundle or signature) is not added twice, so a
rerun publishes nothing new. A malformed or foreign tag manifest stops the command (it is reported, never
replaced).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servimg.backends.referrers import Referrers, TagUpdate
from servimg.core.digest import Digest
from servimg.core.progress import Log
from servimg.oci.image import Descriptor
from servimg.provenance import attest, cosign, dsse, referrers
from servimg.provenance import statements as provenance

DEFAULT_FORMATS = frozenset(cosign.FORMATS)


@dataclass(frozen=True)
class Envelope:
    """A signed (or deliberately unsigned) statement ready to attach."""

    kind: str
    predicate_type: str
    data: bytes
    signed: bool


@dataclass(frozen=True)
class Attached:
    """One attestation as published: its OCI referrer (`artifact`, when that format was written) and
    where else it went (`formats`: format → artifact or layer digest)."""

    kind: str
    artifact: str
    signed: bool
    reused: bool
    formats: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "artifact": self.artifact,
            "signed": self.signed,
            "reused": self.reused,
            "formats": dict(self.formats),
        }


def publish_attestation(
    place: Referrers, subject: Descriptor, env: Envelope, formats: frozenset[str], log: Log
) -> Attached:
    """`env` about `subject` at `place`, in each of `formats` (an unsigned envelope has no bundle: a
    bundle's envelope carries exactly one signature)."""
    written: list[tuple[str, str]] = []
    reused = True
    artifact = ""
    if cosign.NATIVE in formats:
        artifact, again = _native(place, subject, env, log)
        written.append((cosign.NATIVE, artifact))
        reused &= again
    if cosign.ATT in formats:
        layer = cosign.attestation_layer(env.data, env.predicate_type)
        tag = cosign.attestation_tag(subject.digest)
        added = add_layers(place, tag, [(layer, env.data)], log)
        written.append((cosign.ATT, f"{tag}#{layer.digest}"))
        reused &= not added
    if cosign.BUNDLE in formats and env.signed:
        for bundle in cosign.bundles(dsse.Envelope.parse(env.data)):
            digest, again = _bundle(place, subject, bundle, env, log)
            written.append((cosign.BUNDLE, str(digest)))
            reused &= again
    return Attached(env.kind, artifact or written[0][1], env.signed, reused, tuple(written))


def _native(place: Referrers, subject: Descriptor, env: Envelope, log: Log) -> tuple[str, bool]:
    """Attach one envelope unless the same envelope is already attached (idempotent reruns)."""
    artifact_type = attest.artifact_type(env.kind)
    existing = referrers.already_attached(place, subject.digest, artifact_type, Digest.of_bytes(env.data))
    if existing is not None:
        log(f"{env.kind}: already attached as {existing.short}")
        return str(existing), True
    annotations = referrers.attestation_annotations(env.predicate_type, provenance.now())
    digest = referrers.attach(place, subject, env.data, artifact_type, annotations)
    log(f"{env.kind}: attached as {digest.short} ({'signed' if env.signed else 'UNSIGNED'})")
    return str(digest), False


def _bundle(
    place: Referrers, subject: Descriptor, bundle: bytes, env: Envelope, log: Log
) -> tuple[Digest, bool]:
    existing = referrers.already_attached(place, subject.digest, cosign.BUNDLE_V03, Digest.of_bytes(bundle))
    if existing is not None:
        return existing, True
    created = attest.timestamp(provenance.now())
    annotations = cosign.bundle_annotations(env.predicate_type, created)
    digest = referrers.attach(
        place, subject, bundle, cosign.BUNDLE_V03, annotations, layer_type=cosign.BUNDLE_V03
    )
    log(f"{env.kind}: sigstore bundle attached as {digest.short}")
    return digest, False


def add_layers(
    place: Referrers,
    tag: str,
    new: Sequence[tuple[cosign.TagLayer, bytes]],
    log: Log,
    *,
    present: Callable[[list[cosign.TagLayer]], bool] | None = None,
) -> bool:
    """Add layers (descriptor, blob) to the cosign manifest under `tag`, keeping every earlier one;
    whether anything was written. `present` says, of the layers already there, that what this writer
    adds is in effect there already (a signature by the same key over the same payload)."""
    where = f"the cosign manifest under {tag}"

    def update(existing: bytes | None) -> TagUpdate | None:
        before = cosign.tag_layers(existing, where) if existing is not None else []
        if present is not None and present(before):
            return None
        layers, added = cosign.merged(existing, [layer for layer, _ in new], where)
        if not added:
            return None
        manifest, config = cosign.tag_manifest(layers)
        return TagUpdate(manifest, (config, *(blob for _, blob in new)))

    def holds(current: bytes) -> bool:
        have = cosign.tag_layers(current, where)
        return all(layer in have for layer, _ in new) or (present is not None and present(have))

    digest = place.update_tagged(tag, update, holds)
    if digest is not None:
        log(f"{tag}: {len(new)} layer(s) added ({digest.short})")
    return digest is not None


def sign_manifest(place: Referrers, subject: Digest, repository: str, key: dsse.Signer, log: Log) -> str:
    """cosign's simple signing of `subject` under `sha256-<hex>.sig` (SIGNATURE_SPEC.md), unless this
    key already signed the same payload there (ECDSA in an HSM is not deterministic: the same key signs
    the same payload differently each time, so "already there" is a verification, not a byte match)."""
    payload = cosign.simple_signing_payload(repository, subject)
    payload_digest = Digest.of_bytes(payload)
    tag = cosign.signature_tag(subject)

    def present(layers: list[cosign.TagLayer]) -> bool:
        return any(
            layer.digest == payload_digest
            and key.public_key.verify(cosign.decode_signature(layer, tag), payload)
            for layer in layers
            if layer.media_type == cosign.SIMPLE_SIGNING
        )

    layer = cosign.signature_layer(payload, key.sign(payload))
    added = add_layers(place, tag, [(layer, payload)], log, present=present)
    return f"{tag}#{layer.digest}" + ("" if added else " (already signed)")
