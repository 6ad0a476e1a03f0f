"""What a build hands its sink: the built images (one, or one per platform with the index over them), where
they go and under which tag; and, once the whole probe passed over every image, the same release as
proven (`ProvenRelease`), the only value a sink publishes.

The order is in the types (issue 49): a sink may begin work that publishes nothing while the proof runs
(`Sink.stage`: the engine's untagged load), and `Sink.publish` takes a `ProvenRelease`, which only a
passing proof makes: every image carries its report, and every report passed. So no sink can publish an
unproven image by forgetting to ask (the pipeline used to check that only after the sink had returned).
"""

from __future__ import annotations

from dataclasses import dataclass

from servimg.backends.target import Target
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, BuildError
from servimg.core.platform import Platform, texts
from servimg.oci.image import Image
from servimg.oci.index import ImageIndex, IndexedImages
from servimg.oci.store import BlobStore
from servimg.proof.verify import VerifyReport


@dataclass(frozen=True)
class PlatformImage:
    """One platform's built image, with the probe report that verified it (None before the proof, or in a
    build planned without verification: a rebuild that only compares digests)."""

    platform: Platform
    image: Image
    report: VerifyReport | None
    base_config: Digest  # the base's config digest: the engine loads only the layers it lacks


@dataclass(frozen=True)
class Release:
    images: tuple[PlatformImage, ...]  # one, or every platform's in the index's order
    index: ImageIndex | None  # over `images` when the definition builds several platforms
    target: Target
    tag: str  # as the destination names it (`BuildPlan.full_tag`)
    platform: Platform | None = None  # which child a place of one image gets (`--platform`; else the host's)

    @property
    def named(self) -> Image | IndexedImages:
        """What the tag names: the one image, or the index with every image it lists."""
        if self.index is None:
            return self.images[0].image
        return IndexedImages(self.index, {c.platform: c.image for c in self.images})

    def runnable(self) -> PlatformImage:
        """The image a place of one image (the Docker Engine) gets: `platform`'s (else this host's), or
        the only image, whatever its platform (a one-platform build of another, run under emulation)."""
        wanted = self.platform or Platform.host()
        for child in self.images:
            if child.platform == wanted or len(self.images) == 1:
                return child
        raise BackendError(
            f"the index has no {wanted} image for the Docker Engine (it has "
            f"{texts(c.platform for c in self.images)})",
            hint="choose one of its platforms with --platform",
        )


@dataclass(frozen=True)
class ProvenRelease:
    """`release` with every image proven: `images` are its images in order, each with the passing report
    of the whole probe run over it in this build. Refused unless every image is there and passed."""

    release: Release
    images: tuple[PlatformImage, ...]

    def __post_init__(self) -> None:
        problems = []
        if tuple(c.image.digest for c in self.images) != tuple(c.image.digest for c in self.release.images):
            problems.append("its images are not the release's")
        problems += [
            f"{c.platform} ({c.image.digest.short}) has no passing probe report"
            for c in self.images
            if c.report is None or not c.report.ok
        ]
        if problems:
            raise BuildError(
                "not a proven release: " + "; ".join(problems),
                hint="only the whole probe's passing reports prove a release: report this bug",
            )

    @property
    def index(self) -> ImageIndex | None:
        return self.release.index

    @property
    def target(self) -> Target:
        return self.release.target

    @property
    def tag(self) -> str:
        return self.release.tag


def keep_in_store(release: Release, store: BlobStore) -> str:
    """The release's images left as values in the blob store (their layers are there already, their configs
    are added), published nowhere: where a build planned without the proof ends (a rebuild comparing
    digests), and the `StoreOnly` sink."""
    for child in release.images:
        store.put_bytes(child.image.config_bytes)
    return f"the blob store ({release.named.digest}; not published)"
