"""One base for several platforms: each built from its own pins, then one image index over them.

`servimg base test-bookworm --platform linux/amd64,linux/arm64` builds every platform's base exactly as a
single base is built (`catalog.pinned_recipe(name, platform)`: an architecture's own Debian pins, its
binaries run under qemu where the host differs, its digest pinned in verify/bases/NAME.ARCH.lock.json),
then writes the multi-platform index over them (`oci.index.ImageIndex`: canonical, so equal children give
the same index digest on every machine). The children go to the engine (tagged, one platform each, as
single bases do); the index to its cached OCI layout and to each registry or layout in `--to`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from servimg.assembly.context import Context
from servimg.backends import layout
from servimg.backends.target import Holds, Target
from servimg.backends.transport import publish
from servimg.bases.assemble import base_image, publish_base
from servimg.bases.catalog import pinned_recipe
from servimg.core.platform import Platform, texts
from servimg.oci.image import Image
from servimg.oci.index import ImageIndex, IndexedImages
from servimg.patching import emulation


def index_tag(suite: str, index: ImageIndex) -> str:
    """The index's tag: suite, architectures, index digest prefix (`bookworm-amd64-arm64-1a2b3c4d5e6f`)."""
    archs = "-".join(p.architecture for p in index.platforms)
    return f"{suite}-{archs}-{index.digest.hex[:12]}"


def build_platforms(
    name: str,
    platforms: Sequence[Platform],
    ctx: Context,
    *,
    targets: Sequence[Target],
    workdir: Path | None = None,
) -> dict[str, object]:
    """Build (or reuse) base `name` for each platform, check each pinned digest, and publish the children
    and the index over them; returns what a definition needs: the index digest and ref, and per platform
    the digest and engine tag."""
    store, log = ctx.store, ctx.log
    for platform in platforms:  # every emulator checked before the first (long) build starts
        emulation.require(platform, f"building the {name} base")
    children: dict[Platform, Image] = {}
    built: dict[str, object] = {}
    in_engine = [t for t in targets if t.holds(Holds.RUNNABLE)]
    recipes = {platform: pinned_recipe(name, platform) for platform in platforms}
    for platform, recipe in recipes.items():
        log(f"{name} base for {platform}" + (" (under qemu emulation)" if platform.emulated else ""))
        image = base_image(recipe, ctx, workdir)
        children[platform] = image
        published = publish_base(image, recipe.tag(), in_engine, ctx)
        built[str(platform)] = {
            "recipe": recipe.name,
            "digest": str(image.digest),
            "config_digest": str(image.config_digest),
            "tag": recipe.tag(),
            "ref": Target.engine_image(recipe.tag()).text(),
            "published": published,
        }
    index = ImageIndex.of(children)
    first = recipes[platforms[0]]  # every platform's recipe is of one kind and suite
    tag = index_tag(first.suite, index)
    cached = store.layout.bases(first.kind.name) / f"index-{index.digest.hex}"
    layout.write_index(
        index, [children[p] for p in index.platforms], cached, store, tag=tag, store_owned=True
    )
    log(f"{name} base index {index.digest.short}: {texts(index.platforms)}")
    published_index = [
        publish(IndexedImages(index, children), target, ctx, tag=tag)
        for target in targets
        if not target.holds(Holds.RUNNABLE)
    ]
    return {
        "base": name,
        "digest": str(index.digest),
        "tag": tag,
        "oci_ref": Target.layout(cached, tag).text(),
        "platforms": built,
        "published": published_index,
    }
