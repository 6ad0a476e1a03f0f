"""An image as a value: manifest + config + layer descriptors. Transformations return a new Image.

Bytes are canonical (sorted keys, compact) for everything servimg creates, and preserved exactly for
everything it reads (a base manifest's digest is the sha256 of its bytes as served, never re-serialised).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.core.errors import ImageError, ServimgError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
# The OCI image-layout annotation that names a manifest's tag in index.json.
REF_NAME = "org.opencontainers.image.ref.name"
LAYER_TYPES = {OCI_LAYER, OCI_LAYER_GZIP, DOCKER_LAYER_GZIP, DOCKER_LAYER}
MANIFEST_TYPES = {OCI_MANIFEST, DOCKER_MANIFEST}
INDEX_TYPES = {OCI_INDEX, DOCKER_LIST}


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: Digest
    size: int
    annotations: tuple[tuple[str, str], ...] = ()
    platform: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"mediaType": self.media_type, "digest": str(self.digest), "size": self.size}
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.platform:
            out["platform"] = dict(self.platform)
        return out

    @classmethod
    def from_json(cls, data: object, where: str) -> Descriptor:
        problems: list[str] = []
        if not isinstance(data, dict):
            raise ImageError(f"{where}: descriptor is not an object")
        media = data.get("mediaType")
        size = data.get("size")
        if not isinstance(media, str):
            problems.append(f"{where}.mediaType: missing or not a string")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            problems.append(f"{where}.size: missing or not a non-negative integer")
        try:
            digest = Digest.parse(data.get("digest"))  # type: ignore[arg-type]
        except ServimgError as exc:
            problems.append(f"{where}.digest: {exc.message}")
        ann = data.get("annotations") or {}
        plat = data.get("platform") or {}
        if not isinstance(ann, dict):
            problems.append(f"{where}.annotations: not an object")
        if not isinstance(plat, dict):
            problems.append(f"{where}.platform: not an object")
        if problems:
            raise ImageError(f"malformed descriptor at {where}", problems=problems)
        return cls(
            str(media),
            digest,
            int(size),  # type: ignore[arg-type]
            tuple(sorted((str(k), str(v)) for k, v in ann.items())),
            tuple(sorted((str(k), str(v)) for k, v in plat.items() if isinstance(v, str))),
        )


@dataclass(frozen=True)
class Layer:
    """A layer descriptor plus its diffID (from the config's rootfs.diff_ids)."""

    descriptor: Descriptor
    diff_id: Digest


@dataclass(frozen=True)
class Image:
    """An image manifest and its config, kept as the exact bytes that define their digests."""

    manifest_bytes: bytes
    config_bytes: bytes
    manifest: Mapping[str, object] = field(compare=False, repr=False)
    config: Mapping[str, object] = field(compare=False, repr=False)

    @classmethod
    def parse(cls, manifest_bytes: bytes, config_bytes: bytes) -> Image:
        """Validate a manifest/config pair (every problem collected), keeping the exact bytes."""
        problems: list[str] = []
        manifest = _json_object(manifest_bytes, "manifest", problems)
        config = _json_object(config_bytes, "config", problems)
        if problems:
            raise ImageError("malformed image", problems=problems)
        media = manifest.get("mediaType", OCI_MANIFEST)
        if not isinstance(media, str) or media not in MANIFEST_TYPES:
            problems.append(f"manifest.mediaType {media!r} is not an image manifest")
        if manifest.get("schemaVersion") != 2:
            problems.append("manifest.schemaVersion must be 2")
        problems.extend(_config_problems(config))
        image = cls(manifest_bytes, config_bytes, manifest, config)
        try:
            cfg = image.config_descriptor
            if Digest.of_bytes(config_bytes) != cfg.digest:
                problems.append(
                    f"config bytes hash to {Digest.of_bytes(config_bytes)}, manifest says {cfg.digest}"
                )
            layers = image.layer_descriptors
            rootfs = config.get("rootfs", {})
            diff_ids = rootfs.get("diff_ids", []) if isinstance(rootfs, dict) else []
            if isinstance(diff_ids, list) and len(diff_ids) != len(layers):
                problems.append(
                    f"config has {len(diff_ids)} diff_ids but the manifest has {len(layers)} layers"
                )
            for i, d in enumerate(layers):
                if d.media_type not in LAYER_TYPES:
                    problems.append(f"manifest.layers[{i}].mediaType {d.media_type!r} is not a layer type")
        except ServimgError as exc:
            problems.extend([exc.message, *exc.problems])
        if problems:
            raise ImageError("malformed image", problems=problems)
        return image

    @classmethod
    def create(
        cls, config: Mapping[str, object], layers: list[Layer], *, manifest_media_type: str = OCI_MANIFEST
    ) -> Image:
        """Build a new image with canonical config and manifest bytes."""
        return cls.assemble(canonical.dumps(config), layers, manifest_media_type=manifest_media_type)

    @classmethod
    def assemble(
        cls, config_bytes: bytes, layers: list[Layer], *, manifest_media_type: str = OCI_MANIFEST
    ) -> Image:
        """A canonical manifest around exact config bytes (e.g. as `docker save` returned them)."""
        config_media = OCI_CONFIG if manifest_media_type == OCI_MANIFEST else DOCKER_CONFIG
        manifest: dict[str, object] = {
            "schemaVersion": 2,
            "mediaType": manifest_media_type,
            "config": Descriptor(config_media, Digest.of_bytes(config_bytes), len(config_bytes)).to_json(),
            "layers": [layer.descriptor.to_json() for layer in layers],
        }
        return cls.parse(canonical.dumps(manifest), config_bytes)

    # -- facts --------------------------------------------------------------------------------------
    @property
    def digest(self) -> Digest:
        return Digest.of_bytes(self.manifest_bytes)

    @property
    def config_digest(self) -> Digest:
        """Also Docker's image ID."""
        return Digest.of_bytes(self.config_bytes)

    @property
    def media_type(self) -> str:
        return str(self.manifest.get("mediaType", OCI_MANIFEST))

    @property
    def config_descriptor(self) -> Descriptor:
        return Descriptor.from_json(self.manifest.get("config"), "manifest.config")

    @property
    def layer_descriptors(self) -> list[Descriptor]:
        raw = self.manifest.get("layers")
        if not isinstance(raw, list):
            raise ImageError("manifest.layers is missing or not a list")
        return [Descriptor.from_json(d, f"manifest.layers[{i}]") for i, d in enumerate(raw)]

    @property
    def diff_ids(self) -> list[Digest]:
        return [
            Digest.parse(d)
            for d in jv.texts(jv.member(self.config, "rootfs", "diff_ids") or [], "rootfs.diff_ids")
        ]

    @property
    def layers(self) -> list[Layer]:
        return [Layer(d, i) for d, i in zip(self.layer_descriptors, self.diff_ids, strict=True)]

    @property
    def labels(self) -> dict[str, str]:
        labels = jv.obj(jv.member(self.config, "config", "Labels") or {}, "config.Labels")
        return {key: jv.text(value, f"config.Labels.{key}") for key, value in labels.items()}

    @property
    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in jv.seq(jv.member(self.config, "config", "Env") or [], "config.Env"):
            key, _, value = str(item).partition("=")
            out[key] = value
        return out

    # -- transformations ----------------------------------------------------------------------------
    def with_layer(self, layer: Layer, *, labels: Mapping[str, str], created: str, history: str) -> Image:
        """A new image: this one plus `layer`, `labels` merged into the config, one history entry."""
        config = json.loads(self.config_bytes)
        if not isinstance(config.get("config"), dict):  # absent or null in some bases
            config["config"] = {}
        merged = dict(config["config"].get("Labels") or {})
        merged.update(labels)
        config["config"]["Labels"] = merged
        config["created"] = created
        config.setdefault("rootfs", {"type": "layers", "diff_ids": []})
        config["rootfs"]["diff_ids"] = [*config["rootfs"].get("diff_ids", []), str(layer.diff_id)]
        config["history"] = [
            *config.get("history", []),
            {"created": created, "created_by": history, "comment": "servimg overlay layer"},
        ]
        base_layers = self.layers
        media = self.media_type
        return Image.create(config, [*base_layers, layer], manifest_media_type=media)


def _config_problems(config: Mapping[str, object]) -> list[str]:
    """The config fields servimg reads (rootfs.diff_ids, config.Env, config.Labels) have their spec'd
    shapes: a base image's config is untrusted input."""
    problems: list[str] = []
    rootfs = config.get("rootfs", {})
    diff_ids = rootfs.get("diff_ids", []) if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list):
        problems.append("config.rootfs.diff_ids is not a list")
    else:
        for i, value in enumerate(diff_ids):
            try:
                Digest.parse(value)
            except ServimgError as exc:
                problems.append(f"config.rootfs.diff_ids[{i}]: {exc.message}")
    if not isinstance(config.get("history", []), list):
        problems.append("config.history is not a list")
    runtime = config.get("config")
    if runtime is not None and not isinstance(runtime, dict):
        problems.append("config.config is not an object")
    elif runtime:
        env, labels = runtime.get("Env"), runtime.get("Labels")
        if env is not None and not (isinstance(env, list) and all(isinstance(e, str) for e in env)):
            problems.append("config.config.Env is not a list of strings")
        if labels is not None and not (
            isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())
        ):
            problems.append("config.config.Labels is not an object of strings")
    return problems


def _json_object(data: bytes, what: str, problems: list[str]) -> dict[str, object]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        problems.append(f"{what} is not valid JSON: {exc}")
        return {}
    if not isinstance(value, dict):
        problems.append(f"{what} is not a JSON object")
        return {}
    return value
