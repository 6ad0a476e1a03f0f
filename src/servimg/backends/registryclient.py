"""servimg's own OCI distribution client (OCI distribution-spec v1.1): every request, retry and upload of
the registry backend (`backends.registry`). Why our own, and the security rules, are in `backends.registry`
and `backends.registryauth`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar
from urllib.parse import urljoin

from servimg.backends.registrysession import RegistrySession
from servimg.backends.registrywire import (
    CHUNK_SIZE,
    CHUNKED_THRESHOLD,
    DEFAULT_ACCEPT,
    IO_BLOCK,
    MANIFEST_LIMIT,
    READ_ONCE_ITEM,
    READ_ONCE_LIMIT,
    Body,
    Transient,
    declared_media_type,
    hash_as,
    media_type,
    pull_scopes,
    push_scopes,
    read_limited,
)
from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.core.errors import RegistryError, ServimgError
from servimg.core.lazy import LazyModule
from servimg.oci.image import (
    OCI_INDEX,
)

if TYPE_CHECKING:
    import requests
else:  # a build that reads and writes no registry never imports it (≈0.1 s)
    requests = LazyModule("requests")

T = TypeVar("T")

# ----------------------------------------------------------------------------------------------------- client


class RegistryClient(RegistrySession):
    """A client for one registry host (`127.0.0.1:5000`, `ghcr.io`, …) speaking OCI distribution-spec v1.1."""

    # ------------------------------------------------------------------------------------------ API

    def ping(self) -> None:
        """GET /v2/ (§Determining support): raise unless the registry answers, authorized, with 200."""
        what = f"checking registry {self.base_url}"
        self._call("GET", self._url(""), what=what, scopes=[], expect={200}, consume=lambda r: None)

    def supports_signatures(self) -> bool:
        """Whether the registry stores containers/image simple signatures itself: the
        `X-Registry-Supports-Signatures: 1` answer to GET /v2/ (containers/image
        docs/signature-protocols.md; OpenShift's integrated registry has it, distribution does not)."""
        what = f"checking registry {self.base_url} for the signature extension"
        return self._call(
            "GET",
            self._url(""),
            what=what,
            scopes=[],
            expect={200},
            consume=lambda r: r.headers.get("X-Registry-Supports-Signatures") == "1",
        )

    def put_signature(self, repo: str, digest: Digest, name: str, content: bytes) -> None:
        """PUT one signature through the extension API (signature-protocols.md §Writing signatures):
        `/extensions/v2/<name>/signatures/<digest>` with `{"signatures": [{version 2, type atomic, name
        <digest>@<32 hex>, content base64}]}`."""
        self._check_repo(repo)
        body = canonical.dumps(
            {
                "signatures": [
                    {
                        "version": 2,
                        "type": "atomic",
                        "name": name,
                        "content": base64.b64encode(content).decode("ascii"),
                    }
                ]
            }
        )
        self._call(
            "PUT",
            f"{self.base_url}/extensions/v2/{repo}/signatures/{digest}",
            what=f"storing a signature of {digest} in {self.registry}/{repo}",
            scopes=push_scopes(repo),
            expect={200, 201},
            consume=lambda r: None,
            headers={"Content-Type": "application/json"},
            body=body,
        )

    def has_blob(self, repo: str, digest: Digest) -> bool:
        """HEAD /v2/<name>/blobs/<digest> (§Checking if content exists in the registry)."""
        self._check_repo(repo)
        what = f"checking blob {digest} in {self.registry}/{repo}"
        url = self._url(f"{repo}/blobs/{digest}")
        status = self._call(
            "HEAD",
            url,
            what=what,
            scopes=pull_scopes(repo),
            expect={200, 404},
            consume=lambda r: r.status_code,
        )
        return status == 200

    def repositories(self, limit: int = 1000) -> list[str]:
        """The registry's repositories (`GET /v2/_catalog`, distribution's listing; not every registry
        serves it to every client): empty when it does not answer."""
        what = f"listing the repositories of {self.registry}"
        try:
            listed = self._call(
                "GET",
                self._url("_catalog"),
                what=what,
                scopes=["registry:catalog:*"],
                expect={200},
                consume=lambda r: r.json(),
                params={"n": str(limit)},
            )
        except (RegistryError, ValueError):
            return []
        names = listed.get("repositories") if isinstance(listed, dict) else None
        return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []

    def get_blob(self, repo: str, digest: Digest) -> bytes:
        """GET /v2/<name>/blobs/<digest> (§Pulling blobs), verified against `digest`."""
        self._check_repo(repo)
        what = f"fetching blob {digest} from {self.registry}/{repo}"

        def consume(resp: requests.Response) -> bytes:
            data = b"".join(resp.iter_content(IO_BLOCK))
            self._verify(digest, hash_as(digest.algorithm, data), what)
            return data

        url = self._url(f"{repo}/blobs/{digest}")
        # identity: a transfer encoding would make the bytes we hash differ from the stored blob's.
        headers = {"Accept-Encoding": "identity"}

        return self._once(
            (repo, str(digest), "blob"), lambda: (self._get(url, repo, what, consume, headers), "")
        )[0]

    def _get(
        self,
        url: str,
        repo: str,
        what: str,
        consume: Callable[[requests.Response], T],
        headers: dict[str, str],
    ) -> T:
        """One GET that must answer 200, with pull access to `repo`."""
        found: T = self._call(
            "GET", url, what=what, scopes=pull_scopes(repo), expect={200}, consume=consume, headers=headers
        )
        return found

    def _once(self, key: tuple[str, str, str], fetch: Callable[[], tuple[bytes, str]]) -> tuple[bytes, str]:
        """What `fetch` returns for content-addressed `key`, fetched at most once by this client while it
        fits the read-once bound (`__init__`); a concurrent reader of the same key waits for it."""
        if key in self._read_once:
            return self._read_once[key]
        with self._reading_guard:
            lock = self._reading.setdefault(key, threading.Lock())
        with lock:
            if key in self._read_once:
                return self._read_once[key]
            data, media = fetch()
            if len(data) <= READ_ONCE_ITEM and self._read_once_bytes + len(data) <= READ_ONCE_LIMIT:
                self._read_once[key] = (data, media)
                self._read_once_bytes += len(data)
            return data, media

    def hash_blob(self, repo: str, digest: Digest) -> None:
        """GET a blob and hash it as it streams, keeping nothing (§Pulling blobs): raise when the registry
        serves bytes that do not match `digest`."""
        self._check_repo(repo)
        what = f"fetching blob {digest} from {self.registry}/{repo}"

        def consume(resp: requests.Response) -> None:
            hasher = hashlib.new(digest.algorithm)
            for block in resp.iter_content(IO_BLOCK):
                hasher.update(block)
            self._verify(digest, Digest(digest.algorithm, hasher.hexdigest()), what)

        url = self._url(f"{repo}/blobs/{digest}")
        headers = {"Accept-Encoding": "identity"}
        self._call(
            "GET", url, what=what, scopes=pull_scopes(repo), expect={200}, consume=consume, headers=headers
        )

    def download_blob(self, repo: str, digest: Digest, dest: Path) -> None:
        """Stream a blob to `dest` (§Pulling blobs): temp file beside it, hashed while written, atomic rename.

        On any failure the temp file is removed: `dest` is either untouched or complete and verified.
        """
        self._check_repo(repo)
        what = f"downloading blob {digest} from {self.registry}/{repo}"

        def consume(resp: requests.Response) -> None:
            fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
            try:
                hasher = hashlib.new(digest.algorithm)
                with os.fdopen(fd, "wb") as fh:
                    for block in resp.iter_content(IO_BLOCK):
                        hasher.update(block)
                        fh.write(block)
                    fh.flush()
                    os.fsync(fh.fileno())
                self._verify(digest, Digest(digest.algorithm, hasher.hexdigest()), what)
                os.replace(tmp, dest)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise

        url = self._url(f"{repo}/blobs/{digest}")
        headers = {"Accept-Encoding": "identity"}
        self._call(
            "GET", url, what=what, scopes=pull_scopes(repo), expect={200}, consume=consume, headers=headers
        )

    def push_blob(
        self,
        repo: str,
        digest: Digest,
        size: int,
        open_blob: Callable[[], BinaryIO],
        *,
        mount_from: str | None = None,
    ) -> str:
        """Push a blob unless present; return "exists", "mounted" or "uploaded".

        §Checking if content exists, §Mounting a blob from another repository, §Pushing a blob
        monolithically (POST then one streamed PUT), §Pushing a blob in chunks (above CHUNKED_THRESHOLD).
        `open_blob` is called once per attempt: a retry restarts the upload from scratch, never from a
        half-known offset.
        """
        self._check_repo(repo)
        if mount_from is not None:
            self._check_repo(mount_from)
        if size < 0:
            raise RegistryError(f"blob {digest}: negative size {size}")
        if self.has_blob(repo, digest):
            return "exists"
        what = f"pushing blob {digest} to {self.registry}/{repo}"
        source = mount_from if mount_from not in (None, repo) else None
        return self._retrying(what, lambda: self._upload_once(repo, digest, size, open_blob, source, what))

    def _upload_once(
        self,
        repo: str,
        digest: Digest,
        size: int,
        open_blob: Callable[[], BinaryIO],
        mount_from: str | None,
        what: str,
    ) -> str:
        scopes = push_scopes(repo) + (pull_scopes(mount_from) if mount_from else [])
        started = self._start_upload(repo, digest, mount_from, scopes, what)
        if started is None:
            return "mounted"
        location, min_chunk = started
        hasher = hashlib.new(digest.algorithm)
        with open_blob() as stream:
            final: bytes | Body = b""
            if size > CHUNKED_THRESHOLD:
                chunk = max(CHUNK_SIZE, min_chunk)
                location = self._patch_chunks(location, stream, size, chunk, hasher, scopes, what)
            elif size:
                final = Body(stream, size, hasher, what)
            resp = self._send(
                "PUT",
                location,
                what=what,
                scopes=scopes,
                headers={"Content-Type": "application/octet-stream"},
                body=final,
                params={"digest": str(digest)},
            )
        with resp:
            self._expect(resp, {201}, what)
            self._check_digest_header(resp, digest, what)
        # The registry verified ?digest=; checking our own hash too catches a registry that did not.
        self._verify(digest, Digest(digest.algorithm, hasher.hexdigest()), what)
        return "uploaded"

    def _start_upload(
        self, repo: str, digest: Digest, mount_from: str | None, scopes: Sequence[str], what: str
    ) -> tuple[str, int] | None:
        """POST an upload session, asking to mount from `mount_from` first; None if the mount succeeded."""
        params = {"mount": str(digest), "from": mount_from} if mount_from else None
        resp = self._send(
            "POST", self._url(f"{repo}/blobs/uploads/"), what=what, scopes=scopes, params=params
        )
        with resp:
            if resp.status_code == 201 and mount_from:
                self._check_digest_header(resp, digest, what)
                return None
            # 202 after a mount request means "not mounted; here is an upload session instead".
            self._expect(resp, {202}, what)
            return self._location(resp, what), int(resp.headers.get("OCI-Chunk-Min-Length", "0") or 0)

    def _location(self, resp: requests.Response, what: str) -> str:
        location = resp.headers.get("Location")
        if not location:
            raise self._error(f"{what}: registry answered {resp.status_code} without a Location")
        return urljoin(self.base_url + "/", location)

    def _patch_chunks(
        self,
        location: str,
        stream: BinaryIO,
        size: int,
        chunk: int,
        hasher: hashlib._Hash,
        scopes: Sequence[str],
        what: str,
    ) -> str:
        """PATCH the blob in order with Content-Range; return the Location for the closing PUT."""
        offset = 0
        while offset < size:
            length = min(chunk, size - offset)
            end = offset + length - 1
            headers = {"Content-Type": "application/octet-stream", "Content-Range": f"{offset}-{end}"}
            body = Body(stream, length, hasher, what)
            resp = self._send("PATCH", location, what=what, scopes=scopes, headers=headers, body=body)
            with resp:
                self._expect(resp, {202}, what)
                acknowledged = resp.headers.get("Range")
                if acknowledged is not None and acknowledged != f"0-{end}":
                    # The session lost bytes; only a fresh upload is safe.
                    raise Transient(f"{what}: registry acknowledged {acknowledged}, expected 0-{end}")
                location = self._location(resp, what)
            offset += length
        return location

    def put_manifest(self, repo: str, reference: str, data: bytes, media_type: str) -> Digest:
        """PUT the manifest's exact bytes (§Pushing manifests); return their digest."""
        self._check_repo(repo)
        pinned = self._check_reference(reference)
        digest = hash_as(pinned.algorithm if pinned else "sha256", data)
        what = f"pushing manifest {reference} to {self.registry}/{repo}"
        if pinned is not None and pinned != digest:
            raise RegistryError(f"{what}: the manifest hashes to {digest}, not to the digest it is pushed as")
        declared = declared_media_type(data)
        if declared is not None and declared != media_type:
            raise RegistryError(f"{what}: Content-Type {media_type} but the manifest declares {declared}")

        def consume(resp: requests.Response) -> None:
            self._check_digest_header(resp, digest, what)

        url = self._url(f"{repo}/manifests/{reference}")
        headers = {"Content-Type": media_type}
        self._call(
            "PUT",
            url,
            what=what,
            scopes=push_scopes(repo),
            expect={200, 201},
            consume=consume,
            headers=headers,
            body=data,
        )
        return digest

    def get_manifest(
        self, repo: str, reference: str, accept: Sequence[str] = DEFAULT_ACCEPT
    ) -> tuple[bytes, str, Digest]:
        """GET a manifest (§Pulling manifests); return (exact bytes, media type, digest of those bytes).

        The body is always re-hashed: a digest reference must match it, and a tag fetch must agree with the
        registry's Docker-Content-Digest.
        """
        self._check_repo(repo)
        pinned = self._check_reference(reference)
        what = f"fetching manifest {reference} from {self.registry}/{repo}"

        def consume(resp: requests.Response) -> tuple[bytes, str, Digest]:
            data = read_limited(resp, MANIFEST_LIMIT, what)
            if pinned is not None:
                self._verify(pinned, hash_as(pinned.algorithm, data), what)
                return data, media_type(resp, data), pinned
            digest = Digest.of_bytes(data)
            self._check_digest_header(resp, digest, what)
            return data, media_type(resp, data), digest

        url = self._url(f"{repo}/manifests/{reference}")
        headers = {"Accept": ", ".join(accept)}

        if pinned is None:  # a tag: what it names may move; only a digest's bytes are read once
            return self._get(url, repo, what, consume, headers)
        data, media = self._once(
            (repo, str(pinned), ", ".join(accept)), lambda: self._get(url, repo, what, consume, headers)[:2]
        )
        return data, media, pinned

    def head_manifest(
        self, repo: str, reference: str, accept: Sequence[str] = DEFAULT_ACCEPT
    ) -> tuple[Digest, str, int] | None:
        """HEAD a manifest (§Checking if content exists): (digest, media type, size), or None if absent.

        Falls back to a GET when the registry omits Docker-Content-Digest or Content-Length on HEAD.
        """
        self._check_repo(repo)
        pinned = self._check_reference(reference)
        what = f"checking manifest {reference} in {self.registry}/{repo}"
        url = self._url(f"{repo}/manifests/{reference}")
        headers = {"Accept": ", ".join(accept)}
        status, found = self._call(
            "HEAD",
            url,
            what=what,
            scopes=pull_scopes(repo),
            expect={200, 404},
            consume=lambda r: (r.status_code, dict(r.headers)),
            headers=headers,
        )
        if status == 404:
            return None
        header, length = found.get("Docker-Content-Digest"), found.get("Content-Length", "")
        if header is None or not length.isdigit():
            data, media_type, digest = self.get_manifest(repo, reference, accept)
            return digest, media_type, len(data)
        digest = self._parse_digest_header(header, what)
        if pinned is not None:
            self._verify(pinned, digest, what)
        media_type = found.get("Content-Type", "").split(";", 1)[0].strip()
        return digest, media_type, int(length)

    def _parse_digest_header(self, header: str, what: str) -> Digest:
        try:
            return Digest.parse(header)
        except ServimgError:
            raise self._error(f"{what}: registry sent a malformed Docker-Content-Digest") from None

    def delete_manifest(self, repo: str, digest: Digest) -> None:
        """DELETE /v2/<name>/manifests/<digest> (§Deleting manifests); tags pointing at it go with it."""
        self._check_repo(repo)
        what = f"deleting manifest {digest} from {self.registry}/{repo}"
        url = self._url(f"{repo}/manifests/{digest}")
        scopes = [f"repository:{repo}:delete"]
        self._call("DELETE", url, what=what, scopes=scopes, expect={200, 202}, consume=lambda r: None)

    def list_tags(self, repo: str, *, page_size: int | None = None) -> list[str]:
        """GET /v2/<name>/tags/list, following `Link: <…>; rel="next"` pages (§Listing tags)."""
        self._check_repo(repo)
        what = f"listing tags of {self.registry}/{repo}"

        def consume(resp: requests.Response) -> tuple[list[str], str | None]:
            try:
                doc = json.loads(read_limited(resp, MANIFEST_LIMIT, what))
            except (ValueError, RecursionError):
                raise self._error(f"{what}: the registry's answer is not JSON") from None
            tags = doc.get("tags") if isinstance(doc, dict) else None
            following = resp.links.get("next", {}).get("url")
            return [t for t in tags or [] if isinstance(t, str)], urljoin(
                resp.url, following
            ) if following else None

        tags: list[str] = []
        url: str | None = self._url(f"{repo}/tags/list")
        params = {"n": str(page_size)} if page_size else None
        seen: set[str] = set()
        while url is not None and url not in seen:  # a Link loop must not spin forever
            seen.add(url)
            page, url = self._call(
                "GET", url, what=what, scopes=pull_scopes(repo), expect={200}, consume=consume, params=params
            )
            tags.extend(page)
            params = None  # the Link URL carries n and last itself
        return tags

    def referrers(
        self, repo: str, digest: Digest, artifact_type: str | None = None
    ) -> list[dict[str, object]] | None:
        """GET /v2/<name>/referrers/<digest> (§Listing referrers): the index's descriptors.

        None when the registry has no referrers API (a 404 without an image index body, e.g.
        distribution 2.8's "404 page not found"): the caller then uses the `sha256-<hex>` tag schema
        (§Referrers tag schema).
        """
        self._check_repo(repo)
        what = f"listing referrers of {digest} in {self.registry}/{repo}"
        params = {"artifactType": artifact_type} if artifact_type else None
        url: str | None = self._url(f"{repo}/referrers/{digest}")
        found: list[dict[str, object]] = []
        filtered = False
        seen: set[str] = set()
        while url is not None and url not in seen:
            seen.add(url)
            page = self._call(
                "GET",
                url,
                what=what,
                scopes=pull_scopes(repo),
                expect={200, 404},
                consume=lambda r: self._referrers_page(r, what),
                headers={"Accept": OCI_INDEX},
                params=params,
            )
            if page is None:
                return None
            descriptors, url, applied = page
            found.extend(descriptors)
            filtered = filtered or applied
            params = None
        if artifact_type and not filtered:
            # The registry MAY ignore the filter; it says so by omitting OCI-Filters-Applied.
            found = [d for d in found if d.get("artifactType") == artifact_type]
        return found

    def _referrers_page(
        self, resp: requests.Response, what: str
    ) -> tuple[list[dict[str, object]], str | None, bool] | None:
        data = read_limited(resp, MANIFEST_LIMIT, what)
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            doc = None
        manifests = doc.get("manifests") if isinstance(doc, dict) else None
        if not isinstance(manifests, list):
            if resp.status_code == 404:
                return None
            raise self._error(f"{what}: the registry's answer is not an image index")
        following = resp.links.get("next", {}).get("url")
        applied = "artifacttype" in resp.headers.get("OCI-Filters-Applied", "").lower()
        next_url = urljoin(resp.url, following) if following else None
        return [d for d in manifests if isinstance(d, dict)], next_url, applied
