"""Fresh bytecode for patched sources, compiled by the image's own interpreter.

docs/design.md: never compare pyc bytes to decide freshness; write CHECKED_HASH pycs (PEP 552) for patched
files at every optimisation level the base carried, and whiteout every legacy or stale pyc, because the
interpreter happily runs a stale timestamp pyc whose recorded mtime/size still match the patched source.

Two runners produce identical bytes (same interpreter binary, PYTHONHASHSEED=0, one process per file,
fixed order): a Docker container with `--network none` (`backends.engine.run`), and a daemonless chroot
over the interpreter's files extracted from the base layers (no engine; `unshare --map-root-user` when
not root). `chroot_run` is the one daemonless runner: the probe (`proof.verify`) uses it too.
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
import shutil
import stat
import subprocess
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from servimg.backends import engine
from servimg.backends.engine import ContainerSpec, Mount
from servimg.core.errors import BackendError, BytecodeError
from servimg.oci.filesystem import LayeredFS

COMPILE_SCRIPT = Path(__file__).parents[1] / "inimage" / "compile.py"
PROBE_SCRIPT = Path(__file__).parents[1] / "inimage" / "probe.py"
WORK_IN_IMAGE = "/.servimg-compile"


@dataclass(frozen=True)
class CompileJob:
    """Compile `source` (bytes) as if it lived at `image_path`, writing one pyc per opt level."""

    image_path: str
    source: bytes
    opt_levels: tuple[int, ...]


@dataclass(frozen=True)
class InterpreterFacts:
    executable: str
    version: str
    magic: str
    cache_tag: str


def opt_suffix(opt: int) -> str:
    return "" if opt == 0 else f".opt-{opt}"


def pyc_path(source: str, cache_tag: str, opt: int) -> str:
    """PEP 3147/488 location: `<dir>/__pycache__/<stem>.<tag>[.opt-N].pyc`."""
    directory, name = posixpath.split(source)
    stem = name.rsplit(".", 1)[0]
    return posixpath.join(directory, "__pycache__", f"{stem}.{cache_tag}{opt_suffix(opt)}.pyc")


def stale_pycs(fs: LayeredFS, source: str, pycache_prefix: str | None) -> list[str]:
    """Every pyc in the base that the interpreter could load for `source` instead of fresh bytecode:
    any cache tag, any optimisation level, the legacy sourceless `<stem>.pyc` beside it, and the mirror
    under PYTHONPYCACHEPREFIX (PEP 3147, bpo-33499)."""
    directory, name = posixpath.split(source.lstrip("/"))
    stem = name.rsplit(".", 1)[0]
    found = []
    cache = posixpath.join(directory, "__pycache__")
    for entry in fs.listdir(cache):
        # A name that is not UTF-8 (kept surrogate-escaped) holds no ASCII cache tag, so the interpreter
        # never loads it for `source`; it could not be recorded in changes.json either.
        if entry.startswith(stem + ".") and entry.endswith(".pyc") and entry.count(".") >= 2 and _utf8(entry):
            found.append(posixpath.join(cache, entry))
    legacy = posixpath.join(directory, stem + ".pyc")
    if fs.exists(legacy):
        found.append(legacy)
    if pycache_prefix:
        mirror = posixpath.join(pycache_prefix.lstrip("/"), directory)
        for entry in fs.listdir(mirror):
            if entry.startswith(stem + ".") and entry.endswith(".pyc") and _utf8(entry):
                found.append(posixpath.join(mirror, entry))
    return sorted(found)


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def base_opt_levels(fs: LayeredFS, package_dirs: Sequence[str], cache_tag: str) -> tuple[int, ...]:
    """Which optimisation levels the base's pycs carry in the given package trees (always includes 0)."""
    levels = {0}
    for directory in package_dirs:
        for path in fs.paths_below(directory):
            name = path.rpartition("/")[2]
            if "/__pycache__/" in "/" + path and name.endswith(".pyc") and cache_tag in name:
                for opt in (1, 2):
                    if f".opt-{opt}.pyc" in name:
                        levels.add(opt)
    return tuple(sorted(levels))


class Runner(Protocol):
    name: str

    def run(self, jobs_dir: Path, interpreter: str) -> InterpreterFacts: ...


def _work_dir(work: Path) -> Path:
    """A runner's work dir as every runner expects it: compile.py, src/ (the sources), out/ (the pycs)."""
    (work / "src").mkdir()
    (work / "out").mkdir()
    shutil.copyfile(COMPILE_SCRIPT, work / "compile.py")
    return work


def compile_sources(
    runner: Runner, interpreter: str, jobs: Sequence[CompileJob]
) -> tuple[InterpreterFacts, dict[tuple[str, int], bytes]]:
    """Compile every job with the image's interpreter; return its facts and pyc bytes per (path, opt)."""
    with tempfile.TemporaryDirectory(prefix="servimg-compile-") as tmp:
        work = _work_dir(Path(tmp))
        plan = []
        ordered = sorted(jobs, key=lambda j: j.image_path)
        for i, job in enumerate(ordered):
            (work / "src" / f"{i}.py").write_bytes(job.source)
            for opt in job.opt_levels:
                plan.append(
                    {
                        "src": f"{WORK_IN_IMAGE}/src/{i}.py",
                        "dfile": job.image_path,
                        "out": f"{WORK_IN_IMAGE}/out/{i}.{opt}.pyc",
                        "opt": opt,
                        "key": [job.image_path, opt],
                    }
                )
        # Largest source first: compile.py hands jobs out in this order to one worker per CPU, and the
        # longest compile started last is the whole run's tail (issue 13). Results are keyed by `out`,
        # and each job is its own process, so the order changes no byte.
        sizes = {f"{WORK_IN_IMAGE}/src/{i}.py": len(job.source) for i, job in enumerate(ordered)}
        plan.sort(key=lambda job_plan: -sizes[str(job_plan["src"])])
        (work / "jobs.json").write_text(json.dumps(plan))
        os.chmod(work, 0o755)
        facts = runner.run(work, interpreter)
        out: dict[tuple[str, int], bytes] = {}
        for job_plan in plan:
            local = work / "out" / Path(str(job_plan["out"])).name
            out[(str(job_plan["dfile"]), int(str(job_plan["opt"])))] = local.read_bytes()
        return facts, out


def lookup_in_image(
    runner: Runner,
    interpreter: str,
    sources: Mapping[str, bytes],
    lookups: Mapping[str, Sequence[Mapping[str, object]]],
) -> dict[str, tuple[int, int]]:
    """Search base modules' code for sentinels with the image's own interpreter (compile.py's sentinel
    jobs): `sources` maps a module to its source bytes, `lookups` a module to its sentinels (`key`,
    `qualname`, `name`, `const`). Per key: (hits, code objects with that qualname). The image compiles
    its own modules: a base newer than the host has syntax the host's compiler refuses."""
    with tempfile.TemporaryDirectory(prefix="servimg-sentinels-") as tmp:
        work = _work_dir(Path(tmp))
        shutil.copyfile(PROBE_SCRIPT, work / "probe.py")
        items = []
        for i, (module, source) in enumerate(sorted(sources.items())):
            (work / "src" / f"{i}.py").write_bytes(source)
            items.append(
                {"module": module, "src": f"{WORK_IN_IMAGE}/src/{i}.py", "lookups": list(lookups[module])}
            )
        (work / "jobs.json").write_text(json.dumps({"compile": [], "sentinels": items}))
        os.chmod(work, 0o755)
        runner.run(work, interpreter)
        answers = json.loads((work / "result.json").read_text()).get("sentinels", {})
    out: dict[str, tuple[int, int]] = {}
    problems = []
    for module in sorted(lookups):
        for lookup in lookups[module]:
            answer = answers.get(lookup["key"]) if module in sources else [0, 0]
            if isinstance(answer, list) and len(answer) == 2:
                out[str(lookup["key"])] = (int(answer[0]), int(answer[1]))
            else:
                why = answer.get("error") if isinstance(answer, dict) else "no answer"
                problems.append(f"{module}: {why}")
    if problems:
        raise BytecodeError(
            f"the image's interpreter {interpreter} cannot compile the base's module(s)",
            problems=sorted(set(problems)),
            hint="the base's own source must be valid for its own interpreter; check the definition's python",
        )
    return out


# -S/-s: no site import, no user site: the compiler needs only the stdlib, and site hooks (.pth files)
# in the base must not run during a build.
COMPILE_ARGS = (
    "-S",
    "-s",
    f"{WORK_IN_IMAGE}/compile.py",
    f"{WORK_IN_IMAGE}/jobs.json",
    f"{WORK_IN_IMAGE}/result.json",
)


def read_result(jobs_dir: Path, runner: str) -> InterpreterFacts:
    try:
        data = json.loads((jobs_dir / "result.json").read_text())
    except (OSError, ValueError):
        raise BytecodeError(
            f"{runner} runner: the image's interpreter wrote no result",
            hint="check that the interpreter path in the definition/lock runs in the image",
        ) from None
    failed = [r for r in data["results"] if not r["ok"]]
    if failed:
        raise BytecodeError(
            f"{runner} runner: {len(failed)} file(s) failed to compile",
            problems=[r["error"].strip().splitlines()[-1] if r["error"] else r["out"] for r in failed],
            hint="the patched source is not valid Python for the image's interpreter",
        )
    return InterpreterFacts(data["executable"], data["version"], data["magic"], data["cache_tag"])


Ran = subprocess.CompletedProcess[str]  # a command's exit status and output, wherever it ran

# What a compile run gets, wherever it runs: a fixed hash seed and the image's usual binary dirs.
COMPILE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONHASHSEED": "0"}


class Sandbox(Protocol):
    """Where a command runs in an image: a throwaway container, a chroot of its extracted files, the warm
    root's overlay. Compiling the overlays' pycs (`compile_in`, over the base) and probing the image
    (`verify.probe_in`, over the built image) are jobs on one. `work`, when given, is a host dir that
    appears at WORK_IN_IMAGE, and what the command writes under it is there afterwards; `workdir` is
    where the command starts in the image (None: /)."""

    name: str
    hint: str  # what to try when a command fails in it

    def execute(
        self, argv: Sequence[str], env: Mapping[str, str], work: Path | None, workdir: str | None = None
    ) -> subprocess.CompletedProcess[str]: ...


def compile_in(sandbox: Sandbox, jobs_dir: Path, interpreter: str) -> InterpreterFacts:
    """compile.py's jobs (`jobs_dir`) run by the image's interpreter in `sandbox`: every compile runner
    is this, over its own sandbox."""
    proc = sandbox.execute([interpreter, *COMPILE_ARGS], COMPILE_ENV, jobs_dir)
    if proc.returncode != 0:
        raise BytecodeError(
            f"{sandbox.name} runner: {interpreter} failed ({proc.returncode}): {proc.stderr[-800:]}",
            hint=sandbox.hint,
        )
    return read_result(jobs_dir, sandbox.name)


@dataclass
class DockerRunner:
    """Compile in a throwaway container of the base image (`--network none`, removed afterwards)."""

    image: str
    name: str = "docker"
    hint: str = "is the interpreter path right? try `--runner chroot`"

    def run(self, jobs_dir: Path, interpreter: str) -> InterpreterFacts:
        return compile_in(self, jobs_dir, interpreter)

    def execute(
        self, argv: Sequence[str], env: Mapping[str, str], work: Path | None, workdir: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        spec = ContainerSpec(
            self.image,
            list(argv),
            user="0:0",
            workdir=workdir or "/",
            env={"PYTHONHASHSEED": env["PYTHONHASHSEED"]},  # the image's own PATH
            mounts=(Mount(str(work), WORK_IN_IMAGE),) if work is not None else (),
        )
        try:
            exited = engine.run(spec)
        except BackendError as exc:
            raise BytecodeError(
                f"docker runner: running {argv[0]} in {self.image} failed: {exc.message}", hint=self.hint
            ) from exc
        return subprocess.CompletedProcess(list(argv), exited.status, exited.stdout, exited.stderr)


@dataclass
class ChrootRunner:
    """Daemonless: extract the base's files (minus site-packages) and run its interpreter in a chroot."""

    fs: LayeredFS
    name: str = "chroot"
    hint: str = "is the interpreter path right? try `--runner docker`"

    _root: Path | None = field(default=None, init=False, repr=False)

    def _runtime(self) -> Path:
        """Extract once per runner (lock and build each ask the interpreter more than once)."""
        if self._root is None:
            root = Path(tempfile.mkdtemp(prefix="servimg-rootfs-"))
            weakref.finalize(self, shutil.rmtree, root, True)
            extract_runtime(self.fs, root)
            self._root = root
        return self._root

    def run(self, jobs_dir: Path, interpreter: str) -> InterpreterFacts:
        return compile_in(self, jobs_dir, interpreter)

    def execute(
        self, argv: Sequence[str], env: Mapping[str, str], work: Path | None, workdir: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return ImageChroot(self._runtime()).execute(argv, env, work, workdir)


@dataclass
class ImageChroot:
    """A chroot of an image's files already extracted at `root` (the probe's: packages included)."""

    root: Path
    name: str = "the chroot"
    hint: str = "try the docker runner (start dockerd)"

    def execute(
        self, argv: Sequence[str], env: Mapping[str, str], work: Path | None, workdir: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        if work is None:
            return chroot_run(self.root, argv, env=env, workdir=workdir)
        target = self.root / WORK_IN_IMAGE.lstrip("/")
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(work, target)
        try:
            proc = chroot_run(self.root, argv, env=env, workdir=workdir)
            if proc.returncode == 0:
                copy_back(target, work)
            return proc
        finally:
            shutil.rmtree(target, ignore_errors=True)


def copy_back(done: Path, work: Path) -> None:
    """What a compile run wrote (out/, result.json) from where it ran back into the host's work dir."""
    shutil.rmtree(work / "out")
    shutil.copytree(done / "out", work / "out")
    shutil.copyfile(done / "result.json", work / "result.json")


def chroot_run(
    root: Path, argv: Sequence[str], *, env: Mapping[str, str], workdir: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `argv` in a chroot of `root` (an extracted image), with exactly `env`.

    chroot needs CAP_SYS_CHROOT: as a normal user (a Nix build) it runs in a user namespace where it is
    root (`unshare --map-root-user`). With a `workdir` (the image's WorkingDir, as the service would
    start) it goes through the image's /bin/sh (`cd`, then `exec`); without one the program runs
    directly from /, so the compiler needs nothing of the image but its interpreter."""
    prefix = [] if os.geteuid() == 0 else [tool("unshare"), "--user", "--map-root-user"]
    command = list(argv)
    if workdir is not None:
        command = ["/bin/sh", "-c", f"cd {shlex.quote(workdir)} && exec {shlex.join(argv)}"]
    return subprocess.run(
        [*prefix, tool("chroot"), str(root), *command],
        capture_output=True,
        text=True,
        env=dict(env),
        check=False,
    )


def tool(name: str) -> str:
    # $PATH first (a Nix build has no /usr/bin), then the sbin dirs a root shell may lack.
    search = os.pathsep.join(
        [os.environ.get("PATH", ""), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    )
    found = shutil.which(name, path=search)
    if found is None:
        raise BytecodeError(
            f"chroot runner: `{name}` is not installed",
            hint="install util-linux/coreutils, or use `--runner docker`",
        )
    return found


_SKIP_DIRS = ("site-packages", "dist-packages")


def extract_runtime(fs: LayeredFS, root: Path, *, packages: bool = False) -> None:
    """Materialise the image's files, by default without installed packages (the compiler needs only
    the stdlib; the probe, which checks the packages, passes `packages=True`).

    Only regular files, directories and symlinks are written, all inside `root`: symlinks are written
    as-is (the chroot resolves them, confined to `root`), and nothing is ever written THROUGH one: every
    parent is a directory this call created, files are opened O_NOFOLLOW|O_EXCL. Device nodes and FIFOs
    are skipped (never created on the host); setuid/setgid/sticky bits are dropped. The base may not
    provide the runner's work directory (WORK_IN_IMAGE)."""
    work = WORK_IN_IMAGE.strip("/")
    made: set[str] = {""}
    for node in fs.walk(""):
        if not node.path or node.path == work or node.path.startswith(work + "/"):
            continue
        if not packages and any(f"/{d}/" in f"/{node.path}/" for d in _SKIP_DIRS):
            continue
        parent = node.path.rpartition("/")[0]
        if parent not in made:
            continue  # under a skipped directory
        dest = root / node.path
        if node.is_dir:
            _make_dir(dest, root)
            made.add(node.path)
        elif node.is_symlink:
            os.symlink(node.linkname, dest)
        elif node.is_file:
            try:
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            except FileExistsError:
                raise BytecodeError(
                    f"refusing to extract over {dest}: it already exists",
                    hint=f"extract into a fresh, empty directory (not {root})",
                ) from None
            with os.fdopen(fd, "wb") as fh:
                fs.copy_to(node.path, fh, follow=False)
                os.fchmod(fh.fileno(), node.mode & 0o755 | 0o600)


def _make_dir(dest: Path, root: Path) -> None:
    try:
        os.mkdir(dest, 0o755)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(dest).st_mode):  # a symlink or file where a directory must be
            raise BytecodeError(
                f"refusing to extract into {dest}: it exists and is not a directory",
                hint=f"extract into a fresh, empty directory (not {root})",
            ) from None
