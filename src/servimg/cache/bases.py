"""What each base costs in the cache (`servimg cache status`): a base is an image whose layer chain has a
warm root (`rootfs/<format>/<chain key>/`, the key of its ordered diffIDs as `cache.layout.chain_key`
spells it); its cost is its layer blobs in the store plus that extracted root. Read from the cache
alone: the manifests and configs in `blobs/`, nothing fetched, nothing run.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

from servimg.cache.layout import CacheLayout, chain_key
from servimg.cache.state import tree_size
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError

MANIFEST_LIMIT = 1 << 20  # a manifest or config is small; a layer blob is never read
TITLE = "org.opencontainers.image.title"


@dataclass(frozen=True)
class CachedBase:
    manifest: Digest
    title: str  # the image's title label, or "" when it has none
    layers: int  # bytes of its layer blobs in the store
    warm_root: int  # bytes of its extracted root file system

    @property
    def total(self) -> int:
        return self.layers + self.warm_root

    def as_dict(self) -> dict[str, object]:
        return {
            "manifest": str(self.manifest),
            "title": self.title,
            "layers_bytes": self.layers,
            "warm_root_bytes": self.warm_root,
        }


def cached_bases(root: Path) -> list[CachedBase]:
    """Every base the cache holds a warm root for, largest first (one entry per chain)."""
    layout = CacheLayout(root)
    roots = {p.name: p for p in layout.rootfs.glob("*/*") if p.is_dir()}
    found: dict[str, CachedBase] = {}
    for blob in sorted(layout.blobs.glob("sha256/*")):
        doc = _small_json(blob)
        config_digest = _config_of(doc)
        if config_digest is None:
            continue
        config = _small_json(layout.blobs / "sha256" / config_digest)
        diff_ids = _diff_ids(config)
        if not diff_ids:
            continue
        key = chain_key(diff_ids).hex
        if key not in roots or key in found:
            continue
        layers = sum(_size(layout.blobs / "sha256" / d.hex) for d in _layer_digests(doc))
        labels = (config.get("config") or {}).get("Labels") or {} if isinstance(config, dict) else {}
        title = labels.get(TITLE, "") if isinstance(labels, dict) else ""
        found[key] = CachedBase(
            Digest.parse(f"sha256:{blob.name}"), str(title), layers, tree_size(roots[key])
        )
    return sorted(found.values(), key=lambda b: -b.total)


def _small_json(path: Path) -> object:
    with contextlib.suppress(OSError, ValueError):
        if path.stat().st_size <= MANIFEST_LIMIT:
            return json.loads(path.read_bytes())
    return None


def _config_of(doc: object) -> str | None:
    if not (isinstance(doc, dict) and isinstance(doc.get("layers"), list)):
        return None
    config = doc.get("config")
    digest = config.get("digest") if isinstance(config, dict) else None
    return (
        digest.removeprefix("sha256:") if isinstance(digest, str) and digest.startswith("sha256:") else None
    )


def _layer_digests(doc: object) -> list[Digest]:
    layers = doc.get("layers") if isinstance(doc, dict) else None
    out = []
    for layer in layers if isinstance(layers, list) else []:
        digest = layer.get("digest") if isinstance(layer, dict) else None
        with contextlib.suppress(ServimgError):
            out.append(Digest.parse(str(digest)))
    return out


def _diff_ids(config: object) -> list[Digest]:
    rootfs = config.get("rootfs") if isinstance(config, dict) else None
    ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    out = []
    for text in ids if isinstance(ids, list) else []:
        with contextlib.suppress(ServimgError):
            out.append(Digest.parse(str(text)))
    return out


def _size(path: Path) -> int:
    with contextlib.suppress(OSError):
        return path.stat().st_size
    return 0
