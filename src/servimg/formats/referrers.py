"""Attestations as OCI 1.1 artifacts (image-spec v1.1, distribution-spec v1.1): what the artifact of a DSSE
envelope is, and how one is attached to an image and read back, at any place that keeps referrers
(`backends.referrers.Referrers`, found through `backends.transport.referrers`: a registry repository or
an OCI layout).

An attestation is an image manifest with `artifactType`, the empty config, the envelope as its one layer
and `subject` = the image manifest's descriptor (image-spec `manifest.md` §Guidelines for Artifact Usage).
The image manifest itself is never touched, so attaching never changes the image digest. Where the
artifact is kept and how it is found again (the referrers API, the `sha256-<hex>` tag, a layout's index)
is the backend's (`backends.registryreferrers`, `backends.layout.LayoutReferrers`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

from servimg.backends.referrers import Referrers, ReferrersError, valid_digest
from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.formats import cosign
from servimg.oci.image import MANIFEST_TYPES, OCI_INDEX, OCI_MANIFEST, Descriptor
from servimg.signing import dsse
from servimg.statements.attest import ENVELOPE_MEDIA_TYPE, timestamp

EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_BLOB = b"{}"
# image-spec manifest.md §Guidance for an Empty Descriptor: `{}`, size 2, this digest.
EMPTY_DESCRIPTOR: Mapping[str, object] = {
    "mediaType": EMPTY_MEDIA_TYPE,
    "digest": str(Digest.of_bytes(EMPTY_BLOB)),
    "size": len(EMPTY_BLOB),
}
ANNOTATION_CREATED = "org.opencontainers.image.created"
# The annotation key Docker BuildKit's attestation manifests use for the in-toto predicate type.
ANNOTATION_PREDICATE_TYPE = "in-toto.io/predicate-type"
# RFC 6838 §4.2 type/subtype names (artifactType MUST conform, image-spec manifest.md §artifactType).
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}")

__all__ = ["Referrers", "ReferrersError"]


# ---------------------------------------------------------------------------------------------- building


def attestation_annotations(predicate_type: str, created: str) -> dict[str, str]:
    """Annotations of an attestation artifact: its predicate type and creation time (RFC 3339 UTC)."""
    return {ANNOTATION_PREDICATE_TYPE: predicate_type, ANNOTATION_CREATED: timestamp(created)}


def artifact_manifest(
    subject: Descriptor,
    envelope_bytes: bytes,
    artifact_type: str,
    annotations: Mapping[str, str],
    *,
    layer_type: str = ENVELOPE_MEDIA_TYPE,
) -> bytes:
    """The artifact's image manifest as canonical JSON (image-spec manifest.md, artifact guidance 2).

    The layer must parse (a DSSE envelope, or a sigstore bundle of one when `layer_type` is the bundle
    type, cosign BUNDLE_SPEC.md §Publishing): a registry is no place to park bytes no verifier could read.
    """
    _check_artifact_inputs(subject, envelope_bytes, artifact_type, annotations, layer_type)
    manifest: dict[str, object] = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": dict(EMPTY_DESCRIPTOR),
        "layers": [
            {
                "mediaType": layer_type,
                "digest": str(Digest.of_bytes(envelope_bytes)),
                "size": len(envelope_bytes),
            }
        ],
        "subject": {"mediaType": subject.media_type, "digest": str(subject.digest), "size": subject.size},
    }
    if annotations:
        manifest["annotations"] = dict(annotations)
    return canonical.dumps(manifest)


def _check_artifact_inputs(
    subject: Descriptor,
    envelope_bytes: bytes,
    artifact_type: str,
    annotations: Mapping[str, str],
    layer_type: str,
) -> None:
    problems: list[str] = []
    if subject.media_type not in MANIFEST_TYPES | {OCI_INDEX}:
        problems.append(f"subject mediaType {subject.media_type!r} is not a manifest or index")
    if not _MEDIA_TYPE.fullmatch(artifact_type):
        problems.append(f"artifactType {artifact_type!r} is not a media type (RFC 6838)")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        problems.append("annotations must map strings to strings")
    try:
        if layer_type == cosign.BUNDLE_V03:
            cosign.bundle_envelope(envelope_bytes, "bundle")
        else:
            dsse.Envelope.parse(envelope_bytes)
    except ServimgError as exc:
        problems.extend(f"envelope: {p}" for p in exc.problems or [exc.message])
    if problems:
        raise ReferrersError("refusing to build an attestation artifact", problems=problems)


# ------------------------------------------------------------------------------------ attaching, reading
def attach(
    place: Referrers,
    subject: Descriptor,
    envelope_bytes: bytes,
    artifact_type: str,
    annotations: Mapping[str, str],
    *,
    layer_type: str = ENVELOPE_MEDIA_TYPE,
) -> Digest:
    """Attach one envelope (or bundle) to `subject` at `place` (its artifact: empty config, the blob,
    manifest), made discoverable there; the artifact manifest's digest."""
    manifest = artifact_manifest(subject, envelope_bytes, artifact_type, annotations, layer_type=layer_type)
    return place.attach(subject.digest, manifest, (EMPTY_BLOB, envelope_bytes))


def listed(place: Referrers, subject: Digest, artifact_type: str | None = None) -> list[dict[str, object]]:
    """The descriptors at `place` that refer to `subject` (of `artifact_type`, when given). Pointers only:
    `fetch_envelope` verifies what they point at."""
    found, _ = place.discover(subject)
    return [d for d in found if artifact_type is None or d.get("artifactType") == artifact_type]


def fetch_envelope(
    place: Referrers,
    subject: Digest,
    artifact: Digest,
    *,
    artifact_type: str | None = None,
    layer_type: str = ENVELOPE_MEDIA_TYPE,
) -> bytes:
    """The envelope bytes of the artifact `artifact`, checked against `subject`.

    The manifest is read by digest (re-hashed), must be an OCI manifest whose `subject.digest` is
    `subject` (an index entry can point anywhere; the manifest's subject is what binds it) and whose one
    DSSE layer is within the size limit; the blob is re-hashed."""
    data, media_type = place.manifest(artifact)
    layer = _envelope_layer(data, media_type, subject, artifact_type, f"artifact {artifact}", layer_type)
    blob = place.blob(layer.digest)
    if len(blob) != layer.size:
        raise ReferrersError(
            f"artifact {artifact}: envelope is {len(blob)} bytes, its descriptor says {layer.size}"
        )
    return blob


def _envelope_layer(
    data: bytes, media_type: str, subject: Digest, artifact_type: str | None, where: str, layer_type: str
) -> Descriptor:
    """The DSSE layer of an artifact manifest, after checking the manifest is bound to `subject`."""
    try:
        manifest = json.loads(data)
    except ValueError:
        raise ReferrersError(f"{where}: manifest is not JSON") from None
    if not isinstance(manifest, dict):
        raise ReferrersError(f"{where}: manifest is not a JSON object")
    problems = _binding_problems(manifest, media_type, subject, artifact_type)
    layers = manifest.get("layers")
    envelopes = [
        d
        for d in (layers if isinstance(layers, list) else [])
        if isinstance(d, dict) and d.get("mediaType") == layer_type
    ]
    if len(envelopes) != 1:
        problems.append(f"has {len(envelopes)} layers of type {layer_type}, expected exactly 1")
    if problems:
        raise ReferrersError(f"{where} is not an attestation of {subject}", problems=problems)
    try:
        layer = Descriptor.from_json(envelopes[0], f"{where}.layers")
    except ServimgError as exc:
        raise ReferrersError(exc.message, problems=exc.problems) from None
    if layer.size > dsse.ENVELOPE_LIMIT:
        raise ReferrersError(f"{where}: envelope of {layer.size} bytes exceeds {dsse.ENVELOPE_LIMIT}")
    return layer


def _binding_problems(
    manifest: Mapping[str, object], media_type: str, subject: Digest, artifact_type: str | None
) -> list[str]:
    problems: list[str] = []
    if media_type != OCI_MANIFEST or manifest.get("mediaType", OCI_MANIFEST) != OCI_MANIFEST:
        problems.append(f"mediaType is {media_type}, not {OCI_MANIFEST}")
    bound = manifest.get("subject")
    bound_digest = bound.get("digest") if isinstance(bound, dict) else None
    if bound_digest != str(subject):
        problems.append(f"its subject is {bound_digest or 'missing'}, not {subject}")
    if artifact_type is not None and manifest.get("artifactType") != artifact_type:
        problems.append(f"artifactType is {manifest.get('artifactType')!r}, not {artifact_type!r}")
    return problems


def already_attached(
    place: Referrers,
    subject: Digest,
    artifact_type: str,
    envelope: Digest,
    listed: Sequence[Mapping[str, object]] | None = None,
) -> Digest | None:
    """The artifact already attached to `subject` with this type and this very envelope (reruns are
    idempotent), or None. A stale or unreadable entry is skipped: not ours to repair here. `listed`:
    what `discover` gave, when the caller has it already."""
    descriptors = listed if listed is not None else place.discover(subject)[0]
    for d in descriptors:
        if d.get("artifactType") != artifact_type or not valid_digest(d.get("digest")):
            continue
        try:
            digest = Digest.parse(str(d["digest"]))
            doc = json.loads(place.manifest(digest)[0])
        except (ServimgError, ValueError):
            continue
        bound = jv.member(doc, "subject", "digest") if isinstance(doc, dict) else None
        layers = doc.get("layers") if isinstance(doc, dict) else None
        if bound == str(subject) and any(
            isinstance(x, dict) and x.get("digest") == str(envelope) for x in layers or []
        ):
            return digest
    return None
