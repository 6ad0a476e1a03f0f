"""What a build hands its sink: the built images (one, or one per platform with the index over them), where
they go and under which tag, and the proof that must pass before any of it is visible.

The sink calls `release.proven()` before it makes anything visible; it may start work that publishes
nothing first (the engine's untagged load, `seams.TargetSink(stage=True)`), and must undo that work when
the proof fails. The pipeline refuses a publish that skipped the proof, so no sink can publish an
unproven image by forgetting to ask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from servimg.backends.target import Target
from servimg.core.digest import Digest
from servimg.core.platform import Platform
from servimg.oci.image import Image
from servimg.oci.index import ImageIndex
from servimg.proof.verify import VerifyReport


@dataclass(frozen=True)
class PlatformImage:
    """One platform's built image, with the probe report that verified it (None before the proof, or in a
    build planned without verification: a rebuild that only compares digests)."""

    platform: Platform
    image: Image
    report: VerifyReport | None
    base_config: Digest  # the base's config digest: the engine loads only the layers it lacks


class Proof:
    """The whole probe over every image of a release, run once when first asked (`Release.proven`)."""

    def __init__(self, run: Callable[[], tuple[PlatformImage, ...]]) -> None:
        self._run = run
        self._proven: tuple[PlatformImage, ...] | None = None

    def __call__(self) -> tuple[PlatformImage, ...]:
        if self._proven is None:
            self._proven = self._run()
        return self._proven

    @property
    def ran(self) -> bool:
        return self._proven is not None


@dataclass(frozen=True)
class Release:
    images: tuple[PlatformImage, ...]  # one, or every platform's in the index's order
    index: ImageIndex | None  # over `images` when the definition builds several platforms
    target: Target
    tag: str  # as the destination names it (`BuildPlan.full_tag`)
    proof: Proof
    engine_platform: Platform | None = None  # which child the Docker Engine gets (it stores no index)

    @property
    def image(self) -> PlatformImage:
        """The one image of a single-platform release."""
        if self.index is not None or len(self.images) != 1:
            raise ValueError("a multi-platform release has no single image")
        return self.images[0]

    def proven(self) -> tuple[PlatformImage, ...]:
        """Every image with its probe report; raises (core.errors.VerifyFailed) when any image fails."""
        return self.proof()
