"""The one interface every backend (engine, registry, OCI layout, docker-archive) implements.

A `Target` names a place (`docker`, `oci:DIR[:TAG]`, `docker-archive:FILE`, `HOST/REPO[:TAG]`), one of
four kinds (a closed sum: `Place`); a `Backend` reads an image from a place of its kind and writes one to
it. `backends.transport` is the table
from kind to backend. This module sits below every backend, so each can name the types without a cycle.
"""

from __future__ import annotations

import enum
import re
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol, TypedDict

from servimg.core.context import NULL, Progress
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, ServimgError
from servimg.core.platform import Platform, texts
from servimg.core.reference import Reference

if TYPE_CHECKING:  # annotations only
    from servimg.backends.referrers import Referrers
    from servimg.oci.image import Image
    from servimg.oci.index import IndexedImages
    from servimg.oci.store import Io


def split_layout_ref(text: str) -> tuple[Path, str | None]:
    """`./out/demo` or `./out/demo:tag` (a tag is the part after the last ':' if it has no '/')."""
    head, sep, tail = text.rpartition(":")
    if sep and head and "/" not in tail:
        return Path(head), tail
    return Path(text), None


class Holds(enum.Enum):
    """What a place can keep besides one image: asked of the place (`Target.holds`) by code outside
    backends/, which then never tests what kind of place it is."""

    ATTESTATIONS = "attestations"  # referrers beside the image: a registry's API, a layout's index
    INDEX = "an image index"  # a multi-platform index over its children
    SIMPLE_SIGNATURES = "GPG simple signatures"  # containers/image's sigstore, for registry images only
    RUNNABLE = "runnable images"  # the engine: an image there runs as a container, found by its name
    TAGS = "tagged images"  # many images under tags: a registry repository, a layout's ref names


@dataclass(frozen=True)
class Target:
    """A place, parsed once by the one parser (`Target.parse`) and printed by the one printer (`text`).

    A closed sum: every place is one of `EngineTarget`, `LayoutTarget`, `ArchiveTarget` or
    `RegistryTarget` (`Place`), and names its backend by `kind` (`backends.transport.BACKENDS`). Code
    outside backends/ asks the place what it can hold (`holds`) or what it names (`named_tag`,
    `image_reference`, `digest_ref`, `untagged`), never which kind it is."""

    location: str
    tag: str | None = None
    reference: Reference | None = field(default=None, compare=False, repr=False)

    kind: ClassVar[str]
    described: ClassVar[str]  # in a sentence: "a docker-archive"
    keeps: ClassVar[frozenset[Holds]] = frozenset()

    def __post_init__(self) -> None:
        if type(self) is Target:
            raise TypeError("Target is the sum of its kinds: make one with Target.parse or a subclass")

    @classmethod
    def parse(cls, text: str) -> Target:
        if text in ("docker", "docker-daemon", "engine"):
            return EngineTarget("")
        for prefix, kind in PREFIXES:
            if text.startswith(prefix):
                rest = text[len(prefix) :]
                if kind is LayoutTarget:
                    path, tag = split_layout_ref(rest)
                    return LayoutTarget(str(path), tag)
                return kind(rest)
        if "/" not in text:
            raise BackendError(
                f"not a target: {text!r}",
                hint="use docker, oci:DIR[:TAG], docker-archive:FILE or [docker://]HOST[:PORT]/REPO[:TAG]",
            )
        return RegistryTarget(text)

    @classmethod
    def engine(cls) -> Target:
        """The Docker Engine as a sink (`docker`): the image is named by the tag the writer gives."""
        return EngineTarget("")

    @classmethod
    def engine_image(cls, name: str) -> Target:
        """An image in the Docker Engine, by tag or ID (`docker-daemon:NAME`)."""
        return EngineTarget(name)

    @classmethod
    def layout(cls, path: Path | str, tag: str | None = None) -> Target:
        """An OCI image layout directory, optionally one ref name in it (`oci:DIR[:TAG]`)."""
        return LayoutTarget(str(path), tag)

    @property
    def registry_ref(self) -> Reference:
        """The parsed reference of a registry target."""
        if self.reference is None:
            raise BackendError(f"{self.text()} is not a registry reference", hint="use HOST/REPO[:TAG]")
        return self.reference

    def holds(self, what: Holds) -> bool:
        """Whether `what` can live at this place."""
        return what in self.keeps

    def text(self) -> str:
        """The place as `parse` reads it (`Target.parse(t.text()) == t`)."""
        raise NotImplementedError

    @property
    def named_tag(self) -> str | None:
        """The tag this place's name carries (a layout's ref name, a reference's tag), None where it names
        a digest or no tag."""
        return None

    @property
    def image_reference(self) -> str | None:
        """What `org.opencontainers.image.base.name` may say for an image here (annotations spec: an image
        reference in distribution's grammar): None for a layout, an archive or an image ID."""
        return None

    def digest_ref(self, digest: Digest) -> str | None:
        """The reference of image `digest` in this place's repository (None: no reference names one)."""
        return None

    def untagged(self) -> Target:
        """This place without its tag: where images go by digest."""
        return self

    def name_for(self, repository: str, tag: str) -> str:
        """The name `tag` is published under here: docker load refuses a bare tag in RepoTags, so the
        engine and an archive take `REPOSITORY:TAG`, the others the tag alone."""
        return tag

    def is_layout_in(self, directory: Path) -> bool:
        """Whether this is an OCI layout directly under `directory` (a cache's bases)."""
        return False

    def is_engine_image_of(self, repository: str) -> bool:
        """Whether this is an engine image tagged in `repository` (`REPOSITORY:TAG`)."""
        return False


def _reference_tag(text: str) -> str | None:
    try:
        parsed = Reference.parse(text)
    except ServimgError:
        return None
    return parsed.tag if parsed.digest is None else None


@dataclass(frozen=True)
class EngineTarget(Target):
    """The Docker Engine (`docker`), or one image it holds by name or ID (`docker-daemon:NAME`)."""

    kind: ClassVar[str] = "engine"
    described: ClassVar[str] = "the Docker Engine"
    keeps: ClassVar[frozenset[Holds]] = frozenset({Holds.RUNNABLE})

    def text(self) -> str:
        return f"docker-daemon:{self.location}" if self.location else "docker"

    @property
    def named_tag(self) -> str | None:
        return _reference_tag(self.location) if self.location else None

    @property
    def image_reference(self) -> str | None:
        if not self.location or _IMAGE_ID.fullmatch(self.location):
            return None  # an image named by its ID: no reference names it
        return self.location if _parses(self.location) else None

    def name_for(self, repository: str, tag: str) -> str:
        return f"{repository}:{tag}"

    def is_engine_image_of(self, repository: str) -> bool:
        return self.location.startswith(f"{repository}:")


@dataclass(frozen=True)
class LayoutTarget(Target):
    """An OCI image layout directory, optionally one ref name in it (`oci:DIR[:TAG]`)."""

    kind: ClassVar[str] = "oci"
    described: ClassVar[str] = "an OCI layout"
    keeps: ClassVar[frozenset[Holds]] = frozenset({Holds.ATTESTATIONS, Holds.INDEX, Holds.TAGS})

    def text(self) -> str:
        return f"oci:{self.location}" + (f":{self.tag}" if self.tag else "")

    @property
    def named_tag(self) -> str | None:
        return self.tag

    def untagged(self) -> Target:
        return LayoutTarget(self.location)

    def is_layout_in(self, directory: Path) -> bool:
        return Path(self.location).parent == directory


@dataclass(frozen=True)
class ArchiveTarget(Target):
    """A docker-archive tarball (`docker-archive:FILE`, what `docker save` writes): one image."""

    kind: ClassVar[str] = "archive"
    described: ClassVar[str] = "a docker-archive"

    def text(self) -> str:
        return f"docker-archive:{self.location}"

    def name_for(self, repository: str, tag: str) -> str:
        return f"{repository}:{tag}"


@dataclass(frozen=True)
class RegistryTarget(Target):
    """A repository in an OCI registry, with its tag or digest (`[docker://]HOST/REPO[:TAG|@DIGEST]`);
    its reference is parsed once, when the place is made."""

    kind: ClassVar[str] = "registry"
    described: ClassVar[str] = "a registry"
    keeps: ClassVar[frozenset[Holds]] = frozenset(
        {Holds.ATTESTATIONS, Holds.INDEX, Holds.SIMPLE_SIGNATURES, Holds.TAGS}
    )

    def __post_init__(self) -> None:
        if self.reference is None:
            object.__setattr__(self, "reference", Reference.parse(self.location))

    def text(self) -> str:
        return self.location

    @property
    def named_tag(self) -> str | None:
        return self.registry_ref.tag if self.registry_ref.digest is None else None

    @property
    def image_reference(self) -> str | None:
        return self.location

    def digest_ref(self, digest: Digest) -> str | None:
        ref = self.registry_ref
        return f"{ref.registry}/{ref.repository}@{digest}"

    def untagged(self) -> Target:
        ref = self.registry_ref
        return RegistryTarget(f"{ref.registry}/{ref.repository}")


def _parses(text: str) -> bool:
    try:
        Reference.parse(text)
    except ServimgError:
        return False
    return True


# The closed sum: `match` over it is exhaustive (mypy checks it with `assert_never`).
Place = EngineTarget | LayoutTarget | ArchiveTarget | RegistryTarget
_IMAGE_ID = re.compile(r"(?:sha256:)?[a-f0-9]{12,64}")

# `docker-daemon:` names an engine image, `oci:` a layout, `docker-archive:` a file, `docker://` (skopeo's
# spelling) or no prefix a registry ref.
PREFIXES: tuple[tuple[str, type[Target]], ...] = (
    ("docker-daemon:", EngineTarget),
    ("oci:", LayoutTarget),
    ("docker-archive:", ArchiveTarget),
    ("docker://", RegistryTarget),
)


class WriteOptions(TypedDict, total=False):
    """How to write an image; each backend uses what applies to it.

    tag: the name published last (engine tag, layout ref name, archive RepoTag, registry tag) unless the
    target names its own; base_config: the base's image ID (the engine loads thin over it); mount_from: a
    repository on the same registry to cross-mount blobs from; progress: transfer progress; staged: how
    the engine's load went when it ran while the image was proven
    (`assembly.defaults.TargetSink`, its `stage`); platform: which child of an index a place of one image
    (the engine, an archive) gets (default: this host's)."""

    tag: str | None
    base_config: Digest | None
    mount_from: str | None
    progress: Progress
    staged: str | None
    platform: Platform | None


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


def one_child(indexed: IndexedImages, options: WriteOptions, place: str) -> tuple[Platform, Image]:
    """The child of `indexed` that a place of one image (`place`: the engine, an archive) gets: the
    platform `options` name, else this host's; BackendError naming the index's platforms when it has none."""
    wanted = options.get("platform") or Platform.host()
    if wanted not in indexed.children:
        raise BackendError(
            f"the index has no {wanted} image for {place} (it has {texts(indexed.index.platforms)})",
            hint="choose one of its platforms with --platform",
        )
    return wanted, indexed.children[wanted]


def only_child_said(where: str, platform: Platform, indexed: IndexedImages, why: str) -> str:
    """Where a place of one image put the index's child, saying that the index itself is not there."""
    return (
        f"{where} ({platform} only: {why}, not the index {indexed.digest.short}; push to a registry or an "
        f"OCI layout for all of {texts(indexed.index.platforms)})"
    )


class Backend(Protocol):
    """Reads and writes images at targets of one kind. Every write publishes its name last (tag after the
    image is complete), so a failure never leaves a tag or a half-written output behind."""

    def read(self, target: Target, io: Io, how: ReadOptions) -> Image:
        """The image at `target` (manifest, config, every layer blob in the context's store), read as
        `how` says."""
        ...

    def write(self, image: Image, target: Target, io: Io, options: WriteOptions) -> str:
        """Write `image` (blobs from the context's store) to `target`; return a human description of
        where it went."""
        ...

    def write_index(self, indexed: IndexedImages, target: Target, io: Io, options: WriteOptions) -> str:
        """Write every child of `indexed`, then its name; a place of one image (the engine, an archive)
        writes the one child `options` names and says so in the description it returns."""
        ...

    def check_reachable(self, target: Target) -> None:
        """Fail before any work when `target` cannot possibly accept an image."""
        ...

    def referrers(self, target: Target) -> AbstractContextManager[Referrers]:
        """The artifacts beside the images at `target` (`backends.referrers`), open while the block runs;
        ReferrersError where a place of this kind cannot hold any (the engine, an archive)."""
        ...
