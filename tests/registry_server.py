"""A real OCI registry for tests: Debian's `docker-registry` (CNCF distribution 2.8) on 127.0.0.1.

Usage:

    with RegistryServer() as server:
        client = RegistryClient(server.host)

`kill()` stops it abruptly (fault tests); `start()` again brings it back on the same port and storage.
Distribution 2.8 has no referrers API, which is exactly what the tag-index fallback must cope with.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

BINARY = "docker-registry"
# The account of conftest's `auth_registry` (a test secret: tests/test_secrets.py searches for it).
AUTH_USER = "ci-robot"
AUTH_PASSWORD = "Regi5try-s3cret-Pa55!"


def registry_available() -> bool:
    return shutil.which(BINARY) is not None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_htpasswd(path: Path, user: str, password: str) -> None:
    """An htpasswd file with a bcrypt hash (the only kind distribution accepts), made by libc's crypt(3)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # deprecated, gone in 3.13: callers skip when it is missing

    hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
    path.write_text(f"{user}:{hashed}\n")


def htpasswd_server(directory: Path, user: str, password: str) -> RegistryServer:
    """A (not yet started) registry that requires basic auth as `user`/`password`."""
    htpasswd = directory / "htpasswd"
    write_htpasswd(htpasswd, user, password)
    return RegistryServer(htpasswd=htpasswd)


class RegistryServer:
    """One `docker-registry serve` process with its own config and storage in a temporary directory."""

    def __init__(
        self, *, htpasswd: Path | None = None, port: int | None = None, seed: Path | None = None
    ) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="servimg-registry-"))
        if seed is not None:
            self._seed(seed)
        self.port = port or free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.host}"
        self.config = self._dir / "config.yml"
        self.log = self._dir / "registry.log"
        self.config.write_text(self._config_text(htpasswd))
        self._proc: subprocess.Popen[bytes] | None = None

    def _config_text(self, htpasswd: Path | None) -> str:
        text = (
            "version: 0.1\n"
            "log:\n  level: warn\n"
            "storage:\n"
            f"  filesystem:\n    rootdirectory: {self.storage}\n"
            "  delete:\n    enabled: true\n"
            # A fixed secret keeps upload sessions valid across a kill/start of the same server.
            f"http:\n  addr: {self.host}\n  secret: servimg-test-secret\n"
        )
        if htpasswd is not None:
            text += f"auth:\n  htpasswd:\n    realm: servimg-test\n    path: {htpasswd}\n"
        return text

    def _seed(self, seed: Path) -> None:
        """Start from a copy of another registry's storage, hard-linked: distribution writes a blob once
        (upload, then rename into place) and never rewrites it, and a blob that is already linked into a
        repository is only HEADed by a push, so the seed's files are read and never written. Used to give
        each fault test a registry that already holds the image's base blobs (gigabytes) without pushing
        them again; what the test is about (manifests, attestations, the tag) is pushed for real."""
        subprocess.run(["cp", "-al", str(seed), str(self.storage)], check=True)

    @property
    def storage(self) -> Path:
        """Its storage root (stop() removes it)."""
        return self._dir / "storage"

    def start(self, timeout: float = 15.0) -> RegistryServer:
        if self._proc is not None and self._proc.poll() is None:
            return self
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(
                [BINARY, "serve", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited early:\n{self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/", timeout=1):
                    return
            except urllib.error.HTTPError as exc:
                if exc.code == 401:  # auth-enabled registry: answering is enough
                    return
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"docker-registry did not answer on {self.url} within {timeout}s")

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), keeping storage so that `start()` can bring the same registry back."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RegistryServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
