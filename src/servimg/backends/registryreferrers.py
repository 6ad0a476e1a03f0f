"""The referrers of images in a registry repository (distribution-spec v1.1): the referrers API where
the registry has it; otherwise an image index the client keeps under the tag `sha256-<hex>` (§Referrers
Tag Schema, §Pushing Manifests with Subject).

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

import io
import json
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from servimg.backends.referrers import (
    Holds,
    ReferrersError,
    Update,
    fallback_tag,
    referrer_descriptor,
    valid_digest,
)
from servimg.backends.registryclient import RegistryClient
from servimg.backends.registrywire import DEFAULT_ACCEPT
from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.core.errors import RegistryError, ServimgError
from servimg.oci.image import OCI_INDEX, OCI_MANIFEST

ATTACH_ATTEMPTS = 8
SETTLE_SECONDS = 0.2
_MAX_BACKOFF = 2.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegistryReferrers:
    """The referrers of images in one repository of a registry (its client open while used)."""

    client: RegistryClient
    repository: str
    attempts: int = ATTACH_ATTEMPTS
    settle: float = SETTLE_SECONDS

    def discover(self, subject: Digest) -> tuple[list[dict[str, object]], str]:
        """The referrers API's list, else the fallback tag's (never merged: a registry that gained the
        API lists what the tag index held, §Enabling the Referrers API), and which it was."""
        found = self.client.referrers(self.repository, subject)
        if found is not None:
            return sorted(found, key=canonical.dumps), "referrers API"
        tag = fallback_tag(subject)
        entries, problem = _fallback_entries(self.client, self.repository, subject)
        if problem:
            log.warning("%s: %s", self.repository, problem)
        listed = sorted(entries, key=canonical.dumps)
        return listed, f"fallback tag {tag}" + (f" ({problem})" if problem else "")

    def manifest(self, artifact: Digest) -> tuple[bytes, str]:
        try:
            data, media_type, _ = self.client.get_manifest(
                self.repository, str(artifact), accept=DEFAULT_ACCEPT
            )
        except RegistryError as exc:
            if "MANIFEST_UNKNOWN" in " ".join(exc.problems) or " 404 " in exc.message:
                raise ReferrersError(
                    f"the index lists {artifact}, which the registry does not have (stale fallback index)"
                ) from None
            raise
        return data, media_type

    def blob(self, digest: Digest) -> bytes:
        return self.client.get_blob(self.repository, digest)

    def attach(self, subject: Digest, manifest: bytes, blobs: Sequence[bytes]) -> Digest:
        """Blobs, then the manifest by digest; with the referrers API the registry indexes the artifact
        itself, without it the `sha256-<hex>` index is updated with write-then-verify (module docstring)."""
        digest = _push_artifact(self.client, self.repository, manifest, blobs)
        if self.client.referrers(self.repository, subject) is not None:
            return digest
        descriptor = referrer_descriptor(manifest)
        _add_to_fallback(self.client, self.repository, subject, descriptor, self.attempts, self.settle)
        return digest

    def tagged(self, tag: str) -> bytes | None:
        found = self.client.head_manifest(self.repository, tag, accept=DEFAULT_ACCEPT)
        if found is None:
            return None
        data, _, _ = self.client.get_manifest(self.repository, str(found[0]), accept=DEFAULT_ACCEPT)
        return data

    def update_tagged(self, tag: str, update: Update, holds: Holds) -> Digest | None:
        """cosign's `.sig`/`.att` tags are read-modify-write like the fallback index (module docstring):
        write, wait a jittered moment, re-read, and write again (merged with whatever another writer
        put there meanwhile) until what this writer added is seen under the tag."""
        for attempt in range(max(1, self.attempts)):
            change = update(self.tagged(tag))
            if change is None:
                return None
            digest = _push_artifact(self.client, self.repository, change.manifest, change.blobs, tag=tag)
            time.sleep(_jittered(self.settle, attempt))
            now = self.tagged(tag)
            if now is not None and holds(now):
                return digest
            log.info("tag %s lost our entry to a concurrent writer; retry %d", tag, attempt + 1)
        raise ReferrersError(
            f"could not keep our entry under {self.repository}:{tag} after {max(1, self.attempts)} attempts",
            hint="another client keeps rewriting that tag; adding is idempotent, run it again",
        )


def _push_artifact(
    client: RegistryClient, repo: str, manifest: bytes, blobs: Sequence[bytes], *, tag: str | None = None
) -> Digest:
    # Blobs before the manifest: a registry refuses a manifest whose blobs it lacks (MANIFEST_BLOB_UNKNOWN).
    for blob in blobs:
        client.push_blob(repo, Digest.of_bytes(blob), len(blob), _opener(blob))
    return client.put_manifest(repo, tag or str(Digest.of_bytes(manifest)), manifest, OCI_MANIFEST)


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
    good = [m for m in manifests if isinstance(m, dict) and valid_digest(m.get("digest"))]
    if len(good) != len(manifests):
        log.warning("dropping %d malformed entries of a referrers index", len(manifests) - len(good))
    return good
