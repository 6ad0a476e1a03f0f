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
from servimg.core.errors import BuildError
from servimg.core.platform import Platform
from servimg.oci.image import Image
from servimg.oci.index import ImageIndex
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
    engine_platform: Platform | None = None  # which child the Docker Engine gets (it stores no index)

    @property
    def image(self) -> PlatformImage:
        """The one image of a single-platform release."""
        if self.index is not None or len(self.images) != 1:
            raise ValueError("a multi-platform release has no single image")
        return self.images[0]


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

    @property
    def image(self) -> PlatformImage:
        """The one proven image of a single-platform release (`Release.image` refuses the others)."""
        one = self.release.image
        return next(c for c in self.images if c.image.digest == one.image.digest)


def keep_in_store(release: Release, store: BlobStore) -> str:
    """The release's images left as values in the blob store (their layers are there already, their configs
    are added), published nowhere: where a build planned without the proof ends (a rebuild comparing
    digests), and the `StoreOnly` sink."""
    for child in release.images:
        store.put_bytes(child.image.config_bytes)
    digest = release.index.digest if release.index is not None else release.image.image.digest
    return f"the blob store ({digest}; not published)"
