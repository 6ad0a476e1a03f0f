"""What proving bytes costs on the demo (docs/benchmarks.md, "Integrity: materialising a layout, re-hashing").

Sections (the demo base must be cached: `servimg base demo`; the demo image's blobs are read from the
blob store):

- materialise: each way of putting the demo image's layer blobs (≈4.5 GB) into a fresh directory on the
  cache's file system, N rounds interleaved: `hardlink` (what `--to oci:DIR` did before: one inode
  shared with the store), `copy` (`copy_file_range`, no hash), `copy+hash` (what it does now:
  `integrity.copy_verified`, the store's bytes hashed on the way out), `reflink` (FICLONE; reported as
  unsupported where the file system has none, e.g. ext4), and `hardlink+immutable` (a hard link, then
  `chattr +i`: what "a hard link made safe" would take; timed, and whether `rm -rf` of the directory
  still works is reported).
- rehash: re-hashing every layer blob once (`integrity.rehash`), what `verify`, `check` and a write into an
  existing layout now pay per blob they rely on.
- build: `servimg build images/demo.yaml --to oci:DIR` into a fresh layout and `servimg verify oci:DIR`,
  in-process (SERVIMG_SERVER=0), every result cache off (SERVIMG_NO_RESULT_CACHE=1), with the checkout
  given by `--repo` (run it once with a worktree of the commit before the change, once with this one).

Usage:
    .venv/bin/python benchmarks/integrity.py --runs 3 [--sections materialise,rehash,build] [--repo DIR]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from servimg.backends import layout  # noqa: E402
from servimg.core.digest import Digest  # noqa: E402
from servimg.oci import integrity  # noqa: E402
from servimg.oci.store import BlobStore  # noqa: E402


def demo_blobs(store: BlobStore) -> list[tuple[Digest, Path]]:
    """The demo base's layer blobs, from its cached layout (the cache's own: read without copying)."""
    caches = sorted((store.root / "demo-base").glob("*/index.json"))
    if not caches:
        raise SystemExit("the demo base is not cached: run `servimg base demo` first")
    image = layout.read_layout(caches[-1].parent, store, link=True)
    return [(d.digest, store.path(d.digest)) for d in image.layer_descriptors]


def _copy_file_range(src: Path, dest: Path) -> None:
    with src.open("rb") as fin, dest.open("wb") as fout:
        left = src.stat().st_size
        while left:
            left -= os.copy_file_range(fin.fileno(), fout.fileno(), left)


def _reflink(src: Path, dest: Path) -> None:
    with src.open("rb") as fin, dest.open("wb") as fout:
        fcntl.ioctl(fout.fileno(), integrity.FICLONE, fin.fileno())


def _immutable_link(src: Path, dest: Path) -> None:
    os.link(src, dest)
    subprocess.run(["chattr", "+i", str(dest)], check=True)


METHODS: dict[str, Callable[[Path, Path], object]] = {
    "hardlink": lambda src, dest: os.link(src, dest),
    "copy": _copy_file_range,
    "copy+hash": lambda src, dest: integrity.copy_verified(src, dest, Digest("sha256", src.name)),
    "reflink": _reflink,
    "hardlink+immutable": _immutable_link,
}


def materialise(store: BlobStore, blobs: list[tuple[Digest, Path]], runs: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    notes: dict[str, str] = {}
    for _ in range(runs):
        for name, method in METHODS.items():
            if name in notes and notes[name].startswith("unsupported"):
                continue
            out = Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=store.root / "tmp"))
            try:
                start = time.perf_counter()
                for digest, path in blobs:
                    method(path, out / digest.hex)
                os.sync()  # the copies' writeback is part of their cost
                times[name].append(time.perf_counter() - start)
            except OSError as exc:
                notes[name] = f"unsupported here: {errno.errorcode.get(exc.errno or 0, exc.errno)} ({exc})"
            finally:
                if name == "hardlink+immutable":
                    removed = subprocess.run(["rm", "-rf", str(out)], capture_output=True, text=True)
                    notes[name] = (
                        "rm -rf "
                        + ("succeeds" if removed.returncode == 0 else "fails: ")
                        + (removed.stderr.strip().splitlines()[0] if removed.stderr.strip() else "")
                    )
                    subprocess.run(["chattr", "-R", "-i", str(out)], capture_output=True)
                shutil.rmtree(out, ignore_errors=True)
    return {
        "bytes": sum(p.stat().st_size for _, p in blobs),
        "median_s": {m: statistics.median(v) for m, v in times.items() if v},
        "all_s": times,
        "notes": notes,
    }


def rehash_all(blobs: list[tuple[Digest, Path]], runs: int) -> dict[str, Any]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for digest, path in blobs:
            assert integrity.rehash(path)[0] == digest
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "all_s": times}


def build_and_verify(repo: Path, runs: int) -> dict[str, Any]:
    builds, verifies, digests = [], [], set()
    for i in range(runs):
        out = Path(tempfile.mkdtemp(prefix="bench-layout-"))
        try:
            seconds, built = _servimg(repo, "build", "images/demo.yaml", "--to", f"oci:{out / 'demo'}")
            builds.append(seconds)
            digests.add(built["digest"])
            verifies.append(_servimg(repo, "verify", f"oci:{out / 'demo'}")[0])
        finally:
            shutil.rmtree(out, ignore_errors=True)
        print(f"  round {i + 1}: build {builds[-1]:.2f} s, verify {verifies[-1]:.2f} s", flush=True)
    return {
        "repo": str(repo),
        "build_median_s": statistics.median(builds),
        "verify_median_s": statistics.median(verifies),
        "build_all_s": builds,
        "verify_all_s": verifies,
        "digests": sorted(digests),
    }


def _servimg(repo: Path, *argv: str) -> tuple[float, dict[str, Any]]:
    """One command of the checkout `repo`, in-process (no resident server), every result cache off:
    its wall time and its --json line."""
    env = {
        **os.environ,
        "SERVIMG_SERVER": "0",
        "SERVIMG_NO_RESULT_CACHE": "1",
        "PYTHONPATH": str(repo / "src"),
    }
    python = str(REPO / ".venv" / "bin" / "python")
    start = time.perf_counter()
    proc = subprocess.run(
        [python, "-m", "servimg", *argv, "--json", "--quiet"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return seconds, dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sections", default="materialise,rehash,build")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose servimg builds (build)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    store = BlobStore()
    (store.root / "tmp").mkdir(exist_ok=True)
    blobs = demo_blobs(store)
    result: dict[str, Any] = {"runs": args.runs}
    sections = args.sections.split(",")
    if "materialise" in sections:
        result["materialise"] = materialise(store, blobs, args.runs)
        print(json.dumps(result["materialise"]["median_s"]), result["materialise"]["notes"], flush=True)
    if "rehash" in sections:
        result["rehash"] = rehash_all(blobs, args.runs)
        print("rehash", result["rehash"]["median_s"], flush=True)
    if "build" in sections:
        result["build"] = build_and_verify(args.repo.resolve(), args.runs)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
