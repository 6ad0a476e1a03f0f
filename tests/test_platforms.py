"""Multi-platform images (docs/platforms.md): linux/amd64 + linux/arm64 from one definition and one lock.

The fast tests pin the values (platforms, the index's canonical bytes, the definition's `platforms:`, the
lock of all platforms, pins per architecture, the emulation check). The end-to-end test builds the small
test base for both platforms (arm64 under qemu), pushes the index to a real registry, builds and signs a
two-platform image on it twice (one index digest), pulls each platform with Docker Engine
(`docker pull --platform`: servimg's config digest), verifies both children, checks the index, and then
replaces one child with an image of another lock: `check` FAILs in a row that names the platform. The
first build's tag is GPG-signed too (`--gpg-key`): skopeo under the exported `signedBy` policy copies it
and refuses the second, unsigned one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import fakebase
from conftest import REPO, _require, docker_available
from fakebase import HOST_SEAMS, on_host
from servimg.assembly.context import Context
from servimg.attesting.attach import AttestingSink, GpgPlan
from servimg.authoring.rebase import RebaseRequest, rebase
from servimg.backends.target import Target
from servimg.bases import debpins
from servimg.cli import main
from servimg.core.digest import Digest
from servimg.core.errors import BuildError, DefinitionError, LockError, RebaseError, UsageError
from servimg.core.platform import Platform
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import Lock, check_drift
from servimg.definitions.platformlock import Locks, PlatformLocks, load_any
from servimg.oci.image import OCI_INDEX, Image
from servimg.oci.index import ImageIndex
from servimg.oci.store import BlobStore
from servimg.patching import emulation
from servimg.signing.gpgsign import GpgSigner
from test_cosign_interop import gpg, gpg_key, skopeo_copy

AMD64, ARM64 = Platform("linux", "amd64"), Platform("linux", "arm64")
EXAMPLE = REPO / "images" / "tiny-multiarch.yaml"


# ----------------------------------------------------------------------------------------------- values


def test_platforms_parse_and_refuse_what_servimg_cannot_build() -> None:
    assert Platform.parse_list("linux/arm64,linux/amd64") == (ARM64, AMD64)
    assert str(ARM64) == "linux/arm64" and ARM64.index_entry() == {"architecture": "arm64", "os": "linux"}
    with pytest.raises(UsageError, match="unsupported platform 'linux/s390x'") as exc:
        Platform.parse("linux/s390x")
    assert "linux/amd64, linux/arm64" in exc.value.hint
    with pytest.raises(UsageError, match="given twice"):
        Platform.parse_list("linux/amd64,linux/amd64")


def _image(arch: str) -> Image:
    config = {"architecture": arch, "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}, "config": {}}
    return Image.create(config, [])


def test_index_is_canonical_sorted_and_reads_back() -> None:
    arm, amd = _image("arm64"), _image("amd64")
    one = ImageIndex.of({ARM64: arm, AMD64: amd}, {"io.servimg.lock": "sha256:" + "a" * 64})
    two = ImageIndex.of({AMD64: amd, ARM64: arm}, {"io.servimg.lock": "sha256:" + "a" * 64})
    assert one.index_bytes == two.index_bytes  # the order children were given in does not matter
    doc = json.loads(one.index_bytes)
    assert doc["mediaType"] == OCI_INDEX and doc["schemaVersion"] == 2
    assert [m["platform"]["architecture"] for m in doc["manifests"]] == ["amd64", "arm64"]
    assert doc["manifests"][1]["digest"] == str(arm.digest)
    read = ImageIndex.parse(one.index_bytes)
    assert read.digest == one.digest and read.platforms == (AMD64, ARM64)
    assert read.child(ARM64).digest == arm.digest
    with pytest.raises(UsageError, match="has no linux/ppc64le image"):
        read.child(Platform("linux", "ppc64le"))


def test_index_parse_refuses_a_platform_listed_twice() -> None:
    entry = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "size": 1,
        "digest": "sha256:" + "b" * 64,
    }
    doc = {
        "schemaVersion": 2,
        "manifests": [{**entry, "platform": {"os": "linux", "architecture": "arm64"}}] * 2,
    }
    with pytest.raises(Exception, match="malformed image index") as exc:
        ImageIndex.parse(json.dumps(doc).encode())
    assert any("listed twice" in p for p in exc.value.problems)  # type: ignore[attr-defined]


def _definition(base: str) -> str:
    text = EXAMPLE.read_text()
    start = text.index("base:")
    end = text.index("packages:")
    return text[:start] + base + text[end:]


def test_definition_platforms_forms_and_refusals() -> None:
    listed = ImageDefinition.parse(EXAMPLE.read_bytes())
    assert listed.multi_platform and listed.platforms == (AMD64, ARM64)
    for exclude_defaults in (False, True):  # its JSON (provenance, rebase) reads back to it
        assert ImageDefinition.from_mapping(listed.to_json(exclude_defaults=exclude_defaults)) == listed
    assert "platform" not in listed.to_json()["base"]  # exclusive with platforms: the default is moot
    arm = listed.for_platform(ARM64)
    assert (
        arm.base.platform == "linux/arm64"
        and arm.base.digest == listed.base.digest
        and not arm.multi_platform
    )
    own = ImageDefinition.parse(
        _definition(
            "base:\n  ref: docker-daemon:a\n  digest: sha256:" + "1" * 64 + "\n  platforms:\n"
            "    - linux/amd64\n    - {platform: linux/arm64, ref: docker-daemon:b, digest: sha256:"
            + "2" * 64
            + "}\n"
        )
    )
    assert own.for_platform(ARM64).base.ref == "docker-daemon:b"
    assert own.for_platform(AMD64).base.ref == "docker-daemon:a"
    bad = (
        "base:\n  ref: docker-daemon:a\n  digest: sha256:" + "1" * 64 + "\n  platform: linux/amd64\n"
        "  platforms: [linux/amd64, linux/amd64, linux/mips, {platform: linux/arm64, ref: docker-daemon:b}]\n"
    )
    with pytest.raises(DefinitionError) as exc:
        ImageDefinition.parse(_definition(bad))
    problems = " ".join(exc.value.problems)
    assert "unsupported platform 'linux/mips'" in problems
    assert "give both `ref` and `digest`" in problems


def test_a_single_platform_definition_keeps_its_digest() -> None:
    """`platforms` is left out of the canonical JSON when empty: the demo's lock still names it."""
    demo = ImageDefinition.load(REPO / "images" / "demo.yaml")
    assert "platforms" not in json.loads(demo.canonical_bytes())["base"]
    assert Lock.load(REPO / "images" / "demo.lock.json").definition_sha256 == demo.digest.hex


def test_every_lock_names_the_platforms_it_pins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """N >= 1 (issue 49): `servimg lock` reports the platforms it pinned for one platform as for several,
    and the lock file of one platform keeps its format (no `platforms` key: no digest moves)."""
    base = fakebase.make_base(tmp_path / "base", [fakebase.tar(fakebase.package_members())])
    definition = fakebase.make_repo(tmp_path / "repo", base)
    assert fakebase.main(["lock", str(definition), "--cache", str(tmp_path / "cache"), "--json"]) == 0
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said["status"] == "OK" and said["platforms"] == ["linux/amd64"], said
    assert "platforms" not in json.loads(definition.with_name("tiny.lock.json").read_text())


def multi_platform_lock(path: Path) -> PlatformLocks:
    locked = load_any(path)
    assert isinstance(locked, PlatformLocks), path
    return locked


def test_the_example_lock_pins_every_platform_and_drift_names_it(tmp_path: Path) -> None:
    locked = multi_platform_lock(REPO / "images" / "tiny-multiarch.lock.json")
    definition = ImageDefinition.load(EXAMPLE)
    assert locked.definition_sha256 == definition.digest.hex
    assert sorted(locked.platforms) == ["linux/amd64", "linux/arm64"]
    for platform in definition.platforms:
        part = locked.of(platform)
        assert part.definition_sha256 == definition.for_platform(platform).digest.hex
        assert part.base.index_digest == definition.base.digest  # picked from the pinned index
    arm = locked.platforms["linux/arm64"]
    moved = PlatformLocks(
        locked.name,
        locked.definition_sha256,
        {**locked.platforms, "linux/arm64": Lock.from_json({**arm.to_json(), "source_date_epoch": 1})},
    )
    with pytest.raises(LockError, match="platform\\(s\\) linux/arm64") as exc:
        check_drift(locked, moved, EXAMPLE)
    assert any(p.startswith("linux/arm64.source_date_epoch") for p in exc.value.problems)
    # A lock of the other shape is refused, naming both (a definition that gained or lost base.platforms).
    (tmp_path / "images").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "images" / "x.yaml")
    shutil.copy(REPO / "images" / "demo.lock.json", tmp_path / "images" / "x.lock.json")
    with pytest.raises(LockError, match=r"locks one platform \(base\.platform\), .* builds several") as shape:
        Locks.read(definition, tmp_path / "images" / "x.yaml")
    assert "servimg lock" in (shape.value.hint or "")


def test_pins_carry_their_architecture_and_amd64_keys_do_not_move() -> None:
    amd = debpins.load_pins("test-bookworm")
    arm = debpins.load_pins("test-bookworm.arm64")
    assert amd.arch == "amd64" and "arch:" not in amd.render()
    assert arm.arch == "arm64" and arm.render().splitlines()[3] == "arch: arm64"
    assert "arch" not in amd.key_document() and arm.key_document()["arch"] == "arm64"
    assert {p.arch for p in arm.packages} <= {"arm64", "all"}
    assert debpins.DebianPins.parse(arm.render()) == arm
    wrong = arm.render().replace("arch: arm64\n", "")
    with pytest.raises(debpins.DebianError) as exc:
        debpins.DebianPins.parse(wrong)
    assert any("pinned for arm64, the file for amd64" in p for p in exc.value.problems)


def test_emulation_check_says_what_is_missing(tmp_path: Path) -> None:
    foreign = ARM64 if Platform.host() == AMD64 else AMD64
    handler = emulation.HANDLERS[foreign.architecture]
    assert emulation.problem(Platform.host(), tmp_path) is None  # native: nothing needed
    assert "not mounted" in str(emulation.problem(foreign, tmp_path))
    (tmp_path / "status").write_text("enabled\n")
    assert "no binfmt_misc handler" in str(emulation.problem(foreign, tmp_path))
    (tmp_path / handler).write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/x\nflags: P\n")
    assert "lacks the F flag" in str(emulation.problem(foreign, tmp_path))
    (tmp_path / handler).write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/x\nflags: PF\n")
    assert emulation.problem(foreign, tmp_path) is None


# ----------------------------------------------------------------------------------------- end to end


def _json(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]]]:
    capfd.readouterr()
    code = main([*argv, "--json", "-q"])
    out = capfd.readouterr().out
    lines = [json.loads(line[line.index('{"') :]) for line in out.splitlines() if '{"' in line]
    return code, lines


@pytest.fixture(scope="session")
def two_platform_base(registry: Any) -> dict[str, Any]:
    """The test base for amd64 and arm64 (arm64 under qemu), the index pushed to the test registry."""
    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    foreign = ARM64 if Platform.host() == AMD64 else AMD64
    _require(emulation.problem(foreign) is None, f"needs qemu for {foreign}: bash scripts/setup.sh")
    from servimg.bases.platforms import build_platforms
    from servimg.oci.store import BlobStore

    return build_platforms(
        "test-bookworm",
        (AMD64, ARM64),
        on_host(BlobStore()),
        targets=[Target.parse(f"{registry.host}/servimg/test-base")],
    )


@pytest.fixture(scope="session")
def two_platform_repo(
    tmp_path_factory: pytest.TempPathFactory, two_platform_base: dict[str, Any], registry: Any
) -> Path:
    """A checkout whose tiny-multiarch definition names the index in the test registry, locked there."""
    repo = tmp_path_factory.mktemp("multiarch")
    shutil.copytree(REPO / "images", repo / "images")
    shutil.copytree(REPO / "overlays", repo / "overlays")
    path = repo / "images" / "tiny-multiarch.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["base"]["ref"] = f"{registry.host}/servimg/test-base:{two_platform_base['tag']}"
    doc["base"]["digest"] = two_platform_base["digest"]
    doc["repository"] = f"{registry.host}/servimg/tiny-multiarch"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["lock", str(path), "-q"]) == 0
    return repo


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.root
def test_two_platform_build_pulls_verifies_checks_and_names_a_replaced_child(
    two_platform_repo: Path,
    registry: Any,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _require(docker_available(), "needs a running Docker Engine")
    assert two_platform_base_is_pinned(two_platform_repo)
    definition = two_platform_repo / "images" / "tiny-multiarch.yaml"
    key = tmp_path / "keys"
    assert main(["key", "generate", "--out", str(key), "-q"]) == 0
    repo = f"{registry.host}/servimg/tiny-multiarch"
    sign = ["--sign", str(key / "servimg.key"), "--formats", "oci"]
    gpg_signed = _gpg_signing(tmp_path, registry.host, monkeypatch)
    code, [first] = _json(capfd, "build", str(definition), "--to", repo, *sign, *gpg_signed.flags)
    assert code == 0, first
    code, [second] = _json(capfd, "build", str(definition), "--to", f"{repo}-again", *sign)
    assert code == 0 and second["digest"] == first["digest"]  # two builds, one index digest
    assert first["bytecode"]["files"] >= 1 and first["bytecode"]["identical"], first["bytecode"]
    tag = f"{repo}:{first['tag']}"

    # containers/image judges a `signedBy` policy on the manifest the tag names, here the index: the
    # GPG-signed one is copied, the same index pushed without --gpg-key is refused.
    done = skopeo_copy({}, gpg_signed.policy, tag, tmp_path)
    assert done.returncode == 0, done.stderr
    done = skopeo_copy({}, gpg_signed.policy, f"{repo}-again:{first['tag']}", tmp_path)
    assert done.returncode != 0 and "A signature was required, but no signature exists" in done.stderr

    # Docker Engine pulls each platform of the index: the config servimg built for that platform.
    for platform, child in first["platforms"].items():
        subprocess.run(["docker", "pull", "-q", "--platform", platform, tag], check=True, capture_output=True)
        inspect = subprocess.run(
            ["docker", "image", "inspect", "-f", "{{.Id}} {{.Architecture}}", tag],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        assert inspect == [child["config_digest"], platform.split("/")[1]]

    # `docker pull` put the tag in the engine too, where an unprefixed name resolves first (as docker
    # would): the registry's index is named with docker://.
    index_ref = f"docker://{tag}"
    code, verified = _json(capfd, "verify", index_ref)
    assert code == 0 and len(verified) == 2, verified  # both children, each probed by its own interpreter
    code, [arm] = _json(capfd, "verify", index_ref, "--platform", "linux/arm64")
    assert code == 0 and arm["image"] == "tiny-multiarch", arm
    code, [card] = _json(capfd, "show", index_ref, "--platform", "linux/arm64")
    assert code == 0 and card["digest"] == first["platforms"]["linux/arm64"]["digest"], card
    code, [refused] = _json(capfd, "show", index_ref)
    assert code != 0 and "linux/amd64, linux/arm64: show takes one platform" in json.dumps(refused), refused
    trust = ["--key", str(key / "servimg.pub")]
    code, [checked] = _json(capfd, "check", index_ref, *trust)
    assert code == 0, [
        r for r in checked.get("report", checked).get("rows", []) if r.get("verdict") == "FAIL"
    ]
    lock_file = two_platform_repo / "images" / "tiny-multiarch.lock.json"
    code, [pinned] = _json(capfd, "check", index_ref, *trust, "--lock", str(lock_file))
    assert code == 0 and {"index lock", "[linux/arm64] lock", "[linux/amd64] lock"} <= {
        r["what"] for r in pinned["rows"] if r["verdict"] == "PASS"
    }, pinned
    code, [one] = _json(capfd, "check", index_ref, *trust, "--platform", "linux/arm64")
    assert code == 0 and all("linux/amd64" not in r["what"] for r in one["rows"]), one

    # Another lock (a later source_date_epoch): its arm64 child put into a copy of the index, pushed
    # under the first build's tag. check FAILs, and the failing row names linux/arm64.
    doc = yaml.safe_load(definition.read_text())
    doc["source_date_epoch"] = 1767225601
    other = two_platform_repo / "images" / "tiny-other.yaml"
    other.write_text(yaml.safe_dump({**doc, "name": "tiny-other"}, sort_keys=False))
    assert main(["lock", str(other), "-q"]) == 0
    code, [replacement] = _json(capfd, "build", str(other), "--to", repo, *sign)
    assert code == 0
    original = json.loads(_registry_manifest(registry.host, "servimg/tiny-multiarch", first["tag"]))
    swapped = replacement["platforms"]["linux/arm64"]["digest"]
    for entry in original["manifests"]:
        if entry["platform"]["architecture"] == "arm64":
            entry["digest"] = swapped
            entry["size"] = len(_registry_manifest(registry.host, "servimg/tiny-multiarch", swapped))
    _put_index(registry.host, "servimg/tiny-multiarch", first["tag"], json.dumps(original).encode())
    code, [failed] = _json(capfd, "check", index_ref, *trust, "--lock", str(lock_file))
    assert code != 0
    rows = failed["report"]["rows"]
    bad = [r for r in rows if r["verdict"] == "FAIL"]
    assert any("linux/arm64" in r["what"] and "replaced child" in r["why"] for r in bad), bad
    assert not any("linux/amd64" in r["what"] for r in bad), bad
    assert any(r["what"] == "index provenance" for r in bad), bad
    assert any(r["what"] == "[linux/arm64] lock" for r in bad), bad  # not the lock file's arm64 part


@dataclass(frozen=True)
class GpgSigning:
    """The `--gpg-key`/`--lookaside` flags that sign with a new GPG key, and the containers policy
    `servimg policy export` writes for it."""

    flags: tuple[str, ...]
    policy: Path


def _gpg_signing(tmp_path: Path, host: str, monkeypatch: pytest.MonkeyPatch) -> GpgSigning:
    """A GPG key in a keyring of its own ($GNUPGHOME for the rest of the test), signing to a lookaside."""
    _require(shutil.which("gpg") is not None, "needs gnupg (scripts/setup.sh installs it)")
    home, lookaside, policy = tmp_path / "gnupg", tmp_path / "lookaside", tmp_path / "containers"
    fpr = gpg_key(home, "servimg-index")
    monkeypatch.setenv("GNUPGHOME", str(home))
    (tmp_path / "index.asc").write_bytes(gpg(home, "--export", "--armor", fpr))
    trusts = ["--key", str(tmp_path / "index.asc"), "--registry", host]
    argv = ["policy", "export", "--runtime", "containers", "--signatures", "gpg", *trusts]
    assert main([*argv, "--lookaside", f"file://{lookaside}", "--out", str(policy), "-q"]) == 0
    return GpgSigning(("--gpg-key", fpr, "--lookaside", str(lookaside)), policy)


def two_platform_base_is_pinned(repo: Path) -> bool:
    locked = multi_platform_lock(repo / "images" / "tiny-multiarch.lock.json")
    pinned = json.loads((REPO / "images" / "tiny-multiarch.lock.json").read_text())
    # The same base children as the committed lock: the test registry holds what the pins make.
    return all(
        str(locked.platforms[p].base.manifest_digest) == pinned["platforms"][p]["base"]["manifest_digest"]
        for p in locked.platforms
    )


def _registry_manifest(host: str, repository: str, reference: str) -> bytes:
    from servimg.backends.registryclient import RegistryClient

    with RegistryClient(host) as client:
        data, _, _ = client.get_manifest(repository, reference)
    return data


def _put_index(host: str, repository: str, tag: str, data: bytes) -> Digest:
    from servimg.backends.registryclient import RegistryClient

    with RegistryClient(host) as client:
        return client.put_manifest(repository, tag, data, OCI_INDEX)


def test_a_ladder_under_emulation_is_refused(capfd: pytest.CaptureFixture[str]) -> None:
    foreign = ARM64 if Platform.host() == AMD64 else AMD64
    code = main(["ladder", "servimg-test/never-pulled:x", "--platform", str(foreign)])
    err = capfd.readouterr()
    assert code != 0
    assert f"refusing to run the ladder for {foreign}" in err.out + err.err
    assert "timings" in err.out + err.err


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.root
def test_the_engine_and_an_archive_get_one_platform_and_say_so_and_a_layout_holds_the_index(
    two_platform_repo: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    _require(docker_available(), "needs a running Docker Engine")
    definition = two_platform_repo / "images" / "tiny-multiarch.yaml"
    code, [engine] = _json(capfd, "build", str(definition), "--to", "docker", "--platform", "linux/arm64")
    assert code == 0, engine
    assert (
        "linux/arm64 only" in engine["destination"]
        and "stores single-platform images" in engine["destination"]
    )
    inspect = subprocess.run(
        [
            "docker",
            "image",
            "inspect",
            "-f",
            "{{.Id}} {{.Architecture}}",
            engine["platforms"]["linux/arm64"]["config_digest"],
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert inspect == [engine["platforms"]["linux/arm64"]["config_digest"], "arm64"]

    layout = tmp_path / "layout"
    code, [built] = _json(capfd, "build", str(definition), "--to", f"oci:{layout}:multi")
    assert code == 0 and built["digest"] == engine["digest"]  # the same index, whichever sink
    index = json.loads((layout / "index.json").read_text())
    [entry] = index["manifests"]  # the index only: its children are reached through it
    assert entry["mediaType"] == OCI_INDEX and entry["digest"] == built["digest"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "multi"
    children = ImageIndex.parse(
        (layout / "blobs" / "sha256" / Digest.parse(built["digest"]).hex).read_bytes()
    )
    for child in children.entries:
        assert (layout / "blobs" / "sha256" / child.descriptor.digest.hex).is_file()
    # An archive, like the engine, takes the one child --platform names and says so (Backend.write_index).
    archive = tmp_path / "a.tar"
    code, [one] = _json(
        capfd, "build", str(definition), "--to", f"docker-archive:{archive}", "--platform", "linux/arm64"
    )
    assert code == 0 and one["digest"] == built["digest"], one
    assert (
        "linux/arm64 only" in one["destination"] and "a docker-archive holds one image" in one["destination"]
    )
    from servimg.backends.archive import read_archive
    from servimg.oci.store import BlobStore

    held = read_archive(archive, BlobStore(tmp_path / "archive-store"))
    assert str(held.config_digest) == engine["platforms"]["linux/arm64"]["config_digest"]


def test_a_gpg_signed_build_goes_to_a_registry_only(tmp_path: Path) -> None:
    """A one-image and an index build alike: GPG simple signatures live in a registry (or its lookaside),
    so --gpg-key to an OCI layout is refused before anything is built."""
    sink = AttestingSink(None, ("servimg", "build"), gpg=GpgPlan(GpgSigner("servimg-index")))
    with pytest.raises(BuildError, match="--gpg-key: GPG simple signatures are for images in a registry"):
        sink.check(Target.layout(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_platform_on_a_single_platform_build_is_refused(capfd: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "build",
            str(REPO / "images" / "demo.yaml"),
            "--to",
            "oci:/nonexistent/x",
            "--platform",
            "linux/arm64",
        ]
    )
    out = capfd.readouterr()
    assert code != 0 and "builds linux/amd64 only" in out.out + out.err


def test_a_rebase_refuses_platforms_that_pin_their_own_base(tmp_path: Path) -> None:
    """A rebase moves base.ref and base.digest: a platform with its own pin would stay behind, so it is
    refused before anything is read (docker-daemon:b is never asked) and nothing is written."""
    images = tmp_path / "images"
    images.mkdir()
    path = images / "own.yaml"
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["base"]["platforms"] = [
        "linux/amd64",
        {"platform": "linux/arm64", "ref": "docker-daemon:b", "digest": "sha256:" + "b" * 64},
    ]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    ctx = Context(BlobStore(tmp_path / "cache"), print, seams=HOST_SEAMS)
    with pytest.raises(RebaseError, match="linux/arm64 pin"):
        rebase(RebaseRequest(path, "docker-daemon:new", write=True), ctx)
    assert sorted(p.name for p in images.iterdir()) == ["own.yaml"]


def test_a_multi_platform_rebase_onto_one_image_is_refused(tmp_path: Path) -> None:
    """A multi-platform definition pins one index over every platform: one image as the new base, by
    its name or by its digest, is refused and nothing is written."""
    images = tmp_path / "images"
    images.mkdir()
    path = images / "tiny-multiarch.yaml"
    shutil.copy(EXAMPLE, path)
    one = fakebase.make_base(tmp_path / "one", [fakebase.tar(fakebase.package_members())])
    ctx = Context(BlobStore(tmp_path / "cache"), print, seams=HOST_SEAMS)
    for digest in (None, one.image.digest):
        with pytest.raises(RebaseError, match=r"is one image; .* builds several platforms from one index"):
            rebase(RebaseRequest(path, one.ref, digest, write=True), ctx)
    assert sorted(p.name for p in images.iterdir()) == ["tiny-multiarch.yaml"]


def test_a_base_of_another_platform_is_refused_at_lock(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The base must be an image for the platform it is resolved for: an arm64 image under a definition
    that builds linux/amd64 is refused, naming both, and no lock is written."""
    arm = fakebase.make_base(
        tmp_path / "arm", [fakebase.tar(fakebase.package_members())], config_extra={"architecture": "arm64"}
    )
    definition = fakebase.make_repo(tmp_path / "repo", arm)
    assert fakebase.main(["lock", str(definition), "--cache", str(tmp_path / "cache")]) != 0
    out = capfd.readouterr()
    assert "is a linux/arm64 image; tiny resolves it for linux/amd64" in out.out + out.err
    assert not (definition.parent / "tiny.lock.json").exists()


def test_one_platform_of_a_definition_is_the_hosts_else_the_first() -> None:
    definition = ImageDefinition.load(EXAMPLE)
    assert definition.one_platform().platforms == (Platform.host(),)  # amd64 and arm64 hosts alike
    assert definition.one_platform(ARM64).base.platform == "linux/arm64"
    single = ImageDefinition.load(REPO / "images" / "demo.yaml")
    assert single.one_platform() == single  # its one platform, whatever the host
    with pytest.raises(DefinitionError, match="does not build linux/arm64"):
        single.one_platform(ARM64)


@pytest.mark.registry
@pytest.mark.root
def test_an_overlay_is_authored_on_one_platform_and_locked_on_every_one_and_a_rebase_carries_it(
    two_platform_repo: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`overlay edit --platform linux/arm64` unpacks the arm64 child's files; `overlay save` diffs against
    the same and locks every platform (arm64's interpreter under qemu checks the sentinel is absent from
    its base); `rebase` onto the same index (its digest read from the ref) carries the whole stack and
    rewrites the same lock and definition, byte for byte."""
    repo = tmp_path / "repo"
    for part in ("images", "overlays"):
        shutil.copytree(two_platform_repo / part, repo / part)
    definition, tree = repo / "images" / "tiny-multiarch.yaml", tmp_path / "edit"
    code, [edited] = _json(
        capfd, "overlay", "edit", str(definition), "tinypkg", "--dir", str(tree), "--with-stack",
        "--platform", "linux/arm64",
    )  # fmt: skip
    assert code == 0 and edited["platform"] == "linux/arm64" and edited["stack"] == "tinypkg-admit-gate"
    assert "_servimg_admit" in (tree / "tinypkg" / "core.py").read_text()  # the stack is applied
    util = tree / "tinypkg" / "util.py"
    floored = "    return min(max(n, SERVIMG_FLOOR), limit)\n\n\nSERVIMG_FLOOR = 0\n"
    util.write_text(util.read_text().replace("    return min(n, limit)\n", floored))
    code, [saved] = _json(
        capfd, "overlay", "save", str(definition), "tinypkg", "--dir", str(tree), "--id", "tinypkg-floor",
        "--description", "clamp never admits a negative amount (a test)",
    )  # fmt: skip
    assert code == 0 and saved["sentinels"] == "tinypkg.util:clamp:SERVIMG_FLOOR", saved
    lock_file = repo / "images" / "tiny-multiarch.lock.json"
    locked = json.loads(lock_file.read_text())
    for platform in ("linux/amd64", "linux/arm64"):
        floor = locked["platforms"][platform]["overlays"][-1]
        assert floor["id"] == "tinypkg-floor", floor
        assert floor["sentinels_absent_in_base"] == ["tinypkg.util:clamp:name=SERVIMG_FLOOR"], floor

    pinned = {p: p.read_bytes() for p in (definition, lock_file)}
    base_ref = ImageDefinition.load(definition).base.ref
    code, [rebased] = _json(capfd, "rebase", str(definition), "--base", base_ref, "--write")
    assert code == 0 and rebased["counts"]["APPLIES"] == 2, rebased
    assert {p: p.read_bytes() for p in pinned} == pinned  # same index, same stack: the same bytes


@pytest.mark.registry
@pytest.mark.root
def test_a_multi_platform_base_in_an_oci_layout(
    two_platform_base: dict[str, Any], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The base index from the cache's own layout (`oci_ref`): each platform's manifest is reached through
    the index (children have no index.json entries of their own)."""
    shutil.copytree(REPO / "images", tmp_path / "images")
    shutil.copytree(REPO / "overlays", tmp_path / "overlays")
    path = tmp_path / "images" / "tiny-multiarch.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["base"]["ref"], doc["base"]["digest"] = two_platform_base["oci_ref"], two_platform_base["digest"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["lock", str(path), "-q"]) == 0
    locked = multi_platform_lock(tmp_path / "images" / "tiny-multiarch.lock.json")
    for platform, child in two_platform_base["platforms"].items():
        assert str(locked.platforms[platform].base.manifest_digest) == child["digest"]
    code, [built] = _json(capfd, "build", str(path), "--to", f"oci:{tmp_path / 'out'}")
    assert code == 0 and built["bytecode"]["identical"], built
