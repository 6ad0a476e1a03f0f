"""What lies where in servimg's cache, in one table: each section, the glob of its entries (the unit
`servimg cache prune` removes) and whether it can be made again. Pure: no I/O (servimg.cache.state
measures and prunes by this table; servimg.cache.hold keeps a running command's cache whole).

Every entry of every section can be made again from its inputs (a blob fetched or rebuilt from its
pins, a result computed again): pruning costs time, never correctness. Anything at the cache root that
no section names (a file of a newer servimg, a user's own file) is never touched.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servimg.core.digest import Digest


@dataclass(frozen=True)
class Section:
    """One kind of cached thing: `entries` globs its removable units below the cache root."""

    name: str
    entries: str
    what: str


# Ordered as `servimg cache status` lists them. A base layout's blobs are hard links to blobs/ (the
# cache's own layouts: servimg.backends.layout `store_owned`), so removing one name frees nothing while
# the other stays: servimg.cache.state counts bytes per inode and frees what the last name held.
SECTIONS: tuple[Section, ...] = (
    Section("blobs", "blobs/*/*", "image blobs by digest (layers, configs, manifests)"),
    Section("diffs", "diffs/*/*", "uncompressed copies of compressed layers, by diffID"),
    Section("bases", "*-base/*", "the built bases' OCI layouts, one per recipe key (rebuilt from pins)"),
    Section("rootfs", "rootfs/*/*", "warm root file systems of base layer chains"),
    Section("results", "results/*/*/*/*", "cached results: compiled bytecode, facts of a base"),
    Section("interpreters", "interpreters/*", "facts of a base's interpreter (before results/)"),
    Section("fs-index", "fs-index/*/*", "file indexes of layer chains"),
    Section("layer-index", "layer-index/*/*/*", "file indexes of single layers"),
    Section("engine", "engine/*", "which manifest an engine image ID was read as"),
    Section("models", "models/*", "the ladder's tiny model copies"),
    Section("debs", "debs/*", "pinned Debian packages, by sha256 (fetched again by pin)"),
    Section("wheels", "*wheels/*", "pinned wheels (fetched again by pin)"),
    Section("tmp", "tmp/*", "work in progress of running commands (stale once none runs)"),
)


# The format of the file indexes kept here (layer-index/, fs-index/), and of the key a layer chain's
# entries are filed under (fs-index/ and rootfs/): bumped whenever what an index holds or how it is
# read changes, so old indexes are then never read.
INDEX_FORMAT = "v1"


def chain_key(diff_ids: Sequence[Digest]) -> Digest:
    """The key a layer chain (its ordered diffIDs) is filed under in fs-index/ and rootfs/."""
    return Digest.of_bytes(json.dumps([INDEX_FORMAT, [str(d) for d in diff_ids]]).encode())


@dataclass(frozen=True)
class CacheLayout:
    """The paths of one cache root. `lock` is flocked shared by every running command and exclusively
    by a prune; `holds/` names the running commands (one flocked file per process)."""

    root: Path

    @property
    def lock(self) -> Path:
        return self.root / "lock"

    # Where each section lives (SECTIONS above globs their entries): every module asks here.
    @property
    def blobs(self) -> Path:
        return self.root / "blobs"

    @property
    def diffs(self) -> Path:
        return self.root / "diffs"

    @property
    def results(self) -> Path:
        return self.root / "results"

    @property
    def rootfs(self) -> Path:
        return self.root / "rootfs"

    @property
    def fs_index(self) -> Path:
        return self.root / "fs-index"

    @property
    def layer_index(self) -> Path:
        return self.root / "layer-index"

    @property
    def engine(self) -> Path:
        return self.root / "engine"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def debs(self) -> Path:
        return self.root / "debs"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def bases(self, kind: str) -> Path:
        """One base kind's layouts (`demo` → demo-base/, one layout per recipe key)."""
        return self.root / f"{kind}-base"

    def wheels(self, name: str = "wheels") -> Path:
        """A pinned-wheel directory (`Kind.wheel_cache`)."""
        return self.root / name

    @property
    def holds(self) -> Path:
        return self.root / "holds"


# SERVIMG_CACHE_MAX_SIZE: after each command, the cache is pruned (least recently used first) to this
# size when no other command holds it. Same syntax as `servimg cache prune --max-size`; `none` lifts the
# bound. Unset: DEFAULT_MAX_SIZE. Why 30 GiB: a whole CI run leaves 27.9 GiB (2026-12-06: the demo base,
# 8.2 GiB with its warm root, the seed-era base, 13.4 GiB, the test bases, wheels and packages); a third
# serving base is what least-recently-used pruning removes (README, "Set-up").
MAX_SIZE_ENV = "SERVIMG_CACHE_MAX_SIZE"
DEFAULT_MAX_SIZE = 30 << 30

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def max_size(environ: Mapping[str, str]) -> tuple[int | None, str]:
    """The cache's bound and where it comes from: SERVIMG_CACHE_MAX_SIZE (a size, or `none`: unbounded),
    else DEFAULT_MAX_SIZE. ValueError when the variable is not a size."""
    text = environ.get(MAX_SIZE_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_SIZE, f"the default; {MAX_SIZE_ENV} changes it"
    if text.lower() == "none":
        return None, f"{MAX_SIZE_ENV}=none"
    return parse_size(text), f"{MAX_SIZE_ENV}={text}"


def parse_size(text: str) -> int:
    """`20G`, `512M`, `1.5T`, `20GiB`, `1048576`: bytes (binary units). ValueError says what is accepted."""
    cleaned = text.strip().upper().removesuffix("IB").removesuffix("B")
    number, unit = cleaned, ""
    if cleaned and cleaned[-1] in _UNITS:
        number, unit = cleaned[:-1], cleaned[-1]
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size: write bytes or a number with K, M, G or T (20G)") from None
    if value < 0:
        raise ValueError(f"{text!r} is negative: a size is 0 or more")
    return int(value * _UNITS[unit])


def format_size(size: int) -> str:
    for unit in ("T", "G", "M", "K"):
        if size >= _UNITS[unit]:
            return f"{size / _UNITS[unit]:.1f} {unit}iB"
    return f"{size} B"
