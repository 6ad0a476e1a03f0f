"""Any locally built base as an image: two deterministic uncompressed layers under a canonical config.

No public container registry is reachable from CI, so the bases every test and the README job use are
made here (`base_image`, for any `Recipe`): the rootfs trees from `servimg.bases.demo.build_rootfs` become
two uncompressed layers (Debian; the venv) under the config every base shares (`base_config`; the kind
adds its labels and the venv layer's history line). Uncompressed layers keep the manifest digest
independent of zlib, and they are exactly what `docker save` gives back, so reading the base from the
engine reconstructs the same manifest digest the definition pins.
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from servimg.assembly.context import Context
from servimg.backends import layout
from servimg.backends.target import Holds, Target
from servimg.backends.transport import publish
from servimg.bases import pinned as basepin
from servimg.bases.debian import Clock
from servimg.bases.debpins import DebianPins
from servimg.bases.demo import VENV, build_rootfs, python_version
from servimg.bases.recipe import Recipe
from servimg.core.platform import Host
from servimg.oci.image import OCI_LAYER, Descriptor, Image, Layer
from servimg.oci.layer import entries_from_dir, write_layer
from servimg.oci.store import BlobStore


def venv_base_config(
    *,
    source_date_epoch: int,
    diff_ids: Sequence[str],
    labels: Mapping[str, str],
    history: Sequence[str],
    architecture: str = "amd64",
) -> dict[str, object]:
    """The config every locally built base shares: /opt/venv first on PATH, its python as Cmd, `created`
    and each history entry at SOURCE_DATE_EPOCH (never the build's clock)."""
    created = dt.datetime.fromtimestamp(source_date_epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "architecture": architecture,
        "os": "linux",
        "created": created,
        "config": {
            "Env": [
                f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8",
                f"VIRTUAL_ENV={VENV}",
            ],
            "Cmd": [f"{VENV}/bin/python"],
            "WorkingDir": "/",
            "Labels": dict(labels),
        },
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
        "history": [{"created": created, "created_by": step} for step in history],
    }


def debian_history(pins: DebianPins) -> str:
    """The history line of a Debian layer: what was bootstrapped, from which pinned closure."""
    return (
        f"mmdebstrap --variant={pins.variant} --include={','.join(pins.include)} {pins.suite} "
        f"({len(pins.packages)} pinned packages, pins sha256 {pins.key()})"
    )


def base_config(recipe: Recipe, python: str, diff_ids: Sequence[str]) -> dict[str, object]:
    """The config of a base built from `recipe` whose Debian tree has python`python`: the shared one, with
    the recipe key as ``io.servimg.<kind>.recipe`` and the kind's own labels and venv history line."""
    kind = recipe.kind
    return venv_base_config(
        source_date_epoch=recipe.source_date_epoch,
        diff_ids=diff_ids,
        labels={
            "org.opencontainers.image.title": kind.title,
            f"io.servimg.{kind.name}.recipe": recipe.cache_key(),
            **kind.labels(recipe, python),
        },
        history=[debian_history(recipe.debian_pins), kind.history(recipe)],
        architecture=recipe.arch,
    )


def image_from_trees(
    trees: Sequence[tuple[str, Path]],
    ctx: Context,
    *,
    mtime: int,
    prefix: str,
    config: Callable[[list[str]], Mapping[str, object]],
) -> Image:
    """One deterministic uncompressed layer per rootfs tree (in order), adopted into the store, under
    the config `config(diff_ids)` returns."""
    store, log = ctx.store, ctx.log
    layers = []
    for name, tree in trees:
        log(f"{prefix}: writing the {name} layer")
        dest = store.layout.tmp / f"{prefix}-{name}"
        dest.parent.mkdir(exist_ok=True)
        blob = write_layer(entries_from_dir(tree), dest, mtime=mtime)
        store.adopt(dest, blob.digest)
        layers.append(Layer(Descriptor(OCI_LAYER, blob.digest, blob.size), blob.diff_id))
        log(f"{prefix}: {name} layer {blob.size / 1e9:.2f} GB")
    return Image.create(config([str(layer.diff_id) for layer in layers]), layers)


def cached_base(
    cache: Path,
    ctx: Context,
    what: str,
    build: Callable[[Path], Image],
    *,
    tag: str,
    workdir: Path | None,
    pinned: tuple[str, str] | None = None,
) -> Image:
    """The base cached as an OCI layout at `cache` (keyed by its recipe), or `build(workdir)` it once:
    in a temp work dir that is always removed, and written to the cache only when complete.

    `pinned` is (base name, recipe key): the image, cached or new, must have the digest committed for
    that recipe in verify/bases (`basepin.check` explains a drift file by file); a drifted build is not
    cached.
    """
    store, log = ctx.store, ctx.log
    if (cache / "index.json").is_file():
        log(f"{what}: cached at {cache}")
        image = layout.read_layout(cache, store, link=True)  # the cache's own layout: never rewritten
        if pinned is not None:
            basepin.check(*pinned, image, ctx)
        return image
    work = Path(tempfile.mkdtemp(prefix="servimg-base-", dir=workdir))
    try:
        image = build(work)
        if pinned is not None:
            basepin.check(*pinned, image, ctx)
        layout.write_layout(image, cache, store, tag=tag, store_owned=True)
        return image
    finally:
        shutil.rmtree(work, ignore_errors=True)


def default_targets(host: Host) -> list[Target]:
    """Where a base goes when the command names no `--to`: the engine when one runs, else nowhere (it
    stays in the cache's OCI layout)."""
    return [Target.engine()] if host.engine else []


def publish_base(image: Image, tag: str, targets: Sequence[Target], ctx: Context) -> list[str]:
    """Publish a base to each target, tagged in the engine."""
    published = []
    for target in targets:
        # The engine finds a base by its tag; every other place is named by the target itself.
        named = tag if target.holds(Holds.RUNNABLE) else None
        published.append(publish(image, target, ctx, tag=named))
    return published


def layout_path(recipe: Recipe, store: BlobStore) -> Path:
    """Where the base of `recipe` is cached: one OCI layout per recipe key, tagged with its suite."""
    return store.layout.bases(recipe.kind.name) / recipe.cache_key()


def base_image(
    recipe: Recipe,
    ctx: Context,
    workdir: Path | None = None,
    *,
    clock: Clock | None = None,
    check_pin: bool = True,
) -> Image:
    """Build (or reuse from the cache) the base of any recipe as an OCI layout keyed by the recipe.

    With `check_pin`, the image must have the digest committed for the recipe's key in
    verify/bases/<name>.lock.json (a recipe with no pin there is only logged)."""
    store, log = ctx.store, ctx.log
    key = recipe.cache_key()
    what = f"{recipe.name} base"

    def build(work: Path) -> Image:
        log(f"{what}: mmdebstrap from pinned packages + {_installs(recipe)} (minutes on first run)")
        debian_dir, venv_dir = build_rootfs(
            recipe,
            work,
            store.layout.wheels(recipe.kind.wheel_cache),
            log,
            deb_cache=store.layout.debs,
            clock=clock,
        )
        python = python_version(debian_dir)
        log(f"{what} [4/4] image: one deterministic layer per tree, then the pinned-digest check")
        return image_from_trees(
            [("debian", debian_dir), ("venv", venv_dir)],
            ctx,
            mtime=recipe.source_date_epoch,
            prefix=f"{recipe.kind.name}-{key[:12]}",
            config=lambda diff_ids: base_config(recipe, python, diff_ids),
        )

    pinned = (recipe.name, key) if check_pin else None
    return cached_base(
        layout_path(recipe, store),
        ctx,
        what,
        build,
        tag=recipe.suite,
        workdir=workdir,
        pinned=pinned,
    )


def _installs(recipe: Recipe) -> str:
    source = recipe.kind.source_wheel
    return source.filename if source is not None else f"{len(recipe.wheels)} pinned wheel(s)"
