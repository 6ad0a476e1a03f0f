"""Independent reads of a registry done a few at a time: each is a round trip, and a repository of
hundreds of tags, or an image with a dozen attestations, is read in the time of a few round trips
instead of the sum of them all (docs/benchmarks.md, "Issue 48"). Results keep the order of the inputs;
the first exception is raised, as a plain loop would raise it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Round trips in flight at once from one loop: enough to hide latency, few enough for any registry.
READS_IN_FLIGHT = 8


def map_ordered(fn: Callable[[T], R], items: Sequence[T], workers: int = READS_IN_FLIGHT) -> list[R]:
    """`[fn(x) for x in items]`, up to `workers` at a time."""
    if len(items) <= 1 or workers <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))
