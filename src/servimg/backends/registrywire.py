"""The HTTP details of the OCI distribution client (`backends.registryclient`): limits, retryable
failures, error bodies (§Error Codes), media types, the streamed upload body, and the scopes a request
asks for. Section names (§…) are those of the distribution spec's `spec.md`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO, TypeVar

from servimg.core.digest import Digest
from servimg.core.errors import RegistryError
from servimg.core.lazy import LazyModule
from servimg.oci.image import (
    DOCKER_LIST,
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
)

if TYPE_CHECKING:
    import requests
else:  # a build that reads and writes no registry never imports it (≈0.1 s)
    requests = LazyModule("requests")

# Asked for explicitly, every time: a registry that falls back to another manifest type would otherwise
# hand us a different document (and digest) than the one the tag names.

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
# What one RegistryClient keeps of what it fetched by digest (registryclient: read once): items up to
# READ_ONCE_ITEM bytes (manifests, configs, attestation envelopes; never a layer), READ_ONCE_LIMIT in all.
READ_ONCE_ITEM = 1 << 20
READ_ONCE_LIMIT = 64 << 20
MAX_BACKOFF = 30.0

IO_BLOCK = 1 << 20
ERROR_BODY_LIMIT = 64 << 10
CHALLENGE_PARAM = re.compile(r'(\w+)\s*=\s*(?:"([^"]*)"|([^\s,]+))')
# Codes of the spec's error table (§Error Codes) with what to do about them.
CODE_HINTS = {
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


class Transient(Exception):
    """A failure worth retrying: connection error, timeout, 5xx or 429 (§Error Codes: TOOMANYREQUESTS)."""

    def __init__(self, what: str, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.retry_after = retry_after


# ---------------------------------------------------------------------------------------------- hosts, config


def host_of(registry: str) -> str:
    if registry.startswith("["):
        return registry[1 : registry.find("]")]
    return registry.rsplit(":", 1)[0]


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


# ---------------------------------------------------------------------------------------------------- helpers


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception in its chain (causes, contexts, urllib3's `reason`, args), once each."""
    stack: list[BaseException] = [exc]
    seen: set[int] = set()
    while stack:
        err = stack.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        yield err
        nested = [err.__cause__, err.__context__, getattr(err, "reason", None), *err.args]
        stack.extend(e for e in nested if isinstance(e, BaseException))


def describe(exc: BaseException) -> str:
    """A short, secret-free reason for a transport failure (the OS error if one is in the chain)."""
    for err in _causes(exc):
        if isinstance(err, OSError) and err.strerror:
            return err.strerror.lower()
    return "timed out" if isinstance(exc, requests.Timeout) else "connection failed"


def unresolvable(exc: BaseException) -> str | None:
    """The resolver's answer when a connection failed because the host name does not resolve (a typo, or
    offline: Docker Hub from a machine without it). Permanent: retrying cannot help."""
    for err in _causes(exc):
        if isinstance(err, socket.gaierror):
            return str(err.strerror or err).lower()
    return None


def retry_after(resp: requests.Response) -> float | None:
    value = resp.headers.get("Retry-After", "")
    return float(value) if value.isdigit() else None


def read_limited(resp: requests.Response, limit: int, what: str) -> bytes:
    chunks: list[bytes] = []
    total = 0
    for block in resp.iter_content(64 << 10):
        total += len(block)
        if total > limit:
            raise RegistryError(f"{what}: response is larger than {limit} bytes", hint="is this a manifest?")
        chunks.append(block)
    return b"".join(chunks)


def media_type(resp: requests.Response, data: bytes) -> str:
    """Content-Type without parameters; else the manifest's own `mediaType` field (§Pulling manifests)."""
    header = resp.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if header and header not in ("application/json", "application/octet-stream", "text/plain"):
        return header
    declared = declared_media_type(data)
    return declared or header or "application/octet-stream"


def declared_media_type(data: bytes) -> str | None:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return None
    value = doc.get("mediaType") if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None


def hash_as(algorithm: str, data: bytes) -> Digest:
    return Digest(algorithm, hashlib.new(algorithm, data).hexdigest())


def error_lines(body: bytes) -> tuple[list[str], list[str]]:
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


class Body:
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
        while block := self.read(IO_BLOCK):
            yield block


def pull_scopes(repo: str) -> list[str]:
    return [f"repository:{repo}:pull"]


def push_scopes(repo: str) -> list[str]:
    return [f"repository:{repo}:pull,push"]


def read_errors() -> tuple[type[Exception], ...]:
    return (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)
