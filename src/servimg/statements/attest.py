"""in-toto Statement v1 and the three predicates servimg attests with, as canonical JSON.

- Statement: in-toto/attestation `spec/v1/statement.md`; subjects and dependencies are ResourceDescriptors
  (`spec/v1/resource_descriptor.md`); timestamps are RFC 3339 in UTC with "Z" (`spec/v1/field_types.md`).
- SLSA Provenance v1 (`https://slsa.dev/provenance/v1`) for a build.
- in-toto test-result v0.1 (`spec/predicates/test-result.md`) for `servimg verify` and each ladder.
- SLSA Verification Summary v1 (slsa.dev `spec/v1.0/verification_summary`) for promotion.

The subject of an image attestation is its manifest digest AND its config digest (docs/design.md,
"attestation"): an image that went through `docker load` keeps only its config digest (the image ID), and
must still be matchable. Builders validate their own output with the same checks that `parse_statement`
applies to input, so what servimg signs is exactly what it would accept.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.signing import dsse

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
# The DSSE payloadType of an in-toto statement (in-toto/attestation spec/v1/envelope.md).
PAYLOAD_TYPE = "application/vnd.in-toto+json"
PROVENANCE_V1 = "https://slsa.dev/provenance/v1"
TEST_RESULT_V01 = "https://in-toto.io/attestation/test-result/v0.1"
VSA_V1 = "https://slsa.dev/verification_summary/v1"
# servimg's own: the result of an independent rebuild (judging.rebuild).
REBUILD_V1 = "https://servimg.invalid/rebuild/v1"
# The in-toto predicate type of a CycloneDX BOM (in-toto/attestation spec/predicates: "cyclonedx").
CYCLONEDX_BOM = "https://cyclonedx.org/bom"
OPENVEX_V020 = "https://openvex.dev/ns/v0.2.0"  # the OpenVEX context, as in-toto predicate type
# buildType of servimg's builder (Provenance v1 §buildType: a URI naming the build template).
BUILD_TYPE = "https://servimg.io/buildtypes/image/v1"
ENVELOPE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
KINDS: Mapping[str, str] = {
    PROVENANCE_V1: "provenance",
    TEST_RESULT_V01: "test-result",
    VSA_V1: "vsa",
    REBUILD_V1: "rebuild",
    CYCLONEDX_BOM: "sbom",
    OPENVEX_V020: "vex",
}
TEST_RESULTS = ("PASSED", "WARNED", "FAILED")
VSA_RESULTS = ("PASSED", "FAILED")
CONFIG_SUBJECT_SUFFIX = "#config"

_TYPE_URI = re.compile(r"[a-z][a-z0-9+.-]*:\S+")
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?Z")
_SLSA_LEVEL = re.compile(r"(SLSA_[A-Z]+)_LEVEL_\d+")
_SLSA_VERSION = re.compile(r"\d+\.\d+")


class AttestationError(ServimgError):
    """A statement or predicate is malformed, or an attestation does not verify."""


# ------------------------------------------------------------------------------------------ media types


def artifact_type(kind: str) -> str:
    """OCI artifactType of an attestation: `application/vnd.in-toto.<kind>+dsse` (kind: KINDS values)."""
    if kind not in KINDS.values():
        raise AttestationError(f"unknown attestation kind {kind!r}", hint=f"one of {sorted(KINDS.values())}")
    return f"{_ARTIFACT_PREFIX}{kind}{_ARTIFACT_SUFFIX}"


_ARTIFACT_PREFIX, _ARTIFACT_SUFFIX = "application/vnd.in-toto.", "+dsse"


def artifact_kind(artifact_type: str) -> str:
    """The kind an attestation's artifactType names (`artifact_type`'s inverse; another type as it is)."""
    return artifact_type.removeprefix(_ARTIFACT_PREFIX).removesuffix(_ARTIFACT_SUFFIX)


def kind_of(predicate_type: str) -> str:
    """`provenance`, `test-result`, `vsa`, `rebuild` or `sbom` for a predicate type servimg knows."""
    try:
        return KINDS[predicate_type]
    except KeyError:
        raise AttestationError(f"servimg does not attest predicate type {predicate_type!r}") from None


# ----------------------------------------------------------------------------------------- field helpers


def timestamp(value: dt.datetime | str) -> str:
    """An in-toto Timestamp: RFC 3339, UTC, "Z" (field_types.md §Timestamp). Naive datetimes are refused."""
    if isinstance(value, str):
        problems: list[str] = []
        _check_timestamp(value, "timestamp", problems)
        if problems:
            raise AttestationError(problems[0])
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise AttestationError("a naive datetime has no time zone", hint="pass an aware datetime (UTC)")
    utc = value.astimezone(dt.UTC)
    spec = "microseconds" if utc.microsecond else "seconds"
    return utc.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def digest_set(digest: Digest) -> dict[str, str]:
    """A DigestSet (`spec/v1/digest_set.md`): `{"sha256": "<hex>"}`."""
    return {digest.algorithm: digest.hex}


def resource(
    *,
    name: str | None = None,
    uri: str | None = None,
    digest: Digest | None = None,
    media_type: str | None = None,
    download_location: str | None = None,
    annotations: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """A ResourceDescriptor; at least one of `uri` or `digest` (resource_descriptor.md §Fields)."""
    out: dict[str, object] = {}
    for key, value in (
        ("name", name),
        ("uri", uri),
        ("mediaType", media_type),
        ("downloadLocation", download_location),
    ):
        if value is not None:
            out[key] = value
    if digest is not None:
        out["digest"] = digest_set(digest)
    if annotations:
        out["annotations"] = dict(annotations)
    problems: list[str] = []
    _check_resource(out, "resource", problems)
    if problems:
        raise AttestationError("invalid resource descriptor", problems=problems)
    return out


def changed_file(path: str, sha256: str | None, mode: int, kind: str | None = None) -> dict[str, object]:
    """A changed-files manifest entry as a ResourceDescriptor: name = path, digest, mode (octal string),
    kind (file, symlink, directory, deleted; servimg.statements.derived.ChangedFile).

    An entry without a sha256 (a deletion: a whiteout; a directory the layer creates) has no digest; its
    `file:` URI keeps the descriptor valid. Only a deletion is annotated `deleted` (readers from before
    kinds were recorded read that annotation alone)."""
    annotations: dict[str, object] = {"mode": f"{mode & 0o7777:04o}"}
    if kind is not None:
        annotations["kind"] = kind
    if sha256 is None:
        if kind in (None, "deleted"):
            annotations["deleted"] = True
        return resource(name=path, uri="file:///" + path.lstrip("/"), annotations=annotations)
    return resource(name=path, digest=Digest.parse(f"sha256:{sha256}"), annotations=annotations)


# -------------------------------------------------------------------------------------------- statement


def image_subjects(name: str, manifest: Digest, config: Digest) -> list[tuple[str, Digest]]:
    """Subjects of an image: its manifest digest, and its config digest (what `docker load` keeps).

    statement.md: names SHOULD be unique within a subject, so the config carries a `#config` suffix.
    """
    return [(name, manifest), (name + CONFIG_SUBJECT_SUFFIX, config)]


def statement(
    subjects: Sequence[tuple[str, Digest]], predicate_type: str, predicate: Mapping[str, object]
) -> bytes:
    """A Statement v1 as canonical JSON (statement.md §Schema), validated before it is returned."""
    doc = {
        "_type": STATEMENT_TYPE,
        "subject": [_subject(name, digest) for name, digest in subjects],
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }
    problems = _statement_problems(doc) + _repeated_names(subjects)
    if problems:
        raise AttestationError("refusing to create an invalid statement", problems=problems)
    try:
        return canonical.dumps(doc)
    except (TypeError, ValueError) as exc:
        raise AttestationError(f"the predicate is not JSON: {exc}") from None


def _subject(name: str, digest: Digest) -> dict[str, object]:
    out: dict[str, object] = {"digest": digest_set(digest)}
    if name:
        out["name"] = name
    return out


@dataclass(frozen=True)
class Statement:
    """A parsed, validated statement. `subjects` holds one (name, Digest) per sha256/sha512 digest."""

    subjects: tuple[tuple[str, Digest], ...]
    predicate_type: str
    predicate: Mapping[str, object] = field(compare=False, repr=False)

    def covers(self, digest: Digest) -> bool:
        """True if `digest` is one of the subjects (statement.md: matched purely by digest)."""
        return any(d == digest for _, d in self.subjects)

    @property
    def kind(self) -> str:
        return kind_of(self.predicate_type)


def parse_statement(data: bytes) -> Statement:
    """Parse and validate a Statement v1, and its predicate if servimg knows the type (all problems)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError, TypeError):
        raise AttestationError("statement is not valid UTF-8 JSON") from None
    if not isinstance(doc, dict):
        raise AttestationError("statement is not a JSON object")
    problems = _statement_problems(doc)
    if problems:
        raise AttestationError("invalid in-toto statement", problems=problems)
    subjects = tuple(
        (str(s.get("name", "")), Digest(alg, hex_))
        for s in doc["subject"]
        for alg, hex_ in sorted(s["digest"].items())
        if _known_digest(alg, hex_)
    )
    return Statement(subjects, doc["predicateType"], doc.get("predicate") or {})


def _known_digest(algorithm: str, hex_: object) -> bool:
    try:
        Digest.parse(f"{algorithm}:{hex_}")
    except ServimgError:
        return False
    return True


def _statement_problems(doc: Mapping[str, object]) -> list[str]:
    problems: list[str] = []
    if doc.get("_type") != STATEMENT_TYPE:
        problems.append(f"_type: must be {STATEMENT_TYPE}")
    _check_subjects(doc.get("subject"), problems)
    predicate_type = doc.get("predicateType")
    if not _is_type_uri(predicate_type):
        problems.append("predicateType: missing or not a URI")
    predicate = doc.get("predicate", {})
    if not isinstance(predicate, dict):
        problems.append("predicate: not an object")
    elif isinstance(predicate_type, str) and predicate_type in _PREDICATE_CHECKS:
        _PREDICATE_CHECKS[predicate_type](predicate, problems)
    return problems


def _check_subjects(subjects: object, problems: list[str]) -> None:
    if not isinstance(subjects, list) or not subjects:
        problems.append("subject: missing, empty or not a list")
        return
    for i, entry in enumerate(subjects):
        where = f"subject[{i}]"
        _check_resource(entry, where, problems)
        if not isinstance(entry, dict):
            continue
        digests = entry.get("digest")
        if not isinstance(digests, dict) or not digests:
            problems.append(f"{where}.digest: required for a subject")
        elif not any(_known_digest(a, h) for a, h in digests.items()):
            problems.append(f"{where}.digest: no well-formed sha256 or sha512 digest")


def _repeated_names(subjects: Sequence[tuple[str, Digest]]) -> list[str]:
    # statement.md: names SHOULD be unique. A SHOULD, so only what servimg creates is held to it.
    names = [name for name, _ in subjects if name not in ("", "_")]
    return [f"subject name {n!r} repeats" for n in sorted({n for n in names if names.count(n) > 1})]


# ------------------------------------------------------------------------------------------- predicates


def provenance(
    *,
    external_parameters: Mapping[str, object],
    resolved_dependencies: Sequence[Mapping[str, object]],
    builder_id: str,
    invocation_id: str,
    started_on: dt.datetime | str | None = None,
    finished_on: dt.datetime | str | None = None,
    internal_parameters: Mapping[str, object] | None = None,
    byproducts: Sequence[Mapping[str, object]] = (),
    build_type: str = BUILD_TYPE,
) -> dict[str, object]:
    """A SLSA Provenance v1 predicate (provenance/v1 §Schema: buildDefinition, runDetails).

    `external_parameters` is the image definition as JSON; `resolved_dependencies` the base manifest and
    config, every overlay patch, the dists and the probe (ResourceDescriptors, e.g. from `resource`);
    `byproducts` the changed-files manifest (from `changed_file`). Start and finish times are left out
    when unknown (an image pushed long after its build): metadata never states a time nobody measured.
    """
    metadata: dict[str, object] = {"invocationId": invocation_id}
    for key, value in (("startedOn", started_on), ("finishedOn", finished_on)):
        if value is not None:
            metadata[key] = timestamp(value)
    predicate: dict[str, object] = {
        "buildDefinition": {
            "buildType": build_type,
            "externalParameters": dict(external_parameters),
            "internalParameters": dict(internal_parameters or {}),
            "resolvedDependencies": [dict(d) for d in resolved_dependencies],
        },
        "runDetails": {
            "builder": {"id": builder_id},
            "metadata": metadata,
            "byproducts": sorted((dict(b) for b in byproducts), key=canonical.dumps),
        },
    }
    return _validated(PROVENANCE_V1, predicate)


def test_result(
    *,
    configuration: Sequence[Mapping[str, object]],
    passed: Sequence[str] = (),
    warned: Sequence[str] = (),
    failed: Sequence[str] = (),
    url: str | None = None,
    result: str | None = None,
) -> dict[str, object]:
    """An in-toto test-result v0.1 predicate (test-result.md §Schema).

    `result` defaults to the worst outcome present. A result better than the lists allow is refused, and
    so is PASSED when no test ran at all: not exercised is never a pass.
    """
    derived = "FAILED" if failed else "WARNED" if warned else "PASSED"
    predicate: dict[str, object] = {
        "result": result or derived,
        "configuration": [dict(c) for c in configuration],
        "passedTests": list(passed),
        "warnedTests": list(warned),
        "failedTests": list(failed),
    }
    if url is not None:
        predicate["url"] = url
    return _validated(TEST_RESULT_V01, predicate)


test_result.__test__ = False  # type: ignore[attr-defined]  # its name must not make pytest collect it


def verification_summary(
    *,
    verifier_id: str,
    time_verified: dt.datetime | str,
    resource_uri: str,
    policy: Mapping[str, object],
    verification_result: str,
    verified_levels: Sequence[str],
    input_attestations: Sequence[Mapping[str, object]] = (),
    dependency_levels: Mapping[str, int] | None = None,
    slsa_version: str = "1.0",
) -> dict[str, object]:
    """A SLSA Verification Summary v1 predicate (verification_summary §Schema)."""
    predicate: dict[str, object] = {
        "verifier": {"id": verifier_id},
        "timeVerified": timestamp(time_verified),
        "resourceUri": resource_uri,
        "policy": dict(policy),
        "inputAttestations": [dict(a) for a in input_attestations],
        "verificationResult": verification_result,
        "verifiedLevels": list(verified_levels),
        "slsaVersion": slsa_version,
    }
    if dependency_levels is not None:
        predicate["dependencyLevels"] = dict(dependency_levels)
    return _validated(VSA_V1, predicate)


def _validated(predicate_type: str, predicate: dict[str, object]) -> dict[str, object]:
    problems: list[str] = []
    _PREDICATE_CHECKS[predicate_type](predicate, problems)
    if problems:
        raise AttestationError(
            f"refusing to create an invalid {kind_of(predicate_type)} predicate", problems=problems
        )
    return predicate


# ----------------------------------------------------------------------------------- predicate checks


def _check_provenance(p: Mapping[str, object], problems: list[str]) -> None:
    """provenance/v1 §Fields: buildType and externalParameters required; builder.id required."""
    bd = _object(p, "buildDefinition", "predicate", problems)
    if bd is not None:
        if not _is_type_uri(bd.get("buildType")):
            problems.append("predicate.buildDefinition.buildType: missing or not a URI")
        _object(bd, "externalParameters", "predicate.buildDefinition", problems)
        _object(bd, "internalParameters", "predicate.buildDefinition", problems, required=False)
        _resources(bd, "resolvedDependencies", "predicate.buildDefinition", problems)
    rd = _object(p, "runDetails", "predicate", problems)
    if rd is None:
        return
    builder = _object(rd, "builder", "predicate.runDetails", problems)
    if builder is not None and not _is_type_uri(builder.get("id")):
        problems.append("predicate.runDetails.builder.id: missing or not a URI")
    meta = _object(rd, "metadata", "predicate.runDetails", problems, required=False)
    if meta is not None:
        _check_metadata(meta, problems)
    _resources(rd, "byproducts", "predicate.runDetails", problems)


def _check_metadata(meta: Mapping[str, object], problems: list[str]) -> None:
    where = "predicate.runDetails.metadata"
    if "invocationId" in meta and not isinstance(meta["invocationId"], str):
        problems.append(f"{where}.invocationId: not a string")
    for key in ("startedOn", "finishedOn"):
        if key in meta:
            _check_timestamp(meta[key], f"{where}.{key}", problems)
    started, finished = (meta.get(k) for k in ("startedOn", "finishedOn"))
    both = [t for t in (started, finished) if isinstance(t, str) and _is_timestamp(t)]
    if len(both) == 2 and _instant(both[1]) < _instant(both[0]):
        problems.append(f"{where}: finishedOn is before startedOn")


def _check_test_result(p: Mapping[str, object], problems: list[str]) -> None:
    """test-result.md §Fields: result enum and configuration required; the lists are strings."""
    result = p.get("result")
    if result not in TEST_RESULTS:
        problems.append(f"predicate.result: must be one of {', '.join(TEST_RESULTS)}")
    if not isinstance(p.get("configuration"), list):
        problems.append("predicate.configuration: missing or not a list")
    else:
        _resources(p, "configuration", "predicate", problems)
    if "url" in p and not isinstance(p["url"], str):
        problems.append("predicate.url: not a string")
    lists = {key: _strings(p, key, problems) for key in ("passedTests", "warnedTests", "failedTests")}
    _check_result_consistency(result, lists, problems)


def _check_result_consistency(result: object, lists: Mapping[str, list[str]], problems: list[str]) -> None:
    # servimg's policy on top of the spec: a result may not be better than the tests it lists, and a run
    # that exercised nothing is never PASSED (docs/design.md, "ladder": NOT_EXERCISED is never PASS).
    if result in ("PASSED", "WARNED") and lists["failedTests"]:
        problems.append(f"predicate.result: {result} but failedTests is not empty")
    if result == "PASSED" and lists["warnedTests"]:
        problems.append("predicate.result: PASSED but warnedTests is not empty")
    if result == "PASSED" and not lists["passedTests"]:
        problems.append("predicate.result: PASSED but no test passed (nothing exercised is not a pass)")
    seen: dict[str, str] = {}
    for key, names in lists.items():
        for name in names:
            if name in seen and seen[name] != key:
                problems.append(f"predicate: test {name!r} is in both {seen[name]} and {key}")
            seen.setdefault(name, key)


def _check_vsa(p: Mapping[str, object], problems: list[str]) -> None:
    """verification_summary §Fields: verifier.id, timeVerified, resourceUri, policy.uri,
    verificationResult, verifiedLevels required; one level per SLSA track; FAILED iff result FAILED."""
    verifier = _object(p, "verifier", "predicate", problems)
    if verifier is not None and not _is_type_uri(verifier.get("id")):
        problems.append("predicate.verifier.id: missing or not a URI")
    _check_timestamp(p.get("timeVerified"), "predicate.timeVerified", problems)
    if not isinstance(p.get("resourceUri"), str) or not p["resourceUri"]:
        problems.append("predicate.resourceUri: missing or not a string")
    policy = _object(p, "policy", "predicate", problems)
    if policy is not None:
        _check_resource(policy, "predicate.policy", problems)
        if not isinstance(policy.get("uri"), str):
            problems.append("predicate.policy.uri: required")
    for i, att in enumerate(_resources(p, "inputAttestations", "predicate", problems)):
        if isinstance(att, dict) and not isinstance(att.get("digest"), dict):
            problems.append(f"predicate.inputAttestations[{i}].digest: required")
    _check_levels(p, problems)
    if "slsaVersion" in p and not (
        isinstance(p["slsaVersion"], str) and _SLSA_VERSION.fullmatch(p["slsaVersion"])
    ):
        problems.append("predicate.slsaVersion: not <MAJOR>.<MINOR>")


def _check_levels(p: Mapping[str, object], problems: list[str]) -> None:
    result = p.get("verificationResult")
    if result not in VSA_RESULTS:
        problems.append(f"predicate.verificationResult: must be one of {', '.join(VSA_RESULTS)}")
    levels = _strings(p, "verifiedLevels", problems, required=True)
    if result == "FAILED" and "FAILED" not in levels:
        problems.append("predicate.verifiedLevels: must say FAILED when verificationResult is FAILED")
    if result == "PASSED" and "FAILED" in levels:
        problems.append("predicate.verifiedLevels: FAILED although verificationResult is PASSED")
    tracks = [m.group(1) for m in map(_SLSA_LEVEL.fullmatch, levels) if m]
    for track in sorted({t for t in tracks if tracks.count(t) > 1}):
        problems.append(f"predicate.verifiedLevels: more than one level for track {track}")
    deps = p.get("dependencyLevels", {})
    if not isinstance(deps, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in deps.items()
    ):
        problems.append("predicate.dependencyLevels: not a map of level to non-negative integer")


def _check_bom(p: Mapping[str, object], problems: list[str]) -> None:
    """The CycloneDX fields servimg relies on (the full schema is checked by cyclonedx's validator in the
    tests): bomFormat, specVersion 1.6, metadata.component, components as a list."""
    if p.get("bomFormat") != "CycloneDX":
        problems.append("predicate.bomFormat: must be CycloneDX")
    if p.get("specVersion") != "1.6":
        problems.append("predicate.specVersion: must be 1.6")
    if not isinstance(jv.member(p, "metadata", "component"), dict):
        problems.append("predicate.metadata.component: missing (the image the BOM describes)")
    if not isinstance(p.get("components"), list):
        problems.append("predicate.components: missing or not a list")


def _check_vex(p: Mapping[str, object], problems: list[str]) -> None:
    """The OpenVEX fields servimg relies on (the full schema is checked against OpenVEX's own JSON schema in
    the tests): its context, and statements that each name a vulnerability, products and a status."""
    if p.get("@context") != OPENVEX_V020:
        problems.append(f"predicate.@context: must be {OPENVEX_V020}")
    statements = p.get("statements")
    if not isinstance(statements, list) or not statements:
        problems.append("predicate.statements: missing or empty")
        return
    for i, s in enumerate(statements):
        if not (isinstance(s, dict) and isinstance(jv.member(s, "vulnerability", "name"), str)):
            problems.append(f"predicate.statements[{i}].vulnerability.name: missing")
        elif s.get("status") not in ("not_affected", "affected", "fixed", "under_investigation"):
            problems.append(f"predicate.statements[{i}].status: not an OpenVEX status")


_PREDICATE_CHECKS: Mapping[str, Callable[[Mapping[str, object], list[str]], None]] = {
    PROVENANCE_V1: _check_provenance,
    TEST_RESULT_V01: _check_test_result,
    VSA_V1: _check_vsa,
    CYCLONEDX_BOM: _check_bom,
    OPENVEX_V020: _check_vex,
}


# ------------------------------------------------------------------------------------- shared checks


def _is_type_uri(value: object) -> bool:
    return isinstance(value, str) and _TYPE_URI.fullmatch(value) is not None


def _is_timestamp(value: str) -> bool:
    if not _TIMESTAMP.fullmatch(value):
        return False
    try:
        _instant(value)
    except ValueError:
        return False
    return True


def _instant(value: str) -> dt.datetime:
    # fromisoformat takes at most 6 fractional digits; RFC 3339 allows more, which changes nothing here.
    head, dot, frac = value[:-1].partition(".")
    return dt.datetime.fromisoformat(head + (dot + frac[:6] if dot else "") + "+00:00")


def _check_timestamp(value: object, where: str, problems: list[str]) -> None:
    if not isinstance(value, str) or not _is_timestamp(value):
        problems.append(f"{where}: not an RFC 3339 UTC timestamp (YYYY-MM-DDTHH:MM:SSZ)")


def _object(
    parent: Mapping[str, object], key: str, where: str, problems: list[str], *, required: bool = True
) -> Mapping[str, object] | None:
    value = parent.get(key)
    if isinstance(value, dict):
        return value
    if value is not None or required:
        problems.append(f"{where}.{key}: {'missing or ' if required else ''}not an object")
    return None


def _strings(
    parent: Mapping[str, object], key: str, problems: list[str], *, required: bool = False
) -> list[str]:
    value = parent.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(f"predicate.{key}: {'missing or ' if required else ''}not a list of strings")
        return []
    return value


def _resources(parent: Mapping[str, object], key: str, where: str, problems: list[str]) -> list[Any]:
    value = parent.get(key, [])
    if not isinstance(value, list):
        problems.append(f"{where}.{key}: not a list")
        return []
    for i, entry in enumerate(value):
        _check_resource(entry, f"{where}.{key}[{i}]", problems)
    return value


def _check_resource(rd: object, where: str, problems: list[str]) -> None:
    """resource_descriptor.md: an object with at least one of uri, digest, content; typed fields."""
    if not isinstance(rd, dict):
        problems.append(f"{where}: not an object")
        return
    if not any(k in rd for k in ("uri", "digest", "content")):
        problems.append(f"{where}: needs at least one of uri, digest, content")
    for key in ("name", "uri", "content", "downloadLocation", "mediaType"):
        if key in rd and not isinstance(rd[key], str):
            problems.append(f"{where}.{key}: not a string")
    digests = rd.get("digest", {})
    if not isinstance(digests, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in digests.items()
    ):
        problems.append(f"{where}.digest: not a map of algorithm to hex string")
    if "annotations" in rd and not isinstance(rd["annotations"], dict):
        problems.append(f"{where}.annotations: not an object")


# --------------------------------------------------------------------------------------- sign and open


def sign_statement(statement_bytes: bytes, key: dsse.Signer) -> dsse.Envelope:
    """A DSSE envelope with payloadType `application/vnd.in-toto+json` over the statement bytes."""
    parse_statement(statement_bytes)  # never sign what a verifier would refuse
    return dsse.sign(PAYLOAD_TYPE, statement_bytes, key)


def open_envelope(
    envelope: dsse.Envelope,
    trusted: Sequence[dsse.VerifyKey],
    *,
    threshold: int = 1,
    subject: Digest | None = None,
    predicate_type: str | None = None,
) -> Statement:
    """Verify the signatures, then parse the statement; optionally require a subject and predicate type.

    The payload is parsed only after the signatures verified: unauthenticated bytes are never interpreted.
    """
    result = dsse.verify(envelope, trusted, threshold)
    if not result.verified:
        raise AttestationError(f"attestation does not verify: {result.reason}")
    if envelope.payload_type != PAYLOAD_TYPE:
        raise AttestationError(f"payloadType is {envelope.payload_type!r}, not {PAYLOAD_TYPE}")
    parsed = parse_statement(envelope.payload)
    if subject is not None and not parsed.covers(subject):
        raise AttestationError(f"the attestation is not about {subject}")
    if predicate_type is not None and parsed.predicate_type != predicate_type:
        raise AttestationError(f"predicateType is {parsed.predicate_type!r}, not {predicate_type!r}")
    return parsed


def statement_identity(payload: bytes) -> bytes | None:
    """What a statement says, as bytes two equal statements share: its type, subjects and predicate,
    without when or by which command it was made (SLSA provenance's `runDetails.metadata` — invocation id,
    start and finish — and servimg's `internalParameters.invocation`). None for a payload that is no
    statement. Used so a push attaches no second copy of what is already stated (attach.push_image)."""
    try:
        statement = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(statement, dict) or not isinstance(statement.get("predicate"), dict):
        return None
    predicate = copy.deepcopy(statement["predicate"])
    if statement.get("predicateType") == PROVENANCE_V1:
        run = predicate.get("runDetails")
        if isinstance(run, dict):
            run.pop("metadata", None)
        build = predicate.get("buildDefinition")
        internal = build.get("internalParameters") if isinstance(build, dict) else None
        if isinstance(internal, dict):
            internal.pop("invocation", None)
    return canonical.dumps({**statement, "predicate": predicate})
