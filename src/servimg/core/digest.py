"""Content digests as a type, not a str (OCI image-spec descriptor `digest`)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import BinaryIO

from servimg.core.errors import DigestError

_HEX_LEN = {"sha256": 64, "sha512": 128}
_ENCODED = {"sha256": re.compile(r"^[a-f0-9]{64}$"), "sha512": re.compile(r"^[a-f0-9]{128}$")}


@dataclass(frozen=True, order=True)
class Digest:
    algorithm: str
    hex: str

    @classmethod
    def parse(cls, text: str) -> Digest:
        """Parse `sha256:<64 lowercase hex>`; raise a ServimgError that shows the expected form."""
        if not isinstance(text, str) or ":" not in text:
            raise DigestError(
                f"not a digest: {text!r}", hint="a digest looks like sha256:<64 lowercase hex characters>"
            )
        algorithm, _, encoded = text.partition(":")
        pattern = _ENCODED.get(algorithm)
        if pattern is None:
            raise DigestError(f"unsupported digest algorithm {algorithm!r} in {text!r}", hint="use sha256")
        if not pattern.fullmatch(encoded):  # `$` would accept a trailing newline
            raise DigestError(
                f"malformed {algorithm} digest {text!r}",
                hint=f"a {algorithm} digest is {_HEX_LEN[algorithm]} lowercase hex characters",
            )
        return cls(algorithm, encoded)

    @classmethod
    def of_bytes(cls, data: bytes) -> Digest:
        return cls("sha256", hashlib.sha256(data).hexdigest())

    @classmethod
    def of_file(cls, path: str, chunk: int = 1 << 20) -> Digest:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while block := fh.read(chunk):
                h.update(block)
        return cls("sha256", h.hexdigest())

    @classmethod
    def of_stream(cls, stream: BinaryIO, chunk: int = 1 << 20) -> Digest:
        h = hashlib.sha256()
        while block := stream.read(chunk):
            h.update(block)
        return cls("sha256", h.hexdigest())

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hex}"

    @property
    def short(self) -> str:
        return self.hex[:12]

    def verify(self, data: bytes, what: str = "content") -> None:
        """Raise if `data` does not hash to this digest."""
        actual = Digest("sha256", hashlib.sha256(data).hexdigest()) if self.algorithm == "sha256" else None
        if actual is None:
            actual = Digest(self.algorithm, hashlib.new(self.algorithm, data).hexdigest())
        if actual != self:
            raise DigestError(
                f"{what} digest mismatch: expected {self}, got {actual}",
                hint="the content was altered in transit or at rest; fetch it again from a trusted source",
            )


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
