"""servimg's own OCI distribution client (OCI distribution-spec v1.1).

Why our own: Docker Engine 20.10's `docker push` rewrites an OCI manifest into Docker schema 2, which changes
its digest. A publisher that promises "this digest is what was built" must PUT the manifest's exact bytes, and
must re-hash everything it reads back. Section names below ("§Pushing blobs" …) are those of the spec's
`spec.md`.

Security: credentials come from the Docker config file or its credential helpers (`backends.credentials`)
and are sent only in `Authorization` headers (or the token request's body). No
exception message, log line or repr ever contains a password, a base64 `auth` value or a bearer token; every
message is passed through `_Auth.redact` as a last line of defence.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO, TypeVar
from urllib.parse import urljoin, urlsplit

from servimg.backends import credentials as creds_module
from servimg.backends.credentials import Credentials, HelperRunner, run_helper
from servimg.backends.target import ReadOptions, Target, WriteOptions
from servimg.core.digest import Digest
from servimg.core.errors import RegistryError, ServimgError
from servimg.core.lazy import LazyModule
from servimg.core.progress import NULL, Advance, CountingReader, Log, Progress
from servimg.core.reference import Reference, is_valid_repository, is_valid_tag
from servimg.oci.image import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    INDEX_TYPES,
    OCI_INDEX,
    OCI_MANIFEST,
    Descriptor,
    Image,
)
from servimg.oci.store import BlobStore

if TYPE_CHECKING:
    import requests
else:  # a build that reads and writes no registry never imports it (≈0.1 s)
    requests = LazyModule("requests")

# Asked for explicitly, every time: a registry that falls back to another manifest type would otherwise
# hand us a different document (and digest) than the one the tag names.
DEFAULT_ACCEPT: tuple[str, ...] = (OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST)

# Blobs larger than this go up in chunks (§Pushing a blob in chunks) so that one stalled request never has to
# carry gigabytes; smaller ones use one streamed PUT (§Pushing a blob monolithically, POST then PUT).
CHUNKED_THRESHOLD = 64 << 20
CHUNK_SIZE = 16 << 20
# §Pushing manifests: registries SHOULD accept manifests of at least 4 MiB; refusing to read more keeps a
# hostile or broken registry from filling memory.
MANIFEST_LIMIT = 4 << 20
MAX_BACKOFF = 30.0

_IO_BLOCK = 1 << 20
_ERROR_BODY_LIMIT = 64 << 10
_CHALLENGE_PARAM = re.compile(r'(\w+)\s*=\s*(?:"([^"]*)"|([^\s,]+))')
# Codes of the spec's error table (§Error Codes) with what to do about them.
_CODE_HINTS = {
    "NAME_UNKNOWN": "the repository does not exist on this registry; check the name",
    "MANIFEST_UNKNOWN": "no manifest with that tag or digest; check the reference",
    "BLOB_UNKNOWN": "the blob is not in this repository; push it first",
    "MANIFEST_BLOB_UNKNOWN": "the manifest references a blob the registry lacks; push the blobs first",
    "DIGEST_INVALID": "the content does not hash to its digest; it changed since it was hashed",
    "MANIFEST_INVALID": "the registry refused the manifest; check its mediaType and descriptors",
    "UNSUPPORTED": "the registry does not support this operation (deletes need storage.delete.enabled)",
    "TOOMANYREQUESTS": "the registry is rate limiting; wait and retry",
}

T = TypeVar("T")
log = logging.getLogger(__name__)


class _Transient(Exception):
    """A failure worth retrying: connection error, timeout, 5xx or 429 (§Error Codes: TOOMANYREQUESTS)."""

    def __init__(self, what: str, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.retry_after = retry_after


# ---------------------------------------------------------------------------------------------- hosts, config


def _host_of(registry: str) -> str:
    if registry.startswith("["):
        return registry[1 : registry.find("]")]
    return registry.rsplit(":", 1)[0]


def _is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


# ------------------------------------------------------------------------------------------------------- auth


def _parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="…",service="…",scope="…"` → ("bearer", {...}) (RFC 7235 §4.1)."""
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): m.group(2) or m.group(3) or "" for m in _CHALLENGE_PARAM.finditer(rest)}
    return scheme.lower(), params


class _Auth:
    """Answers 401 challenges: Basic with the configured credentials, or the Bearer token flow.

    Tokens are cached per scope set, so a push to one repository fetches one token, not one per request.
    """

    def __init__(
        self,
        registry: str,
        config: Path,
        session: requests.Session,
        timeout: float,
        helpers: HelperRunner = run_helper,
    ) -> None:
        self._registry = registry
        self._config = config
        self._helpers = helpers
        self._session = session
        self._timeout = timeout
        self._loaded = False
        self._creds: Credentials | None = None
        self._basic = False
        self._tokens: dict[str, str] = {}
        self._secrets: set[str] = set()

    def __repr__(self) -> str:
        return f"_Auth({self._registry!r})"

    @property
    def config(self) -> Path:
        return self._config

    @property
    def source(self) -> str:
        """Where the credentials came from (a config key or a helper), or the config file searched."""
        return self._creds.source if self._creds is not None else str(self._config)

    def credentials(self) -> Credentials | None:
        # Loaded lazily: an anonymous registry never needs the config file (or a helper) at all.
        if not self._loaded:
            self._loaded = True
            self._creds = creds_module.lookup(self._registry, self._config, self._helpers)
            if self._creds is not None:
                self._secrets.update(self._creds.secrets())
        return self._creds

    def header(self, scopes: Sequence[str]) -> str | None:
        token = self._tokens.get(" ".join(sorted(scopes)))
        if token is not None:
            return f"Bearer {token}"
        creds = self._creds
        if self._basic and creds is not None:
            return f"Basic {creds.basic()}"
        return None

    def answer(self, response: requests.Response, scopes: Sequence[str]) -> bool:
        """Learn from a 401; True if resending the request with new authorization can succeed."""
        scheme, params = _parse_challenge(response.headers.get("WWW-Authenticate", ""))
        if scheme == "basic":
            creds = self.credentials()
            if self._basic or creds is None or creds.identity_token:
                return False  # the credentials we sent were refused, or there are none for basic
            self._basic = True
            return True
        if scheme == "bearer" and params.get("realm"):
            self._tokens[" ".join(sorted(scopes))] = self._fetch_token(params, scopes)
            return True
        return False

    def _fetch_token(self, params: Mapping[str, str], scopes: Sequence[str]) -> str:
        """GET the realm with service and scope (distribution "Token Authentication Specification")."""
        realm = urlsplit(params["realm"])
        where = f"{realm.scheme}://{realm.netloc}{realm.path}"
        if realm.scheme not in ("http", "https"):
            raise RegistryError(f"token realm {where!r} is not an http(s) URL")
        wanted = sorted(set(scopes) | set(params.get("scope", "").split()))
        query = [("service", params["service"])] if params.get("service") else []
        query += [("scope", scope) for scope in wanted]
        creds = self.credentials()
        if creds is not None and not (realm.scheme == "https" or _is_loopback(realm.hostname or "")):
            # Never hand a password or token to a remote realm over plain http.
            log.warning("not sending credentials to %s over plain http; asking for an anonymous token", where)
            creds = None
        try:
            if creds is not None and creds.identity_token:
                resp = self._refresh_token_request(params, wanted, creds)
            else:
                auth = (creds.username, creds.password) if creds is not None else None
                resp = self._session.get(params["realm"], params=query, auth=auth, timeout=self._timeout)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise _Transient(f"token service {where}: {_describe(exc)}") from None
        with resp:
            if resp.status_code == 429 or resp.status_code >= 500:
                raise _Transient(f"token service {where} answered {resp.status_code}", _retry_after(resp))
            if resp.status_code != 200:
                raise RegistryError(
                    f"token service {where} refused ({resp.status_code} {resp.reason})",
                    hint=f"check the credentials for {self._registry} from {self.source} (`docker login`)",
                )
            token = _token_of(resp)
        self._secrets.add(token)
        return token

    def _refresh_token_request(
        self, params: Mapping[str, str], scopes: Sequence[str], creds: Credentials
    ) -> requests.Response:
        """The OAuth2 flow an identity token calls for (distribution "Token Authentication Implementation
        using OAuth2"): POST grant_type=refresh_token; the answer's `access_token` is the bearer token."""
        form = {"grant_type": "refresh_token", "refresh_token": creds.password, "client_id": "servimg"}
        if params.get("service"):
            form["service"] = params["service"]
        if scopes:
            form["scope"] = " ".join(scopes)
        return self._session.post(params["realm"], data=form, timeout=self._timeout)

    def redact(self, text: str) -> str:
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text


def _token_of(resp: requests.Response) -> str:
    try:
        body = resp.json()
    except (ValueError, RecursionError):  # RecursionError: JSON nested too deeply (a hostile server)
        body = None
    token = (body.get("token") or body.get("access_token")) if isinstance(body, dict) else None
    if not isinstance(token, str) or not token:
        raise RegistryError("the token service answered without a token")
    return token


# ---------------------------------------------------------------------------------------------------- helpers


def _describe(exc: BaseException) -> str:
    """A short, secret-free reason for a transport failure (the OS error if one is in the chain)."""
    stack: list[BaseException] = [exc]
    seen: set[int] = set()
    while stack:
        err = stack.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, OSError) and err.strerror:
            return err.strerror.lower()
        nested = [err.__cause__, err.__context__, getattr(err, "reason", None), *err.args]
        stack.extend(e for e in nested if isinstance(e, BaseException))
    return "timed out" if isinstance(exc, requests.Timeout) else "connection failed"


def _retry_after(resp: requests.Response) -> float | None:
    value = resp.headers.get("Retry-After", "")
    return float(value) if value.isdigit() else None


def _read_limited(resp: requests.Response, limit: int, what: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    for block in resp.iter_content(64 << 10):
        total += len(block)
        if total > limit:
            raise RegistryError(f"{what}: response is larger than {limit} bytes", hint="is this a manifest?")
        chunks.append(block)
    return b"".join(chunks)


def _media_type(resp: requests.Response, data: bytes) -> str:
    """Content-Type without parameters; else the manifest's own `mediaType` field (§Pulling manifests)."""
    header = resp.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if header and header not in ("application/json", "application/octet-stream", "text/plain"):
        return header
    declared = _declared_media_type(data)
    return declared or header or "application/octet-stream"


def _declared_media_type(data: bytes) -> str | None:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    value = doc.get("mediaType") if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None


def _hash(algorithm: str, data: bytes) -> Digest:
    return Digest(algorithm, hashlib.new(algorithm, data).hexdigest())


def _error_lines(body: bytes) -> tuple[list[str], list[str]]:
    """Problems and error codes from a spec error body `{"errors": [{code, message, detail}]}`."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        text = body.decode("utf-8", "replace").strip()[:200]
        return ([text] if text else []), []
    errors = doc.get("errors") if isinstance(doc, dict) else None
    if not isinstance(errors, list):
        return [], []
    problems: list[str] = []
    codes: list[str] = []
    for err in errors:
        if not isinstance(err, dict):
            continue
        code, message, detail = str(err.get("code", "")), str(err.get("message", "")), err.get("detail")
        codes.append(code)
        line = f"{code}: {message}"
        if detail:
            line += f" ({json.dumps(detail, sort_keys=True)[:200]})"
        problems.append(line)
    return problems, codes


class _Body:
    """A fixed-length request body read from `stream` and hashed as requests sends it.

    requests streams any object with `read`; `__len__` lets it send Content-Length instead of chunked
    transfer-encoding, which registries need for blob uploads.
    """

    def __init__(self, stream: BinaryIO, length: int, hasher: hashlib._Hash, what: str) -> None:
        self._stream = stream
        self._length = length
        self._remaining = length
        self._hasher = hasher
        self._what = what

    def __len__(self) -> int:
        return self._length

    def read(self, size: int | None = -1) -> bytes:
        if self._remaining == 0:
            return b""
        want = self._remaining if size is None or size < 0 else min(size, self._remaining)
        block = self._stream.read(want)
        if not block:
            # The local file is shorter than its descriptor says: retrying cannot help.
            raise RegistryError(
                f"{self._what}: the blob ended {self._remaining} bytes short of its declared size",
                hint="the file changed since it was hashed; rebuild",
            )
        self._remaining -= len(block)
        self._hasher.update(block)
        return block

    def __iter__(self) -> Iterator[bytes]:
        while block := self.read(_IO_BLOCK):
            yield block


def _pull(repo: str) -> list[str]:
    return [f"repository:{repo}:pull"]


def _push(repo: str) -> list[str]:
    return [f"repository:{repo}:pull,push"]


def _read_errors() -> tuple[type[Exception], ...]:
    return (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


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
        loopback = _is_loopback(_host_of(registry))
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
        self._auth = _Auth(registry, config, self._session, timeout, helpers)

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
        body: bytes | _Body | None,
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
            raise _Transient(f"{what}: {_describe(exc)}") from None

    def _send(
        self,
        method: str,
        url: str,
        *,
        what: str,
        scopes: Sequence[str],
        headers: Mapping[str, str] | None = None,
        body: bytes | _Body | None = None,
        params: Mapping[str, str] | None = None,
        stream: bool = False,
    ) -> requests.Response:
        """One HTTP exchange answering at most one auth challenge; _Transient for retryable failures."""

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
            if isinstance(body, _Body):
                # A streamed body is half consumed; the caller's retry restarts it with the new authorization.
                raise _Transient(f"{what}: authorization needed mid-upload")
            resp = exchange()
        if resp.status_code == 429 or resp.status_code >= 500:
            resp.close()
            raise _Transient(
                f"{what}: registry answered {resp.status_code} {resp.reason}", _retry_after(resp)
            )
        return resp

    def _refusal(self, resp: requests.Response, what: str) -> RegistryError:
        """A RegistryError carrying the registry's error codes and messages (§Error Codes)."""
        try:
            body = next(resp.iter_content(_ERROR_BODY_LIMIT), b"")
        except _read_errors():
            body = b""
        problems, codes = _error_lines(body)
        hint = next((_CODE_HINTS[c] for c in codes if c in _CODE_HINTS), "")
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
        last = _Transient(what)
        for n in range(self.retries + 1):
            if n:
                delay = min(self.backoff * 2 ** (n - 1), MAX_BACKOFF)
                if last.retry_after is not None:
                    delay = min(max(delay, last.retry_after), MAX_BACKOFF)
                log.info("%s; retry %d/%d in %.2fs", self._auth.redact(last.what), n, self.retries, delay)
                self.sleep(delay)
            try:
                return attempt()
            except _Transient as exc:
                last = exc
        raise self._error(
            f"{last.what} (gave up after {self.retries + 1} attempts)",
            hint=f"is the registry running at {self.base_url}? start it, or check `--to`",
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
                except _read_errors() as exc:
                    raise _Transient(f"{what}: {_describe(exc)}") from None

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

    def has_blob(self, repo: str, digest: Digest) -> bool:
        """HEAD /v2/<name>/blobs/<digest> (§Checking if content exists in the registry)."""
        self._check_repo(repo)
        what = f"checking blob {digest} in {self.registry}/{repo}"
        url = self._url(f"{repo}/blobs/{digest}")
        status = self._call(
            "HEAD", url, what=what, scopes=_pull(repo), expect={200, 404}, consume=lambda r: r.status_code
        )
        return status == 200

    def get_blob(self, repo: str, digest: Digest) -> bytes:
        """GET /v2/<name>/blobs/<digest> (§Pulling blobs), verified against `digest`."""
        self._check_repo(repo)
        what = f"fetching blob {digest} from {self.registry}/{repo}"

        def consume(resp: requests.Response) -> bytes:
            data = b"".join(resp.iter_content(_IO_BLOCK))
            self._verify(digest, _hash(digest.algorithm, data), what)
            return data

        url = self._url(f"{repo}/blobs/{digest}")
        # identity: a transfer encoding would make the bytes we hash differ from the stored blob's.
        headers = {"Accept-Encoding": "identity"}
        return self._call(
            "GET", url, what=what, scopes=_pull(repo), expect={200}, consume=consume, headers=headers
        )

    def hash_blob(self, repo: str, digest: Digest) -> None:
        """GET a blob and hash it as it streams, keeping nothing (§Pulling blobs): raise when the registry
        serves bytes that do not match `digest`."""
        self._check_repo(repo)
        what = f"fetching blob {digest} from {self.registry}/{repo}"

        def consume(resp: requests.Response) -> None:
            hasher = hashlib.new(digest.algorithm)
            for block in resp.iter_content(_IO_BLOCK):
                hasher.update(block)
            self._verify(digest, Digest(digest.algorithm, hasher.hexdigest()), what)

        url = self._url(f"{repo}/blobs/{digest}")
        headers = {"Accept-Encoding": "identity"}
        self._call("GET", url, what=what, scopes=_pull(repo), expect={200}, consume=consume, headers=headers)

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
                    for block in resp.iter_content(_IO_BLOCK):
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
        self._call("GET", url, what=what, scopes=_pull(repo), expect={200}, consume=consume, headers=headers)

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
        scopes = _push(repo) + (_pull(mount_from) if mount_from else [])
        started = self._start_upload(repo, digest, mount_from, scopes, what)
        if started is None:
            return "mounted"
        location, min_chunk = started
        hasher = hashlib.new(digest.algorithm)
        with open_blob() as stream:
            final: bytes | _Body = b""
            if size > CHUNKED_THRESHOLD:
                chunk = max(CHUNK_SIZE, min_chunk)
                location = self._patch_chunks(location, stream, size, chunk, hasher, scopes, what)
            elif size:
                final = _Body(stream, size, hasher, what)
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
            body = _Body(stream, length, hasher, what)
            resp = self._send("PATCH", location, what=what, scopes=scopes, headers=headers, body=body)
            with resp:
                self._expect(resp, {202}, what)
                acknowledged = resp.headers.get("Range")
                if acknowledged is not None and acknowledged != f"0-{end}":
                    # The session lost bytes; only a fresh upload is safe.
                    raise _Transient(f"{what}: registry acknowledged {acknowledged}, expected 0-{end}")
                location = self._location(resp, what)
            offset += length
        return location

    def put_manifest(self, repo: str, reference: str, data: bytes, media_type: str) -> Digest:
        """PUT the manifest's exact bytes (§Pushing manifests); return their digest."""
        self._check_repo(repo)
        pinned = self._check_reference(reference)
        digest = _hash(pinned.algorithm if pinned else "sha256", data)
        what = f"pushing manifest {reference} to {self.registry}/{repo}"
        if pinned is not None and pinned != digest:
            raise RegistryError(f"{what}: the manifest hashes to {digest}, not to the digest it is pushed as")
        declared = _declared_media_type(data)
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
            scopes=_push(repo),
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
            data = _read_limited(resp, MANIFEST_LIMIT, what)
            if pinned is not None:
                self._verify(pinned, _hash(pinned.algorithm, data), what)
                return data, _media_type(resp, data), pinned
            digest = Digest.of_bytes(data)
            self._check_digest_header(resp, digest, what)
            return data, _media_type(resp, data), digest

        url = self._url(f"{repo}/manifests/{reference}")
        headers = {"Accept": ", ".join(accept)}
        return self._call(
            "GET", url, what=what, scopes=_pull(repo), expect={200}, consume=consume, headers=headers
        )

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
            scopes=_pull(repo),
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
                doc = json.loads(_read_limited(resp, MANIFEST_LIMIT, what))
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
                "GET", url, what=what, scopes=_pull(repo), expect={200}, consume=consume, params=params
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
                scopes=_pull(repo),
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
        data = _read_limited(resp, MANIFEST_LIMIT, what)
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


# ----------------------------------------------------------------------------------------------- images


def read_image(
    client: RegistryClient, repository: str, reference: str, *, expected: Digest | None = None
) -> tuple[Image, str]:
    """One single-platform image's manifest and config (both re-hashed) and the manifest's media type.

    An index is refused: which platform it stands for is the caller's decision (`platform_manifest`)."""
    name = f"{client.registry}/{repository}" + ("@" if ":" in reference else ":") + reference
    data, media_type, digest = client.get_manifest(repository, reference)
    if media_type in INDEX_TYPES:
        raise RegistryError(
            f"{name} is a multi-platform index ({digest})",
            hint="name the platform's manifest by digest (REPO@sha256:…); a definition's base.digest may "
            "pin the index (servimg picks linux/amd64)",
        )
    if expected is not None and digest != expected:
        raise RegistryError(f"{name} resolved to {digest}, not the pinned {expected}")
    config = Descriptor.from_json(_manifest_object(data, name).get("config"), "manifest.config")
    return Image.parse(data, client.get_blob(repository, config.digest)), media_type


def _manifest_object(data: bytes, name: str) -> dict[str, object]:
    """A manifest a registry served (which may be anything at all) as a JSON object."""
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError):
        manifest = None
    if not isinstance(manifest, dict):
        raise RegistryError(f"{name}: the registry served a manifest that is not a JSON object")
    return manifest


def platform_manifest(ref_text: str, pinned: Digest, platform: str = "linux/amd64") -> Digest:
    """The single-platform manifest a pinned digest stands for: itself, or, when the pin is a
    multi-platform index (what `docker pull` shows for official images), the entry for `platform`."""
    ref = Reference.parse(ref_text)
    with RegistryClient(ref.registry) as client:
        data, media_type, digest = client.get_manifest(ref.repository, str(pinned))
    if media_type not in INDEX_TYPES:
        return digest
    os_name, _, arch = platform.partition("/")
    for entry in json.loads(data).get("manifests") or []:
        plat = entry.get("platform") or {}
        if plat.get("os") == os_name and plat.get("architecture") == arch and not plat.get("variant"):
            return Descriptor.from_json(entry, "index.manifests[]").digest
    raise RegistryError(
        f"{ref_text}@{pinned} is an index without a {platform} manifest",
        hint="pin the digest of an image built for this platform",
    )


def pull(ref_text: str, store: BlobStore, log: Log, how: ReadOptions | None = None) -> Image:
    """The image `ref_text` (or the pinned `how.expected` digest in its repository), every blob in `store`.

    With `how.rehash` every layer is fetched from the registry and hashed even when the store holds it
    (`check --deep`, `verify`: what the registry serves is what is checked, not the local copy)."""
    ref = Reference.parse(ref_text)
    how = how or ReadOptions()
    expected, progress = how.expected, how.progress
    with RegistryClient(ref.registry) as client:
        image, _ = read_image(client, ref.repository, str(expected or ref.reference), expected=expected)
        for i, desc in enumerate(image.layer_descriptors):
            if how.rehash and store.has(desc.digest, desc.size):
                log(f"re-fetching layer {desc.digest.short} ({desc.size / 1e6:.1f} MB) to hash it")
                with progress.transfer(f"hash {desc.digest.short}", desc.size) as advance:
                    try:
                        client.hash_blob(ref.repository, desc.digest)
                    except RegistryError as exc:
                        raise exc.context(f"layer {i}") from None
                    advance(desc.size)
            elif not store.has(desc.digest, desc.size):
                log(f"pulling layer {desc.digest.short} ({desc.size / 1e6:.1f} MB)")
                with progress.transfer(f"pull {desc.digest.short}", desc.size) as advance:
                    client.download_blob(ref.repository, desc.digest, store.path(desc.digest))
                    advance(desc.size)
    store.put_bytes(image.config_bytes)
    store.put_bytes(image.manifest_bytes)
    return image


def write_image(
    client: RegistryClient,
    repository: str,
    image: Image,
    store: BlobStore,
    log: Log,
    *,
    mount_from: str | None = None,
    progress: Progress = NULL,
) -> None:
    """Blobs first (skipped when present, cross-mounted from `mount_from`), then the manifest by digest
    with its exact bytes. No tag: the caller tags last, once everything the tag promises is there."""
    store.put_bytes(image.config_bytes)  # a freshly assembled image's config may exist only as bytes
    for desc in [*image.layer_descriptors, image.config_descriptor]:
        with progress.transfer(f"push {desc.digest.short}", desc.size) as advance:
            opener = _opener(store.path(desc.digest), advance)
            how = client.push_blob(repository, desc.digest, desc.size, opener, mount_from=mount_from)
        log(f"blob {desc.digest.short}: {how}")
    client.put_manifest(repository, str(image.digest), image.manifest_bytes, image.media_type)


def _opener(path: Path, advance: Advance) -> Callable[[], BinaryIO]:
    def open_blob() -> BinaryIO:
        return CountingReader(path.open("rb"), advance)  # type: ignore[return-value]

    return open_blob


def push(
    image: Image,
    ref_text: str,
    store: BlobStore,
    log: Log,
    *,
    tag: str | None = None,
    mount_from: str | None = None,
    progress: Progress = NULL,
) -> str:
    """Blobs, the manifest by digest, the tag last (the ref's own tag wins over `tag`)."""
    ref = Reference.parse(ref_text)
    chosen = ref.tag or tag
    with RegistryClient(ref.registry) as client:
        write_image(client, ref.repository, image, store, log, mount_from=mount_from, progress=progress)
        if chosen:
            put_tag(client, ref.repository, chosen, image, log)
    return f"{ref.registry}/{ref.repository}" + (f":{chosen}" if chosen else "") + f"@{image.digest}"


def put_tag(client: RegistryClient, repository: str, tag: str, image: Image, log: Log) -> None:
    """Point `tag` at the image (its manifest's exact bytes). A refused PUT is no failure when the tag
    names exactly this manifest anyway: a concurrent push of the same image tagged it first, and
    distribution refuses the second of two simultaneous writes of one tag (seen: 400 under load)."""
    try:
        client.put_manifest(repository, tag, image.manifest_bytes, image.media_type)
    except RegistryError:
        head = client.head_manifest(repository, tag)
        if head is None or head[0] != image.digest:
            raise
        log(f"tag {tag}: already names {image.digest.short} (a concurrent push of this image tagged it)")


class RegistryBackend:
    """`HOST[:PORT]/REPO[:TAG]` through servimg's own distribution client."""

    def read(self, target: Target, store: BlobStore, log: Log, how: ReadOptions) -> Image:
        return pull(target.location, store, log, how)

    def write(self, image: Image, target: Target, store: BlobStore, log: Log, options: WriteOptions) -> str:
        progress = options.get("progress", NULL)
        mount_from = options.get("mount_from")
        return push(
            image,
            target.location,
            store,
            log,
            tag=options.get("tag"),
            mount_from=mount_from,
            progress=progress,
        )

    def check_reachable(self, target: Target) -> None:
        with RegistryClient(Reference.parse(target.location).registry) as client:
            client.ping()

    def evidence(self, target: Target, image: Image) -> dict[str, object] | None:
        return None  # the tag can move at any time, and asking needs the network

    def holds(self, target: Target, digest: Digest, evidence: Mapping[str, object]) -> bool:
        """Whether the registry names the manifest `digest` by the target's tag (one HEAD request)."""
        ref = Reference.parse(target.location)
        try:
            with RegistryClient(ref.registry) as client:
                head = client.head_manifest(ref.repository, str(ref.reference))
        except ServimgError:
            return False
        return head is not None and head[0] == digest


BACKEND = RegistryBackend()
