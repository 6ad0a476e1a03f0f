"""Provenance that travels with the digest, attacked: the tamper suite and the happy path.

Real parts only: the demo image built from the real demo base, Debian's dockerd, and Debian's
docker-registry (distribution 2.8: no referrers API, so every attestation goes through the
`sha256-<hex>` fallback index). Every tampered image below is a real variant of the demo image pushed to
the real registry; each must FAIL `servimg check` with its own specific reason, and the clean image must
have no FAIL row at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import copy_checkout, docker
from fakebase import HOST_SEAMS, on_host
from servimg.assembly.context import Context
from servimg.assembly.plan import BuildPlan
from servimg.attesting.attach import build_statements, image_facts, push_image
from servimg.backends import engine
from servimg.backends.referrers import fallback_tag
from servimg.backends.registryclient import RegistryClient
from servimg.backends.registryreferrers import RegistryReferrers
from servimg.backends.target import Target
from servimg.cli import main
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.formats import cosign, referrers
from servimg.judging import check, evidence
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import OCI_INDEX, OCI_MANIFEST, Descriptor, Image, Layer
from servimg.oci.layer import WHITEOUT_PREFIX, Entry, Kind, normalize_path, write_layer
from servimg.signing import dsse, keys
from servimg.statements import attest
from servimg.statements.derived import DEFAULT_BUILDER_ID, Invocation

pytestmark = [pytest.mark.docker, pytest.mark.demo, pytest.mark.root, pytest.mark.registry]

DEMO = "images/demo.yaml"
REPO_NAME = "servimg/tamper"
SCHEDULER = "opt/venv/lib/python3.11/site-packages/vllm/v1/core/sched/scheduler.py"
SCHEDULER_PYC = (
    "opt/venv/lib/python3.11/site-packages/vllm/v1/core/sched/__pycache__/scheduler.cpython-311.pyc"
)


# ------------------------------------------------------------------------------------------------ helpers


def run_cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main([*argv, "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1]) if out else {}


def rows_of(out: dict[str, Any]) -> list[dict[str, str]]:
    report = out.get("report", out)
    return list(report.get("rows", []))


def fails(out: dict[str, Any]) -> list[str]:
    return [f"{r['what']}: {r['why']}" for r in rows_of(out) if r["verdict"] == "FAIL"]


def warns(out: dict[str, Any]) -> list[str]:
    return [f"{r['what']}: {r['why']}" for r in rows_of(out) if r["verdict"] == "WARN"]


def head(registry: Any, repo: str, reference: str) -> str | None:
    with RegistryClient(registry.host) as client:
        found = client.head_manifest(repo, reference)
    return None if found is None else str(found[0])


@pytest.fixture(scope="module")
def keyring(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("keys")
    trusted = keys.generate(root, "trusted")
    other = keys.generate(root, "other")
    assert trusted.private.stat().st_mode & 0o777 == 0o600
    return {
        "key": trusted.private,
        "pub": trusted.public,
        "other_key": other.private,
        "other_pub": other.public,
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, demo_base: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The demo image, built once into an OCI layout, and its verify report (probe run once). The layout
    (4+ GB of its own files) goes when the module ends: the session's disk is finite."""
    root = tmp_path_factory.mktemp("tamper") / "repo"
    copy_checkout(root)
    from servimg.assembly.pipeline import build
    from servimg.oci.store import BlobStore
    from servimg.proof.verify import verify_image_value

    store = BlobStore()
    result = build(
        BuildPlan.make(root / DEMO, to=f"oci:{root / 'out' / 'demo'}", runner="docker"),
        Context(store, print, seams=HOST_SEAMS),
    )
    report = verify_image_value(result.images[0].image, on_host(store), in_container=HOST_SEAMS.host.engine)
    assert report.ok
    yield {"root": root, "image": result.images[0].image, "store": store, "report": report, "tag": result.tag}
    shutil.rmtree(root / "out", ignore_errors=True)


@pytest.fixture(scope="module")
def clean(built: dict[str, Any], registry: Any, keyring: dict[str, Path]) -> dict[str, Any]:
    """The clean image pushed with its signed provenance and verify result."""
    ref = f"{registry.host}/{REPO_NAME}:clean"
    pushed = publish(built, registry, built["image"], "clean", keys.load_signing(keyring["key"]))
    assert pushed.digest == built["image"].digest
    return {"ref": ref, "pushed": pushed}


def publish(
    built: dict[str, Any],
    registry: Any,
    image: Image,
    tag: str,
    key: dsse.SigningKey | None,
    formats: frozenset[str] = frozenset(cosign.FORMATS),
) -> Any:
    """Push a (possibly tampered) image with attestations made by the pipeline from the image itself,
    vouched for by the clean image's verify report: an insider or a broken step, not an outsider."""
    return push_image(
        image,
        Target.parse(f"{registry.host}/{REPO_NAME}:{tag}"),
        on_host(built["store"]),
        key=key,
        report=built["report"],
        formats=formats,
    )


def relabeled(built: dict[str, Any], **labels: str) -> Image:
    image: Image = built["image"]
    config = json.loads(image.config_bytes)
    config["config"]["Labels"].update(labels)
    variant = Image.create(config, image.layers, manifest_media_type=image.media_type)
    built["store"].put_bytes(variant.config_bytes)
    return variant


def retopped(built: dict[str, Any], mutate: Callable[[list[Entry]], list[Entry]]) -> Image:
    """The image with its overlay layer rewritten by `mutate` (config diffID and manifest follow)."""
    image: Image = built["image"]
    store = built["store"]
    top = image.layers[-1]
    entries = mutate(_entries(store.uncompressed(top.descriptor.digest, top.diff_id)))
    tmp = store.root / "tmp" / f"tamper-{hashlib.sha256(repr(entries).encode()).hexdigest()[:16]}"
    blob = write_layer(entries, tmp, mtime=1767225600)
    store.adopt(tmp, blob.digest)
    layer = Layer(dataclasses.replace(top.descriptor, digest=blob.digest, size=blob.size), blob.diff_id)
    config = json.loads(image.config_bytes)
    config["rootfs"]["diff_ids"][-1] = str(blob.diff_id)
    variant = Image.create(config, [*image.layers[:-1], layer], manifest_media_type=image.media_type)
    store.put_bytes(variant.config_bytes)
    return variant


def _entries(path: Path) -> list[Entry]:
    out = []
    with tarfile.open(path) as tar:
        for info in tar:
            name = normalize_path(info.name)
            parent, _, base = name.rpartition("/")
            if info.isdir():
                out.append(Entry(name, Kind.DIR, info.mode))
            elif base.startswith(WHITEOUT_PREFIX):
                out.append(Entry(f"{parent}/{base[len(WHITEOUT_PREFIX) :]}", Kind.WHITEOUT))
            else:
                handle = tar.extractfile(info)
                assert handle is not None
                out.append(Entry(name, Kind.FILE, info.mode, data=handle.read()))
    return out


def check_cli(
    ref: str, keyring: dict[str, Path], capsys: pytest.CaptureFixture[str], *flags: str
) -> tuple[int, dict[str, Any]]:
    return run_cli("check", ref, "--key", str(keyring["pub"]), "--remote", *flags, capsys=capsys)


# ------------------------------------------------------------------------------------------------ clean


def test_clean_image_has_no_fail_even_deep(
    clean: dict[str, Any], keyring: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = check_cli(clean["ref"], keyring, capsys, "--deep")
    assert code == 0 and out["status"] == "OK", fails(out)
    whats = {r["what"]: r["verdict"] for r in rows_of(out)}
    # The push named no builder: servimg's placeholder id, trusted only by default, is a WARN (issue 40).
    assert whats["builder"] == "WARN"
    code, out = check_cli(clean["ref"], keyring, capsys, "--deep", "--builder", DEFAULT_BUILDER_ID)
    assert code == 0 and out["status"] == "OK", fails(out)
    whats = {r["what"]: r["verdict"] for r in rows_of(out)}
    for what in ("provenance", "builder", "base digest", "patches", "dists", "changed files", "verify"):
        assert whats[what] == "PASS", what
    assert whats["deep: probe"] == "PASS"
    assert not [r for r in rows_of(out) if r["verdict"] == "FAIL"]


def test_push_is_idempotent_and_never_changes_the_digest(
    built: dict[str, Any], clean: dict[str, Any], registry: Any, keyring: dict[str, Path]
) -> None:
    again = publish(built, registry, built["image"], "clean", keys.load_signing(keyring["key"]))
    assert again.digest == clean["pushed"].digest
    assert all(a.reused for a in again.attached), "the same envelopes are already attached"
    assert head(registry, REPO_NAME, "clean") == str(built["image"].digest)
    with RegistryClient(registry.host) as client:
        listed = referrers.listed(RegistryReferrers(client, REPO_NAME), built["image"].digest)
    natives = [d for d in listed if d["artifactType"] != cosign.BUNDLE_V03]
    assert len(natives) == 3  # provenance, the verify result, the SBOM
    assert len(listed) == 6  # and each as a sigstore bundle (one signature each)


def test_oci_layout_carries_its_attestations(
    built: dict[str, Any], keyring: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = tmp_path / "signed"
    code, out = run_cli(
        "push",
        f"oci:{built['root'] / 'out' / 'demo'}",
        f"oci:{layout}:v1",
        "--key",
        str(keyring["key"]),
        capsys=capsys,
    )
    assert code == 0, out
    code, out = run_cli("check", f"oci:{layout}", "--key", str(keyring["pub"]), capsys=capsys)
    assert code == 0, fails(out)
    assert any("OCI layout" in r["why"] for r in rows_of(out) if r["what"] == "attestations")


# ------------------------------------------------------------------------------------------------ tampered


def test_edited_file_in_the_overlay_layer(
    built: dict[str, Any], registry: Any, keyring: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    def edit(entries: list[Entry]) -> list[Entry]:
        return [
            dataclasses.replace(e, data=(e.data or b"") + b"\n# tampered after the build\n")
            if e.path == SCHEDULER
            else e
            for e in entries
        ]

    variant = retopped(built, edit)
    publish(built, registry, variant, "edited", keys.load_signing(keyring["key"]))
    code, out = check_cli(f"{registry.host}/{REPO_NAME}:edited", keyring, capsys, "--deep")
    assert code == 1
    reasons = fails(out)
    assert any(
        r.startswith("changed files:") and f"/{SCHEDULER}: the overlay layer has" in r for r in reasons
    )
    assert any(r.startswith("changes manifest:") for r in reasons)
    assert any(r.startswith("deep: probe:") and "SOURCE_SHA" in r for r in reasons), reasons


def test_planted_pyc(
    built: dict[str, Any], registry: Any, keyring: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    image: Image = built["image"]
    store = built["store"]
    lower = LayeredFS([store.uncompressed(x.descriptor.digest, x.diff_id) for x in image.layers[:-1]])
    stale = lower.read(SCHEDULER_PYC)  # the base's unpatched bytecode
    planted = SCHEDULER_PYC.replace(".pyc", ".opt-1.pyc")
    variant = retopped(built, lambda entries: [*entries, Entry(planted, Kind.FILE, 0o644, data=stale)])
    publish(built, registry, variant, "planted", keys.load_signing(keyring["key"]))
    code, out = check_cli(f"{registry.host}/{REPO_NAME}:planted", keyring, capsys)
    assert code == 1
    assert any(
        r.startswith("changed files:")
        and f"/{planted} is in the overlay layer, not in the provenance byproducts" in r
        for r in fails(out)
    ), fails(out)


def test_label_edited(
    built: dict[str, Any], registry: Any, keyring: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    forged = "sha256:" + "0" * 64
    variant = relabeled(built, **{check.BASE_LABEL: forged})
    publish(built, registry, variant, "relabeled", keys.load_signing(keyring["key"]))
    code, out = check_cli(f"{registry.host}/{REPO_NAME}:relabeled", keyring, capsys)
    assert code == 1
    reasons = fails(out)
    assert any(
        r.startswith("base label:") and f"says {forged}, the lock in the image says" in r for r in reasons
    )
    assert any(r.startswith("base digest:") and f"label says {forged}" in r for r in reasons), reasons


def test_attestation_for_another_digest(
    built: dict[str, Any],
    clean: dict[str, Any],
    registry: Any,
    keyring: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    from servimg.backends.registry import push as push_plain

    variant = relabeled(built, **{"io.servimg.test.variant": "another-digest"})
    push_plain(variant, f"{registry.host}/{REPO_NAME}", on_host(built["store"]), tag="another")
    subject = Descriptor(variant.media_type, variant.digest, len(variant.manifest_bytes))
    with RegistryClient(registry.host) as client:
        for artifact in clean["pushed"].attached:  # the clean image's genuine, signed envelopes
            envelope = referrers.fetch_envelope(
                RegistryReferrers(client, REPO_NAME), built["image"].digest, Digest.parse(artifact.artifact)
            )
            kind = {
                "provenance": attest.PROVENANCE_V1,
                "test-result": attest.TEST_RESULT_V01,
                "sbom": attest.CYCLONEDX_BOM,
            }[artifact.kind]
            annotations = referrers.attestation_annotations(kind, "2026-01-01T00:00:00Z")
            referrers.attach(
                RegistryReferrers(client, REPO_NAME),
                subject,
                envelope,
                attest.artifact_type(artifact.kind),
                annotations,
            )
    code, out = check_cli(f"{registry.host}/{REPO_NAME}:another", keyring, capsys)
    assert code == 1
    reasons = fails(out)
    # Each is ignored (about another image: no verdict either way); nothing verified remains.
    about = f"ignored: the statement is about {built['image'].digest}"
    assert sum(1 for r in warns(out) if r.startswith("attestation ") and about in r) == 3, warns(out)
    assert any(r.startswith("provenance: no verified provenance") for r in reasons)


def test_attestation_swapped_between_tags(
    built: dict[str, Any], registry: Any, keyring: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    key = keys.load_signing(keyring["key"])
    native = frozenset({cosign.NATIVE})  # the swap is of the referrers index: the one place they are
    a = publish(
        built, registry, relabeled(built, **{"io.servimg.test.variant": "swap-a"}), "swap-a", key, native
    )
    b = publish(
        built, registry, relabeled(built, **{"io.servimg.test.variant": "swap-b"}), "swap-b", key, native
    )
    with RegistryClient(registry.host) as client:
        mine = referrers.listed(RegistryReferrers(client, REPO_NAME), a.digest)
        theirs = referrers.listed(RegistryReferrers(client, REPO_NAME), b.digest)
        provenance_type = attest.artifact_type("provenance")
        swapped = [d for d in mine if d["artifactType"] != provenance_type] + [
            d for d in theirs if d["artifactType"] == provenance_type
        ]
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": swapped}
        client.put_manifest(REPO_NAME, fallback_tag(a.digest), json.dumps(index).encode(), OCI_INDEX)
    code, out = check_cli(f"{registry.host}/{REPO_NAME}:swap-a", keyring, capsys)
    assert code == 1
    reasons = fails(out)
    # The fallback listing keeps only entries whose manifest names this subject: b's provenance is dropped
    # and said so, and a has no provenance left.
    notes = [r["why"] for r in rows_of(out)]
    assert any(f"do not name {a.digest.short} as their subject; ignored" in n for n in notes), notes
    assert any(r.startswith("provenance: no verified provenance") for r in reasons)


def test_stale_fallback_index(
    built: dict[str, Any], registry: Any, keyring: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    key = keys.load_signing(keyring["key"])
    # servimg's referrers only: the stale entry is then the one place the provenance was (with cosign's
    # formats beside it the same statement would still be found, as tests/test_cosign_interop.py shows).
    stale = relabeled(built, **{"io.servimg.test.variant": "stale"})
    pushed = publish(built, registry, stale, "stale", key, frozenset({cosign.NATIVE}))
    gone = next(a for a in pushed.attached if a.kind == "provenance")
    with RegistryClient(registry.host) as client:
        client.delete_manifest(REPO_NAME, Digest.parse(gone.artifact))
    code, out = check_cli(f"{registry.host}/{REPO_NAME}:stale", keyring, capsys)
    assert code == 1
    # An entry whose manifest the registry no longer has cannot name the subject: dropped, and said so.
    notes = [r["why"] for r in rows_of(out)]
    assert any("do not name" in n and "ignored" in n for n in notes), notes
    assert any(r.startswith("provenance: no verified provenance") for r in fails(out)), fails(out)


def test_forged_signature(
    built: dict[str, Any], registry: Any, keyring: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    key = keys.load_signing(keyring["key"])
    variant = relabeled(built, **{"io.servimg.test.variant": "forged"})
    publish(built, registry, variant, "forged", key)
    facts = image_facts(variant, on_host(built["store"]))
    statements = build_statements(
        variant, facts, built["report"], key, built["store"], invocation=Invocation("x")
    )
    genuine = next(e for e in statements if e.kind == "provenance")
    envelope = dsse.Envelope.parse(genuine.data)
    altered = envelope.payload.replace(b"https://servimg.invalid/builder/v1", b"https://evil.invalid/builder")
    forged = dsse.Envelope(envelope.payload_type, altered, envelope.signatures).to_bytes()
    subject = Descriptor(variant.media_type, variant.digest, len(variant.manifest_bytes))
    with RegistryClient(registry.host) as client:
        annotations = referrers.attestation_annotations(attest.PROVENANCE_V1, "2026-01-01T00:00:00Z")
        referrers.attach(
            RegistryReferrers(client, REPO_NAME),
            subject,
            forged,
            attest.artifact_type("provenance"),
            annotations,
        )
    code, out = check_cli(f"{registry.host}/{REPO_NAME}:forged", keyring, capsys)
    # Beside the genuine attestations the forged one is reported and ignored, never a verdict.
    assert code == 0, fails(out)
    assert any(
        "ignored: signature claims trusted key" in r and "forged, or the payload was altered" in r
        for r in warns(out)
    ), warns(out)


def test_unsigned_is_reported_and_only_accepted_in_unsigned_mode(
    built: dict[str, Any], registry: Any, keyring: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    variant = relabeled(built, **{"io.servimg.test.variant": "unsigned"})
    pushed = publish(built, registry, variant, "unsigned", None)
    assert not any(a.signed for a in pushed.attached)
    ref = f"{registry.host}/{REPO_NAME}:unsigned"
    code, out = check_cli(ref, keyring, capsys)
    assert code == 1
    assert sum(1 for r in warns(out) if "ignored: unsigned envelope, no signature to verify" in r) == 3
    assert any(r.startswith("provenance: no verified provenance") for r in fails(out)), fails(out)
    assert not any("--allow-unsigned" in r for r in fails(out)), "no hint lowers the bar"
    code, out = check_cli(ref, keyring, capsys, "--allow-unsigned")
    assert code == 0, fails(out)
    warned = [r for r in rows_of(out) if r["verdict"] == "WARN"]
    assert any("unsigned mode" in r["why"] for r in warned), "unsigned mode is reported, never silent"


def test_unverified_evidence_beside_signed_is_ignored_unless_the_policy_forbids_it(
    built: dict[str, Any],
    registry: Any,
    keyring: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Anyone who may push may attach: unsigned envelopes and ones signed by an untrusted key beside the
    signed evidence are WARN rows and the check stays OK; `unsigned: forbid` makes unsigned ones FAIL."""
    variant = relabeled(built, **{"io.servimg.test.variant": "beside"})
    publish(built, registry, variant, "beside", keys.load_signing(keyring["key"]))
    # An unsigned push of a signed digest attaches nothing unsigned, and says so ...
    quiet = publish(built, registry, variant, "beside-unsigned", None)
    assert not quiet.attached and quiet.note and "attached nothing unsigned" in quiet.note, quiet
    assert "--unsigned" in quiet.note and head(registry, REPO_NAME, "beside-unsigned") == str(variant.digest)
    # ... unless asked.
    dest = f"{registry.host}/{REPO_NAME}:beside-unsigned"
    loud = push_image(
        variant,
        Target.parse(dest),
        on_host(built["store"]),
        report=built["report"],
        unsigned=True,
    )
    assert len(loud.attached) == 3 and not any(a.signed for a in loud.attached)
    publish(built, registry, variant, "beside-other", keys.load_signing(keyring["other_key"]))

    ref = f"{registry.host}/{REPO_NAME}:beside"
    code, out = check_cli(ref, keyring, capsys)
    assert code == 0, fails(out)
    warned = warns(out)
    assert sum(1 for w in warned if "ignored: unsigned envelope" in w) == 3, warned
    assert sum(1 for w in warned if "ignored: signed by a key that is not trusted" in w) == 3, warned

    strict = tmp_path / "strict.yaml"
    strict.write_text(f"keys: [{keyring['pub']}]\nunsigned: forbid\n")
    code, out = run_cli("check", ref, "--policy", str(strict), "--remote", capsys=capsys)
    assert code == 1
    assert sum(1 for r in fails(out) if "forbids unsigned evidence (unsigned: forbid)" in r) == 3, fails(out)


def test_witness_hook_flipped_in_the_overlay_layer_fails_verify_by_name(
    built: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """One byte of a file servimg adds (the witness hook) flipped, the layer, diffID, config and manifest
    re-written consistently: every blob hashes right, and the probe's LAYER check names the file."""

    def flip(entries: list[Entry]) -> list[Entry]:
        out = []
        for e in entries:
            if e.path.endswith("/servimg_witness.py"):
                data = bytearray(e.data or b"")
                data[data.index(b"t")] = 0x8B
                e = dataclasses.replace(e, data=bytes(data))
            out.append(e)
        return out

    variant = retopped(built, flip)
    engine.load(variant, built["store"], tag=None)  # thin: the engine has every other layer
    try:
        code, out = run_cli("verify", str(variant.config_digest), capsys=capsys)
    finally:
        engine.remove(variant.config_digest)
    assert code == 1, out
    layer = [p for p in out["problems"] if p.startswith("LAYER ")]
    assert layer and "servimg_witness.py has sha256" in layer[0], out["problems"]


def test_deep_check_hashes_what_the_registry_serves_not_the_local_copy(
    built: dict[str, Any],
    clean: dict[str, Any],
    registry: Any,
    keyring: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    top = built["image"].layers[-1].descriptor.digest
    data = registry.storage / "docker/registry/v2/blobs/sha256" / top.hex[:2] / top.hex / "data"
    original = data.read_bytes()
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0x8B
    spare = data.with_name("data.servimg-test")
    # Replaced, not written in place: a registry seeded from this one (`cp -al`) keeps its own bytes.
    spare.write_bytes(bytes(flipped))
    spare.replace(data)
    try:
        assert built["store"].has(top, len(original)), "the local store holds the good bytes"
        code, out = check_cli(clean["ref"], keyring, capsys, "--deep")
        assert code == 1
        deep = [r for r in fails(out) if r.startswith("deep: probe:")]
        assert deep and str(top) in deep[0] and "digest mismatch" in deep[0], fails(out)
    finally:
        spare.write_bytes(original)
        spare.replace(data)


def test_untrusted_key(
    built: dict[str, Any], registry: Any, keyring: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    other = keys.load_signing(keyring["other_key"])
    variant = relabeled(built, **{"io.servimg.test.variant": "untrusted"})
    publish(built, registry, variant, "untrusted", other)
    code, out = check_cli(f"{registry.host}/{REPO_NAME}:untrusted", keyring, capsys)
    assert code == 1
    hint = other.keyid[:12]
    # Each is reported and not counted (a WARN); the verdict fails because nothing trusted remains.
    warned = [r["why"] for r in rows_of(out) if r["verdict"] == "WARN"]
    untrusted = f"signed by a key that is not trusted (keyid hint {hint})"
    assert sum(1 for w in warned if untrusted in w) == 3, warned
    assert any("provenance" in r for r in fails(out)), fails(out)


def test_missing_and_unexercised_required_ladders(
    built: dict[str, Any],
    registry: Any,
    keyring: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = keys.load_signing(keyring["key"])
    variant = relabeled(built, **{"io.servimg.test.variant": "ladders"})
    publish(built, registry, variant, "ladders", key)
    ref = f"{registry.host}/{REPO_NAME}:ladders"
    receipt = tmp_path / "cold.json"
    receipt.write_text(
        json.dumps({"ladder": "cold", "verdict": "NOT_EXERCISED", "image_digest": str(variant.digest)})
    )
    code, out = run_cli(
        "attest",
        ref,
        "--predicate-type",
        "test-result",
        "--file",
        str(receipt),
        "--key",
        str(keyring["key"]),
        capsys=capsys,
    )
    assert code == 0, out
    code, out = check_cli(ref, keyring, capsys, "--require-ladder", "smoke", "--require-ladder", "cold")
    assert code == 1
    reasons = fails(out)
    assert "ladder smoke: required ladder smoke: no verified test-result attestation" in reasons
    assert any(r.startswith("ladder cold: NOT_EXERCISED") for r in reasons), reasons


def test_receipt_for_another_image_is_refused(
    clean: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    receipt = tmp_path / "r.json"
    receipt.write_text(
        json.dumps({"ladder": "smoke", "verdict": "PASS", "image_digest": "sha256:" + "1" * 64})
    )
    code, out = run_cli(
        "attest", clean["ref"], "--predicate-type", "test-result", "--file", str(receipt), capsys=capsys
    )
    assert code == 1 and "not this image" in out["message"]


def test_show_and_diff(
    clean: dict[str, Any], registry: Any, keyring: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_cli("show", clean["ref"], "--key", str(keyring["pub"]), "--remote", capsys=capsys)
    assert code == 0
    assert out["source"] == "signed provenance (verified)"
    assert {o["id"] for o in out["overlays"]} == {
        "vllm-cpu-mamba2-prefix-caching",
        "vllm-computed-tokens-gate",
        "lmcache-aligned-lookup-gate",
    }
    assert any("absent in base" in s for o in out["overlays"] for s in o["sentinels"])
    assert {r["what"] for r in out["results"]} >= {"verify"}
    assert main(["show", clean["ref"], "--remote", "--markdown", "--quiet"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("# Provenance card") and "| vllm-computed-tokens-gate |" in markdown
    assert "OK:" not in markdown
    code, out = run_cli(
        "diff",
        clean["ref"],
        f"{registry.host}/{REPO_NAME}:edited",
        "--key",
        str(keyring["pub"]),
        "--remote",
        capsys=capsys,
    )
    assert code == 0 and not out["identical"], out
    changed = [d for d in out["differences"] if d["section"] == "changed file"]
    assert [d["item"] for d in changed] == [f"/{SCHEDULER}"], "the overlay layers differ in that file only"
    assert {d["item"] for d in out["differences"] if d["section"] == "image"} == {"digest", "config"}


# ------------------------------------------------------------------------------------------------ happy path


def test_build_verify_push_attest_pull_check_promote(
    request: pytest.FixtureRequest,
    built: dict[str, Any],
    registry: Any,
    keyring: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    repo = f"{registry.host}/servimg/happy"
    key, pub = str(keyring["key"]), str(keyring["pub"])
    code, out = run_cli(
        "build", str(built["root"] / DEMO), "--to", repo, "--sign", key, "--runner", "docker", capsys=capsys
    )
    assert code == 0, out
    digest, tag = out["digest"], out["tag"]
    assert digest == str(built["image"].digest), "signing does not change what is built"
    ref = f"{repo}:{tag}"
    assert head(registry, "servimg/happy", tag) == digest

    code, out = run_cli("verify", ref, capsys=capsys)
    assert code == 0 and out["summary"]["FAIL"] == 0

    receipt = tmp_path / "receipt.json"
    receipt.write_text(
        json.dumps(
            {
                "ladder": "smoke",
                "verdict": "PASS",
                "image_digest": digest,
                "arms": [
                    {"id": "control"},
                    {"id": "warm", "verdict": "PASS"},
                    {"id": "restart", "verdict": "PASS"},
                ],
                "finished_at": "2026-11-30T12:00:00Z",
            }
        )
    )
    code, out = run_cli(
        "attest", ref, "--predicate-type", "test-result", "--file", str(receipt), "--key", key, capsys=capsys
    )
    assert code == 0, out
    assert head(registry, "servimg/happy", tag) == digest

    pulled = docker("pull", ref)
    assert pulled.returncode == 0, pulled.stderr
    request.addfinalizer(lambda: docker("rmi", ref, check=False))  # the tag only; the image stays
    code, out = run_cli("check", ref, "--key", pub, "--require-ladder", "smoke", capsys=capsys)
    assert code == 0, fails(out)
    image_rows = [r["why"] for r in rows_of(out) if r["what"] == "image"]
    # The pulled copy stands for the tag because it is what the registry serves now (issue 48).
    assert any("the engine's copy is that image" in why for why in image_rows), image_rows
    assert out["digest"] == digest

    code, out = run_cli(
        "promote",
        ref,
        "--tag",
        "qualified",
        "--key",
        pub,
        "--require-ladder",
        "smoke",
        "--sign",
        key,
        capsys=capsys,
    )
    assert code == 0, out
    assert head(registry, "servimg/happy", "qualified") == digest
    code, out = run_cli(
        "check",
        f"{repo}:qualified",
        "--remote",
        "--key",
        pub,
        "--policy",
        str(_vsa_policy(tmp_path)),
        capsys=capsys,
    )
    assert code == 0, fails(out)
    assert head(registry, "servimg/happy", tag) == digest, "no attach ever changed the image digest"
    repo_digests = docker("image", "inspect", "-f", "{{json .RepoDigests}}", ref).stdout
    assert f"{repo}@{digest}" in repo_digests


def _vsa_policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text("require: [provenance, verify, vsa]\nladders: [smoke]\n")
    return path


def test_promote_refuses_and_leaves_no_tag(
    clean: dict[str, Any], registry: Any, keyring: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_cli(
        "promote",
        clean["ref"],
        "--remote",
        "--tag",
        "refused",
        "--key",
        str(keyring["pub"]),
        "--require-ladder",
        "smoke",
        capsys=capsys,
    )
    assert code == 1 and "was not moved" in out["message"]
    assert head(registry, REPO_NAME, "refused") is None


# ------------------------------------------------------------------------------------------------ faults


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registry retries without their back-off sleeps (the fault is permanent until restarted)."""
    import time

    monkeypatch.setattr(time, "sleep", lambda seconds: None)


KILLED_REPO = "servimg/killed"


@pytest.fixture(scope="module")
def base_blobs_seed(built: dict[str, Any]) -> Iterator[Path]:
    """Registry storage holding the demo base's layers in KILLED_REPO, pushed once for the fault cases:
    each would otherwise push the same 4.5 GB again before its fault (≈60 s a case on 2 cores). The
    image's own layer, its config, manifests, attestations and tags are pushed by each case for real."""
    from registry_server import RegistryServer

    image: Image = built["image"]
    server = RegistryServer().start()
    try:
        with RegistryClient(server.host) as client:
            for desc in image.layer_descriptors[:-1]:
                path = built["store"].path(desc.digest)
                client.push_blob(KILLED_REPO, desc.digest, desc.size, lambda p=path: p.open("rb"))
        server.kill()  # storage kept until teardown
        yield server.storage
    finally:
        server.stop()


@pytest.fixture
def own_registry(base_blobs_seed: Path) -> Iterator[Any]:
    from registry_server import RegistryServer

    server = RegistryServer(seed=base_blobs_seed).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("kill_at", ["image manifest", "attestation", "tag"])
def test_registry_killed_during_push_leaves_no_tag_and_rerun_completes(
    built: dict[str, Any],
    keyring: dict[str, Path],
    own_registry: Any,
    fast_retries: None,
    monkeypatch: pytest.MonkeyPatch,
    kill_at: str,
) -> None:
    image: Image = built["image"]
    key = keys.load_signing(keyring["key"])
    dest = f"{own_registry.host}/{KILLED_REPO}:v1"
    original = RegistryClient.put_manifest
    killed: list[str] = []

    def put_manifest(self: RegistryClient, repo: str, reference: str, data: bytes, media_type: str) -> Digest:
        hit = {
            "image manifest": reference == str(image.digest),
            "attestation": media_type == OCI_MANIFEST and b'"artifactType"' in data,
            "tag": reference == "v1",
        }[kill_at]
        if hit and not killed:
            killed.append(reference)
            own_registry.kill()
        return original(self, repo, reference, data, media_type)

    monkeypatch.setattr(RegistryClient, "put_manifest", put_manifest)
    with pytest.raises(ServimgError):
        push_image(
            image,
            Target.parse(dest),
            on_host(built["store"]),
            key=key,
            report=built["report"],
        )
    assert killed, "the fault was injected"
    own_registry.start()
    assert head(own_registry, KILLED_REPO, "v1") is None, "a killed push leaves no tag"

    first = push_image(
        image,
        Target.parse(dest),
        on_host(built["store"]),
        key=key,
        report=built["report"],
    )
    assert head(own_registry, KILLED_REPO, "v1") == str(image.digest)
    second = push_image(
        image,
        Target.parse(dest),
        on_host(built["store"]),
        key=key,
        report=built["report"],
    )
    assert all(a.reused for a in second.attached), "a rerun attaches nothing new"
    assert [a.artifact for a in first.attached] == [a.artifact for a in second.attached]
    with RegistryClient(own_registry.host) as client:
        listed = referrers.listed(RegistryReferrers(client, KILLED_REPO), image.digest)
        bundles = referrers.listed(RegistryReferrers(client, KILLED_REPO), image.digest, cosign.BUNDLE_V03)
    assert len(bundles) == 3, "each envelope once as a bundle too"
    listed = [d for d in listed if d["artifactType"] != cosign.BUNDLE_V03]
    assert sorted(d["artifactType"] for d in listed) == sorted(
        attest.artifact_type(k) for k in ("provenance", "test-result", "sbom")
    ), "one entry per envelope: nothing lost, nothing doubled"
    ctx = on_host(built["store"])
    found = evidence.collect(
        evidence.locate_ref(dest, ctx, remote=True), ctx, trusted=keys.load_trusted([keyring["pub"]])
    )
    report = check.evaluate(check.Policy(), found)
    assert report.ok, [f"{r.subject}: {r.message}" for r in report.failures()]
