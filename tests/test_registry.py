"""Reference parsing, and servimg's OCI distribution client against a real registry (distribution 2.8).

Scripted HTTP servers (FakeRegistry) cover what a well-behaved registry never does: lying digests, truncated
bodies, 5xx storms, the Bearer token flow.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import requests

from registry_server import RegistryServer, registry_available, write_htpasswd
from servimg.backends import credentials
from servimg.backends.registryclient import RegistryClient
from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.core.errors import RegistryError, ServimgError
from servimg.core.reference import DEFAULT_REGISTRY, Reference
from servimg.oci.image import OCI_INDEX, OCI_MANIFEST

HEX = "a" * 64
DIGEST = f"sha256:{HEX}"
EMPTY_JSON = "application/vnd.oci.empty.v1+json"


# ------------------------------------------------------------------------------------------------ Reference


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest"),
    [
        ("127.0.0.1:5000/servimg/vllm", "127.0.0.1:5000", "servimg/vllm", None, None),
        ("127.0.0.1:5000/servimg/vllm:0.32.0-ab12", "127.0.0.1:5000", "servimg/vllm", "0.32.0-ab12", None),
        (f"127.0.0.1:5000/servimg/vllm@{DIGEST}", "127.0.0.1:5000", "servimg/vllm", None, DIGEST),
        (f"127.0.0.1:5000/servimg/vllm:t@{DIGEST}", "127.0.0.1:5000", "servimg/vllm", "t", DIGEST),
        ("localhost/x", "localhost", "x", None, None),
        ("localhost:5000/a/b:_t", "localhost:5000", "a/b", "_t", None),
        ("[::1]:5000/x/y", "[::1]:5000", "x/y", None, None),
        ("ghcr.io/org/a__b.c-d---e:V1_x.y-z", "ghcr.io", "org/a__b.c-d---e", "V1_x.y-z", None),
        ("ubuntu", DEFAULT_REGISTRY, "library/ubuntu", None, None),
        ("ubuntu:24.04", DEFAULT_REGISTRY, "library/ubuntu", "24.04", None),
        ("someone/app:1", DEFAULT_REGISTRY, "someone/app", "1", None),
        ("docker.io/ubuntu", DEFAULT_REGISTRY, "library/ubuntu", None, None),
    ],
)
def test_reference_parse_valid(
    text: str, registry: str, repository: str, tag: str | None, digest: str | None
) -> None:
    ref = Reference.parse(text)
    assert (ref.registry, ref.repository, ref.tag) == (registry, repository, tag)
    assert ref.digest == (Digest.parse(digest) if digest else None)
    assert Reference.parse(str(ref)) == ref


def test_reference_property_prefers_digest_then_tag_then_latest() -> None:
    ref = Reference.parse("127.0.0.1:5000/servimg/vllm")
    assert ref.reference == "latest"
    assert ref.with_tag("v1").reference == "v1"
    pinned = ref.with_tag("v1").with_digest(Digest.parse(DIGEST))
    assert pinned.reference == DIGEST
    assert str(pinned) == f"127.0.0.1:5000/servimg/vllm:v1@{DIGEST}"
    assert pinned.name == "127.0.0.1:5000/servimg/vllm"


def test_reference_collects_every_problem() -> None:
    with pytest.raises(ServimgError) as info:
        Reference.parse("127.0.0.1:5000/Servimg/vl!m:-bad@sha256:xyz")
    problems = info.value.problems
    assert len(problems) == 4, problems
    joined = "\n".join(problems)
    assert "'Servimg' must be lowercase" in joined
    assert "'vl!m' is invalid" in joined
    assert "tag '-bad'" in joined
    assert "sha256" in joined
    assert "host[:port]" in info.value.hint


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "repository is empty"),
        ("https://ghcr.io/x", "drop the URL scheme"),
        ("127.0.0.1:5000/a//b", "component ''"),
        ("127.0.0.1:5000/a:", "tag after ':' is empty"),
        ("127.0.0.1:5000/a:" + "t" * 129, "tag"),
        ("127.0.0.1:5000/a-/b", "'a-' is invalid"),
        ("bad_host.example:99x/a", "not a host[:port]"),
        ("127.0.0.1:5000/" + "a" * 250, "longer than 255"),
        ("127.0.0.1:5000/a@md5:00", "unsupported digest algorithm"),
    ],
)
def test_reference_parse_invalid(text: str, needle: str) -> None:
    with pytest.raises(ServimgError) as info:
        Reference.parse(text)
    assert needle in str(info.value)


def test_reference_grammar_does_not_backtrack_exponentially() -> None:
    started = time.monotonic()
    with pytest.raises(ServimgError):
        Reference.parse("127.0.0.1:5000/" + "a" * 60 + "!")
    assert time.monotonic() - started < 1


def test_reference_constructor_validates() -> None:
    with pytest.raises(ServimgError):
        Reference("127.0.0.1:5000", "UPPER", None, None)
    with pytest.raises(ServimgError):
        Reference.parse("127.0.0.1:5000/x").with_tag("no spaces")


# ------------------------------------------------------------------------------------- client (no registry)


@pytest.mark.parametrize(
    ("registry", "url"),
    [
        ("127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("localhost:5000", "http://localhost:5000"),
        ("localhost", "http://localhost"),
        ("[::1]:5000", "http://[::1]:5000"),
        ("ghcr.io", "https://ghcr.io"),
        ("registry.example:5000", "https://registry.example:5000"),
    ],
)
def test_scheme_defaults(registry: str, url: str) -> None:
    assert RegistryClient(registry).base_url == url


def test_invalid_arguments_are_refused_before_any_request(tmp_path: Path) -> None:
    client = RegistryClient("127.0.0.1:9", retries=0, docker_config=tmp_path / "none.json")
    with pytest.raises(RegistryError, match="invalid repository"):
        client.has_blob("../etc", Digest.parse(DIGEST))
    with pytest.raises(RegistryError, match="invalid tag"):
        client.get_manifest("x", "bad tag")
    with pytest.raises(RegistryError, match="malformed sha256"):
        client.get_manifest("x", "sha256:zz")
    with pytest.raises(RegistryError, match="not to the digest"):
        client.put_manifest("x", DIGEST, b"{}", OCI_MANIFEST)
    with pytest.raises(RegistryError, match="declares"):
        client.put_manifest("x", "t", json.dumps({"mediaType": OCI_INDEX}).encode(), OCI_MANIFEST)


@dataclass
class Seen:
    method: str
    path: str
    headers: Message
    body: bytes


Reply = tuple[int, dict[str, str], bytes]


class FakeRegistry:
    """A scripted HTTP/1.1 server: `respond(Seen)` decides every answer; every request is recorded."""

    def __init__(self, respond: Callable[[Seen], Reply]) -> None:
        self.seen: list[Seen] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                seen = Seen(self.command, self.path, self.headers, self.rfile.read(length) if length else b"")
                fake.seen.append(seen)
                status, headers, payload = respond(seen)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                declared = int(headers.get("Content-Length", len(payload)))
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(declared))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                # A body shorter than its Content-Length: hang up, as a crashing server would.
                self.close_connection = declared > len(payload)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = handle_one

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake() -> Iterator[Callable[[Callable[[Seen], Reply]], FakeRegistry]]:
    started: list[FakeRegistry] = []

    def start(respond: Callable[[Seen], Reply]) -> FakeRegistry:
        server = FakeRegistry(respond)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"errors": [{"code": code, "message": message, "detail": None}]}).encode()


def docker_config(path: Path, host: str, user: str, password: str) -> Path:
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return path


def assert_secret_free(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text


def everything_said(exc: BaseException) -> str:
    parts = [str(exc), repr(exc)]
    if isinstance(exc, ServimgError):
        parts.append(exc.hint)
    for linked in (exc.__cause__, exc.__context__):
        if linked is not None:
            parts += [str(linked), repr(linked)]
    return "\n".join(parts)


def test_bearer_token_flow_caches_per_scope_and_never_leaks(
    fake: Callable[[Callable[[Seen], Reply]], FakeRegistry], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    password, token = "pw-Zq81x", "tok-8c1f0e-SECRET"
    basic = base64.b64encode(f"alice:{password}".encode()).decode()
    manifest = canonical.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST})

    def respond(seen: Seen) -> Reply:
        if seen.path.startswith("/token"):
            if seen.headers.get("Authorization") == f"Basic {basic}":
                return 200, {"Content-Type": "application/json"}, json.dumps({"token": token}).encode()
            return 401, {}, error_body("UNAUTHORIZED", "bad credentials")
        if seen.headers.get("Authorization") != f"Bearer {token}":
            challenge = f'Bearer realm="http://{server.host}/token",service="fake",scope="repository:x:pull"'
            return 401, {"WWW-Authenticate": challenge}, error_body("UNAUTHORIZED", "authentication required")
        if seen.path == "/v2/x/manifests/latest":
            return 200, {"Content-Type": OCI_MANIFEST}, manifest
        return 404, {"Content-Type": "application/json"}, error_body("MANIFEST_UNKNOWN", f"no {token}")

    server = fake(respond)
    caplog.set_level("DEBUG")
    config = docker_config(tmp_path / "config.json", server.host, "alice", password)
    client = RegistryClient(server.host, docker_config=config, retries=0)
    assert client.get_manifest("x", "latest")[0] == manifest
    assert client.get_manifest("x", "latest")[0] == manifest
    token_requests = [s for s in server.seen if s.path.startswith("/token")]
    assert len(token_requests) == 1
    assert (
        "service=fake" in token_requests[0].path and "scope=repository%3Ax%3Apull" in token_requests[0].path
    )

    # A refusal whose body echoes the token: the message must still not carry it.
    with pytest.raises(RegistryError) as info:
        client.get_manifest("x", "missing")
    said = everything_said(info.value) + repr(client) + caplog.text
    assert "MANIFEST_UNKNOWN" in said
    assert_secret_free(said, password, basic, token)


def _helper_runner(user: str, secret: str, asked: list[str]) -> credentials.HelperRunner:
    """A helper seam answering like `docker-credential-x get` (test_credentials.py runs real ones)."""

    def run(program: str, server: str) -> credentials.HelperAnswer:
        asked.append(f"{program} {server}")
        body = json.dumps({"ServerURL": server, "Username": user, "Secret": secret}).encode()
        return credentials.HelperAnswer(0, body, b"")

    return run


@pytest.mark.parametrize("identity", [False, True], ids=["password", "identity-token"])
def test_bearer_flow_with_helper_credentials(
    fake: Callable[[Callable[[Seen], Reply]], FakeRegistry], tmp_path: Path, identity: bool
) -> None:
    secret, token = "helper-pw-Qx15", "access-tok-15-SECRET"
    user = "<token>" if identity else "bob"
    basic = base64.b64encode(f"{user}:{secret}".encode()).decode()

    def respond(seen: Seen) -> Reply:
        if seen.path.startswith("/token"):
            form = dict(parse_qsl(seen.body.decode()))
            oauth = (form.get("grant_type"), form.get("refresh_token"), form.get("scope"))
            if identity:
                ok = seen.method == "POST" and oauth == ("refresh_token", secret, "repository:x:pull")
            else:
                ok = seen.headers.get("Authorization") == f"Basic {basic}"
            if ok:
                return 200, {"Content-Type": "application/json"}, json.dumps({"access_token": token}).encode()
            return 401, {}, error_body("UNAUTHORIZED", "bad credentials")
        if seen.headers.get("Authorization") != f"Bearer {token}":
            challenge = f'Bearer realm="http://{server.host}/token",service="fake"'
            return 401, {"WWW-Authenticate": challenge}, b""
        return 200, {}, b"{}"

    server = fake(respond)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"credHelpers": {server.host: "fake15"}}))
    asked: list[str] = []
    client = RegistryClient(
        server.host, docker_config=config, retries=0, helpers=_helper_runner(user, secret, asked)
    )
    assert client.has_blob("x", Digest.parse(DIGEST)) is True
    assert asked == [f"docker-credential-fake15 {server.host}"]
    assert any(s.path.startswith("/token") for s in server.seen)
    assert secret not in repr(client)


def test_token_refused_error_is_secret_free(
    fake: Callable[[Callable[[Seen], Reply]], FakeRegistry], tmp_path: Path
) -> None:
    def respond(seen: Seen) -> Reply:
        if seen.path.startswith("/token"):
            return 401, {}, error_body("UNAUTHORIZED", "bad credentials")
        challenge = f'Bearer realm="http://{server.host}/token",service="fake"'
        return 401, {"WWW-Authenticate": challenge}, b""

    server = fake(respond)
    config = docker_config(tmp_path / "config.json", f"https://{server.host}/v1/", "alice", "wrong-pw-777")
    client = RegistryClient(server.host, docker_config=config, retries=0)
    with pytest.raises(RegistryError) as info:
        client.ping()
    said = everything_said(info.value)
    assert "token service" in said and "docker login" in said
    assert_secret_free(said, "wrong-pw-777", base64.b64encode(b"alice:wrong-pw-777").decode())


def test_transient_failures_are_retried(fake: Callable[[Callable[[Seen], Reply]], FakeRegistry]) -> None:
    answers = iter([(503, {}, b""), (429, {"Retry-After": "0"}, b""), (200, {}, b"{}")])
    server = fake(lambda seen: next(answers))
    RegistryClient(server.host, backoff=0.01).ping()
    assert len(server.seen) == 3


def test_persistent_5xx_gives_up_after_bounded_retries(
    fake: Callable[[Callable[[Seen], Reply]], FakeRegistry],
) -> None:
    server = fake(lambda seen: (500, {}, b"boom"))
    with pytest.raises(RegistryError) as info:
        RegistryClient(server.host, retries=3, backoff=0.01).ping()
    assert len(server.seen) == 4
    assert "gave up after 4 attempts" in str(info.value)
    assert "is the registry running" in info.value.hint


def test_4xx_is_not_retried_and_carries_the_registry_error(
    fake: Callable[[Callable[[Seen], Reply]], FakeRegistry],
) -> None:
    server = fake(lambda seen: (400, {}, error_body("MANIFEST_INVALID", "manifest invalid")))
    client = RegistryClient(server.host, backoff=0.01)
    with pytest.raises(RegistryError) as info:
        client.put_manifest("x", "t", b"{}", OCI_MANIFEST)
    assert len(server.seen) == 1
    assert "MANIFEST_INVALID: manifest invalid" in str(info.value)
    assert "mediaType" in info.value.hint


def test_get_manifest_rejects_a_body_that_does_not_hash_to_the_digest(
    fake: Callable[[Callable[[Seen], Reply]], FakeRegistry],
) -> None:
    honest = canonical.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": []})
    lie = canonical.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": ["evil"]})
    server = fake(lambda seen: (200, {"Content-Type": OCI_MANIFEST}, lie))
    client = RegistryClient(server.host, retries=0)
    with pytest.raises(RegistryError, match="digest mismatch"):
        client.get_manifest("x", str(Digest.of_bytes(honest)))
    with pytest.raises(RegistryError, match="digest mismatch"):
        client.head_manifest("x", str(Digest.of_bytes(honest)))


def test_get_manifest_by_tag_rejects_a_lying_digest_header(
    fake: Callable[[Callable[[Seen], Reply]], FakeRegistry],
) -> None:
    body = canonical.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST})
    headers = {"Content-Type": OCI_MANIFEST, "Docker-Content-Digest": DIGEST}
    server = fake(lambda seen: (200, headers, body))
    with pytest.raises(RegistryError, match="reports digest"):
        RegistryClient(server.host, retries=0).get_manifest("x", "latest")


def test_download_blob_never_leaves_a_partial_file(
    fake: Callable[[Callable[[Seen], Reply]], FakeRegistry], tmp_path: Path
) -> None:
    good = b"layer bytes" * 1000
    digest = Digest.of_bytes(good)
    mode = {"answer": "wrong"}

    def respond(seen: Seen) -> Reply:
        if mode["answer"] == "wrong":
            return 200, {}, b"other bytes" * 1000
        return 200, {"Content-Length": str(len(good))}, good[:100]  # truncated, then hang up

    server = fake(respond)
    client = RegistryClient(server.host, retries=2, backoff=0.01)
    dest = tmp_path / "blob"
    with pytest.raises(RegistryError, match="digest mismatch"):
        client.download_blob("x", digest, dest)
    assert os.listdir(tmp_path) == []
    mode["answer"] = "truncated"
    before = len(server.seen)
    with pytest.raises(RegistryError, match="gave up after 3 attempts"):
        client.download_blob("x", digest, dest)
    assert len(server.seen) - before == 3
    assert os.listdir(tmp_path) == []


def test_referrers_filters_client_side_and_follows_pages(
    fake: Callable[[Callable[[Seen], Reply]], FakeRegistry],
) -> None:
    def descriptor(n: int, artifact_type: str) -> dict[str, Any]:
        return {
            "mediaType": OCI_MANIFEST,
            "digest": f"sha256:{n:064x}",
            "size": 1,
            "artifactType": artifact_type,
        }

    pages = {
        f"/v2/x/referrers/{DIGEST}?artifactType=a%2Fb": (
            [descriptor(1, "a/b"), descriptor(2, "c/d")],
            {"Link": f'</v2/x/referrers/{DIGEST}?page=2>; rel="next"'},
        ),
        f"/v2/x/referrers/{DIGEST}?page=2": ([descriptor(3, "a/b")], {}),
    }

    def respond(seen: Seen) -> Reply:
        manifests, headers = pages[seen.path]
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
        return 200, {"Content-Type": OCI_INDEX, **headers}, canonical.dumps(index)

    server = fake(respond)
    found = RegistryClient(server.host, retries=0).referrers("x", Digest.parse(DIGEST), "a/b")
    assert found is not None
    assert [d["digest"][-1] for d in found] == ["1", "3"]


def test_referrers_404_with_an_index_body_is_an_empty_api_answer(
    fake: Callable[[Callable[[Seen], Reply]], FakeRegistry],
) -> None:
    index = canonical.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []})
    server = fake(lambda seen: (404, {"Content-Type": OCI_INDEX}, index))
    assert RegistryClient(server.host, retries=0).referrers("x", Digest.parse(DIGEST)) == []


def test_credentials_repr_is_redacted(tmp_path: Path) -> None:
    config = docker_config(tmp_path / "config.json", "127.0.0.1:1", "alice", "pw-hidden-42")
    creds = credentials.lookup("127.0.0.1:1", config)
    assert creds is not None and creds.password == "pw-hidden-42"
    assert "pw-hidden-42" not in repr(creds)
    (tmp_path / "bad.json").write_text(json.dumps({"auths": {"h": {"auth": "bm9jb2xvbg=="}}}))  # "nocolon"
    with pytest.raises(RegistryError) as info:
        credentials.lookup("h", tmp_path / "bad.json")
    assert "bm9jb2xvbg" not in everything_said(info.value)


# --------------------------------------------------------------------------------- real registry (dist 2.8)


class RecordingSession(requests.Session):
    """A requests session that records (method, path) of every request, to see which protocol path ran."""

    def __init__(self) -> None:
        super().__init__()
        self.trust_env = False
        self.calls: list[tuple[str, str]] = []

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
        self.calls.append((str(method), urlsplit(str(url)).path))
        return super().request(method, url, *args, **kwargs)


@pytest.fixture(scope="session")
def registry() -> Iterator[RegistryServer]:
    if not registry_available():
        pytest.skip("docker-registry (Debian package) is not installed")
    with RegistryServer() as server:
        yield server


@pytest.fixture
def client(registry: RegistryServer, tmp_path: Path) -> Iterator[RegistryClient]:
    # A config path that does not exist: the developer's own ~/.docker/config.json stays out of tests.
    with RegistryClient(registry.host, docker_config=tmp_path / "no-config.json", backoff=0.01) as c:
        yield c


def push_bytes(client: RegistryClient, repo: str, data: bytes, mount_from: str | None = None) -> str:
    return client.push_blob(
        repo, Digest.of_bytes(data), len(data), lambda: io.BytesIO(data), mount_from=mount_from
    )


def image(client: RegistryClient, repo: str) -> tuple[bytes, Digest]:
    """Push a config and a layer blob and return a canonical OCI manifest referring to them (not pushed)."""
    layer = b"not really a tar, the registry does not look" + repo.encode()
    config = canonical.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [str(Digest.of_bytes(layer))]},
        }
    )
    push_bytes(client, repo, config)
    push_bytes(client, repo, layer)
    manifest = canonical.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": str(Digest.of_bytes(config)),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": str(Digest.of_bytes(layer)),
                    "size": len(layer),
                }
            ],
        }
    )
    return manifest, Digest.of_bytes(manifest)


@pytest.mark.registry
def test_ping(client: RegistryClient, tmp_path: Path) -> None:
    assert client.ping() is None  # answered 200 on /v2/
    dead = RegistryClient("127.0.0.1:9", docker_config=tmp_path / "none.json", backoff=0.01, retries=0)
    with dead, pytest.raises(RegistryError) as info:
        dead.ping()
    assert "127.0.0.1:9" in str(info.value) and info.value.hint


@pytest.mark.registry
def test_push_small_blob_then_exists(client: RegistryClient, tmp_path: Path) -> None:
    data = os.urandom(4096)
    digest = Digest.of_bytes(data)
    assert not client.has_blob("t/small", digest)
    assert push_bytes(client, "t/small", data) == "uploaded"
    assert client.has_blob("t/small", digest)
    assert push_bytes(client, "t/small", data) == "exists"
    assert client.get_blob("t/small", digest) == data
    client.download_blob("t/small", digest, tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == data
    assert os.listdir(tmp_path) == ["out"]


@pytest.mark.registry
def test_push_empty_blob(client: RegistryClient) -> None:
    assert push_bytes(client, "t/empty", b"") == "uploaded"
    assert client.get_blob("t/empty", Digest.of_bytes(b"")) == b""


@pytest.mark.registry
def test_push_large_blob_in_chunks(registry: RegistryServer, tmp_path: Path) -> None:
    path = tmp_path / "big"
    hasher = hashlib.sha256()
    with path.open("wb") as fh:
        for _ in range(70):
            block = os.urandom(1 << 20)
            hasher.update(block)
            fh.write(block)
    digest = Digest("sha256", hasher.hexdigest())
    session = RecordingSession()
    with RegistryClient(registry.host, session=session, docker_config=tmp_path / "none") as client:
        assert client.push_blob("t/big", digest, 70 << 20, lambda: path.open("rb")) == "uploaded"
        patches = [c for c in session.calls if c[0] == "PATCH"]
        assert len(patches) == 5  # 70 MiB in 16 MiB chunks
        client.download_blob("t/big", digest, tmp_path / "back")
    assert Digest.of_file(str(tmp_path / "back")) == digest


@pytest.mark.registry
def test_cross_repository_mount(client: RegistryClient) -> None:
    data = os.urandom(1000)
    assert push_bytes(client, "t/mount-src", data) == "uploaded"
    assert push_bytes(client, "t/mount-dst", data, mount_from="t/mount-src") == "mounted"
    assert client.has_blob("t/mount-dst", Digest.of_bytes(data))
    # A source that lacks the blob: the registry opens an upload session instead (202), which we use.
    other = os.urandom(1000)
    assert push_bytes(client, "t/mount-dst", other, mount_from="t/mount-src") == "uploaded"


@pytest.mark.registry
def test_blob_that_does_not_match_its_digest_is_refused(client: RegistryClient) -> None:
    data = os.urandom(100)
    wrong = Digest.of_bytes(b"something else")
    with pytest.raises(RegistryError) as info:
        client.push_blob("t/bad", wrong, len(data), lambda: io.BytesIO(data))
    assert "DIGEST_INVALID" in str(info.value)


@pytest.mark.registry
def test_blob_shorter_than_declared_is_refused_without_retrying(client: RegistryClient) -> None:
    data = os.urandom(100)
    opened: list[int] = []

    def open_blob() -> io.BytesIO:
        opened.append(1)
        return io.BytesIO(data[:50])

    with pytest.raises(RegistryError, match="short of its declared size"):
        client.push_blob("t/short", Digest.of_bytes(data), len(data), open_blob)
    assert len(opened) == 1


@pytest.mark.registry
def test_manifest_push_keeps_exact_bytes(client: RegistryClient) -> None:
    manifest, digest = image(client, "t/manifest")
    assert client.put_manifest("t/manifest", "v1", manifest, OCI_MANIFEST) == digest
    for reference in ("v1", str(digest)):
        data, media_type, got = client.get_manifest("t/manifest", reference)
        assert data == manifest
        assert media_type == OCI_MANIFEST
        assert got == digest
    assert client.head_manifest("t/manifest", "v1") == (digest, OCI_MANIFEST, len(manifest))
    assert client.head_manifest("t/manifest", "nope") is None
    assert client.put_manifest("t/manifest", str(digest), manifest, OCI_MANIFEST) == digest


@pytest.mark.registry
def test_get_manifest_with_a_wrong_digest_reference_raises(client: RegistryClient) -> None:
    manifest, _ = image(client, "t/wrong")
    client.put_manifest("t/wrong", "v1", manifest, OCI_MANIFEST)
    with pytest.raises(RegistryError) as info:
        client.get_manifest("t/wrong", str(Digest.of_bytes(manifest + b" ")))
    assert "MANIFEST_UNKNOWN" in str(info.value)


@pytest.mark.registry
def test_artifact_manifest_and_tag_fallback_on_a_registry_without_referrers(client: RegistryClient) -> None:
    manifest, digest = image(client, "t/referrers")
    client.put_manifest("t/referrers", "v1", manifest, OCI_MANIFEST)
    assert client.referrers("t/referrers", digest) is None
    assert client.referrers("t/referrers", digest, "application/vnd.in-toto+json") is None
    # What the attestation fallback pushes: an artifact manifest with `subject`, under `sha256-<hex>`.
    empty = b"{}"
    push_bytes(client, "t/referrers", empty)
    artifact = canonical.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": "application/vnd.in-toto+json",
            "config": {"mediaType": EMPTY_JSON, "digest": str(Digest.of_bytes(empty)), "size": 2},
            "layers": [{"mediaType": EMPTY_JSON, "digest": str(Digest.of_bytes(empty)), "size": 2}],
            "subject": {"mediaType": OCI_MANIFEST, "digest": str(digest), "size": len(manifest)},
        }
    )
    artifact_digest = client.put_manifest(
        "t/referrers", str(Digest.of_bytes(artifact)), artifact, OCI_MANIFEST
    )
    fallback = canonical.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [{"mediaType": OCI_MANIFEST, "digest": str(artifact_digest), "size": len(artifact)}],
        }
    )
    client.put_manifest("t/referrers", f"sha256-{digest.hex}", fallback, OCI_INDEX)
    data, media_type, _ = client.get_manifest("t/referrers", f"sha256-{digest.hex}")
    assert (data, media_type) == (fallback, OCI_INDEX)
    assert client.get_manifest("t/referrers", str(artifact_digest))[0] == artifact
    # Attaching never changes the image digest.
    assert client.get_manifest("t/referrers", "v1")[2] == digest


@pytest.mark.registry
def test_list_tags_follows_pages_and_delete_manifest(client: RegistryClient) -> None:
    manifest, digest = image(client, "t/tags")
    for tag in ("a", "b", "c", "d", "e"):
        client.put_manifest("t/tags", tag, manifest, OCI_MANIFEST)
    assert sorted(client.list_tags("t/tags")) == ["a", "b", "c", "d", "e"]
    session_paths = client.list_tags("t/tags", page_size=2)
    assert sorted(session_paths) == ["a", "b", "c", "d", "e"]
    client.delete_manifest("t/tags", digest)
    assert client.head_manifest("t/tags", str(digest)) is None
    assert client.head_manifest("t/tags", "a") is None
    with pytest.raises(RegistryError, match="MANIFEST_UNKNOWN"):
        client.delete_manifest("t/tags", digest)


@pytest.mark.registry
def test_download_of_a_missing_blob_leaves_nothing(client: RegistryClient, tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="BLOB_UNKNOWN"):
        client.download_blob("t/small", Digest.parse(DIGEST), tmp_path / "missing")
    assert os.listdir(tmp_path) == []


@pytest.mark.registry
def test_killed_registry_gives_up_after_bounded_retries(tmp_path: Path) -> None:
    session = RecordingSession()
    with RegistryServer() as server:
        client = RegistryClient(server.host, retries=3, backoff=0.01, session=session, docker_config=tmp_path)
        client.ping()
        server.kill()
        started = time.monotonic()
        with pytest.raises(RegistryError) as info:
            push_bytes(client, "t/dead", b"data")
    assert time.monotonic() - started < 5
    assert len(session.calls) == 1 + 4  # the ping, then one HEAD per attempt
    assert "gave up after 4 attempts" in str(info.value)
    assert f"is the registry running at {server.url}?" in info.value.hint


@pytest.mark.registry
def test_registry_coming_back_during_retries(tmp_path: Path) -> None:
    with RegistryServer() as server:
        server.kill()
        restart = threading.Timer(0.3, server.start)
        restart.start()
        client = RegistryClient(server.host, retries=6, backoff=0.1, docker_config=tmp_path)
        try:
            assert push_bytes(client, "t/back", b"hello") == "uploaded"
        finally:
            restart.join()


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    if not registry_available():
        pytest.skip("docker-registry (Debian package) is not installed")
    htpasswd = tmp_path_factory.mktemp("auth") / "htpasswd"
    try:
        write_htpasswd(htpasswd, "alice", "s3cret-Pw!")
    except ImportError:
        pytest.skip("the crypt module (bcrypt for htpasswd) is not available")
    with RegistryServer(htpasswd=htpasswd) as server:
        yield server


@pytest.mark.registry
def test_basic_auth_works_and_credentials_never_leak(
    auth_registry: RegistryServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    good = docker_config(tmp_path / "good.json", auth_registry.host, "alice", "s3cret-Pw!")
    client = RegistryClient(auth_registry.host, docker_config=good, retries=1, backoff=0.01)
    client.ping()
    assert push_bytes(client, "t/auth", b"secret layer") == "uploaded"
    with pytest.raises(RegistryError) as info:
        client.get_manifest("t/auth", "missing")
    said = [everything_said(info.value)]

    bad = docker_config(tmp_path / "bad.json", auth_registry.host, "alice", "wr0ng-Pw!")
    bad_client = RegistryClient(auth_registry.host, docker_config=bad, retries=1, backoff=0.01)
    with pytest.raises(RegistryError) as info:
        push_bytes(bad_client, "t/auth", b"other")
    said.append(everything_said(info.value))
    assert "401 Unauthorized" in said[-1] and "docker login" in said[-1]

    anonymous = RegistryClient(auth_registry.host, docker_config=tmp_path / "none.json", retries=0)
    with pytest.raises(RegistryError, match="401"):
        anonymous.ping()

    auth_registry.kill()
    try:
        with pytest.raises(RegistryError) as info:
            client.get_blob("t/auth", Digest.of_bytes(b"secret layer"))
        said.append(everything_said(info.value))
    finally:
        auth_registry.start()
    said += [repr(client), repr(bad_client), caplog.text]
    text = "\n".join(said)
    secrets = ["s3cret-Pw!", "wr0ng-Pw!"]
    secrets += [base64.b64encode(f"alice:{p}".encode()).decode() for p in ("s3cret-Pw!", "wr0ng-Pw!")]
    assert_secret_free(text, *secrets)
