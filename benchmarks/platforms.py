"""Multi-platform builds (issue 32): a two-platform tiny build against one-platform builds, and the arm64
demo base under emulation.

    .venv/bin/python benchmarks/platforms.py --base-ref HOST/REPO:TAG --base-digest sha256:… [--runs 5]
        [--variants two-platform,amd64,arm64] [--checkout DIR] [--before DIR]
    .venv/bin/python benchmarks/platforms.py --demo-base [linux/arm64 | linux/amd64]

The first form builds images/tiny-multiarch.yaml on the two-platform test base index (`servimg base
test-bookworm --platform linux/amd64,linux/arm64 --to HOST/REPO` prints its ref and digest) three ways:
`base.platforms: [linux/amd64, linux/arm64]` (the index), `base.platform: linux/amd64` (native) and
`base.platform: linux/arm64` (every interpreter run under qemu). Each variant is locked once (untimed) in
a copy of the checkout; each timed run is `servimg build DEF --to oci:DIR` in a fresh process
(SERVIMG_SERVER=0) with an empty cache (SERVIMG_CACHE): the base is read from the registry, the overlay
compiled and the image probed, nothing replayed. The variants alternate, so drift on a shared machine hits
all of them; reported: each median, and the two-platform build's ratio to the amd64 one. `--checkout DIR`
runs another checkout's servimg (`python -m servimg` with DIR/src first on the path); `--before DIR` adds the
amd64 variant at that checkout (the commit before multi-platform builds existed: the "before" of a
one-platform build), alternating with the others in the same run.

`--demo-base` times the build `servimg base demo --platform linux/arm64` does, once, in-process, with the
arm64 demo base's layout removed from the cache (its pinned .debs and wheels stay: downloads are not what
is measured): mmdebstrap of the pinned arm64 packages (`--demo-base linux/amd64`: the native build, for
comparison), 179 wheels installed and every module compiled, all
under qemu, the two layers written and the digest checked against verify/bases/demo.arm64.lock.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from servimg.assembly.context import Context
from servimg.assembly.defaults import default_seams, probe_host
from servimg.bases.assemble import base_image, layout_path
from servimg.bases.catalog import pinned_recipe
from servimg.core.platform import Platform
from servimg.oci.store import BlobStore

REPO = Path(__file__).resolve().parent.parent
SERVIMG = [sys.executable, "-m", "servimg"]
VARIANTS = {
    "two-platform": {"platforms": ["linux/amd64", "linux/arm64"]},
    "amd64": {"platform": "linux/amd64"},
    "arm64": {"platform": "linux/arm64"},  # every interpreter run under qemu on an amd64 host
}


def run(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def tiny(args: argparse.Namespace) -> dict[str, object]:
    work = Path(tempfile.mkdtemp(prefix="bench-platforms-"))
    env = {**os.environ, "SERVIMG_SERVER": "0", "PYTHONPATH": str(args.checkout / "src")}
    chosen = {name: VARIANTS[name] for name in args.variants.split(",")}
    envs = dict.fromkeys(chosen, env)
    if args.before is not None:  # the one-platform build at another checkout, alternating with these
        chosen["amd64 (before)"] = VARIANTS["amd64"]
        envs["amd64 (before)"] = {**env, "PYTHONPATH": str(args.before / "src")}
    try:
        for part in ("images", "overlays"):
            shutil.copytree(REPO / part, work / part)
        definitions = {}
        for i, (name, base) in enumerate(chosen.items()):
            doc = yaml.safe_load((REPO / "images" / "tiny-multiarch.yaml").read_text())
            doc["base"] = {"ref": args.base_ref, "digest": args.base_digest, **base}
            path = work / "images" / f"variant{i}.yaml"
            path.write_text(yaml.safe_dump({**doc, "name": f"variant{i}"}, sort_keys=False))
            subprocess.run([*SERVIMG, "lock", str(path), "-q"], check=True, env=envs[name])
            definitions[name] = path
        times: dict[str, list[float]] = {name: [] for name in chosen}
        for n in range(args.runs):
            for name, path in definitions.items():
                cache = work / f"cache-{n}-{path.stem}"
                out = work / f"out-{n}-{path.stem}"
                argv = [*SERVIMG, "build", str(path), "--to", f"oci:{out}", "-q"]
                times[name].append(run(argv, {**envs[name], "SERVIMG_CACHE": str(cache)}))
                shutil.rmtree(cache, ignore_errors=True)
                shutil.rmtree(out, ignore_errors=True)
        medians = {name: statistics.median(t) for name, t in times.items()}
        result: dict[str, object] = {"checkout": str(args.checkout), "runs": args.runs, "seconds": times}
        result["median"] = medians
        if "two-platform" in medians and "amd64" in medians:
            result["two_platform_over_amd64"] = medians["two-platform"] / medians["amd64"]
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def demo_base(platform: Platform) -> dict[str, object]:
    """`servimg base demo --platform P`'s work, in-process: the base built from its pins (its cached
    layout removed first) and checked against its pinned digest; published nowhere."""
    recipe = pinned_recipe("demo", platform)
    store = BlobStore()
    shutil.rmtree(layout_path(recipe, store), ignore_errors=True)
    started = time.perf_counter()
    image = base_image(recipe, Context(store, print, seams=default_seams(probe_host())))
    seconds = time.perf_counter() - started
    return {"recipe": recipe.name, "platform": str(platform), "digest": str(image.digest), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-ref")
    parser.add_argument("--base-digest")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--demo-base", nargs="?", const="linux/arm64", default=None, metavar="PLATFORM")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--checkout", type=Path, default=REPO)
    parser.add_argument("--before", type=Path, default=None, help="a checkout whose amd64 build alternates")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not args.demo_base and not (args.base_ref and args.base_digest):
        parser.error("--base-ref and --base-digest (or --demo-base)")
    result = demo_base(Platform.parse(args.demo_base)) if args.demo_base else tiny(args)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
