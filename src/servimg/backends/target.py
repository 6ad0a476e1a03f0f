"""The one interface every backend (engine, registry, OCI layout, docker-archive) implements.

A `Target` names a place (`docker`, `oci:DIR[:TAG]`, `docker-archive:FILE`, `HOST/REPO[:TAG]`); a
`Backend` reads an image from a place of its kind and writes one to it. `backends.transport` is the table
from kind to backend. This module sits below every backend, so each can name the types without a cycle.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict

from servimg.core.digest import Digest
from servimg.core.errors import BackendError
from servimg.core.progress import NULL, Log, Progress
from servimg.core.reference import Reference

if TYPE_CHECKING:  # annotations only
    from servimg.backends.referrers import Referrers
    from servimg.core.platform import Platform
    from servimg.oci.image import Image
    from servimg.oci.store import BlobStore

# `docker-daemon:` names an engine image, `oci:` a layout, `docker-archive:` a file, `docker://` (skopeo's
# spelling) or no prefix a registry ref.
PREFIXES = (
    ("docker-daemon:", "engine"),
    ("oci:", "oci"),
    ("docker-archive:", "archive"),
    ("docker://", "registry"),
)


def split_layout_ref(text: str) -> tuple[Path, str | None]:
    """`./out/demo` or `./out/demo:tag` (a tag is the part after the last ':' if it has no '/')."""
    head, sep, tail = text.rpartition(":")
    if sep and head and "/" not in tail:
        return Path(head), tail
    return Path(text), None


@dataclass(frozen=True)
class Target:
    """A parsed `--to`/base location. kind: engine | oci | archive | registry. A registry target carries
    its reference, parsed once when the target is made (`registry_ref`): no caller parses it again."""

    kind: str
    location: str
    tag: str | None = None
    reference: Reference | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind == "registry" and self.reference is None:
            object.__setattr__(self, "reference", Reference.parse(self.location))

    @property
    def registry_ref(self) -> Reference:
        """The parsed reference of a registry target."""
        if self.reference is None:
            raise BackendError(f"{self.text()} is not a registry reference", hint="use HOST/REPO[:TAG]")
        return self.reference

    @classmethod
    def parse(cls, text: str) -> Target:
        if text in ("docker", "docker-daemon", "engine"):
            return cls("engine", "")
        for prefix, kind in PREFIXES:
            if text.startswith(prefix):
                rest = text[len(prefix) :]
                if kind == "oci":
                    path, tag = split_layout_ref(rest)
                    return cls(kind, str(path), tag)
                return cls(kind, rest)
        if "/" not in text:
            raise BackendError(
                f"not a target: {text!r}",
                hint="use docker, oci:DIR[:TAG], docker-archive:FILE or [docker://]HOST[:PORT]/REPO[:TAG]",
            )
        return cls("registry", text)

    @classmethod
    def engine_image(cls, name: str) -> Target:
        """An image in the Docker Engine, by tag or ID (`docker-daemon:NAME`)."""
        return cls("engine", name)

    @classmethod
    def layout(cls, path: Path | str, tag: str | None = None) -> Target:
        """An OCI image layout directory, optionally one ref name in it (`oci:DIR[:TAG]`)."""
        return cls("oci", str(path), tag)

    @property
    def in_engine(self) -> bool:
        return self.kind == "engine"

    @property
    def is_layout(self) -> bool:
        return self.kind == "oci"

    @property
    def is_archive(self) -> bool:
        return self.kind == "archive"

    @property
    def in_registry(self) -> bool:
        return self.kind == "registry"

    @property
    def holds_attestations(self) -> bool:
        """Whether attestations can live beside an image here (a registry's referrers, a layout's index)."""
        return self.kind in ("registry", "oci")

    def text(self) -> str:
        """The place as `parse` reads it (`Target.parse(t.text()) == t`)."""
        if self.kind == "engine":
            return f"docker-daemon:{self.location}" if self.location else "docker"
        if self.kind == "oci":
            return f"oci:{self.location}" + (f":{self.tag}" if self.tag else "")
        if self.kind == "archive":
            return f"docker-archive:{self.location}"
        return self.location


class WriteOptions(TypedDict, total=False):
    """How to write an image; each backend uses what applies to it.

    tag: the name published last (engine tag, layout ref name, archive RepoTag, registry tag) unless the
    target names its own; base_config: the base's image ID (the engine loads thin over it); mount_from: a
    repository on the same registry to cross-mount blobs from; progress: transfer progress; staged: how
    the engine's load went when it ran while the image was proven
    (`assembly.defaults.TargetSink`, its `stage`)."""

    tag: str | None
    base_config: Digest | None
    mount_from: str | None
    progress: Progress
    staged: str | None


@dataclass(frozen=True)
class ReadOptions:
    """How to read an image. `expected`: the digest it must have (a layout selects by it); `progress`:
    transfer progress; `rehash`: read every blob from the place and hash it even when the store holds
    it (verify, check: the source's bytes are what is relied on)."""

    expected: Digest | None = None
    progress: Progress = NULL
    rehash: bool = False
    # Which child of a multi-platform index to read (`--platform`); None: an index is refused, naming
    # its platforms.
    platform: Platform | None = None


class Backend(Protocol):
    """Reads and writes images at targets of one kind. Every write publishes its name last (tag after the
    image is complete), so a failure never leaves a tag or a half-written output behind."""

    def read(self, target: Target, store: BlobStore, log: Log, how: ReadOptions) -> Image:
        """The image at `target` (manifest, config, every layer blob in `store`), read as `how` says."""
        ...

    def write(self, image: Image, target: Target, store: BlobStore, log: Log, options: WriteOptions) -> str:
        """Write `image` (blobs from `store`) to `target`; return a human description of where it went."""
        ...

    def check_reachable(self, target: Target) -> None:
        """Fail before any work when `target` cannot possibly accept an image."""
        ...

    def referrers(self, target: Target) -> AbstractContextManager[Referrers]:
        """The artifacts beside the images at `target` (`backends.referrers`), open while the block runs;
        ReferrersError where a place of this kind cannot hold any (the engine, an archive)."""
        ...
