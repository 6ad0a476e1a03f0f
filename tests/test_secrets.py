"""Secrets never leak (docs/reliability.md): registry credentials and signing keys do not appear in logs,
receipts, attestations, image layers, caches, the registry's storage, or error messages.

One full flow against an htpasswd registry (tests/registry_server.py), through the real CLI: generate a
password-protected signing key, lock, build to an OCI layout and to the registry (basic auth), push with
signed provenance and a verify result, check and show (credentials from a credential helper executable);
then the failure paths: a wrong registry password, no credentials, a wrong key password, a corrupt key
file, a registry that died. Every byte produced is
then searched for every form of every secret (raw, base64, hex, PEM body lines), including base64
payloads of DSSE envelopes and the contents of every layer.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

import fakebase as fb
from registry_server import AUTH_PASSWORD, AUTH_USER, RegistryServer
from servimg.backends import registry as registry_module

pytestmark = pytest.mark.registry

USER = AUTH_USER
PASSWORD = AUTH_PASSWORD
WRONG = "Wr0ng-but-also-s3cret!"
KEY_PASSWORD = "k3y-unl0ck-Phrase#"


def _docker_config(directory: Path, host: str, password: str) -> Path:
    directory.mkdir(parents=True)
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    (directory / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return directory


def _helper_config(directory: Path, host: str, password: str) -> Path:
    """A config whose credentials come from a real `docker-credential-<name>` executable (credHelpers)."""
    directory.mkdir(parents=True)
    helper = directory / "docker-credential-secrets15"
    answer = json.dumps({"ServerURL": host, "Username": USER, "Secret": password})
    helper.write_text(f"#!/bin/sh\ncat >/dev/null\ncat <<'EOF'\n{answer}\nEOF\n")
    helper.chmod(0o755)
    (directory / "config.json").write_text(json.dumps({"credHelpers": {host: "secrets15"}}))
    return directory


def _forms(secret: bytes) -> list[bytes]:
    """A secret as it could leak: raw, base64 (std/url-safe, unpadded), hex."""
    b64 = base64.b64encode(secret)
    return [secret, b64.rstrip(b"="), base64.urlsafe_b64encode(secret).rstrip(b"="), secret.hex().encode()]


def _corpus(paths: list[Path]) -> Iterator[tuple[str, bytes]]:
    """Every file's bytes, plus what hides inside them: tar members (layers) and DSSE payloads."""
    for root in paths:
        for path in sorted(p for p in ([root] if root.is_file() else root.rglob("*")) if p.is_file()):
            data = path.read_bytes()
            yield str(path), data
            yield from _inside(str(path), data)


def _inside(name: str, data: bytes) -> Iterator[tuple[str, bytes]]:
    import gzip
    import io

    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
            return
        yield name + "!gunzip", data
    if len(data) >= 512 and data[257:262] == b"ustar":
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            for member in t:
                if member.isfile():
                    fh = t.extractfile(member)
                    assert fh is not None
                    yield f"{name}!{member.name}", fh.read()
    if data[:1] == b"{":
        try:
            doc = json.loads(data)
        except ValueError:
            return
        if isinstance(doc, dict) and isinstance(doc.get("payload"), str):
            yield name + "!payload", base64.b64decode(doc["payload"] + "==")


def test_no_secret_appears_in_any_artifact_of_a_full_flow(
    auth_registry: RegistryServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("DEBUG")
    fast = functools.partial(registry_module.RegistryClient, retries=1, backoff=0.01)
    monkeypatch.setattr(registry_module, "RegistryClient", fast)
    host = auth_registry.host
    good = _docker_config(tmp_path / "inputs" / "docker-good", host, PASSWORD)
    bad = _docker_config(tmp_path / "inputs" / "docker-bad", host, WRONG)
    helped = _helper_config(tmp_path / "inputs" / "docker-helper", host, PASSWORD)
    monkeypatch.setenv("PATH", f"{helped}{os.pathsep}{os.environ['PATH']}")
    none = tmp_path / "inputs" / "docker-none"
    none.mkdir()
    keys = tmp_path / "inputs" / "keys"
    work = tmp_path / "work"
    base = fb.make_base(work / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(work / "repo", base)
    cache = ["--cache", str(work / "cache")]
    report = work / "verify-report.json"  # the fake base has no interpreter to run the probe in
    report.write_text(
        json.dumps({"checks": [{"code": "SOURCE", "status": "PASS", "subject": "s", "message": "m"}]})
    )
    said: list[str] = []

    def run(*argv: str, config: Path = good, key_password: str = KEY_PASSWORD) -> int:
        monkeypatch.setenv("DOCKER_CONFIG", str(config))
        monkeypatch.setenv("SERVIMG_KEY_PASSWORD", key_password)
        code = fb.main([*argv, *cache])
        captured = capsys.readouterr()
        said.extend([captured.out, captured.err])
        return code

    repo = f"{host}/sec/tiny"
    assert run("key", "generate", "--out", str(keys)) == 0
    assert run("lock", str(definition)) == 0
    assert run("build", str(definition), "--to", f"oci:{work / 'out'}") == 0
    assert run("build", str(definition), "--to", repo, "--json") == 0
    push = ("push", f"oci:{work / 'out'}", f"{repo}:signed", "--report", str(report), "--json")
    assert run(*push, "--key", str(keys / "servimg.key")) == 0
    check = ("check", f"{repo}:signed", "--key", str(keys / "servimg.pub"))
    assert run(*check, "--json", config=helped) == 0
    assert run("show", f"{repo}:signed", "--key", str(keys / "servimg.pub"), config=helped) == 0
    # The failure paths: every message printed is part of the corpus.
    assert run("build", str(definition), "--to", repo, config=bad) == 1
    assert "401" in said[-2] and "docker login" in said[-2]
    assert run("check", f"{repo}:signed", "--key", str(keys / "servimg.pub"), config=none) == 1
    assert run(*push, "--key", str(keys / "servimg.key"), key_password=WRONG) == 1
    assert "FAIL" in said[-2]
    corrupt = tmp_path / "inputs" / "corrupt.key"
    pem = (keys / "servimg.key").read_bytes()
    corrupt.write_bytes(pem[: len(pem) // 2] + pem[len(pem) // 2 + 8 :])
    assert run(*push, "--key", str(corrupt)) == 1
    auth_registry.kill()
    try:
        assert run("check", f"{repo}:signed", "--key", str(keys / "servimg.pub")) == 1
    finally:
        auth_registry.start()

    private = serialization.load_pem_private_key(pem, KEY_PASSWORD.encode())
    raw_key = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    der = private.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    secrets: dict[str, list[bytes]] = {
        "registry password": _forms(PASSWORD.encode()) + _forms(WRONG.encode()),
        "basic credentials": _forms(f"{USER}:{PASSWORD}".encode()) + _forms(f"{USER}:{WRONG}".encode()),
        "key password": _forms(KEY_PASSWORD.encode()),
        "private key": [*_forms(raw_key), *_forms(der)],
        "encrypted key file": [line for line in pem.splitlines() if len(line) >= 32 and b"-----" not in line],
    }
    artifacts = [work, auth_registry.log.parent]  # outputs, the cache, the registry's storage and log
    corpus = list(_corpus(artifacts))
    corpus.append(("stdout+stderr", "\n".join(said).encode()))
    corpus.append(("logging", caplog.text.encode()))
    assert any("!payload" in name for name, _ in corpus), "the DSSE payloads were searched"
    assert any("opt/servimg/lock.json" in name for name, _ in corpus), "the layers were searched"
    leaks = [
        f"{what} in {name}"
        for name, data in corpus
        for what, forms in secrets.items()
        for form in forms
        if form and form in data
    ]
    assert leaks == []
    assert not os.environ.get("SERVIMG_DEBUG")
