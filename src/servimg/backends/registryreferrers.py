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
    Artifact,
    ReferrersError,
    TagChange,
    TagUpdate,
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
from servimg.core.parallel import map_ordered
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
        return self.commit(subject, (Artifact(manifest, tuple(blobs)),), ())[0][0]

    def tagged(self, tag: str) -> bytes | None:
        found = self.client.head_manifest(self.repository, tag, accept=DEFAULT_ACCEPT)
        if found is None:
            return None
        data, _, _ = self.client.get_manifest(self.repository, str(found[0]), accept=DEFAULT_ACCEPT)
        return data

    def update_tagged(self, change: TagChange) -> Digest | None:
        return self._commit_tags([change], set())[0]

    def commit(
        self, subject: Digest, artifacts: Sequence[Artifact], changes: Sequence[TagChange]
    ) -> tuple[list[Digest], list[Digest | None]]:
        """Artifacts first (blobs, then manifests by digest); then every tag change, the `sha256-<hex>`
        index among them where the registry has no referrers API. cosign's `.sig`/`.att` tags are
        read-modify-write like that index (module docstring): all are written, one jittered wait, all
        re-read, and any whose entry another writer erased meanwhile is written again (merged with
        what is there now), until each holds what this writer added."""
        pushed: set[Digest] = set()
        digests = [
            _push_artifact(self.client, self.repository, a.manifest, a.blobs, pushed=pushed)
            for a in artifacts
        ]
        index: list[TagChange] = []
        if artifacts and self.client.referrers(self.repository, subject) is None:
            descriptors = [referrer_descriptor(a.manifest) for a in artifacts]
            index.append(_fallback_change(self.client, self.repository, subject, descriptors))
        results = self._commit_tags([*index, *changes], pushed)
        return digests, results[len(index) :]

    def _commit_tags(self, changes: Sequence[TagChange], pushed: set[Digest]) -> list[Digest | None]:
        results: list[Digest | None] = [None] * len(changes)
        pending = list(range(len(changes)))
        for attempt in range(max(1, self.attempts)):
            written = []
            for i in pending:
                change = changes[i].update(self.tagged(changes[i].tag))
                if change is None:
                    continue  # what this writer adds is there already
                results[i] = _push_artifact(
                    self.client,
                    self.repository,
                    change.manifest,
                    change.blobs,
                    tag=changes[i].tag,
                    media_type=change.media_type,
                    pushed=pushed,
                )
                written.append(i)
            if not written:
                return results
            # A concurrent writer that read before our PUT may overwrite it without our entry: wait
            # (jittered, so two writers fall out of step), then look again.
            time.sleep(_jittered(self.settle, attempt))
            pending = [i for i in written if not _holds(self.tagged(changes[i].tag), changes[i])]
            if not pending:
                return results
            for i in pending:
                log.info(
                    "tag %s lost our entry to a concurrent writer; retry %d", changes[i].tag, attempt + 1
                )
        tags = ", ".join(changes[i].tag for i in pending)
        raise ReferrersError(
            f"could not keep our entries under {self.repository}:{tags} "
            f"after {max(1, self.attempts)} attempts",
            hint="another client keeps rewriting that tag; adding is idempotent, run it again",
        )


def _holds(current: bytes | None, change: TagChange) -> bool:
    return current is not None and change.holds(current)


def _fallback_change(
    client: RegistryClient, repo: str, subject: Digest, descriptors: Sequence[Mapping[str, object]]
) -> TagChange:
    """The `sha256-<hex>` index gaining `descriptors` (§Pushing Manifests with Subject, step 4). Read
    strictly: an aliased tag or something other than an index there is an error, never overwritten."""
    tag = fallback_tag(subject)

    def update(_: bytes | None) -> TagUpdate | None:
        entries = _read_index(client, repo, tag, strict=True)
        if all(_lists(entries, d) for d in descriptors):
            return None
        return TagUpdate(_index_bytes(entries, descriptors), (), OCI_INDEX)

    def holds(current: bytes) -> bool:
        entries = _index_entries(current, OCI_INDEX) or []
        return all(_lists(entries, d) for d in descriptors)

    return TagChange(tag, update, holds)


def _push_artifact(
    client: RegistryClient,
    repo: str,
    manifest: bytes,
    blobs: Sequence[bytes],
    *,
    tag: str | None = None,
    media_type: str = OCI_MANIFEST,
    pushed: set[Digest] | None = None,
) -> Digest:
    """Blobs before the manifest: a registry refuses a manifest whose blobs it lacks
    (MANIFEST_BLOB_UNKNOWN). `pushed`: blobs this publication already stored (the empty config of every
    artifact, an envelope that is a referrer's layer and an `.att` layer), not asked about again."""
    for blob in blobs:
        digest = Digest.of_bytes(blob)
        if pushed is not None and digest in pushed:
            continue
        client.push_blob(repo, digest, len(blob), _opener(blob))
        if pushed is not None:
            pushed.add(digest)
    return client.put_manifest(repo, tag or str(Digest.of_bytes(manifest)), manifest, media_type)


def _opener(blob: bytes) -> Callable[[], BinaryIO]:
    return lambda: io.BytesIO(blob)


def _jittered(settle: float, attempt: int) -> float:
    return min(settle * 2.0**attempt, _MAX_BACKOFF) * (0.5 + random.random())


def _lists(entries: list[dict[str, object]], descriptor: Mapping[str, object]) -> bool:
    return any(e.get("digest") == descriptor["digest"] for e in entries)


def _index_bytes(entries: list[dict[str, object]], descriptors: Sequence[Mapping[str, object]]) -> bytes:
    """The merged index: one entry per digest (ours win), sorted by canonical bytes, canonical JSON."""
    by_digest = {e["digest"]: e for e in entries}
    for descriptor in descriptors:
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
    names = map_ordered(lambda e: _names_subject(client, repo, e, subject), entries)
    named = [e for e, names_it in zip(entries, names, strict=True) if names_it]
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
