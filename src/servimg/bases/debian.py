"""Debian root filesystems made from pinned packages only: a pure function of the pin file and one epoch.

Why: a base built by ``debootstrap`` straight from the archive is a function of the archive's state on the
build day and of the build host's clock. The archive replaces packages in place at every point release, and
``/etc/shadow`` recorded the build *day* (``root:*:20788:…``), so the pinned demo base stopped reproducing
the day after it was pinned (docs/reproducibility.md lists every such file and what neutralises it).

The inputs are, all of them, in the repository:

``verify/bases/<base>.debian.txt``
    The exact package closure (name, version, architecture, archive priority, size, sha256, pool path) that
    ``mmdebstrap --variant=<variant> --include=<…> <suite>`` installed when it was last pinned, captured
    from the archive's Packages index (apt verified the index against the suite's signed InRelease). A
    re-pin (`resolve_pins`, ``servimg base <base> --repin``) is the only way this file changes.
the recipe's ``source_date_epoch``
    The one time that may reach the tree.

How (`build_rootfs`), in order, stopping at the first failure with nothing left behind:

1. Every pinned ``.deb`` is taken from the content-addressed cache (``<cache>/debs/<sha256>.deb``) or
   downloaded from ``<mirror>/<pool path>`` and checked against its pinned size and sha256 before anything
   is installed. When pinned files are gone from the archive (a point release replaced them), the build
   stops before it starts and names each moved package with the version the archive serves now.
2. A local file mirror (``dists/<suite>/…/Packages`` + ``Release``) holding exactly the pinned files is
   written under ``/tmp``; its stanzas are the packages' own control fields plus the archive priority.
   The mirror is the whole universe apt may resolve in, so it cannot pick anything that is not pinned.
3. ``mmdebstrap`` (Debian's reproducible bootstrapper: SOURCE_DATE_EPOCH, hooks) installs from that
   mirror with a clean environment (PATH, HOME=/root, LC_ALL=C, TZ=UTC, umask 022, cwd /) and
   SOURCE_DATE_EPOCH, so maintainer scripts write the epoch's day into ``/etc/shadow`` and Python's
   ``py_compile`` writes checked-hash pycs that do not depend on file times.
4. The installed set (``var/lib/dpkg/status``) must equal the pin set exactly.
5. `neutralise`: what is still host- or time-dependent is replaced by fixed content (sources.list names the
   real archive, not the temp mirror; hostname; resolv.conf; machine-id; shadow day fields) and every
   mtime later than the epoch is clamped to it.

A `Clock` seam lets tests build under another clock: `FaketimeClock` preloads libfaketime into every
process that writes the tree, including those inside the chroot (LD_PRELOAD does not follow into a chroot
that lacks the library, so the library is staged inside the tree for the build and removed after).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from servimg.bases.debfetch import fetch_debs, parse_stanzas
from servimg.bases.debpins import (
    DebianError,
    DebianPins,
    DebPin,
)
from servimg.core.context import Log
from servimg.core.digest import Digest, sha256_hex

HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
UMASK = 0o022
AUTOMOUNT_HOOK = "/usr/share/mmdebstrap/hooks/file-mirror-automount"


# ---------------------------------------------------------------------------------------------- clock


class Clock(Protocol):
    """What every process that writes the tree sees as the time (the real clock unless a test shifts it)."""

    def env(self, preload: str | None = None) -> Mapping[str, str]:
        """Environment for a build process; `preload` is where the preload library is (default: its host
        path, which mmdebstrap's hooks mirror inside the chroot)."""
        ...

    def library(self) -> str | None:
        """The host path of a library that must be preloaded in every process, or None."""
        ...


class SystemClock:
    """The host's clock, untouched."""

    def env(self, preload: str | None = None) -> Mapping[str, str]:
        return {}

    def library(self) -> str | None:
        return None


@dataclass(frozen=True)
class FaketimeClock:
    """libfaketime (Debian `faketime`) with a FAKETIME spec such as "+17d" or "@2027-03-01 12:00:00".

    NO_FAKE_STAT: a host on another day reads the same file times from stat(); with faked stat results,
    dpkg would copy shifted times onto symlinks, a difference no real clock can cause.

    FAKETIME_SHARED: libfaketime keeps a semaphore and shared memory per process tree; the process that
    created them removes them at exit, and so does every fork of it (perl's, mmdebstrap's), after which
    processes started later fail to start (measured twice: dpkg-deb during extraction, `sem_open failed`).
    So no build process may create them: every host-side build process is handed one segment that lives
    as long as this process — its own when it runs under libfaketime itself, else one held by a small
    owner process (`_held_segment`).
    """

    spec: str
    path: str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

    def env(self, preload: str | None = None) -> Mapping[str, str]:
        if not Path(self.path).is_file():
            raise DebianError(f"{self.path} is missing", hint="apt-get install faketime")
        env = {
            "LD_PRELOAD": preload or self.path,
            "FAKETIME": self.spec,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "NO_FAKE_STAT": "1",
        }
        # Inside a chroot (`preload` given) /dev/shm is the tree's own tmpfs: the host's segment is not
        # there, so those processes make their own (chroot_clock).
        if preload is None:
            env["FAKETIME_SHARED"] = os.environ.get("FAKETIME_SHARED") or _held_segment(self.path, self.spec)
        return env

    def library(self) -> str | None:
        return self.path


# The owner prints the segment libfaketime made for it, then holds it while its parent (this process)
# lives; a builder killed with SIGKILL does not leave it running.
_OWNER_SCRIPT = 'printf "%s\\n" "$FAKETIME_SHARED"; while kill -0 "$PPID" 2>/dev/null; do sleep 1; done'


@functools.cache
def _held_segment(library: str, spec: str) -> str:
    """FAKETIME_SHARED ("SEM SHM") of a segment held by an owner process until this process exits."""
    env = {"PATH": HOST_PATH, "LD_PRELOAD": library, "FAKETIME": spec, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    owner = subprocess.Popen(
        [tool("sh"), "-c", _OWNER_SCRIPT], env=env, stdout=subprocess.PIPE, text=True, cwd="/"
    )
    assert owner.stdout is not None
    shared = owner.stdout.readline().strip()
    if len(shared.split()) != 2:
        owner.kill()
        owner.wait()
        raise DebianError(
            f"libfaketime ({library}) made no shared segment for its owner process",
            hint="check that `faketime` works here: LD_PRELOAD=... FAKETIME=+1d date",
        )
    atexit.register(_release_segment, owner, shared)
    return shared


def _release_segment(owner: subprocess.Popen[str], shared: str) -> None:
    owner.kill()
    owner.wait()
    sem, shm = shared.split()  # "/faketime_sem_N /faketime_shm_N": sem.* and * under /dev/shm
    Path("/dev/shm", "sem." + sem.lstrip("/")).unlink(missing_ok=True)
    Path("/dev/shm", shm.lstrip("/")).unlink(missing_ok=True)


_CHROOT_CLOCK_DIR = "tmp/.servimg-clock"


@contextlib.contextmanager
def chroot_clock(rootfs: Path, clock: Clock) -> Iterator[Mapping[str, str]]:
    """The clock's environment for a process inside `rootfs`, its library staged under the tree's /tmp
    for the body (LD_PRELOAD does not follow into a chroot that lacks the library) and removed after."""
    library = clock.library()
    if library is None:
        yield clock.env()
        return
    staged_dir = rootfs / _CHROOT_CLOCK_DIR
    staged_dir.mkdir(parents=True)
    shm = rootfs / "dev/shm"
    # libfaketime creates and removes its shared memory in /dev/shm of every process it starts in; a
    # tmpfs there (as a container runtime mounts) keeps that out of the tree.
    mounted = (
        shm.is_dir()
        and subprocess.run(
            [tool("mount"), "-t", "tmpfs", "-o", "mode=0755", "servimg-shm", str(shm)], capture_output=True
        ).returncode
        == 0
    )
    try:
        shutil.copy2(library, staged_dir / os.path.basename(library))
        yield clock.env(preload=f"/{_CHROOT_CLOCK_DIR}/{os.path.basename(library)}")
    finally:
        shutil.rmtree(staged_dir, ignore_errors=True)
        if mounted:
            unmount_under(shm)


def _stage_hooks(clock: Clock) -> list[str]:
    """mmdebstrap hooks that put the clock's library at its host path inside the chroot (setup: before
    any chroot process runs) and remove it again (customize: before the tree is cleaned up)."""
    library = clock.library()
    if library is None:
        return []
    rel = library.lstrip("/")
    parent = os.path.dirname(rel)
    return [
        f'--setup-hook=mkdir -p "$1/{parent}" && cp -p {library} "$1/{rel}"',
        f'--customize-hook=rm -f "$1/{rel}" && rmdir --ignore-fail-on-non-empty "$1/{parent}"',
    ]


# ---------------------------------------------------------------------------------------------- mirror


@contextlib.contextmanager
def local_mirror(pins: DebianPins, debs: Mapping[DebPin, Path]) -> Iterator[str]:
    """A file mirror under /tmp holding exactly the pinned files; yields its sources.list line.

    Under /tmp on purpose, never $TMPDIR: mmdebstrap's automount hook makes the path visible inside the
    chroot, and mmdebstrap empties the chroot's /tmp at the end, so no host path stays in the tree.
    """
    root = Path(tempfile.mkdtemp(prefix="servimg-debian-mirror-", dir="/tmp"))
    try:
        root.chmod(0o755)
        pool = root / "pool"
        pool.mkdir()
        stanzas = []
        for pin in sorted(pins.packages):
            dest = pool / f"{pin.name}_{pin.sha256[:16]}.deb"
            _link_or_copy(debs[pin], dest)
            stanzas.append(_stanza(pin, dest, f"pool/{dest.name}"))
        index = root / "dists" / pins.suite / "main" / f"binary-{pins.arch}"
        index.mkdir(parents=True)
        packages = "\n".join(stanzas).encode()
        (index / "Packages").write_bytes(packages)
        release = (
            f"Suite: {pins.suite}\nCodename: {pins.suite}\nArchitectures: {pins.arch}\nComponents: main\n"
            f"Description: servimg local mirror of pinned packages\nSHA256:\n"
            f" {sha256_hex(packages)} {len(packages)} main/binary-{pins.arch}/Packages\n"
        )
        (root / "dists" / pins.suite / "Release").write_text(release, encoding="utf-8")
        yield f"deb [trusted=yes] file://{root} {pins.suite} main"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def _stanza(pin: DebPin, deb: Path, filename: str) -> str:
    """The package's own control stanza with the archive's priority, Filename, Size and SHA256."""
    proc = subprocess.run(
        [tool("dpkg-deb"), "--field", str(deb)], capture_output=True, text=True, check=False, env=_env()
    )
    if proc.returncode != 0:
        raise DebianError(f"dpkg-deb cannot read {pin.name}={pin.version}", problems=_tail(proc.stderr))
    lines = [line for line in proc.stdout.rstrip("\n").splitlines() if not line.startswith("Priority:")]
    control = dict(parse_stanzas("\n".join(lines)).__next__())
    if (control.get("Package"), control.get("Version")) != (pin.name, pin.version):
        raise DebianError(f"{deb} is {control.get('Package')}={control.get('Version')}, pinned {pin.name}")
    lines += [
        f"Priority: {pin.priority}",
        f"Filename: {filename}",
        f"Size: {pin.size}",
        f"SHA256: {pin.sha256}",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- build


@dataclass(frozen=True)
class BuildOptions:
    """How a rootfs is made from pins. `neutralise=False` exists for the test that proves the clamps
    matter (a shifted clock must then change the tree); never for a real base."""

    epoch: int
    clock: Clock = dataclasses.field(default_factory=SystemClock)
    neutralise: bool = True


def build_rootfs(pins: DebianPins, rootfs: Path, cache_dir: Path, options: BuildOptions, log: Log) -> None:
    """Build the Debian tree into the new directory `rootfs` (see the module docstring, steps 1-5)."""
    preflight()
    debs = fetch_debs(pins, cache_dir, log)
    started = time.monotonic()
    with local_mirror(pins, debs) as source:
        try:
            _mmdebstrap(pins, rootfs, source, options, log)
        finally:
            unmount_under(rootfs)
    log(f"debian: mmdebstrap took {time.monotonic() - started:.0f}s")
    check_installed(pins, rootfs)
    if options.neutralise:
        neutralise(rootfs, pins, options.epoch)
    check_dev(rootfs)


def preflight() -> None:
    """Refuse early, with a hint, when the host cannot build (not root, tools missing)."""
    if os.geteuid() != 0:
        raise DebianError(
            "building a Debian base needs root (mmdebstrap --mode=root, chroot)", hint="run it as root"
        )
    for name in ("mmdebstrap", "dpkg-deb", "chroot"):
        tool(name)
    if not Path(AUTOMOUNT_HOOK).is_dir():
        raise DebianError(f"{AUTOMOUNT_HOOK} is missing", hint="apt-get install mmdebstrap")


def tool(name: str) -> str:
    found = shutil.which(name, path=HOST_PATH)
    if found is None:
        package = {"chroot": "coreutils", "umount": "mount", "dpkg-deb": "dpkg"}.get(name, name)
        raise DebianError(f"{name} is not installed", hint=f"apt-get install {package}")
    return found


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a build process: nothing from the host but proxy settings."""
    env = {"PATH": HOST_PATH, "HOME": "/root", "LC_ALL": "C", "TZ": "UTC"}
    env.update(
        {k: v for k, v in os.environ.items() if k.lower() in ("http_proxy", "https_proxy", "no_proxy")}
    )
    env.update(extra or {})
    return env


def _mmdebstrap(pins: DebianPins, rootfs: Path, source: str, options: BuildOptions, log: Log) -> None:
    cmd = [
        tool("mmdebstrap"),
        "--mode=root",
        f"--variant={pins.variant}",
        f"--arch={pins.arch}",
        f"--include={','.join(pins.include)}",
        f"--hook-dir={AUTOMOUNT_HOOK}",
        *_stage_hooks(options.clock),
    ]
    if not options.neutralise:
        cmd.append("--skip=cleanup/reproducible")
    cmd += [pins.suite, str(rootfs), source]
    extra = dict(options.clock.env())
    if options.neutralise:
        extra["SOURCE_DATE_EPOCH"] = str(options.epoch)
    run(cmd, env=_env(extra), log=log, what="mmdebstrap", hint="see the mmdebstrap output above")


def run(cmd: Sequence[str], *, env: Mapping[str, str], log: Log, what: str, hint: str) -> list[str]:
    """Run with umask 022 and cwd / (modes and paths end up in layers), streaming output to `log`."""
    lines: list[str] = []
    with subprocess.Popen(
        list(cmd),
        env=dict(env),
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        umask=UMASK,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            log(f"  {what}: {line.rstrip()}")
    if proc.returncode != 0:
        raise DebianError(
            f"{what} failed with exit status {proc.returncode}", hint=hint, problems=lines[-20:]
        )
    return lines


def installed(rootfs: Path) -> dict[tuple[str, str], str]:
    """(package, arch) → version of every installed package in the tree's dpkg database."""
    status = (rootfs / "var/lib/dpkg/status").read_text(encoding="utf-8")
    return {
        (s["Package"], s.get("Architecture", "")): s.get("Version", "")
        for s in parse_stanzas(status)
        if s.get("Status", "").endswith(" installed")
    }


def check_installed(pins: DebianPins, rootfs: Path) -> None:
    """The installed set must be the pin set, exactly (a resolver surprise is an error, not a drift)."""
    have = installed(rootfs)
    want = {(p.name, p.arch): p.version for p in pins.packages}
    problems = [
        f"{n}:{a}={v} installed but not pinned" for (n, a), v in sorted(have.items()) if want.get((n, a)) != v
    ]
    problems += [
        f"{n}:{a}={v} pinned but not installed" for (n, a), v in sorted(want.items()) if have.get((n, a)) != v
    ]
    if problems:
        raise DebianError(
            "the installed package set differs from the pins",
            problems=problems,
            hint="the pin file is not a closed set for this variant and includes; re-pin with --repin",
        )


def neutralise(rootfs: Path, pins: DebianPins, epoch: int) -> None:
    """Replace what still depends on the host or the clock (docs/reproducibility.md), then clamp mtimes."""
    # mmdebstrap wrote the temp mirror's file:// line; the image should name the real archive.
    _write_fixed(rootfs / "etc/apt/sources.list", f"deb {pins.mirror} {pins.suite} main\n".encode())
    # Copied from the host by mmdebstrap; a container runtime bind-mounts its own over both anyway.
    _write_fixed(rootfs / "etc/hostname", b"localhost\n")
    _write_fixed(rootfs / "etc/resolv.conf", b"")
    for name in ("etc/machine-id", "var/lib/dbus/machine-id"):
        path = rootfs / name
        if path.is_file() and not path.is_symlink():
            path.write_bytes(b"")
    for name in ("etc/shadow", "etc/shadow-"):
        _shadow_days(rootfs / name, epoch // 86400)
    for pattern in ("var/log/**/*.log", "var/log/apt/eipp.log.xz", "var/cache/ldconfig/aux-cache"):
        for path in rootfs.glob(pattern):
            if path.is_file() and not path.is_symlink():
                path.unlink()
    clamp_mtimes(rootfs, epoch)
    rootfs.chmod(0o755)


def _shadow_days(path: Path, day: int) -> None:
    """Set every non-empty "last password change" field (days since the epoch) to the epoch's day."""
    if not path.is_file():
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split(":")
        if len(fields) > 2 and fields[2].strip():
            fields[2] = str(day)
        out.append(":".join(fields))
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    path.chmod(mode)


def _write_fixed(path: Path, content: bytes) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    path.write_bytes(content)
    os.chown(path, 0, 0)
    path.chmod(0o644)


def clamp_mtimes(root: Path, epoch: int) -> None:
    """Every mtime (and atime) later than `epoch` becomes `epoch` (reproducible-builds clamping)."""
    for path, st in walk(root):
        if st.st_mtime_ns > epoch * 1_000_000_000:
            os.utime(path, (epoch, epoch), follow_symlinks=False)


_CANONICAL_DEV = {
    "console": "c:0666:5,1",
    "fd": "l:0777:/proc/self/fd",
    "full": "c:0666:1,7",
    "null": "c:0666:1,3",
    "ptmx": "c:0666:5,2",
    "pts": "d:0755:",
    "random": "c:0666:1,8",
    "shm": "d:0755:",
    "stderr": "l:0777:/proc/self/fd/2",
    "stdin": "l:0777:/proc/self/fd/0",
    "stdout": "l:0777:/proc/self/fd/1",
    "tty": "c:0666:5,0",
    "urandom": "c:0666:1,9",
    "zero": "c:0666:1,5",
}


def check_dev(rootfs: Path) -> None:
    """Require the /dev that mmdebstrap makes with mknod (a host without mknod leaves another tree)."""
    found = {}
    for path, st in walk(rootfs / "dev"):
        rel = path.relative_to(rootfs / "dev").as_posix()
        if rel == ".":
            continue
        kind = (
            "c"
            if stat.S_ISCHR(st.st_mode)
            else "l"
            if stat.S_ISLNK(st.st_mode)
            else "d"
            if stat.S_ISDIR(st.st_mode)
            else "?"
        )
        payload = (
            f"{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
            if kind == "c"
            else os.readlink(path)
            if kind == "l"
            else ""
        )
        found[rel] = f"{kind}:{stat.S_IMODE(st.st_mode):04o}:{payload}"
    problems = [
        f"/dev/{name}: found {found.get(name)!r}, expected {_CANONICAL_DEV.get(name)!r}"
        for name in sorted(set(found) | set(_CANONICAL_DEV))
        if found.get(name) != _CANONICAL_DEV.get(name)
    ]
    if problems:
        raise DebianError(
            "mmdebstrap produced a non-standard /dev",
            hint="build on a host where root may mknod (not in an unprivileged container)",
            problems=problems,
        )


def walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """(path, lstat) for `root` and everything below it, never following symlinks."""
    yield root, os.lstat(root)
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                yield Path(entry.path), st
                if stat.S_ISDIR(st.st_mode):
                    stack.append(Path(entry.path))


def _tail(text: str, count: int = 20) -> list[str]:
    return [line for line in text.splitlines() if line.strip()][-count:]


# ---------------------------------------------------------------------------------------------- mounts


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path`, deepest first (from /proc/self/mountinfo)."""
    prefix = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            field = line.split()[4]
            point = field.encode("latin-1").decode("unicode_escape") if "\\" in field else field
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def unmount_under(path: Path) -> None:
    """Unmount whatever a failed mmdebstrap may have left mounted below `path`."""
    if not path.exists():
        return
    for point in mounts_under(path):
        if subprocess.run([tool("umount"), point], capture_output=True, check=False).returncode != 0:
            subprocess.run([tool("umount"), "-l", point], capture_output=True, check=False)


# ---------------------------------------------------------------------------------------------- re-pin


def resolve_pins(request: DebianPins, workdir: Path, cache_dir: Path, log: Log) -> DebianPins:
    """What `request` (suite, mirror, variant, includes) installs from the live archive today, pinned.

    Runs mmdebstrap against the real archive (apt verifies the suite's InRelease with the host's Debian
    keyring), keeps its downloaded files and package lists, and pins exactly the installed set with size,
    sha256 and pool path from the verified Packages index. The downloaded files seed the deb cache.
    """
    preflight()
    rootfs = Path(tempfile.mkdtemp(prefix="servimg-resolve-", dir=workdir))
    try:
        cmd = [
            tool("mmdebstrap"),
            "--mode=root",
            f"--variant={request.variant}",
            f"--arch={request.arch}",
            f"--include={','.join(request.include)}",
            "--skip=essential/unlink,cleanup/apt",
            request.suite,
            str(rootfs / "root"),
            request.mirror,
        ]
        try:
            run(
                cmd, env=_env(), log=log, what="mmdebstrap (resolve)", hint="is the Debian archive reachable?"
            )
        finally:
            unmount_under(rootfs)
        root = rootfs / "root"
        index: dict[tuple[str, str, str], dict[str, str]] = {}
        release = ""
        for lists in sorted((root / "var/lib/apt/lists").glob("*_Packages")):
            for stanza in parse_stanzas(lists.read_text(encoding="utf-8", errors="replace")):
                index[(stanza["Package"], stanza["Version"], stanza["Architecture"])] = stanza
        for signed in sorted((root / "var/lib/apt/lists").glob("*InRelease")):
            fields = next(
                parse_stanzas(signed.read_text(encoding="utf-8", errors="replace").split("\n\n", 1)[1])
            )
            version, codename = fields.get("Version", "?"), fields.get("Codename", request.suite)
            release = f"Debian {version} ({codename}), {fields.get('Date', '?')}"
        packages: list[DebPin] = []
        problems: list[str] = []
        for (name, arch), version in sorted(installed(root).items()):
            entry = index.get((name, version, arch))
            if entry is None:
                problems.append(f"{name}:{arch}={version} is installed but not in the archive's index")
                continue
            pin = DebPin(
                name,
                version,
                arch,
                entry.get("Priority", "optional"),
                int(entry["Size"]),
                entry["SHA256"],
                entry["Filename"],
            )
            packages.append(pin)
            _harvest(pin, root / "var/cache/apt/archives", cache_dir)
        if problems:
            raise DebianError("cannot pin what mmdebstrap installed", problems=problems)
        return dataclasses.replace(request, release=release, packages=tuple(sorted(packages)))
    finally:
        unmount_under(rootfs)
        shutil.rmtree(rootfs, ignore_errors=True)


def _harvest(pin: DebPin, archives: Path, cache_dir: Path) -> None:
    """Move the file apt downloaded for `pin` into the deb cache when it matches the pin."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    for candidate in archives.glob(f"{pin.name}_*.deb"):
        if candidate.stat().st_size == pin.size and Digest.of_file(str(candidate)).hex == pin.sha256:
            shutil.move(str(candidate), cache_dir / pin.cache_name)
            return
