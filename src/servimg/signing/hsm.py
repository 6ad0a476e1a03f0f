"""Signing through PKCS#11: the private key stays in the token (an HSM, a smart card, SoftHSM), only
digests go in and signatures come out.

A key is named by a PKCS#11 URI (RFC 7512), the spelling cosign's `--key pkcs11:…` uses too:

    pkcs11:token=servimg;object=signer?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=/run/pin

Path attributes `token` (the token label) and `object` (the key label) or `id` (percent-encoded CKA_ID);
query attributes `module-path` (else $SERVIMG_PKCS11_MODULE), `pin-value` or `pin-source` (a file; else
$SERVIMG_PKCS11_PIN). The key is an ECDSA P-256 key pair (CKM_ECDSA over a SHA-256 digest made here, the
signature returned as ASN.1 DER like every ECDSA signature servimg writes).

Loading logs in and finds both halves at once, so a missing module or token, a wrong or locked PIN or a
missing key is an error before anything is signed or pushed (issue 31: "nothing is pushed").
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

import pkcs11
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass
from pkcs11.util.ec import encode_ec_public_key

from servimg.core.errors import ServimgError
from servimg.signing.dsse import VerifyKey

SCHEME = "pkcs11:"
MODULE_ENV = "SERVIMG_PKCS11_MODULE"
PIN_ENV = "SERVIMG_PKCS11_PIN"


class HsmError(ServimgError):
    """A PKCS#11 key cannot be used: the module, token, PIN or key is missing or refused."""


@dataclass(frozen=True)
class KeyUri:
    """A parsed `pkcs11:` URI (RFC 7512 §2.3): what to open, never the PIN's value in its repr."""

    token: str
    label: str | None
    key_id: bytes | None
    module: str
    pin_value: str | None
    pin_source: str | None

    def __repr__(self) -> str:
        return f"KeyUri(token={self.token!r}, object={self.label!r}, module={self.module!r})"

    @classmethod
    def parse(cls, text: str) -> KeyUri:
        if not text.startswith(SCHEME):
            raise HsmError(
                f"{text!r} is not a PKCS#11 URI", hint="pkcs11:token=LABEL;object=KEY?module-path=…"
            )
        path, _, query = text[len(SCHEME) :].partition("?")
        attrs = {k: unquote_to_bytes(v) for k, _, v in (p.partition("=") for p in path.split(";") if p)}
        params = dict(parse_qsl(query, keep_blank_values=True))
        problems = []
        if "token" not in attrs:
            problems.append("no token= (the token's label)")
        if "object" not in attrs and "id" not in attrs:
            problems.append("no object= (the key's label) or id=")
        module = params.get("module-path") or os.environ.get(MODULE_ENV, "")
        if not module:
            problems.append(f"no module-path= and ${MODULE_ENV} is not set (the PKCS#11 library, a .so)")
        if problems:
            raise HsmError(
                "incomplete PKCS#11 URI",
                problems=problems,
                hint="e.g. pkcs11:token=servimg;object=signer?module-path=/usr/lib/softhsm/libsofthsm2.so",
            )
        label = attrs["object"].decode() if "object" in attrs else None
        return cls(
            attrs["token"].decode(),
            label,
            attrs.get("id"),
            module,
            params.get("pin-value"),
            params.get("pin-source"),
        )

    def pin(self) -> str:
        if self.pin_value is not None:
            return self.pin_value
        if self.pin_source is not None:
            source = Path(self.pin_source.removeprefix("file:"))
            try:
                return source.read_text().strip()
            except OSError as exc:
                raise HsmError(f"cannot read the PIN from {source}: {exc.strerror}") from None
        pin = os.environ.get(PIN_ENV)
        if pin is None:
            raise HsmError(
                f"no PIN for token {self.token!r}",
                hint=f"set ${PIN_ENV}, or add pin-source=FILE to the URI",
            )
        return pin


class HsmSigner:
    """An ECDSA P-256 key in a PKCS#11 token (a `dsse.Signer`). Each signature opens a session and
    logs in; the private key is never read."""

    __slots__ = ("_pin", "_public", "_token", "_uri")

    def __init__(self, uri: KeyUri) -> None:
        self._uri = uri
        self._pin = uri.pin()
        self._token = _token(uri)
        with self._session() as session:
            self._private(session)
            self._public = VerifyKey.from_der(
                encode_ec_public_key(self._find(session, ObjectClass.PUBLIC_KEY)), where=repr(uri)
            )

    @classmethod
    def load(cls, text: str) -> HsmSigner:
        return cls(KeyUri.parse(text))

    @property
    def public_key(self) -> VerifyKey:
        return self._public

    @property
    def keyid(self) -> str:
        return self._public.keyid

    def __repr__(self) -> str:
        return f"HsmSigner({self._uri!r}, keyid={self.keyid[:16]}…)"

    def __reduce__(self) -> Any:
        raise TypeError("HsmSigner cannot be pickled")

    def sign(self, message: bytes) -> bytes:
        digest = hashlib.sha256(message).digest()
        with self._session() as session:
            try:
                raw = self._private(session).sign(digest, mechanism=Mechanism.ECDSA)
            except pkcs11.PKCS11Error as exc:
                raise HsmError(f"{self._uri.token}: the token refused to sign: {_name(exc)}") from None
        half = len(raw) // 2
        return encode_dss_signature(int.from_bytes(raw[:half], "big"), int.from_bytes(raw[half:], "big"))

    def _session(self) -> Any:
        try:
            return self._token.open(user_pin=self._pin)
        except pkcs11.PinIncorrect:
            raise HsmError(
                f"PKCS#11 token {self._uri.token!r}: the PIN is wrong", hint="nothing was signed or pushed"
            ) from None
        except pkcs11.PinLocked:
            raise HsmError(
                f"PKCS#11 token {self._uri.token!r} is locked (too many wrong PINs)",
                hint="unlock it with the SO PIN (your HSM's tool); nothing was signed or pushed",
            ) from None
        except pkcs11.PKCS11Error as exc:
            raise HsmError(f"PKCS#11 token {self._uri.token!r}: cannot log in: {_name(exc)}") from None

    def _private(self, session: Any) -> Any:
        return self._find(session, ObjectClass.PRIVATE_KEY)

    def _find(self, session: Any, kind: ObjectClass) -> Any:
        wanted: dict[Attribute, object] = {Attribute.CLASS: kind, Attribute.KEY_TYPE: KeyType.EC}
        if self._uri.label is not None:
            wanted[Attribute.LABEL] = self._uri.label
        if self._uri.key_id is not None:
            wanted[Attribute.ID] = self._uri.key_id
        found = list(session.get_objects(wanted))
        what = "private key" if kind == ObjectClass.PRIVATE_KEY else "public key"
        if len(found) != 1:
            raise HsmError(
                f"PKCS#11 token {self._uri.token!r} has {len(found)} EC {what}(s) "
                f"labelled {self._uri.label!r}, expected exactly 1",
                hint="name the key pair with object= (CKA_LABEL) or id= (CKA_ID)",
            )
        return found[0]


def _token(uri: KeyUri) -> Any:
    try:
        lib = pkcs11.lib(uri.module)
    except (RuntimeError, OSError, pkcs11.PKCS11Error):
        raise HsmError(
            f"cannot load the PKCS#11 module {uri.module}",
            hint="install the HSM's library (Debian: softhsm2 for SoftHSM) or fix module-path",
        ) from None
    try:
        return lib.get_token(token_label=uri.token)
    except pkcs11.NoSuchToken:
        raise HsmError(
            f"no PKCS#11 token labelled {uri.token!r} in {uri.module} (is the HSM plugged in?)",
            hint="list tokens with `softhsm2-util --show-slots` or your HSM's tool",
        ) from None
    except pkcs11.PKCS11Error as exc:
        raise HsmError(f"PKCS#11 module {uri.module}: {_name(exc)}") from None


def _name(exc: BaseException) -> str:
    return type(exc).__name__ + (f": {exc}" if str(exc) else "")
