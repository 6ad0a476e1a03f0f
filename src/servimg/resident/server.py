"""The resident server: imports the CLI once, then forks a worker per client request.

Started detached by `resident.client.spawn_server` (`python -c BOOT NAME SYS_PATH…`), one per identity
(`resident.identity`): it holds `<dir>/<name>.lock` (flock) for its life, so a second one of the same
identity leaves at once, and listens on `<dir>/<name>.sock` (in a 0700 directory; a peer of another uid
is refused). Its stderr is `<dir>/<name>.log`.

Steps (`main`):
1. take the lock, or leave (another server of this identity is starting or serving);
2. import the CLI and what its commands need (`servimg.cli.preload`), then check that the identity it
   was started for is still its own (a file edited meanwhile: leave; the client ran in-process);
3. freeze what was imported out of the garbage collector (a worker's pages stay shared), bind, listen;
4. per `run` request: fork. The worker leaves every descriptor of the server, moves into its own
   process group and returns its `Job` up to `main`, where it becomes the client's process (`Job.run`:
   its standard streams, working directory, umask, environment, argv), runs `servimg.cli.main(argv)` and
   exits as the interpreter would (`_leave`). The server tells the client the worker's pid, and, when the
   worker's pidfd says it ended, its exit status;
5. a client that hangs up before its worker ended takes its command with it (SIGTERM to the worker's
   process group, as a closed terminal would);
6. leave when idle for SERVIMG_SERVER_IDLE seconds (default 600) with no worker running, on a `stop`
   request, or on SIGTERM — each after the running workers have ended and their clients have their
   status.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gc
import importlib
import os
import selectors
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import NoReturn

from servimg.resident import identity, wire

CLI = "servimg.cli"  # its preload() warms the server; its main(argv) runs a worker's command
IDLE_ENV = "SERVIMG_SERVER_IDLE"
DEFAULT_IDLE = 600.0
BACKLOG = 64
REQUEST_TIMEOUT = 5.0  # a client sends its request as soon as it is connected


@dataclass(frozen=True)
class Job:
    """A client's command, as the worker forked for it runs it."""

    argv: tuple[str, ...]
    argv0: str
    env: dict[str, str]
    umask: int
    streams: tuple[int, int, int]
    cwd: int

    @classmethod
    def parse(cls, message: dict[str, object], fds: list[int]) -> Job:
        """A `run` request and its descriptors (stdin, stdout, stderr, cwd); every problem named."""
        argv, env = message.get("run"), message.get("env")
        argv0, umask = message.get("argv0"), message.get("umask")
        problems = []
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            problems.append("run: not a list of strings")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            problems.append("env: not a mapping of strings")
        if not isinstance(argv0, str):
            problems.append("argv0: not a string")
        if not isinstance(umask, int) or not 0 <= umask <= 0o777:
            problems.append("umask: not a mode")
        if len(fds) != 4:
            problems.append(f"{len(fds)} descriptors, not 4 (stdin, stdout, stderr, cwd)")
        if problems:
            raise wire.ProtocolError("; ".join(problems))
        assert isinstance(argv, list) and isinstance(env, dict)
        assert isinstance(argv0, str) and isinstance(umask, int)
        return cls(tuple(argv), argv0, dict(env), umask, (fds[0], fds[1], fds[2]), fds[3])

    def run(self) -> NoReturn:
        """In the worker: become the client's process, run its command, exit with its status."""
        for number, fd in enumerate(self.streams):
            os.dup2(fd, number)
        os.fchdir(self.cwd)
        for fd in {*self.streams, self.cwd} - {0, 1, 2}:
            os.close(fd)
        os.umask(self.umask)
        os.environ.clear()
        os.environ.update(self.env)
        time.tzset()
        sys.argv = [self.argv0, *self.argv]
        # Line-buffered on a terminal, as the interpreter makes stdout when it starts on one.
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(line_buffering=os.isatty(1))
        code: int | str = 1
        try:
            code = int(importlib.import_module(CLI).main(list(self.argv)))
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int | str) else 1
        except KeyboardInterrupt:
            code = "interrupted"
        except BaseException:
            traceback.print_exc()
        _leave(code)


def _leave(code: int | str) -> NoReturn:
    """End the worker as the interpreter ends a process (its non-daemon threads joined, atexit run,
    streams flushed; a str exit code printed; KeyboardInterrupt re-delivered as SIGINT), but without
    tearing down every module the server imported: that touches each object once more, ≈30 ms of
    copy-on-write page faults per command (measured), for memory the kernel frees anyway."""
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx runs first
    atexit._run_exitfuncs()
    if isinstance(code, str) and code != "interrupted":
        print(code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    if code == "interrupted":
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code if isinstance(code, int) else 1)


@dataclass
class Worker:
    pid: int
    pidfd: int
    client: socket.socket | None  # None once the client hung up


@dataclass
class Server:
    """The serving loop's state: the listener, the workers running and the clients waiting on them."""

    where: str
    name: str
    doc: bytes
    lock: int
    listener: socket.socket
    idle: float
    bound: int  # the socket name's inode: removed on leaving only while it is still this server's
    wakeup: tuple[int, int] = field(default_factory=lambda: _pipe())  # SIGTERM's wakeup fd
    term: bool = False  # SIGTERM arrived
    started: float = field(default_factory=time.time)
    served: int = 0
    stopping: bool = False
    workers: dict[int, Worker] = field(default_factory=dict)  # by pidfd
    clients: dict[int, Worker] = field(default_factory=dict)  # by the client socket's fd
    selector: selectors.DefaultSelector = field(default_factory=selectors.DefaultSelector)

    @property
    def socket_path(self) -> str:
        return os.path.join(self.where, f"{self.name}.sock")

    def serve(self) -> Job | None:
        """Serve until it is time to leave (None); in a forked worker, return that worker's Job."""
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wakeup[0], selectors.EVENT_READ)
        signal.set_wakeup_fd(self.wakeup[1], warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_term)
        last = time.monotonic()
        while not (self.stopping and not self.workers):
            idle = None if self.workers or self.stopping else max(0.0, last + self.idle - time.monotonic())
            events = self.selector.select(idle)
            if self.term:
                self.stop()
            if not events and not self.workers and time.monotonic() - last >= self.idle:
                break
            for key, _mask in events:
                if key.fileobj is self.listener:
                    job = self._accept()
                    if job is not None:
                        return job
                elif key.fd in self.workers:
                    self._reap(self.workers.pop(key.fd))
                elif key.fd in self.clients:
                    self._hung_up(self.clients.pop(key.fd))
                elif key.fd == self.wakeup[0]:
                    _drain(self.wakeup[0])
            last = time.monotonic()
        if not self.stopping:
            self._unlink()
        return None

    def _on_term(self, signum: int, frame: object) -> None:
        self.term = True  # the wakeup fd ends the select; the loop stops there

    def _accept(self) -> Job | None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return None
        try:
            job = self._request(sock)
        except (OSError, EOFError, wire.ProtocolError) as exc:
            _say(f"a request failed: {exc}")
            job = None
        if job is None:
            sock.close()
            return None
        pid = os.fork()
        if pid == 0:
            self._become_worker(sock)
            return job  # the worker owns the descriptors now
        for fd in {*job.streams, job.cwd}:
            os.close(fd)
        self._track(pid, sock)
        return None

    def _request(self, sock: socket.socket) -> Job | None:
        """Read one request: a Job to fork for, or None when it was answered here (control, refusal)."""
        sock.settimeout(REQUEST_TIMEOUT)
        if wire.peer_uid(sock) != os.geteuid():
            wire.send(sock, {"refused": "this server runs commands for another user"})
            return None
        message, fds = wire.receive(sock, wire.MAX_FDS)
        try:
            if "control" in message:  # any of this user's servers answers status and stop
                self._control(sock, message["control"])
            elif message.get("identity") != self.doc:
                wire.send(sock, {"refused": "this server serves another environment"})
            elif self.stopping:
                wire.send(sock, {"refused": "the server is stopping"})
            else:
                job = Job.parse(message, fds)
                fds = []
                return job
        finally:
            for fd in fds:
                os.close(fd)
        return None

    def _track(self, pid: int, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the worker does it too: whichever runs first, the group exists
            os.setpgid(pid, pid)
        worker = Worker(pid, os.pidfd_open(pid), sock)
        self.workers[worker.pidfd] = worker
        self.clients[sock.fileno()] = worker
        self.selector.register(worker.pidfd, selectors.EVENT_READ)
        self.selector.register(sock, selectors.EVENT_READ)
        self.served += 1
        try:
            sock.settimeout(None)
            wire.send(sock, {"pid": pid})
        except OSError:
            self._hung_up(self.clients.pop(sock.fileno()))

    def _become_worker(self, mine: socket.socket) -> None:
        """In the child: the default signal dispositions, none of the server's descriptors."""
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.selector.close()
        self.listener.close()
        os.close(self.wakeup[0])
        os.close(self.wakeup[1])
        for worker in self.workers.values():
            os.close(worker.pidfd)
            if worker.client is not None:
                worker.client.close()
        mine.close()
        os.close(self.lock)  # the server's flock stays the server's

    def _reap(self, worker: Worker) -> None:
        self.selector.unregister(worker.pidfd)
        _, status = os.waitpid(worker.pid, 0)
        os.close(worker.pidfd)
        client = worker.client
        if client is not None:
            self.clients.pop(client.fileno(), None)
            self.selector.unregister(client)
            with contextlib.suppress(OSError):
                wire.send(client, {"exit": os.waitstatus_to_exitcode(status)})
            client.close()

    def _hung_up(self, worker: Worker) -> None:
        """The client is gone (or sent more than its request): its command goes with it."""
        if worker.client is not None:
            self.selector.unregister(worker.client)
            worker.client.close()
            worker.client = None
        with contextlib.suppress(OSError):
            os.killpg(worker.pid, signal.SIGTERM)

    def _control(self, sock: socket.socket, what: object) -> None:
        if what == "status":
            wire.send(sock, {"status": self.status()})
        elif what == "stop":
            wire.send(sock, {"stopping": os.getpid()})
            self.stop()
        else:
            wire.send(sock, {"refused": f"unknown control request {what!r}"})

    def status(self) -> dict[str, object]:
        return {
            "pid": os.getpid(),
            "name": self.name,
            "socket": self.socket_path,
            "started": self.started,
            "served": self.served,
            "running": len(self.workers),
            "idle_timeout": self.idle,
            "python": sys.executable,
            "package": identity.PACKAGE_DIR,
        }

    def stop(self) -> None:
        """Take no more requests; the loop ends when the running workers have."""
        if not self.stopping:
            self.stopping = True
            self.selector.unregister(self.listener)
            self._unlink()
            self.listener.close()

    def _unlink(self) -> None:
        """Remove the socket name if it is still this server's (a later server may have bound it)."""
        try:
            if os.stat(self.socket_path).st_ino == self.bound:
                os.unlink(self.socket_path)
        except OSError:
            pass


def main(name: str) -> int:
    """The server's life (steps 1–6): 0 when it served and left, 1 when it could not serve. A worker never
    returns: it exits with its command's status (`Job.run`)."""
    where, why = identity.server_dir()
    if where is None:
        _say(f"no server: {why}")
        return 1
    files = {kind: os.path.join(where, f"{name}.{kind}") for kind in ("lock", "log", "sock")}
    lock = _lock(files["lock"])
    if lock is None:
        return 0  # another server of this identity holds the lock
    _log_to(files["log"])
    os.chdir("/")
    importlib.import_module(CLI).preload()
    doc = identity.document()
    if identity.name_of(doc) != name:
        _say("the environment changed while the server started (a file of servimg edited?); leaving")
        os.unlink(files["lock"])
        return 1
    listener, bound = _listen(files["sock"])
    server = Server(where, name, doc, lock, listener, _idle(), bound)
    gc.collect()
    gc.freeze()
    _say(f"serving {name} (idle timeout {server.idle:g} s)")  # resident.client.SERVING reads this
    job = server.serve()
    if job is not None:
        job.run()
    # Leaving cleanly leaves nothing behind; the lock file goes while we still hold it (`_lock`).
    os.unlink(files["log"])
    os.unlink(files["lock"])
    return 0


def _lock(path: str) -> int | None:
    """The identity's lock, held for the server's life; None when another server holds it. A lock file
    removed by a server that left between our open and our flock is not the lock any more: retry."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _log_to(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


def _listen(path: str) -> tuple[socket.socket, int]:
    """Bind the socket name (a stale one, of a server that died, is replaced: we hold the lock); the
    listener and the inode of the name."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(BACKLOG)
    return listener, os.stat(path).st_ino


def _pipe() -> tuple[int, int]:
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    return read, write


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _idle() -> float:
    try:
        return max(0.1, float(os.environ.get(IDLE_ENV) or DEFAULT_IDLE))
    except ValueError:
        return DEFAULT_IDLE


def _say(message: str) -> None:
    print(f"servimg server {os.getpid()}: {message}", file=sys.stderr, flush=True)
