"""DSSE envelopes (ed25519) and in-toto statements: fast, no registry.

PAE vectors are computed by hand from DSSE protocol.md §Signature definition:
`"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`, LEN = decimal byte length.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import json
import os
import pickle
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.oci.image import OCI_MANIFEST
from servimg.signing import dsse
from servimg.signing.dsse import DsseError, Envelope, Signature, SigningKey, VerifyKey, pae, sign, verify
from servimg.statements import attest
from servimg.statements.attest import AttestationError

MANIFEST = Digest.of_bytes(b"manifest")
CONFIG = Digest.of_bytes(b"config")
T0 = "2026-01-02T03:04:05Z"
T1 = "2026-01-02T03:14:05Z"


@pytest.fixture(scope="module")
def key_a() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture(scope="module")
def key_b() -> SigningKey:
    return SigningKey.generate()


# ------------------------------------------------------------------------------------------------------ PAE


@pytest.mark.parametrize(
    ("payload_type", "body", "expected"),
    [
        (
            "http://example.com/HelloWorld",
            b"hello world",
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world",
        ),
        ("", b"", b"DSSEv1 0  0 "),
        ("a", b"0123456789", b"DSSEv1 1 a 10 0123456789"),
        # LEN counts bytes: "ü" is two bytes of UTF-8.
        ("\u00fc", b"x", b"DSSEv1 2 \xc3\xbc 1 x"),
        # The body is opaque: spaces, newlines and NULs are just bytes.
        ("t", b"a b\n\x00", b"DSSEv1 1 t 5 a b\n\x00"),
        ("application/vnd.in-toto+json", b"{}", b"DSSEv1 28 application/vnd.in-toto+json 2 {}"),
    ],
)
def test_pae_known_answers(payload_type: str, body: bytes, expected: bytes) -> None:
    assert pae(payload_type, body) == expected


def test_pae_separates_type_from_body() -> None:
    # Without length prefixes ("a b", "c") and ("a", "b c") would sign the same bytes.
    assert pae("a b", b"c") != pae("a", b"b c")


# ------------------------------------------------------------------------------------------------- envelope


def test_envelope_json_shape_and_round_trip(key_a: SigningKey) -> None:
    env = sign("http://example.com/HelloWorld", b"hello world", key_a)
    doc = json.loads(env.to_bytes())
    assert doc["payload"] == "aGVsbG8gd29ybGQ="  # standard base64, padded
    assert doc["payloadType"] == "http://example.com/HelloWorld"
    assert doc["signatures"][0]["keyid"] == key_a.keyid
    assert base64.b64decode(doc["signatures"][0]["sig"]) == env.signatures[0].sig
    assert env.to_bytes() == canonical.dumps(doc)
    assert Envelope.parse(env.to_bytes()) == env


def test_envelope_omits_unset_keyid() -> None:
    env = Envelope("t", b"p", (Signature(b"\x01\x02"),))
    assert env.to_json()["signatures"] == [{"sig": "AQI="}]


def test_envelope_parse_accepts_url_safe_unpadded_base64_and_ignores_unknown_fields() -> None:
    payload = b"\xfb\xff\xfe"  # standard base64 "+//+", URL-safe "-__-"
    data = json.dumps(
        {
            "payload": "-__-",
            "payloadType": "t",
            "signatures": [{"sig": "AQ", "keyid": ""}],
            "extra": {"ignored": True},
        }
    ).encode()
    env = Envelope.parse(data)
    assert env.payload == payload
    assert env.signatures == (Signature(b"\x01", None),)  # empty keyid is the same as unset


def test_envelope_parse_collects_every_problem() -> None:
    data = json.dumps({"payload": "not base64!", "signatures": [{"sig": 5}, "x", {"sig": "", "keyid": 3}]})
    with pytest.raises(DsseError) as info:
        Envelope.parse(data.encode())
    problems = info.value.problems
    assert "payloadType: missing or not a string" in problems
    assert "payload: not base64" in problems
    assert "signatures[0].sig: missing or not a string" in problems
    assert "signatures[1]: not an object" in problems
    assert "signatures[2].keyid: not a string" in problems


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_B64ISH = st.text(alphabet="ABCDabcd0123+/-_=!é ", max_size=12)
_ENVELOPE_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "payload": _B64ISH | _JSON,
        "payloadType": st.text(max_size=10) | _JSON,
        "signatures": st.lists(
            st.dictionaries(st.sampled_from(["sig", "keyid"]), _B64ISH | _JSON, max_size=2) | _JSON,
            max_size=3,
        )
        | _JSON,
    },
)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=200)
    | _JSON.map(lambda v: json.dumps(v).encode())
    | _ENVELOPE_LIKE.map(lambda v: json.dumps(v).encode())
)
def test_envelope_parse_never_tracebacks(data: bytes) -> None:
    try:
        env = Envelope.parse(data)
    except DsseError as exc:
        assert exc.message
        return
    assert isinstance(env.payload, bytes) and isinstance(env.payload_type, str)


def test_envelope_parse_refuses_deep_nesting() -> None:
    with pytest.raises(DsseError):
        Envelope.parse(b"[" * 100_000 + b"]" * 100_000)


# ------------------------------------------------------------------------------------------- sign, verify


def test_sign_verify_round_trip(key_a: SigningKey) -> None:
    env = Envelope.parse(sign("t", b"payload", key_a).to_bytes())
    result = verify(env, [key_a.public_key])
    assert result.verified and result.keyids == (key_a.keyid,) and not result.unsigned


def test_tampered_payload_fails(key_a: SigningKey) -> None:
    env = sign("t", b"payload", key_a)
    assert not verify(Envelope("t", b"payloaD", env.signatures), [key_a.public_key]).verified
    # The type is signed too (PAE): the same bytes under another type do not verify.
    assert not verify(Envelope("u", b"payload", env.signatures), [key_a.public_key]).verified


def test_wrong_key_fails(key_a: SigningKey, key_b: SigningKey) -> None:
    result = verify(sign("t", b"p", key_a), [key_b.public_key])
    assert not result.verified and result.keyids == ()
    assert "0 of the required 1" in result.reason


def test_keyid_is_a_hint_never_a_selector(key_a: SigningKey, key_b: SigningKey) -> None:
    # B signs, but the signature claims to be A's.
    real = sign("t", b"p", key_b).signatures[0]
    lying = Envelope("t", b"p", (Signature(real.sig, key_a.keyid),))
    assert not verify(lying, [key_a.public_key]).verified
    assert verify(lying, [key_b.public_key]).keyids == (key_b.keyid,)
    assert verify(lying, [key_a.public_key, key_b.public_key]).keyids == (key_b.keyid,)
    # A garbage keyid does not stop a good signature from being found either.
    assert verify(Envelope("t", b"p", (Signature(real.sig, "nonsense"),)), [key_b.public_key]).verified


def test_threshold_counts_each_key_once(key_a: SigningKey, key_b: SigningKey) -> None:
    trusted = [key_a.public_key, key_b.public_key]
    twice_a = dsse.countersign(sign("t", b"p", key_a), key_a)
    assert len(twice_a.signatures) == 2
    result = verify(twice_a, trusted, threshold=2)
    assert not result.verified and result.keyids == (key_a.keyid,)
    both = dsse.countersign(twice_a, key_b)
    assert verify(both, trusted, threshold=2).keyids == tuple(sorted([key_a.keyid, key_b.keyid]))


def test_threshold_duplicate_trusted_keys_count_once(key_a: SigningKey) -> None:
    same = VerifyKey.from_pem(key_a.public_key.to_pem())
    with pytest.raises(DsseError, match="exceeds the 1 distinct"):
        verify(sign("t", b"p", key_a), [key_a.public_key, same], threshold=2)
    with pytest.raises(DsseError, match="at least 1"):
        verify(sign("t", b"p", key_a), [key_a.public_key], threshold=0)


def test_unsigned_envelope_is_reported(key_a: SigningKey) -> None:
    result = verify(Envelope.parse(b'{"payload":"","payloadType":"t","signatures":[]}'), [key_a.public_key])
    assert not result.verified and result.unsigned and result.reason == "unsigned"


# ----------------------------------------------------------------------------------------------------- keys


def test_keyid_is_sha256_of_raw_public_key(key_a: SigningKey) -> None:
    raw = serialization.load_pem_public_key(key_a.public_key.to_pem()).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    assert key_a.keyid == hashlib.sha256(raw).hexdigest() == key_a.public_key.keyid


def test_key_files_round_trip_private_is_0600(tmp_path: Path, key_a: SigningKey) -> None:
    key_a.save(tmp_path / "key.pem")
    key_a.public_key.save(tmp_path / "key.pub")
    assert stat.S_IMODE(os.stat(tmp_path / "key.pem").st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key.pem", "key.pub"]  # no temp files left
    loaded = SigningKey.load(tmp_path / "key.pem")
    assert loaded.keyid == key_a.keyid
    assert VerifyKey.load(tmp_path / "key.pub") == key_a.public_key
    assert verify(sign("t", b"p", loaded), [VerifyKey.load(tmp_path / "key.pub")]).verified


def test_encrypted_private_key(tmp_path: Path, key_a: SigningKey) -> None:
    key_a.save(tmp_path / "k.pem", password=b"pw")
    assert SigningKey.load(tmp_path / "k.pem", b"pw").keyid == key_a.keyid
    with pytest.raises(DsseError, match="password"):
        SigningKey.load(tmp_path / "k.pem", b"wrong")


def test_keys_never_appear_in_reprs_or_errors(tmp_path: Path, key_a: SigningKey) -> None:
    pem = key_a.to_pem()
    secret_b64 = b"".join(pem.splitlines()[1:-1]).decode()
    for text in (repr(key_a), str(key_a), repr(key_a.public_key), repr(sign("t", b"p", key_a))):
        assert secret_b64 not in text and "PRIVATE" not in text
    damaged = pem.replace(b"M", b"N", 3)
    (tmp_path / "bad.pem").write_bytes(damaged)
    with pytest.raises(DsseError) as info:
        SigningKey.load(tmp_path / "bad.pem")
    message = str(info.value) + info.value.hint
    assert damaged.decode()[30:60] not in message and "PRIVATE" not in message
    with pytest.raises(TypeError):
        pickle.dumps(key_a)


def test_ecdsa_p256_keys_sign_and_verify_and_other_curves_are_refused() -> None:
    """cosign's default key type (SIGNATURE_SPEC.md §Signature Schemes: ECDSA-P256) signs DSSE like
    ed25519; its signatures are deterministic (RFC 6979) so reruns attach nothing new."""
    p256 = SigningKey.generate("ecdsa-p256")
    reloaded = SigningKey.from_pem(p256.to_pem())
    envelope = dsse.sign("application/vnd.in-toto+json", b"{}", reloaded)
    assert dsse.verify(envelope, [VerifyKey.from_pem(p256.public_key.to_pem())]).verified
    assert dsse.sign("application/vnd.in-toto+json", b"{}", p256) == envelope
    assert p256.public_key.algorithm == "ecdsa-p256"
    assert not dsse.verify(envelope, [SigningKey.generate("ecdsa-p256").public_key]).keyids
    other = ec.generate_private_key(ec.SECP384R1())
    pem = other.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(DsseError, match=r"SECP384R1|secp384r1"):
        SigningKey.from_pem(pem)
    pub = other.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(DsseError, match=r"secp384r1|SECP384R1"):
        VerifyKey.from_pem(pub)
    with pytest.raises(DsseError, match="unknown key algorithm"):
        SigningKey.generate("rsa")


def test_missing_key_file_and_directory(tmp_path: Path, key_a: SigningKey) -> None:
    with pytest.raises(DsseError, match="cannot read private key"):
        SigningKey.load(tmp_path / "absent.pem")
    with pytest.raises(DsseError, match="cannot write"):
        key_a.save(tmp_path / "no" / "such" / "dir.pem")


# ----------------------------------------------------------------------------------------------- statements


def _test_result() -> dict[str, Any]:
    return attest.test_result(
        configuration=[attest.resource(name="ladder.yaml", digest=Digest.of_bytes(b"ladder"))],
        passed=["cold", "warm"],
    )


def test_statement_is_canonical_with_image_subjects() -> None:
    data = attest.statement(
        attest.image_subjects("reg/x", MANIFEST, CONFIG), attest.TEST_RESULT_V01, _test_result()
    )
    doc = json.loads(data)
    assert data == canonical.dumps(doc)
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["subject"] == [
        {"name": "reg/x", "digest": {"sha256": MANIFEST.hex}},
        {"name": "reg/x#config", "digest": {"sha256": CONFIG.hex}},
    ]
    parsed = attest.parse_statement(data)
    assert parsed.covers(MANIFEST) and parsed.covers(CONFIG) and not parsed.covers(Digest.of_bytes(b"x"))
    assert parsed.predicate_type == attest.TEST_RESULT_V01 and parsed.kind == "test-result"


def test_statement_refuses_repeated_names_and_non_json() -> None:
    with pytest.raises(AttestationError, match="invalid statement") as info:
        attest.statement([("a", MANIFEST), ("a", CONFIG)], "https://example.com/p", {})
    assert info.value.problems == ("subject name 'a' repeats",)
    with pytest.raises(AttestationError, match="not JSON"):
        attest.statement([("a", MANIFEST)], "https://example.com/p", {"x": float("nan")})


def test_parse_statement_collects_every_problem() -> None:
    bad = {
        "_type": "https://in-toto.io/Statement/v0.1",
        "subject": [],
        "predicateType": "no uri",
        "predicate": [],
    }
    with pytest.raises(AttestationError) as info:
        attest.parse_statement(json.dumps(bad).encode())
    assert len(info.value.problems) == 4
    bad_subject = {
        "_type": attest.STATEMENT_TYPE,
        "subject": [{"name": "x"}, {"digest": {"gitCommit": "ab"}}],
    }
    with pytest.raises(AttestationError) as info:
        attest.parse_statement(json.dumps({**bad_subject, "predicateType": "https://e.com/p"}).encode())
    assert any("subject[0]" in p for p in info.value.problems)
    assert any("subject[1].digest: no well-formed" in p for p in info.value.problems)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=100) | _JSON.map(lambda v: json.dumps(v).encode()))
def test_parse_statement_never_tracebacks(data: bytes) -> None:
    with contextlib.suppress(AttestationError):
        attest.parse_statement(data)


# ----------------------------------------------------------------------------------------------- predicates


def _provenance(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "external_parameters": {"name": "demo", "base": {"ref": "r/base", "digest": str(MANIFEST)}},
        "resolved_dependencies": [
            attest.resource(name="base", uri="oci://r/base", digest=MANIFEST, media_type=OCI_MANIFEST),
            attest.resource(name="base#config", digest=CONFIG),
            attest.resource(name="overlays/vllm/gate.patch", digest=Digest.of_bytes(b"patch")),
            attest.resource(name="probe", digest=Digest.of_bytes(b"probe")),
        ],
        "builder_id": "https://servimg.io/builder/local@v0.1.0",
        "invocation_id": "uuid-1",
        "started_on": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "finished_on": T1,
        "byproducts": [
            attest.changed_file("usr/lib/b.py", hashlib.sha256(b"b").hexdigest(), 0o100644),
            attest.changed_file("usr/lib/a.pyc", None, 0o644),
        ],
    }
    args.update(overrides)
    return attest.provenance(**args)


def test_provenance_predicate_shape() -> None:
    p = _provenance()
    assert p["buildDefinition"]["buildType"] == attest.BUILD_TYPE
    assert p["buildDefinition"]["internalParameters"] == {}
    assert p["runDetails"]["metadata"] == {"invocationId": "uuid-1", "startedOn": T0, "finishedOn": T1}
    names = [b["name"] for b in p["runDetails"]["byproducts"]]
    assert sorted(names) == ["usr/lib/a.pyc", "usr/lib/b.py"]
    b = next(b for b in p["runDetails"]["byproducts"] if b["name"] == "usr/lib/b.py")
    assert b == {
        "name": "usr/lib/b.py",
        "digest": {"sha256": hashlib.sha256(b"b").hexdigest()},
        "annotations": {"mode": "0644"},
    }
    data = attest.statement(attest.image_subjects("x", MANIFEST, CONFIG), attest.PROVENANCE_V1, p)
    assert attest.parse_statement(data).predicate == p


def test_provenance_refusals() -> None:
    with pytest.raises(AttestationError, match="finishedOn is before startedOn"):
        _provenance(started_on=T1, finished_on=T0)
    with pytest.raises(AttestationError, match="naive"):
        _provenance(started_on=dt.datetime(2026, 1, 1))
    with pytest.raises(AttestationError, match="RFC 3339"):
        _provenance(finished_on="2026-01-02 03:04:05")
    with pytest.raises(AttestationError) as info:
        _provenance(builder_id="", resolved_dependencies=[{"name": "no digest"}])
    assert len(info.value.problems) == 2


def test_timestamp_normalises_to_utc_z() -> None:
    cet = dt.timezone(dt.timedelta(hours=1))
    assert attest.timestamp(dt.datetime(2026, 1, 2, 4, 4, 5, tzinfo=cet)) == T0
    assert (
        attest.timestamp(dt.datetime(2026, 1, 2, 3, 4, 5, 500, tzinfo=dt.UTC))
        == "2026-01-02T03:04:05.000500Z"
    )
    assert attest.timestamp("1985-04-12T23:20:50.52Z") == "1985-04-12T23:20:50.52Z"
    with pytest.raises(AttestationError):
        attest.timestamp("2026-13-01T00:00:00Z")


def test_test_result_derives_and_refuses_optimism() -> None:
    cfg = [attest.resource(uri="https://example.com/ladder")]
    assert attest.test_result(configuration=cfg, passed=["a"])["result"] == "PASSED"
    assert attest.test_result(configuration=cfg, passed=["a"], warned=["b"])["result"] == "WARNED"
    assert attest.test_result(configuration=cfg, warned=["b"], failed=["c"])["result"] == "FAILED"
    with pytest.raises(AttestationError, match="PASSED but failedTests"):
        attest.test_result(configuration=cfg, passed=["a"], failed=["c"], result="PASSED")
    with pytest.raises(AttestationError, match="nothing exercised"):
        attest.test_result(configuration=cfg)
    with pytest.raises(AttestationError, match="in both"):
        attest.test_result(configuration=cfg, passed=["a"], failed=["a"])
    with pytest.raises(AttestationError, match="must be one of"):
        attest.test_result(configuration=cfg, passed=["a"], result="pass")
    # FAILED with nothing named is allowed: e.g. an arm that was not exercised.
    assert attest.test_result(configuration=cfg, result="FAILED")["failedTests"] == []


def _vsa(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "verifier_id": "https://servimg.io/verifier/promote@v0.1.0",
        "time_verified": T1,
        "resource_uri": f"oci://127.0.0.1:5000/servimg/vllm@{MANIFEST}",
        "policy": attest.resource(uri="https://servimg.io/policy/promote/v1", digest=Digest.of_bytes(b"pol")),
        "input_attestations": [attest.resource(uri="oci://x", digest=Digest.of_bytes(b"env"))],
        "verification_result": "PASSED",
        "verified_levels": ["SLSA_BUILD_LEVEL_2"],
    }
    args.update(overrides)
    return attest.verification_summary(**args)


def test_vsa_predicate() -> None:
    p = _vsa(dependency_levels={"SLSA_BUILD_LEVEL_2": 1})
    assert p["verificationResult"] == "PASSED" and p["slsaVersion"] == "1.0"
    data = attest.statement(attest.image_subjects("x", MANIFEST, CONFIG), attest.VSA_V1, p)
    assert attest.parse_statement(data).kind == "vsa"
    with pytest.raises(AttestationError, match="must say FAILED"):
        _vsa(verification_result="FAILED")
    with pytest.raises(AttestationError, match="more than one level for track SLSA_BUILD"):
        _vsa(verified_levels=["SLSA_BUILD_LEVEL_2", "SLSA_BUILD_LEVEL_3"])
    with pytest.raises(AttestationError, match=r"policy\.uri"):
        _vsa(policy=attest.resource(digest=Digest.of_bytes(b"pol")))
    with pytest.raises(AttestationError, match="dependencyLevels"):
        _vsa(dependency_levels={"SLSA_BUILD_LEVEL_1": -1})


def test_media_types() -> None:
    assert attest.artifact_type("provenance") == "application/vnd.in-toto.provenance+dsse"
    assert (
        attest.artifact_type(attest.kind_of(attest.TEST_RESULT_V01))
        == "application/vnd.in-toto.test-result+dsse"
    )
    assert attest.artifact_type("vsa") == "application/vnd.in-toto.vsa+dsse"
    assert attest.ENVELOPE_MEDIA_TYPE == "application/vnd.dsse.envelope.v1+json"
    assert attest.artifact_type("sbom") == "application/vnd.in-toto.sbom+dsse"
    with pytest.raises(AttestationError):
        attest.artifact_type("spdx")


# -------------------------------------------------------------------------------------- sign and open


def test_open_envelope(key_a: SigningKey, key_b: SigningKey) -> None:
    data = attest.statement(
        attest.image_subjects("x", MANIFEST, CONFIG), attest.TEST_RESULT_V01, _test_result()
    )
    env = Envelope.parse(attest.sign_statement(data, key_a).to_bytes())
    assert env.payload_type == attest.PAYLOAD_TYPE
    opened = attest.open_envelope(
        env, [key_a.public_key], subject=CONFIG, predicate_type=attest.TEST_RESULT_V01
    )
    assert opened.covers(MANIFEST)
    with pytest.raises(AttestationError, match="does not verify"):
        attest.open_envelope(env, [key_b.public_key])
    with pytest.raises(AttestationError, match="not about"):
        attest.open_envelope(env, [key_a.public_key], subject=Digest.of_bytes(b"other"))
    with pytest.raises(AttestationError, match="predicateType"):
        attest.open_envelope(env, [key_a.public_key], predicate_type=attest.VSA_V1)
    with pytest.raises(AttestationError, match="payloadType"):
        attest.open_envelope(sign("text/plain", data, key_a), [key_a.public_key])
    with pytest.raises(AttestationError):
        attest.sign_statement(b'{"_type": "nope"}', key_a)
