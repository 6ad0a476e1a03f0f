"""Registry credentials, found the way the docker CLI finds them.

Order (docker/cli `config/configfile`): `credHelpers[<registry>]` names a helper for that registry; else
`credsStore` names the helper for every registry; else (and when the store has nothing for this registry)
the `auths` entry of the config file. A helper is an executable `docker-credential-<name>` speaking the
docker-credential-helpers protocol: `get` with the server URL on stdin, a JSON object
`{"ServerURL", "Username", "Secret"}` on stdout, or a non-zero exit with `credentials not found` when it
has nothing. A `Username` of `<token>` means `Secret` is an identity (OAuth2 refresh) token.

Security: a `Credentials` never shows its secret in a repr, and no error message carries a helper's stdout
(that is where the secret is); only the first line of what a failing helper said, bounded.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from servimg.core.errors import RegistryError

DOCKER_HUB = frozenset({"registry-1.docker.io", "docker.io", "index.docker.io"})
# What docker passes to a helper (and keys `auths` by) for Docker Hub.
DOCKER_HUB_SERVER = "https://index.docker.io/v1/"
IDENTITY_TOKEN_USER = "<token>"
HELPER_TIMEOUT = 60.0
_NOT_FOUND = "credentials not found"
_MESSAGE_LIMIT = 200


@dataclass(frozen=True)
class Credentials:
    """A user name and a secret (a password, or an identity token when `identity_token`); `source` says
    where they came from (a config path and key, or a helper), never what they are."""

    username: str
    password: str = field(repr=False)
    source: str = ""
    identity_token: bool = False

    def __repr__(self) -> str:
        return f"Credentials(<redacted> from {self.source})"

    def basic(self) -> str:
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode("ascii")

    def secrets(self) -> set[str]:
        """Every form in which this secret could reach a message, for redaction."""
        return {s for s in (self.password, self.basic()) if s}


@dataclass(frozen=True)
class HelperAnswer:
    """What a helper process did: exit status and its two streams."""

    returncode: int
    stdout: bytes
    stderr: bytes


class HelperRunner(Protocol):
    """Runs `docker-credential-<name> get` with `server` on stdin (a seam: the default runs the process)."""

    def __call__(self, program: str, server: str) -> HelperAnswer: ...


def run_helper(program: str, server: str) -> HelperAnswer:
    try:
        done = subprocess.run(
            [program, "get"], input=server.encode(), capture_output=True, timeout=HELPER_TIMEOUT, check=False
        )
    except FileNotFoundError:
        raise RegistryError(
            f"credential helper {program} is not installed (named by the Docker config)",
            hint=f"install {program} into PATH, or remove it from credHelpers/credsStore",
        ) from None
    except subprocess.TimeoutExpired:
        raise RegistryError(
            f"credential helper {program} did not answer within {HELPER_TIMEOUT:.0f}s",
            hint="is it waiting for a keyring to be unlocked? unlock it and retry",
        ) from None
    except OSError as exc:
        raise RegistryError(f"cannot run credential helper {program}: {exc.strerror}") from None
    return HelperAnswer(done.returncode, done.stdout, done.stderr)


def config_path(explicit: Path | None) -> Path:
    """`explicit` (a file, or a directory holding config.json), else $DOCKER_CONFIG, else ~/.docker."""
    if explicit is not None:
        return explicit / "config.json" if explicit.is_dir() else explicit
    env = os.environ.get("DOCKER_CONFIG")
    if env:
        return Path(env) / "config.json"
    return Path.home() / ".docker" / "config.json"


def key_host(key: str) -> str:
    """`https://index.docker.io/v1/` → `index.docker.io`: Docker writes keys with and without scheme/path."""
    for prefix in ("https://", "http://"):
        if key.startswith(prefix):
            key = key[len(prefix) :]
    return key.split("/", 1)[0]


def server_url(registry: str) -> str:
    """The server URL docker hands a helper for `registry`: the index URL for Docker Hub, else the host."""
    return DOCKER_HUB_SERVER if registry in DOCKER_HUB else registry


def _hosts(registry: str) -> frozenset[str]:
    return DOCKER_HUB if registry in DOCKER_HUB else frozenset({registry})


def _entry_credentials(entry: Mapping[str, object], where: str) -> Credentials | None:
    token = entry.get("identitytoken")
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            user, sep, password = base64.b64decode(auth).decode("utf-8").partition(":")
        except ValueError:  # binascii.Error and UnicodeDecodeError are both ValueErrors
            sep, user, password = "", "", ""
        if not sep:
            # The value itself is never shown: it is a secret even when malformed.
            raise RegistryError(
                f"{where}: `auth` is not base64 of user:password", hint="run `docker login` again"
            )
        if isinstance(token, str) and token:
            return Credentials(user, token, where, identity_token=True)
        return Credentials(user, password, where)
    name, secret = entry.get("username"), entry.get("password")
    if isinstance(name, str) and isinstance(secret, str) and name:
        return Credentials(name, secret, where)
    return None


def _read_config(config: Path) -> dict[str, object]:
    try:
        doc = json.loads(config.read_text("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not valid JSON"
        raise RegistryError(
            f"cannot read Docker config {config}: {reason}", hint="fix or remove it"
        ) from None
    if not isinstance(doc, dict):
        raise RegistryError(f"Docker config {config} is not a JSON object", hint="fix or remove it")
    return doc


def _from_auths(doc: Mapping[str, object], registry: str, config: Path) -> Credentials | None:
    auths = doc.get("auths")
    if not isinstance(auths, dict):
        return None
    wanted = _hosts(registry)
    for key, entry in auths.items():
        if isinstance(key, str) and key_host(key) in wanted and isinstance(entry, dict):
            creds = _entry_credentials(entry, f"{config} auths[{key!r}]")
            if creds is not None:
                return creds
    return None


def _helper_for(doc: Mapping[str, object], registry: str, config: Path) -> tuple[str, str] | None:
    """(helper name, where it was configured) for `registry`: credHelpers first, then credsStore."""
    helpers = doc.get("credHelpers")
    if isinstance(helpers, dict):
        wanted = _hosts(registry)
        for key, name in sorted(helpers.items()):
            if isinstance(key, str) and key_host(key) in wanted and isinstance(name, str) and name:
                return name, f"{config} credHelpers[{key!r}]"
    store = doc.get("credsStore")
    if isinstance(store, str) and store:
        return store, f"{config} credsStore"
    return None


def _first_line(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    return text.splitlines()[0][:_MESSAGE_LIMIT] if text else ""


def from_helper(
    name: str, registry: str, where: str, runner: HelperRunner = run_helper
) -> Credentials | None:
    """Ask `docker-credential-<name>` for `registry`; None when it has nothing stored for it."""
    program = f"docker-credential-{name}"
    if "/" in name or not name.strip():
        raise RegistryError(f"{where}: {name!r} is not a credential helper name")
    try:
        answer = runner(program, server_url(registry))
    except RegistryError as exc:
        raise exc.context(f"credentials for {registry} ({where})") from None
    if answer.returncode != 0:
        # The protocol reports "not found" on stdout; some helpers use stderr.
        said = _first_line(answer.stdout) or _first_line(answer.stderr)
        if _NOT_FOUND in said.lower():
            return None
        raise RegistryError(
            f"credential helper {program} failed for {registry} (exit {answer.returncode}): {said}",
            hint=f"run `echo {server_url(registry)} | {program} get` to see why ({where})",
        )
    try:
        doc = json.loads(answer.stdout)
    except (ValueError, RecursionError):
        doc = None
    user, secret = (doc.get("Username"), doc.get("Secret")) if isinstance(doc, dict) else (None, None)
    if user == "" and secret == "":
        return None  # helpers before 0.7 answer "nothing stored" with empty fields and exit 0
    if not isinstance(user, str) or not isinstance(secret, str) or not secret:
        # Never quote stdout: it may hold the secret.
        raise RegistryError(
            f"credential helper {program} answered for {registry} without a Username and Secret",
            hint="it does not speak the docker-credential-helpers protocol; check the helper",
        )
    source = f"{program} ({where})"
    if user == IDENTITY_TOKEN_USER:
        return Credentials(user, secret, source, identity_token=True)
    return Credentials(user, secret, source)


def lookup(registry: str, config: Path, runner: HelperRunner = run_helper) -> Credentials | None:
    """Credentials for `registry`: its credHelper, else the credsStore, else `auths`; None if none."""
    doc = _read_config(config)
    helper = _helper_for(doc, registry, config)
    if helper is not None:
        creds = from_helper(helper[0], registry, helper[1], runner)
        if creds is not None:
            return creds
    return _from_auths(doc, registry, config)
