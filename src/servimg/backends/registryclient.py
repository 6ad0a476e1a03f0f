"""servimg's own OCI distribution client (OCI distribution-spec v1.1): every request, retry and upload of
the registry backend (`backends.registry`). Why our own, and the security rules, are in `backends.registry`
and `backends.registryauth`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO, TypeVar
from urllib.parse import urljoin

from servimg.backends import credentials as creds_module
from servimg.backends.credentials import HelperRunner, run_helper
from servimg.backends.registryauth import Auth
from servimg.backends.registrywire import (
    CHUNK_SIZE,
    CHUNKED_THRESHOLD,
    CODE_HINTS,
    DEFAULT_ACCEPT,
    ERROR_BODY_LIMIT,
    IO_BLOCK,
    MANIFEST_LIMIT,
    MAX_BACKOFF,
    READ_ONCE_ITEM,
    READ_ONCE_LIMIT,
    Body,
    Transient,
    declared_media_type,
    describe,
    error_lines,
    hash_as,
    host_of,
    is_loopback,
    media_type,
    pull_scopes,
    push_scopes,
    read_errors,
    read_limited,
    retry_after,
    unresolvable,
)
from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.core.errors import RegistryError, ServimgError
from servimg.core.lazy import LazyModule
from servimg.core.reference import is_valid_repository, is_valid_tag
from servimg.oci.image import (
    OCI_INDEX,
)

if TYPE_CHECKING:
    import requests
else:  # a build that reads and writes no registry never imports it (≈0.1 s)
    requests = LazyModule("requests")

T = TypeVar("T")
log = logging.getLogger("servimg.backends.registry")  # one logger for the whole client

# ----------------------------------------------------------------------------------------------------- client


class RegistryClient:
    """A client for one registry host (`127.0.0.1:5000`, `ghcr.io`, …) speaking OCI distribution-spec v1.1."""

    def __init__(
        self,
        registry: str,
        *,
        scheme: str | None = None,
        timeout: float = 60,
        retries: int = 4,
        backoff: float = 0.5,
        session: requests.Session | None = None,
        docker_config: Path | None = None,
        sleep: Callable[[float], None] = time.sleep,
        helpers: HelperRunner = run_helper,
    ) -> None:
        """`sleep` waits out each back-off (a seam: tests record the delays instead of sleeping);
        `helpers` runs docker credential helpers (the default runs `docker-credential-<name> get`)."""
        loopback = is_loopback(host_of(registry))
        scheme = scheme or ("http" if loopback else "https")
        if scheme not in ("http", "https"):
            raise RegistryError(
                f"unsupported scheme {scheme!r} for registry {registry}", hint="use http or https"
            )
        if retries < 0:
            raise RegistryError(f"retries must be >= 0, not {retries}")
        self.registry = registry
        self.base_url = f"{scheme}://{registry}"
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.sleep = sleep
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        if self._owns_session and loopback:
            # A proxy from the environment cannot reach our loopback, and ~/.netrc must not add auth.
            self._session.trust_env = False
        config = creds_module.config_path(docker_config)
        self._auth = Auth(registry, config, self._session, timeout, helpers)
        # What this client already fetched by digest, verified on the way in: a manifest or a small blob
        # (an attestation's envelope, a config) is read once per client, however many readers ask for it
        # (check and the matrix reach one envelope through a referrer, an `.att` layer and an index
        # entry). Content-addressed, so it can never answer with other bytes; it lives as long as the
        # client (one command), and holds at most READ_ONCE_LIMIT bytes.
        self._read_once: dict[tuple[str, str, str], tuple[bytes, str]] = {}
        self._read_once_bytes = 0
        # Concurrent readers of one digest (core.parallel) wait for the first one's bytes, not a 2nd GET.
        self._reading: dict[tuple[str, str, str], threading.Lock] = {}
        self._reading_guard = threading.Lock()

    def __repr__(self) -> str:
        return f"RegistryClient({self.base_url!r})"

    def close(self) -> None:
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------- plumbing

    def _url(self, path: str) -> str:
        return f"{self.base_url}/v2/{path}"

    def _error(self, message: str, *, hint: str = "", problems: Sequence[str] = ()) -> RegistryError:
        redact = self._auth.redact
        return RegistryError(redact(message), hint=redact(hint), problems=[redact(p) for p in problems])

    def _exchange(
        self,
        method: str,
        url: str,
        *,
        what: str,
        scopes: Sequence[str],
        headers: Mapping[str, str] | None,
        body: bytes | Body | None,
        params: Mapping[str, str] | None,
        stream: bool,
    ) -> requests.Response:
        sent = dict(headers or {})
        authorization = self._auth.header(scopes)
        if authorization is not None:
            sent["Authorization"] = authorization
        try:
            return self._session.request(
                method, url, headers=sent, data=body, params=params, stream=stream, timeout=self.timeout
            )
        except (requests.ConnectionError, requests.Timeout) as exc:
            reason = unresolvable(exc)
            if reason is not None:  # an unknown host: permanent, never retried
                raise self._error(
                    f"{what}: the host {host_of(self.registry)} does not resolve ({reason})",
                    hint="check the registry's name; a reference without a registry host names Docker Hub "
                    "(docker.io), which this machine may not reach",
                ) from None
            raise Transient(f"{what}: {describe(exc)}") from None

    def _send(
        self,
        method: str,
        url: str,
        *,
        what: str,
        scopes: Sequence[str],
        headers: Mapping[str, str] | None = None,
        body: bytes | Body | None = None,
        params: Mapping[str, str] | None = None,
        stream: bool = False,
    ) -> requests.Response:
        """One HTTP exchange answering at most one auth challenge; Transient for retryable failures."""

        def exchange() -> requests.Response:
            return self._exchange(
                method,
                url,
                what=what,
                scopes=scopes,
                headers=headers,
                body=body,
                params=params,
                stream=stream,
            )

        resp = exchange()
        if resp.status_code == 401 and self._auth.answer(resp, scopes):
            resp.close()
            if isinstance(body, Body):
                # A streamed body is half consumed; the caller's retry restarts it with the new authorization.
                raise Transient(f"{what}: authorization needed mid-upload")
            resp = exchange()
        if resp.status_code == 429 or resp.status_code >= 500:
            resp.close()
            raise Transient(f"{what}: registry answered {resp.status_code} {resp.reason}", retry_after(resp))
        return resp

    def _refusal(self, resp: requests.Response, what: str) -> RegistryError:
        """A RegistryError carrying the registry's error codes and messages (§Error Codes)."""
        try:
            body = next(resp.iter_content(ERROR_BODY_LIMIT), b"")
        except read_errors():
            body = b""
        problems, codes = error_lines(body)
        hint = next((CODE_HINTS[c] for c in codes if c in CODE_HINTS), "")
        if resp.status_code in (401, 403) or {"UNAUTHORIZED", "DENIED"} & set(codes):
            hint = (
                f"log in with `docker login {self.registry}` (credentials are read from {self._auth.source})"
            )
        return self._error(
            f"{what}: registry answered {resp.status_code} {resp.reason}", hint=hint, problems=problems
        )

    def _expect(self, resp: requests.Response, expect: Collection[int], what: str) -> None:
        if resp.status_code not in expect:
            raise self._refusal(resp, what)

    def _retrying(self, what: str, attempt: Callable[[], T]) -> T:
        """Run `attempt` up to 1 + retries times on transient failures, backing off exponentially."""
        last = Transient(what)
        for n in range(self.retries + 1):
            if n:
                delay = min(self.backoff * 2 ** (n - 1), MAX_BACKOFF)
                if last.retry_after is not None:
                    delay = min(max(delay, last.retry_after), MAX_BACKOFF)
                log.info("%s; retry %d/%d in %.2fs", self._auth.redact(last.what), n, self.retries, delay)
                self.sleep(delay)
            try:
                return attempt()
            except Transient as exc:
                last = exc
        raise self._error(
            f"{last.what} (gave up after {self.retries + 1} attempts)",
            hint=f"is the registry running at {self.base_url}? start it, or check the reference",
        )

    def _call(
        self,
        method: str,
        url: str,
        *,
        what: str,
        scopes: Sequence[str],
        expect: Collection[int],
        consume: Callable[[requests.Response], T],
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        params: Mapping[str, str] | None = None,
    ) -> T:
        """A retried request whose response body is read by `consume` inside the same attempt."""

        def attempt() -> T:
            resp = self._send(
                method, url, what=what, scopes=scopes, headers=headers, body=body, params=params, stream=True
            )
            with resp:
                self._expect(resp, expect, what)
                try:
                    return consume(resp)
                except read_errors() as exc:
                    raise Transient(f"{what}: {describe(exc)}") from None

        return self._retrying(what, attempt)

    def _check_repo(self, repo: str) -> None:
        if not is_valid_repository(repo):
            raise RegistryError(
                f"invalid repository name {repo!r}", hint="lowercase path components, e.g. servimg/vllm"
            )

    def _check_reference(self, reference: str) -> Digest | None:
        """A manifest reference is a tag or a digest (§Pulling manifests); return the digest if it is one."""
        if ":" in reference:
            try:
                return Digest.parse(reference)
            except ServimgError as exc:
                raise RegistryError(exc.message, hint=exc.hint) from None
        if not is_valid_tag(reference):
            raise RegistryError(f"invalid tag {reference!r}", hint="tags are 1-128 of [A-Za-z0-9_.-]")
        return None

    def _check_digest_header(self, resp: requests.Response, expected: Digest, what: str) -> None:
        header = resp.headers.get("Docker-Content-Digest")
        if header is not None and header != str(expected):
            raise self._error(f"{what}: registry reports digest {header}, expected {expected}")

    def _verify(self, expected: Digest, actual: Digest, what: str) -> None:
        if actual != expected:
            raise self._error(
                f"{what}: digest mismatch: expected {expected}, got {actual}",
                hint="the registry served different content; do not trust this registry's copy",
            )

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
