"""The committed result of every locally built base, so that a drift is explained file by file.

A base is a pure function of pins in the repository (`servimg.bases.debian`, the wheel pins), so its digest is
pinned too: ``verify/bases/<base>.lock.json`` holds the recipe key it was built from, the manifest and
config digests, the config itself and each layer's diffID; ``verify/bases/<base>.<layer>.files.gz`` holds
each layer's file listing (`servimg.oci.treediff`: path, kind, mode, owner, size, mtime, sha256).

When a build of the same recipe gives another digest, "two digests" helps nobody (docs/design.md: say which
files differ). `check` compares the built image with the pin and raises `BaseDriftError` naming the layer, and
in it each path that differs with size, mode and sha256 on each side.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servimg.assembly.context import Context
from servimg.bases.debpins import PIN_DIR
from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.oci.image import Image
from servimg.oci.listing import LayerListing, listing_from_tar, parse_listing, render_listing
from servimg.oci.store import BlobStore
from servimg.oci.treediff import describe, diff_listings, json_changes

LAYER_NAMES = ("debian", "venv")


class BaseDriftError(ServimgError):
    """A locally built base differs from the digest pinned for its recipe."""


@dataclass(frozen=True)
class BasePin:
    """`verify/bases/<name>.lock.json`: what building `recipe_key` gave when it was pinned."""

    name: str
    recipe_key: str
    digest: Digest
    config_digest: Digest
    config: dict[str, object]
    layers: tuple[tuple[str, Digest], ...]

    @classmethod
    def of(cls, name: str, recipe_key: str, image: Image) -> BasePin:
        names = LAYER_NAMES[: len(image.layers)]
        return cls(
            name=name,
            recipe_key=recipe_key,
            digest=image.digest,
            config_digest=image.config_digest,
            config=json.loads(image.config_bytes),
            layers=tuple((n, layer.diff_id) for n, layer in zip(names, image.layers, strict=True)),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "base": self.name,
            "recipe_key": self.recipe_key,
            "manifest_digest": str(self.digest),
            "config_digest": str(self.config_digest),
            "config": self.config,
            "layers": [{"name": n, "diff_id": str(d)} for n, d in self.layers],
        }

    @classmethod
    def from_json(cls, data: Any, origin: str) -> BasePin:
        try:
            return cls(
                name=str(data["base"]),
                recipe_key=str(data["recipe_key"]),
                digest=Digest.parse(data["manifest_digest"]),
                config_digest=Digest.parse(data["config_digest"]),
                config=dict(data["config"]),
                layers=tuple((str(x["name"]), Digest.parse(x["diff_id"])) for x in data["layers"]),
            )
        except (KeyError, TypeError, ValueError, ServimgError) as exc:
            raise BaseDriftError(
                f"{origin}: malformed base pin ({exc})", hint="re-pin it with `servimg base <base> --repin`"
            ) from None


def lock_path(name: str, directory: Path | None = None) -> Path:
    return (directory or PIN_DIR) / f"{name}.lock.json"


def listing_path(name: str, layer: str, directory: Path | None = None) -> Path:
    return (directory or PIN_DIR) / f"{name}.{layer}.files.gz"


def load(name: str, directory: Path | None = None) -> BasePin | None:
    path = lock_path(name, directory)
    if not path.is_file():
        return None
    return BasePin.from_json(json.loads(path.read_text(encoding="utf-8")), str(path))


def layer_listing(image: Image, index: int, store: BlobStore) -> LayerListing:
    layer = image.layers[index]
    with store.uncompressed(layer.descriptor.digest, layer.diff_id).open("rb") as stream:
        return listing_from_tar(stream)


def pin_files(pin: BasePin, image: Image, store: BlobStore) -> dict[str, bytes]:
    """File name (in verify/bases/) → bytes for the lock and every layer listing of `image`."""
    files = {lock_path(pin.name).name: canonical.dumps_pretty(pin.to_json())}
    for index, (layer, _) in enumerate(pin.layers):
        listing = render_listing(layer_listing(image, index, store))
        files[listing_path(pin.name, layer).name] = gzip.compress(listing, compresslevel=9, mtime=0)
    return files


def check(name: str, recipe_key: str, image: Image, ctx: Context, directory: Path | None = None) -> None:
    """Raise `BaseDriftError` with a file-level explanation when `image` is not the pinned base.

    Recipes with no pin (a test's variant recipe) are only logged: there is nothing to compare with.
    """
    pin, log = load(name, directory), ctx.log
    if pin is None or pin.recipe_key != recipe_key:
        log(f"{name} base: no pinned digest for recipe {recipe_key[:12]} (verify/bases/{name}.lock.json)")
        return
    if image.digest == pin.digest:
        log(f"{name} base: {image.digest} is the pinned digest")
        return
    raise BaseDriftError(
        f"the {name} base built from its pinned recipe has digest {image.digest}, pinned {pin.digest}",
        problems=explain(pin, image, ctx.store, directory=directory),
        hint=(
            "a build input is not pinned, or the build procedure changed (docs/reproducibility.md); "
            f"compare any two builds with `servimg diff --files A B`; re-pin deliberately with "
            f"`servimg base {name} --repin`"
        ),
    )


def explain(
    pin: BasePin, image: Image, store: BlobStore, limit: int = 40, directory: Path | None = None
) -> list[str]:
    """Which layer differs and, in it, which paths, against the committed listings."""
    lines = [
        f"config: {change.key}: {change.before} → {change.after}"
        for change in json_changes(
            pin.config, json.loads(image.config_bytes), nested=("config",), skip=("rootfs",)
        )
    ]
    if len(image.layers) != len(pin.layers):
        lines.append(f"{len(image.layers)} layers, pinned {len(pin.layers)}")
    for index, ((layer, pinned_diff_id), built) in enumerate(zip(pin.layers, image.layers, strict=False)):
        if built.diff_id == pinned_diff_id:
            lines.append(f"layer {index} ({layer}): identical ({built.diff_id})")
            continue
        path = listing_path(pin.name, layer, directory)
        if not path.is_file():
            lines.append(
                f"layer {index} ({layer}): diffID {built.diff_id}, pinned {pinned_diff_id} ({path} missing)"
            )
            continue
        changes = diff_listings(
            parse_listing(gzip.decompress(path.read_bytes())), layer_listing(image, index, store)
        )
        lines.append(
            f"layer {index} ({layer}): diffID {built.diff_id}, pinned {pinned_diff_id}: "
            f"{len(changes)} path(s) differ (pinned → built)"
        )
        lines += [f"  {describe(change)}" for change in changes[:limit]]
        if len(changes) > limit:
            lines.append(f"  … and {len(changes) - limit} more")
    return lines
