"""What a base holds that a build needs: each package's installed distribution (dist-info, RECORD, site
dir), the service's interpreter and its facts (version, magic number, cache tag, the opt levels the base's
pycs carry), found without running anything but the image's own interpreter, once per base.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from servimg.assembly.context import Context
from servimg.cache import results
from servimg.core.digest import sha256_hex
from servimg.core.errors import BuildError, DefinitionError
from servimg.definitions.definition import ImageDefinition, Sentinel
from servimg.definitions.lock import (
    InterpreterLock,
    PackageLock,
)
from servimg.inimage import probe
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.oci.store import BlobStore
from servimg.patching import basefacts, bytecode
from servimg.patching.bytecode import (
    InterpreterFacts,
    Runner,
    base_opt_levels,
    compile_sources,
)
from servimg.proof import verify
from servimg.proof.sentinels import base_sentinel_verdicts_in_image

SERVIMG_DIR = "opt/servimg"


_SITE_DIRS = ("site-packages", "dist-packages")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _dist_infos(fs: LayeredFS, distribution: str) -> list[tuple[str, str, str]]:
    """Every `<site>/<dist>-<version>.dist-info` of `distribution`: (site, entry, version)."""
    found = []
    for site in _site_dirs(fs):
        for entry in fs.listdir(site):
            if not entry.endswith(".dist-info") or "-" not in entry.removesuffix(".dist-info"):
                continue
            name, found_version = entry.removesuffix(".dist-info").rsplit("-", 1)
            if _normalize(name) == _normalize(distribution):
                found.append((site, entry, found_version))
    return found


def _provides(fs: LayeredFS, site: str, import_name: str) -> bool:
    return fs.exists(f"{site}/{import_name}") or fs.exists(f"{site}/{import_name}.py")


def installed_versions(fs: LayeredFS, import_name: str, distribution: str) -> list[str]:
    """The versions of `distribution` installed in the image that provide `import_name` (sorted)."""
    return sorted({v for site, _, v in _dist_infos(fs, distribution) if _provides(fs, site, import_name)})


def find_package(fs: LayeredFS, import_name: str, distribution: str, version: str) -> PackageLock:
    """Locate `<site>/<dist>-<version>.dist-info` that provides `import_name` (PEP 376/427 layout)."""
    hits: list[tuple[str, str]] = []
    others: list[str] = []
    for site, entry, found_version in _dist_infos(fs, distribution):
        if found_version != version:
            others.append(f"/{site}/{entry}")
        elif _provides(fs, site, import_name):
            hits.append((site, entry))
    if len(hits) != 1:
        found = ", ".join(f"/{s}/{e}" for s, e in hits) or ", ".join(others) or "nothing"
        raise DefinitionError(
            f"package {import_name!r}: expected exactly one {distribution}=={version} providing it, "
            f"found {found}",
            hint="fix packages.<name>.distribution/version to match what the base installs",
        )
    site, dist_info = hits[0]
    record = fs.read_or_none(f"{site}/{dist_info}/RECORD") or b""
    return PackageLock(
        import_name, distribution, version, "/" + site, f"/{site}/{dist_info}", sha256_hex(record)
    )


def _site_dirs(fs: LayeredFS) -> list[str]:
    return fs.dirs_named(_SITE_DIRS)


def interpreter_lock(
    definition: ImageDefinition,
    fs: LayeredFS,
    base: Image,
    packages: tuple[PackageLock, ...],
    runner: Runner,
    ctx: Context,
) -> InterpreterLock:
    path = definition.python or guess_interpreter(fs, packages[0].site_packages if packages else None)
    node = fs.lstat(fs.resolve(path))
    if node is None or not (node.is_file or node.is_hardlink):
        raise BuildError(
            f"interpreter {path} not found in the base image",
            hint="set `python:` in the definition to the service's interpreter, e.g. /opt/venv/bin/python",
        )
    facts = interpreter_facts(base, path, runner, ctx)
    prefix = base.env.get("PYTHONPYCACHEPREFIX") or None
    dirs = [p.site_packages.lstrip("/") + "/" + p.import_name for p in packages]
    return InterpreterLock(
        path,
        "/" + fs.resolve(path),
        facts.version,
        facts.magic,
        facts.cache_tag,
        _base_opt_levels(ctx.store, base, fs, dirs, facts.cache_tag),
        prefix,
    )


def _base_opt_levels(
    store: BlobStore, base: Image, fs: LayeredFS, dirs: list[str], cache_tag: str
) -> tuple[int, ...]:
    """`base_opt_levels`, once per base (servimg.patching.basefacts): it lists every path in the packages."""
    key = {"diff_ids": [str(d) for d in base.diff_ids], "dirs": dirs, "cache_tag": cache_tag}
    return basefacts.remembered(
        store.root,
        "opt-levels",
        key,
        lambda: base_opt_levels(fs, dirs, cache_tag),
        code=(bytecode,),
        encode=list,
        decode=lambda levels: tuple(int(level) for level in levels),
    )


# The interpreter's facts (version, magic, cache tag) per (base diffIDs, path): a fact of the base alone.
INTERPRETER_FACTS = "interpreter"


def interpreter_facts(base: Image, path: str, runner: Runner, ctx: Context) -> InterpreterFacts:
    """Ask the image's interpreter for its version/magic/cache tag, once per (base layers, path): the
    layers are content-addressed, so the same diffIDs cannot hold a different interpreter."""
    store, log = ctx.store, ctx.log
    key = {"diff_ids": [str(d) for d in base.diff_ids], "path": path}
    cached = results.read(store.root, INTERPRETER_FACTS, key, per_base=True)
    with contextlib.suppress(TypeError):
        if isinstance(cached, dict):
            return InterpreterFacts(**cached)
    log(f"asking {path} for its version ({runner.name} runner)")
    facts, _ = compile_sources(runner, path, [])
    results.write(store.root, INTERPRETER_FACTS, key, dataclasses.asdict(facts))
    return facts


def guess_interpreter(fs: LayeredFS, site: str | None) -> str:
    """The interpreter that owns the packages' site dir: a venv's bin/python, else <prefix>/bin/pythonX.Y,
    else the system's pythonX.Y (the official vLLM image: /usr/bin/python3.12 with its packages in
    /usr/local/lib/python3.12/dist-packages), else /usr/bin/python3; the first that is in the image."""
    match = re.match(r"^(.*)/lib/(python3\.\d+)/(site|dist)-packages$", site or "")
    candidates = []
    if match:
        prefix, version = match.group(1), match.group(2)
        if fs.exists(f"{prefix}/pyvenv.cfg"):
            candidates.append(f"{prefix}/bin/python")
        candidates += [f"{prefix or '/usr'}/bin/{version}", f"/usr/bin/{version}"]
        candidates.append(f"/usr/local/bin/{version}")
    candidates.append("/usr/bin/python3")
    for path in dict.fromkeys(candidates):
        node = fs.lstat(fs.resolve(path))
        if node is not None and (node.is_file or node.is_hardlink):
            return path
    return candidates[0]


def providers(fs: LayeredFS, import_name: str) -> list[tuple[str, str, str]]:
    """Every installed distribution that provides `import_name` (its RECORD lists files under it):
    (distribution, version, site), sorted. What `servimg init` writes under `packages:`."""
    found = []
    for site in _site_dirs(fs):
        if not _provides(fs, site, import_name):
            continue
        for entry in fs.listdir(site):
            if not entry.endswith(".dist-info") or "-" not in entry.removesuffix(".dist-info"):
                continue
            record = fs.read_or_none(f"{site}/{entry}/RECORD") or b""
            rows = record.decode("utf-8", "replace").splitlines()
            if any(r.startswith((f"{import_name}/", f"{import_name}.py,")) for r in rows):
                name, version = entry.removesuffix(".dist-info").rsplit("-", 1)
                metadata = fs.read_or_none(f"{site}/{entry}/METADATA") or b""
                declared = re.search(rb"^Name: *(\S+)", metadata, re.MULTILINE)
                found.append((declared.group(1).decode() if declared else name, version, "/" + site))
    return sorted(found)


def sentinels_in_base(
    store: BlobStore,
    sources: Mapping[str, bytes],
    wanted: Sequence[Sentinel],
    runner: Runner,
    interpreter: InterpreterLock,
) -> dict[str, bool]:
    """Whether the base's code already holds each sentinel, answered by the image's own interpreter
    (`sentinels.base_sentinel_verdicts_in_image`: a base newer than the host compiles there), kept by the
    sources' sha256 and that interpreter (servimg.patching.basefacts): a module's bytes, the sentinel and
    the compiler decide it, and asking the image costs a run of it."""
    if not wanted:
        return {}
    key = {
        "interpreter": [interpreter.resolved, interpreter.version, interpreter.magic],
        "sources": {module: sha256_hex(data) for module, data in sorted(sources.items())},
        "sentinels": [dataclasses.asdict(s) for s in wanted],
    }
    return basefacts.remembered(
        store.root,
        "sentinels-in-base",
        key,
        lambda: base_sentinel_verdicts_in_image(runner, interpreter.path, sources, wanted),
        code=(verify, probe),
        decode=_verdict_map,
    )


def _verdict_map(value: Any) -> dict[str, bool]:
    if not isinstance(value, dict) or not all(isinstance(v, bool) for v in value.values()):
        raise TypeError("not a map of sentinel keys to booleans")
    return {str(k): v for k, v in value.items()}
