"""A multi-platform image index as a value: one child manifest per platform (OCI image-index v1).

servimg writes an index over the images it built per platform (`ImageIndex.of`): canonical bytes (sorted
keys, compact), children sorted by platform, no time and no host fact in it, so equal children give an
equal index digest on every rebuild. An index read from elsewhere keeps its exact bytes (`parse`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.core.errors import ImageError, ServimgError, UsageError
from servimg.core.platform import Platform, texts
from servimg.oci.image import INDEX_TYPES, MANIFEST_TYPES, OCI_INDEX, Descriptor, Image


@dataclass(frozen=True)
class IndexEntry:
    platform: Platform
    descriptor: Descriptor  # the child's manifest


@dataclass(frozen=True)
class ImageIndex:
    """An image index and the exact bytes that define its digest."""

    index_bytes: bytes
    entries: tuple[IndexEntry, ...] = field(compare=False)
    media_type: str = OCI_INDEX
    annotations: Mapping[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def of(
        cls, children: Mapping[Platform, Image], annotations: Mapping[str, str] | None = None
    ) -> ImageIndex:
        """The index servimg writes over its per-platform images: OCI media type, children sorted by
        platform, each with its manifest's media type, digest, size and `platform`."""
        manifests = []
        entries = []
        for platform in sorted(children):
            image = children[platform]
            descriptor = Descriptor(
                image.media_type,
                image.digest,
                len(image.manifest_bytes),
                platform=tuple(sorted(platform.index_entry().items())),
            )
            manifests.append(descriptor.to_json())
            entries.append(IndexEntry(platform, descriptor))
        doc: dict[str, object] = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
        if annotations:
            doc["annotations"] = dict(sorted(annotations.items()))
        return cls(canonical.dumps(doc), tuple(entries), OCI_INDEX, dict(annotations or {}))

    @classmethod
    def parse(cls, data: bytes, where: str = "index") -> ImageIndex:
        """Validate an index's bytes (every problem collected); entries without a platform are skipped
        (attestation manifests some builders add), entries of unsupported platforms are kept as read."""
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ImageError(f"{where}: not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ImageError(f"{where}: not a JSON object")
        problems: list[str] = []
        media = str(doc.get("mediaType") or OCI_INDEX)
        if media not in INDEX_TYPES:
            problems.append(f"{where}.mediaType {media!r} is not an image index")
        if doc.get("schemaVersion") != 2:
            problems.append(f"{where}.schemaVersion must be 2")
        manifests = doc.get("manifests")
        entries: list[IndexEntry] = []
        if not isinstance(manifests, list):
            problems.append(f"{where}.manifests: missing or not a list")
            manifests = []
        for i, raw in enumerate(manifests):
            try:
                descriptor = Descriptor.from_json(raw, f"{where}.manifests[{i}]")
            except ServimgError as exc:
                problems.extend([exc.message, *exc.problems])
                continue
            plat = dict(descriptor.platform)
            if descriptor.media_type not in MANIFEST_TYPES or "architecture" not in plat:
                continue
            entries.append(IndexEntry(Platform(plat.get("os", "linux"), plat["architecture"]), descriptor))
        seen = [e.platform for e in entries]
        problems += [f"{where}: {p} listed twice" for p in sorted(set(seen)) if seen.count(p) > 1]
        found = doc.get("annotations")
        if found is not None and not isinstance(found, dict):
            problems.append(f"{where}.annotations: not an object")
        if problems:
            raise ImageError(f"malformed image index ({where})", problems=problems)
        annotations = {str(k): str(v) for k, v in (found or {}).items()}
        return cls(bytes(data), tuple(entries), media, annotations)

    @property
    def digest(self) -> Digest:
        return Digest.of_bytes(self.index_bytes)

    @property
    def platforms(self) -> tuple[Platform, ...]:
        return tuple(e.platform for e in self.entries)

    @property
    def descriptor(self) -> Descriptor:
        return Descriptor(self.media_type, self.digest, len(self.index_bytes))

    def chosen(self, platform: Platform | None) -> tuple[IndexEntry, ...]:
        """Every entry, or `platform`'s (UsageError naming the platforms it has when it lists none)."""
        if platform is None:
            return self.entries
        self.child(platform)
        return tuple(e for e in self.entries if e.platform == platform)

    def child(self, platform: Platform) -> Descriptor:
        """The manifest the index lists for `platform`, or UsageError naming the ones it has."""
        for entry in self.entries:
            if entry.platform == platform:
                return entry.descriptor
        raise UsageError(
            f"the index {self.digest.short} has no {platform} image",
            hint=f"choose one of its platforms: {texts(self.platforms)}",
        )


def is_index(media_type: str) -> bool:
    return media_type in INDEX_TYPES


@dataclass(frozen=True)
class IndexedImages:
    """An index with the images it lists: what publishing an index writes (every child, then the index's
    name), as go-containerregistry's `remote.WriteIndex` does. Refused unless every child the index lists
    is here, by platform and digest."""

    index: ImageIndex
    children: Mapping[Platform, Image]

    def __post_init__(self) -> None:
        problems = [
            f"{entry.platform}: {'missing' if entry.platform not in self.children else 'another image'}"
            for entry in self.index.entries
            if self.children.get(entry.platform) is None
            or self.children[entry.platform].digest != entry.descriptor.digest
        ]
        if problems:
            raise ImageError(f"the images are not the index {self.index.digest.short}'s", problems=problems)

    @property
    def digest(self) -> Digest:
        return self.index.digest

    @property
    def ordered(self) -> tuple[Image, ...]:
        """The children in the index's order."""
        return tuple(self.children[p] for p in self.index.platforms)

    def child(self, platform: Platform) -> Image:
        """`platform`'s image, or UsageError naming the platforms the index has."""
        self.index.child(platform)
        return self.children[platform]
