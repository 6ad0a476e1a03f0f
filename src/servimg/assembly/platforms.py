"""What a multi-platform build adds to one platform's: every platform as its own image, then one image index.

A definition with `base.platforms` (docs/platforms.md) is, per platform, an ordinary single-platform
definition (`ImageDefinition.for_platform`): the same pipeline resolves its base, applies the overlays
exactly, compiles the pycs with *that platform's* interpreter (under qemu where the host differs:
`patching.emulation`) and verifies the image with the in-image probe under the same emulation. Their locks
are one file (`definitions.platformlock`); the images are children of one OCI image index
(`oci.index.ImageIndex`), published by the sink with its name last. The loop over the platforms is the
one build's (`assembly.pipeline.build`); this module holds what ties the children to their index and the
comparison of their bytecode.

Bytecode is not assumed to be platform-independent: the build compares the pycs each platform's
interpreter wrote for the same sources (`compare_bytecode`) and reports what differed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servimg.assembly.release import PlatformImage
from servimg.core.digest import sha256_hex
from servimg.core.platform import Platform, texts
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.platformlock import PlatformLocks
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.oci.store import BlobStore


@dataclass(frozen=True)
class BytecodeComparison:
    """The pycs each platform's interpreter compiled for the same sources: identical or not, file by file."""

    platforms: tuple[Platform, ...]
    files: int  # pyc paths compared (present on every platform)
    differing: tuple[str, ...]  # paths whose bytes differ between platforms
    only_some: tuple[str, ...]  # paths some platforms have and others lack

    @property
    def identical(self) -> bool:
        return not self.differing and not self.only_some

    def summary(self) -> str:
        if len(self.platforms) < 2:
            return "one platform: nothing to compare"
        if self.identical:
            return f"{self.files} pyc(s) byte-identical on {texts(self.platforms)}"
        return f"{len(self.differing)} of {self.files} pyc(s) differ between {texts(self.platforms)}" + (
            f"; {len(self.only_some)} on some platforms only" if self.only_some else ""
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "platforms": [str(p) for p in self.platforms],
            "files": self.files,
            "identical": self.identical,
            "differing": list(self.differing),
            "only_some": list(self.only_some),
        }


# What ties the children to their index, whoever re-assembles one: each child's config names the
# multi-platform lock and its platform; the index names the lock and the definition.
PLATFORMS_LOCK_LABEL = "io.servimg.platforms.lock"
PLATFORM_LABEL = "io.servimg.platform"
INDEX_LOCK = "io.servimg.lock"
INDEX_DEFINITION = "io.servimg.definition.sha256"


def child_labels(locked: PlatformLocks, platform: Platform) -> dict[str, str]:
    return {PLATFORMS_LOCK_LABEL: str(locked.digest), PLATFORM_LABEL: str(platform)}


def index_annotations(definition: ImageDefinition, locked: PlatformLocks) -> dict[str, str]:
    return {INDEX_LOCK: str(locked.digest), INDEX_DEFINITION: definition.digest.hex}


def compare_bytecode(children: Sequence[PlatformImage], store: BlobStore) -> BytecodeComparison:
    """Every pyc of each child's servimg layer by path, compared across the platforms."""
    hashes = [_layer_pycs(c.image, store) for c in children]
    every = set().union(*hashes) if hashes else set()
    common = sorted(set.intersection(*(set(h) for h in hashes))) if hashes else []
    differing = tuple(p for p in common if len({h[p] for h in hashes}) > 1)
    only_some = tuple(sorted(every - set(common)))
    return BytecodeComparison(tuple(c.platform for c in children), len(common), differing, only_some)


def _layer_pycs(image: Image, store: BlobStore) -> dict[str, str]:
    top = image.layers[-1]
    fs = LayeredFS([store.uncompressed(top.descriptor.digest, top.diff_id)])
    return {node.path: sha256_hex(fs.read(node.path)) for node in fs.walk() if node.path.endswith(".pyc")}
