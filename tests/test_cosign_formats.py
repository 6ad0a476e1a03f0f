"""cosign's formats, keys users already have and the deploy side's policy files, without a registry
(issue 31).

The registry half (the formats pushed, read back by check, verified by the sigstore project's own verifier
and enforced by skopeo) is tests/test_cosign_interop.py.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from conftest import _require
from servimg.cli import main
from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.formats import cosign
from servimg.judging import export
from servimg.judging.policy import Policy
from servimg.oci.image import OCI_MANIFEST
from servimg.signing import cosignkey, dsse, keys
from servimg.signing.dsse import DsseError, SigningKey
from servimg.statements import attest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NODE = Path(__file__).resolve().parent / "interop" / "node"
SUBJECT = Digest.of_bytes(b"an image manifest")


# ------------------------------------------------------------------------------------------ formats


def test_simple_signing_payload_is_cosigns() -> None:
    """SIGNATURE_SPEC.md §Simple Signing: critical.identity.docker-reference, critical.image.
    docker-manifest-digest, critical.type "cosign container image signature"."""
    payload = json.loads(cosign.simple_signing_payload("127.0.0.1:5000/servimg/demo", SUBJECT))
    assert payload == {
        "critical": {
            "identity": {"docker-reference": "127.0.0.1:5000/servimg/demo"},
            "image": {"docker-manifest-digest": str(SUBJECT)},
            "type": "cosign container image signature",
        },
        "optional": None,
    }
    parsed = cosign.SimpleSigning.parse(json.dumps(payload).encode(), "x")
    assert (parsed.reference, parsed.digest, parsed.kind) == (
        "127.0.0.1:5000/servimg/demo",
        str(SUBJECT),
        cosign.COSIGN_SIGNATURE_TYPE,
    )
    # cosign's own example spells the key Docker-manifest-digest; Go's decoder and servimg accept both.
    spelled = json.dumps({"critical": {**payload["critical"], "image": {"Docker-manifest-digest": "d"}}})
    assert cosign.SimpleSigning.parse(spelled.encode(), "x").digest == "d"
    assert cosign.signature_tag(SUBJECT) == f"sha256-{SUBJECT.hex}.sig"
    assert cosign.attestation_tag(SUBJECT) == f"sha256-{SUBJECT.hex}.att"


def test_tag_manifest_is_canonical_and_keeps_every_entry() -> None:
    first = cosign.signature_layer(b"payload-1", b"sig-1")
    second = cosign.attestation_layer(
        b'{"payload":"","payloadType":"x","signatures":[]}', attest.PROVENANCE_V1
    )
    manifest, config = cosign.tag_manifest([first])
    doc = json.loads(manifest)
    assert manifest == canonical.dumps(doc) and doc["mediaType"] == OCI_MANIFEST
    assert doc["config"] == {
        "mediaType": "application/vnd.oci.image.config.v1+json",
        "digest": str(Digest.of_bytes(config)),
        "size": len(config),
    }
    assert json.loads(config)["rootfs"] == {"type": "layers", "diff_ids": [str(first.digest)]}
    assert doc["layers"] == [
        {
            "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
            "digest": str(Digest.of_bytes(b"payload-1")),
            "size": 9,
            "annotations": {"dev.cosignproject.cosign/signature": base64.b64encode(b"sig-1").decode()},
        }
    ]
    assert second.annotation == {
        "predicateType": attest.PROVENANCE_V1,
        "dev.cosignproject.cosign/signature": "",
    }
    layers, added = cosign.merged(manifest, [second, first], "t")
    assert added and layers == [first, second]
    again, added = cosign.merged(cosign.tag_manifest(layers)[0], [first], "t")
    assert not added and again == [first, second]
    assert cosign.tag_manifest(layers) == cosign.tag_manifest(again)  # same layers, same digest


def test_a_malformed_or_foreign_tag_manifest_is_refused_with_every_problem() -> None:
    with pytest.raises(cosign.CosignFormatError, match="not an OCI image manifest with layers"):
        cosign.tag_layers(json.dumps({"mediaType": "application/vnd.oci.image.index.v1+json"}).encode(), "t")
    with pytest.raises(cosign.CosignFormatError, match="not JSON"):
        cosign.tag_layers(b"\xff", "t")
    bad = {"layers": [{"mediaType": 1, "size": -1, "digest": "sha256:zz"}, {"mediaType": "m"}]}
    with pytest.raises(cosign.CosignFormatError) as info:
        cosign.merged(json.dumps(bad).encode(), [], "t")
    assert len(info.value.problems) >= 4


def test_formats_flag() -> None:
    assert cosign.parse_formats("all") == frozenset(cosign.FORMATS)
    assert cosign.parse_formats("sig, bundle") == {"sig", "bundle"}
    with pytest.raises(cosign.CosignFormatError, match="unknown cosgin"):
        cosign.parse_formats("sig,cosgin")
    with pytest.raises(cosign.CosignFormatError, match="empty"):
        cosign.parse_formats(",")


def test_bundle_is_v03_dsse_with_one_signature_per_bundle() -> None:
    a, b = SigningKey.generate("ecdsa-p256"), SigningKey.generate()
    envelope = dsse.countersign(dsse.sign(attest.PAYLOAD_TYPE, b'{"_type":"x"}', a), b)
    made = cosign.bundles(envelope)
    assert len(made) == 2
    doc = json.loads(made[0])
    assert doc["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert doc["verificationMaterial"] == {"publicKey": {"hint": a.keyid}, "tlogEntries": []}
    assert doc["dsseEnvelope"]["payloadType"] == attest.PAYLOAD_TYPE
    assert len(doc["dsseEnvelope"]["signatures"]) == 1
    single = cosign.bundle_envelope(made[1], "b")
    assert dsse.verify(single, [b.public_key]).verified and not dsse.verify(single, [a.public_key]).keyids
    for broken, why in (
        ({**doc, "mediaType": "application/json"}, "not a v0.3 bundle"),
        ({**doc, "verificationMaterial": {}}, "no publicKey or certificate"),
        ({k: v for k, v in doc.items() if k != "dsseEnvelope"}, "no dsseEnvelope"),
    ):
        with pytest.raises(cosign.CosignFormatError) as info:
            cosign.bundle_envelope(json.dumps(broken).encode(), "b")
        assert any(why in p for p in info.value.problems), info.value.problems


# ------------------------------------------------------------------------------------------------- keys


def test_a_cosign_generated_encrypted_key_is_imported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The fixture is cosign's own test vector (sigstore/cosign pkg/cosign/keys_test.go `pemsigstorekey`,
    password "hello"): `ENCRYPTED SIGSTORE PRIVATE KEY`, scrypt + nacl/secretbox over PKCS#8."""
    path = FIXTURES / "cosign" / "sigstore-encrypted.key"
    monkeypatch.setenv("COSIGN_PASSWORD", "hello")
    key = keys.load_signing(path)
    assert key.public_key.algorithm == "ecdsa-p256"
    message = b"signed by a key cosign made"
    assert key.public_key.verify(key.sign(message), message)
    # The public half is a PEM cosign, containers/image and Kyverno read; check trusts the private file.
    assert keys.load_trusted([path]) == (key.public_key,)
    monkeypatch.setenv("COSIGN_PASSWORD", "wrong")
    with pytest.raises(DsseError, match="password is wrong"):
        keys.load_signing(path)
    garbled = tmp_path / "garbled.key"
    garbled.write_text(path.read_text().replace("eyJr", "eyJx", 1))
    with pytest.raises(DsseError, match="not a readable cosign private key"):
        cosignkey.load(garbled.read_bytes(), b"hello", where=str(garbled))


def test_key_generate_ecdsa_writes_a_pem_cosign_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["key", "generate", "--out", str(tmp_path), "--algorithm", "ecdsa-p256", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["algorithm"] == "ecdsa-p256"
    pem = (tmp_path / "servimg.pub").read_bytes()
    assert pem.startswith(b"-----BEGIN PUBLIC KEY-----")
    public = dsse.VerifyKey.from_pem(pem)
    signer = keys.load_signing(tmp_path / "servimg.key")
    # cosign verifies ECDSA-P256 over SHA-256 of the payload, ASN.1 DER (SIGNATURE_SPEC.md): so does this.
    signature = signer.sign(b"payload")
    ec_key = public._key  # the independent check below uses cryptography directly
    assert isinstance(ec_key, ec.EllipticCurvePublicKey)
    ec_key.verify(signature, b"payload", ec.ECDSA(hashes.SHA256()))


# ------------------------------------------------------------------------------------------ policy export


def _export(tmp_path: Path, *argv: str) -> dict[str, object]:
    out = tmp_path / "out"
    code = main(["policy", "export", "--out", str(out), *argv])
    assert code == 0
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_containers_gpg_and_sigstore_policies(tmp_path: Path) -> None:
    gpg_key = tmp_path / "a.asc"
    gpg_key.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
    files = _export(
        tmp_path,
        "--runtime",
        "containers",
        "--key",
        str(gpg_key),
        "--registry",
        "127.0.0.1:5000/servimg",
        "--lookaside",
        "https://sigs.example.invalid",
    )
    policy = json.loads(files["policy.json"])  # type: ignore[arg-type]
    assert policy == {
        "default": [{"type": "reject"}],
        "transports": {
            "docker": {
                "127.0.0.1:5000/servimg": [
                    {
                        "type": "signedBy",
                        "keyType": "GPGKeys",
                        "keyData": base64.b64encode(gpg_key.read_bytes()).decode(),
                    }
                ]
            }
        },
    }
    assert yaml.safe_load(files["registries.d/servimg.yaml"]) == {  # type: ignore[arg-type]
        "docker": {"127.0.0.1:5000/servimg": {"lookaside": "https://sigs.example.invalid"}}
    }
    pub = tmp_path / "cosign.pub"
    pub.write_bytes(SigningKey.generate("ecdsa-p256").public_key.to_pem())
    shutil.rmtree(tmp_path / "out")
    files = _export(
        tmp_path,
        "--runtime",
        "containers",
        "--signatures",
        "sigstore",
        "--key",
        str(pub),
        "--registry",
        "r:5000",
    )
    requirement = json.loads(files["policy.json"])["transports"]["docker"]["r:5000"][0]  # type: ignore[arg-type]
    assert requirement == {
        "type": "sigstoreSigned",
        "keyData": base64.b64encode(pub.read_bytes()).decode(),
        "signedIdentity": {"type": "matchRepository"},
    }
    assert yaml.safe_load(files["registries.d/servimg.yaml"]) == {  # type: ignore[arg-type]
        "docker": {"r:5000": {"use-sigstore-attachments": True}}
    }


def test_export_refusals_write_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    base = ["policy", "export", "--out", str(out), "--registry"]
    assert main([*base, "r:5000", "--kyverno"]) != 0  # no key: an admission policy would admit anything
    assert main([*base, "http://r:5000", "--runtime", "containers", "--key", "/dev/null"]) != 0
    assert main([*base, "r:5000", "--runtime", "containers", "--key", "/dev/null"]) != 0  # gpg, no lookaside
    assert main([*base, "r:5000"]) != 0
    assert not out.exists()


def test_a_key_of_the_wrong_kind_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 48 item 3: a PEM key under --signatures gpg made a policy that refused every image, exit 0."""
    pem = tmp_path / "servimg.pub"
    pem.write_bytes(SigningKey.generate("ecdsa-p256").public_key.to_pem())
    gpg = tmp_path / "a.asc"
    gpg.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n")
    out = tmp_path / "out"
    base = ["policy", "export", "--out", str(out), "--registry", "r:5000", "--runtime", "containers"]
    assert main([*base, "--signatures", "gpg", "--key", str(pem), "--lookaside", "https://s.invalid"]) == 1
    said = capsys.readouterr().out
    assert f"--key {pem} is a PEM public key, but --signatures gpg needs an OpenPGP (GPG) public key" in said
    assert "gpg --export --armor" in said
    assert main([*base, "--signatures", "sigstore", "--key", str(gpg)]) == 1
    assert "is an OpenPGP (GPG) public key, but --signatures sigstore needs a PEM public key" in (
        capsys.readouterr().out
    )
    assert not out.exists()
    pub = tmp_path / "k.pub"
    pub.write_bytes(SigningKey.generate().public_key.to_pem())
    policy = Policy().merged(keys=[pub], threshold=2)
    with pytest.raises(export.ExportError, match="any one authority"):
        export.policy_controller_policy(export.Admission.of(policy, "r:5000", ["a", "b"], "p"))


def test_admission_policies_carry_the_check_policy(tmp_path: Path) -> None:
    pub = tmp_path / "k.pub"
    pub.write_bytes(SigningKey.generate("ecdsa-p256").public_key.to_pem())
    policy_file = tmp_path / "release.yaml"
    policy_file.write_text(f"require: [provenance, verify, sbom]\nkeys: [{pub}]\nladders: [cpu-smoke]\n")
    files = _export(
        tmp_path,
        "--kyverno",
        "--policy-controller",
        "--policy",
        str(policy_file),
        "--registry",
        "r:5000/servimg",
    )
    kyverno = yaml.safe_load(files["kyverno-clusterpolicy.yaml"])  # type: ignore[arg-type]
    assert kyverno["apiVersion"] == "kyverno.io/v1" and kyverno["kind"] == "ClusterPolicy"
    verify = kyverno["spec"]["rules"][0]["verifyImages"][0]
    assert verify["imageReferences"] == ["r:5000/servimg/*"] and verify["required"] is True
    entry = verify["attestors"][0]["entries"][0]["keys"]
    assert entry["publicKeys"] == pub.read_text() and entry["rekor"] == {"ignoreTlog": True}
    types = [a["type"] for a in verify["attestations"]]
    assert types == [attest.PROVENANCE_V1, attest.TEST_RESULT_V01, attest.CYCLONEDX_BOM]
    tests = verify["attestations"][1]["conditions"][0]
    assert tests["all"] == [{"key": "{{ result }}", "operator": "Equals", "value": "PASSED"}]
    assert [c["value"] for c in tests["any"]][1:] == ["cpu-smoke"]
    cip = yaml.safe_load(files["clusterimagepolicy.yaml"])  # type: ignore[arg-type]
    assert cip["apiVersion"] == "policy.sigstore.dev/v1beta1" and cip["kind"] == "ClusterImagePolicy"
    _valid_cluster_image_policy(cip)
    authority = cip["spec"]["authorities"][0]
    assert (
        authority["key"] == {"data": pub.read_text(), "hashAlgorithm": "sha256"} and "ctlog" not in authority
    )
    assert 'predicate: result: "PASSED"' in authority["attestations"][1]["policy"]["data"]
    _valid_kyverno(kyverno, tmp_path)


def _valid_kyverno(doc: dict[str, object], tmp_path: Path) -> None:
    """Kyverno's CRD schemas, as @kubernetes-models/kyverno (npm) generates them from Kyverno's published
    CRDs (tests/interop/node/kyverno.mjs); scripts/setup.sh installs them."""
    _require(
        (NODE / "node_modules" / "@kubernetes-models").is_dir(), "needs tests/interop/node (scripts/setup.sh)"
    )
    path = tmp_path / "kyverno.json"
    path.write_text(json.dumps(doc))
    done = subprocess.run(
        ["node", str(NODE / "kyverno.mjs"), str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    broken = json.loads(json.dumps(doc))
    broken["spec"]["rules"][0]["verifyImages"][0]["required"] = "yes"
    path.write_text(json.dumps(broken))
    done = subprocess.run(
        ["node", str(NODE / "kyverno.mjs"), str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and "must be boolean" in done.stdout


# No package ships policy-controller's CRD; this is its v1beta1 openAPIV3Schema (sigstore/policy-controller
# config/300-clusterimagepolicy.yaml) for every field servimg writes, with the types it declares there.
_CIP_FIELDS = {
    "spec": dict,
    "spec.images": list,
    "spec.images[].glob": str,
    "spec.mode": str,
    "spec.authorities": list,
    "spec.authorities[].name": str,
    "spec.authorities[].key": dict,
    "spec.authorities[].key.data": str,
    "spec.authorities[].key.hashAlgorithm": str,
    "spec.authorities[].attestations": list,
    "spec.authorities[].attestations[].name": str,
    "spec.authorities[].attestations[].predicateType": str,
    "spec.authorities[].attestations[].policy": dict,
    "spec.authorities[].attestations[].policy.type": str,
    "spec.authorities[].attestations[].policy.data": str,
}


def _valid_cluster_image_policy(doc: dict[str, object]) -> None:
    def walk(value: object, where: str) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                path = f"{where}.{key}" if where else key
                if where or key == "spec":
                    assert path in _CIP_FIELDS, f"{path} is not a field of the ClusterImagePolicy CRD"
                    assert isinstance(inner, _CIP_FIELDS[path]), f"{path}: {type(inner).__name__}"
                    walk(inner, path)
        elif isinstance(value, list):
            for item in value:
                walk(item, f"{where}[]")

    walk(doc, "")
    assert doc["spec"]["mode"] in ("enforce", "warn")  # type: ignore[index]
