"""Facts the host derives from a base image alone, derived once and kept: `<cache>/base-facts/<name>/`.

A build asks the base some questions whose answers depend on nothing but the base's bytes and the code
that asks: which optimisation levels its pycs carry (`bytecode.base_opt_levels`), whether a sentinel is
already in its code (`sentinels.base_sentinel_verdicts`). Answering them costs time on every build and the
answer cannot change while the base does not, so like the interpreter's facts it is computed once per
base:

- the key names the base by content (the ordered diffIDs, or the sha256 of the file asked about), holds
  every other input, and the sha256 of each module whose code derives the answer, so an edited
  derivation is another key, never a stale answer;
- a build that must do all its work (SERVIMG_NO_RESULT_CACHE, the benchmark's analogue of
  `docker build --no-cache`) still reads these: `--no-cache` re-runs the build's own steps, not its
  base's pull;
- entries are cache.results' (the key document and the value's sha256, written atomically): a damaged or
  foreign entry reads as none and the fact is derived again. A fact that cannot be kept is still the
  answer: the build goes on.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from servimg.cache import results

T = TypeVar("T")
KIND = "base-facts"


def remembered(
    cache_root: Path,
    name: str,
    key: Mapping[str, object],
    derive: Callable[[], T],
    *,
    code: tuple[ModuleType, ...],
    encode: Callable[[T], Any] = lambda value: value,
    decode: Callable[[Any], T] = lambda value: value,
) -> T:
    """The fact `name` for `key`: read from the cache, else `derive()`d and written. `encode` turns it
    into JSON (tuples as lists …), `decode` back; a cached value `decode` refuses is derived again."""
    full = {"fact": name, "code": [_module_sha256(m) for m in code], **key}
    cached = results.read(cache_root, f"{KIND}/{name}", full, per_base=True)
    if cached is not None:
        try:
            return decode(cached)
        except (KeyError, TypeError, ValueError, IndexError):
            pass  # an entry this code does not read: derive it again
    value = derive()
    results.write(cache_root, f"{KIND}/{name}", full, encode(value))
    return value


@functools.cache
def _module_sha256(module: ModuleType) -> str:
    """The sha256 of the module's source file (read once per process)."""
    path = getattr(module, "__file__", None)
    if path is None:
        raise ValueError(f"module {module.__name__} has no file to name its code by")
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
