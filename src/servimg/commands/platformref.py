"""`--platform`: which image an IMAGE/REF argument that names a multi-platform index stands for.

An index in a registry is read (its exact bytes, re-hashed); each child is then named by digest in the
same repository, so every command reads a child exactly as it reads any image. Without `--platform`,
`verify` and `check` take every platform of an index; `show` and `ladder` need one.
"""

from __future__ import annotations

from dataclasses import dataclass

from servimg.backends import transport
from servimg.backends.resolve import Resolved
from servimg.backends.target import Holds
from servimg.core.context import Log
from servimg.core.errors import UsageError
from servimg.core.platform import Platform, texts
from servimg.judging.indexcheck import child_ref
from servimg.oci.index import ImageIndex


def index_at(found: Resolved) -> ImageIndex | None:
    """The index a resolved argument names (None: one image, or a place that holds no index)."""
    if not found.target.holds(Holds.INDEX):
        return None
    with transport.said_where(found):
        return transport.read_index(found.ref)


@dataclass(frozen=True)
class Chosen:
    """One image an argument stands for: its label in the output, a ref that names exactly it, and its
    platform when it is a child of an index (None: the argument names one image)."""

    label: str
    ref: str
    platform: Platform | None = None


def each_platform(ref: str, platform: Platform | None, log: Log) -> list[Chosen]:
    """Each image the argument stands for: an index's children (or the one `platform` chooses), else the
    argument itself."""
    found = transport.resolve(ref, log)
    index = index_at(found)
    if index is None:
        return [Chosen(ref, ref)]
    return [
        Chosen(f"{ref} [{e.platform}]", child_ref(found.ref, e.descriptor.digest), e.platform)
        for e in index.chosen(platform)
    ]


def one_platform(ref: str, platform: Platform | None, log: Log, *, what: str) -> str:
    """The one image the argument stands for: an index needs `platform` (else UsageError naming its
    platforms)."""
    chosen = each_platform(ref, platform, log)
    children = [c.platform for c in chosen if c.platform is not None]
    if platform is None and (children or not chosen):  # an index (perhaps of no image we can run)
        raise UsageError(
            f"{ref} is a multi-platform index of {texts(children)}: {what} takes one platform",
            hint="choose one with --platform",
        )
    return chosen[0].ref
