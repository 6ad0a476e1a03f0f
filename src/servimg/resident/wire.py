"""What a client and its server say on the unix socket: length-prefixed messages, with file descriptors.

A message is 4 bytes of length (big-endian) and a marshal'd dict. marshal, not JSON: both ends are the
same interpreter (their identities are equal), it costs the client no import, and the peer is checked to
be the same user before anything it sent is read (`peer_uid`). The first chunk of a message may carry
file descriptors (SCM_RIGHTS): the client's stdin, stdout, stderr and working directory.

Client → server: `{"run": argv, "argv0", "env", "umask", "identity"}` with those four descriptors, or
`{"control": "status" | "stop"}` (any server of the same user answers it). Server → client: `{"pid": N}`
once the worker runs, then `{"exit": CODE}` (the worker's exit status; -N: killed by signal N);
`{"refused": WHY}`, `{"status": {...}}`, `{"stopping": PID}`.
"""

from __future__ import annotations

import _socket
import array
import contextlib
import marshal
import os

TYPE_CHECKING = False  # typing itself is ≈10 ms of a served command's start (resident.client)
if TYPE_CHECKING:
    from collections.abc import Sequence

MAX_MESSAGE = 1 << 22  # an argv and an environment: far below this
MAX_FDS = 4
_INT = array.array("i").itemsize


class ProtocolError(Exception):
    """The peer sent something that is not a message of this protocol."""


def connect(path: str, timeout: float | None = None) -> _socket.socket:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


def send(sock: _socket.socket, message: dict[str, object], fds: Sequence[int] = ()) -> None:
    body = marshal.dumps(message)
    data = len(body).to_bytes(4, "big") + body
    ancillary = [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sent = sock.sendmsg([data], ancillary)
    while sent < len(data):
        sent += sock.send(data[sent:])


def receive(sock: _socket.socket, max_fds: int = 0) -> tuple[dict[str, object], list[int]]:
    """One message and the descriptors that came with it (the caller owns and closes them). EOFError:
    the peer closed before a message began."""
    fds: list[int] = []
    space = _socket.CMSG_SPACE(max_fds * _INT) if max_fds else 0
    try:
        head, ancillary, _flags, _addr = sock.recvmsg(4, space)
        for level, kind, payload in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[: len(payload) - len(payload) % _INT])
                fds.extend(got)
        if not head:
            raise EOFError("the peer closed the connection")
        head += _exactly(sock, 4 - len(head))
        size = int.from_bytes(head, "big")
        if size > MAX_MESSAGE:
            raise ProtocolError(f"a message of {size} bytes")
        try:
            message = marshal.loads(_exactly(sock, size))
        except (ValueError, EOFError, TypeError) as exc:  # bytes that are no marshal data
            raise ProtocolError(f"a message that does not decode: {exc}") from None
    except BaseException:
        for fd in fds:
            _close(fd)
        raise
    if not isinstance(message, dict) or not all(isinstance(k, str) for k in message):
        for fd in fds:
            _close(fd)
        raise ProtocolError("a message that is not a mapping")
    return message, fds


def peer_uid(sock: _socket.socket) -> int:
    """The uid of the process at the other end (SO_PEERCRED: pid, uid, gid as three ints)."""
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 3 * _INT)
    return int(array.array("i", creds)[1])


def _exactly(sock: _socket.socket, size: int) -> bytes:
    chunks = []
    while size > 0:
        chunk = sock.recv(min(size, 1 << 16))
        if not chunk:
            raise ProtocolError("the peer closed the connection inside a message")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
