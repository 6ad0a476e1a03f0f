"""The probe spec as typed values: what the in-image probe checks, made from a lock and its definition.

The image carries the spec as canonical JSON (`/opt/servimg/probe-spec.json`), and the probe, which
imports only the standard library, reads that JSON: `ProbeSpec.to_json()` is the contract, and its bytes
are part of every image digest, so a field here is named and valued exactly as the probe reads it.
`ProbeSpec.from_json` reads a spec back (an image's, or one this module wrote).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.definitions.lock import InterpreterLock

SPEC_VERSION = 1


def interpreter_json(interp: InterpreterLock) -> dict[str, object]:
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

    def to_json(self) -> dict[str, object]:
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

    def to_json(self) -> dict[str, object]:
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

    def to_json(self) -> dict[str, object]:
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

    def to_json(self) -> dict[str, object]:
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

    def to_json(self) -> dict[str, object]:
        return {"import_name": self.import_name, "path": self.path, "overlay": self.overlay}


@dataclass(frozen=True)
class SpecLayer:
    """LAYER (a built image's own spec): the changes manifest to check every added file against, and
    servimg's files (lock, definition) with their sha256."""

    changes: str
    files: tuple[tuple[str, str], ...]

    def to_json(self) -> dict[str, object]:
        return {"changes": self.changes, "files": [{"path": p, "sha256": s} for p, s in self.files]}


@dataclass(frozen=True)
class ProbeSpec:
    image: str
    lock_digest: Digest
    entry: str  # module | script:PATH | command | none: how the service starts (sys.path[0])
    interpreter: InterpreterLock
    modules: tuple[SpecModule, ...]
    sentinels: tuple[SpecSentinel, ...]
    forbidden: tuple[SpecForbidden, ...]
    distributions: tuple[SpecDistribution, ...]
    packages: tuple[SpecPackage, ...]
    layer: SpecLayer | None = None
    spec_version: int = SPEC_VERSION

    def to_json(self) -> dict[str, object]:
        """The spec as the probe reads it (the image carries its canonical bytes)."""
        return {
            **({"layer": self.layer.to_json()} if self.layer is not None else {}),
            "spec_version": self.spec_version,
            "image": self.image,
            "lock_digest": str(self.lock_digest),
            "entry": self.entry,
            "interpreter": interpreter_json(self.interpreter),
            "modules": [m.to_json() for m in self.modules],
            "sentinels": [s.to_json() for s in self.sentinels],
            "forbidden": [f.to_json() for f in self.forbidden],
            "distributions": [d.to_json() for d in self.distributions],
            "packages": [p.to_json() for p in self.packages],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> ProbeSpec:
        """A spec as `to_json` writes it; jsonview.JsonShapeError names the first key of another shape."""
        layer = doc.get("layer")
        return cls(
            image=jv.text(doc.get("image"), "image"),
            lock_digest=Digest.parse(jv.text(doc.get("lock_digest"), "lock_digest")),
            entry=jv.text(doc.get("entry"), "entry"),
            interpreter=_interpreter(jv.obj(doc.get("interpreter"), "interpreter")),
            modules=tuple(_module(m) for m in jv.objs(doc.get("modules"), "modules")),
            sentinels=tuple(_sentinel(x) for x in jv.objs(doc.get("sentinels"), "sentinels")),
            forbidden=tuple(_forbidden(f) for f in jv.objs(doc.get("forbidden"), "forbidden")),
            distributions=tuple(_distribution(d) for d in jv.objs(doc.get("distributions"), "distributions")),
            packages=tuple(_package(x) for x in jv.objs(doc.get("packages"), "packages")),
            layer=None if layer is None else _layer(jv.obj(layer, "layer")),
            spec_version=jv.integer(doc.get("spec_version"), "spec_version"),
        )


def _interpreter(d: Mapping[str, object]) -> InterpreterLock:
    return InterpreterLock(
        path=jv.text(d.get("path"), "interpreter.path"),
        resolved=jv.text(d.get("resolved"), "interpreter.resolved"),
        version=jv.text(d.get("version"), "interpreter.version"),
        magic=jv.text(d.get("magic"), "interpreter.magic"),
        cache_tag=jv.text(d.get("cache_tag"), "interpreter.cache_tag"),
        opt_levels=tuple(jv.integer(o, "interpreter.opt_levels[]") for o in jv.seq(d.get("opt_levels"))),
        pycache_prefix=jv.optional_text(d.get("pycache_prefix"), "interpreter.pycache_prefix"),
    )


def _module(m: Mapping[str, object]) -> SpecModule:
    return SpecModule(
        module=jv.text(m.get("module"), "modules[].module"),
        path=jv.text(m.get("path"), "modules[].path"),
        sha256=jv.optional_text(m.get("sha256"), "modules[].sha256"),
        site_packages=jv.text(m.get("site_packages"), "modules[].site_packages"),
        package=jv.text(m.get("package"), "modules[].package"),
        overlays=tuple(jv.texts(m.get("overlays"), "modules[].overlays")),
    )


def _sentinel(x: Mapping[str, object]) -> SpecSentinel:
    const = x.get("const")
    if not (const is None or isinstance(const, (str, int))):
        raise jv.JsonShapeError("sentinels[].const", "a string, an integer or null", const)
    base = x.get("base_has_sentinel")
    return SpecSentinel(
        key=jv.text(x.get("key"), "sentinels[].key"),
        module=jv.text(x.get("module"), "sentinels[].module"),
        qualname=jv.text(x.get("qualname"), "sentinels[].qualname"),
        name=jv.optional_text(x.get("name"), "sentinels[].name"),
        const=const,
        absent_in_base=jv.flag(x.get("absent_in_base"), "sentinels[].absent_in_base"),
        base_has_sentinel=None if base is None else jv.flag(base, "sentinels[].base_has_sentinel"),
        overlay=jv.text(x.get("overlay"), "sentinels[].overlay"),
    )


def _forbidden(f: Mapping[str, object]) -> SpecForbidden:
    return SpecForbidden(
        module=jv.text(f.get("module"), "forbidden[].module"),
        qualname=jv.text(f.get("qualname"), "forbidden[].qualname"),
        name=jv.optional_text(f.get("name"), "forbidden[].name"),
        overlay=jv.text(f.get("overlay"), "forbidden[].overlay"),
    )


def _distribution(d: Mapping[str, object]) -> SpecDistribution:
    files = jv.objs(d.get("overlay_files"), "distributions[].overlay_files")
    return SpecDistribution(
        distribution=jv.text(d.get("distribution"), "distributions[].distribution"),
        version=jv.text(d.get("version"), "distributions[].version"),
        import_name=jv.text(d.get("import_name"), "distributions[].import_name"),
        dist_info=jv.text(d.get("dist_info"), "distributions[].dist_info"),
        record_sha256=jv.text(d.get("record_sha256"), "distributions[].record_sha256"),
        overlay_files=tuple(
            (jv.text(f.get("path"), "overlay_files[].path"), jv.optional_text(f.get("post_sha256")))
            for f in files
        ),
    )


def _package(x: Mapping[str, object]) -> SpecPackage:
    return SpecPackage(
        import_name=jv.text(x.get("import_name"), "packages[].import_name"),
        path=jv.text(x.get("path"), "packages[].path"),
        overlay=jv.flag(x.get("overlay"), "packages[].overlay"),
    )


def _layer(layer: Mapping[str, object]) -> SpecLayer:
    files = jv.objs(layer.get("files"), "layer.files")
    return SpecLayer(
        jv.text(layer.get("changes"), "layer.changes"),
        tuple((jv.text(f.get("path"), "layer.files[].path"), jv.text(f.get("sha256"))) for f in files),
    )
