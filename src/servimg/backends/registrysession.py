"""The plumbing under servimg's OCI distribution client (`backends.registryclient`): one session per
registry host, its URLs, authorization (`backends.registryauth`), retries with back-off, refusals turned
into errors with the registry's own words, and the checks every request makes of what it sends and gets.
The API (manifests, blobs, uploads, tags, referrers) is `RegistryClient`, built on this."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeVar

from servimg.backends import credentials as creds_module
from servimg.backends.credentials import HelperRunner, run_helper
from servimg.backends.registryauth import Auth
from servimg.backends.registrywire import (
    CODE_HINTS,
    ERROR_BODY_LIMIT,
    MAX_BACKOFF,
    Body,
    Transient,
    describe,
    error_lines,
    host_of,
    is_loopback,
    read_errors,
    retry_after,
    unresolvable,
)
from servimg.core.digest import Digest
from servimg.core.errors import RegistryError, ServimgError
from servimg.core.lazy import LazyModule
from servimg.core.reference import is_valid_repository, is_valid_tag

if TYPE_CHECKING:
    import requests
else:  # a build that reads and writes no registry never imports it (≈0.1 s)
    requests = LazyModule("requests")

T = TypeVar("T")
log = logging.getLogger("servimg.backends.registry")  # one logger for the whole client


class RegistrySession:
    """A session with one registry host (`127.0.0.1:5000`, `ghcr.io`, …): what every request of the
    OCI distribution-spec v1.1 client goes through."""

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
        return f"{type(self).__name__}({self.base_url!r})"

    def close(self) -> None:
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> Self:
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
