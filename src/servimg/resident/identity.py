"""The identity of a process environment, and where the server of one listens.

A worker runs a client's command with the client's argv, environment, working directory, umask and
standard streams, but everything else it inherits from its server, fixed when the server started. The
identity is a digest of exactly that — the interpreter (executable, version, flags, -X and -W options),
`sys.path` and the distributions installed on it (an upgrade renames a dist-info), every
file of the servimg package (path, size, mtime, inode: an edit makes another identity), the environment
the interpreter reads at start (PYTHON*, LD_* — faketime is an LD_PRELOAD —, FAKETIME*, the locale, TZ),
uid, gid and groups, the cgroup and namespaces, the root directory, resource limits, niceness and CPU
affinity — so a command served by a worker cannot see a process other than the one it would have run in.

Standard library only, and cheap (every `servimg` command computes it before anything else: ≈1 ms).
"""

from __future__ import annotations

import hashlib
import os
import resource
import stat
import sys

TYPE_CHECKING = False  # typing and collections are ≈10 ms of a served command's start (resident.client)
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The environment a process reads once, at its start (the interpreter, the dynamic loader, libfaketime,
# the C library's locale): a client with other values here needs another server.
START_ENV_PREFIXES = ("PYTHON", "LD_", "FAKETIME", "LC_", "DYLD_")
START_ENV_NAMES = ("LANG", "LANGUAGE", "TZ", "TZDIR")
NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts")
LIMITS = (
    *("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_MEMLOCK"),
    *("RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_STACK"),
)
DIR_ENV = "SERVIMG_SERVER_DIR"
MAX_DIR = 107 - len("/") - 32 - len(".sock")  # sun_path holds 108 bytes with its NUL
INSTALLED = (".dist-info", ".egg-info", ".egg-link", ".pth")


def document(environ: Mapping[str, str] | None = None, path: list[str] | None = None) -> bytes:
    """This process's environment as the server compares it: the repr of a sorted tuple of strings,
    ints and tuples (canonical; marshal's bytes are not: they depend on reference counts)."""
    env = os.environ if environ is None else environ
    entries = sys.path if path is None else path
    parts = {
        "python": (sys.executable, sys.version, tuple(sys.flags), sorted(sys._xoptions.items())),
        "warnings": tuple(sys.warnoptions),
        "path": tuple((entry, _installed(entry)) for entry in entries),
        "package": (PACKAGE_DIR, tuple(_package_files(PACKAGE_DIR))),
        "env": tuple(sorted((k, v) for k, v in env.items() if _read_at_start(k))),
        "ids": (os.getuid(), os.geteuid(), os.getgid(), os.getegid(), tuple(sorted(os.getgroups()))),
        "cgroup": _read("/proc/self/cgroup"),
        "namespaces": tuple(_link(f"/proc/self/ns/{name}") for name in NAMESPACES),
        "root": _link("/proc/self/root"),
        "limits": tuple(resource.getrlimit(getattr(resource, n)) for n in LIMITS if hasattr(resource, n)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "cpus": tuple(sorted(os.sched_getaffinity(0))),
    }
    return repr(tuple(sorted(parts.items()))).encode()


def name_of(doc: bytes) -> str:
    """The socket's name for an identity document: 32 hex digits of its sha256."""
    return hashlib.sha256(doc).hexdigest()[:32]


def _read_at_start(key: str) -> bool:
    return key.startswith(START_ENV_PREFIXES) or key in START_ENV_NAMES


def _installed(entry: str) -> tuple[object, ...]:
    """What a sys.path entry has installed: the names of its distributions' metadata and .pth files (an
    upgrade renames a dist-info), or a zip's size and mtime. Not the directory's mtime: the working
    directory of `python -m servimg` is on sys.path, and a build writes there."""
    try:
        with os.scandir(entry or ".") as found:
            return tuple(sorted(e.name for e in found if e.name.endswith(INSTALLED)))
    except NotADirectoryError:
        try:
            st = os.stat(entry)
        except OSError:
            return ()
        return (st.st_size, st.st_mtime_ns)
    except OSError:
        return ()


def _package_files(top: str) -> Iterator[tuple[str, int, int, int]]:
    """(path, size, mtime, inode) of every file of the package, in a fixed order; bytecode caches aside."""
    stack = [top]
    while stack:
        here = stack.pop()
        try:
            with os.scandir(here) as found:
                entries = sorted(found, key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    stack.append(entry.path)
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            yield entry.path, st.st_size, st.st_mtime_ns, st.st_ino


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def server_dir(environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """Where this user's servers listen, made private if new: $SERVIMG_SERVER_DIR, else
    $XDG_RUNTIME_DIR/servimg, else $TMPDIR (or /tmp)/servimg-<uid>. (None, why) when it is not a
    directory of ours that only we can enter: then no server is used."""
    env = os.environ if environ is None else environ
    uid = os.geteuid()
    if env.get(DIR_ENV):
        where = env[DIR_ENV]
    elif env.get("XDG_RUNTIME_DIR"):
        where = os.path.join(env["XDG_RUNTIME_DIR"], "servimg")
    else:
        where = os.path.join(env.get("TMPDIR") or "/tmp", f"servimg-{uid}")
    try:
        os.mkdir(where, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return None, f"{where}: {exc.strerror or exc}"
    try:
        st = os.lstat(where)
    except OSError as exc:
        return None, f"{where}: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return None, f"{where} is not a directory"
    if len(os.fsencode(where)) > MAX_DIR:
        return None, f"{where} is too long for a unix socket's path ({MAX_DIR} bytes at most)"
    if st.st_uid != uid or st.st_mode & 0o077:
        return (
            None,
            f"{where} must belong to uid {uid} with mode 0700 (it is uid {st.st_uid}, {st.st_mode:o})",
        )
    return where, ""
