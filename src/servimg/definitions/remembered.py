"""Definitions as they were locked, kept in the cache by their sha256 (`results/definitions/`), so that a
build whose definition drifted from its lock can name the fields that moved (issue 40: the drift message
showed only `definition_sha256`). Content-addressed: the key is the digest of the value itself, so an
entry is never stale; without one (a lock made on another machine) the drift says where to look instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from servimg.cache import results
from servimg.definitions.definition import ImageDefinition

KIND = "definitions"


def remember(cache_root: Path, definition: ImageDefinition) -> None:
    results.write(cache_root, KIND, {"sha256": definition.digest.hex}, definition.to_json())


def recall(cache_root: Path, sha256: str) -> Mapping[str, object] | None:
    """The definition that hashed to `sha256` when it was locked here, or None."""
    found = results.read(cache_root, KIND, {"sha256": sha256}, per_base=True)
    return found if isinstance(found, dict) else None
