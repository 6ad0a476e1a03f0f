"""Publishing evidence beside an image, in every format a consumer reads (issue 31): servimg's own OCI
referrer of a DSSE envelope, cosign's `.att` tag layer, a sigstore bundle v0.3 referrer, and for the
manifest itself cosign's simple-signing `.sig` (formats: `formats.cosign`; where: a `Referrers`
place, a registry repository or an OCI layout).

Adding never removes: a `.sig`/`.att` tag keeps every earlier layer (read-modify-write through
`Referrers.update_tagged`, which the place makes safe against a concurrent writer), a referrer is only
ever added, and what is already there (the same envelope, bundle or signature) is not added twice, so a
rerun publishes nothing new. A malformed or foreign tag manifest stops the command (it is reported, never
replaced).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from servimg.backends.referrers import Artifact, Referrers, TagChange, TagUpdate
from servimg.core.context import Log
from servimg.core.digest import Digest
from servimg.formats import cosign, referrers
from servimg.oci.image import Descriptor
from servimg.signing import dsse
from servimg.statements import attest
from servimg.statements import derived as provenance

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


def publish(
    place: Referrers,
    subject: Descriptor,
    envelopes: Sequence[Envelope],
    formats: frozenset[str],
    signer: tuple[dsse.Signer, str] | None,
    log: Log,
) -> tuple[tuple[Attached, ...], tuple[str, ...]]:
    """`envelopes` about `subject` at `place` in each of `formats`, and with `signer` (a key and the
    repository name the payload states) cosign's simple signature of the manifest: one `commit`, so a
    registry waits once for its read-modify-writes to settle however many formats are written. An
    unsigned envelope has no bundle (a bundle's envelope carries exactly one signature)."""
    listed = place.discover(subject.digest)[0] if formats & {cosign.NATIVE, cosign.BUNDLE} else []
    batch = _Batch(place, subject, listed)
    plans = [batch.plan(env, formats) for env in envelopes]
    changes = []
    att = cosign.attestation_tag(subject.digest)
    if batch.att_layers:
        changes.append(layers_change(att, batch.att_layers))
    signature = None
    if signer is not None and cosign.SIG in formats:
        signature_tag, where = signature_change(subject.digest, signer[1], signer[0])
        changes.append(signature_tag)
    digests, results = place.commit(subject.digest, batch.artifacts, changes)
    att_added = bool(batch.att_layers) and results[0] is not None
    attached = tuple(_attached(plan, digests, att_added, log) for plan in plans)
    if signer is not None and cosign.SIG in formats:
        signature = where + ("" if results[-1] is not None else " (already signed)")
        log(f"cosign signature: {signature}")
    return attached, (signature,) if signature else ()


@dataclass
class _Batch:
    """What one publication writes: the artifacts to attach and the `.att` layers to add."""

    place: Referrers
    subject: Descriptor
    listed: Sequence[Mapping[str, object]]
    artifacts: list[Artifact] = field(default_factory=list)
    att_layers: list[tuple[cosign.TagLayer, bytes]] = field(default_factory=list)

    def plan(self, env: Envelope, formats: frozenset[str]) -> _Plan:
        entries: list[tuple[str, str | int]] = []
        if cosign.NATIVE in formats:
            artifact_type = attest.artifact_type(env.kind)
            annotations = referrers.attestation_annotations(env.predicate_type, provenance.now())
            entries.append(self._artifact(cosign.NATIVE, env.data, artifact_type, annotations, ENVELOPE))
        if cosign.ATT in formats:
            layer = cosign.attestation_layer(env.data, env.predicate_type)
            if (layer, env.data) not in self.att_layers:
                self.att_layers.append((layer, env.data))
            entries.append((cosign.ATT, f"{cosign.attestation_tag(self.subject.digest)}#{layer.digest}"))
        if cosign.BUNDLE in formats and env.signed:
            annotations = cosign.bundle_annotations(env.predicate_type, attest.timestamp(provenance.now()))
            for bundle in cosign.bundles(dsse.Envelope.parse(env.data)):
                entries.append(
                    self._artifact(cosign.BUNDLE, bundle, cosign.BUNDLE_V03, annotations, cosign.BUNDLE_V03)
                )
        return _Plan(env, tuple(entries))

    def _artifact(
        self, form: str, data: bytes, artifact_type: str, annotations: Mapping[str, str], layer_type: str
    ) -> tuple[str, str | int]:
        """(format, the digest of the artifact already attached) or (format, index of the new one)."""
        existing = referrers.already_attached(
            self.place, self.subject.digest, artifact_type, Digest.of_bytes(data), self.listed
        )
        if existing is not None:
            return form, str(existing)
        manifest = referrers.artifact_manifest(
            self.subject, data, artifact_type, annotations, layer_type=layer_type
        )
        self.artifacts.append(Artifact(manifest, (referrers.EMPTY_BLOB, data)))
        return form, len(self.artifacts) - 1


@dataclass(frozen=True)
class _Plan:
    env: Envelope
    entries: tuple[tuple[str, str | int], ...]  # (format, existing artifact digest | new artifact index)


def _attached(plan: _Plan, digests: Sequence[Digest], att_added: bool, log: Log) -> Attached:
    formats: list[tuple[str, str]] = []
    reused = True
    for form, where in plan.entries:
        if isinstance(where, int):
            formats.append((form, str(digests[where])))
            reused = False
        else:
            formats.append((form, where))
            reused &= form != cosign.ATT or not att_added
    env = plan.env
    native = dict(formats).get(cosign.NATIVE)
    state = "already attached" if reused else "attached"
    log(
        f"{env.kind}: {state} as {', '.join(f'{f} {w[:19]}' for f, w in formats)} "
        f"({'signed' if env.signed else 'UNSIGNED'})"
    )
    return Attached(
        env.kind, native or (formats[0][1] if formats else ""), env.signed, reused, tuple(formats)
    )


ENVELOPE = attest.ENVELOPE_MEDIA_TYPE


def layers_change(
    tag: str,
    new: Sequence[tuple[cosign.TagLayer, bytes]],
    present: Callable[[list[cosign.TagLayer]], bool] | None = None,
) -> TagChange:
    """Layers (descriptor, blob) added to the cosign manifest under `tag`, every earlier one kept.
    `present` says, of the layers already there, that what this writer adds is in effect there already
    (a signature by the same key over the same payload)."""
    where = f"the cosign manifest under {tag}"

    def update(existing: bytes | None) -> TagUpdate | None:
        if present is not None and existing is not None and present(cosign.tag_layers(existing, where)):
            return None
        layers, added = cosign.merged(existing, [layer for layer, _ in new], where)
        if not added:
            return None
        manifest, config = cosign.tag_manifest(layers)
        return TagUpdate(manifest, (config, *(blob for _, blob in new)))

    def holds(current: bytes) -> bool:
        have = cosign.tag_layers(current, where)
        return all(layer in have for layer, _ in new) or (present is not None and present(have))

    return TagChange(tag, update, holds)


def signature_change(subject: Digest, repository: str, key: dsse.Signer) -> tuple[TagChange, str]:
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
    return layers_change(tag, [(layer, payload)], present), f"{tag}#{layer.digest}"
