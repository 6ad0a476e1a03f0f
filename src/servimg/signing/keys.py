"""Signing keys: `servimg key generate` and loading keys named on the command line or in a policy.

A key pair is `<name>.key` (PKCS#8 PEM, 0600) and `<name>.pub` (SubjectPublicKeyInfo PEM, 0644), ed25519
or ECDSA P-256 (cosign's default; its public PEM is what cosign, containers/image and Kyverno read). A
signing key may also be a cosign-generated encrypted key (`signing.cosignkey`) or a `pkcs11:` URI, a
key that never leaves its HSM (`signing.hsm`). Where a trusted key is expected, a private key is
accepted too (its public half is used), so one file can be handed to both `push --key` and `check --key`
in a single-operator setup.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from servimg.signing import cosignkey, hsm
from servimg.signing.dsse import DsseError, Signer, SigningKey, VerifyKey

DEFAULT_NAME = "servimg"
PASSWORD_ENV = "SERVIMG_KEY_PASSWORD"


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path
    keyid: str
    algorithm: str = "ed25519"

    def as_dict(self) -> dict[str, object]:
        return {
            "private_key": str(self.private),
            "public_key": str(self.public),
            "keyid": self.keyid,
            "algorithm": self.algorithm,
        }


def generate(
    out: Path, name: str = DEFAULT_NAME, *, force: bool = False, algorithm: str = "ed25519"
) -> KeyPair:
    """Write a fresh pair (ed25519 or ecdsa-p256) into `out` (created 0700 if missing); never overwrite
    unless `force`."""
    private, public = out / f"{name}.key", out / f"{name}.pub"
    refuse_tracked(private)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    existing = [p for p in (private, public) if p.exists()]
    if existing and not force:
        raise DsseError(
            f"{', '.join(map(str, existing))} already exist(s); refusing to overwrite a key",
            hint="choose another --out or --name (or pass --force to replace it deliberately)",
        )
    key = SigningKey.generate(algorithm)
    key.save(private, _password())
    key.public_key.save(public)
    return KeyPair(private, public, key.keyid, key.public_key.algorithm)


def refuse_tracked(private: Path) -> None:
    """A private key is never written where git would track it: inside a work tree the path must be
    ignored (`git check-ignore`), else `git add -A` commits the signing key. Checked before anything is
    written."""
    here = private.absolute().parent
    top = next((d for d in (here, *here.parents) if (d / ".git").exists()), None)
    if top is None:
        return
    # The work tree's own .gitignore exists to be appended to, even when the key folder does not yet.
    folder = here.relative_to(top).as_posix()
    pattern = f"/{folder}/" if folder != "." else f"/{private.name}"
    hint = (
        f"write keys outside the repository (--out ~/.config/servimg/keys), or ignore the path first "
        f"(echo '{pattern}' >> {top}/.gitignore)"
    )
    git = shutil.which("git")
    if git is None:
        raise DsseError(
            f"{private} would be inside the git work tree {top}, and git is not here to say "
            "whether it is ignored; nothing was written",
            hint=hint,
        )
    ignored = subprocess.run(
        [git, "-C", str(top), "check-ignore", "-q", str(private.absolute())], capture_output=True, check=False
    )
    if ignored.returncode != 0:
        raise DsseError(
            f"{private} would be inside the git work tree {top} and is not ignored: `git add -A` would "
            "commit the signing key; nothing was written",
            hint=hint,
        )


def _password() -> bytes | None:
    value = os.environ.get(PASSWORD_ENV)
    return value.encode() if value else None


def load_signing(path: Path | str) -> Signer:
    """A private key: a `pkcs11:` URI (the key stays in its token), a cosign-encrypted key
    ($COSIGN_PASSWORD), or a PKCS#8 PEM ($SERVIMG_KEY_PASSWORD decrypts an encrypted one)."""
    if str(path).startswith(hsm.SCHEME):
        return hsm.HsmSigner.load(str(path))
    path = Path(path)
    data = path.read_bytes() if path.is_file() else b""
    if cosignkey.is_cosign_key(data):
        return cosignkey.load(data, cosignkey.password(), where=str(path))
    return SigningKey.load(path, _password())


def load_trusted(paths: Iterable[Path]) -> tuple[VerifyKey, ...]:
    """Trusted public keys: each file is a public key, or a private key whose public half is trusted."""
    keys: list[VerifyKey] = []
    for path in paths:
        if str(path).startswith(hsm.SCHEME):
            keys.append(load_signing(path).public_key)
            continue
        try:
            keys.append(VerifyKey.load(path))
        except DsseError as public_error:
            try:
                keys.append(load_signing(path).public_key)
            except DsseError:
                raise public_error from None
    return tuple(dict.fromkeys(keys))
