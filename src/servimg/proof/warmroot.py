"""The warm daemonless runner: the base's files extracted ONCE per chain, every run over an overlay of them.

`WarmRoot.of` extracts the base (packages included, `bytecode.extract_runtime`) into
`<cache>/rootfs/<format>/<chain key>/` (the key of the ordered diffIDs, `cache.layout.chain_key`): written
under a temp name and renamed into place, never written again, shared by every build of that base.
`WarmRoot.run` then runs a command in a private mount namespace (`unshare --mount`, in a user namespace
when not root) in a chroot of an overlayfs whose lower dir is that tree and whose upper dir is the
run's own: whatever a run adds (compile jobs, the overlay layer to verify, the probe and its spec) goes
there, so concurrent builds never see each other and the shared tree is never changed. The cost of a run
is a process start, not an extraction: it does not grow with the base.

`available()` says whether this host can do it (root or unprivileged user namespaces, overlayfs); the
runner choice falls back to the docker runner or the extracting chroot runner when it cannot.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servimg.cache.layout import CacheLayout, chain_key
from servimg.core.digest import Digest
from servimg.core.errors import BytecodeError
from servimg.oci.filesystem import LayeredFS
from servimg.oci.layerindex import OPAQUE, LayerIndex
from servimg.patching.bytecode import (
    WORK_IN_IMAGE,
    InterpreterFacts,
    Sandbox,
    compile_in,
    copy_back,
    extract_runtime,
    tool,
)

ROOTFS_FORMAT = "v1"
MOUNT_FAILED = 125
IN_NAMESPACE = "servimg-warm-root: in the namespace"  # stderr marker: unshare itself worked


def _namespace_prefix() -> list[str]:
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [tool("unshare"), *user, "--mount", "--net", "--"]  # --net: no network, as the containers


def _overlay_argv(lower: Path, run_dir: Path, argv: Sequence[str]) -> list[str]:
    """Mount the overlay at run_dir/merged (private namespace: gone when the process ends), chroot in."""
    options = f"lowerdir={lower},upperdir={run_dir / 'upper'},workdir={run_dir / 'work'}"
    merged = run_dir / "merged"
    script = (
        f"echo {IN_NAMESPACE} >&2; "
        f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(str(merged))} "
        f"|| exit {MOUNT_FAILED}; "
        f'exec {shlex.quote(tool("chroot"))} {shlex.quote(str(merged))} "$@"'
    )
    return [*_namespace_prefix(), tool("sh"), "-c", script, "sh", *argv]


def _unsafe(path: Path) -> bool:
    return any(c in str(path) for c in ",:\\\n")  # overlayfs option syntax has no quoting


@functools.cache
def available() -> bool:
    """Whether this host looks able to (root, or user namespaces enabled; overlayfs; the tools): read
    from /proc, no process started. A run that still cannot mount exits 125 and the caller falls back."""
    try:
        if "overlay" not in Path("/proc/filesystems").read_text():
            return False
        if os.geteuid() != 0 and int(Path("/proc/sys/user/max_user_namespaces").read_text()) <= 0:
            return False
        for name in ("unshare", "mount", "chroot", "sh"):
            tool(name)
    except (OSError, ValueError, BytecodeError):
        return False
    return True


@dataclass(frozen=True)
class WarmRoot:
    """A base's extracted tree in the cache, run only through overlays."""

    lower: Path

    @classmethod
    def of(cls, fs: LayeredFS, diff_ids: Sequence[Digest], cache_root: Path) -> WarmRoot:
        root = CacheLayout(cache_root).rootfs / ROOTFS_FORMAT / chain_key(diff_ids).hex
        if not root.is_dir():
            root.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root.parent))
            try:
                extract_runtime(fs, tmp, packages=True)
                os.chmod(tmp, 0o755)
                os.rename(tmp, root)
            except OSError:
                if not root.is_dir():  # another build renamed its copy into place first: use that one
                    raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        if _unsafe(root):
            raise BytecodeError(f"the warm root {root} has a character overlayfs cannot take (,:\\)")
        with contextlib.suppress(OSError):  # used now: `servimg cache prune` removes the least recently used
            os.utime(root)
        return cls(root)

    def run(
        self,
        upper: Path,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        workdir: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` chrooted in the base overlaid with `upper` (a directory laid out as image paths, the
        run's writes land in it). Exit MOUNT_FAILED: the overlay could not be mounted."""
        run_dir = upper.parent
        if _unsafe(run_dir):
            return subprocess.CompletedProcess(
                list(argv), MOUNT_FAILED, "", f"{run_dir}: not an overlay path"
            )
        for name in ("work", "merged"):
            (run_dir / name).mkdir(exist_ok=True)
        command = list(argv)
        if workdir is not None:
            command = ["/bin/sh", "-c", f"cd {shlex.quote(workdir)} && exec {shlex.join(argv)}"]
        proc = subprocess.run(
            _overlay_argv(self.lower, run_dir, command),
            capture_output=True,
            text=True,
            env=dict(env),
            check=False,
        )
        marker = f"{IN_NAMESPACE}\n"
        if not proc.stderr.startswith(marker):  # unshare refused (a sandbox without namespaces)
            return subprocess.CompletedProcess(proc.args, MOUNT_FAILED, proc.stdout, proc.stderr)
        proc.stderr = proc.stderr[len(marker) :]
        return proc


def new_upper(prefix: str) -> Path:
    """A fresh run directory (the caller removes `upper.parent` when done) and its empty upper dir."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    (run_dir / "upper").mkdir()
    return run_dir / "upper"


def lay_out(layer: Path, upper: Path) -> None:
    """Write one layer tar as an overlayfs upper dir: files, dirs and symlinks as themselves, a whiteout as
    the 0/0 character device, an opaque directory with `trusted.overlay.opaque=y`. Hardlinks, devices
    and FIFOs are refused (servimg's layers have none; the caller falls back to the extracting runner)."""
    index = LayerIndex.read(layer, 0)
    with layer.open("rb") as tar:
        for member in index.members:
            dest = upper / member.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            if member.type == tarfile.DIRTYPE:
                dest.mkdir(exist_ok=True)
                os.chmod(dest, member.mode & 0o777)
            elif member.type == tarfile.SYMTYPE:
                os.symlink(member.linkname, dest)
            elif member.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
                tar.seek(member.offset_data)
                dest.write_bytes(tar.read(member.size))
                os.chmod(dest, member.mode & 0o777)
            else:
                raise BytecodeError(
                    f"{member.path}: tar type {member.type!r} is not laid out by the warm root"
                )
    for path, kind in index.deletions:
        dest = upper / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        if kind == OPAQUE:
            dest.mkdir(exist_ok=True)
            os.setxattr(dest, "trusted.overlay.opaque", b"y")
        else:
            os.mknod(dest, stat.S_IFCHR | 0o600, os.makedev(0, 0))


@dataclass
class WarmRunner:
    """The compile runner over a warm root: the jobs go into the run's upper dir. Where the overlay cannot
    be mounted after all, `fallback` (the extracting chroot runner) runs it instead: same bytes."""

    root: WarmRoot
    fallback: Sandbox
    name: str = "warm-chroot"
    hint: str = "is the interpreter path right? try `--runner docker` or `--runner chroot`"

    def run(self, jobs_dir: Path, interpreter: str) -> InterpreterFacts:
        return compile_in(self, jobs_dir, interpreter)

    def execute(
        self, argv: Sequence[str], env: Mapping[str, str], work: Path | None, workdir: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        upper = new_upper("servimg-compile-")
        try:
            if work is not None:
                shutil.copytree(work, upper / WORK_IN_IMAGE.lstrip("/"))
            proc = self.root.run(upper, argv, env=env, workdir=workdir)
            if proc.returncode == MOUNT_FAILED:
                return self.fallback.execute(argv, env, work, workdir)
            if proc.returncode == 0 and work is not None:
                copy_back(upper / WORK_IN_IMAGE.lstrip("/"), work)
            return proc
        finally:
            shutil.rmtree(upper.parent, ignore_errors=True)
