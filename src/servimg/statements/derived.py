"""What a build states about an image, as in-toto statements (docs/design.md, "attestation").

Everything here is derived from the image itself: a servimg image carries its lock, definition,
changed-files manifest, probe and probe spec under `/opt/servimg/` in its overlay layer (build.plan_layer),
so the provenance of an image pushed long after its build is the same statement as the one made at build
time (only the invocation metadata differs). `ImageFacts` reads those files; the predicate builders below
are pure functions of them.

- build provenance: SLSA Provenance v1. externalParameters = the definition JSON; resolvedDependencies =
  base manifest + config, every overlay patch, each dist (its dist-info RECORD), the probe and its spec;
  byproducts = the changed-files manifest (`/opt/servimg/changes.json`, and one entry per file in it).
- verify: in-toto test-result, one test per probe check; configuration = the probe spec and probe.
- ladder: in-toto test-result made from a ladder receipt (verdict PASS | FAIL | NOT_EXERCISED; only PASS
  is PASSED).
- promotion: SLSA verification summary (see `attesting.later.promote`).

Roles: every ResourceDescriptor servimg writes carries `annotations.role`, which is how `check` and
`card` find "the base manifest" or "the patches" again without relying on names or order.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import posixpath
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servimg import __version__
from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import ServimgError
from servimg.definitions.lock import Lock
from servimg.oci.filesystem import LayeredFS
from servimg.oci.layer import OPAQUE_MARKER, WHITEOUT_PREFIX, normalize_path
from servimg.proof.verify import VerifyReport
from servimg.statements import attest

DEFAULT_BUILDER_ID = "https://servimg.invalid/builder/v1"
DEFAULT_VERIFIER_ID = "https://servimg.invalid/verifier/v1"
BUILDER_ENV = "SERVIMG_BUILDER_ID"
SERVIMG_DIR = "opt/servimg"
LOCK_FILE = f"{SERVIMG_DIR}/lock.json"
DEFINITION_FILE = f"{SERVIMG_DIR}/definition.json"
CHANGES_FILE = f"{SERVIMG_DIR}/changes.json"
PROBE_FILE = f"{SERVIMG_DIR}/probe.py"
SPEC_FILE = f"{SERVIMG_DIR}/probe-spec.json"
# Files servimg adds beside the overlays; they are not "changed files" of the base.
SERVIMG_FILES = frozenset({LOCK_FILE, DEFINITION_FILE, CHANGES_FILE, PROBE_FILE, SPEC_FILE})
VERIFY_CONFIG = "servimg-verify"
LADDER_PREFIX = "ladder:"
LADDER_VERDICTS = ("PASS", "FAIL", "NOT_EXERCISED")

# ResourceDescriptor roles (annotations.role).
ROLE_BASE_MANIFEST = "base-manifest"
ROLE_BASE_CONFIG = "base-config"
ROLE_PATCH = "patch"
ROLE_DIST = "dist"
ROLE_PROBE = "probe"
ROLE_PROBE_SPEC = "probe-spec"
ROLE_CHANGES = "changes-manifest"
ROLE_CHANGED_FILE = "changed-file"
ROLE_VERIFY = "verify"
ROLE_LADDER = "ladder"


class ProvenanceError(ServimgError):
    """An image lacks what servimg provenance is made from, or a result cannot become a statement."""


# ------------------------------------------------------------------------------------------ image facts


# What a changed file is (ChangedFile.kind). The image's manifest names the layer entry's kind
# (servimg.oci.layer.Kind: file, dir, symlink, whiteout); attestations made before kinds were recorded
# carry none (kind None: "deleted" there meant no digest, which a created directory has too).
FILE, SYMLINK, DIRECTORY, DELETED, OTHER = "file", "symlink", "directory", "deleted", "other"
KINDS = (FILE, SYMLINK, DIRECTORY, DELETED, OTHER)
_LAYER_KINDS = {"file": FILE, "symlink": SYMLINK, "dir": DIRECTORY, "whiteout": DELETED, "opaque": DELETED}
# The changes manifest's format: 1 is a bare JSON list of {path, kind, mode, sha256} (every image built
# so far); a later format is an object with a "format" key, which this reader names and refuses.
CHANGES_FORMAT = 1


@dataclass(frozen=True)
class ChangedFile:
    """One line of the changed-files manifest: a file (its sha256), a symlink, a directory the layer
    creates, or a deletion (a whiteout: no sha256). `kind` None: not recorded (an older attestation)."""

    path: str
    sha256: str | None
    mode: int
    kind: str | None = None

    def key(self) -> tuple[str, str | None, int]:
        """What two listings must agree on; kinds are compared apart (`kind_differs`), since an older
        attestation has none."""
        return (self.path, self.sha256, self.mode & 0o7777)

    def kind_differs(self, other: ChangedFile) -> bool:
        return self.kind is not None and other.kind is not None and self.kind != other.kind

    def describe(self) -> str:
        """`deleted`, `directory`, `symlink …` or the sha256's first 16 hex digits, for cards and rows."""
        if self.kind == DIRECTORY:
            return "directory"
        if self.sha256 is None:
            return "deleted" if self.kind in (DELETED, None) else str(self.kind)
        return f"sha256:{self.sha256[:16]}…" if self.kind in (FILE, None) else self.sha256

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "kind": self.kind, "mode": self.mode, "sha256": self.sha256}

    @classmethod
    def from_json(cls, doc: object, where: str) -> ChangedFile:
        """One manifest entry; its `kind` as the layer writer names it (file, dir, whiteout, …) or as
        ChangedFile does. ProvenanceError naming `where` when malformed."""
        path, sha, mode, kind = (
            (doc.get(k) for k in ("path", "sha256", "mode", "kind")) if isinstance(doc, dict) else (None,) * 4
        )
        named = _LAYER_KINDS.get(kind, kind) if isinstance(kind, str) else kind
        if (
            not isinstance(path, str)
            or not isinstance(mode, int)
            or not (sha is None or isinstance(sha, str))
            or not (named is None or named in KINDS)
        ):
            raise ProvenanceError(f"{where} is malformed")
        return cls(path, sha, mode, named)


@dataclass(frozen=True)
class ImageFacts:
    """The files a servimg image carries about itself (read from its overlay layer)."""

    lock: Lock
    definition: Mapping[str, object]
    definition_sha256: str
    changes: tuple[ChangedFile, ...]
    changes_sha256: str
    probe_sha256: str
    spec_sha256: str

    @property
    def lock_digest(self) -> Digest:
        return self.lock.digest


def read_facts(top_layer: Path) -> ImageFacts:
    """Read `/opt/servimg/*` from an image's (uncompressed) top layer; every problem at once."""
    fs = LayeredFS([top_layer])
    files = {path: fs.read_or_none(path) for path in sorted(SERVIMG_FILES)}
    missing = sorted("/" + p for p, data in files.items() if data is None)
    if missing:
        raise ProvenanceError(
            "the image's top layer lacks servimg's files: " + ", ".join(missing),
            hint="only images built by `servimg build` carry their own provenance",
        )
    data = {p: d for p, d in files.items() if d is not None}
    try:
        lock = Lock.from_json(json.loads(data[LOCK_FILE]), "/" + LOCK_FILE)
        definition = json.loads(data[DEFINITION_FILE])
        changes = parse_changes(json.loads(data[CHANGES_FILE]))
    except ValueError as exc:
        raise ProvenanceError(f"the image's servimg files are not valid JSON: {exc}") from None
    except ServimgError as exc:
        raise ProvenanceError(exc.message, hint=exc.hint, problems=exc.problems) from None
    if not isinstance(definition, dict):
        raise ProvenanceError(f"/{DEFINITION_FILE} is not a JSON object")
    return ImageFacts(
        lock,
        definition,
        sha256_hex(data[DEFINITION_FILE]),
        changes,
        sha256_hex(data[CHANGES_FILE]),
        sha256_hex(data[PROBE_FILE]),
        sha256_hex(data[SPEC_FILE]),
    )


def parse_changes(doc: object) -> tuple[ChangedFile, ...]:
    """The changes manifest (format 1: `[{path, kind, mode, sha256}]`) as ChangedFiles, sorted by path."""
    if isinstance(doc, dict) and "format" in doc:
        raise ProvenanceError(
            f"/{CHANGES_FILE} is format {doc['format']!r}; this servimg reads format {CHANGES_FORMAT}",
            hint="the image was built by a newer servimg: check it with that version",
        )
    if not isinstance(doc, list):
        raise ProvenanceError(f"/{CHANGES_FILE} is not a list")
    out = [ChangedFile.from_json(entry, f"/{CHANGES_FILE}[{i}]") for i, entry in enumerate(doc)]
    return tuple(sorted(out, key=ChangedFile.key))


def layer_changes(layer: Path) -> tuple[ChangedFile, ...]:
    """Re-derive the changed-files manifest from an overlay layer's tar: every file and whiteout in it,
    and every directory it creates empty (the witness dir), except servimg's own files. What the layer
    really holds, whatever its manifest says. A directory with members below it is only their parent,
    which the manifest does not list; an empty one is listed as the manifest lists it (no sha256, its
    mode), so a witness image's own dir is no "extra" entry (measured: check FAILed on it)."""
    out: dict[str, ChangedFile] = {}
    dirs: dict[str, int] = {}
    try:
        with tarfile.open(layer, mode="r:") as tar:
            for info in tar:
                path = normalize_path(info.name)
                parent, _, base = path.rpartition("/")
                if info.isdir() and path:
                    dirs[path] = info.mode & 0o7777
                if info.isdir() or path in SERVIMG_FILES or not path:
                    continue
                if base == OPAQUE_MARKER:
                    out[path] = ChangedFile("/" + path, None, 0o644, DELETED)
                elif base.startswith(WHITEOUT_PREFIX):
                    target = posixpath.join(parent, base[len(WHITEOUT_PREFIX) :])
                    out[target] = ChangedFile("/" + target, None, info.mode & 0o7777, DELETED)
                elif info.isfile():
                    handle = tar.extractfile(info)
                    content = handle.read() if handle is not None else b""
                    out[path] = ChangedFile("/" + path, sha256_hex(content), info.mode & 0o7777, FILE)
                else:  # links and devices have no digest; name them so a comparison sees them
                    kind = SYMLINK if info.issym() else OTHER
                    out[path] = ChangedFile("/" + path, f"{info.type.decode()}:{info.linkname}", 0, kind)
            members = [normalize_path(info.name) for info in tar.getmembers()]
    except (tarfile.TarError, OSError) as exc:
        raise ProvenanceError(f"the overlay layer is not a readable tar: {exc}") from None
    parents = {m.rpartition("/")[0] for m in members} | {m.rpartition("/")[0] for m in out}
    parents = {a for p in parents for a in _ancestors(p)}
    for path, mode in dirs.items():
        if path not in parents:
            out[path] = ChangedFile("/" + path, None, mode, DIRECTORY)
    return tuple(sorted(out.values(), key=ChangedFile.key))


def _ancestors(path: str) -> list[str]:
    """`a/b/c` → [a/b/c, a/b, a]."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1) if parts[0]]


# ------------------------------------------------------------------------------------------ provenance


@dataclass(frozen=True)
class Invocation:
    """Who ran what, when: the part of the provenance that is about the run, not about the image."""

    id: str
    started_on: str | None = None
    finished_on: str | None = None
    command: tuple[str, ...] = ()


def builder_id(explicit: str | None = None) -> str:
    """`explicit`, else $SERVIMG_BUILDER_ID, else servimg's default builder id."""
    return explicit or os.environ.get(BUILDER_ENV) or DEFAULT_BUILDER_ID


def now() -> str:
    return attest.timestamp(dt.datetime.now(dt.UTC).replace(microsecond=0))


def _role(role: str, **more: Any) -> dict[str, object]:
    return {"role": role, **{k: v for k, v in more.items() if v is not None}}


def resolved_dependencies(facts: ImageFacts) -> list[dict[str, object]]:
    lock = facts.lock
    overlays = {o.get("id"): o for o in jv.seq(facts.definition.get("overlays") or []) if isinstance(o, dict)}
    deps = [
        attest.resource(
            name=lock.base.ref,
            uri=lock.base.ref,
            digest=lock.base.manifest_digest,
            annotations=_role(ROLE_BASE_MANIFEST),
        ),
        attest.resource(
            name=lock.base.ref + attest.CONFIG_SUBJECT_SUFFIX,
            digest=lock.base.config_digest,
            annotations=_role(ROLE_BASE_CONFIG),
        ),
    ]
    for overlay in lock.overlays:
        spec = overlays.get(overlay.id) or {}
        deps.append(
            attest.resource(
                name=overlay.patch,
                digest=Digest.parse(f"sha256:{overlay.patch_sha256}"),
                annotations=_role(
                    ROLE_PATCH,
                    overlay=overlay.id,
                    package=overlay.package,
                    upstream=list(spec.get("upstream") or []),
                    files=[f.path for f in overlay.files],
                    fixes=list(overlay.fixes) or None,
                ),
            )
        )
    for pkg in lock.packages:
        deps.append(
            attest.resource(
                name=f"{pkg.distribution}=={pkg.version}",
                uri=f"file://{pkg.dist_info}/RECORD",
                digest=Digest.parse(f"sha256:{pkg.record_sha256}"),
                annotations=_role(ROLE_DIST, import_name=pkg.import_name, dist_info=pkg.dist_info),
            )
        )
    deps.append(
        attest.resource(
            name="/" + PROBE_FILE,
            digest=Digest.parse(f"sha256:{facts.probe_sha256}"),
            annotations=_role(ROLE_PROBE),
        )
    )
    deps.append(
        attest.resource(
            name="/" + SPEC_FILE,
            digest=Digest.parse(f"sha256:{facts.spec_sha256}"),
            annotations=_role(ROLE_PROBE_SPEC),
        )
    )
    return deps


def byproducts(facts: ImageFacts) -> list[dict[str, object]]:
    out = [
        attest.resource(
            name="/" + CHANGES_FILE,
            digest=Digest.parse(f"sha256:{facts.changes_sha256}"),
            media_type="application/json",
            annotations=_role(ROLE_CHANGES),
        )
    ]
    for change in facts.changes:
        entry = attest.changed_file(change.path, change.sha256, change.mode, change.kind)
        entry["annotations"] = {**jv.obj(entry["annotations"]), "role": ROLE_CHANGED_FILE}
        out.append(entry)
    return out


def provenance_predicate(facts: ImageFacts, invocation: Invocation, builder: str) -> dict[str, object]:
    """SLSA Provenance v1 for the image `facts` describe (pure)."""
    lock = facts.lock
    internal: dict[str, object] = {
        "lockDigest": str(lock.digest),
        "sourceDateEpoch": lock.source_date_epoch,
        "interpreter": {
            "path": lock.interpreter.path,
            "version": lock.interpreter.version,
            "cacheTag": lock.interpreter.cache_tag,
        },
        "tool": dict(lock.tool),
        "invocation": {"command": list(invocation.command), "servimg": __version__},
    }
    return attest.provenance(
        external_parameters=facts.definition,
        resolved_dependencies=resolved_dependencies(facts),
        builder_id=builder,
        invocation_id=invocation.id,
        started_on=invocation.started_on,
        finished_on=invocation.finished_on,
        internal_parameters=internal,
        byproducts=byproducts(facts),
    )


def subjects(name: str, manifest: Digest, config: Digest) -> list[tuple[str, Digest]]:
    return attest.image_subjects(name, manifest, config)


def subject_name(facts: ImageFacts) -> str:
    """The statement's subject name: the definition's repository (stable wherever the image goes)."""
    return str(facts.definition.get("repository") or facts.lock.name)


# ------------------------------------------------------------------------------------------ test results


def _test_names(checks: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    """(status, name) pairs → the three lists, names made unique (a name never sits in two lists)."""
    lists: dict[str, list[str]] = {"PASS": [], "WARN": [], "FAIL": []}
    seen: dict[str, int] = {}
    for status, name in checks:
        seen[name] = seen.get(name, 0) + 1
        unique = name if seen[name] == 1 else f"{name} #{seen[name]}"
        lists["FAIL" if status not in ("PASS", "WARN") else status].append(unique)
    return lists


def verify_predicate(report: VerifyReport, facts: ImageFacts) -> dict[str, object]:
    """An in-toto test-result for a `servimg verify` report of the image `facts` describe.

    Refuses a report made for another lock or another probe spec: a result is evidence only about the
    image it ran on."""
    problems = []
    if report.lock_digest is not None and report.lock_digest != facts.lock_digest:
        problems.append(f"the report is for lock {report.lock_digest}, the image has {facts.lock_digest}")
    if report.spec_sha256 is not None and report.spec_sha256 != facts.spec_sha256:
        problems.append(f"the report ran spec sha256 {report.spec_sha256}, the image has {facts.spec_sha256}")
    if problems:
        raise ProvenanceError(
            "the verify report is not about this image",
            problems=problems,
            hint="run `servimg verify` on this image and pass that report",
        )
    lists = _test_names([(c.status, f"{c.code} {c.subject}") for c in report.findings])
    configuration = [
        attest.resource(
            name=VERIFY_CONFIG,
            uri="file:///" + SPEC_FILE,
            digest=Digest.parse(f"sha256:{facts.spec_sha256}"),
            annotations=_role(
                ROLE_VERIFY,
                probe_sha256=facts.probe_sha256,
                lock_digest=str(facts.lock_digest),
                audit=bool(report.audit),
                interpreter=str((report.interpreter or {}).get("version") or ""),
            ),
        )
    ]
    return attest.test_result(
        configuration=configuration, passed=lists["PASS"], warned=lists["WARN"], failed=lists["FAIL"]
    )


@dataclass(frozen=True)
class LadderReceipt:
    """The parts of a ladder receipt a test-result needs; the receipt itself is hashed."""

    name: str
    verdict: str
    sha256: str
    image_digests: tuple[str, ...]
    arms: tuple[tuple[str, str], ...]
    finished: str | None
    # `module:name` of every sentinel a serving process of an arm executed (the witness's records), so that
    # `servimg fixes` can say a fix ran where it serves, from the signed test-result alone.
    witnessed: tuple[str, ...] = ()
    # What the arms covered, for `servimg matrix`: model families (`dense` for an arm without one), the
    # arms that served through a KV connector (LMCache), and the device (`gpu` when an arm's serving
    # arguments reserve GPU memory, else `cpu`).
    families: tuple[str, ...] = ()
    connector_arms: tuple[str, ...] = ()
    device: str | None = None

    @classmethod
    def parse(cls, data: bytes) -> LadderReceipt:
        """Accepts `{ladder: NAME | {name}, verdict, image_digest | image: {digest, config_digest} |
        images: [...], arms: [{id, verdict}], finished_at, sha256}`; refuses anything without a name and
        verdict, and a sealed receipt (`sha256` over the canonical rest) whose seal no longer holds."""
        try:
            doc = json.loads(data)
        except ValueError:
            raise ProvenanceError("the ladder receipt is not JSON") from None
        if not isinstance(doc, dict):
            raise ProvenanceError("the ladder receipt is not a JSON object")
        ladder = doc.get("ladder")
        name = ladder.get("name") if isinstance(ladder, dict) else ladder
        verdict = doc.get("verdict")
        problems = []
        if not isinstance(name, str) or not name:
            problems.append("ladder: missing (the ladder's name, or {name: …})")
        if verdict not in LADDER_VERDICTS:
            problems.append(f"verdict: must be one of {', '.join(LADDER_VERDICTS)}")
        sealed = doc.get("sha256")
        if sealed is not None:  # a sealed receipt (servimg.ladder.receipt.seal): its own hash must still hold
            body = canonical.dumps({k: v for k, v in doc.items() if k != "sha256"})
            if sealed != sha256_hex(body):
                problems.append("sha256: does not match the receipt's content (edited after sealing)")
        arms = []
        raw_arms = doc.get("arms") or []
        for i, arm in enumerate(raw_arms if isinstance(raw_arms, list) else [None]):
            if not (isinstance(arm, dict) and isinstance(arm.get("id"), str)):
                problems.append(f"arms[{i}]: not an object with an id")
            elif "verdict" not in arm:
                continue  # an arm without a verdict of its own (a control) is not a test
            elif arm.get("verdict") not in LADDER_VERDICTS:
                problems.append(f"arms[{i}].verdict: must be one of {', '.join(LADDER_VERDICTS)}")
            else:
                arms.append((str(arm["id"]), str(arm["verdict"])))
        if problems:
            raise ProvenanceError("not a ladder receipt", problems=problems)
        finished = doc.get("finished_at")
        return cls(
            str(name),
            str(verdict),
            sha256_hex(data),
            tuple(_receipt_digests(doc)),
            tuple(arms),
            finished if isinstance(finished, str) else None,
            tuple(_witnessed(raw_arms)),
            *_coverage(raw_arms),
        )


def _coverage(arms: object) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    """(model families, connector arms, device) of the receipt's arms, from their specs."""
    families: set[str] = set()
    connectors: list[str] = []
    gpu, seen = False, False
    # an arm that reuses a server serves with that server's arguments (a warm arm behind a connector)
    args_of: dict[str, str] = {}
    for arm in arms if isinstance(arms, list) else []:
        spec = arm.get("spec") if isinstance(arm, dict) else None
        if not isinstance(spec, dict):
            continue
        seen = True
        family = spec.get("model_family")
        families.add(family if isinstance(family, str) and family else "dense")
        server = spec.get("server")
        owner = (
            server.removeprefix("reuse:") if isinstance(server, str) and server.startswith("reuse:") else ""
        )
        args = args_of.get(owner) or " ".join(a for a in spec.get("args") or [] if isinstance(a, str))
        args_of[str(arm.get("id"))] = args
        if "kv_connector" in args:
            connectors.append(str(arm.get("id")))
        gpu = gpu or "--gpu-memory-utilization" in args
    return tuple(sorted(families)), tuple(connectors), ("gpu" if gpu else "cpu") if seen else None


def _witnessed(arms: object) -> list[str]:
    """Every `module:sentinel` the arms' serving processes were seen running (witness records)."""
    seen: set[str] = set()
    for arm in arms if isinstance(arms, list) else []:
        witness = arm.get("witness") if isinstance(arm, dict) else None
        records = witness.get("records") if isinstance(witness, dict) else None
        for record in records if isinstance(records, list) else []:
            module = record.get("module") if isinstance(record, dict) else None
            ran = record.get("sentinels_ran") if isinstance(record, dict) else None
            if isinstance(module, str) and isinstance(ran, list):
                seen.update(f"{module}:{name}" for name in ran if isinstance(name, str))
    return sorted(seen)


def _receipt_digests(doc: Mapping[str, object]) -> list[str]:
    found: list[str] = []
    candidates: list[Any] = [doc.get("image_digest"), doc.get("image")]
    images = doc.get("images")
    candidates += list(images) if isinstance(images, list) else []
    for item in candidates:
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            found += [str(item[k]) for k in ("digest", "config_digest", "id") if isinstance(item.get(k), str)]
    return found


def arm_test(arm_id: str) -> str:
    """The name a ladder arm has in the test-result's passed/failed lists."""
    return f"arm {arm_id}"


def ladder_predicate(receipt: LadderReceipt, manifest: Digest, config: Digest) -> dict[str, object]:
    """A test-result for a ladder receipt about this image. NOT_EXERCISED is never PASS (docs/design.md)."""
    if receipt.image_digests and not {str(manifest), str(config)} & set(receipt.image_digests):
        raise ProvenanceError(
            f"the ladder receipt is about {', '.join(receipt.image_digests)}, not this image ({manifest})",
            hint="attach a receipt to the image the ladder ran against",
        )
    tests = [("PASS" if verdict == "PASS" else "FAIL", arm_test(arm)) for arm, verdict in receipt.arms]
    whole = LADDER_PREFIX + receipt.name
    if receipt.verdict != "PASS" and not any(status == "FAIL" for status, _ in tests):
        tests.append(("FAIL", whole))
    if receipt.verdict == "PASS" and not tests:
        tests.append(("PASS", whole))
    lists = _test_names(tests)
    # A receipt that says PASS over a failing or unexercised arm is inconsistent: fail closed.
    result = "PASSED" if receipt.verdict == "PASS" and not lists["FAIL"] else "FAILED"
    annotations = _role(
        ROLE_LADDER,
        ladder=receipt.name,
        verdict=receipt.verdict,
        finished_at=receipt.finished,
        witnessed=list(receipt.witnessed) or None,
        families=list(receipt.families) or None,
        connector_arms=list(receipt.connector_arms) or None,
        device=receipt.device,
    )
    configuration = [
        attest.resource(
            name=whole,
            digest=Digest.parse(f"sha256:{receipt.sha256}"),
            media_type="application/json",
            annotations=annotations,
        )
    ]
    return attest.test_result(
        configuration=configuration, passed=lists["PASS"], failed=lists["FAIL"], result=result
    )


# ------------------------------------------------------------------------------------------ reading back


def role_of(rd: Mapping[str, object]) -> str | None:
    annotations = rd.get("annotations")
    role = annotations.get("role") if isinstance(annotations, dict) else None
    return role if isinstance(role, str) else None


def with_role(items: object, role: str) -> list[Mapping[str, object]]:
    if not isinstance(items, list):
        return []
    return [rd for rd in items if isinstance(rd, dict) and role_of(rd) == role]


def sha256_of(rd: Mapping[str, object]) -> str | None:
    digests = rd.get("digest")
    value = digests.get("sha256") if isinstance(digests, dict) else None
    return value if isinstance(value, str) else None


def provenance_dependencies(predicate: Mapping[str, object], role: str) -> list[Mapping[str, object]]:
    build = predicate.get("buildDefinition")
    return with_role(build.get("resolvedDependencies") if isinstance(build, dict) else None, role)


def provenance_byproducts(predicate: Mapping[str, object]) -> tuple[ChangedFile, ...]:
    """The changed files a provenance lists (the `changed-file` byproducts), in ChangedFile form."""
    run = predicate.get("runDetails")
    out = []
    for rd in with_role(run.get("byproducts") if isinstance(run, dict) else None, ROLE_CHANGED_FILE):
        annotations = jv.obj(rd.get("annotations") or {}, "byproducts[].annotations")
        try:
            mode = int(str(annotations.get("mode", "0")), 8)
        except ValueError:
            mode = -1
        sha = None if annotations.get("deleted") or annotations.get("kind") == DIRECTORY else sha256_of(rd)
        kind = annotations.get("kind")  # none in an attestation made before kinds were recorded
        out.append(
            ChangedFile(
                str(rd.get("name", "")), sha, mode, kind if isinstance(kind, str) and kind in KINDS else None
            )
        )
    return tuple(sorted(out, key=ChangedFile.key))


def builder_of(predicate: Mapping[str, object]) -> str | None:
    run = predicate.get("runDetails")
    builder = run.get("builder") if isinstance(run, dict) else None
    value = builder.get("id") if isinstance(builder, dict) else None
    return value if isinstance(value, str) else None


def test_config(predicate: Mapping[str, object]) -> Mapping[str, object] | None:
    """The servimg configuration entry of a test-result (verify or ladder), if it has one."""
    for rd in jv.seq(predicate.get("configuration") or []):
        if isinstance(rd, dict) and role_of(rd) in (ROLE_VERIFY, ROLE_LADDER):
            return rd
    return None


test_config.__test__ = False  # type: ignore[attr-defined]


def ladder_name(predicate: Mapping[str, object]) -> str | None:
    rd = test_config(predicate)
    if rd is None or role_of(rd) != ROLE_LADDER:
        return None
    name = str(rd.get("name", ""))
    return name[len(LADDER_PREFIX) :] if name.startswith(LADDER_PREFIX) else None


def is_verify_result(predicate: Mapping[str, object]) -> bool:
    rd = test_config(predicate)
    return rd is not None and role_of(rd) == ROLE_VERIFY


def canonical_sha256(value: Any) -> str:
    return sha256_hex(canonical.dumps(value))
