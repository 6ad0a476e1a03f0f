"""The embedded default: the demo base image, built locally and bit-for-bit reproducibly.

No public container registry is reachable from CI, so the base every test and the README job use is
made here: the rootfs trees from `demo_base` become two deterministic, uncompressed layers (Debian; the
venv with vllm + lmcache) under a canonical config. Uncompressed layers keep the manifest digest
independent of zlib, and they are exactly what `docker save` gives back, so reading the base from the
engine reconstructs the same manifest digest the definition pins.
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from servimg.backends import layout
from servimg.demo_base import DemoRecipe, build_rootfs
from servimg.image import OCI_LAYER, Descriptor, Image, Layer
from servimg.layer import entries_from_dir, write_layer
from servimg.store import BlobStore
from servimg.transport import Target, publish

Log = Callable[[str], None]
DEMO_BASE_NAME = "servimg/demo-base"
VENV = "/opt/venv"


def demo_base_tag(recipe: DemoRecipe) -> str:
    return f"{DEMO_BASE_NAME}:{recipe.suite}-{recipe.cache_key()[:12]}"


def demo_base_config(recipe: DemoRecipe, diff_ids: Sequence[str]) -> dict[str, Any]:
    created = dt.datetime.fromtimestamp(recipe.source_date_epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    wheels = " ".join(f"{w.name}=={w.version}" for w in recipe.wheels)
    return {
        "architecture": "amd64",
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
            "Labels": {
                "org.opencontainers.image.title": "servimg demo base",
                "io.servimg.demo.recipe": recipe.cache_key(),
            },
        },
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
        "history": [
            {
                "created": created,
                "created_by": f"debootstrap --variant={recipe.variant} "
                f"--include={','.join(recipe.include)} {recipe.suite}",
            },
            {"created": created, "created_by": f"python3 -m venv {VENV} && pip install --no-deps {wheels}"},
        ],
    }


def demo_base_image(recipe: DemoRecipe, store: BlobStore, log: Log, workdir: Path | None = None) -> Image:
    """Build (or reuse from the cache) the demo base as an OCI layout keyed by the recipe."""
    cached = store.root / "demo-base" / recipe.cache_key()
    if (cached / "index.json").is_file():
        log(f"demo base: cached at {cached}")
        return layout.read_layout(cached, store)
    work = Path(tempfile.mkdtemp(prefix="servimg-demo-", dir=workdir))
    try:
        log("demo base: debootstrap + wheels (a few minutes on first run)")
        debian_dir, venv_dir = build_rootfs(recipe, work, store.root / "wheels", log)
        layers = []
        for name, tree in (("debian", debian_dir), ("venv", venv_dir)):
            log(f"demo base: writing the {name} layer")
            dest = store.root / "tmp" / f"demo-{name}-{recipe.cache_key()[:12]}"
            dest.parent.mkdir(exist_ok=True)
            blob = write_layer(entries_from_dir(tree), dest, mtime=recipe.source_date_epoch)
            store.adopt(dest, blob.digest)
            layers.append(Layer(Descriptor(OCI_LAYER, blob.digest, blob.size), blob.diff_id))
        image = Image.create(demo_base_config(recipe, [str(layer.diff_id) for layer in layers]), layers)
        layout.write_layout(image, cached, store, tag=recipe.suite)
        return image
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_demo_base(
    store: BlobStore,
    log: Log,
    *,
    targets: Sequence[str] | None = None,
    workdir: Path | None = None,
    recipe: DemoRecipe | None = None,
) -> dict[str, Any]:
    from servimg.backends import engine

    recipe = recipe or DemoRecipe()
    image = demo_base_image(recipe, store, log, workdir)
    tag = demo_base_tag(recipe)
    chosen = list(targets or (["docker"] if engine.engine_available() else []))
    published = []
    for text in chosen:
        target = Target.parse(text)
        published.append(publish(image, target, store, log, tag=tag if target.kind == "engine" else None))
    return {
        "digest": str(image.digest),
        "config_digest": str(image.config_digest),
        "tag": tag,
        "ref": f"docker-daemon:{tag}",
        "published": published,
        "layout": str(store.root / "demo-base" / recipe.cache_key()),
    }
