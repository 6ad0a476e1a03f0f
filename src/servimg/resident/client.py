"""`servimg`, the console script (and `python -m servimg`): the command run by this user's resident server
for this environment when one answers, else in-process — leaving a server behind for the next command.

Steps (`main`):
1. Decide whether a server may run the command at all: not under SERVIMG_SERVER=0, not inside a batch
   job (SLURM_JOB_ID: its processes must stay in the job's allocation), not for `server …`, `--help` or
   `--version`, and only with this user's private server directory.
2. Connect to `<dir>/<identity>.sock` and send argv, argv[0], the environment and umask, with stdin,
   stdout, stderr and the working directory as descriptors. Until the server names the worker's pid,
   nothing has run: any failure up to there (no server, a stale socket, a refusal) runs the command
   in-process instead.
3. While the worker runs, forward SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to its process
   group (Ctrl-C interrupts the command and what it started, as in-process).
4. Exit with the worker's status: its exit code, or, killed by a signal, the same signal.
5. In-process: `servimg.cli.main(argv)`; then, unless it was a usage error, spawn the server.

Standard library only, and nothing heavy: this module's imports are a served command's whole start-up
(no typing, json, socket or subprocess: ≈10 ms each, measured with `python -X importtime`).
"""

from __future__ import annotations

import _socket
import contextlib
import importlib
import os
import signal
import sys
import time

from servimg.resident import identity, wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

CLI = "servimg.cli"  # its main(argv) runs a command in-process
OFF_ENV = "SERVIMG_SERVER"
OFF = ("0", "off", "no", "false")
HELP = frozenset({"-h", "--help", "--version"})
SPAWN_BACKOFF = 60.0  # seconds after a server failed to start before another is spawned
SERVING = b": serving "  # what a server's log says once it serves (resident.server)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# The server's boot: this process's sys.path exactly (the server must import what this process would),
# then resident.server.main with the identity's name. Run by this interpreter with its flags.
BOOT = (
    "import sys; sys.path[:] = sys.argv[2:]; "
    "from servimg.resident.server import main; sys.exit(main(sys.argv[1]))"
)


def main() -> int:
    argv = sys.argv[1:]
    where = _server_dir(argv)
    if where is None:
        return _in_process(argv)
    doc = identity.document()
    name = identity.name_of(doc)
    status = _served(os.path.join(where, f"{name}.sock"), doc, argv)
    if status is not None:
        return _exit_like(status)
    # Help is read and gone: a running server may answer it, but none is started for it.
    wanted = not HELP.intersection(argv) and _may_spawn(where, name)
    return _in_process(argv, spawn=name if wanted else None)


def _server_dir(argv: Sequence[str]) -> str | None:
    """Step 1: the private directory where this command's server would listen, or None."""
    if os.environ.get(OFF_ENV, "").lower() in OFF or os.environ.get("SLURM_JOB_ID"):
        return None
    if not argv or argv[0].startswith("-") or argv[0] == "server":
        return None
    where, _ = identity.server_dir()
    return where


def _served(path: str, doc: bytes, argv: Sequence[str]) -> int | None:
    """Steps 2–3: the worker's exit status, or None when no worker ran (run it in-process)."""
    try:
        sock = wire.connect(path)
    except OSError:
        return None
    try:
        pid = _request(sock, doc, argv)
        if pid is None:
            return None
        return _wait(sock, pid)
    finally:
        sock.close()


def _request(sock: _socket.socket, doc: bytes, argv: Sequence[str]) -> int | None:
    umask = os.umask(0o22)
    os.umask(umask)
    try:
        cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None  # a working directory we cannot open: in-process, where it still works
    try:
        request = {"run": list(argv), "argv0": sys.argv[0], "env": dict(os.environ), "umask": umask}
        wire.send(sock, {**request, "identity": doc}, fds=(0, 1, 2, cwd))
        reply, _ = wire.receive(sock)
    except (OSError, EOFError, wire.ProtocolError):
        return None
    finally:
        os.close(cwd)
    pid = reply.get("pid")
    return pid if isinstance(pid, int) else None


def _wait(sock: _socket.socket, pid: int) -> int:
    """Step 3: forward signals to the worker's group until the server reports its exit status."""

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            os.killpg(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        reply, _ = wire.receive(sock)
    except (OSError, EOFError, wire.ProtocolError) as exc:
        print(
            f"FAIL: the servimg server stopped answering while it ran this command (worker {pid}): {exc}",
            file=sys.stderr,
        )
        return 1
    finally:
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_DFL)
    code = reply.get("exit")
    return code if isinstance(code, int) else 1


def _exit_like(status: int) -> int:
    """Step 4: an exit code as it is; a signal's death (-N) died again here, so the caller sees it."""
    if status >= 0:
        return status
    signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
    return 128 - status  # the signal did not end us (blocked or ignored by our parent)


def _may_spawn(where: str, name: str) -> bool:
    """Whether to start this identity's server after an in-process run: not while one is starting (its
    log is there, it does not say it serves yet), nor within a minute of one that failed before it
    served (its log says why: `servimg server start` shows it), so a server that cannot start is not
    started again by every command. A server that served and died is replaced at once."""
    log = os.path.join(where, f"{name}.log")
    try:
        if abs(time.time() - os.stat(log).st_mtime) > SPAWN_BACKOFF:
            return True
        with open(log, "rb") as fh:
            return SERVING in fh.read(1 << 16)
    except OSError:
        return True


def _in_process(argv: Sequence[str], spawn: str | None = None) -> int:
    """Step 5: the command in this process; with `spawn`, that server started afterwards."""
    main = importlib.import_module(CLI).main
    code = 2
    try:
        code = int(main(list(argv)))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    finally:
        if spawn is not None and code != 2:
            with contextlib.suppress(OSError):
                spawn_server(spawn)
    return code


def spawn_server(name: str) -> int:
    """Start the server of this process's identity `name`, detached: its own session, its streams on
    /dev/null, every other descriptor closed (an inherited pipe held by a long-lived server would keep
    whoever reads it waiting), cwd /. Not waited for: it is ready when its socket answers. Its pid."""
    import subprocess  # the in-process path only: ≈10 ms a served command does not pay

    # This interpreter's settings (-O, -B, -s, -S, -E, -I, -X …, -W …) as the standard library's own
    # process launchers (multiprocessing) pass them on: the server's identity must be the client's.
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
    argv = [sys.executable, *flags, "-c", BOOT, name, *sys.path]
    null = subprocess.DEVNULL
    server = subprocess.Popen(
        argv, stdin=null, stdout=null, stderr=null, close_fds=True, start_new_session=True, cwd="/"
    )
    return server.pid
