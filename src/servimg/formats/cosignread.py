"""Reading evidence back in every format servimg writes (`formats.publish`), for `check`, `show`, `diff`:
what is listed where (servimg's DSSE referrers, sigstore bundle referrers, the layers of cosign's `.att`
tag), each with the way to fetch its DSSE envelope (re-hashed, bound to the image); and cosign's simple
signatures under `.sig`, each verified against the trusted keys.

A bundle or an `.att` layer is judged exactly like a referrer: its envelope's signature against the
trusted keys, its statement's subject against the image (an `.att` tag is found by the image's digest,
but only the signed statement binds it). Nothing here decides PASS or FAIL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from servimg.backends.referrers import Referrers
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.formats import cosign, referrers
from servimg.signing import dsse
from servimg.statements import attest

REFERRER, ATT, BUNDLE = cosign.NATIVE, cosign.ATT, cosign.BUNDLE


@dataclass(frozen=True)
class Listed:
    """One attestation as listed somewhere: its descriptor (digest, an in-toto `artifactType`, its
    annotations), where it was listed, in which format, and how to fetch its envelope's bytes."""

    descriptor: Mapping[str, object]
    via: str
    form: str
    fetch: Callable[[Digest], bytes]


def listed(
    place: Referrers, subject: Digest, descriptors: Sequence[Mapping[str, object]], via: str
) -> list[Listed]:
    """Every attestation of `subject` at `place`: the referrers (`descriptors`, as `discover` gave them)
    and the layers of the `.att` tag."""
    out = [_referrer(place, subject, d, via) for d in descriptors]
    return out + _att_layers(place, subject)


def _referrer(place: Referrers, subject: Digest, descriptor: Mapping[str, object], via: str) -> Listed:
    if descriptor.get("artifactType") != cosign.BUNDLE_V03:
        return Listed(descriptor, via, REFERRER, lambda a: referrers.fetch_envelope(place, subject, a))

    def fetch(artifact: Digest) -> bytes:
        bundle = referrers.fetch_envelope(place, subject, artifact, layer_type=cosign.BUNDLE_V03)
        return cosign.bundle_envelope(bundle, f"bundle {artifact.short}").to_bytes()

    annotations = descriptor.get("annotations")
    predicate = annotations.get(cosign.BUNDLE_PREDICATE) if isinstance(annotations, dict) else None
    return Listed({**descriptor, "artifactType": _in_toto_type(predicate)}, via, BUNDLE, fetch)


def _att_layers(place: Referrers, subject: Digest) -> list[Listed]:
    tag = cosign.attestation_tag(subject)
    via = f"cosign tag {tag}"
    data = place.tagged(tag)
    if data is None:
        return []
    try:
        layers = cosign.tag_layers(data, via)
    except ServimgError as exc:
        message = "; ".join([exc.message, *exc.problems])
        return [
            Listed({"digest": str(Digest.of_bytes(data)), "artifactType": "?"}, via, ATT, _raise(message))
        ]
    out = []
    for layer in layers:
        if layer.media_type != attest.ENVELOPE_MEDIA_TYPE:
            continue
        descriptor = {
            "digest": str(layer.digest),
            "artifactType": _in_toto_type(layer.annotation.get("predicateType")),
        }
        out.append(Listed(descriptor, via, ATT, _blob(place, layer)))
    return out


def _blob(place: Referrers, layer: cosign.TagLayer) -> Callable[[Digest], bytes]:
    def fetch(digest: Digest) -> bytes:
        if layer.size > dsse.ENVELOPE_LIMIT:
            raise referrers.ReferrersError(
                f"layer {digest.short}: {layer.size} bytes exceeds {dsse.ENVELOPE_LIMIT}"
            )
        data = place.blob(digest)
        if len(data) != layer.size:
            raise referrers.ReferrersError(
                f"layer {digest.short} is {len(data)} bytes, its descriptor says {layer.size}"
            )
        return data

    return fetch


def _raise(message: str) -> Callable[[Digest], bytes]:
    def fetch(_: Digest) -> bytes:
        raise cosign.CosignFormatError(message)

    return fetch


def _in_toto_type(predicate_type: object) -> str:
    """The artifactType servimg's own referrer of this predicate type has (so every format is judged by
    one rule), or the predicate type itself when servimg does not make that kind."""
    if isinstance(predicate_type, str) and predicate_type in attest.KINDS:
        return attest.artifact_type(attest.KINDS[predicate_type])
    return str(predicate_type or "?")


# ----------------------------------------------------------------------------------------- simple signing


@dataclass(frozen=True)
class CosignSignature:
    """One layer of the `.sig` tag: whose signature it is (keyids of trusted keys that verify it) and what
    its payload names."""

    layer: str
    status: str  # verified | untrusted | no-keys | other-image | malformed
    why: str
    keyids: tuple[str, ...] = ()


def signatures(
    place: Referrers, subject: Digest, trusted: Sequence[dsse.VerifyKey]
) -> tuple[CosignSignature, ...]:
    tag = cosign.signature_tag(subject)
    data = place.tagged(tag)
    if data is None:
        return ()
    try:
        layers = cosign.tag_layers(data, tag)
    except ServimgError as exc:
        return (CosignSignature(tag, "malformed", "; ".join([exc.message, *exc.problems])),)
    return tuple(
        _signature(place, subject, layer, trusted, tag)
        for layer in layers
        if layer.media_type == cosign.SIMPLE_SIGNING
    )


def _signature(
    place: Referrers, subject: Digest, layer: cosign.TagLayer, trusted: Sequence[dsse.VerifyKey], tag: str
) -> CosignSignature:
    where = f"{tag} layer {layer.digest.short}"
    try:
        payload = place.blob(layer.digest)
        signed = cosign.SimpleSigning.parse(payload, where)
        signature = cosign.decode_signature(layer, where)
    except ServimgError as exc:
        return CosignSignature(str(layer.digest), "malformed", exc.message)
    if signed.digest != str(subject) or signed.kind != cosign.COSIGN_SIGNATURE_TYPE:
        why = f"its payload names {signed.digest} ({signed.kind!r}), not this image"
        return CosignSignature(str(layer.digest), "other-image", why)
    if not trusted:
        return CosignSignature(str(layer.digest), "no-keys", "no trusted key was given (--key PUB)")
    keyids = tuple(sorted(k.keyid for k in set(trusted) if k.verify(signature, payload)))
    if not keyids:
        return CosignSignature(str(layer.digest), "untrusted", "signed by no trusted key")
    return CosignSignature(
        str(layer.digest), "verified", f"signed by trusted key(s) {', '.join(k[:12] for k in keyids)}", keyids
    )
