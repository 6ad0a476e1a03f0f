"""The pins of a Debian base (`verify/bases/<base>.debian.txt`): the exact package closure a base is built
from, read and checked (bases.debian builds from them; bases.debfetch fetches what they name).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from servimg.core.digest import sha256_hex
from servimg.core.errors import BaseBuildError

REPO_ROOT = Path(__file__).resolve().parents[3]
PIN_DIR = REPO_ROOT / "verify" / "bases"
ARCH = "amd64"  # the default architecture: a pin file without an `arch:` header pins amd64
_LINE = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9+.-]*)=(?P<version>\S+) (?P<arch>[a-z0-9-]+) (?P<priority>[a-z]+) "
    r"(?P<size>[0-9]+) sha256:(?P<sha>[0-9a-f]{64}) (?P<file>pool/\S+\.deb)$"
)
_HEADER_KEYS = ("suite", "mirror", "variant", "include", "release")
_OPTIONAL_HEADERS = ("arch",)  # written only when not ARCH, so amd64 pin files (and keys) keep their bytes


class DebianError(BaseBuildError):
    """A Debian base could not be built from its pins (tool missing, pins malformed, build failed)."""


class ArchiveMovedError(DebianError):
    """Pinned packages are no longer served by the archive (a point release replaced them)."""


# ---------------------------------------------------------------------------------------------- pins


@dataclass(frozen=True, order=True)
class DebPin:
    """One .deb pinned by name, version, architecture, archive priority, size, sha256 and pool path."""

    name: str
    version: str
    arch: str
    priority: str
    size: int
    sha256: str
    filename: str

    def line(self) -> str:
        return (
            f"{self.name}={self.version} {self.arch} {self.priority} {self.size} "
            f"sha256:{self.sha256} {self.filename}"
        )

    @property
    def cache_name(self) -> str:
        return f"{self.sha256}.deb"


@dataclass(frozen=True)
class DebianPins:
    """A pin file: what to bootstrap (suite, mirror, variant, includes) and the closure it resolved to."""

    suite: str
    mirror: str
    variant: str
    include: tuple[str, ...]
    release: str
    packages: tuple[DebPin, ...]
    arch: str = ARCH  # Debian's architecture name (amd64, arm64): mmdebstrap --arch, binary-<arch>

    @classmethod
    def parse(cls, text: str, origin: str = "<pins>") -> DebianPins:
        """Parse the pin file format (`render`); every malformed line is reported, then one error."""
        header: dict[str, str] = {}
        packages: list[DebPin] = []
        problems: list[str] = []
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition(": ")
            if sep and key in (*_HEADER_KEYS, *_OPTIONAL_HEADERS):
                if key in header:
                    problems.append(f"{origin}:{number}: {key} given twice")
                header[key] = value.strip()
                continue
            match = _LINE.match(line)
            if match is None:
                problems.append(
                    f"{origin}:{number}: not `name=version arch priority size sha256:<hex> pool/….deb`"
                )
                continue
            packages.append(
                DebPin(
                    match["name"],
                    match["version"],
                    match["arch"],
                    match["priority"],
                    int(match["size"]),
                    match["sha"],
                    match["file"],
                )
            )
        problems += [f"{origin}: missing `{k}: …` header" for k in _HEADER_KEYS if k not in header]
        names = [p.name for p in packages]
        problems += [
            f"{origin}: {n} pinned more than once" for n in sorted({n for n in names if names.count(n) > 1})
        ]
        if not packages:
            problems.append(f"{origin}: no packages pinned")
        arch = header.get("arch", ARCH)
        problems += [
            f"{origin}: {p.name} is pinned for {p.arch}, the file for {arch}"
            for p in packages
            if p.arch not in (arch, "all")
        ]
        if problems:
            raise DebianError(
                f"{origin}: malformed Debian pin file",
                problems=problems,
                hint="re-pin it deliberately with `servimg base <base> --repin`",
            )
        return cls(
            suite=header["suite"],
            mirror=header["mirror"],
            variant=header["variant"],
            include=tuple(header["include"].split()),
            release=header["release"],
            packages=tuple(sorted(packages)),
            arch=arch,
        )

    def render(self) -> str:
        """Canonical text: header, then one sorted line per package."""
        lines = [
            "# Debian packages pinned for one locally built base: the exact closure mmdebstrap installed,",
            "# with size and sha256 from the archive's (signed) Packages index. Builds install only these",
            "# files, from a local mirror. Change it only deliberately: servimg base <base> --repin",
            f"suite: {self.suite}",
            f"mirror: {self.mirror}",
            f"variant: {self.variant}",
            f"include: {' '.join(self.include)}",
            f"release: {self.release}",
        ]
        if self.arch != ARCH:
            lines.insert(lines.index(f"suite: {self.suite}"), f"arch: {self.arch}")
        lines += [p.line() for p in sorted(self.packages)]
        return "\n".join(lines) + "\n"

    def key_document(self) -> dict[str, object]:
        """The pins as the recipe cache key hashes them: an amd64 pin file without its (default) arch, so
        the keys of the bases pinned before arm64 existed do not move."""
        doc = dataclasses.asdict(self)
        if self.arch == ARCH:
            del doc["arch"]
        return doc

    def key(self) -> str:
        """sha256 hex of the canonical text (the recipe cache keys include it)."""
        return sha256_hex(self.render().encode())


def pin_path(base: str, directory: Path | None = None) -> Path:
    return (directory or PIN_DIR) / f"{base}.debian.txt"


def load_pins(base: str, directory: Path | None = None) -> DebianPins:
    path = pin_path(base, directory)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DebianError(
            f"cannot read the Debian pins {path}: {exc.strerror}",
            hint="run from a servimg checkout (verify/bases/), or re-pin with `servimg base <base> --repin`",
        ) from None
    return DebianPins.parse(text, str(path))
