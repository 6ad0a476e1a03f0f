"""GPG simple signing, as containers/image reads it (containers-signature(5), signature-protocols.md): the
signature podman, skopeo and CRI-O enforce with a `signedBy` (`keyType: GPGKeys`) policy requirement —
the one deploy-side gate that Debian's containers/image (built without sigstore) runs (docs/ecosystem.md).

A signature is an OpenPGP signed message (`gpg --sign`, not detached) of the JSON payload

    {"critical": {"identity": {"docker-reference": "HOST/REPO:TAG"},
                  "image": {"docker-manifest-digest": "sha256:…"},
                  "type": "atomic container signature"},
     "optional": {"creator": "servimg"}}

kept where the runtime looks: a lookaside directory, `DIR/<repository path>@sha256=<hex>/signature-N`
(N from 1; registries.d names it with `lookaside:`), or the registry itself where it has the signature
extension (`X-Registry-Supports-Signatures`). The identity is the reference a runtime pulls: by default
(`matchRepoDigestOrExact`) a pull of HOST/REPO:TAG needs a signature for exactly that tag.

Signing is gpg's (Debian `gnupg`): the key never leaves the keyring ($GNUPGHOME), and gpg-agent may hold
it on a smartcard.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError

ATOMIC_TYPE = "atomic container signature"
CREATOR = "servimg"
_TIMEOUT = 120


class GpgError(ServimgError):
    """gpg is missing, the key cannot sign, or a lookaside directory cannot be written."""


def atomic_payload(reference: str, digest: Digest) -> bytes:
    return canonical.dumps(
        {
            "critical": {
                "identity": {"docker-reference": reference},
                "image": {"docker-manifest-digest": str(digest)},
                "type": ATOMIC_TYPE,
            },
            "optional": {"creator": CREATOR},
        }
    )


@dataclass(frozen=True)
class Verified:
    """A signature gpg verified: its payload and the signing key's fingerprint."""

    payload: bytes
    fingerprint: str

    def names(self, reference: str, digest: Digest) -> bool:
        try:
            critical = json.loads(self.payload)["critical"]
            return bool(
                critical["type"] == ATOMIC_TYPE
                and critical["identity"]["docker-reference"] == reference
                and critical["image"]["docker-manifest-digest"] == str(digest)
            )
        except (ValueError, KeyError, TypeError):
            return False


@dataclass(frozen=True)
class GpgSigner:
    """A secret key in the gpg keyring ($GNUPGHOME), named as `gpg --local-user` takes it."""

    key: str

    def fingerprint(self) -> str:
        """The full fingerprint of the secret key `key` names; an error when there is none."""
        out = _gpg(
            ["--list-secret-keys", "--with-colons", "--", self.key], f"looking up secret key {self.key}"
        )
        fingerprints = re.findall(r"^fpr:(?:[^:]*:){8}([0-9A-F]{40,64}):", out.decode(), re.MULTILINE)
        if not fingerprints:
            raise GpgError(f"gpg has no secret key {self.key!r}", hint=_KEY_HINT)
        return str(fingerprints[0])

    def sign(self, payload: bytes) -> bytes:
        return _gpg(
            ["--local-user", self.key, "--sign", "--output", "-"], f"signing with {self.key}", payload
        )

    def verify(self, signature: bytes) -> Verified | None:
        """The payload and signer of a signature gpg accepts (against the keyring), else None."""
        result = subprocess.run(
            ["gpg", "--batch", "--no-tty", "--status-fd", "2", "--decrypt"],
            input=signature,
            capture_output=True,
            timeout=_TIMEOUT,
            check=False,
        )
        found = re.search(rb"^\[GNUPG:\] VALIDSIG ([0-9A-F]+) ", result.stderr, re.MULTILINE)
        if result.returncode != 0 or found is None:
            return None
        return Verified(result.stdout, found.group(1).decode())


_KEY_HINT = "list keys with `gpg --list-secret-keys`; set $GNUPGHOME to the keyring that holds it"


def _gpg(args: list[str], what: str, data: bytes | None = None) -> bytes:
    try:
        result = subprocess.run(
            ["gpg", "--batch", "--no-tty", "--yes", *args],
            input=data,
            capture_output=True,
            timeout=_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        raise GpgError("gpg is not installed", hint="apt-get install gnupg") from None
    except subprocess.TimeoutExpired:
        raise GpgError(f"{what}: gpg did not answer in {_TIMEOUT} s (waiting for a passphrase?)") from None
    if result.returncode != 0:
        last = result.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise GpgError(f"{what}: gpg failed", problems=last, hint=_KEY_HINT)
    return result.stdout


@dataclass(frozen=True)
class Lookaside:
    """A lookaside directory as containers/image lays it out (docker/registries_d.go): one directory per
    repository path and manifest digest, `signature-1`, `signature-2`, … in it."""

    root: Path

    def directory(self, repository: str, digest: Digest) -> Path:
        return self.root / f"{repository}@{digest.algorithm}={digest.hex}"

    def signatures(self, repository: str, digest: Digest) -> list[tuple[Path, bytes]]:
        """The signatures there, in order (containers/image reads until the first missing index)."""
        found = []
        directory = self.directory(repository, digest)
        index = 1
        while (path := directory / f"signature-{index}").is_file():
            found.append((path, path.read_bytes()))
            index += 1
        return found

    def add(self, repository: str, digest: Digest, signature: bytes) -> Path:
        """Write the signature as the next `signature-N`, never over another: O_EXCL, so of two writers
        each gets its own index (the later one takes the next)."""
        directory = self.directory(repository, digest)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for index in range(1, 10_000):
                path = directory / f"signature-{index}"
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    continue
                with os.fdopen(fd, "wb") as out:
                    out.write(signature)
                    out.flush()
                    os.fsync(out.fileno())
                return path
        except OSError as exc:
            raise GpgError(f"cannot write to the lookaside {self.root}: {exc.strerror}") from None
        raise GpgError(f"{directory} holds 9999 signatures; refusing to add more")


@dataclass(frozen=True)
class GpgSigned:
    """One GPG signature of a manifest: where it is, and whether it was there already."""

    reference: str
    path: str
    reused: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": "gpg-signature",
            "identity": self.reference,
            "where": self.path,
            "reused": self.reused,
        }


def existing(
    signer: GpgSigner, signatures: list[tuple[Path, bytes]], reference: str, digest: Digest
) -> Path | None:
    """A signature among `signatures` that this key made for exactly (reference, digest): a rerun signs
    nothing new (gpg signatures carry a time, so the bytes differ each time)."""
    fingerprint = signer.fingerprint()
    for path, data in signatures:
        verified = signer.verify(data)
        if verified is not None and verified.fingerprint == fingerprint and verified.names(reference, digest):
            return path
    return None
