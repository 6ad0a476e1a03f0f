"""What knowing and bounding the cache costs (docs/benchmarks.md, "The cache: status, prune, holds").

Sections:

- hold: one command's hold on its cache (`cachehold.held`: mkdir, open, shared flock, its holds/ file,
  unlink), entered and left N times; the per-command price every command now pays.
- status: `cachestate.usage` over the cache (every entry stat'ed once, hard links counted once) against
  `du -sb` of the same directory (what a user had before `servimg cache status`).
- plan: `cachestate.prune(..., dry_run=True)` to half the cache's size (scan + grouping + LRU order;
  nothing removed).
- prune: a copy of the cache's blobs/ (hard-linked, so nothing is read) pruned to nothing, N rounds.

Usage:
    .venv/bin/python benchmarks/cache.py [--cache DIR] [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servimg.cache import hold as cachehold
from servimg.cache import state as cachestate
from servimg.cache.location import default_cache_dir


def _timed(run: Callable[[], object], runs: int) -> dict[str, float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def hold(cache: Path, runs: int) -> dict[str, Any]:
    def once() -> None:
        with cachehold.held(cache):
            pass

    result = _timed(once, runs * 200)
    return {**result, "what": "one command's hold (enter + leave)"}


def status(cache: Path, runs: int) -> dict[str, Any]:
    usage = cachestate.usage(cache)
    return {
        "usage": _timed(lambda: cachestate.usage(cache), runs),
        "du": _timed(lambda: subprocess.run(["du", "-sb", str(cache)], capture_output=True), runs),
        "entries": usage.entries,
        "bytes": usage.size,
    }


def plan(cache: Path, runs: int) -> dict[str, Any]:
    half = cachestate.usage(cache).size // 2
    return _timed(lambda: cachestate.prune(cache, half, dry_run=True), runs)


def prune(cache: Path, runs: int) -> dict[str, Any]:
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(dir=cache.parent) as scratch:
            copy = Path(scratch) / "cache"
            (copy / "blobs").mkdir(parents=True)
            subprocess.run(["cp", "-al", str(cache / "blobs" / "sha256"), str(copy / "blobs")], check=True)
            started = time.perf_counter()
            with cachehold.exclusive(copy):
                cachestate.prune(copy, 0)
            times.append(time.perf_counter() - started)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=default_cache_dir())
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = {
        "cache": str(args.cache),
        "hold": hold(args.cache, args.runs),
        "status": status(args.cache, args.runs),
        "plan": plan(args.cache, args.runs),
        "prune": prune(args.cache, args.runs),
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
