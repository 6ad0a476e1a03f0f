"""`--platform`: which image an IMAGE/REF argument that names a multi-platform index stands for.

An index in a registry is read (its exact bytes, re-hashed); each child is then named by digest in the
same repository, so every command reads a child exactly as it reads any image. Without `--platform`,
`verify` and `check` take every platform of an index; `show` and `ladder` need one.
"""

from __future__ import annotations

from servimg.backends import transport
from servimg.backends.resolve import Resolved
from servimg.backends.target import Holds
from servimg.core.errors import UsageError
from servimg.core.platform import Platform, texts
from servimg.core.progress import Log
from servimg.judging.indexcheck import child_ref
from servimg.oci.index import ImageIndex


def index_at(found: Resolved) -> ImageIndex | None:
    """The index a resolved argument names (None: one image, or a place that holds no index)."""
    if not found.target.holds(Holds.INDEX):
        return None
    with transport.said_where(found):
        return transport.read_index(found.ref)


def each_platform(ref: str, platform: Platform | None, log: Log) -> list[tuple[str, str]]:
    """(target label, ref) for each image the argument stands for: an index's children (or the one
    `platform` chooses), else the argument itself."""
    found = transport.resolve(ref, log)
    index = index_at(found)
    if index is None:
        return [(ref, ref)]
    entries = [e for e in index.entries if platform is None or e.platform == platform]
    if not entries and platform is not None:
        index.child(platform)  # raises, naming the platforms the index has
    return [(f"{ref} [{e.platform}]", child_ref(found.ref, e.descriptor.digest)) for e in entries]


def one_platform(ref: str, platform: Platform | None, log: Log, *, what: str) -> str:
    """The one image the argument stands for: an index needs `platform` (else UsageError naming its
    platforms)."""
    found = transport.resolve(ref, log)
    index = index_at(found)
    if index is None:
        return ref
    if platform is None:
        raise UsageError(
            f"{ref} is a multi-platform index of {texts(index.platforms)}: {what} takes one platform",
            hint="choose one with --platform",
        )
    return child_ref(found.ref, index.child(platform).digest)
