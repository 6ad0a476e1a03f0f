"""A CycloneDX 1.6 (JSON) SBOM of an image, derived from the image alone, and its consistency check.

What is in it (docs/ecosystem.md "SBOM"):

- every Python distribution the image holds (`*.dist-info/METADATA` name and version, a `pkg:pypi` purl,
  the SHA-256 of its `RECORD`, which itself pins every installed file's hash);
- every Debian package the dpkg status database (`/var/lib/dpkg/status`) says is installed (`pkg:deb`
  purl with arch and distro);
- the service interpreter (from the lock: path, version, magic, cache tag) and the operating system
  (`/etc/os-release`);
- each patched distribution's overlays as `pedigree.patches`: `backport` when the overlay names upstream
  references (they become `resolves`), else `unofficial`; the diff by its repository path, its sha256 in
  the component's `io.servimg:overlay:<id>:patch-sha256` property.

Deterministic: the same image gives the same bytes (sorted components, canonical JSON, the lock's
SOURCE_DATE_EPOCH as the timestamp, a serial number derived from the image digest).
"""

from __future__ import annotations

import datetime as dt
import email.parser
import hashlib
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from servimg import __version__
from servimg.core import canonical, fixid
from servimg.core import jsonview as jv
from servimg.core.distname import canonical_name
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.oci.store import BlobStore
from servimg.statements import vex
from servimg.statements.derived import ImageFacts

SPEC_VERSION = "1.6"
SCHEMA = "http://cyclonedx.org/schema/bom-1.6.schema.json"
MEDIA_TYPE = "application/vnd.cyclonedx+json"
DPKG_STATUS = "var/lib/dpkg/status"
OS_RELEASE = ("etc/os-release", "usr/lib/os-release")
_NAMESPACE = uuid.UUID("5d1f9b0e-8f3e-4c55-9f25-5e7a1c2b7d15")  # servimg's: serial = uuid5(this, digest)
_OVERLAY_PROPERTY = re.compile(r"io\.servimg:overlay:([^:]+):patch-sha256")


def _purl_part(text: str) -> str:
    return quote(text, safe=".-_~")


def pypi_purl(name: str, version: str) -> str:
    return f"pkg:pypi/{_purl_part(canonical_name(name))}@{_purl_part(version)}"


@dataclass(frozen=True)
class Dist:
    """A Python distribution found in the image."""

    name: str
    version: str
    path: str  # the dist-info directory
    record_sha256: str | None


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str
    architecture: str
    source: str | None


def python_dists(fs: LayeredFS) -> list[Dist]:
    """Every `*.dist-info` directory with a METADATA file, anywhere in the image."""
    found: list[Dist] = []
    for node in fs.walk():
        if not (node.is_dir and node.path.endswith(".dist-info")):
            continue
        metadata = fs.read_or_none(f"{node.path}/METADATA")
        if metadata is None:
            continue
        headers = email.parser.BytesHeaderParser().parsebytes(metadata)
        name, version = headers.get("Name"), headers.get("Version")
        if not name or not version:
            continue
        record = fs.read_or_none(f"{node.path}/RECORD")
        digest = hashlib.sha256(record).hexdigest() if record is not None else None
        found.append(Dist(str(name).strip(), str(version).strip(), "/" + node.path, digest))
    return found


def _paragraphs(text: str) -> Iterator[dict[str, str]]:
    fields: dict[str, str] = {}
    key = None
    for line in [*text.splitlines(), ""]:
        if not line.strip():
            if fields:
                yield fields
            fields, key = {}, None
        elif line[0] in " \t" and key is not None:
            fields[key] += "\n" + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.strip()


def debian_packages(fs: LayeredFS) -> list[DebPackage]:
    """Installed packages (`Status: install ok installed`) from the dpkg status database."""
    data = fs.read_or_none(DPKG_STATUS)
    if data is None:
        return []
    packages = []
    for p in _paragraphs(data.decode("utf-8", "replace")):
        if p.get("Status", "").split()[-1:] != ["installed"] or not p.get("Package") or not p.get("Version"):
            continue
        source = p.get("Source", "").split(" ", 1)[0] or None
        packages.append(DebPackage(p["Package"], p["Version"], p.get("Architecture", "all"), source))
    return packages


def os_release(fs: LayeredFS) -> dict[str, str]:
    for path in OS_RELEASE:
        data = fs.read_or_none(path)
        if data is not None:
            pairs = (line.partition("=") for line in data.decode("utf-8", "replace").splitlines())
            return {k.strip(): v.strip().strip('"') for k, sep, v in pairs if sep}
    return {}


# ---------------------------------------------------------------------------------------------- the BOM


def _deb_component(pkg: DebPackage, distro: str | None) -> dict[str, object]:
    query = f"?arch={_purl_part(pkg.architecture)}" + (f"&distro={_purl_part(distro)}" if distro else "")
    purl = f"pkg:deb/debian/{_purl_part(pkg.name)}@{_purl_part(pkg.version)}{query}"
    component: dict[str, object] = {
        "type": "library",
        "bom-ref": purl,
        "name": pkg.name,
        "version": pkg.version,
        "purl": purl,
    }
    if pkg.source and pkg.source != pkg.name:
        component["properties"] = [{"name": "io.servimg:deb:source", "value": pkg.source}]
    return component


def _issue(ref: str) -> dict[str, object]:
    issue: dict[str, object] = {"type": "defect", "id": ref}
    if re.match(r"[a-z][a-z0-9+.-]*://", ref):
        issue["references"] = [ref]
    return issue


def _advisory_source(advisory: str) -> dict[str, str]:
    if advisory.startswith("GHSA-"):
        return {"name": "GitHub Advisory Database", "url": f"https://github.com/advisories/{advisory}"}
    return {"name": "NVD", "url": f"https://nvd.nist.gov/vuln/detail/{advisory}"}


def _patches(overlays: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """Each overlay as a pedigree patch; what it `resolves`: its upstream references (defects) and the
    fixes it declares (an advisory as a security issue: CycloneDX's VEX, with `vulnerabilities`)."""
    patches = []
    for overlay in overlays:
        upstream = [str(u) for u in jv.seq(overlay.get("upstream") or [])]
        fixes = [str(f) for f in jv.seq(overlay.get("fixes") or []) if str(f) not in upstream]
        patch: dict[str, object] = {
            "type": "backport" if upstream or fixes else "unofficial",
            "diff": {"url": str(overlay["patch"])},
        }
        resolves = [_issue(u) for u in upstream] + [
            {"type": "security", "id": f, "source": _advisory_source(f)}
            if fixid.is_advisory(f)
            else _issue(f)
            for f in fixes
        ]
        if resolves:
            patch["resolves"] = resolves
        patches.append(patch)
    return patches


def _vulnerabilities(facts: ImageFacts, refs: Mapping[str, str]) -> list[dict[str, object]]:
    """CycloneDX VEX: each advisory an overlay fixes, `resolved` in the component it patches (`refs`:
    import name → the distribution's bom-ref). Left out of the BOM when there is none."""
    out: list[dict[str, object]] = []
    for advisory in vex.advisories(facts):
        package = next(o.package for o in facts.lock.overlays if o.id == advisory.overlay)
        ref = refs.get(package)
        if ref is None:
            continue
        out.append(
            {
                "bom-ref": f"vex:{advisory.id}:{advisory.overlay}",
                "id": advisory.id,
                "source": _advisory_source(advisory.id),
                "analysis": {"state": "resolved", "detail": advisory.note()},
                "affects": [{"ref": ref}],
            }
        )
    return out


def _overlay_property(overlay_id: str) -> str:
    return f"io.servimg:overlay:{overlay_id}:patch-sha256"


def _overlays_by_package(facts: ImageFacts) -> dict[str, list[dict[str, object]]]:
    """Each locked overlay (id, patch path, sha256) with its definition's upstream refs, by import name."""
    declared = {
        str(o.get("id")): o for o in jv.seq(facts.definition.get("overlays") or []) if isinstance(o, dict)
    }
    by_package: dict[str, list[dict[str, object]]] = {}
    for overlay in facts.lock.overlays:
        upstream = declared.get(overlay.id, {}).get("upstream") or []
        entry = {
            "id": overlay.id,
            "patch": overlay.patch,
            "sha256": overlay.patch_sha256,
            "upstream": upstream,
            "fixes": list(overlay.fixes),
        }
        by_package.setdefault(overlay.package, []).append(entry)
    return by_package


def _dist_component(dist: Dist, overlays: Sequence[Mapping[str, object]]) -> dict[str, object]:
    purl = pypi_purl(dist.name, dist.version)
    component: dict[str, object] = {
        "type": "library",
        "bom-ref": f"{purl}#{dist.path}",  # one distribution may be installed in two places
        "name": dist.name,
        "version": dist.version,
        "purl": purl,
    }
    if dist.record_sha256:
        component["hashes"] = [{"alg": "SHA-256", "content": dist.record_sha256}]
    properties = [{"name": "io.servimg:dist-info", "value": dist.path}]
    if overlays:
        component["pedigree"] = {"patches": _patches(overlays)}
        properties += [{"name": _overlay_property(str(o["id"])), "value": str(o["sha256"])} for o in overlays]
    component["properties"] = properties
    return component


def _interpreter(facts: ImageFacts) -> dict[str, object]:
    interp = facts.lock.interpreter
    purl = f"pkg:generic/cpython@{_purl_part(interp.version)}"
    return {
        "type": "application",
        "bom-ref": f"{purl}#{interp.path}",
        "name": "cpython",
        "version": interp.version,
        "purl": purl,
        "properties": [
            {"name": "io.servimg:interpreter:path", "value": interp.path},
            {"name": "io.servimg:interpreter:resolved", "value": interp.resolved},
            {"name": "io.servimg:interpreter:magic", "value": interp.magic},
            {"name": "io.servimg:interpreter:cache-tag", "value": interp.cache_tag},
        ],
    }


def _operating_system(release: Mapping[str, str]) -> list[dict[str, object]]:
    if not release.get("ID"):
        return []
    version = release.get("VERSION_ID", "")
    component: dict[str, object] = {
        "type": "operating-system",
        "bom-ref": f"os:{release['ID']}",
        "name": release["ID"],
    }
    if version:
        component["version"] = version
    if release.get("PRETTY_NAME"):
        component["description"] = release["PRETTY_NAME"]
    return [component]


def _import_name(dist: Dist, facts: ImageFacts) -> str | None:
    for pkg in facts.lock.packages:
        if pkg.dist_info.rstrip("/") == dist.path.rstrip("/"):
            return pkg.import_name
    return None


def build_sbom(image: Image, facts: ImageFacts, fs: LayeredFS, name: str) -> dict[str, object]:
    """The SBOM document of `image` (whose merged filesystem is `fs`, whose own files are `facts`)."""
    release = os_release(fs)
    distro = (
        f"{release['ID']}-{release['VERSION_ID']}"
        if release.get("ID") and release.get("VERSION_ID")
        else None
    )
    overlays = _overlays_by_package(facts)
    components = [_interpreter(facts), *_operating_system(release)]
    patched: dict[str, str] = {}  # import name → the bom-ref of the distribution its overlays patch
    for dist in python_dists(fs):
        import_name = _import_name(dist, facts)
        component = _dist_component(dist, overlays.get(import_name, []) if import_name else [])
        if import_name in overlays:
            patched[str(import_name)] = str(component["bom-ref"])
        components.append(component)
    components += [_deb_component(p, distro) for p in debian_packages(fs)]
    components.sort(key=lambda c: (c["type"], c["bom-ref"]))
    created = dt.datetime.fromtimestamp(facts.lock.source_date_epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "$schema": SCHEMA,
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "serialNumber": f"urn:uuid:{uuid.uuid5(_NAMESPACE, str(image.digest))}",
        "version": 1,
        "metadata": {
            "timestamp": created,
            "tools": {"components": [{"type": "application", "name": "servimg", "version": __version__}]},
            "component": {
                "type": "container",
                "bom-ref": str(image.digest),
                "name": name,
                "version": str(image.digest),
                "hashes": [{"alg": "SHA-256", "content": image.digest.hex}],
            },
        },
        "components": components,
        **(
            {"vulnerabilities": vulnerabilities}
            if (vulnerabilities := _vulnerabilities(facts, patched))
            else {}
        ),
    }


def image_filesystem(image: Image, store: BlobStore) -> LayeredFS:
    """The merged filesystem of `image`, every layer uncompressed from `store` (verified by diffID)."""
    return LayeredFS.of_layers(image.layers, store)


def sbom_bytes(image: Image, facts: ImageFacts, store: BlobStore, name: str) -> bytes:
    return canonical.dumps(build_sbom(image, facts, image_filesystem(image, store), name))


# --------------------------------------------------------------------------------------------- checking


@dataclass(frozen=True)
class Summary:
    """What `servimg show` prints about an SBOM."""

    python: int
    debian: int
    patched: tuple[str, ...]  # "name version (overlay ids)"
    interpreter: str | None

    def line(self) -> str:
        patched = "; ".join(self.patched) or "none"
        return (
            f"{self.python} Python distributions, {self.debian} Debian packages, interpreter "
            f"{self.interpreter or '?'}; patched: {patched}"
        )


def _components(bom: Mapping[str, object]) -> list[Mapping[str, object]]:
    items = bom.get("components")
    return [c for c in items if isinstance(c, dict)] if isinstance(items, list) else []


def _overlay_ids(component: Mapping[str, object]) -> list[str]:
    props = jv.seq(component.get("properties") or [])
    return sorted(
        m.group(1)
        for p in props
        if isinstance(p, dict)
        for m in [_OVERLAY_PROPERTY.fullmatch(str(p.get("name")))]
        if m
    )


def summary(bom: Mapping[str, object]) -> Summary:
    components = _components(bom)
    purls = [str(c.get("purl", "")) for c in components]
    patched = tuple(
        f"{c.get('name')} {c.get('version')} ({', '.join(_overlay_ids(c))})"
        for c in components
        if jv.member(c, "pedigree", "patches")
    )
    interp = next((c for c in components if c.get("name") == "cpython"), None)
    return Summary(
        sum(p.startswith("pkg:pypi/") for p in purls),
        sum(p.startswith("pkg:deb/") for p in purls),
        patched,
        str(interp.get("version")) if interp else None,
    )


def problems(bom: Mapping[str, object], image: Image, facts: ImageFacts) -> list[str]:
    """Where the SBOM disagrees with the image it is attached to (its own lock): every problem."""
    found: list[str] = []
    if bom.get("bomFormat") != "CycloneDX" or bom.get("specVersion") != SPEC_VERSION:
        found.append(f"not a CycloneDX {SPEC_VERSION} BOM")
    about = jv.member(bom, "metadata", "component", "bom-ref")
    if about != str(image.digest):
        found.append(f"metadata.component is {about}, not this image ({image.digest})")
    components = _components(bom)
    by_path = {
        str(p.get("value")): c
        for c in components
        for p in jv.seq(c.get("properties") or [])
        if isinstance(p, dict) and p.get("name") == "io.servimg:dist-info"
    }
    overlays = _overlays_by_package(facts)
    for pkg in facts.lock.packages:
        component = by_path.get(pkg.dist_info)
        what = f"{pkg.distribution} {pkg.version}"
        if component is None:
            found.append(f"{what} ({pkg.dist_info}) is missing")
            continue
        if component.get("purl") != pypi_purl(pkg.distribution, pkg.version):
            found.append(f"{pkg.dist_info}: purl {component.get('purl')}, the lock says {what}")
        applied = overlays.get(pkg.import_name, [])
        wanted, listed = sorted(str(o["id"]) for o in applied), _overlay_ids(component)
        if listed != wanted:
            found.append(f"{what}: overlays {listed or 'none'}, the lock applies {wanted or 'none'}")
        patches = jv.seq(jv.member(component, "pedigree", "patches") or [])
        if len(patches) != len(wanted):
            found.append(f"{what}: {len(patches)} pedigree patches for {len(wanted)} overlays")
        props = {
            str(p.get("name")): p.get("value")
            for p in jv.seq(component.get("properties") or [])
            if isinstance(p, dict)
        }
        found += [
            f"{what}: overlay {o['id']} is not pinned to sha256 {o['sha256']}"
            for o in applied
            if props.get(_overlay_property(str(o["id"]))) != o["sha256"]
        ]
    interp = next((c for c in components if c.get("name") == "cpython"), None)
    if interp is None or interp.get("version") != facts.lock.interpreter.version:
        found.append(f"the interpreter is not cpython {facts.lock.interpreter.version}")
    return found
