"""One question to the local Docker Engine without its SDK: which image ID a name has, from one plain
`GET /images/NAME/json` on the engine's unix socket. Standard library only, so a warm rebuild
(`servimg.build.actioncache`) and a base read before (`backends.engine.read_engine`) ask it without
importing the SDK (and requests, urllib3: ≈0.2–0.3 s)."""

from __future__ import annotations

import json
import os
import socket
import urllib.parse

from servimg.core.digest import Digest
from servimg.core.errors import ServimgError

DEFAULT_SOCKET = "/var/run/docker.sock"


def socket_image_id(ref: str, timeout: float = 10) -> Digest | None:
    """The engine's image ID for `ref` from one `GET /images/REF/json` on its unix socket, without the
    SDK (importing it and its ping cost ≈0.2–0.3 s, a warm rebuild's largest part when its base is an
    engine image). HTTP/1.0, so the engine closes the connection after its answer and no chunked body
    comes back (written by hand: http.client alone imports ssl and email, ≈0.03 s). None whenever that
    does not answer plainly (DOCKER_HOST names TCP or TLS, no socket, no such image, anything odd): the
    caller then asks through the SDK, with its errors."""
    host = os.environ.get("DOCKER_HOST", f"unix://{DEFAULT_SOCKET}")
    if not host.startswith("unix://") or os.environ.get("DOCKER_TLS_VERIFY"):
        return None
    path = f"/images/{urllib.parse.quote_plus(ref, safe='/:')}/json"  # quoted as the SDK quotes it
    answer = b""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(host.removeprefix("unix://"))
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
            while len(answer) < 1 << 22 and (chunk := sock.recv(1 << 16)):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or status[1] != b"200" or b"transfer-encoding" in head.lower():
            return None
        return Digest.parse(str(json.loads(body)["Id"]))
    except (OSError, ValueError, KeyError, TypeError, ServimgError):
        return None
