"""The deploy side reads servimg's evidence without servimg (issue 31), against the real registry.

- cosign's formats as pushed: the `.sig` and `.att` manifests field by field against cosign's
  specs/SIGNATURE_SPEC.md and specs/ATTESTATION_SPEC.md, the bundle referrers against specs/BUNDLE_SPEC.md;
- every bundle verified offline by the sigstore project's own verifier (`@sigstore/verify`, npm, run by
  node: tests/interop/node/verify.js), and read by the protobuf-specs' generated code; a tampered one is
  refused;
- `servimg check --require-ladder cpu-smoke` passes on a tag whose only evidence is in cosign's formats,
  and accepts a bundle this test signs without servimg;
- two writers adding to one `.att` tag at once lose nothing; a malformed `.att` stops a push (never
  replaced); a registry refusing the `.sig` push fails the command and the tag does not move;
- GPG simple signing under the exported `signedBy` policy, enforced by Debian's skopeo 1.9.3 (and podman
  where it runs): the servimg-signed image is accepted, a skopeo-made signature beside servimg's too, and
  an unsigned image, a tag re-pointed with `docker push`, another key's signature and a signature copied
  from another digest are each refused with containers/image's own reason;
- a key in a PKCS#11 token (Debian's softhsm2): the push signs through it, `check` and `@sigstore/verify`
  accept what it signed; a wrong PIN or a missing token is a clear error and nothing is pushed.

One image on the fake base (tests/fakebase.py) serves every test; each test that changes what the
registry holds uses a repository of its own.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

import fakebase as fb
from conftest import _require, docker_available
from servimg.backends.layout import LayoutReferrers
from servimg.backends.referrers import fallback_tag
from servimg.backends.registryclient import RegistryClient
from servimg.backends.registryreferrers import RegistryReferrers
from servimg.cli import main
from servimg.core.digest import Digest
from servimg.formats import cosign, publish, referrers
from servimg.oci.image import OCI_INDEX, OCI_MANIFEST, Descriptor
from servimg.signing import dsse, keys
from servimg.statements import attest
from test_faults import FaultProxy

pytestmark = pytest.mark.registry

NODE = Path(__file__).resolve().parent / "interop" / "node"
REPO = "i31/cosign"
BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"


def cli(*argv: str, cache: Path) -> int:
    return fb.main([*argv, "--cache", str(cache)])


def cli_json(*argv: str, cache: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = fb.main([*argv, "--cache", str(cache), "--json"])
    lines = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(lines[-1]) if lines else {}


def gpg(home: Path, *args: str, data: bytes | None = None) -> bytes:
    done = subprocess.run(
        ["gpg", "--batch", "--no-tty", *args],
        input=data,
        capture_output=True,
        env={**os.environ, "GNUPGHOME": str(home)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def gpg_key(home: Path, name: str) -> str:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    gpg(
        home,
        "--passphrase",
        "",
        "--quick-gen-key",
        f"{name} <{name}@servimg.invalid>",
        "ed25519",
        "sign",
        "never",
    )
    listing = gpg(home, "--list-secret-keys", "--with-colons", name).decode()
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


@pytest.fixture(scope="module")
def world(registry: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The fake-base image built once, an ECDSA P-256 pair (cosign's default), two GPG keys (A is
    servimg's, B another's) in one keyring, and a verify report for pushes (the fake base has no
    interpreter to run the probe in)."""
    _require(shutil.which("gpg") is not None, "needs gnupg (scripts/setup.sh installs it)")
    root = tmp_path_factory.mktemp("cosign31")
    cache = root / "cache"
    base = fb.make_base(root / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(root / "repo", base)
    assert cli("lock", str(definition), cache=cache) == 0
    assert cli("build", str(definition), "--to", f"oci:{root / 'built'}", cache=cache) == 0
    report = root / "verify.json"
    report.write_text(
        json.dumps({"checks": [{"code": "SOURCE", "status": "PASS", "subject": "s", "message": "m"}]})
    )
    home = root / "gnupg"
    fprs = {"A": gpg_key(home, "servimg-a"), "B": gpg_key(home, "other-b")}
    (root / "a.asc").write_bytes(gpg(home, "--export", "--armor", fprs["A"]))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GNUPGHOME", str(home))
        mp.delenv("COSIGN_PASSWORD", raising=False)
        yield {
            "root": root,
            "cache": cache,
            "host": registry.host,
            "image": f"oci:{root / 'built'}",
            "report": report,
            "pair": keys.generate(root / "keys", "cosign", algorithm="ecdsa-p256"),
            "gpg_home": home,
            "fpr": fprs,
            "lookaside": root / "lookaside",
        }


def push(world: dict[str, Any], ref: str, *flags: str, key: Path | str | None = None) -> int:
    signing = ("--key", str(key if key is not None else world["pair"].private))
    return cli(
        "push", world["image"], ref, "--report", str(world["report"]), *signing, *flags, cache=world["cache"]
    )


def receipt(world: dict[str, Any], digest: Digest, ladder: str = "cpu-smoke") -> Path:
    path = world["root"] / f"receipt-{digest.hex[:12]}-{ladder}.json"
    body = {
        "ladder": ladder,
        "verdict": "PASS",
        "image_digest": str(digest),
        "arms": [{"id": "control"}, {"id": "warm", "verdict": "PASS"}],
        "finished_at": "2026-12-04T08:00:00Z",
    }
    path.write_text(json.dumps(body))
    return path


@pytest.fixture(scope="module")
def signed(world: dict[str, Any]) -> dict[str, Any]:
    """The image pushed signed in every format (and GPG-signed to the lookaside), a cpu-smoke receipt
    attested."""
    ref = f"{world['host']}/{REPO}:signed"
    gpg_flags = ("--gpg-key", world["fpr"]["A"], "--lookaside", str(world["lookaside"]))
    assert push(world, ref, *gpg_flags) == 0
    with RegistryClient(world["host"]) as client:
        head = client.head_manifest(REPO, "signed")
    assert head is not None
    digest = head[0]
    attest_flags = ("--file", str(receipt(world, digest)), "--key", str(world["pair"].private))
    assert cli("attest", ref, "--predicate-type", "test-result", *attest_flags, cache=world["cache"]) == 0
    return {"ref": ref, "digest": digest, "repo": REPO}


def manifest(host: str, repo: str, reference: str) -> tuple[dict[str, Any], bytes]:
    with RegistryClient(host) as client:
        data, _, _ = client.get_manifest(repo, reference)
    return json.loads(data), data


def blob(host: str, repo: str, digest: str) -> bytes:
    with RegistryClient(host) as client:
        return client.get_blob(repo, Digest.parse(digest))


def ecdsa_verify(public_pem: bytes, signature: bytes, message: bytes) -> None:
    """Independent of servimg's code: cryptography's ECDSA-P256 over SHA-256 (SIGNATURE_SPEC.md)."""
    key = serialization.load_pem_public_key(public_pem)
    assert isinstance(key, ec.EllipticCurvePublicKey)
    key.verify(signature, message, ec.ECDSA(hashes.SHA256()))


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE protocol.md PAE, written out here so the check does not rest on servimg's own."""
    kind = payload_type.encode()
    return b"DSSEv1 " + b"%d %s %d %s" % (len(kind), kind, len(payload), payload)


# ------------------------------------------------------------------------------------- the formats as pushed


def test_sig_manifest_follows_cosigns_signature_spec(world: dict[str, Any], signed: dict[str, Any]) -> None:
    host, digest = world["host"], signed["digest"]
    doc, _ = manifest(host, REPO, f"sha256-{digest.hex}.sig")
    assert doc["schemaVersion"] == 2 and doc["mediaType"] == OCI_MANIFEST  # §OCI Image Manifest V1
    assert doc["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    config = json.loads(blob(host, REPO, doc["config"]["digest"]))
    assert config["rootfs"] == {"type": "layers", "diff_ids": [layer["digest"] for layer in doc["layers"]]}
    assert len(doc["layers"]) == 1
    layer = doc["layers"][0]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"  # §Payload and mediaType
    payload = blob(host, REPO, layer["digest"])
    assert len(payload) == layer["size"]
    assert json.loads(payload)["critical"] == {  # §Simple Signing
        "identity": {"docker-reference": f"{host}/{REPO}"},
        "image": {"docker-manifest-digest": str(digest)},
        "type": "cosign container image signature",
    }
    signature = base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"])  # §Signature
    ecdsa_verify(world["pair"].public.read_bytes(), signature, payload)  # §Signature Schemes: ECDSA-P256


def test_att_manifest_follows_cosigns_attestation_spec(world: dict[str, Any], signed: dict[str, Any]) -> None:
    host, digest = world["host"], signed["digest"]
    doc, _ = manifest(host, REPO, f"sha256-{digest.hex}.att")
    assert doc["mediaType"] == OCI_MANIFEST and doc["config"]["mediaType"].endswith("config.v1+json")
    predicates = []
    for layer in doc["layers"]:
        assert layer["mediaType"] == "application/vnd.dsse.envelope.v1+json"  # §Overall Layout
        assert layer["annotations"]["dev.cosignproject.cosign/signature"] == ""
        envelope = json.loads(blob(host, REPO, layer["digest"]))
        assert envelope["payloadType"] == "application/vnd.in-toto+json"
        payload = base64.b64decode(envelope["payload"])
        for signature in envelope["signatures"]:
            ecdsa_verify(
                world["pair"].public.read_bytes(),
                base64.b64decode(signature["sig"]),
                pae(envelope["payloadType"], payload),
            )
        statement = json.loads(payload)
        # §Subject Verification: the statement names this image; the annotation names its predicate.
        assert {"sha256": digest.hex} in [s["digest"] for s in statement["subject"]]
        assert layer["annotations"]["predicateType"] == statement["predicateType"]
        predicates.append(statement["predicateType"])
    expected = {attest.PROVENANCE_V1, attest.TEST_RESULT_V01, attest.CYCLONEDX_BOM}
    assert set(predicates) == expected and predicates.count(attest.TEST_RESULT_V01) == 2  # verify + ladder


def bundles_of(host: str, repo: str, digest: Digest) -> list[tuple[dict[str, Any], bytes]]:
    """(artifact manifest, bundle bytes) of every bundle referrer (§Retrieval: the fallback tag here)."""
    index, _ = manifest(host, repo, fallback_tag(digest))
    assert index["mediaType"] == OCI_INDEX
    out = []
    for entry in index["manifests"]:
        if entry.get("artifactType") == BUNDLE:
            doc, _ = manifest(host, repo, entry["digest"])
            out.append((doc, blob(host, repo, doc["layers"][0]["digest"])))
    return out


def test_bundles_are_referrers_as_cosigns_bundle_spec(world: dict[str, Any], signed: dict[str, Any]) -> None:
    found = bundles_of(world["host"], REPO, signed["digest"])
    assert len(found) == 4  # provenance, verify result, SBOM, ladder receipt
    for doc, data in found:  # §Publishing
        assert doc["artifactType"] == BUNDLE and doc["mediaType"] == OCI_MANIFEST
        assert doc["config"] == {
            "mediaType": "application/vnd.oci.empty.v1+json",
            "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
            "size": 2,
        }
        assert [layer["mediaType"] for layer in doc["layers"]] == [BUNDLE]
        assert doc["subject"]["digest"] == str(signed["digest"])
        assert doc["annotations"]["dev.sigstore.bundle.content"] == "dsse-envelope"
        bundle = json.loads(data)
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        assert doc["annotations"]["dev.sigstore.bundle.predicateType"] == statement["predicateType"]
        assert bundle["mediaType"] == BUNDLE and list(bundle["verificationMaterial"]) == [
            "publicKey",
            "tlogEntries",
        ]


def sigstore_verify(public: Path, paths: list[Path]) -> list[dict[str, Any]]:
    _require((NODE / "node_modules" / "@sigstore" / "verify").is_dir(), "needs tests/interop/node (setup.sh)")
    done = subprocess.run(
        ["node", str(NODE / "verify.js"), str(public), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stderr == "" or done.returncode in (0, 1), done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_every_bundle_verifies_with_sigstore_verify_and_a_tampered_one_is_refused(
    world: dict[str, Any], signed: dict[str, Any], tmp_path: Path
) -> None:
    paths = []
    for i, (_, data) in enumerate(bundles_of(world["host"], REPO, signed["digest"])):
        paths.append(tmp_path / f"bundle-{i}.json")
        paths[-1].write_bytes(data)
    results = sigstore_verify(world["pair"].public, paths)
    assert [r["ok"] for r in results] == [True] * len(paths) and all(r["schema"] for r in results), results
    bundle = json.loads(paths[0].read_bytes())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["subject"][0]["digest"]["sha256"] = "0" * 64  # the evidence moved to another image
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(bundle))
    other = tmp_path / "other.pub"
    other.write_bytes(dsse.SigningKey.generate("ecdsa-p256").public_key.to_pem())
    (refused,) = sigstore_verify(world["pair"].public, [tampered])
    assert not refused["ok"] and "signature" in refused["error"].lower()
    assert [r["ok"] for r in sigstore_verify(other, paths[:1])] == [False]


def test_a_rerun_adds_nothing_and_another_key_keeps_every_entry(
    world: dict[str, Any], signed: dict[str, Any]
) -> None:
    host, digest = world["host"], signed["digest"]
    repo = "i31/rerun"
    ref = f"{host}/{repo}:v1"
    assert push(world, ref, "--formats", "sig,att") == 0
    sig, att = (manifest(host, repo, f"sha256-{digest.hex}.{s}")[1] for s in ("sig", "att"))
    assert push(world, ref, "--formats", "sig,att") == 0  # RFC 6979: the same bytes again, nothing added
    assert [manifest(host, repo, f"sha256-{digest.hex}.{s}")[1] for s in ("sig", "att")] == [sig, att]
    other = keys.generate(world["root"] / "keys", "second")  # ed25519
    assert push(world, ref, "--formats", "sig,att", key=other.private) == 0
    sig_doc, _ = manifest(host, repo, f"sha256-{digest.hex}.sig")
    att_doc, _ = manifest(host, repo, f"sha256-{digest.hex}.att")
    assert sig_doc["layers"][0] == json.loads(sig)["layers"][0] and len(sig_doc["layers"]) == 2
    assert att_doc["layers"][:3] == json.loads(att)["layers"] and len(att_doc["layers"]) == 6


# ------------------------------------------------------------------------------------------- check reads them


def check(
    world: dict[str, Any], ref: str, capsys: pytest.CaptureFixture[str], *keyfiles: Path
) -> tuple[int, dict[str, Any]]:
    flags = [f for k in keyfiles or (world["pair"].public,) for f in ("--key", str(k))]
    return cli_json(
        "check", ref, *flags, "--require-ladder", "cpu-smoke", cache=world["cache"], capsys=capsys
    )


def rows(out: dict[str, Any]) -> list[dict[str, str]]:
    return list(out.get("report", out).get("rows", []))


def test_check_passes_on_cosign_formats_alone(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    host, repo = world["host"], "i31/cosign-only"
    ref = f"{host}/{repo}:v1"
    assert push(world, ref) == 0
    with RegistryClient(host) as client:
        head = client.head_manifest(repo, "v1")
        assert head is not None
        digest = head[0]
    flags = ("--file", str(receipt(world, digest)), "--key", str(world["pair"].private))
    assert cli("attest", ref, "--predicate-type", "test-result", *flags, cache=world["cache"]) == 0
    code, out = check(world, ref, capsys)
    assert code == 0, rows(out)
    assert any(
        "found as OCI referrer (DSSE), cosign .att, sigstore bundle v0.3" in r["why"] for r in rows(out)
    )
    # Delete servimg's own artifacts: the referrers index keeps only the bundles.
    index, _ = manifest(host, repo, fallback_tag(digest))
    with RegistryClient(host) as client:
        for entry in index["manifests"]:
            if entry["artifactType"] != BUNDLE:
                client.delete_manifest(repo, Digest.parse(entry["digest"]))
        kept = {**index, "manifests": [e for e in index["manifests"] if e["artifactType"] == BUNDLE]}
        client.put_manifest(repo, fallback_tag(digest), json.dumps(kept).encode(), OCI_INDEX)
    code, out = check(world, ref, capsys)
    assert code == 0, rows(out)
    found = [r["why"] for r in rows(out) if r["what"].startswith("attestation ") and r["verdict"] == "PASS"]
    assert len(found) == 4 and all("found as cosign .att, sigstore bundle v0.3" in why for why in found)
    assert any(r["what"].startswith("cosign signature") and r["verdict"] == "PASS" for r in rows(out))
    # Then the bundles too: the `.att` tag alone carries the evidence.
    with RegistryClient(host) as client:
        index_head = client.head_manifest(repo, fallback_tag(digest))
        assert index_head is not None
        client.delete_manifest(repo, index_head[0])
    code, out = check(world, ref, capsys)
    assert code == 0, rows(out)
    found = [r["why"] for r in rows(out) if r["what"].startswith("attestation ") and r["verdict"] == "PASS"]
    assert len(found) == 4 and all("found as cosign .att;" in why for why in found)


def test_check_accepts_a_bundle_signed_without_servimg(
    world: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The statements servimg made (unsigned), signed here with cryptography alone into bundles written by
    hand, attached as referrers: check trusts them by the test's key."""
    host, repo = world["host"], "i31/foreign"
    ref = f"{host}/{repo}:v1"
    assert (
        cli(
            "push",
            world["image"],
            ref,
            "--report",
            str(world["report"]),
            "--formats",
            "oci",
            cache=world["cache"],
        )
        == 0
    )
    with RegistryClient(host) as client:
        head = client.head_manifest(repo, "v1")
        assert head is not None
        subject = Descriptor(OCI_MANIFEST, head[0], head[2])
        place = RegistryReferrers(client, repo)
        descriptors, _ = place.discover(subject.digest)
        payloads = [
            json.loads(referrers.fetch_envelope(place, subject.digest, Digest.parse(d["digest"])))["payload"]
            for d in descriptors
        ]
        foreign = ec.generate_private_key(ec.SECP256R1())
        pem = foreign.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        for payload in payloads:
            body = base64.b64decode(payload)
            sig = foreign.sign(pae("application/vnd.in-toto+json", body), ec.ECDSA(hashes.SHA256()))
            bundle = json.dumps(
                {
                    "mediaType": BUNDLE,
                    "verificationMaterial": {"publicKey": {"hint": "foreign"}, "tlogEntries": []},
                    "dsseEnvelope": {
                        "payload": payload,
                        "payloadType": "application/vnd.in-toto+json",
                        "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}],
                    },
                }
            ).encode()
            predicate = json.loads(body)["predicateType"]
            empty = b"{}"
            artifact = json.dumps(
                {
                    "schemaVersion": 2,
                    "mediaType": OCI_MANIFEST,
                    "artifactType": BUNDLE,
                    "config": {
                        "mediaType": "application/vnd.oci.empty.v1+json",
                        "digest": str(Digest.of_bytes(empty)),
                        "size": 2,
                    },
                    "layers": [
                        {"mediaType": BUNDLE, "digest": str(Digest.of_bytes(bundle)), "size": len(bundle)}
                    ],
                    "subject": {
                        "mediaType": OCI_MANIFEST,
                        "digest": str(subject.digest),
                        "size": subject.size,
                    },
                    "annotations": {
                        "dev.sigstore.bundle.content": "dsse-envelope",
                        "dev.sigstore.bundle.predicateType": predicate,
                    },
                }
            ).encode()
            place.attach(subject.digest, artifact, (empty, bundle))
    public = tmp_path / "foreign.pub"
    public.write_bytes(pem)
    capsys.readouterr()
    code, out = cli_json("check", ref, "--key", str(public), cache=world["cache"], capsys=capsys)
    assert code == 0, rows(out)
    passed = [r["why"] for r in rows(out) if r["what"].startswith("attestation ") and r["verdict"] == "PASS"]
    assert len(passed) == 3 and all("found as sigstore bundle v0.3;" in w for w in passed), passed
    # servimg's own unsigned copies of the same statements are reported apart, and not counted.
    unsigned = [r for r in rows(out) if "ignored: unsigned envelope" in r["why"]]
    assert len(unsigned) == 3


# ---------------------------------------------------------------------------------------- writers and faults


def test_two_writers_at_once_lose_no_entry(
    world: dict[str, Any], signed: dict[str, Any], tmp_path: Path
) -> None:
    """Registry: write, settle, re-read, retry (backends.registryreferrers); layout: under its lock."""
    subject = signed["digest"]
    tag = cosign.attestation_tag(Digest.of_bytes(b"a subject of its own"))
    rounds = 6

    def writer(name: str, place_of: Any, errors: list[BaseException]) -> None:
        try:
            with place_of() as place:
                for i in range(rounds):
                    data = f'{{"payload":"","payloadType":"{name}-{i}","signatures":[]}}'.encode()
                    layer = cosign.attestation_layer(data, attest.TEST_RESULT_V01)
                    place.update_tagged(publish.layers_change(tag, [(layer, data)]))
        except BaseException as exc:
            errors.append(exc)

    class Registry:
        def __enter__(self) -> RegistryReferrers:
            self.client = RegistryClient(world["host"])
            return RegistryReferrers(self.client, REPO, settle=0.05)

        def __exit__(self, *exc: object) -> None:
            self.client.close()

    class Layout:
        def __enter__(self) -> LayoutReferrers:
            return LayoutReferrers(tmp_path / "layout")

        def __exit__(self, *exc: object) -> None:
            pass

    assert (
        cli(
            "push",
            world["image"],
            f"oci:{tmp_path / 'layout'}:v1",
            "--report",
            str(world["report"]),
            cache=world["cache"],
        )
        == 0
    )
    for place_of, read in (
        (Registry, lambda: manifest(world["host"], REPO, tag)[1]),
        (Layout, lambda: LayoutReferrers(tmp_path / "layout").tagged(tag)),
    ):
        errors: list[BaseException] = []
        threads = [threading.Thread(target=writer, args=(n, place_of, errors)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        layers = cosign.tag_layers(read(), tag)
        assert len(layers) == 2 * rounds and len(set(layers)) == 2 * rounds
    assert subject  # the image itself was never touched


def test_a_malformed_att_stops_the_push_and_is_never_replaced(
    world: dict[str, Any], signed: dict[str, Any]
) -> None:
    host, repo = world["host"], "i31/malformed"
    assert (
        cli(
            "push",
            world["image"],
            f"{host}/{repo}",
            "--report",
            str(world["report"]),
            "--formats",
            "oci",
            cache=world["cache"],
        )
        == 0
    )
    foreign = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}).encode()
    tag = f"sha256-{signed['digest'].hex}.att"
    with RegistryClient(host) as client:
        client.put_manifest(repo, tag, foreign, OCI_INDEX)
    assert push(world, f"{host}/{repo}:v1") != 0
    with RegistryClient(host) as client:
        assert client.head_manifest(repo, "v1") is None  # the tag did not move
    assert manifest(host, repo, tag)[1] == foreign  # reported, never replaced


def test_a_registry_refusing_the_sig_push_fails_and_the_tag_does_not_move(
    world: dict[str, Any], registry: Any
) -> None:
    repo = "i31/refused"
    with FaultProxy(registry.host) as proxy:
        proxy.add(
            "PUT",
            r"/manifests/sha256-[0-9a-f]{64}\.sig$",
            "status",
            status=403,
            body=b'{"errors":[{"code":"DENIED"}]}',
        )
        assert push(world, f"{proxy.host}/{repo}:v1") != 0
        assert proxy.count("PUT", r"\.sig$", 403) >= 1
    with RegistryClient(registry.host) as client:
        assert client.head_manifest(repo, "v1") is None


def test_gpg_signatures_go_to_a_registry_with_the_signature_extension(
    world: dict[str, Any], registry: Any
) -> None:
    """No registry here has the extension (OpenShift's has): the proxy answers for it, the rest is real."""
    repo = "i31/extension"
    with FaultProxy(registry.host) as proxy:
        proxy.add(
            "GET",
            r"^/v2/$",
            "status",
            status=200,
            headers=(("X-Registry-Supports-Signatures", "1"),),
            body=b"{}",
        )
        proxy.add("PUT", r"^/extensions/v2/", "status", status=201)
        assert push(world, f"{proxy.host}/{repo}:v1", "--gpg-key", world["fpr"]["A"], "--formats", "oci") == 0
        assert proxy.count("PUT", rf"^/extensions/v2/{repo}/signatures/sha256:", 201) == 1
    # Without the extension and without --lookaside there is nowhere to put them: refused before pushing.
    assert push(world, f"{registry.host}/{repo}-nowhere:v1", "--gpg-key", world["fpr"]["A"]) != 0
    with RegistryClient(registry.host) as client:
        assert client.head_manifest(f"{repo}-nowhere", "v1") is None


# ----------------------------------------------------------------------------------- GPG: skopeo enforces it


def skopeo_copy(
    world: dict[str, Any], policy: Path, ref: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    _require(shutil.which("skopeo") is not None, "needs skopeo (scripts/setup.sh installs it)")
    dest = tmp_path / f"copy-{len(list(tmp_path.glob('copy-*')))}"
    return subprocess.run(
        [
            "skopeo",
            "copy",
            "--remove-signatures",
            "--src-tls-verify=false",
            "--policy",
            str(policy / "policy.json"),
            "--registries.d",
            str(policy / "registries.d"),
            f"docker://{ref}",
            f"dir:{dest}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def podman_pull(
    world: dict[str, Any], policy: Path, ref: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """`podman pull` under the exported files: the policy by flag; registries.d (and registries.conf, for
    the plain-HTTP test registry) from $HOME/.config/containers, which containers/image reads first."""
    _require(shutil.which("podman") is not None, "needs podman (scripts/setup.sh installs it)")
    home = tmp_path / "podman-home"
    config = home / ".config" / "containers"
    if not config.exists():
        shutil.copytree(policy / "registries.d", config / "registries.d")
        (config / "registries.conf").write_text(
            f'[[registry]]\nlocation = "{world["host"]}"\ninsecure = true\n'
        )
    done = subprocess.run(
        ["podman", "pull", "--signature-policy", str(policy / "policy.json"), ref],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HOME": str(home)},
        check=False,
    )
    if done.returncode == 0:
        subprocess.run(["podman", "rmi", "-f", ref], capture_output=True, timeout=120, check=False)
    return done


@pytest.fixture(scope="module")
def gpg_policy(world: dict[str, Any], signed: dict[str, Any]) -> Path:
    """The exported folder, moved somewhere else and its key file gone (issue 48 item 3): every test that
    runs skopeo and podman under it proves it is complete and relocatable, as a copy on a node is."""
    made = world["root"] / "exported-here"
    key = made.parent / "export-key.asc"
    shutil.copy(world["root"] / "a.asc", key)
    code = main(
        [
            "policy",
            "export",
            "--runtime",
            "containers",
            "--signatures",
            "gpg",
            "--key",
            str(key),
            "--registry",
            world["host"],
            "--lookaside",
            f"file://{world['lookaside']}",
            "--out",
            str(made),
        ]
    )
    assert code == 0
    key.unlink()
    out = world["root"] / "containers"
    shutil.move(made, out)
    assert (
        str(made) not in (out / "policy.json").read_text()
        and "export-key" not in (out / "policy.json").read_text()
    )
    return out


def test_skopeo_accepts_the_gpg_signed_image_and_refuses_the_unsigned_and_another_keys(
    world: dict[str, Any], signed: dict[str, Any], gpg_policy: Path, tmp_path: Path
) -> None:
    host = world["host"]
    done = skopeo_copy(world, gpg_policy, signed["ref"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (
        cli(
            "push",
            world["image"],
            f"{host}/i31/unsigned:v1",
            "--report",
            str(world["report"]),
            cache=world["cache"],
        )
        == 0
    )
    done = skopeo_copy(world, gpg_policy, f"{host}/i31/unsigned:v1", tmp_path)
    assert done.returncode != 0 and "A signature was required, but no signature exists" in done.stderr
    # podman, the same library: the signed image is pulled, the unsigned one refused with the same reason.
    done = podman_pull(world, gpg_policy, signed["ref"], tmp_path)
    assert done.returncode == 0, done.stderr
    done = podman_pull(world, gpg_policy, f"{host}/i31/unsigned:v1", tmp_path)
    assert done.returncode != 0 and "A signature was required, but no signature exists" in done.stderr
    other = ("--gpg-key", world["fpr"]["B"], "--lookaside", str(world["lookaside"]))
    assert push(world, f"{host}/i31/otherkey:v1", *other) == 0
    done = skopeo_copy(world, gpg_policy, f"{host}/i31/otherkey:v1", tmp_path)
    # gpgme checks the signature against the policy's keyring only: key B is unknown there.
    assert done.returncode != 0 and "Invalid GPG signature" in done.stderr, done.stderr
    assert world["fpr"]["B"] in done.stderr
    done = podman_pull(world, gpg_policy, f"{host}/i31/otherkey:v1", tmp_path)
    assert done.returncode != 0 and "Invalid GPG signature" in done.stderr, done.stderr


def test_promote_signs_the_promotion_tag_for_the_runtime(
    world: dict[str, Any], signed: dict[str, Any], gpg_policy: Path, tmp_path: Path
) -> None:
    """The default policy wants a signature for exactly the pulled tag: promote makes one for its tag."""
    repo = "i31/promote"
    ref, promoted = f"{world['host']}/{repo}:v1", f"{world['host']}/{repo}:qualified"
    gpg_flags = ("--gpg-key", world["fpr"]["A"], "--lookaside", str(world["lookaside"]))
    assert push(world, ref, *gpg_flags) == 0
    flags = ("--file", str(receipt(world, signed["digest"])), "--key", str(world["pair"].private))
    assert cli("attest", ref, "--predicate-type", "test-result", *flags, cache=world["cache"]) == 0
    assert skopeo_copy(world, gpg_policy, promoted, tmp_path).returncode != 0  # no such tag yet
    policy = ("--key", str(world["pair"].public), "--require-ladder", "cpu-smoke")
    sign = ("--sign", str(world["pair"].private))
    assert cli("promote", ref, "--tag", "qualified", *sign, *policy, *gpg_flags, cache=world["cache"]) == 0
    done = skopeo_copy(world, gpg_policy, promoted, tmp_path)
    assert done.returncode == 0, done.stderr


def test_a_skopeo_made_signature_beside_servimgs_is_accepted_too(
    world: dict[str, Any], signed: dict[str, Any], gpg_policy: Path, tmp_path: Path
) -> None:
    """skopeo copy --sign-by is containers/image's own signer: its signature goes beside servimg's (the
    next signature-N) and the policy accepts the image on either."""
    ref = f"{world['host']}/i31/both:v1"
    assert push(world, ref, "--gpg-key", world["fpr"]["A"], "--lookaside", str(world["lookaside"])) == 0
    staging = tmp_path / "staging.d"
    staging.mkdir()
    (staging / "servimg.yaml").write_text(
        f"docker:\n  {world['host']}:\n    lookaside: file://{world['lookaside']}\n"
        f"    lookaside-staging: file://{world['lookaside']}\n"
    )
    done = subprocess.run(
        [
            "skopeo",
            "copy",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            "--registries.d",
            str(staging),
            "--sign-by",
            world["fpr"]["A"],
            f"docker://{ref}",
            f"docker://{ref}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    directory = world["lookaside"] / "i31" / f"both@sha256={signed['digest'].hex}"
    assert sorted(p.name for p in directory.iterdir()) == ["signature-1", "signature-2"]
    assert skopeo_copy(world, gpg_policy, ref, tmp_path).returncode == 0
    # skopeo's alone (containers/image reads signature-1, -2, … up to the first missing one)
    (directory / "signature-1").rename(tmp_path / "servimg-made")
    (directory / "signature-2").rename(directory / "signature-1")
    assert skopeo_copy(world, gpg_policy, ref, tmp_path).returncode == 0


@pytest.mark.docker
def test_a_re_pointed_tag_and_a_copied_signature_are_refused(
    world: dict[str, Any], signed: dict[str, Any], gpg_policy: Path, tmp_path: Path
) -> None:
    _require(docker_available(), "needs a running Docker Engine")
    host = world["host"]
    ref = f"{host}/i31/repointed:v1"
    assert push(world, ref, "--gpg-key", world["fpr"]["A"], "--lookaside", str(world["lookaside"])) == 0
    assert skopeo_copy(world, gpg_policy, ref, tmp_path).returncode == 0
    # An edited image pushed over the tag with plain docker (no signature): the tag now names D2.
    subprocess.run(
        ["skopeo", "copy", "--src-tls-verify=false", f"docker://{ref}", f"docker-daemon:{ref}"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {ref}\nCOPY edited /edited\n")
    (context / "edited").write_text("not what was qualified\n")
    subprocess.run(
        ["docker", "build", "-q", "-t", ref, str(context)], check=True, capture_output=True, timeout=300
    )
    subprocess.run(["docker", "push", ref], check=True, capture_output=True, timeout=300)
    with RegistryClient(host) as client:
        head = client.head_manifest("i31/repointed", "v1")
    assert head is not None and head[0] != signed["digest"]
    done = skopeo_copy(world, gpg_policy, ref, tmp_path)
    assert done.returncode != 0 and "A signature was required, but no signature exists" in done.stderr
    done = podman_pull(world, gpg_policy, ref, tmp_path)
    assert done.returncode != 0 and "A signature was required, but no signature exists" in done.stderr
    # The qualified image's signature copied beside the edited one: it names the other digest.
    original = world["lookaside"] / "i31" / f"repointed@sha256={signed['digest'].hex}" / "signature-1"
    copied = world["lookaside"] / "i31" / f"repointed@sha256={head[0].hex}" / "signature-1"
    copied.parent.mkdir(parents=True)
    shutil.copy(original, copied)
    done = skopeo_copy(world, gpg_policy, ref, tmp_path)
    assert done.returncode != 0 and "does not match" in done.stderr, done.stderr
    assert str(signed["digest"]) in done.stderr
    done = podman_pull(world, gpg_policy, ref, tmp_path)
    assert done.returncode != 0 and "does not match" in done.stderr, done.stderr


# ------------------------------------------------------------------------------------------------ PKCS#11

SOFTHSM = next(
    (
        p
        for p in ("/usr/lib/softhsm/libsofthsm2.so", "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so")
        if Path(p).exists()
    ),
    None,
)


@pytest.fixture(scope="module")
def token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A SoftHSM token of its own (SOFTHSM2_CONF), an ECDSA P-256 pair generated inside it (never
    extractable)."""
    _require(SOFTHSM is not None and shutil.which("softhsm2-util") is not None, "needs softhsm2 (setup.sh)")
    import pkcs11
    from pkcs11 import Attribute, KeyType
    from pkcs11.util.ec import encode_named_curve_parameters

    root = tmp_path_factory.mktemp("hsm")
    (root / "tokens").mkdir()
    conf = root / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {root / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n"
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SOFTHSM2_CONF", str(conf))
        subprocess.run(
            [
                "softhsm2-util",
                "--init-token",
                "--free",
                "--label",
                "servimg31",
                "--pin",
                "1234",
                "--so-pin",
                "5678",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        lib = pkcs11.lib(SOFTHSM)
        with lib.get_token(token_label="servimg31").open(user_pin="1234", rw=True) as session:
            params = session.create_domain_parameters(
                KeyType.EC, {Attribute.EC_PARAMS: encode_named_curve_parameters("secp256r1")}, local=True
            )
            params.generate_keypair(store=True, label="signer")
        uri = f"pkcs11:token=servimg31;object=signer?module-path={SOFTHSM}"
        yield {"uri": uri, "pin": "1234"}


def test_a_pkcs11_signature_verifies_in_check_and_in_sigstore_verify(
    world: dict[str, Any],
    token: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host, repo = world["host"], "i31/hsm"
    ref = f"{host}/{repo}:v1"
    monkeypatch.setenv("SERVIMG_PKCS11_PIN", token["pin"])
    public = tmp_path / "hsm.pub"
    public.write_bytes(keys.load_signing(token["uri"]).public_key.to_pem())
    assert push(world, ref, key=token["uri"]) == 0
    with RegistryClient(host) as client:
        head = client.head_manifest(repo, "v1")
    assert head is not None
    code, out = cli_json("check", ref, "--key", str(public), cache=world["cache"], capsys=capsys)
    assert code == 0, rows(out)
    paths = []
    for i, (_, data) in enumerate(bundles_of(host, repo, head[0])):
        paths.append(tmp_path / f"b{i}.json")
        paths[-1].write_bytes(data)
    assert paths and all(r["ok"] for r in sigstore_verify(public, paths))


def test_a_wrong_pin_or_a_missing_token_is_a_clear_error_and_nothing_is_pushed(
    world: dict[str, Any],
    token: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    host, repo = world["host"], "i31/hsm-refused"
    monkeypatch.setenv("SERVIMG_PKCS11_PIN", "0000")
    code, out = cli_json(
        "push",
        world["image"],
        f"{host}/{repo}:v1",
        "--report",
        str(world["report"]),
        "--key",
        token["uri"],
        cache=world["cache"],
        capsys=capsys,
    )
    assert code != 0 and "the PIN is wrong" in json.dumps(out)
    absent = token["uri"].replace("token=servimg31", "token=unplugged")
    monkeypatch.setenv("SERVIMG_PKCS11_PIN", token["pin"])
    code, out = cli_json(
        "push",
        world["image"],
        f"{host}/{repo}:v1",
        "--report",
        str(world["report"]),
        "--key",
        absent,
        cache=world["cache"],
        capsys=capsys,
    )
    assert code != 0 and "no PKCS#11 token labelled 'unplugged'" in json.dumps(out)
    with RegistryClient(host) as client:
        assert client.head_manifest(repo, "v1") is None
