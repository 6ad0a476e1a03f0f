"""Image arguments as docker users type them (backends/resolve.py, transport.resolve).

The decision is pure (the engine's image list in, a place out), so every rule is tested without an engine;
one docker test then pushes an image the engine holds by its name and by a short ID through the real CLI,
the way `docker push` would find it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fakebase as fb
from conftest import _require, docker, docker_available
from fakebase import on_host
from servimg.backends import engine, transport
from servimg.backends.registryclient import RegistryClient
from servimg.backends.resolve import EngineImage, resolve
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, ServimgError
from servimg.oci.store import BlobStore

A = Digest("sha256", "3f2a" + "1" * 60)
B = Digest("sha256", "3f2b" + "2" * 60)
C = Digest("sha256", "beef" + "3" * 60)
IMAGES = [
    EngineImage(A, ("servimg/vllm:demo-1",), ("127.0.0.1:5000/servimg/vllm@sha256:" + "9" * 64,)),
    EngineImage(B, ("ubuntu:22.04", "127.0.0.1:5000/mirror/ubuntu:22.04")),
    EngineImage(C, ("beef:latest",)),
]


def test_explicit_transports_are_taken_as_written() -> None:
    assert resolve("docker-daemon:anything", IMAGES).ref == "docker-daemon:anything"
    assert resolve("oci:/tmp/x:t", None).ref == "oci:/tmp/x:t"
    assert resolve("docker-archive:/tmp/a.tar", IMAGES).ref == "docker-archive:/tmp/a.tar"
    found = resolve("docker://ubuntu:22.04", IMAGES)  # the engine has it, but the user said the registry
    assert found.kind == "registry" and found.ref == "registry-1.docker.io/library/ubuntu:22.04"
    assert found.explicit
    with pytest.raises(ServimgError, match="invalid image reference"):
        resolve("docker://Not/Valid", IMAGES)


@pytest.mark.parametrize(
    ("text", "image_id", "location"),
    [
        ("servimg/vllm:demo-1", A, "servimg/vllm:demo-1"),
        ("docker.io/library/ubuntu:22.04", B, "docker.io/library/ubuntu:22.04"),  # docker's normalisation
        ("127.0.0.1:5000/mirror/ubuntu:22.04", B, "127.0.0.1:5000/mirror/ubuntu:22.04"),  # `docker push` too
        (
            "127.0.0.1:5000/servimg/vllm@sha256:" + "9" * 64,
            A,
            "127.0.0.1:5000/servimg/vllm@sha256:" + "9" * 64,
        ),
        (str(A), A, str(A)),
        (A.hex, A, str(A)),
        ("3f2a", A, str(A)),
        ("sha256:3f2b", B, str(B)),
        ("beef", C, "beef"),  # a name and the prefix of its own ID: one image, no ambiguity
    ],
)
def test_names_and_ids_the_engine_holds_resolve_to_the_engine(
    text: str, image_id: Digest, location: str
) -> None:
    found = resolve(text, IMAGES)
    assert (found.kind, found.image_id, found.target.location) == ("engine", image_id, location)
    assert found.ref == f"docker-daemon:{location}"
    assert "Docker Engine" in found.why and image_id.short in found.why


def test_names_the_engine_lacks_go_to_the_registry() -> None:
    found = resolve("servimg/vllm:other", IMAGES)
    assert (found.kind, found.ref) == ("registry", "registry-1.docker.io/servimg/vllm:other")
    assert "has no such image" in found.why and "registry-1.docker.io" in found.why
    hosted = resolve("127.0.0.1:5000/x/y:t", IMAGES)
    assert (hosted.kind, hosted.ref) == ("registry", "127.0.0.1:5000/x/y:t")
    assert resolve("127.0.0.1:5000/x/y:t", None).why.startswith("no Docker Engine is reachable")


def test_ambiguity_is_refused_with_the_candidates() -> None:
    with pytest.raises(BackendError) as info:
        resolve("3f2", IMAGES)
    assert "prefix of 2 engine image IDs" in info.value.message
    assert any(A.short in p for p in info.value.problems) and any(B.short in p for p in info.value.problems)
    assert "sha256:" in info.value.hint
    named_and_prefix = [*IMAGES, EngineImage(Digest("sha256", "abc" + "4" * 61), ("abc:latest",))]
    named_and_prefix.append(EngineImage(Digest("sha256", "abcd" + "5" * 60)))
    with pytest.raises(BackendError, match="names one engine image and prefixes other IDs"):
        resolve("abc", named_and_prefix)


def test_ids_without_a_matching_image_are_clear_errors() -> None:
    with pytest.raises(BackendError, match="no image with ID"):
        resolve("sha256:" + "0" * 64, IMAGES)
    with pytest.raises(BackendError, match="no image whose ID starts with sha256:0000"):
        resolve("sha256:0000", IMAGES)
    with pytest.raises(BackendError, match="no Docker Engine is reachable") as info:
        resolve("sha256:3f2a", None)
    assert "oci:DIR" in info.value.hint
    with pytest.raises(ServimgError, match="not an engine image and not a registry reference"):
        resolve("Bad Name!", IMAGES)


# --------------------------------------------------------------------------------- through the real CLI


@pytest.fixture(scope="module")
def engine_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A servimg-built image (on the fake base) in the engine under a name unique to this module, without
    a registry host: a name only docker's own resolution can find."""
    _require(docker_available(), "needs a running Docker Engine")
    root = tmp_path_factory.mktemp("resolve15")
    base = fb.make_base(root / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(root / "repo", base)
    cache = ["--cache", str(root / "cache")]
    assert fb.main(["lock", str(definition), *cache]) == 0
    assert fb.main(["build", str(definition), "--to", f"oci:{root / 'out'}", *cache]) == 0
    store = BlobStore(root / "cache")
    image = transport.fetch(f"oci:{root / 'out'}", on_host(store))
    name = "i15-resolve/fake:t"
    engine.load(image, store, tag=name)
    yield {"root": root, "image": image, "name": name}
    docker("rmi", "-f", name, check=False)


@pytest.mark.docker
@pytest.mark.registry
def test_push_finds_engine_images_by_name_and_short_id(
    engine_image: dict[str, Any], registry: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = engine_image["image"]
    report = tmp_path / "report.json"  # the fake base has no interpreter for the probe
    report.write_text(
        json.dumps({"checks": [{"code": "SOURCE", "status": "PASS", "subject": "s", "message": "m"}]})
    )
    cache = ["--cache", str(tmp_path / "cache")]
    short = image.config_digest.hex[:12]
    for n, typed in enumerate((engine_image["name"], short)):
        dest = f"{registry.host}/i15/resolve:{n}"
        assert fb.main(["push", typed, dest, "--report", str(report), *cache]) == 0
        said = capsys.readouterr()
        assert f"{typed}: the Docker Engine's image {image.config_digest.short}" in said.err
        with registry_client(registry.host) as client:
            assert client.head_manifest("i15/resolve", str(n))[0] == image.digest
    # What `ladder` runs: an engine name stays one; a registry ref becomes the engine image it loads as.
    store = BlobStore(tmp_path / "cache")
    assert transport.engine_name(engine_image["name"], on_host(store)) == engine_image["name"]
    pulled = transport.engine_name(f"docker://{registry.host}/i15/resolve:0", on_host(store))
    assert pulled == str(image.config_digest) and engine.has_image(image.config_digest)
    # The same name with the registry's transport written out reads the registry's copy.
    assert fb.main(["diff", "--files", f"docker://{registry.host}/i15/resolve:0", short, *cache]) == 0
    said = capsys.readouterr()
    assert f"{short}: the Docker Engine's image" in said.err


def registry_client(host: str) -> RegistryClient:
    return RegistryClient(host, retries=0)
