"""Canonical JSON: sorted keys, no insignificant whitespace, UTF-8, no NaN.

Everything that goes into an image or an attestation is serialised through here so that the same value
always has the same bytes (docs/design.md: determinism).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
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


def plain(value: object, *, exclude_defaults: bool = False) -> object:
    """`value` as JSON-ready data: dataclasses as mappings (fields in declaration order; with
    `exclude_defaults`, a field equal to its default left out; a field whose metadata says `omit_default`
    always so, which lets a new field leave every existing value's bytes as they were), tuples and lists
    as lists, mappings as dicts, a `Digest` as its text. A float field holding an integer (`value: float =
    0`) is written as a float, as the schema library that once read these values wrote it (receipts and
    definitions keep their bytes)."""
    if isinstance(value, Digest):
        return str(value)  # a digest is written as `sha256:<hex>`, not as the dataclass it is
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, object] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            omit = exclude_defaults or f.metadata.get("omit_default", False)
            if omit and f.default is not dataclasses.MISSING and item == f.default:
                continue
            is_float = (
                f.type in ("float", "float | None") and isinstance(item, int) and not isinstance(item, bool)
            )
            out[f.name] = float(item) if is_float else plain(item, exclude_defaults=exclude_defaults)
        return out
    if isinstance(value, tuple | list):
        return [plain(v, exclude_defaults=exclude_defaults) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v, exclude_defaults=exclude_defaults) for k, v in value.items()}
    return value


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
