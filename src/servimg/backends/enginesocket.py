"""The local Docker Engine's API without its SDK: plain HTTP/1.0 requests on the engine's unix socket.
Standard library only, so a build that only inspects, loads and tags (the `--to docker` sink, a base read
before in `backends.engine.read_engine`) never imports the SDK and requests/urllib3 (≈0.2 s) nor pays its
client set-up and version ping (≈0.09 s a client).

HTTP/1.0, so the engine closes the connection after its answer and never sends a chunked body (written
by hand: `http.client` alone imports ssl and email, ≈0.03 s). `request` answers None whenever this
cannot be asked plainly (DOCKER_HOST names TCP or TLS, no socket, a broken connection, an answer that
is not plain HTTP): the caller then goes the SDK's way, with its errors.
"""

from __future__ import annotations

import json
import os
import socket
import urllib.parse
from dataclasses import dataclass
from typing import Any, BinaryIO

from servimg.core.digest import Digest
from servimg.core.errors import ServimgError

DEFAULT_SOCKET = "/var/run/docker.sock"
MAX_ANSWER = 1 << 22  # inspect and load answers are a few KB; an endless one is not read whole


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return json.loads(self.body)


def socket_path() -> str | None:
    """The engine's unix socket from DOCKER_HOST (default /var/run/docker.sock); None for TCP or TLS."""
    host = os.environ.get("DOCKER_HOST", f"unix://{DEFAULT_SOCKET}")
    if not host.startswith("unix://") or os.environ.get("DOCKER_TLS_VERIFY"):
        return None
    return host.removeprefix("unix://")


def quoted(ref: str) -> str:
    return urllib.parse.quote_plus(ref, safe="/:")  # as the SDK quotes an image name in a path


def request(method: str, path: str, *, body: BinaryIO | None = None, timeout: float = 10) -> Answer | None:
    """One request; `body` (a file, sent from its position to its end) goes as an x-tar upload."""
    where = socket_path()
    if where is None:
        return None
    head = f"{method} {path} HTTP/1.0\r\nHost: docker\r\n"
    if body is not None:
        size = os.fstat(body.fileno()).st_size - body.tell()
        head += f"Content-Type: application/x-tar\r\nContent-Length: {size}\r\n"
    answer = b""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(where)
            sock.sendall(f"{head}\r\n".encode())
            if body is not None:
                sock.sendfile(body)
            while len(answer) < MAX_ANSWER and (chunk := sock.recv(1 << 16)):
                answer += chunk
    except OSError:
        return None
    header, _, data = answer.partition(b"\r\n\r\n")
    status = header.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or not status[1].isdigit() or b"transfer-encoding" in header.lower():
        return None
    return Answer(int(status[1]), data)


def image_answer(ref: str, timeout: float = 10) -> Answer | None:
    """`GET /images/REF/json` (docker image inspect): 200 with the image's JSON, 404 without it."""
    return request("GET", f"/images/{quoted(ref)}/json", timeout=timeout)


def image_id_in(answer: Answer | None) -> Digest | None:
    """The image ID an inspect answer names; None unless it is a plain 200 with one."""
    if answer is None or answer.status != 200:
        return None
    try:
        return Digest.parse(str(answer.json()["Id"]))
    except (ValueError, KeyError, TypeError, ServimgError):
        return None


def socket_image_id(ref: str, timeout: float = 10) -> Digest | None:
    """The engine's image ID for `ref` from one `GET /images/REF/json`; None when that does not answer
    plainly with one (no such image included: the caller asks through the SDK, with its errors)."""
    return image_id_in(image_answer(ref, timeout))
