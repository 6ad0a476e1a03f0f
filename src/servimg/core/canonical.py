"""Canonical JSON: sorted keys, no insignificant whitespace, UTF-8, no NaN.

Everything that goes into an image or an attestation is serialised through here so that the same value
always has the same bytes (docs/design.md: determinism).
"""

from __future__ import annotations

import json
from typing import Any

from servimg.core.digest import Digest


def dumps(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def dumps_pretty(value: Any) -> bytes:
    """Sorted, indented, trailing newline: for files humans review (locks), still byte-stable."""
    text = json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
    return (text + "\n").encode("utf-8")


class Canonical:
    """A value whose identity is the sha256 of its canonical JSON (`to_json`): the definition and the
    lock, whose digests name what every image was built from."""

    def to_json(self) -> Any:
        raise NotImplementedError

    def canonical_bytes(self) -> bytes:
        return dumps(self.to_json())

    @property
    def digest(self) -> Digest:
        return Digest.of_bytes(self.canonical_bytes())
