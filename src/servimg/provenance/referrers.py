"""Attach DSSE envelopes to an image as OCI 1.1 artifacts (image-spec v1.1, distribution-spec v1.1).

An attestation is an image manifest with `artifactType`, the empty config, the envelope as its one layer
and `subject` = the image manifest's descriptor (image-spec `manifest.md` §Guidelines for Artifact Usage).
The image manifest itself is never touched, so attaching never changes the image digest.

Discovery (distribution-spec `spec.md` §Listing Referrers): the referrers API where the registry has it;
otherwise the client maintains an image index under the tag `sha256-<hex>` (§Referrers Tag Schema,
§Pushing Manifests with Subject).

Concurrency, honestly: distribution has no conditional PUT, so the tag index is a read-modify-write that
two clients can interleave (the spec says as much in §Referrers Tag Schema). `attach` writes, waits a
jittered moment, re-reads, and repeats (bounded) until its descriptor is in the index, so of two
concurrent attaches neither is lost in the common interleavings. The residual race: a writer whose read
happened before our PUT and whose PUT lands after our confirming re-read (its read-modify-write spans our
whole PUT + settle window: a stalled client) still erases our entry. The artifact manifest and blobs stay
in the registry; re-running `attach` with the same envelope is idempotent and restores the entry. Only a
registry with the referrers API removes the race.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from servimg.backends import layout
from servimg.backends.registryclient import RegistryClient
from servimg.backends.registrywire import DEFAULT_ACCEPT
from servimg.backends.target import Target
from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, RegistryError, ServimgError
from servimg.core.reference import Reference
from servimg.oci.image import MANIFEST_TYPES, OCI_INDEX, OCI_MANIFEST, Descriptor
from servimg.provenance import dsse
from servimg.provenance.attest import ENVELOPE_MEDIA_TYPE, timestamp

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
ATTACH_ATTEMPTS = 8
SETTLE_SECONDS = 0.2
_MAX_BACKOFF = 2.0
# RFC 6838 §4.2 type/subtype names (artifactType MUST conform, image-spec manifest.md §artifactType).
_MEDIA_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}")

log = logging.getLogger(__name__)


class ReferrersError(BackendError):
    """An attestation artifact or a referrers index is malformed, foreign, or could not be kept."""


# ---------------------------------------------------------------------------------------------- building


def fallback_tag(subject: Digest) -> str:
    """§Referrers Tag Schema: algorithm (≤32 chars) `-` encoded (≤64 chars), e.g. `sha256-<hex>`."""
    return f"{subject.algorithm[:32]}-{subject.hex[:64]}"


def attestation_annotations(predicate_type: str, created: str) -> dict[str, str]:
    """Annotations of an attestation artifact: its predicate type and creation time (RFC 3339 UTC)."""
    return {ANNOTATION_PREDICATE_TYPE: predicate_type, ANNOTATION_CREATED: timestamp(created)}


def artifact_manifest(
    subject: Descriptor, envelope_bytes: bytes, artifact_type: str, annotations: Mapping[str, str]
) -> bytes:
    """The artifact's image manifest as canonical JSON (image-spec manifest.md, artifact guidance 2).

    The envelope must parse as DSSE: a registry is no place to park bytes no verifier could read.
    """
    _check_artifact_inputs(subject, envelope_bytes, artifact_type, annotations)
    manifest: dict[str, object] = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": dict(EMPTY_DESCRIPTOR),
        "layers": [
            {
                "mediaType": ENVELOPE_MEDIA_TYPE,
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
    subject: Descriptor, envelope_bytes: bytes, artifact_type: str, annotations: Mapping[str, str]
) -> None:
    problems: list[str] = []
    if subject.media_type not in MANIFEST_TYPES | {OCI_INDEX}:
        problems.append(f"subject mediaType {subject.media_type!r} is not a manifest or index")
    if not _MEDIA_TYPE.fullmatch(artifact_type):
        problems.append(f"artifactType {artifact_type!r} is not a media type (RFC 6838)")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()):
        problems.append("annotations must map strings to strings")
    try:
        dsse.Envelope.parse(envelope_bytes)
    except dsse.DsseError as exc:
        problems.extend(f"envelope: {p}" for p in exc.problems or [exc.message])
    if problems:
        raise ReferrersError("refusing to build an attestation artifact", problems=problems)


def referrer_descriptor(manifest_bytes: bytes) -> dict[str, object]:
    """The index entry for an artifact (§Pushing Manifests with Subject, step 4): mediaType, digest,
    size, `artifactType` (else the config mediaType), and every annotation of the manifest."""
    manifest = json.loads(manifest_bytes)
    out: dict[str, object] = {
        "mediaType": manifest.get("mediaType", OCI_MANIFEST),
        "digest": str(Digest.of_bytes(manifest_bytes)),
        "size": len(manifest_bytes),
        "artifactType": manifest.get("artifactType") or manifest["config"]["mediaType"],
    }
    if manifest.get("annotations"):
        out["annotations"] = manifest["annotations"]
    return out


# --------------------------------------------------------------------------------------------- attaching


def attach(
    client: RegistryClient,
    repo: str,
    subject: Descriptor,
    envelope_bytes: bytes,
    artifact_type: str,
    annotations: Mapping[str, str],
    *,
    attempts: int = ATTACH_ATTEMPTS,
    settle: float = SETTLE_SECONDS,
) -> Digest:
    """Push the artifact (empty config, envelope, manifest by digest) and make it discoverable.

    Returns the artifact manifest's digest. With the referrers API the registry indexes the artifact
    itself; without it the `sha256-<hex>` index is updated with write-then-verify (module docstring).
    """
    manifest = artifact_manifest(subject, envelope_bytes, artifact_type, annotations)
    digest = _push_artifact(client, repo, manifest, envelope_bytes)
    if client.referrers(repo, subject.digest) is not None:
        return digest
    _add_to_fallback(client, repo, subject.digest, referrer_descriptor(manifest), attempts, settle)
    return digest


def _push_artifact(client: RegistryClient, repo: str, manifest: bytes, envelope_bytes: bytes) -> Digest:
    # Blobs before the manifest: a registry refuses a manifest whose blobs it lacks (MANIFEST_BLOB_UNKNOWN).
    for blob in (EMPTY_BLOB, envelope_bytes):
        client.push_blob(repo, Digest.of_bytes(blob), len(blob), _opener(blob))
    return client.put_manifest(repo, str(Digest.of_bytes(manifest)), manifest, OCI_MANIFEST)


def _opener(blob: bytes) -> Callable[[], BinaryIO]:
    return lambda: io.BytesIO(blob)


def _add_to_fallback(
    client: RegistryClient,
    repo: str,
    subject: Digest,
    descriptor: Mapping[str, object],
    attempts: int,
    settle: float,
) -> None:
    """Read-modify-write the tag index until `descriptor` is seen in it after a settle delay."""
    tag = fallback_tag(subject)
    for attempt in range(max(1, attempts)):
        entries = _read_index(client, repo, tag, strict=True)
        if not _lists(entries, descriptor):
            client.put_manifest(repo, tag, _index_bytes(entries, descriptor), OCI_INDEX)
        # A concurrent writer that read before our PUT may overwrite it with an index lacking our entry:
        # wait (jittered, so two writers fall out of step), then look again.
        time.sleep(_jittered(settle, attempt))
        if _lists(_read_index(client, repo, tag, strict=True), descriptor):
            return
        log.info("referrers tag %s lost our entry to a concurrent writer; retry %d", tag, attempt + 1)
    raise ReferrersError(
        f"could not keep {descriptor['digest']} in the referrers index {repo}:{tag} "
        f"after {max(1, attempts)} attempts",
        hint="another client keeps rewriting that tag; attaching is idempotent, run it again",
    )


def _jittered(settle: float, attempt: int) -> float:
    return min(settle * 2.0**attempt, _MAX_BACKOFF) * (0.5 + random.random())


def _lists(entries: list[dict[str, object]], descriptor: Mapping[str, object]) -> bool:
    return any(e.get("digest") == descriptor["digest"] for e in entries)


def _index_bytes(entries: list[dict[str, object]], descriptor: Mapping[str, object]) -> bytes:
    """The merged index: one entry per digest (ours wins), sorted by canonical bytes, canonical JSON."""
    by_digest = {e["digest"]: e for e in entries}
    by_digest[descriptor["digest"]] = dict(descriptor)
    manifests = sorted(by_digest.values(), key=canonical.dumps)
    return canonical.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})


def _read_index(client: RegistryClient, repo: str, tag: str, *, strict: bool) -> list[dict[str, object]]:
    """The tag index's entries ([] if the tag is absent).

    HEAD then GET by digest, so the bytes are exactly the version HEAD saw and are re-hashed. Something
    other than an image index under the tag is an error when writing (§Pushing Manifests with Subject:
    report a failure) and no referrers when reading (§Listing Referrers).
    """
    # Accept every manifest type: distribution answers 404 for a manifest whose type the Accept header
    # lacks, and a squatter under the tag would then look like "no index yet" and be overwritten.
    found = client.head_manifest(repo, tag, accept=DEFAULT_ACCEPT)
    if found is None:
        return []
    if tag == fallback_tag(found[0]):
        # The tag answers with the manifest whose digest it spells: the registry reads digest-shaped tags
        # as digests, so nothing can ever be stored under it.
        if strict:
            raise ReferrersError(f"{repo}:{tag}: {_ALIASED}", hint=_ALIASED_HINT)
        log.warning("%s:%s: %s", repo, tag, _ALIASED)
        return []
    data, media_type, _ = client.get_manifest(repo, str(found[0]), accept=DEFAULT_ACCEPT)
    entries = _index_entries(data, media_type)
    if entries is None:
        if strict:
            raise ReferrersError(
                f"{repo}:{tag} holds a {media_type}, not a referrers image index",
                hint="another tool uses the referrers tag; remove it, or use a registry with a referrers API",
            )
        log.warning("%s:%s is not an image index; treating it as no referrers", repo, tag)
        return []
    return entries


_ALIASED = (
    "the registry resolves this referrers tag to the image manifest itself (it reads a sha256-<hex> tag as "
    "the digest), so it cannot hold the referrers index"
)
_ALIASED_HINT = "use a registry with the referrers API, or attach to an OCI layout (oci:DIR)"


def _fallback_entries(
    client: RegistryClient, repo: str, subject: Digest
) -> tuple[list[dict[str, object]], str | None]:
    """The fallback tag's entries that really refer to `subject`, and what was wrong, if anything.

    Some registries resolve `sha256-<hex>` to the subject itself (for a multi-platform subject that is an
    index too, of platform manifests); any index may list manifests about something else. So the tag must
    hold an index other than the subject, and each entry's manifest must name `subject` as its subject."""
    tag = fallback_tag(subject)
    found = client.head_manifest(repo, tag, accept=DEFAULT_ACCEPT)
    if found is None:
        return [], None
    if found[0] == subject:
        return [], _ALIASED
    data, media_type, _ = client.get_manifest(repo, str(found[0]), accept=DEFAULT_ACCEPT)
    entries = _index_entries(data, media_type)
    if entries is None:
        return [], f"{tag} holds a {media_type}, not a referrers image index; treated as no referrers"
    named = [e for e in entries if _names_subject(client, repo, e, subject)]
    if len(named) == len(entries):
        return named, None
    stray = f"{len(entries) - len(named)} of {len(entries)} entries under {tag}"
    return named, f"{stray} do not name {subject.short} as their subject; ignored"


def _names_subject(client: RegistryClient, repo: str, entry: Mapping[str, object], subject: Digest) -> bool:
    """True when the manifest `entry` points at has `subject.digest` = `subject` (§Pushing Manifests
    with Subject: that field, not the index, is what makes a manifest a referrer)."""
    try:
        data, _, _ = client.get_manifest(repo, str(entry["digest"]), accept=DEFAULT_ACCEPT)
        doc = json.loads(data)
    except (ServimgError, ValueError, RecursionError):
        return False
    named = jv.member(doc, "subject", "digest") if isinstance(doc, dict) else None
    return named == str(subject)


def _index_entries(data: bytes, media_type: str) -> list[dict[str, object]] | None:
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    manifests = doc.get("manifests") if isinstance(doc, dict) else None
    if media_type != OCI_INDEX or not isinstance(manifests, list):
        return None
    good = [m for m in manifests if isinstance(m, dict) and _valid_digest(m.get("digest"))]
    if len(good) != len(manifests):
        log.warning("dropping %d malformed entries of a referrers index", len(manifests) - len(good))
    return good


def _valid_digest(value: object) -> bool:
    try:
        Digest.parse(value)  # type: ignore[arg-type]
    except ServimgError:
        return False
    return True


# --------------------------------------------------------------------------------------------- reading


def list_referrers(
    client: RegistryClient, repo: str, subject: Digest, artifact_type: str | None = None
) -> list[dict[str, object]]:
    """Descriptors of the artifacts that refer to `subject`: the referrers API, else the tag index.

    A registry that gained the API lists what the tag index held (§Enabling the Referrers API), so the
    two are never merged. Entries are only pointers: `fetch_envelope` verifies what they point at.
    """
    found = client.referrers(repo, subject, artifact_type)
    if found is None:
        found, problem = _fallback_entries(client, repo, subject)
        if problem:
            log.warning("%s: %s", repo, problem)
        if artifact_type is not None:
            found = [d for d in found if d.get("artifactType") == artifact_type]
    return sorted(found, key=canonical.dumps)


def discover(client: RegistryClient, repo: str, subject: Digest) -> tuple[list[dict[str, object]], str]:
    """Like `list_referrers` (unfiltered), and also say where the list came from: the referrers API or
    the fallback tag (a verifier reports it; a stale fallback index is a finding of its own)."""
    found = client.referrers(repo, subject)
    if found is not None:
        return sorted(found, key=canonical.dumps), "referrers API"
    tag = fallback_tag(subject)
    entries, problem = _fallback_entries(client, repo, subject)
    return sorted(entries, key=canonical.dumps), f"fallback tag {tag}" + (f" ({problem})" if problem else "")


def fetch_envelope(
    client: RegistryClient,
    repo: str,
    subject: Digest,
    artifact: Digest,
    *,
    artifact_type: str | None = None,
) -> bytes:
    """The envelope bytes of the artifact `artifact`, checked against `subject`.

    The manifest is fetched by digest (re-hashed by the client), must be an OCI manifest whose
    `subject.digest` is `subject` (an index entry can point anywhere; the manifest's subject is what
    binds it) and whose one DSSE layer is within the size limit; the blob is digest-verified.
    """
    data, media_type, _ = client.get_manifest(repo, str(artifact), accept=DEFAULT_ACCEPT)
    layer = _envelope_layer(data, media_type, subject, artifact_type, f"artifact {artifact}")
    blob = client.get_blob(repo, layer.digest)
    if len(blob) != layer.size:
        raise ReferrersError(
            f"artifact {artifact}: envelope is {len(blob)} bytes, its descriptor says {layer.size}"
        )
    return blob


def _envelope_layer(
    data: bytes, media_type: str, subject: Digest, artifact_type: str | None, where: str
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
        if isinstance(d, dict) and d.get("mediaType") == ENVELOPE_MEDIA_TYPE
    ]
    if len(envelopes) != 1:
        problems.append(f"has {len(envelopes)} layers of type {ENVELOPE_MEDIA_TYPE}, expected exactly 1")
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


# ---------------------------------------------------------------------------------------------- layouts


def write_to_layout(
    layout_dir: Path,
    subject: Descriptor,
    envelope_bytes: bytes,
    artifact_type: str,
    annotations: Mapping[str, str],
) -> Digest:
    """Store an attestation in an OCI image layout beside its image (image-spec `image-layout.md`).

    Blobs (empty config, envelope, artifact manifest) go to `blobs/sha256/`; the artifact's descriptor is
    added to `index.json`, which is replaced atomically last (`backends.layout`, under the layout's lock).
    The subject must be in the layout.
    """
    _layout_index(layout_dir)
    if not (layout_dir / "blobs" / "sha256" / subject.digest.hex).is_file():
        raise ReferrersError(f"{layout_dir}: the subject {subject.digest} is not in this layout")
    manifest = artifact_manifest(subject, envelope_bytes, artifact_type, annotations)
    layout.add_artifact(layout_dir, (EMPTY_BLOB, envelope_bytes, manifest), referrer_descriptor(manifest))
    return Digest.of_bytes(manifest)


def _layout_index(layout_dir: Path) -> dict[str, object]:
    try:
        index = json.loads((layout_dir / "index.json").read_bytes())
    except (OSError, ValueError):
        raise ReferrersError(
            f"{layout_dir} is not a readable OCI image layout (index.json)",
            hint="write the image there first (`servimg build --to oci:DIR`)",
        ) from None
    if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
        raise ReferrersError(f"{layout_dir}/index.json has no manifests list")
    return index


def layout_referrers(layout_dir: Path, subject: Digest) -> list[dict[str, object]]:
    """Descriptors of the attestations in an OCI layout whose manifest's subject is `subject`.

    A layout may hold several images and their attestations; the index entry only points, so each
    artifact manifest is read (and re-hashed) and kept only when its own `subject` binds it here."""
    out = []
    for entry in jv.seq(_layout_index(layout_dir)["manifests"]):
        if not (isinstance(entry, dict) and entry.get("artifactType") and _valid_digest(entry.get("digest"))):
            continue
        try:
            data = _layout_blob(layout_dir, Digest.parse(entry["digest"]))
            manifest = json.loads(data)
        except (ReferrersError, ValueError):
            out.append(dict(entry))  # unreadable: let the verifier report it
            continue
        bound = manifest.get("subject") if isinstance(manifest, dict) else None
        if isinstance(bound, dict) and bound.get("digest") == str(subject):
            out.append(dict(entry))
    return sorted(out, key=canonical.dumps)


def fetch_layout_envelope(layout_dir: Path, subject: Digest, artifact: Digest) -> bytes:
    """`fetch_envelope` for an OCI layout: the manifest and the envelope blob are re-hashed."""
    data = _layout_blob(layout_dir, artifact)
    layer = _envelope_layer(data, OCI_MANIFEST, subject, None, f"artifact {artifact}")
    blob = _layout_blob(layout_dir, layer.digest)
    if len(blob) != layer.size:
        raise ReferrersError(
            f"artifact {artifact}: envelope is {len(blob)} bytes, its descriptor says {layer.size}"
        )
    return blob


def _layout_blob(layout_dir: Path, digest: Digest) -> bytes:
    path = layout_dir / "blobs" / digest.algorithm / digest.hex
    try:
        data = path.read_bytes()
    except OSError:
        raise ReferrersError(f"{layout_dir}: blob {digest} is missing") from None
    if Digest.of_bytes(data) != digest:
        raise ReferrersError(f"{layout_dir}: blob {digest} does not hash to its name")
    return data


# ------------------------------------------------------------------------------------------ places


class Referrers(Protocol):
    """Where the attestations of an image live beside it: a registry repository (the referrers API, else
    the fallback tag) or an OCI layout (its index). Listing gives pointers only; `fetch` re-hashes what
    one points at and checks that it is bound to the subject."""

    def discover(self, subject: Digest) -> tuple[list[dict[str, object]], str]:
        """The descriptors that refer to `subject`, and where the list came from (for reports)."""
        ...

    def fetch(self, subject: Digest, artifact: Digest) -> bytes:
        """The envelope bytes of `artifact`, checked against `subject`."""
        ...

    def manifest(self, artifact: Digest) -> bytes:
        """The artifact manifest's bytes, re-hashed against `artifact`."""
        ...

    def attach(
        self, subject: Descriptor, envelope: bytes, artifact_type: str, annotations: Mapping[str, str]
    ) -> Digest:
        """Store one attestation of `subject` and make it discoverable; its artifact manifest's digest."""
        ...


@dataclass(frozen=True)
class RegistryReferrers:
    client: RegistryClient
    repository: str

    def discover(self, subject: Digest) -> tuple[list[dict[str, object]], str]:
        return discover(self.client, self.repository, subject)

    def fetch(self, subject: Digest, artifact: Digest) -> bytes:
        try:
            return fetch_envelope(self.client, self.repository, subject, artifact)
        except RegistryError as exc:
            if "MANIFEST_UNKNOWN" in " ".join(exc.problems) or " 404 " in exc.message:
                raise ReferrersError(
                    f"the index lists {artifact}, which the registry does not have (stale fallback index)"
                ) from None
            raise

    def manifest(self, artifact: Digest) -> bytes:
        data, _, _ = self.client.get_manifest(self.repository, str(artifact), accept=(OCI_MANIFEST,))
        return data

    def attach(
        self, subject: Descriptor, envelope: bytes, artifact_type: str, annotations: Mapping[str, str]
    ) -> Digest:
        return attach(self.client, self.repository, subject, envelope, artifact_type, annotations)


@dataclass(frozen=True)
class LayoutReferrers:
    root: Path

    def discover(self, subject: Digest) -> tuple[list[dict[str, object]], str]:
        listed = layout_referrers(self.root, subject) if (self.root / "index.json").is_file() else []
        return listed, f"OCI layout {self.root}"

    def fetch(self, subject: Digest, artifact: Digest) -> bytes:
        return fetch_layout_envelope(self.root, subject, artifact)

    def manifest(self, artifact: Digest) -> bytes:
        return _layout_blob(self.root, artifact)

    def attach(
        self, subject: Descriptor, envelope: bytes, artifact_type: str, annotations: Mapping[str, str]
    ) -> Digest:
        return write_to_layout(self.root, subject, envelope, artifact_type, annotations)


@contextlib.contextmanager
def opened(target: Target) -> Iterator[Referrers]:
    """The attestations' place beside `target` (an OCI layout, or a registry repository, its client open
    while the block runs). The one place that tells the two apart."""
    if target.is_layout:
        yield LayoutReferrers(Path(target.location))
        return
    if not target.in_registry:
        raise ReferrersError(
            f"{target.text()}: attestations cannot live in a {target.kind}",
            hint="push to HOST/REPO[:TAG] or oci:DIR[:TAG]",
        )
    ref = Reference.parse(target.location)
    with RegistryClient(ref.registry) as client:
        yield RegistryReferrers(client, ref.repository)


def already_attached(
    place: Referrers, subject: Digest, artifact_type: str, envelope: Digest
) -> Digest | None:
    """The artifact already attached to `subject` with this type and this very envelope (reruns are
    idempotent), or None. A stale or unreadable entry is skipped: not ours to repair here."""
    descriptors, _ = place.discover(subject)
    for d in descriptors:
        if d.get("artifactType") != artifact_type or not _valid_digest(d.get("digest")):
            continue
        try:
            digest = Digest.parse(str(d["digest"]))
            doc = json.loads(place.manifest(digest))
        except (ServimgError, ValueError):
            continue
        bound = jv.member(doc, "subject", "digest") if isinstance(doc, dict) else None
        layers = doc.get("layers") if isinstance(doc, dict) else None
        if bound == str(subject) and any(
            isinstance(x, dict) and x.get("digest") == str(envelope) for x in layers or []
        ):
            return digest
    return None
