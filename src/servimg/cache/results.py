"""Where servimg keeps the results it may reuse, every kind of them, each under a key that names every
input (servimg.patching.resultcache: compiled bytecode; servimg.patching.basefacts: facts of a base; the
interpreter's facts): `<cache>/results/<kind>/v1/sha256/<key>.json`
(cache.layout), one file per key, named by the sha256 of the key's canonical JSON. Standard library
and servimg.core only.

An entry holds its full key document and the sha256 of its value; `read` checks both, so a corrupt,
truncated or foreign entry (another key's file under this name) reads as none. `write` is atomic (temp
+ rename): a reader sees a whole entry or none.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from servimg.cache.layout import CacheLayout
from servimg.core import canonical
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest, sha256_hex

FORMAT = 1

# Set (to anything but empty): every lookup misses, entries are still written. For measuring a build
# that does all its work (benchmarks/build_vs_dockerfile.py sets it outside its `warm` section).
OFF = "SERVIMG_NO_RESULT_CACHE"
_bypassed: ContextVar[bool] = ContextVar("servimg_result_cache_bypassed", default=False)


@contextlib.contextmanager
def bypassed() -> Iterator[None]:
    """Every lookup inside misses (entries are still written): for a build whose point is to do all the
    work again, the independent rebuild of `servimg check --rebuild` (judging.rebuild)."""
    token = _bypassed.set(True)
    try:
        yield
    finally:
        _bypassed.reset(token)


def entry_path(root: Path, kind: str, key: Mapping[str, object]) -> Path:
    return (
        CacheLayout(root).results
        / kind
        / f"v{FORMAT}"
        / "sha256"
        / f"{Digest.of_bytes(canonical.dumps(key)).hex}.json"
    )


def read(root: Path, kind: str, key: Mapping[str, object], *, per_base: bool = False) -> Any | None:
    """The cached value for `key`; None when there is none, it does not check out, inside `bypassed`,
    or when `OFF` is set (`per_base`: a fact of the base alone, servimg.patching.basefacts, which `OFF`
    does not switch off: a build that does all its work still starts from its base)."""
    if _bypassed.get() or (os.environ.get(OFF) and not per_base):
        return None
    try:
        doc = json.loads(entry_path(root, kind, key).read_bytes())
    except (OSError, ValueError, RecursionError):  # none, unreadable, not JSON; a key JSON cannot hold
        return None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FORMAT
        or doc.get("key") != json.loads(canonical.dumps(key))
    ):
        return None  # another format, or another key's entry under this name
    value = doc.get("value")
    if doc.get("value_sha256") != sha256_hex(canonical.dumps(value)):
        return None  # edited or damaged
    return value


def write(root: Path, kind: str, key: Mapping[str, object], value: Any) -> bool:
    """Cache `value` under `key` (atomically); False when it cannot be: a result that cannot be cached
    (a name canonical JSON cannot hold, a full disk) is still the result, and the build goes on."""
    try:
        path = entry_path(root, kind, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = sha256_hex(canonical.dumps(value))
        atomic_write(
            path, canonical.dumps({"format": FORMAT, "key": key, "value": value, "value_sha256": digest})
        )
    except (OSError, ValueError, TypeError):
        return False
    return True
