"""lock and build of a multi-platform definition: every platform as its own image, then one image index.

A definition with `base.platforms` (docs/platforms.md) is, per platform, an ordinary single-platform
definition (`ImageDefinition.for_platform`): the same pipeline resolves its base, applies the overlays
exactly, compiles the pycs with *that platform's* interpreter (under qemu where the host differs:
`patching.emulation`) and verifies the image with the in-image probe under the same emulation. Their locks
are one file (`definitions.platformlock`); the images are children of one OCI image index
(`oci.index.ImageIndex`), published by the sink with its name last.

Bytecode is not assumed to be platform-independent: the build compares the pycs each platform's
interpreter wrote for the same sources (`compare_bytecode`) and reports what differed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servimg.backends.target import Target
from servimg.build.pipeline import Resolution, assemble, default_target, resolve
from servimg.build.seams import DEFAULT, IndexSink, PlatformImage, Seams, verify_or_refuse
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import BuildError, ServimgError
from servimg.core.platform import Platform, texts
from servimg.core.progress import NULL, Log, Progress
from servimg.definitions import naming
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import lock_path_for
from servimg.definitions.platformlock import PlatformLocks, check_drift
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.oci.index import ImageIndex
from servimg.oci.store import BlobStore
from servimg.patching import emulation


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


@dataclass(frozen=True)
class IndexBuildResult:
    index: ImageIndex
    children: tuple[PlatformImage, ...]
    tag: str
    lock_digest: Digest
    destination: str
    bytecode: BytecodeComparison

    def as_dict(self) -> dict[str, object]:
        return {
            "digest": str(self.index.digest),
            "media_type": self.index.media_type,
            "tag": self.tag,
            "lock_digest": str(self.lock_digest),
            "destination": self.destination,
            "platforms": {
                str(c.platform): {"digest": str(c.image.digest), "config_digest": str(c.image.config_digest)}
                for c in self.children
            },
            "bytecode": self.bytecode.as_dict(),
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


# -- lock -----------------------------------------------------------------------------------------
def resolve_platforms(
    definition: ImageDefinition,
    definition_path: Path,
    store: BlobStore,
    log: Log,
    runner: str = "auto",
    seams: Seams = DEFAULT,
) -> dict[Platform, Resolution]:
    """Every platform resolved as its own single-platform definition (each with its lock)."""
    for platform in definition.platforms:  # every emulator checked before the first platform starts
        emulation.require(platform, f"resolving {definition.name}")
    resolutions = {}
    for platform in definition.platforms:
        log(f"{definition.name}: {platform}" + (" (under qemu emulation)" if platform.emulated else ""))
        try:
            resolutions[platform] = resolve(
                definition_path, store, log, runner, seams, definition=definition.for_platform(platform)
            )
        except ServimgError as exc:
            raise exc.context(f"platform {platform}") from None
    return resolutions


def locks_of(definition: ImageDefinition, resolutions: Mapping[Platform, Resolution]) -> PlatformLocks:
    """One lock over every platform's."""
    locks = {str(platform): resolution.lock for platform, resolution in resolutions.items()}
    return PlatformLocks(definition.name, definition.digest.hex, locks)


def lock_platforms(
    definition: ImageDefinition,
    definition_path: Path,
    store: BlobStore,
    log: Log,
    runner: str = "auto",
    seams: Seams = DEFAULT,
) -> tuple[PlatformLocks, bool]:
    """Resolve every platform and write the lock; (lock, changed?). Nothing is written if any fails."""
    locked = locks_of(definition, resolve_platforms(definition, definition_path, store, log, runner, seams))
    path = lock_path_for(definition_path)
    previous = path.read_bytes() if path.exists() else None
    locked.write(path)
    return locked, previous != path.read_bytes()


# -- build ----------------------------------------------------------------------------------------
def build_platforms(
    definition: ImageDefinition,
    definition_path: Path,
    store: BlobStore,
    log: Log,
    *,
    to: str | None = None,
    runner: str = "auto",
    tag: str | None = None,
    verify: bool = True,
    progress: Progress = NULL,
    seams: Seams = DEFAULT,
    engine_platform: Platform | None = None,
) -> IndexBuildResult:
    """Build every platform's image exactly as locked, verify each, compare their bytecode, and publish
    the children and the index over them (the index's name last). Nothing is published unless every
    platform built and verified."""
    target = Target.parse(to) if to else default_target(definition_path)
    sink = seams.sink
    if not isinstance(sink, IndexSink):
        raise BuildError(
            f"this destination cannot take a multi-platform index ({type(sink).__name__})",
            hint="build to a registry or an OCI layout",
        )
    if target.is_archive:  # refused before any platform is built, not after
        raise BuildError(
            "a docker-archive holds one image, not a multi-platform index",
            hint="write the index to a registry (HOST/REPO[:TAG]) or an OCI layout (oci:DIR[:TAG]), or "
            "--to docker for this host's platform",
        )
    sink.check(target)
    locked = PlatformLocks.load(lock_path_for(definition_path))
    resolutions = resolve_platforms(definition, definition_path, store, log, runner, seams)
    check_drift(locked, locks_of(definition, resolutions), definition_path)
    chosen_tag = tag or naming.derive_tag(definition, locked)
    naming.refuse_tag_of_another_lock(definition, locked, [tag, target.tag, naming.registry_tag(target)])
    children = tuple(
        _build_one(platform, resolution, locked, store, log, seams, verify)
        for platform, resolution in resolutions.items()
    )
    comparison = compare_bytecode(children, store)
    log(f"bytecode: {comparison.summary()}")
    index = ImageIndex.of({c.platform: c.image for c in children}, index_annotations(definition, locked))
    full_tag = naming.full_tag(definition, target, chosen_tag)
    destination = sink.publish_index(
        index, children, target, store, log, tag=full_tag, engine_platform=engine_platform, progress=progress
    )
    return IndexBuildResult(index, children, chosen_tag, locked.digest, destination, comparison)


def _build_one(
    platform: Platform,
    resolution: Resolution,
    locked: PlatformLocks,
    store: BlobStore,
    log: Log,
    seams: Seams,
    verify: bool,
) -> PlatformImage:
    """One platform as resolved (its drift checked): assembled, verified under its emulation."""
    try:
        image, _ = assemble(resolution, locked.of(platform), store, log, child_labels(locked, platform))
        report = None
        if verify:
            report = verify_or_refuse(
                seams.verifier,
                image,
                store,
                log,
                base_config=resolution.base.config_digest,
                consequence="nothing was published",
                probe=resolution.probe,
            )
    except ServimgError as exc:
        raise exc.context(f"platform {platform}") from None
    log(f"{platform}: {image.digest}")
    return PlatformImage(platform, image, report)


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
