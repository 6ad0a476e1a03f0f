"""Starting, listing and stopping this user's resident servers: `servimg server start|status|stop`."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import time

from servimg.core import jsonview as jv
from servimg.core.errors import ResidentError
from servimg.resident import identity, wire
from servimg.resident.client import spawn_server

QUERY_TIMEOUT = 2.0
POLL = 0.05


def where() -> str:
    """This user's server directory, or why there is none."""
    found, why = identity.server_dir()
    if found is None:
        raise ResidentError(
            f"no place for servers: {why}", hint=f"set {identity.DIR_ENV} to a directory of yours"
        )
    return found


def ask(path: str, what: str, timeout: float = QUERY_TIMEOUT) -> dict[str, object]:
    """A control request (`status`, `stop`) to the server at `path`. OSError, EOFError or
    wire.ProtocolError when none answers there."""
    sock = wire.connect(path, timeout)
    try:
        wire.send(sock, {"control": what})
        reply, _ = wire.receive(sock)
    finally:
        sock.close()
    return reply


def start(wait: float = 30.0) -> dict[str, object]:
    """The status of the server of this process's environment, started now unless it runs."""
    doc = identity.document()
    name = identity.name_of(doc)
    path = os.path.join(where(), f"{name}.sock")
    deadline = time.monotonic() + wait
    spawned = False
    while True:
        try:
            reply = ask(path, "status")
        except (OSError, EOFError, wire.ProtocolError):
            reply = {}
        if isinstance(reply.get("status"), dict):
            return {**jv.obj(reply["status"]), "started_now": spawned}
        if not spawned:
            spawn_server(name)
            spawned = True
        if time.monotonic() > deadline:
            raise ResidentError(
                f"the server for this environment ({name}) did not answer within {wait:g} s",
                hint=f"its log: {os.path.join(where(), name + '.log')}",
            )
        time.sleep(POLL)


def servers() -> list[tuple[str, dict[str, object] | None]]:
    """Every server socket of this user, with the status its server gives (None: no server answers:
    it died and left its socket behind)."""
    found: list[tuple[str, dict[str, object] | None]] = []
    top = where()
    for entry in sorted(os.listdir(top)):
        if entry.endswith(".sock"):
            path = os.path.join(top, entry)
            try:
                status = ask(path, "status").get("status")
            except (OSError, EOFError, wire.ProtocolError):
                status = None
            found.append((path, status if isinstance(status, dict) else None))
    return found


def stop(path: str, wait: float = 30.0) -> int | None:
    """Stop the server at `path` (it ends once its running commands have); the pid it had. None for a
    stale socket: it is removed, with its lock when no server holds it (the log stays: why it died)."""
    try:
        reply = ask(path, "stop")
    except (OSError, EOFError, wire.ProtocolError):
        _remove_stale(path)
        return None
    pid = reply.get("stopping")
    if not isinstance(pid, int):
        raise ResidentError(f"{path}: the server did not accept the stop request: {reply}")
    if not _ended(pid, wait):
        raise ResidentError(
            f"{path}: server {pid} still runs commands after {wait:g} s; it stops after them",
            hint="`servimg server status` shows what it still runs",
        )
    return pid


def _remove_stale(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    lock = path.removesuffix(".sock") + ".lock"
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(lock)  # held by us now: a server starting later makes a new one
    except BlockingIOError:
        pass  # a server of this identity is starting: it binds its own socket
    finally:
        os.close(fd)


def _ended(pid: int, wait: float) -> bool:
    """Whether process `pid` ends within `wait` seconds: its pidfd turns readable when it exits, reaped
    or not (the server's parent is whoever reaps orphans here, maybe late)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([pidfd], [], [], wait)[0])
    finally:
        os.close(pidfd)
