"""One recipe type for every locally built base: its kind, its name, its Debian pins, its wheels, one time.

The demo, CPU vLLM and test bases differ in what they install into ``/opt/venv`` and in what their image
says about it, not in how they are built: the same Debian layer from pinned packages, the same venv steps
in the chroot, the same layer writer and config (`servimg.bases.demo`, `servimg.bases.assemble`). So a
`Recipe` is plain data, and the few real differences are a `Kind` value: names, labels, the history line
of the venv layer, the format number of the cache key, and, for the test bases, the wheel servimg builds
from source (`SourceWheel`, the strategy `servimg.bases.tiny` provides).

The cache key is the sha256 of a canonical JSON document; it is a label of every base image, so its
document must never change by accident (each change moves every pinned base digest in verify/bases).
`Recipe.key_document` spells out, per kind, exactly the document the kinds had when they were three
dataclasses; tests/test_recipe_keys.py pins each base's key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from servimg.bases.debian import DebianPins
from servimg.core import canonical
from servimg.core.digest import sha256_hex
from servimg.core.errors import BaseBuildError

# The one time that may reach a base's tree: 2026-01-01T00:00:00Z.
SOURCE_DATE_EPOCH = 1767225600


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel pinned by PyPI distribution name, version, file name and sha256."""

    name: str
    version: str
    sha256: str
    filename: str


class SourceWheel(Protocol):
    """A wheel servimg builds itself from sources it carries (the test bases' ``tinypkg``).

    Its bytes are an input of the base like a pinned wheel's, so their sha256 is part of the cache key;
    it is installed into the venv's site-packages from the host (the venv needs no pip for it).
    """

    @property
    def filename(self) -> str: ...

    def build(self) -> bytes:
        """The wheel, byte for byte the same on every run."""
        ...

    def install(self, wheel: Path, site: Path) -> list[str]:
        """Install the built wheel file into `site`; returns the installed paths relative to it."""
        ...


@dataclass(frozen=True)
class Kind:
    """What one kind of base is called, how its key document and image config are made, and the steps
    in which it differs from the others."""

    name: str  # demo, test: the label namespace io.servimg.<name>.*
    title: str  # org.opencontainers.image.title
    format: int  # bump when the build procedure changes this kind's output for the same recipe
    history: Callable[[Recipe], str]  # the venv layer's history line
    labels: Callable[[Recipe, str], Mapping[str, str]]  # labels beyond title and key, given python3.X
    python: str | None = None  # the interpreter its pinned wheels were chosen for; None: the suite's
    wheel_cache: str = "wheels"  # the pinned wheels' directory in the blob cache
    strict_bytecode: bool = True  # every .py in the venv must compile (False: log those that do not)
    source_wheel: SourceWheel | None = None  # installed instead of pip and pinned wheels

    @property
    def engine_name(self) -> str:
        """The engine repository its bases are tagged in."""
        return f"servimg/{self.name}-base"

    @property
    def layout_dir(self) -> str:
        """The directory of the blob cache holding one OCI layout per recipe key."""
        return f"{self.name}-base"


@dataclass(frozen=True)
class Recipe:
    """Every input of one locally built base, all pinned in the repository; equal recipes give identical
    trees. `name` names its pin files in verify/bases (demo, test-bookworm, test-trixie)."""

    kind: Kind
    name: str
    debian_pins: DebianPins
    wheels: tuple[PinnedWheel, ...] = ()
    source_date_epoch: int = SOURCE_DATE_EPOCH

    def __post_init__(self) -> None:
        if self.kind.source_wheel is not None and self.wheels:
            # Its venv has no pip, and its key document has no wheel list: pinned wheels would be ignored.
            raise BaseBuildError(f"a {self.kind.name} base installs only its source-built wheel, not pins")

    @property
    def suite(self) -> str:
        return self.debian_pins.suite

    @property
    def include(self) -> tuple[str, ...]:
        return self.debian_pins.include

    @property
    def variant(self) -> str:
        return self.debian_pins.variant

    def wheel(self, name: str) -> PinnedWheel:
        for wheel in self.wheels:
            if wheel.name == name:
                return wheel
        raise BaseBuildError(f"{name} is not pinned in the {self.name} recipe")

    def key_document(self) -> dict[str, object]:
        """What the cache key hashes: the format, the pins, the epoch and the wheels.

        Its shape per kind is fixed by the digests pinned in verify/bases: the kind and name are not in
        it (they are no input of the trees), a source-built wheel enters as the sha256 of its bytes
        (`wheel`) in place of the pinned wheel list.
        """
        recipe: dict[str, object] = {
            "debian_pins": dataclasses.asdict(self.debian_pins),
            "source_date_epoch": self.source_date_epoch,
        }
        doc: dict[str, object] = {"format": self.kind.format, "recipe": recipe}
        if self.kind.source_wheel is None:
            recipe["wheels"] = [dataclasses.asdict(w) for w in self.wheels]
        else:
            doc["wheel"] = sha256_hex(self.kind.source_wheel.build())
        return doc

    def cache_key(self) -> str:
        """sha256 hex of the canonical JSON of `key_document`: the base's cache key and recipe label."""
        if not self.debian_pins.packages:
            raise BaseBuildError(
                f"the {self.name} recipe has no Debian packages pinned",
                hint=f"pin them: servimg base {self.name} --repin",
            )
        return sha256_hex(canonical.dumps(self.key_document()))

    def tag(self) -> str:
        """Its engine tag: ``servimg/<kind>-base:<suite>-<key12>``."""
        return f"{self.kind.engine_name}:{self.suite}-{self.cache_key()[:12]}"
