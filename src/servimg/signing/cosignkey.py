"""Private keys that cosign generated (`cosign generate-key-pair`, `cosign import-key-pair`): PEM blocks of
type `ENCRYPTED SIGSTORE PRIVATE KEY` (older: `ENCRYPTED COSIGN PRIVATE KEY`).

The format is documented by its code (cosign `pkg/cosign/keys.go`, sigstore `pkg/encrypted`, which is
go-securesystemslib's `encrypted` package): the PEM body is JSON

    {"kdf": {"name": "scrypt", "params": {"N": 32768, "r": 8, "p": 1}, "salt": B64},
     "cipher": {"name": "nacl/secretbox", "nonce": B64},
     "ciphertext": B64}

The key is scrypt(password, salt, N, r, p) of 32 bytes; the plaintext, opened with NaCl's secretbox
(XSalsa20-Poly1305), is the PKCS#8 DER private key (ECDSA P-256 by default, ed25519 or RSA otherwise;
servimg signs with the first two). The password is $COSIGN_PASSWORD, as for cosign, else
$SERVIMG_KEY_PASSWORD.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os

import nacl.exceptions
import nacl.secret
from cryptography.hazmat.primitives import serialization

from servimg.core import jsonview as jv
from servimg.signing.dsse import DsseError, SigningKey

PEM_TYPES = ("ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY")
PASSWORD_ENVS = ("COSIGN_PASSWORD", "SERVIMG_KEY_PASSWORD")
# go-securesystemslib accepts only its own scrypt costs; refusing larger ones keeps a hostile file from
# asking for gigabytes of memory.
_MAX_N = 1 << 20


def is_cosign_key(data: bytes) -> bool:
    return any(f"-----BEGIN {kind}-----".encode() in data for kind in PEM_TYPES)


def password() -> bytes:
    for name in PASSWORD_ENVS:
        value = os.environ.get(name)
        if value is not None:
            return value.encode()
    return b""  # cosign's keys may be made with an empty password


def load(data: bytes, secret: bytes, *, where: str) -> SigningKey:
    """Decrypt a cosign private key and load it; a wrong password says so, and nothing else leaks."""
    try:
        doc = json.loads(_pem_body(data, where))
        kdf, cipher = jv.obj(doc["kdf"], "kdf"), jv.obj(doc["cipher"], "cipher")
        params = jv.obj(kdf["params"], "kdf.params")
        n, r, p = (jv.integer(params[k], f"kdf.params.{k}") for k in ("N", "r", "p"))
        if kdf.get("name") != "scrypt" or cipher.get("name") != "nacl/secretbox":
            raise DsseError(
                f"{where}: kdf {kdf.get('name')!r} / cipher {cipher.get('name')!r} is not cosign's"
            )
        if not (1 < n <= _MAX_N and n & (n - 1) == 0 and 0 < r <= 32 and 0 < p <= 16):
            raise DsseError(f"{where}: scrypt parameters N={n} r={r} p={p} are out of range")
        salt = base64.b64decode(jv.text(kdf["salt"], "kdf.salt"), validate=True)
        nonce = base64.b64decode(jv.text(cipher["nonce"], "cipher.nonce"), validate=True)
        ciphertext = base64.b64decode(jv.text(doc["ciphertext"], "ciphertext"), validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error, jv.JsonShapeError):
        raise DsseError(f"{where}: not a readable cosign private key", hint=_HINT) from None
    key = hashlib.scrypt(secret, salt=salt, n=n, r=r, p=p, dklen=32, maxmem=256 * n * r + (1 << 20))
    try:
        der = nacl.secret.SecretBox(key).decrypt(ciphertext, nonce)
    except (nacl.exceptions.CryptoError, ValueError):
        raise DsseError(
            f"{where}: the password is wrong (cosign key)",
            hint="set $COSIGN_PASSWORD (or $SERVIMG_KEY_PASSWORD) to the key's password",
        ) from None
    try:
        private = serialization.load_der_private_key(der, None)
    except (ValueError, TypeError):
        raise DsseError(f"{where}: the decrypted cosign key is not PKCS#8", hint=_HINT) from None
    return SigningKey.from_private(private, where=where)


_HINT = "expected a key written by `cosign generate-key-pair` or `cosign import-key-pair`"


def _pem_body(data: bytes, where: str) -> bytes:
    lines = data.decode("ascii", "replace").strip().splitlines()
    if not lines or lines[0].removeprefix("-----BEGIN ").removesuffix("-----") not in PEM_TYPES:
        raise DsseError(f"{where}: not a cosign private key PEM", hint=_HINT)
    body = "".join(line.strip() for line in lines[1:] if not line.startswith("-----"))
    return base64.b64decode(body, validate=True)
