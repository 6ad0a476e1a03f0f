"""OCI 1.1 referrers at a place: the artifacts whose manifest names an image as its `subject`
(image-spec v1.1 manifest.md §subject; distribution-spec v1.1 §Listing Referrers), as the registry and
layout backends keep them (`Backend.referrers`, found through `backends.transport`'s table).

A `Referrers` deals in OCI artifacts only: manifests and blobs, each re-hashed when read, and the index
that makes them discoverable (the registry's referrers API or its `sha256-<hex>` tag, a layout's
index.json). What an artifact holds (a DSSE envelope of an attestation) is `formats.referrers`'.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from servimg.core.digest import Digest
from servimg.core.errors import BackendError, ServimgError
from servimg.oci.image import OCI_MANIFEST


class ReferrersError(BackendError):
    """An attestation artifact or a referrers index is malformed, foreign, or could not be kept."""


@dataclass(frozen=True)
class TagUpdate:
    """What a writer puts under a tag: the new manifest and the blobs it needs (pushed first)."""

    manifest: bytes
    blobs: tuple[bytes, ...]
    media_type: str = OCI_MANIFEST


# Given the manifest now under the tag (None: no tag yet), the update to write, or None when what this
# writer adds is already there. It may raise (a foreign or malformed manifest is never replaced).
Update = Callable[[bytes | None], TagUpdate | None]
# Does this manifest, read back after writing, still hold what this writer added?
Holds = Callable[[bytes], bool]

# cosign's tag-based discovery (SIGNATURE_SPEC.md): `sha256-<hex>.sig` and `.att` name artifacts, not
# images; a layout or a tag listing skips them.
_COSIGN_TAG = re.compile(r"[a-z0-9]+-[0-9a-f]{32,128}\.(sig|att|sbom)")


def is_artifact_tag(tag: str) -> bool:
    return bool(_COSIGN_TAG.fullmatch(tag))


@dataclass(frozen=True)
class TagChange:
    """One read-modify-write of a tag (`Update`, then `Holds` on what is read back)."""

    tag: str
    update: Update
    holds: Holds


@dataclass(frozen=True)
class Artifact:
    """An artifact to attach: its manifest (naming the subject) and its blobs."""

    manifest: bytes
    blobs: tuple[bytes, ...]


class Referrers(Protocol):
    """Where the artifacts referring to an image live beside it: a registry repository (the referrers
    API, else the fallback tag) or an OCI layout (its index). Listing gives pointers only; `manifest` and
    `blob` re-hash what one points at."""

    def discover(self, subject: Digest) -> tuple[list[dict[str, object]], str]:
        """The descriptors that refer to `subject`, and where the list came from (for reports)."""
        ...

    def manifest(self, artifact: Digest) -> tuple[bytes, str]:
        """The artifact manifest's bytes, re-hashed against `artifact`, and its media type."""
        ...

    def blob(self, digest: Digest) -> bytes:
        """A blob of an artifact, re-hashed against `digest`."""
        ...

    def attach(self, subject: Digest, manifest: bytes, blobs: Sequence[bytes]) -> Digest:
        """Store an artifact (its `blobs`, then its `manifest`, which names `subject`) and make it
        discoverable; the manifest's digest."""
        ...

    def tagged(self, tag: str) -> bytes | None:
        """The manifest under `tag` (re-hashed against the digest the tag resolved to), or None."""
        ...

    def update_tagged(self, change: TagChange) -> Digest | None:
        """Read-modify-write the manifest under `change.tag` so that no concurrent writer loses an entry (a
        layout: under its lock; a registry: write, re-read, retry); the new manifest's digest, or None
        when nothing needed adding."""
        ...

    def commit(
        self, subject: Digest, artifacts: Sequence[Artifact], changes: Sequence[TagChange]
    ) -> tuple[list[Digest], list[Digest | None]]:
        """One publication: every artifact stored and made discoverable, every tag changed, together
        (a registry waits once for all its read-modify-writes to settle, not once per tag); the
        artifacts' manifest digests and each change's result as `update_tagged` gives it."""
        ...


def fallback_tag(subject: Digest) -> str:
    """§Referrers Tag Schema: algorithm (≤32 chars) `-` encoded (≤64 chars), e.g. `sha256-<hex>`."""
    return f"{subject.algorithm[:32]}-{subject.hex[:64]}"


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


def valid_digest(value: object) -> bool:
    try:
        Digest.parse(value)  # type: ignore[arg-type]
    except ServimgError:
        return False
    return True
