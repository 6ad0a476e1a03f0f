"""Credentials the way docker finds them: credHelpers, then credsStore, then auths (backends.credentials).

Helpers are real executables on PATH speaking the docker-credential-helpers protocol: small shell scripts
written here, and Debian's `docker-credential-pass` (golang-docker-credential-helpers) over a real `pass`
store with a throwaway GnuPG key. The registry tests use the htpasswd registry (tests/registry_server.py).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import _require
from registry_server import AUTH_PASSWORD, AUTH_USER, RegistryServer
from servimg.backends import credentials
from servimg.backends.registryclient import RegistryClient
from servimg.core.digest import Digest
from servimg.core.errors import RegistryError, ServimgError

USER = AUTH_USER
PASSWORD = AUTH_PASSWORD


def _helper(bin_dir: Path, name: str, body: str) -> Path:
    """A `docker-credential-<name>` executable: records what it was asked on stdin, then runs `body`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / f"docker-credential-{name}"
    asked = bin_dir / f"{name}.asked"
    path.write_text(f'#!/bin/sh\n[ "$1" = get ] || exit 3\ncat >> {asked}\necho >> {asked}\n{body}\n')
    path.chmod(0o755)
    return path


def _serves(user: str, secret: str) -> str:
    answer = json.dumps({"ServerURL": "x", "Username": user, "Secret": secret})
    return f"cat <<'EOF'\n{answer}\nEOF"


NOT_FOUND = "echo 'credentials not found in native keychain'; exit 1"


def _config(path: Path, doc: dict[str, object]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _auths(host: str, user: str, password: str) -> dict[str, object]:
    return {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}}


@pytest.fixture
def helpers_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def said(exc: BaseException) -> str:
    hint = exc.hint if isinstance(exc, ServimgError) else ""
    return "\n".join([str(exc), repr(exc), hint])


# ----------------------------------------------------------------------------------- the lookup order


def test_cred_helper_wins_over_store_and_auths(helpers_on_path: Path, tmp_path: Path) -> None:
    _helper(helpers_on_path, "per-host", _serves("from-helper", "s1"))
    _helper(helpers_on_path, "store", _serves("from-store", "s2"))
    config = _config(
        tmp_path / "c.json",
        {
            "credHelpers": {"reg.example:5000": "per-host"},
            "credsStore": "store",
            "auths": _auths("reg.example:5000", "from-auths", "s3"),
        },
    )
    found = credentials.lookup("reg.example:5000", config)
    assert found is not None and (found.username, found.password) == ("from-helper", "s1")
    assert "per-host" in found.source and "s1" not in repr(found)
    assert (helpers_on_path / "per-host.asked").read_text() == "reg.example:5000\n"
    assert not (helpers_on_path / "store.asked").exists()
    other = credentials.lookup("other.example", config)
    assert other is not None and other.username == "from-store"
    assert (helpers_on_path / "store.asked").read_text() == "other.example\n"


def test_store_without_an_entry_falls_back_to_auths(helpers_on_path: Path, tmp_path: Path) -> None:
    _helper(helpers_on_path, "empty", NOT_FOUND)
    config = _config(
        tmp_path / "c.json", {"credsStore": "empty", "auths": _auths("https://h.example/v1/", "u", "p")}
    )
    found = credentials.lookup("h.example", config)
    assert found is not None and (found.username, found.password) == ("u", "p")
    assert credentials.lookup("nothing.example", config) is None


def test_docker_hub_asks_the_helper_for_the_index_url(helpers_on_path: Path, tmp_path: Path) -> None:
    _helper(helpers_on_path, "hub", _serves("hubuser", "hubpw"))
    config = _config(tmp_path / "c.json", {"credHelpers": {"docker.io": "hub"}})
    found = credentials.lookup("registry-1.docker.io", config)
    assert found is not None and found.username == "hubuser"
    assert (helpers_on_path / "hub.asked").read_text() == "https://index.docker.io/v1/\n"


def test_identity_tokens_are_recognised(helpers_on_path: Path, tmp_path: Path) -> None:
    _helper(helpers_on_path, "oauth", _serves("<token>", "refresh-abc"))
    config = _config(tmp_path / "c.json", {"credsStore": "oauth"})
    found = credentials.lookup("h.example", config)
    assert found is not None and found.identity_token and found.password == "refresh-abc"


def test_helper_problems_are_clear_and_secret_free(helpers_on_path: Path, tmp_path: Path) -> None:
    missing = _config(tmp_path / "m.json", {"credsStore": "not-installed-15"})
    with pytest.raises(RegistryError) as info:
        credentials.lookup("h.example", missing)
    assert "docker-credential-not-installed-15 is not installed" in said(info.value)
    assert "credsStore" in said(info.value)

    # A helper that prints its secret in a non-protocol answer: the message never quotes stdout.
    _helper(helpers_on_path, "garbled", "echo 'Username=u Secret=leaked-Secret-99'")
    with pytest.raises(RegistryError) as info:
        credentials.lookup("h.example", _config(tmp_path / "g.json", {"credsStore": "garbled"}))
    assert "without a Username and Secret" in said(info.value)
    assert "leaked-Secret-99" not in said(info.value)

    _helper(helpers_on_path, "locked", "echo 'keyring is locked' >&2; exit 2")
    with pytest.raises(RegistryError) as info:
        credentials.lookup("h.example", _config(tmp_path / "l.json", {"credsStore": "locked"}))
    assert "exit 2" in said(info.value) and "keyring is locked" in said(info.value)
    assert "docker-credential-locked get" in said(info.value)

    with pytest.raises(RegistryError, match="not a credential helper name"):
        credentials.lookup("h.example", _config(tmp_path / "s.json", {"credsStore": "../evil"}))


# ---------------------------------------------------------------------- against the htpasswd registry


def _round_trip(client: RegistryClient, repo: str, data: bytes) -> None:
    digest = Digest.of_bytes(data)
    client.push_blob(repo, digest, len(data), lambda: io.BytesIO(data))
    assert client.get_blob(repo, digest) == data


@pytest.mark.registry
def test_a_helper_logs_in_to_the_htpasswd_registry(
    auth_registry: RegistryServer, helpers_on_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    _helper(helpers_on_path, "good15", _serves(USER, PASSWORD))
    _helper(helpers_on_path, "bad15", _serves(USER, "Wr0ng-Helper-Pw"))
    host = auth_registry.host
    good = _config(tmp_path / "good.json", {"credHelpers": {host: "good15"}, "auths": {host: {}}})
    client = RegistryClient(host, docker_config=good, retries=0)
    _round_trip(client, "i15/helper", b"pushed with helper credentials")
    assert (helpers_on_path / "good15.asked").read_text() == f"{host}\n"

    bad = _config(tmp_path / "bad.json", {"credsStore": "bad15"})
    with pytest.raises(RegistryError) as info:
        RegistryClient(host, docker_config=bad, retries=0).ping()
    text = said(info.value) + caplog.text
    assert "401" in text and "docker-credential-bad15" in text  # the hint names where they came from
    for secret in (PASSWORD, "Wr0ng-Helper-Pw", base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()):
        assert secret not in text


def _pass_store(home: Path) -> dict[str, str]:
    """A `pass` password store under `home`, encrypted to a fresh passphrase-less GnuPG key."""
    env = {**os.environ, "GNUPGHOME": str(home / "gnupg"), "PASSWORD_STORE_DIR": str(home / "store")}
    (home / "gnupg").mkdir(mode=0o700, parents=True)
    uid = "servimg issue 15 test <ci@servimg.invalid>"
    gen_key = ["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "", "--quick-gen-key"]
    subprocess.run(
        [*gen_key, uid, "future-default", "default", "never"],
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(["pass", "init", uid], env=env, check=True, capture_output=True)
    return env


@pytest.mark.registry
def test_debian_docker_credential_pass_logs_in(
    auth_registry: RegistryServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = ("docker-credential-pass", "pass", "gpg", "gpgconf")
    _require(all(shutil.which(t) for t in tools), "needs golang-docker-credential-helpers, pass and gpg")
    env = _pass_store(tmp_path)
    try:
        host = auth_registry.host
        stored = json.dumps({"ServerURL": host, "Username": USER, "Secret": PASSWORD})
        subprocess.run(
            ["docker-credential-pass", "store"],
            input=stored.encode(),
            env=env,
            check=True,
            capture_output=True,
        )
        for key in ("GNUPGHOME", "PASSWORD_STORE_DIR"):
            monkeypatch.setenv(key, env[key])
        config = _config(tmp_path / "config.json", {"credsStore": "pass"})
        found = credentials.lookup(host, config)
        assert found is not None and found.username == USER and "pass" in found.source
        _round_trip(
            RegistryClient(host, docker_config=config, retries=0), "i15/pass", b"via docker-credential-pass"
        )
        assert credentials.lookup("127.0.0.1:1", config) is None  # pass says "not found"
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False, capture_output=True)
