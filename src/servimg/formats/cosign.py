"""cosign's formats, which the deploy side reads (podman/CRI-O with sigstore, Kyverno, policy-controller,
Trivy, Zot, Harbor): what each artifact is, as bytes, and how each is read back. No I/O here; where
the artifacts are kept is `backends.referrers` (a tag read-modify-written, a referrer attached).

- **Simple signing** (cosign `specs/SIGNATURE_SPEC.md`): an OCI image manifest under the tag
  `sha256-<hex>.sig`, one layer per signature of media type `application/vnd.dev.cosign.simplesigning.v1+json`
  whose blob is the payload (`critical.identity.docker-reference`, `critical.image.docker-manifest-digest`,
  `critical.type` = "cosign container image signature"; containers-signature(5) §JSON Data Format) and
  whose annotation `dev.cosignproject.cosign/signature` is the base64 signature over the payload bytes
  (§Signature; ECDSA-P256 with SHA-256, §Signature Schemes).
- **Attestations** (cosign `specs/ATTESTATION_SPEC.md`): the same kind of manifest under
  `sha256-<hex>.att`, one layer per DSSE envelope (`application/vnd.dsse.envelope.v1+json`, payloadType
  `application/vnd.in-toto+json`), annotated `predicateType` (cosign `cmd/cosign/cli/attest`) and an empty
  `dev.cosignproject.cosign/signature` (the signature is in the envelope).
- **Sigstore bundles v0.3** (cosign `specs/BUNDLE_SPEC.md`, protobuf-specs `sigstore_bundle.proto`): an
  OCI 1.1 referrer of artifactType `application/vnd.dev.sigstore.bundle.v0.3+json`, the empty config, the
  bundle JSON as its one layer, annotated `dev.sigstore.bundle.content: dsse-envelope` and
  `dev.sigstore.bundle.predicateType`. servimg's bundles carry public-key verification material (the
  key's hint) and no transparency-log entry or timestamp: they verify offline against the public key.

Both tag manifests get cosign's fixed config (empty architecture and os, the zero time, one diff_id per
layer), so the same layers always give the same manifest digest.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from servimg.backends.referrers import ReferrersError
from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.oci.image import OCI_CONFIG, OCI_MANIFEST, Descriptor
from servimg.signing import dsse
from servimg.statements.attest import ENVELOPE_MEDIA_TYPE, PAYLOAD_TYPE

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
PREDICATE_ANNOTATION = "predicateType"
COSIGN_SIGNATURE_TYPE = "cosign container image signature"
BUNDLE_V03 = "application/vnd.dev.sigstore.bundle.v0.3+json"
BUNDLE_CONTENT = "dev.sigstore.bundle.content"
BUNDLE_PREDICATE = "dev.sigstore.bundle.predicateType"
_ZERO_TIME = "0001-01-01T00:00:00Z"  # what cosign's empty config says (go's time.Time{})

# What `--formats` chooses from: servimg's own DSSE referrers, and cosign's three.
NATIVE, SIG, ATT, BUNDLE = "oci", "sig", "att", "bundle"
FORMATS = (NATIVE, SIG, ATT, BUNDLE)
FORMAT_NAMES = {
    NATIVE: "OCI referrer (DSSE)",
    SIG: "cosign .sig",
    ATT: "cosign .att",
    BUNDLE: "sigstore bundle v0.3",
}


class CosignFormatError(ReferrersError):
    """A `.sig`/`.att` manifest, a simple-signing payload or a bundle is malformed."""


def parse_formats(text: str) -> frozenset[str]:
    """`--formats oci,sig,att,bundle` (any subset, at least one; `all` for every one)."""
    chosen = {f.strip() for f in text.split(",") if f.strip()}
    if chosen == {"all"}:
        return frozenset(FORMATS)
    unknown = sorted(chosen - set(FORMATS))
    if unknown or not chosen:
        raise CosignFormatError(
            f"--formats {text!r}: unknown {', '.join(unknown) or 'empty list'}",
            hint=f"a comma-separated subset of {', '.join(FORMATS)} (or all)",
        )
    return frozenset(chosen)


def signature_tag(subject: Digest) -> str:
    """SIGNATURE_SPEC.md §Tag-based Discovery: `:` becomes `-`, then `.sig`."""
    return f"{subject.algorithm}-{subject.hex}.sig"


def attestation_tag(subject: Digest) -> str:
    return f"{subject.algorithm}-{subject.hex}.att"


# --------------------------------------------------------------------------------------- tag manifests


@dataclass(frozen=True)
class TagLayer:
    """One layer of a `.sig`/`.att` manifest: its blob's descriptor and annotations."""

    media_type: str
    digest: Digest
    size: int
    annotations: tuple[tuple[str, str], ...] = ()

    @property
    def annotation(self) -> Mapping[str, str]:
        return dict(self.annotations)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"mediaType": self.media_type, "digest": str(self.digest), "size": self.size}
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out

    @classmethod
    def of(cls, media_type: str, blob: bytes, annotations: Mapping[str, str]) -> TagLayer:
        return cls(media_type, Digest.of_bytes(blob), len(blob), tuple(sorted(annotations.items())))


def simple_signing_payload(repository: str, subject: Digest) -> bytes:
    """The payload cosign signs (SIGNATURE_SPEC.md §Simple Signing), as canonical JSON."""
    return canonical.dumps(
        {
            "critical": {
                "identity": {"docker-reference": repository},
                "image": {"docker-manifest-digest": str(subject)},
                "type": COSIGN_SIGNATURE_TYPE,
            },
            "optional": None,
        }
    )


def signature_layer(payload: bytes, signature: bytes) -> TagLayer:
    encoded = base64.b64encode(signature).decode("ascii")
    return TagLayer.of(SIMPLE_SIGNING, payload, {SIGNATURE_ANNOTATION: encoded})


def attestation_layer(envelope_bytes: bytes, predicate_type: str) -> TagLayer:
    return TagLayer.of(
        ENVELOPE_MEDIA_TYPE, envelope_bytes, {PREDICATE_ANNOTATION: predicate_type, SIGNATURE_ANNOTATION: ""}
    )


def tag_manifest(layers: Sequence[TagLayer]) -> tuple[bytes, bytes]:
    """The manifest and its config for `layers` (in this order), both canonical JSON."""
    config = canonical.dumps(
        {
            "architecture": "",
            "config": {},
            "created": _ZERO_TIME,
            "history": [{"created": _ZERO_TIME}],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": [str(layer.digest) for layer in layers]},
        }
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": OCI_CONFIG,
            "digest": str(Digest.of_bytes(config)),
            "size": len(config),
        },
        "layers": [layer.to_json() for layer in layers],
    }
    return canonical.dumps(manifest), config


def tag_layers(data: bytes, where: str) -> list[TagLayer]:
    """Every layer of a `.sig`/`.att` manifest; a manifest that is not one is reported with every problem
    (and never silently replaced: issue 31, "Bad input and faults")."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise CosignFormatError(f"{where}: the manifest is not JSON") from None
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(layers, list):
        raise CosignFormatError(
            f"{where}: not an OCI image manifest with layers",
            hint="another tool wrote this tag; servimg adds to cosign's tags, never replaces a foreign one",
        )
    problems: list[str] = []
    found: list[TagLayer] = []
    for i, layer in enumerate(layers):
        try:
            d = Descriptor.from_json(layer, f"layers[{i}]")
        except ServimgError as exc:
            problems.extend(exc.problems or [exc.message])
            continue
        annotations = dict(d.annotations)
        if not all(isinstance(v, str) for v in annotations.values()):
            problems.append(f"layers[{i}].annotations: values must be strings")
            continue
        found.append(TagLayer(d.media_type, d.digest, d.size, tuple(sorted(annotations.items()))))
    if problems:
        raise CosignFormatError(
            f"{where}: malformed cosign manifest",
            problems=problems,
            hint="inspect it (skopeo inspect --raw), remove it deliberately; servimg will not overwrite it",
        )
    return found


def merged(existing: bytes | None, new: Sequence[TagLayer], where: str) -> tuple[list[TagLayer], bool]:
    """The layers after adding `new` to what the tag holds (every earlier entry kept, in order; a layer
    already there, same blob and annotations, is not added twice), and whether anything was added."""
    layers = tag_layers(existing, where) if existing is not None else []
    added = False
    for layer in new:
        if layer not in layers:
            layers.append(layer)
            added = True
    return layers, added


# ------------------------------------------------------------------------------------- simple signing


@dataclass(frozen=True)
class SimpleSigning:
    """A simple-signing payload as read (critical section only)."""

    reference: str
    digest: str
    kind: str

    @classmethod
    def parse(cls, payload: bytes, where: str) -> SimpleSigning:
        try:
            doc = json.loads(payload)
            critical = jv.obj(jv.obj(doc, "payload")["critical"], "critical")
            image = jv.obj(critical["image"], "critical.image")
            identity = jv.obj(critical["identity"], "critical.identity")
            # containers-signature(5): the key is spelled docker-manifest-digest; cosign's example shows
            # Docker-manifest-digest, and Go's JSON decoding matches either.
            digest = next((v for k, v in image.items() if k.lower() == "docker-manifest-digest"), None)
            return cls(
                jv.text(identity.get("docker-reference", ""), "critical.identity.docker-reference"),
                jv.text(digest, "critical.image.docker-manifest-digest"),
                jv.text(critical["type"], "critical.type"),
            )
        except (ValueError, KeyError, RecursionError, jv.JsonShapeError) as exc:
            raise CosignFormatError(f"{where}: not a simple-signing payload ({exc})") from None


def decode_signature(layer: TagLayer, where: str) -> bytes:
    text = layer.annotation.get(SIGNATURE_ANNOTATION, "")
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        raise CosignFormatError(f"{where}: {SIGNATURE_ANNOTATION} is not base64") from None


# ---------------------------------------------------------------------------------------------- bundles


def bundles(envelope: dsse.Envelope) -> list[bytes]:
    """One bundle per signature of `envelope` (a bundle's DSSE envelope carries exactly one signature:
    sigstore-js `@sigstore/bundle` validate, protobuf-specs `Bundle`), as canonical JSON."""
    out = []
    for signature in envelope.signatures:
        single = dsse.Envelope(envelope.payload_type, envelope.payload, (signature,))
        material: dict[str, object] = {"publicKey": {"hint": signature.keyid or ""}, "tlogEntries": []}
        out.append(
            canonical.dumps(
                {"mediaType": BUNDLE_V03, "verificationMaterial": material, "dsseEnvelope": single.to_json()}
            )
        )
    return out


def bundle_envelope(data: bytes, where: str) -> dsse.Envelope:
    """The DSSE envelope a bundle carries, after checking it is a v0.3 DSSE bundle with one signature."""
    try:
        doc = jv.obj(json.loads(data), "bundle")
    except (ValueError, RecursionError, jv.JsonShapeError):
        raise CosignFormatError(f"{where}: the bundle is not a JSON object") from None
    problems = []
    media_type = doc.get("mediaType")
    if media_type not in (BUNDLE_V03, "application/vnd.dev.sigstore.bundle+json;version=0.3"):
        problems.append(f"mediaType {media_type!r} is not a v0.3 bundle")
    material = doc.get("verificationMaterial")
    if not isinstance(material, dict) or not any(
        k in material for k in ("publicKey", "certificate", "x509CertificateChain")
    ):
        problems.append("verificationMaterial has no publicKey or certificate")
    dsse_doc = doc.get("dsseEnvelope")
    if not isinstance(dsse_doc, dict):
        problems.append("no dsseEnvelope (servimg reads DSSE bundles, not message signatures)")
    if problems:
        raise CosignFormatError(f"{where}: not a sigstore DSSE bundle", problems=problems)
    envelope = dsse.Envelope.parse(canonical.dumps(dsse_doc))
    if len(envelope.signatures) != 1:
        raise CosignFormatError(
            f"{where}: a bundle's envelope has {len(envelope.signatures)} signatures, not 1"
        )
    if envelope.payload_type != PAYLOAD_TYPE:
        raise CosignFormatError(f"{where}: payloadType {envelope.payload_type!r} is not in-toto")
    return envelope


def bundle_annotations(predicate_type: str, created: str) -> dict[str, str]:
    """cosign `pkg/oci/remote/write.go` WriteAttestationNewBundleFormat's annotations."""
    return {
        "org.opencontainers.image.created": created,
        BUNDLE_CONTENT: "dsse-envelope",
        BUNDLE_PREDICATE: predicate_type,
    }
