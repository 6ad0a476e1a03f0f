"""The ecosystem's own tools consume what servimg writes, and servimg consumes what they write.

Debian's skopeo (the pushed manifest's bytes hash to servimg's digest; `copy --preserve-digests` keeps it),
podman (a pull keeps the digest; servimg's in-image probe runs through `podman run`), umoci (unpacks every
OCI layout servimg writes) and the in-toto reference bindings (PyPI `in-toto-attestation`: every
Statement servimg attaches parses and validates, its SLSA provenance, test-result and VSA predicates parse
strictly). The other way: an image skopeo copied into an OCI layout is accepted as a base.

One image on the fake base (tests/fakebase.py) serves every registry test: built, pushed signed with
a verify result, a ladder receipt attested, promoted (a VSA), once per module.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.predicates.test_result.v0 import test_result_pb2
from in_toto_attestation.predicates.vsa.v1 import vsa_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement

import fakebase as fb
from conftest import _require, docker_available
from servimg.assembly.context import Context
from servimg.backends import registry as registry_module
from servimg.backends import transport
from servimg.backends.layout import LayoutReferrers
from servimg.backends.registryclient import RegistryClient
from servimg.backends.registryreferrers import RegistryReferrers
from servimg.backends.target import Target
from servimg.bases import catalog as bases
from servimg.core.digest import Digest
from servimg.formats import cosign, referrers
from servimg.judging.evidence import top_layer
from servimg.oci.store import BlobStore
from servimg.proof.verify import PROBE_IN_IMAGE, SPEC_IN_IMAGE, VerifyReport
from servimg.signing import keys
from servimg.statements import attest, sbom
from servimg.statements.derived import read_facts
from tinyimage import prepare_repo

pytestmark = pytest.mark.registry

REPO = "i15/interop"


def tool(name: str) -> str:
    path = shutil.which(name)
    _require(path is not None, f"needs {name} (Debian package; scripts/setup.sh installs it)")
    assert path is not None
    return path


def run(*argv: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr[-2000:]}"
    return done.stdout


def cli(*argv: str, cache: Path) -> None:
    assert fb.main([*argv, "--cache", str(cache)]) == 0, argv


@pytest.fixture(scope="module")
def image(registry: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("interop15")
    cache = root / "cache"
    base = fb.make_base(root / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(root / "repo", base)
    pair = keys.generate(root / "keys", "interop")
    report = root / "verify.json"  # the fake base has no interpreter to run the probe in
    report.write_text(
        json.dumps({"checks": [{"code": "SOURCE", "status": "PASS", "subject": "s", "message": "m"}]})
    )
    cli("lock", str(definition), cache=cache)
    cli("build", str(definition), "--to", f"oci:{root / 'built'}", cache=cache)
    ref = f"{registry.host}/{REPO}:signed"
    push = ("push", f"oci:{root / 'built'}", ref, "--report", str(report), "--key", str(pair.private))
    cli(*push, cache=cache)
    cli(*push[:2], f"oci:{root / 'pushed'}:signed", *push[3:], cache=cache)
    digest = RegistryClient(registry.host).head_manifest(REPO, "signed")
    assert digest is not None
    receipt = root / "receipt.json"
    receipt.write_text(
        json.dumps(
            {
                "ladder": "smoke",
                "verdict": "PASS",
                "image_digest": str(digest[0]),
                "arms": [{"id": "control"}, {"id": "warm", "verdict": "PASS"}],
                "finished_at": "2026-11-30T12:00:00Z",
            }
        )
    )
    attest_args = ("--predicate-type", "test-result", "--file", str(receipt), "--key", str(pair.private))
    cli("attest", ref, *attest_args, cache=cache)
    policy = ("--key", str(pair.public), "--require-ladder", "smoke", "--remote")
    cli("promote", ref, "--tag", "qualified", "--sign", str(pair.private), *policy, cache=cache)
    return {
        "root": root,
        "ref": ref,
        "digest": digest[0],
        "host": registry.host,
        "base": base,
        "cache": cache,
    }


# ----------------------------------------------------------------------------------------------- skopeo


def test_skopeo_sees_servimg_digest_and_copy_preserves_it(image: dict[str, Any]) -> None:
    skopeo = tool("skopeo")
    raw = subprocess.run(
        [skopeo, "inspect", "--raw", "--tls-verify=false", f"docker://{image['ref']}"],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    assert Digest.of_bytes(raw) == image["digest"]
    copied = f"{image['host']}/{REPO}-copy:signed"
    tls = ("--src-tls-verify=false", "--dest-tls-verify=false")
    run(skopeo, "copy", "--preserve-digests", *tls, f"docker://{image['ref']}", f"docker://{copied}")
    found = RegistryClient(image["host"]).head_manifest(f"{REPO}-copy", "signed")
    assert found is not None and found[0] == image["digest"]


def test_an_image_skopeo_copied_into_a_layout_is_accepted_as_a_base(
    image: dict[str, Any], tmp_path: Path
) -> None:
    skopeo = tool("skopeo")
    base = image["base"]
    # The fake base travels through the registry (servimg pushes it), then skopeo copies it out.
    pushed = f"{image['host']}/{REPO}-base:1"
    registry_module.push(
        base.image, pushed, fb.on_host(BlobStore(base.layout.parent / f".{base.layout.name}-store"))
    )
    layout = tmp_path / "skopeo-layout"
    run(skopeo, "copy", "--src-tls-verify=false", f"docker://{pushed}", f"oci:{layout}:base")
    # skopeo gzips the uncompressed layer on the way (a new manifest digest): the user pins what it wrote.
    copied = transport.fetch(f"oci:{layout}:base", fb.on_host(BlobStore(tmp_path / "read")))
    assert copied.config_digest == base.image.config_digest
    assert [m.media_type for m in copied.layer_descriptors] == ["application/vnd.oci.image.layer.v1.tar+gzip"]
    definition = fb.make_repo(tmp_path / "repo", fb.Base(layout, copied))
    cache = tmp_path / "cache"
    cli("lock", str(definition), cache=cache)
    cli("build", str(definition), "--to", f"oci:{tmp_path / 'out'}", cache=cache)
    lock = json.loads(definition.with_suffix(".lock.json").read_text())
    assert lock["base"]["manifest_digest"] == str(copied.digest)


# ------------------------------------------------------------------------------------------------ umoci


def test_umoci_unpacks_every_layout_servimg_writes(image: dict[str, Any], tmp_path: Path) -> None:
    umoci = tool("umoci")
    for name, tag in (("built", None), ("pushed", "signed")):
        layout = image["root"] / name
        tag = tag or next(iter(layouts_tags(layout)))
        bundle = tmp_path / f"bundle-{name}"
        run(umoci, "unpack", "--image", f"{layout}:{tag}", str(bundle))
        patched = bundle / "rootfs" / fb.SITE / "tinypkg" / "mod.py"
        assert patched.read_bytes() != fb.MOD, f"{name}: umoci unpacked the overlay's file"
        assert (bundle / "rootfs" / "opt" / "servimg" / "lock.json").is_file()
        config = json.loads((bundle / "config.json").read_text())
        assert config["ociVersion"]


def layouts_tags(layout: Path) -> list[str]:
    index = json.loads((layout / "index.json").read_text())
    names = [m.get("annotations", {}).get("org.opencontainers.image.ref.name") for m in index["manifests"]]
    return sorted(n for n in names if n)


# ----------------------------------------------------------------------------------------------- podman


def _podman(root: Path) -> list[str]:
    """podman with private storage (overlay: vfs copies every layer whole, 4x slower here) and no systemd."""
    return [
        tool("podman"),
        "--root",
        str(root / "storage"),
        "--runroot",
        str(root / "run"),
        "--storage-driver",
        "overlay",
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "file",
    ]


@pytest.fixture
def podman_root() -> Iterator[Path]:
    """podman refuses a runroot longer than 50 characters: pytest's tmp_path is too long."""
    root = Path(tempfile.mkdtemp(prefix="i15-podman-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_podman_pull_keeps_the_digest(image: dict[str, Any], podman_root: Path) -> None:
    podman = _podman(podman_root)
    run(*podman, "pull", "--quiet", "--tls-verify=false", image["ref"])
    digest = run(*podman, "image", "inspect", "--format", "{{.Digest}}", image["ref"]).strip()
    assert digest == str(image["digest"])


# ----------------------------------------------------------------------------------------------- in-toto


def _statements(image: dict[str, Any]) -> list[dict[str, Any]]:
    with RegistryClient(image["host"]) as client:
        found, _ = RegistryReferrers(client, REPO).discover(image["digest"])
        found = [d for d in found if d.get("artifactType") != cosign.BUNDLE_V03]  # the same statements
        envelopes = [
            referrers.fetch_envelope(
                RegistryReferrers(client, REPO), image["digest"], Digest.parse(d["digest"])
            )
            for d in found
        ]
    return [json.loads(base64.b64decode(json.loads(e)["payload"])) for e in envelopes]


def _layout_statements(layout: Path, subject: Digest) -> list[dict[str, Any]]:
    found = [
        d for d in LayoutReferrers(layout).discover(subject)[0] if d.get("artifactType") != cosign.BUNDLE_V03
    ]
    envelopes = [
        referrers.fetch_envelope(LayoutReferrers(layout), subject, Digest.parse(d["digest"])) for d in found
    ]
    return [json.loads(base64.b64decode(json.loads(e)["payload"])) for e in envelopes]


# True while the bindings carry in-toto/attestation#425 (fixed by the open PR #429); then the VSA parses
# whole, and this test says so by parsing verifiedLevels too.
BINDINGS_VSA_LEVELS_IS_A_STRING = isinstance(vsa_pb2.VerificationSummary().verified_levels, str)

PREDICATES = {
    attest.PROVENANCE_V1: provenance_pb2.Provenance,
    attest.TEST_RESULT_V01: test_result_pb2.TestResult,
    attest.VSA_V1: vsa_pb2.VerificationSummary,
}


def test_in_toto_bindings_validate_every_statement(image: dict[str, Any]) -> None:
    statements = _statements(image) + _layout_statements(image["root"] / "pushed", image["digest"])
    kinds = sorted(s["predicateType"] for s in statements)
    assert kinds.count(attest.PROVENANCE_V1) == 2 and kinds.count(attest.VSA_V1) == 1
    assert kinds.count(attest.TEST_RESULT_V01) == 3  # verify (registry, layout) and the ladder
    assert kinds.count(attest.CYCLONEDX_BOM) == 2
    for doc in statements:
        proto = json_format.Parse(json.dumps(doc), statement_pb2.Statement())  # unknown fields refused
        statement = Statement.copy_from_pb(proto)
        statement.validate()
        assert {d.digest["sha256"] for d in statement.pb.subject} >= {image["digest"].hex}
        if doc["predicateType"] == attest.CYCLONEDX_BOM:  # no proto in the bindings: the CycloneDX schema
            error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(doc["predicate"]))
            assert error is None, str(error)[:2000]
            continue
        predicate = PREDICATES[doc["predicateType"]]()
        fields = dict(doc["predicate"])
        if isinstance(predicate, vsa_pb2.VerificationSummary) and BINDINGS_VSA_LEVELS_IS_A_STRING:
            # in-toto/attestation#425: the bindings' vsa/v1 proto has `verifiedLevels` as one string;
            # the VSA spec (and servimg) make it an array of strings. Every other field parses strictly.
            levels = fields.pop("verifiedLevels")
            assert isinstance(levels, list) and all(isinstance(level, str) for level in levels), levels
        json_format.Parse(json.dumps(fields), predicate)  # strict: an unknown field is an error
        if isinstance(predicate, vsa_pb2.VerificationSummary):
            assert predicate.verification_result == "PASSED"


@pytest.fixture(scope="module")
def tiny_layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The real tiny image (Python 3.13 test base + one overlay), built by servimg into an OCI layout."""
    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    _require(docker_available(), "needs a running Docker Engine")
    root = tmp_path_factory.mktemp("tiny15")
    store = BlobStore()
    base = bases.build_base(bases.pinned_recipe("test-trixie"), fb.on_host(store), targets=[Target.engine()])
    definition = prepare_repo(root / "repo", base)
    cache = ("--cache", str(store.root))
    assert fb.main(["lock", str(definition), "--runner", "docker", *cache], seams=fb.HOST_SEAMS) == 0
    layout = root / "tiny"
    build = ["build", str(definition), "--to", f"oci:{layout}:tiny", "--runner", "docker", *cache]
    assert fb.main(build, seams=fb.HOST_SEAMS) == 0
    lock = json.loads(definition.with_suffix(".lock.json").read_text())
    return {"layout": layout, "store": store, "python": lock["interpreter"]["path"]}


@pytest.mark.docker
@pytest.mark.root
def test_podman_runs_the_probe_in_a_servimg_image(tiny_layout: dict[str, Any], podman_root: Path) -> None:
    """`podman run` here fails with `error setting rlimit type 6/7: operation not permitted` unless both
    RLIMIT_NPROC and RLIMIT_NOFILE are given below this machine's hard limits: podman (as root) asks
    for 4194304 processes and 1048576 files by default, and the container lacks CAP_SYS_RESOURCE to
    raise a hard limit (`--ulimit host` asks for the same maxima). Lower explicit limits work."""
    limits = [f"nproc={_below(resource.RLIMIT_NPROC)}", f"nofile={_below(resource.RLIMIT_NOFILE)}"]
    argv = [*_podman(podman_root), "run", "--rm", "--network", "none"]
    argv += [arg for limit in limits for arg in ("--ulimit", limit)]
    argv += [
        f"oci:{tiny_layout['layout']}:tiny",
        tiny_layout["python"],
        PROBE_IN_IMAGE,
        SPEC_IN_IMAGE,
        "--json",
    ]
    report = VerifyReport.from_json(json.loads(run(*argv)))
    assert report.ok and report.findings, report
    assert str(report.interpreter.get("version", "")).startswith("3.13")


@pytest.mark.docker
@pytest.mark.root
def test_the_sbom_of_a_real_image_lists_its_debian_packages(tiny_layout: dict[str, Any]) -> None:
    store = tiny_layout["store"]
    image = transport.fetch(f"oci:{tiny_layout['layout']}:tiny", fb.on_host(store))
    facts = read_facts(top_layer(image, Context(store, print, seams=fb.HOST_SEAMS)))
    bom = sbom.build_sbom(image, facts, sbom.image_filesystem(image, store), "servimg-test/tiny")
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(bom))
    assert error is None, str(error)[:2000]
    assert sbom.problems(bom, image, facts) == []
    summary = sbom.summary(bom)
    assert summary.debian > 20 and summary.python >= 1 and summary.interpreter.startswith("3.13")
    purls = {str(c.get("purl")) for c in bom["components"]}
    assert any(p.startswith("pkg:deb/debian/libc6@") and "distro=debian-13" in p for p in purls), sorted(
        purls
    )[:5]
    assert summary.patched and summary.patched[0].startswith("tinypkg")


def _below(limit: int) -> str:
    """`soft:hard` podman may set: at most this process's hard limit, and at most 4096 (plenty)."""
    hard = resource.getrlimit(limit)[1]
    n = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    return f"{n}:{n}"
