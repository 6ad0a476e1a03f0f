"""Registry faults (docs/reliability.md) against the real docker-registry, through a small fault-injecting
HTTP proxy on 127.0.0.1: 5xx, slowness, hangs, dropped connections, 429, rejected or misreported manifests,
corrupted or missing blobs on pull, hostile error bodies.

Invariants checked every time: a push either completes or leaves no tag (asserted on the registry
itself, behind the proxy); a rerun is idempotent and reuses the blobs already uploaded (uploads are
counted at the proxy); retries are bounded and back off (fast settings for tests); a failed pull leaves
nothing in the cache. "Registry killed mid-push" lives with the tamper tests; the fallback attestation
index under two concurrent attaches is tests/test_referrers.py::test_concurrent_attaches_all_survive.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import fakebase as fb
from fakebase import on_host
from servimg.backends import registry as registry_module
from servimg.backends.registryclient import RegistryClient
from servimg.backends.target import ReadOptions
from servimg.core.digest import Digest
from servimg.core.errors import RegistryError, ServimgError
from servimg.oci.image import OCI_LAYER, Descriptor, Image, Layer
from servimg.oci.store import BlobStore

pytestmark = pytest.mark.registry

RETRIES = 3  # 4 attempts in all


# ------------------------------------------------------------------------------------------- the proxy
@dataclass
class Rule:
    """When `method` and `path` (a regex on the request path) match, do `action` (at most `times`)."""

    method: str
    path: str
    action: str  # status | delay | hang | drop | corrupt | digest
    status: int = 503
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    seconds: float = 0.0
    times: int = 1_000_000


class FaultProxy:
    """A forwarding HTTP/1.1 proxy in front of a registry that injects the faults its rules name.

    The Host header is forwarded unchanged, so the registry builds Location URLs pointing back at the
    proxy and every upload request comes through it too."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.rules: list[Rule] = []
        self.log: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                proxy.handle(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add(self, method: str, path: str, action: str, **kw: Any) -> Rule:
        rule = Rule(method, path, action, **kw)
        with self._lock:
            self.rules.append(rule)
        return rule

    def count(self, method: str, path: str, status: int | None = None) -> int:
        with self._lock:
            return sum(
                1
                for m, p, s in self.log
                if m == method and re.search(path, p) and (status is None or s == status)
            )

    def _rule(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.times > 0 and rule.method == method and re.search(rule.path, path):
                    rule.times -= 1
                    return rule
        return None

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.log.append((method, path, status))

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        method, path = h.command, h.path
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        rule = self._rule(method, path.split("?", 1)[0])
        if rule is not None and rule.action == "drop":
            self._record(method, path, 0)
            h.close_connection = True
            h.connection.shutdown(2)
            return
        if rule is not None and rule.action == "hang":
            time.sleep(rule.seconds)  # never forwarded: the registry does not see it
            self._record(method, path, 0)
            h.close_connection = True
            return
        if rule is not None and rule.action == "status":
            self._record(method, path, rule.status)  # before replying: the client may act at once
            self._reply(h, rule.status, dict(rule.headers), rule.body)
            return
        if rule is not None and rule.action == "delay":
            time.sleep(rule.seconds)
        status, headers, data = self._forward(method, path, dict(h.headers), body)
        if rule is not None and rule.action == "corrupt" and data:
            data = bytes([data[0] ^ 1]) + data[1:]
        if rule is not None and rule.action == "digest":
            headers["Docker-Content-Digest"] = str(Digest.of_bytes(b"a lie"))
        self._record(method, path, status)
        with contextlib.suppress(OSError):  # the client gave up (timeout): it will retry
            self._reply(h, status, headers, data, head=method == "HEAD")

    def _forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.upstream, timeout=30)
        try:
            headers.pop("Connection", None)
            conn.request(method, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out = {k: v for k, v in resp.getheaders() if k.lower() not in ("connection", "transfer-encoding")}
            return resp.status, out, data
        finally:
            conn.close()

    @staticmethod
    def _reply(
        h: BaseHTTPRequestHandler, status: int, headers: dict[str, str], data: bytes, head: bool = False
    ) -> None:
        h.send_response(status)
        for key, value in headers.items():
            if key.lower() != "content-length":
                h.send_header(key, value)
        length = headers.get("Content-Length", str(len(data))) if head else str(len(data))
        h.send_header("Content-Length", length)
        h.end_headers()
        if not head:
            h.wfile.write(data)


@pytest.fixture
def proxy(registry: Any) -> Iterator[FaultProxy]:
    with FaultProxy(registry.host) as p:
        yield p


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fast, bounded retry settings for every RegistryClient servimg creates (and no ~/.docker)."""
    fast_client = functools.partial(
        RegistryClient, retries=RETRIES, backoff=0.01, timeout=0.5, docker_config=tmp_path / "none.json"
    )
    monkeypatch.setattr(registry_module, "RegistryClient", fast_client)


# ------------------------------------------------------------------------------------------- fixtures
def _image(store: BlobStore, label: str) -> Image:
    layers = []
    for i in range(2):
        data = os.urandom(64 << 10) + label.encode() + bytes([i])
        digest = store.put_bytes(data)
        layers.append(Layer(Descriptor(OCI_LAYER, digest, len(data)), digest))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Labels": {"label": label}},
        "rootfs": {"type": "layers", "diff_ids": [str(layer.diff_id) for layer in layers]},
    }
    image = Image.create(config, layers)
    store.put_bytes(image.config_bytes)
    return image


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "cache")


@pytest.fixture
def repo() -> str:
    return f"faults/{uuid.uuid4().hex[:10]}"


def tags(registry: Any, repo: str) -> list[str]:
    """The tags as the registry itself (not the proxy) has them."""
    with RegistryClient(registry.host, retries=0) as c:
        try:
            return sorted(c.list_tags(repo))
        except RegistryError as exc:
            if "NAME_UNKNOWN" in str(exc):
                return []
            raise


def manifest_digest(registry: Any, repo: str, reference: str) -> Digest | None:
    with RegistryClient(registry.host, retries=0) as c:
        found = c.head_manifest(repo, reference)
    return None if found is None else found[0]


def push(image: Image, proxy: FaultProxy, repo: str, store: BlobStore, tag: str = "v1") -> str:
    return registry_module.push(image, f"{proxy.host}/{repo}", on_host(store, lambda _: None), tag=tag)


UPLOAD_START = r"/blobs/uploads/$"
MANIFEST_BY_DIGEST = r"/manifests/sha256:"
MANIFEST_BY_TAG = r"/manifests/v1$"


# ----------------------------------------------------------------------------------------------- push
def test_transient_5xx_is_retried_and_the_push_completes(
    fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore
) -> None:
    image = _image(store, "5xx")
    proxy.add("POST", UPLOAD_START, "status", status=503, times=2)
    proxy.add("PUT", MANIFEST_BY_TAG, "status", status=502, times=1)
    push(image, proxy, repo, store)
    assert proxy.count("POST", UPLOAD_START, 503) == 2
    assert tags(registry, repo) == ["v1"]
    assert manifest_digest(registry, repo, "v1") == image.digest


def test_persistent_5xx_gives_up_after_bounded_retries_and_leaves_no_tag(
    fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore
) -> None:
    image = _image(store, "dead")
    proxy.add("PUT", MANIFEST_BY_DIGEST, "status", status=500)
    started = time.monotonic()
    with pytest.raises(RegistryError) as info:
        push(image, proxy, repo, store)
    assert time.monotonic() - started < 3, "backoff is bounded"
    assert f"gave up after {RETRIES + 1} attempts" in str(info.value)
    assert proxy.count("PUT", MANIFEST_BY_DIGEST) == RETRIES + 1
    assert tags(registry, repo) == [], "no tag"
    proxy.rules.clear()
    uploads = proxy.count("POST", UPLOAD_START)
    push(image, proxy, repo, store)
    assert proxy.count("POST", UPLOAD_START) == uploads, "the rerun uploads nothing: every blob was there"
    assert tags(registry, repo) == ["v1"]


def test_backoff_grows_exponentially(proxy: FaultProxy, tmp_path: Path) -> None:
    slept: list[float] = []
    proxy.add("GET", r"^/v2/$", "status", status=503)
    client = RegistryClient(
        proxy.host, retries=5, backoff=0.5, docker_config=tmp_path / "none.json", sleep=slept.append
    )
    with pytest.raises(RegistryError, match="gave up after 6 attempts"):
        client.ping()
    assert slept == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_a_push_to_a_new_repository_mounts_what_the_registry_holds(
    proxy: FaultProxy, repo: str, store: BlobStore
) -> None:
    """Blobs another repository of the same registry holds are mounted, not uploaded again (issue 40: a
    push to a new repository re-sent the 4.4 GB base the registry had under another name); the log says
    which, and a registry that refuses the mount gets an upload."""
    image = _image(store, "mount")
    push(image, proxy, repo, store)
    uploads = proxy.count("PATCH", r"/blobs/uploads/") + proxy.count("PUT", r"/blobs/uploads/")
    said: list[str] = []
    elsewhere = f"{repo}-elsewhere"
    registry_module.push(image, f"{proxy.host}/{elsewhere}", on_host(store, said.append), tag="v1")
    assert [line for line in said if line.startswith("blob ")] == [
        f"blob {d.digest.short}: mounted from {repo}"
        for d in [*image.layer_descriptors, image.config_descriptor]
    ], said
    assert said[-1] == f"blobs: 3 mounted from {repo}"
    after = proxy.count("PATCH", r"/blobs/uploads/") + proxy.count("PUT", r"/blobs/uploads/")
    assert after == uploads, "nothing uploaded again"


def test_a_permanent_failure_is_never_retried(proxy: FaultProxy, tmp_path: Path) -> None:
    """An unknown host, a 404 and a 401 cannot become success by waiting (issue 40: a bare name became a
    Docker Hub reference and cost five retries of a DNS failure): one attempt, no back-off."""
    slept: list[float] = []
    offline = RegistryClient(
        "no-such-host.invalid:5000", retries=5, docker_config=tmp_path / "none.json", sleep=slept.append
    )
    with pytest.raises(RegistryError, match="does not resolve") as unknown:
        offline.ping()
    assert "Docker Hub" in (unknown.value.hint or "") and slept == []
    for status in (404, 401):
        proxy.rules.clear()
        proxy.add("GET", r"^/v2/$", "status", status=status)
        before = proxy.count("GET", r"^/v2/$")
        client = RegistryClient(
            proxy.host, retries=5, docker_config=tmp_path / "none.json", sleep=slept.append
        )
        with pytest.raises(RegistryError):
            client.ping()
        assert proxy.count("GET", r"^/v2/$") - before == 1 and slept == [], status


def test_429_retry_after_is_honoured(
    fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore
) -> None:
    image = _image(store, "429")
    proxy.add("HEAD", r"/blobs/sha256:", "status", status=429, headers=(("Retry-After", "1"),), times=1)
    started = time.monotonic()
    push(image, proxy, repo, store)
    assert time.monotonic() - started >= 1.0
    assert tags(registry, repo) == ["v1"]


def test_slow_responses_time_out_and_are_retried(
    fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore
) -> None:
    image = _image(store, "slow")
    proxy.add("HEAD", r"/blobs/sha256:", "delay", seconds=0.9, times=1)  # > the 0.5 s client timeout
    push(image, proxy, repo, store)
    assert tags(registry, repo) == ["v1"]


def test_a_hung_registry_gives_up_and_leaves_no_tag(
    fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore
) -> None:
    image = _image(store, "hung")
    proxy.add("PUT", MANIFEST_BY_DIGEST, "hang", seconds=0.7)
    with pytest.raises(RegistryError, match=f"timed out \\(gave up after {RETRIES + 1} attempts\\)"):
        push(image, proxy, repo, store)
    assert tags(registry, repo) == []


def test_dropped_connections_restart_the_upload_from_scratch(
    fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore
) -> None:
    image = _image(store, "drop")
    proxy.add("PUT", r"/blobs/uploads/.+", "drop", times=1)
    push(image, proxy, repo, store)
    blobs = len(image.layer_descriptors) + 1
    assert proxy.count("POST", UPLOAD_START) == blobs + 1, "a fresh session, never a half-known offset"
    assert tags(registry, repo) == ["v1"]


def test_a_rejected_manifest_leaves_no_tag_and_the_rerun_reuses_every_blob(
    fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore
) -> None:
    image = _image(store, "rejected")
    body = b'{"errors":[{"code":"MANIFEST_INVALID","message":"manifest invalid","detail":"policy"}]}'
    proxy.add("PUT", MANIFEST_BY_DIGEST, "status", status=400, body=body, times=1)
    with pytest.raises(RegistryError) as info:
        push(image, proxy, repo, store)
    assert "MANIFEST_INVALID" in str(info.value) and "refused the manifest" in info.value.hint
    assert proxy.count("PUT", MANIFEST_BY_DIGEST) == 1, "a 4xx is not retried"
    assert tags(registry, repo) == []
    uploads = proxy.count("POST", UPLOAD_START)
    assert uploads == len(image.layer_descriptors) + 1
    push(image, proxy, repo, store)
    assert proxy.count("POST", UPLOAD_START) == uploads, "idempotent: no blob uploaded twice"
    assert proxy.count("HEAD", r"/blobs/sha256:", 200) == uploads
    assert manifest_digest(registry, repo, "v1") == image.digest
    push(image, proxy, repo, store)  # and a third time: still nothing uploaded, same digest
    assert proxy.count("POST", UPLOAD_START) == uploads
    assert manifest_digest(registry, repo, "v1") == image.digest


def test_a_rejected_tag_leaves_no_tag(
    fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore
) -> None:
    image = _image(store, "denied")
    body = b'{"errors":[{"code":"DENIED","message":"tag is immutable"}]}'
    proxy.add("PUT", MANIFEST_BY_TAG, "status", status=403, body=body)
    with pytest.raises(RegistryError, match="DENIED"):
        push(image, proxy, repo, store)
    assert tags(registry, repo) == []
    assert manifest_digest(registry, repo, str(image.digest)) == image.digest, "by digest only"


def test_a_registry_misreporting_the_manifest_digest_gets_no_tag(
    fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore
) -> None:
    image = _image(store, "liar")
    proxy.add("PUT", MANIFEST_BY_DIGEST, "digest")
    with pytest.raises(RegistryError, match="registry reports digest"):
        push(image, proxy, repo, store)
    assert tags(registry, repo) == []


def test_a_partial_push_is_resumed_by_the_rerun(
    fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore
) -> None:
    """The config (pushed last) fails every time; the rerun uploads only the config."""
    image = _image(store, "partial")
    proxy.add("HEAD", rf"/blobs/{image.config_digest}$", "status", status=503)
    with pytest.raises(RegistryError):
        push(image, proxy, repo, store)
    assert tags(registry, repo) == []
    proxy.rules.clear()
    before = proxy.count("POST", UPLOAD_START)
    push(image, proxy, repo, store)
    assert proxy.count("POST", UPLOAD_START) - before == 1, "only the config went up on the rerun"
    assert tags(registry, repo) == ["v1"]


def test_hostile_error_bodies_give_registry_errors(
    fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore
) -> None:
    image = _image(store, "hostile-body")
    proxy.add("PUT", MANIFEST_BY_DIGEST, "status", status=400, body=b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(RegistryError, match="registry answered 400"):
        push(image, proxy, repo, store)
    proxy.rules.clear()
    proxy.add("GET", r"/tags/list$", "status", status=200, body=b'{"tags":' * 50_000)
    with RegistryClient(proxy.host, retries=0) as c, pytest.raises(RegistryError, match="is not JSON"):
        c.list_tags(repo)
    assert tags(registry, repo) == []


# ----------------------------------------------------------------------------------------------- pull
def _pushed(registry: Any, repo: str, store: BlobStore, label: str) -> Image:
    image = _image(store, label)
    registry_module.push(image, f"{registry.host}/{repo}", on_host(store, lambda _: None), tag="v1")
    return image


@pytest.mark.parametrize("fault", ["corrupt", "missing", "wrong-manifest", "not-json"])
def test_a_faulty_pull_leaves_nothing_in_the_cache(
    fault: str, fast: None, proxy: FaultProxy, registry: Any, repo: str, store: BlobStore, tmp_path: Path
) -> None:
    image = _pushed(registry, repo, store, f"pull-{fault}")
    layer = image.layer_descriptors[1].digest
    other = _pushed(registry, repo + "x", store, f"other-{fault}")
    if fault == "corrupt":
        proxy.add("GET", rf"/blobs/{layer}$", "corrupt")
        fragment = "digest mismatch"
    elif fault == "missing":
        body = b'{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]}'
        proxy.add("GET", rf"/blobs/{layer}$", "status", status=404, body=body)
        fragment = "BLOB_UNKNOWN"
    elif fault == "wrong-manifest":
        proxy.add("GET", r"/manifests/", "status", status=200, body=other.manifest_bytes)
        fragment = "digest mismatch"
    else:
        proxy.add(
            "GET",
            r"/manifests/",
            "status",
            status=200,
            body=b"[1]",
            headers=(("Content-Type", "application/json"),),
        )
        fragment = "not a JSON object"
    fresh = BlobStore(tmp_path / "fresh")
    with pytest.raises(ServimgError, match=fragment):
        expected = image.digest if fault != "not-json" else None
        registry_module.pull(
            f"{proxy.host}/{repo}:v1", on_host(fresh, lambda _: None), ReadOptions(expected=expected)
        )
    assert not fresh.has(layer)
    assert fb.cache_is_sound(tmp_path / "fresh") == []
    assert not [p for p in (tmp_path / "fresh" / "blobs" / "sha256").iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------------------ the build, end to end
def test_build_to_a_failing_registry_leaves_no_tag_then_the_rerun_reuses_blobs(
    fast: None,
    proxy: FaultProxy,
    registry: Any,
    repo: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    cache = str(tmp_path / "cache")
    assert fb.main(["lock", str(definition), "--cache", cache, "--quiet"]) == 0
    proxy.add("PUT", r"/manifests/", "status", status=503)
    target = f"{proxy.host}/{repo}"
    capsys.readouterr()
    assert fb.main(["build", str(definition), "--to", target, "--cache", cache]) == 1
    printed = capsys.readouterr().out
    assert printed.startswith("FAIL: ") and "gave up after" in printed and "hint:" in printed
    assert tags(registry, repo) == []
    proxy.rules.clear()
    uploads = proxy.count("POST", UPLOAD_START)
    assert fb.main(["build", str(definition), "--to", target, "--cache", cache, "--quiet"]) == 0
    assert proxy.count("POST", UPLOAD_START) == uploads, "every blob was already uploaded"
    assert len(tags(registry, repo)) == 1


def test_two_concurrent_pushes_of_one_image_to_one_tag(
    fast: None, registry: Any, repo: str, store: BlobStore
) -> None:
    image = _image(store, "concurrent")
    errors: list[BaseException] = []

    def one() -> None:
        try:
            registry_module.push(image, f"{registry.host}/{repo}", on_host(store, lambda _: None), tag="v1")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert manifest_digest(registry, repo, "v1") == image.digest
