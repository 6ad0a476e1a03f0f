"""Signing keys on disk: `servimg key generate` and loading keys named on the command line or in a policy.

A key pair is `<name>.key` (PKCS#8 PEM, 0600) and `<name>.pub` (SubjectPublicKeyInfo PEM, 0644). Where a
trusted key is expected, a private key file is accepted too (its public half is used), so one file can
be handed to both `push --key` and `check --key` in a single-operator setup.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from servimg.provenance.dsse import DsseError, SigningKey, VerifyKey

DEFAULT_NAME = "servimg"
PASSWORD_ENV = "SERVIMG_KEY_PASSWORD"


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path
    keyid: str

    def as_dict(self) -> dict[str, object]:
        return {"private_key": str(self.private), "public_key": str(self.public), "keyid": self.keyid}


def generate(out: Path, name: str = DEFAULT_NAME, *, force: bool = False) -> KeyPair:
    """Write a fresh ed25519 pair into `out` (created 0700 if missing); never overwrite unless `force`."""
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    private, public = out / f"{name}.key", out / f"{name}.pub"
    existing = [p for p in (private, public) if p.exists()]
    if existing and not force:
        raise DsseError(
            f"{', '.join(map(str, existing))} already exist(s); refusing to overwrite a key",
            hint="choose another --out or --name (or pass --force to replace it deliberately)",
        )
    key = SigningKey.generate()
    key.save(private, _password())
    key.public_key.save(public)
    return KeyPair(private, public, key.keyid)


def _password() -> bytes | None:
    value = os.environ.get(PASSWORD_ENV)
    return value.encode() if value else None


def load_signing(path: Path) -> SigningKey:
    """A private key ($SERVIMG_KEY_PASSWORD decrypts an encrypted one)."""
    return SigningKey.load(path, _password())


def load_trusted(paths: Iterable[Path]) -> tuple[VerifyKey, ...]:
    """Trusted public keys: each file is a public key, or a private key whose public half is trusted."""
    keys: list[VerifyKey] = []
    for path in paths:
        try:
            keys.append(VerifyKey.load(path))
        except DsseError as public_error:
            try:
                keys.append(load_signing(path).public_key)
            except DsseError:
                raise public_error from None
    return tuple(dict.fromkeys(keys))
