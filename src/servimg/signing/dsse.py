"""DSSE v1 envelopes signed with ed25519 or ECDSA P-256 (secure-systems-lab/dsse, `protocol.md`,
`envelope.md`).

What is signed is never the payload itself but PAE(payloadType, payload) (protocol.md §Signature definition),
so a signature made for one payload type can never be replayed as another.

Keys: a `keyid` is sha256 of the raw 32-byte ed25519 public key (of the DER SubjectPublicKeyInfo of an
ECDSA key). It is a HINT only (protocol.md §Protocol: "the KEYID is optional and MUST NOT be used for
security decisions"): `verify` tries every trusted key against every signature and never lets a keyid
choose, or skip, a key.

No repr, log line or error message in this module contains key material: key classes print their keyid
only, and loading errors name the file, never its content.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from servimg.core import canonical
from servimg.core.atomic import atomic_write
from servimg.core.errors import ServimgError

# Envelopes are small (a statement plus signatures); refusing more keeps hostile input from filling memory.
ENVELOPE_LIMIT = 16 << 20


class DsseError(ServimgError):
    """A DSSE envelope or key is malformed, or a key file cannot be read or written."""


# ------------------------------------------------------------------------------------------------- encoding


def pae(payload_type: str, payload: bytes) -> bytes:
    """PAE (protocol.md §Signature definition): `"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`.

    LEN is the ASCII decimal *byte* length without leading zeros; the type is encoded as UTF-8.
    """
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: str) -> bytes:
    """Standard or URL-safe base64, padded or not (envelope.md: "Either … is allowed"); strict otherwise."""
    if not text.isascii():
        raise ValueError("non-ASCII characters")
    normalised = text.replace("-", "+").replace("_", "/")
    normalised += "=" * (-len(normalised) % 4)
    return base64.b64decode(normalised, validate=True)


# ------------------------------------------------------------------------------------------------- envelope


@dataclass(frozen=True)
class Signature:
    """One `signatures[]` entry: the raw signature bytes and the optional keyid hint."""

    sig: bytes
    keyid: str | None = None

    def to_json(self) -> dict[str, str]:
        out = {"sig": _b64encode(self.sig)}
        if self.keyid:
            out["keyid"] = self.keyid
        return out


@dataclass(frozen=True)
class Envelope:
    """A DSSE JSON envelope (envelope.md §Standard JSON envelope), payload decoded."""

    payload_type: str
    payload: bytes
    signatures: tuple[Signature, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The JSON object: base64 (standard, padded) payload and signatures; `keyid` only when set."""
        return {
            "payload": _b64encode(self.payload),
            "payloadType": self.payload_type,
            "signatures": [s.to_json() for s in self.signatures],
        }

    def to_bytes(self) -> bytes:
        """Canonical JSON bytes of `to_json()`: the same envelope always has the same digest."""
        return canonical.dumps(self.to_json())

    @classmethod
    def parse(cls, data: bytes) -> Envelope:
        """Parse an envelope, collecting every problem into one DsseError (envelope.md §Parsing rules).

        Unknown fields are ignored, as the spec requires. Never raises anything but DsseError.
        """
        doc = _json_object(data)
        problems: list[str] = []
        payload_type = doc.get("payloadType")
        if not isinstance(payload_type, str):
            problems.append("payloadType: missing or not a string")
        payload = _decoded(doc.get("payload"), "payload", problems)
        signatures = _signatures(doc.get("signatures"), problems)
        if problems:
            raise DsseError("malformed DSSE envelope", problems=problems)
        assert isinstance(payload_type, str) and payload is not None
        return cls(payload_type, payload, signatures)


def _json_object(data: bytes) -> dict[str, object]:
    if not isinstance(data, bytes | bytearray):
        raise DsseError("malformed DSSE envelope", problems=["input is not bytes"])
    if len(data) > ENVELOPE_LIMIT:
        raise DsseError("malformed DSSE envelope", problems=[f"larger than {ENVELOPE_LIMIT} bytes"])
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        reason = "nested too deeply" if isinstance(exc, RecursionError) else "not valid UTF-8 JSON"
        raise DsseError("malformed DSSE envelope", problems=[reason]) from None
    if not isinstance(doc, dict):
        raise DsseError("malformed DSSE envelope", problems=["not a JSON object"])
    return doc


def _decoded(value: object, where: str, problems: list[str]) -> bytes | None:
    if not isinstance(value, str):
        problems.append(f"{where}: missing or not a string")
        return None
    try:
        return _b64decode(value)
    except (ValueError, binascii.Error):
        problems.append(f"{where}: not base64")
        return None


def _signatures(value: object, problems: list[str]) -> tuple[Signature, ...]:
    if not isinstance(value, list):
        problems.append("signatures: missing or not a list")
        return ()
    found: list[Signature] = []
    for i, entry in enumerate(value):
        where = f"signatures[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: not an object")
            continue
        sig = _decoded(entry.get("sig"), f"{where}.sig", problems)
        keyid = entry.get("keyid")
        if keyid is not None and not isinstance(keyid, str):
            problems.append(f"{where}.keyid: not a string")
            keyid = None
        if sig is not None:
            # envelope.md: an unset field MUST be treated the same as set-but-empty.
            found.append(Signature(sig, keyid or None))
    return tuple(found)


# ----------------------------------------------------------------------------------------------------- keys


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Never a partial key file (`atomic_write`); the temp file is created 0600 before the chmod."""
    try:
        atomic_write(path, data, mode)
    except OSError as exc:
        raise DsseError(f"cannot write {path}: {exc.strerror or 'failed'}") from None


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DsseError(f"cannot read {what} {path}: {exc.strerror or 'failed'}") from None


PublicKeyType = Ed25519PublicKey | ec.EllipticCurvePublicKey
PrivateKeyType = Ed25519PrivateKey | ec.EllipticCurvePrivateKey
ALGORITHMS = ("ed25519", "ecdsa-p256")
_ECDSA = ec.ECDSA(hashes.SHA256())
# RFC 6979: the same key and message always give the same signature, so a rerun attaches nothing new
# (cosign's ECDSA-P256 with SHA-256, SIGNATURE_SPEC.md §Signature Schemes, verifies it like any other).
_ECDSA_DETERMINISTIC = ec.ECDSA(hashes.SHA256(), deterministic_signing=True)
_KEY_HINT = "expected an ed25519 or ECDSA P-256 key (servimg key generate writes one)"


def _algorithm_of(key: PublicKeyType) -> str:
    if isinstance(key, Ed25519PublicKey):
        return "ed25519"
    if isinstance(key.curve, ec.SECP256R1):
        return "ecdsa-p256"
    raise DsseError(f"ECDSA on {key.curve.name} is not supported", hint=_KEY_HINT)


class VerifyKey:
    """An ed25519 or ECDSA P-256 public key. Equal keys compare equal whatever file or PEM spelling they
    came from. ECDSA signatures are ASN.1 DER over SHA-256 of the message (what cosign, containers/image
    and the sigstore clients make and check)."""

    __slots__ = ("_key", "_raw", "algorithm")

    def __init__(self, key: PublicKeyType) -> None:
        self.algorithm = _algorithm_of(key)
        self._key = key
        # The keyid of an ed25519 key is sha256 of its 32 raw bytes (as it always was); of an ECDSA key,
        # sha256 of its DER SubjectPublicKeyInfo.
        self._raw = (
            key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            if isinstance(key, Ed25519PublicKey)
            else key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        )

    @property
    def keyid(self) -> str:
        """sha256 hex of the public key: a hint for humans and for `Signature.keyid`, never trusted."""
        return hashlib.sha256(self._raw).hexdigest()

    def __repr__(self) -> str:
        return f"VerifyKey({self.algorithm}, keyid={self.keyid[:16]}…)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VerifyKey) and other._raw == self._raw

    def __hash__(self) -> int:
        return hash(self._raw)

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            if isinstance(self._key, Ed25519PublicKey):
                self._key.verify(signature, message)
            else:
                self._key.verify(signature, message, _ECDSA)
        except (InvalidSignature, ValueError):  # ValueError: not a DER ECDSA signature at all
            return False
        return True

    def to_pem(self) -> bytes:
        """SubjectPublicKeyInfo PEM ("PUBLIC KEY"): what cosign, containers/image and Kyverno read."""
        return self._key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def to_der(self) -> bytes:
        return self._key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    @classmethod
    def from_pem(cls, data: bytes, *, where: str = "public key") -> VerifyKey:
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError):
            # The library's message may quote the input; ours names only where it came from.
            raise DsseError(f"{where}: not a PEM public key", hint=_KEY_HINT) from None
        return cls(_public_of(key, where))

    @classmethod
    def from_der(cls, data: bytes, *, where: str = "public key") -> VerifyKey:
        try:
            key = serialization.load_der_public_key(data)
        except (ValueError, TypeError):
            raise DsseError(f"{where}: not a DER public key", hint=_KEY_HINT) from None
        return cls(_public_of(key, where))

    @classmethod
    def load(cls, path: Path) -> VerifyKey:
        return cls.from_pem(_read_key_file(path, "public key"), where=str(path))

    def save(self, path: Path) -> None:
        """Write the PEM public key atomically (0644: a public key is meant to be shared)."""
        _write_atomically(path, self.to_pem(), 0o644)


def _public_of(key: object, where: str) -> PublicKeyType:
    if isinstance(key, Ed25519PublicKey | ec.EllipticCurvePublicKey):
        return key
    raise DsseError(f"{where}: not an ed25519 or ECDSA public key", hint=_KEY_HINT)


class Signer(Protocol):
    """What signs: a key in a file (`SigningKey`) or one that never leaves an HSM (`provenance.pkcs11`).
    `sign` returns what `VerifyKey.verify` of `public_key` accepts for the same message."""

    @property
    def public_key(self) -> VerifyKey: ...

    @property
    def keyid(self) -> str: ...

    def sign(self, message: bytes) -> bytes: ...


class SigningKey:
    """An ed25519 or ECDSA P-256 private key. Its repr shows the keyid only; it is saved 0600,
    atomically."""

    __slots__ = ("_key",)

    def __init__(self, key: PrivateKeyType) -> None:
        _algorithm_of(key.public_key())
        self._key = key

    @classmethod
    def generate(cls, algorithm: str = "ed25519") -> SigningKey:
        if algorithm == "ecdsa-p256":
            return cls(ec.generate_private_key(ec.SECP256R1()))
        if algorithm != "ed25519":
            raise DsseError(f"unknown key algorithm {algorithm!r}", hint=f"one of {', '.join(ALGORITHMS)}")
        return cls(Ed25519PrivateKey.generate())

    @property
    def public_key(self) -> VerifyKey:
        return VerifyKey(self._key.public_key())

    @property
    def keyid(self) -> str:
        return self.public_key.keyid

    def __repr__(self) -> str:
        return f"SigningKey(keyid={self.keyid[:16]}…)"

    def __reduce__(self) -> Any:
        # Pickling would copy the private key into caches and logs of multiprocessing; refuse it.
        raise TypeError("SigningKey cannot be pickled")

    def sign(self, message: bytes) -> bytes:
        if isinstance(self._key, Ed25519PrivateKey):
            return self._key.sign(message)
        return self._key.sign(message, _ECDSA_DETERMINISTIC)

    def to_pem(self, password: bytes | None = None) -> bytes:
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
        )
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )

    @classmethod
    def from_private(cls, key: object, *, where: str = "private key") -> SigningKey:
        if not isinstance(key, Ed25519PrivateKey | ec.EllipticCurvePrivateKey):
            raise DsseError(f"{where}: not an ed25519 or ECDSA private key", hint=_KEY_HINT)
        return cls(key)

    @classmethod
    def from_pem(
        cls, data: bytes, password: bytes | None = None, *, where: str = "private key"
    ) -> SigningKey:
        try:
            key = serialization.load_pem_private_key(data, password)
        except (ValueError, TypeError):
            raise DsseError(
                f"{where}: not a PEM private key, or the password is wrong or missing",
                hint="expected a PKCS#8 ed25519 or ECDSA P-256 private key (servimg key generate writes one)",
            ) from None
        return cls.from_private(key, where=where)

    @classmethod
    def load(cls, path: Path, password: bytes | None = None) -> SigningKey:
        return cls.from_pem(_read_key_file(path, "private key"), password, where=str(path))

    def save(self, path: Path, password: bytes | None = None) -> None:
        """Write the PKCS#8 PEM private key atomically with mode 0600 (never world- or group-readable)."""
        _write_atomically(path, self.to_pem(password), 0o600)


# ------------------------------------------------------------------------------------------- sign, verify


def sign(payload_type: str, payload: bytes, key: Signer) -> Envelope:
    """A one-signature envelope over PAE(payload_type, payload) (protocol.md §Protocol, Sign)."""
    return Envelope(payload_type, payload, (Signature(key.sign(pae(payload_type, payload)), key.keyid),))


def countersign(envelope: Envelope, key: Signer) -> Envelope:
    """The same envelope with one more signature (envelope.md §Multiple signatures)."""
    extra = Signature(key.sign(pae(envelope.payload_type, envelope.payload)), key.keyid)
    return Envelope(envelope.payload_type, envelope.payload, (*envelope.signatures, extra))


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of `verify`: which distinct trusted keys verified, against what threshold."""

    verified: bool
    keyids: tuple[str, ...]
    threshold: int
    reason: str

    @property
    def unsigned(self) -> bool:
        return self.reason == "unsigned"


def _distinct(trusted: Sequence[VerifyKey]) -> list[VerifyKey]:
    return list(dict.fromkeys(trusted))


def verify(envelope: Envelope, trusted: Sequence[VerifyKey], threshold: int = 1) -> VerifyResult:
    """Verify (protocol.md §Protocol, Verify, and its (t, n) threshold rule).

    Every signature is tried against every trusted key; keyids are not consulted at all, so a signature
    whose keyid names key A but was made by key B verifies exactly when B is trusted. A key counts once
    however many of its signatures the envelope carries.
    """
    keys = _distinct(trusted)
    if threshold < 1:
        raise DsseError(f"threshold must be at least 1, not {threshold}")
    if threshold > len(keys):
        raise DsseError(
            f"threshold {threshold} exceeds the {len(keys)} distinct trusted key(s): nothing could verify",
            hint="add trusted public keys or lower the threshold",
        )
    if not envelope.signatures:
        return VerifyResult(False, (), threshold, "unsigned")
    message = pae(envelope.payload_type, envelope.payload)
    good = {k.keyid for k in keys if any(k.verify(s.sig, message) for s in envelope.signatures)}
    keyids = tuple(sorted(good))
    if len(keyids) >= threshold:
        return VerifyResult(True, keyids, threshold, f"verified by {len(keyids)} trusted key(s)")
    reason = f"{len(keyids)} of the required {threshold} trusted key(s) verified"
    return VerifyResult(False, keyids, threshold, reason)
