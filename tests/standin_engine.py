"""A stand-in Docker Engine on a unix socket answering `GET /images/NAME/json` from a table (name →
image ID), for what asks the engine's socket by hand (servimg.backends.enginesocket). Every path asked
is appended to `seen`."""

from __future__ import annotations

import http.server
import json
import socketserver
from pathlib import Path

from servimg.core.digest import Digest


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve(sock: Path, images: dict[str, Digest], seen: list[str]) -> Server:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            name = self.path.removeprefix("/images/").removesuffix("/json")
            found = images.get(name)
            body = json.dumps({"Id": str(found)} if found else {"message": "No such image"}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

        def address_string(self) -> str:
            return "unix"

    return Server(str(sock), Handler)
