"""The probe spec as typed values: what the in-image probe checks, made from a lock and its definition.

The image carries the spec as canonical JSON (`/opt/servimg/probe-spec.json`), and the probe, which
imports only the standard library, reads that JSON: `ProbeSpec.to_json()` is the contract, and its bytes
are part of every image digest, so a field here is named and valued exactly as the probe reads it.
`ProbeSpec.from_json` reads a spec back (an image's, or one this module wrote).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servimg.builder.lock import InterpreterLock

SPEC_VERSION = 1


def interpreter_json(interp: InterpreterLock) -> dict[str, Any]:
    """The locked interpreter as the spec carries it (the probe checks the image's against it)."""
    return {
        "path": interp.path,
        "resolved": interp.resolved,
        "version": interp.version,
        "magic": interp.magic,
        "cache_tag": interp.cache_tag,
        "opt_levels": list(interp.opt_levels),
        "pycache_prefix": interp.pycache_prefix,
    }


@dataclass(frozen=True)
class SpecModule:
    """A module an overlay patched: its final sha256 and the overlays that touched it, in order."""

    module: str
    path: str
    sha256: str | None
    site_packages: str
    package: str
    overlays: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "path": self.path,
            "sha256": self.sha256,
            "site_packages": self.site_packages,
            "package": self.package,
            "overlays": list(self.overlays),
        }


@dataclass(frozen=True)
class SpecSentinel:
    """A property of the code the interpreter will run; `base_has_sentinel`: the base's verdict (None:
    none known, which the probe fails for an `absent_in_base` sentinel)."""

    key: str
    module: str
    qualname: str
    name: str | None
    const: str | int | None
    absent_in_base: bool
    base_has_sentinel: bool | None
    overlay: str

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "module": self.module,
            "qualname": self.qualname,
            "name": self.name,
            "const": self.const,
            "absent_in_base": self.absent_in_base,
            "base_has_sentinel": self.base_has_sentinel,
            "overlay": self.overlay,
        }


@dataclass(frozen=True)
class SpecForbidden:
    module: str
    qualname: str
    name: str | None
    overlay: str

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "qualname": self.qualname, "name": self.name, "overlay": self.overlay}


@dataclass(frozen=True)
class SpecDistribution:
    """A locked distribution: its RECORD pin and the files overlays changed in it (path, final sha256)."""

    distribution: str
    version: str
    import_name: str
    dist_info: str
    record_sha256: str
    overlay_files: tuple[tuple[str, str | None], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "distribution": self.distribution,
            "version": self.version,
            "import_name": self.import_name,
            "dist_info": self.dist_info,
            "record_sha256": self.record_sha256,
            "overlay_files": [{"path": p, "post_sha256": s} for p, s in self.overlay_files],
        }


@dataclass(frozen=True)
class SpecPackage:
    import_name: str
    path: str
    overlay: bool

    def to_json(self) -> dict[str, Any]:
        return {"import_name": self.import_name, "path": self.path, "overlay": self.overlay}


@dataclass(frozen=True)
class SpecLayer:
    """LAYER (a built image's own spec): the changes manifest to check every added file against, and
    servimg's files (lock, definition) with their sha256."""

    changes: str
    files: tuple[tuple[str, str], ...]

    def to_json(self) -> dict[str, Any]:
        return {"changes": self.changes, "files": [{"path": p, "sha256": s} for p, s in self.files]}


@dataclass(frozen=True)
class ProbeSpec:
    image: str
    lock_digest: str
    entry: str  # module | script:PATH | command | none: how the service starts (sys.path[0])
    interpreter: InterpreterLock
    modules: tuple[SpecModule, ...]
    sentinels: tuple[SpecSentinel, ...]
    forbidden: tuple[SpecForbidden, ...]
    distributions: tuple[SpecDistribution, ...]
    packages: tuple[SpecPackage, ...]
    layer: SpecLayer | None = None
    spec_version: int = SPEC_VERSION

    def to_json(self) -> dict[str, Any]:
        """The spec as the probe reads it (the image carries its canonical bytes)."""
        return {
            **({"layer": self.layer.to_json()} if self.layer is not None else {}),
            "spec_version": self.spec_version,
            "image": self.image,
            "lock_digest": self.lock_digest,
            "entry": self.entry,
            "interpreter": interpreter_json(self.interpreter),
            "modules": [m.to_json() for m in self.modules],
            "sentinels": [s.to_json() for s in self.sentinels],
            "forbidden": [f.to_json() for f in self.forbidden],
            "distributions": [d.to_json() for d in self.distributions],
            "packages": [p.to_json() for p in self.packages],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ProbeSpec:
        """A spec as `to_json` writes it (KeyError/TypeError on another shape: the caller says whose)."""
        layer = doc.get("layer")
        return cls(
            image=doc["image"],
            lock_digest=doc["lock_digest"],
            entry=doc["entry"],
            interpreter=InterpreterLock(
                **{**doc["interpreter"], "opt_levels": tuple(doc["interpreter"]["opt_levels"])}
            ),
            modules=tuple(SpecModule(**{**m, "overlays": tuple(m["overlays"])}) for m in doc["modules"]),
            sentinels=tuple(SpecSentinel(**s) for s in doc["sentinels"]),
            forbidden=tuple(SpecForbidden(**f) for f in doc["forbidden"]),
            distributions=tuple(
                SpecDistribution(
                    **{
                        **d,
                        "overlay_files": tuple((f["path"], f["post_sha256"]) for f in d["overlay_files"]),
                    }
                )
                for d in doc["distributions"]
            ),
            packages=tuple(SpecPackage(**p) for p in doc["packages"]),
            layer=SpecLayer(layer["changes"], tuple((f["path"], f["sha256"]) for f in layer["files"]))
            if layer is not None
            else None,
            spec_version=doc["spec_version"],
        )
