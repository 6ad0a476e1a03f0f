"""Attestations attached to images as OCI 1.1 artifacts.

Registry tests run against the real distribution 2.8 (tests/registry_server.py), which has NO referrers
API: everything there goes through the `sha256-<hex>` tag index fallback, concurrency included.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from servimg.backends.layout import LayoutReferrers
from servimg.backends.referrers import fallback_tag, referrer_descriptor
from servimg.backends.registryclient import RegistryClient
from servimg.backends.registryreferrers import RegistryReferrers
from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.formats import referrers
from servimg.formats.referrers import ReferrersError
from servimg.oci.image import OCI_INDEX, OCI_MANIFEST, Descriptor, Image
from servimg.signing.dsse import Envelope, SigningKey
from servimg.statements import attest

TEST_RESULT = attest.artifact_type("test-result")
PROVENANCE = attest.artifact_type("provenance")
_names = count()


@pytest.fixture(scope="module")
def key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture
def client(registry: Any) -> Iterator[RegistryClient]:
    with RegistryClient(registry.host, retries=1, backoff=0.05) as c:
        yield c


@pytest.fixture
def repo() -> str:
    return f"servimg/att{next(_names)}"


def _image(label: str) -> Image:
    config = {"architecture": "amd64", "os": "linux", "config": {"Labels": {"l": label}}}
    return Image.create({**config, "rootfs": {"type": "layers", "diff_ids": []}}, [])


def _push_image(client: RegistryClient, repo: str, label: str) -> tuple[Image, Descriptor]:
    image = _image(label)
    data = image.config_bytes
    client.push_blob(repo, image.config_digest, len(data), lambda: io.BytesIO(data))
    client.put_manifest(repo, label, image.manifest_bytes, OCI_MANIFEST)
    return image, Descriptor(OCI_MANIFEST, image.digest, len(image.manifest_bytes))


def _envelope(key: SigningKey, image: Image, test: str) -> bytes:
    predicate = attest.test_result(configuration=[attest.resource(uri="https://servimg.io/l")], passed=[test])
    subjects = attest.image_subjects("servimg/x", image.digest, image.config_digest)
    data = attest.statement(subjects, attest.TEST_RESULT_V01, predicate)
    return attest.sign_statement(data, key).to_bytes()


def _annotations(created: str = "2026-01-02T03:04:05Z") -> dict[str, str]:
    return referrers.attestation_annotations(attest.TEST_RESULT_V01, created)


# ------------------------------------------------------------------------------------------ pure (fast)


def test_artifact_manifest_shape() -> None:
    image = _image("a")
    subject = Descriptor(OCI_MANIFEST, image.digest, len(image.manifest_bytes))
    envelope = b'{"payload":"","payloadType":"t","signatures":[]}'
    data = referrers.artifact_manifest(subject, envelope, TEST_RESULT, _annotations())
    doc = json.loads(data)
    assert data == canonical.dumps(doc)
    assert doc["artifactType"] == TEST_RESULT
    assert doc["mediaType"] == OCI_MANIFEST
    assert doc["config"] == {
        "mediaType": "application/vnd.oci.empty.v1+json",
        "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
        "size": 2,
    }
    assert doc["layers"] == [
        {
            "mediaType": "application/vnd.dsse.envelope.v1+json",
            "digest": str(Digest.of_bytes(envelope)),
            "size": len(envelope),
        }
    ]
    assert doc["subject"] == {"mediaType": OCI_MANIFEST, "digest": str(image.digest), "size": subject.size}
    assert doc["annotations"] == {
        "in-toto.io/predicate-type": attest.TEST_RESULT_V01,
        "org.opencontainers.image.created": "2026-01-02T03:04:05Z",
    }
    entry = referrer_descriptor(data)
    assert entry["artifactType"] == TEST_RESULT and entry["annotations"] == doc["annotations"]
    assert entry["digest"] == str(Digest.of_bytes(data)) and entry["size"] == len(data)


def test_artifact_manifest_refusals() -> None:
    subject = Descriptor("application/vnd.oci.image.layer.v1.tar", Digest.of_bytes(b"x"), 1)
    with pytest.raises(ReferrersError) as info:
        referrers.artifact_manifest(subject, b"not an envelope", "no media type", {})
    assert len(info.value.problems) == 3


def test_fallback_tag() -> None:
    digest = Digest.parse("sha256:" + "ab" * 32)
    assert fallback_tag(digest) == "sha256-" + "ab" * 32
    assert fallback_tag(Digest.parse("sha512:" + "c" * 128)) == "sha512-" + "c" * 64


def test_write_to_layout(tmp_path: Path, key: SigningKey) -> None:
    image = _image("layout")
    blobs = tmp_path / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (tmp_path / "oci-layout").write_bytes(b'{"imageLayoutVersion":"1.0.0"}')
    for blob in (image.manifest_bytes, image.config_bytes):
        (blobs / Digest.of_bytes(blob).hex).write_bytes(blob)
    image_entry = {
        "mediaType": OCI_MANIFEST,
        "digest": str(image.digest),
        "size": len(image.manifest_bytes),
        "annotations": {"org.opencontainers.image.ref.name": "v1"},
    }
    (tmp_path / "index.json").write_bytes(
        canonical.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [image_entry]})
    )
    subject = Descriptor(OCI_MANIFEST, image.digest, len(image.manifest_bytes))
    envelope = _envelope(key, image, "t")
    digest = referrers.attach(LayoutReferrers(tmp_path), subject, envelope, TEST_RESULT, _annotations())
    again = referrers.attach(LayoutReferrers(tmp_path), subject, envelope, TEST_RESULT, _annotations())
    assert again == digest
    index = json.loads((tmp_path / "index.json").read_bytes())
    assert image_entry in index["manifests"] and len(index["manifests"]) == 2
    for entry in index["manifests"]:
        Digest.parse(entry["digest"]).verify((blobs / entry["digest"][7:]).read_bytes())
    manifest = json.loads((blobs / digest.hex).read_bytes())
    assert manifest["subject"]["digest"] == str(image.digest)
    assert (blobs / manifest["layers"][0]["digest"][7:]).read_bytes() == envelope
    assert (blobs / referrers.EMPTY_DESCRIPTOR["digest"][7:]).read_bytes() == b"{}"
    other = Descriptor(OCI_MANIFEST, Digest.of_bytes(b"absent"), 5)
    with pytest.raises(ReferrersError, match="not in this layout"):
        referrers.attach(LayoutReferrers(tmp_path), other, envelope, TEST_RESULT, _annotations())


# --------------------------------------------------------------------------------------- real registry


def _fallback_index(client: RegistryClient, repo: str, subject: Digest) -> dict[str, Any]:
    data, media_type, _ = client.get_manifest(repo, fallback_tag(subject), accept=(OCI_INDEX,))
    assert media_type == OCI_INDEX
    doc: dict[str, Any] = json.loads(data)
    assert data == canonical.dumps(doc)
    return doc


@pytest.mark.registry
def test_attach_two_lists_both_and_keeps_image_digest(
    client: RegistryClient, repo: str, key: SigningKey
) -> None:
    image, subject = _push_image(client, repo, "v1")
    before = client.head_manifest(repo, "v1")
    assert client.referrers(repo, image.digest) is None  # distribution 2.8: the fallback is exercised
    first = referrers.attach(
        RegistryReferrers(client, repo), subject, _envelope(key, image, "a"), TEST_RESULT, _annotations()
    )
    second = referrers.attach(
        RegistryReferrers(client, repo), subject, _envelope(key, image, "b"), PROVENANCE, _annotations()
    )
    assert first != second
    after = client.head_manifest(repo, "v1")
    assert before == after and after is not None and after[0] == image.digest
    assert client.get_manifest(repo, "v1")[0] == image.manifest_bytes
    listed = referrers.listed(RegistryReferrers(client, repo), image.digest)
    assert sorted(d["digest"] for d in listed) == sorted([str(first), str(second)])
    assert {d["artifactType"] for d in listed} == {TEST_RESULT, PROVENANCE}
    assert all(d["annotations"] == _annotations() for d in listed)
    assert _fallback_index(client, repo, image.digest)["manifests"] == listed
    only = referrers.listed(RegistryReferrers(client, repo), image.digest, PROVENANCE)
    assert [d["digest"] for d in only] == [str(second)]


@pytest.mark.registry
def test_reattach_deduplicates(client: RegistryClient, repo: str, key: SigningKey) -> None:
    image, subject = _push_image(client, repo, "v1")
    envelope = _envelope(key, image, "a")
    first = referrers.attach(RegistryReferrers(client, repo), subject, envelope, TEST_RESULT, _annotations())
    again = referrers.attach(RegistryReferrers(client, repo), subject, envelope, TEST_RESULT, _annotations())
    assert first == again
    assert [d["digest"] for d in _fallback_index(client, repo, image.digest)["manifests"]] == [str(first)]


@pytest.mark.registry
def test_concurrent_attaches_all_survive(registry: Any, repo: str, key: SigningKey) -> None:
    with RegistryClient(registry.host) as setup:
        image, subject = _push_image(setup, repo, "v1")
    envelopes = [_envelope(key, image, f"t{i}") for i in range(4)]
    barrier = threading.Barrier(len(envelopes))
    results: dict[int, Digest | BaseException] = {}

    def worker(i: int) -> None:
        # One client (one requests.Session) per thread: sessions are not thread-safe.
        with RegistryClient(registry.host) as own:
            barrier.wait()
            try:
                results[i] = referrers.attach(
                    RegistryReferrers(own, repo), subject, envelopes[i], TEST_RESULT, _annotations()
                )
            except BaseException as exc:
                results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(envelopes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    digests = [results[i] for i in range(len(envelopes))]
    assert all(isinstance(d, Digest) for d in digests), digests
    with RegistryClient(registry.host) as check:
        listed = {d["digest"] for d in referrers.listed(RegistryReferrers(check, repo), image.digest)}
    assert listed == {str(d) for d in digests}


@pytest.mark.registry
def test_fetch_envelope_verifies_binding(client: RegistryClient, repo: str, key: SigningKey) -> None:
    image, subject = _push_image(client, repo, "v1")
    other, other_subject = _push_image(client, repo, "v2")
    envelope = _envelope(key, image, "a")
    artifact = referrers.attach(
        RegistryReferrers(client, repo), subject, envelope, TEST_RESULT, _annotations()
    )
    fetched = referrers.fetch_envelope(
        RegistryReferrers(client, repo), image.digest, artifact, artifact_type=TEST_RESULT
    )
    assert fetched == envelope
    opened = attest.open_envelope(Envelope.parse(fetched), [key.public_key], subject=image.config_digest)
    assert opened.covers(image.digest)
    with pytest.raises(ReferrersError, match="subject is"):
        referrers.fetch_envelope(RegistryReferrers(client, repo), other.digest, artifact)
    with pytest.raises(ReferrersError, match="artifactType"):
        referrers.fetch_envelope(
            RegistryReferrers(client, repo), image.digest, artifact, artifact_type=PROVENANCE
        )
    # A forged index under the other image's tag lists the artifact; the manifest's subject unmasks it
    # (when listing, and when fetching by digest).
    forged = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": referrers.listed(RegistryReferrers(client, repo), image.digest),
    }
    client.put_manifest(repo, fallback_tag(other.digest), canonical.dumps(forged), OCI_INDEX)
    assert (
        referrers.listed(RegistryReferrers(client, repo), other.digest) == []
    )  # the listing already drops it
    [entry] = forged["manifests"]
    with pytest.raises(ReferrersError, match="is not an attestation of"):
        referrers.fetch_envelope(RegistryReferrers(client, repo), other.digest, Digest.parse(entry["digest"]))
    # The image itself is not an attestation either.
    with pytest.raises(ReferrersError):
        referrers.fetch_envelope(RegistryReferrers(client, repo), other_subject.digest, other.digest)


@pytest.mark.registry
def test_foreign_content_under_the_referrers_tag(client: RegistryClient, repo: str, key: SigningKey) -> None:
    image, subject = _push_image(client, repo, "v1")
    squatter = _image("squatter")
    data = squatter.config_bytes
    client.push_blob(repo, squatter.config_digest, len(data), lambda: io.BytesIO(data))
    client.put_manifest(repo, fallback_tag(image.digest), squatter.manifest_bytes, OCI_MANIFEST)
    assert (
        referrers.listed(RegistryReferrers(client, repo), image.digest) == []
    )  # §Listing Referrers: no referrers
    with pytest.raises(ReferrersError, match="not a referrers image index"):
        referrers.attach(
            RegistryReferrers(client, repo), subject, _envelope(key, image, "a"), TEST_RESULT, _annotations()
        )
    # Refused, not overwritten: the squatter is still there.
    held = client.head_manifest(repo, fallback_tag(image.digest))
    assert held is not None and held[0] == squatter.digest


@pytest.mark.registry
def test_referrers_api_registry_skips_the_tag(
    client: RegistryClient, repo: str, key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    image, subject = _push_image(client, repo, "v1")
    monkeypatch.setattr(client, "referrers", lambda *args, **kwargs: [])  # as a registry with the API answers
    artifact = referrers.attach(
        RegistryReferrers(client, repo), subject, _envelope(key, image, "a"), TEST_RESULT, _annotations()
    )
    assert client.head_manifest(repo, str(artifact)) is not None
    assert client.head_manifest(repo, fallback_tag(image.digest)) is None


@pytest.mark.registry
def test_a_registry_that_aliases_the_fallback_tag_to_the_subject_is_named(
    client: RegistryClient, repo: str, key: SigningKey, caplog: pytest.LogCaptureFixture
) -> None:
    """Some registries read `sha256-<hex>` as the digest itself; simulated by putting the subject under it."""
    image, subject = _push_image(client, repo, "v1")
    client.put_manifest(repo, fallback_tag(image.digest), image.manifest_bytes, OCI_MANIFEST)
    found, via = RegistryReferrers(client, repo).discover(image.digest)
    assert found == [] and "resolves this referrers tag to the image manifest itself" in via
    assert referrers.listed(RegistryReferrers(client, repo), image.digest) == []
    assert "image manifest itself" in caplog.text
    with pytest.raises(ReferrersError, match="image manifest itself") as info:
        referrers.attach(
            RegistryReferrers(client, repo), subject, _envelope(key, image, "a"), TEST_RESULT, _annotations()
        )
    assert "referrers API" in info.value.hint


@pytest.mark.registry
def test_fallback_entries_that_do_not_name_the_subject_are_dropped_and_said(
    client: RegistryClient, repo: str, key: SigningKey
) -> None:
    image, subject = _push_image(client, repo, "v1")
    artifact = referrers.attach(
        RegistryReferrers(client, repo), subject, _envelope(key, image, "a"), TEST_RESULT, _annotations()
    )
    other, _ = _push_image(client, repo, "other")  # an image manifest: no subject at all
    tag = fallback_tag(image.digest)
    index = json.loads(client.get_manifest(repo, tag)[0])
    index["manifests"].append(
        {"mediaType": OCI_MANIFEST, "digest": str(other.digest), "size": len(other.manifest_bytes)}
    )
    client.put_manifest(repo, tag, canonical.dumps(index), OCI_INDEX)
    found, via = RegistryReferrers(client, repo).discover(image.digest)
    assert [d["digest"] for d in found] == [str(artifact)]
    assert f"1 of 2 entries under {tag} do not name {image.digest.short}" in via
