"""`servimg show REF` (the provenance card) and `servimg diff A B` (what differs between two images).

A card is a value made from `evidence.Evidence`: base, overlays with their upstream refs and sentinels,
dists, changed files, the verify and ladder results, promotions, and how each attestation is signed.
Content comes from the attestations `check` parsed (verified ones, or unsigned ones, which the card marks);
without any provenance it falls back to what the image says about itself, and says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.judging.check import BASE_LABEL
from servimg.judging.evidence import Evidence, Found
from servimg.statements import attest, sbom
from servimg.statements import derived as provenance
from servimg.statements.derived import ChangedFile


@dataclass(frozen=True)
class Overlay:
    id: str
    package: str
    patch: str
    sha256: str
    upstream: tuple[str, ...]
    sentinels: tuple[str, ...]
    description: str = ""


@dataclass(frozen=True)
class Result:
    what: str  # verify | ladder:<name> | vsa | sbom
    result: str
    detail: str
    trusted: bool


@dataclass(frozen=True)
class Signature:
    kind: str
    artifact: str
    status: str
    keyids: tuple[str, ...]


@dataclass(frozen=True)
class Card:
    ref: str
    digest: Digest
    config_digest: Digest
    source: str  # where the content came from: "signed provenance", "unsigned …", "the image itself"
    base: Mapping[str, str]
    builder: str | None
    invocation: Mapping[str, object]
    overlays: tuple[Overlay, ...]
    dists: Mapping[str, str]
    changed_files: tuple[ChangedFile, ...]
    results: tuple[Result, ...]
    signatures: tuple[Signature, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    layer_files: tuple[ChangedFile, ...] | None = None  # re-derived from the overlay layer itself

    def as_dict(self) -> dict[str, object]:
        return {
            "ref": self.ref,
            "digest": str(self.digest),
            "config_digest": str(self.config_digest),
            "source": self.source,
            "base": dict(self.base),
            "builder": self.builder,
            "invocation": dict(self.invocation),
            "overlays": [
                o.__dict__ | {"upstream": list(o.upstream), "sentinels": list(o.sentinels)}
                for o in self.overlays
            ],
            "dists": dict(self.dists),
            "changed_files": [
                {"path": c.path, "sha256": c.sha256, "mode": f"{c.mode:04o}"} for c in self.changed_files
            ],
            "results": [r.__dict__ for r in self.results],
            "signatures": [s.__dict__ | {"keyids": list(s.keyids)} for s in self.signatures],
            "notes": list(self.notes),
            "layer_files": None
            if self.layer_files is None
            else [{"path": c.path, "sha256": c.sha256, "mode": f"{c.mode:04o}"} for c in self.layer_files],
        }

    def text(self) -> str:
        lines = [
            f"image   {self.ref}",
            f"digest  {self.digest}  (config {self.config_digest})",
            f"source  {self.source}",
            f"base    {self.base.get('ref', '?')}",
            f"        manifest {self.base.get('manifest', '?')}  config {self.base.get('config', '?')}",
            f"builder {self.builder or '?'}  invocation {self.invocation.get('invocationId', '?')}",
        ]
        lines.append(f"overlays ({len(self.overlays)})")
        for o in self.overlays:
            lines.append(f"  {o.id}  [{o.package}]  {o.patch}  sha256:{o.sha256[:16]}…")
            lines.append(f"    upstream: {', '.join(o.upstream) or '(none: not upstream)'}")
            for s in o.sentinels:
                lines.append(f"    sentinel: {s}")
        lines.append("dists   " + ", ".join(f"{k} (RECORD {v[:12]}…)" for k, v in sorted(self.dists.items())))
        lines.append(f"changed files ({len(self.changed_files)})")
        for c in self.changed_files:
            lines.append(f"  {_change(c)}  {c.path}")
        lines.append("results")
        for r in self.results or (Result("-", "none attached", "", False),):
            lines.append(f"  {r.what:<20} {r.result:<14} {r.detail}{'' if r.trusted else '  (UNVERIFIED)'}")
        lines.append("signatures")
        for sig in self.signatures or (Signature("-", "-", "no attestations", ()),):
            keys = ", ".join(k[:16] for k in sig.keyids)
            lines.append(f"  {sig.kind:<12} {sig.artifact[:19]}  {sig.status}{f' ({keys})' if keys else ''}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def markdown(self) -> str:
        out = [
            f"# Provenance card: `{self.ref}`",
            "",
            f"- **digest**: `{self.digest}` (config `{self.config_digest}`)",
            f"- **source**: {self.source}",
            f"- **base**: `{self.base.get('ref', '?')}` — manifest `{self.base.get('manifest', '?')}`, "
            f"config `{self.base.get('config', '?')}`",
            f"- **builder**: `{self.builder or '?'}` "
            f"(invocation `{self.invocation.get('invocationId', '?')}`)",
            "",
            "## Overlays",
            "",
            "| id | package | patch | sha256 | upstream | sentinels |",
            "|---|---|---|---|---|---|",
        ]
        for o in self.overlays:
            upstream = "<br>".join(o.upstream) or "not upstream"
            sentinels = "<br>".join(f"`{s}`" for s in o.sentinels) or "-"
            out.append(
                f"| {o.id} | {o.package} | `{o.patch}` | `{o.sha256[:16]}…` | {upstream} | {sentinels} |"
            )
        out += ["", "## Distributions", "", "| dist | RECORD sha256 |", "|---|---|"]
        out += [f"| {k} | `{v[:16]}…` |" for k, v in sorted(self.dists.items())]
        out += [
            "",
            f"## Changed files ({len(self.changed_files)})",
            "",
            "| path | sha256 | mode |",
            "|---|---|---|",
        ]
        out += [
            f"| `{c.path}` | {c.describe() if c.sha256 is None else f'`{c.sha256[:16]}…`'} | {c.mode:04o} |"
            for c in self.changed_files
        ]
        out += ["", "## Results", "", "| what | result | detail |", "|---|---|---|"]
        out += [
            f"| {r.what} | {r.result}{'' if r.trusted else ' (unverified)'} | {r.detail} |"
            for r in self.results
        ] or ["| - | none attached | |"]
        out += ["", "## Signatures", "", "| attestation | artifact | status |", "|---|---|---|"]
        out += [f"| {s.kind} | `{s.artifact[:19]}…` | {s.status} |" for s in self.signatures]
        out += [f"\n> {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def _change(c: ChangedFile) -> str:
    return f"{c.describe() if c.sha256 is None else c.sha256[:12]:<12} {c.mode:04o}"


def _status(f: Found) -> str:
    return (
        {
            "verified": "signed, verified",
            "unsigned": "UNSIGNED",
            "no-keys": "signed, not verified (no trusted key given)",
            "untrusted": "signed by an UNTRUSTED key",
            "forged": "signature does NOT verify",
            "threshold": "below the signature threshold",
        }.get(f.signature, f.problem or f.signature)
        if f.problem is None
        else f"unusable: {f.problem}"
    )


def card(evidence: Evidence) -> Card:
    """The provenance card of the image `evidence` is about (pure)."""
    loc = evidence.located
    bound = [
        f
        for f in evidence.found
        if f.statement is not None
        and (f.statement.covers(loc.digest) or f.statement.covers(loc.config_digest))
    ]
    provs = [f for f in bound if f.statement and f.statement.predicate_type == attest.PROVENANCE_V1]
    provs.sort(key=lambda f: (f.signature != "verified", f.created or ""))
    notes: list[str] = []
    if provs:
        chosen = provs[0]
        assert chosen.statement is not None
        p = chosen.statement.predicate
        source = (
            "signed provenance (verified)" if chosen.signature == "verified" else "provenance NOT VERIFIED"
        )
        base, builder, invocation, overlays, dists, changes = _from_provenance(p)
    elif evidence.facts is not None:
        facts = evidence.facts
        source = "the image's own /opt/servimg files (no provenance attached)"
        base = {
            "ref": facts.lock.base.ref,
            "manifest": str(facts.lock.base.manifest_digest),
            "config": str(facts.lock.base.config_digest),
        }
        builder, invocation = None, {}
        overlays = _overlays(facts.definition, {o.id: o.patch_sha256 for o in facts.lock.overlays})
        dists = {f"{p.distribution}=={p.version}": p.record_sha256 for p in facts.lock.packages}
        changes = facts.changes
    else:
        source = "nothing: no provenance, and the image's own files are unreadable"
        notes.append(str(evidence.facts_problem))
        base, builder, invocation, overlays, dists, changes = {}, None, {}, (), {}, ()
    label = loc.image.labels.get(BASE_LABEL)
    if label and base.get("manifest") and label != base["manifest"]:
        notes.append(f"the image's base label says {label}, the card's base is {base['manifest']}")
    layer = evidence.layer_changes
    if layer is not None and {c.key() for c in layer} != {c.key() for c in changes}:
        notes.append(
            "the overlay layer's files differ from the changed files listed here: run `servimg check`"
        )
    return Card(
        loc.ref,
        loc.digest,
        loc.config_digest,
        source,
        base,
        builder,
        invocation,
        overlays,
        dists,
        changes,
        tuple(_results(bound)),
        tuple(
            Signature(
                attest.artifact_kind(f.artifact_type),
                f.artifact,
                _status(f),
                f.keyids or f.hints,
            )
            for f in evidence.found
        ),
        tuple(notes),
        layer,
    )


def _from_provenance(
    p: Mapping[str, object],
) -> tuple[
    dict[str, str],
    str | None,
    dict[str, object],
    tuple[Overlay, ...],
    dict[str, str],
    tuple[ChangedFile, ...],
]:
    bases = provenance.provenance_dependencies(p, provenance.ROLE_BASE_MANIFEST)
    configs = provenance.provenance_dependencies(p, provenance.ROLE_BASE_CONFIG)
    base = {
        "ref": str(bases[0].get("uri") or bases[0].get("name")) if bases else "?",
        "manifest": f"sha256:{provenance.sha256_of(bases[0])}" if bases else "?",
        "config": f"sha256:{provenance.sha256_of(configs[0])}" if configs else "?",
    }
    patches = {
        str(jv.member(d, "annotations", "overlay")): provenance.sha256_of(d) or ""
        for d in provenance.provenance_dependencies(p, provenance.ROLE_PATCH)
    }
    definition = jv.obj(jv.member(p, "buildDefinition", "externalParameters") or {})
    dists = {
        str(d.get("name")): provenance.sha256_of(d) or ""
        for d in provenance.provenance_dependencies(p, provenance.ROLE_DIST)
    }
    invocation = dict(jv.obj(jv.member(p, "runDetails", "metadata") or {}))
    return (
        base,
        provenance.builder_of(p),
        invocation,
        _overlays(definition, patches),
        dists,
        provenance.provenance_byproducts(p),
    )


def _overlays(definition: Mapping[str, object], patches: Mapping[str, str]) -> tuple[Overlay, ...]:
    out = []
    for o in jv.seq(definition.get("overlays") or []):
        if not isinstance(o, dict):
            continue
        sentinels = tuple(_sentinel(s) for s in o.get("sentinels") or [] if isinstance(s, dict))
        out.append(
            Overlay(
                str(o.get("id")),
                str(o.get("package")),
                str(o.get("patch")),
                patches.get(str(o.get("id")), str(o.get("sha256", ""))),
                tuple(str(u) for u in o.get("upstream") or []),
                sentinels,
                str(o.get("description") or ""),
            )
        )
    return tuple(out)


def _sentinel(s: Mapping[str, object]) -> str:
    what = f"name={s.get('name')}" if s.get("name") is not None else f"const={s.get('const')!r}"
    absent = " (absent in base)" if s.get("absent_in_base") else ""
    return f"{s.get('module')}:{s.get('qualname')} {what}{absent}"


def _results(bound: Sequence[Found]) -> list[Result]:
    out = []
    for f in bound:
        statement = f.statement
        assert statement is not None
        p, trusted = statement.predicate, f.signature == "verified"
        if statement.predicate_type == attest.TEST_RESULT_V01:
            ladder = provenance.ladder_name(p)
            config = provenance.test_config(p) or {}
            passed, warned, failed = (
                len(jv.seq(p.get(k) or [])) for k in ("passedTests", "warnedTests", "failedTests")
            )
            counts = f"{passed} passed, {warned} warned, {failed} failed"
            if ladder is not None:
                verdict = str(jv.obj(config.get("annotations") or {}).get("verdict", ""))
                receipt = (provenance.sha256_of(config) or "")[:12]
                detail = f"verdict {verdict}; receipt sha256:{receipt}…; {counts}"
                out.append(Result(f"ladder:{ladder}", str(p.get("result")), detail, trusted))
            else:
                out.append(Result("verify", str(p.get("result")), counts, trusted))
        elif statement.predicate_type == attest.VSA_V1:
            levels = ", ".join(jv.texts(p.get("verifiedLevels") or []))
            detail = f"{jv.member(p, 'verifier', 'id')} at {p.get('timeVerified')}; {levels}"
            out.append(Result("vsa", str(p.get("verificationResult")), detail, trusted))
        elif statement.predicate_type == attest.CYCLONEDX_BOM:
            spec = f"CycloneDX {p.get('specVersion')}"
            out.append(Result("sbom", spec, sbom.summary(p).line(), trusted))
        elif statement.predicate_type == attest.OPENVEX_V020:
            said = [
                f"{jv.member(s, 'vulnerability', 'name')}: {s.get('status')}"
                for s in jv.seq(p.get("statements") or [])
                if isinstance(s, dict)
            ]
            out.append(Result("vex", "OpenVEX 0.2.0", "; ".join(said), trusted))
    return sorted(out, key=lambda r: (r.what, r.detail))


# ------------------------------------------------------------------------------------------------ diff


@dataclass(frozen=True)
class Difference:
    section: str
    item: str
    a: str
    b: str

    def line(self) -> str:
        return f"{self.section:<14} {self.item}: {self.a} → {self.b}"


@dataclass(frozen=True)
class Diff:
    a: Card
    b: Card
    differences: tuple[Difference, ...]

    @property
    def identical(self) -> bool:
        return not self.differences

    def text(self) -> str:
        head = f"--- {self.a.ref} {self.a.digest}\n+++ {self.b.ref} {self.b.digest}\n"
        if self.identical:
            return head + "no differences in base, overlays, dists, changed files or results\n"
        return head + "\n".join(d.line() for d in self.differences) + "\n"

    def as_dict(self) -> dict[str, object]:
        return {
            "a": {"ref": self.a.ref, "digest": self.a.digest},
            "b": {"ref": self.b.ref, "digest": self.b.digest},
            "identical": self.identical,
            "differences": [d.__dict__ for d in self.differences],
        }


def diff(a: Card, b: Card) -> Diff:
    """What differs between two cards: the images, base, overlays (patch, upstream), dists, changed files
    (as the overlay layers really hold them, when both were readable; else as listed), results."""
    out: list[Difference] = []
    _cmp(out, "image", "digest", str(a.digest), str(b.digest))
    _cmp(out, "image", "config", str(a.config_digest), str(b.config_digest))
    for key in ("ref", "manifest", "config"):
        _cmp(out, "base", key, a.base.get(key), b.base.get(key))
    _cmp(out, "builder", "id", a.builder, b.builder)
    ao, bo = {o.id: o for o in a.overlays}, {o.id: o for o in b.overlays}
    for oid in sorted(set(ao) | set(bo)):
        x, y = ao.get(oid), bo.get(oid)
        _cmp(out, "overlay", f"{oid} patch", _patch(x), _patch(y))
        if x and y:
            _cmp(out, "overlay", f"{oid} upstream", ", ".join(x.upstream), ", ".join(y.upstream))
            _cmp(out, "overlay", f"{oid} sentinels", "; ".join(x.sentinels), "; ".join(y.sentinels))
    for name in sorted(set(a.dists) | set(b.dists)):
        _cmp(out, "dist", name, a.dists.get(name), b.dists.get(name))
    real = a.layer_files is not None and b.layer_files is not None
    af = {c.path: c for c in (a.layer_files if real and a.layer_files is not None else a.changed_files)}
    bf = {c.path: c for c in (b.layer_files if real and b.layer_files is not None else b.changed_files)}
    for path in sorted(set(af) | set(bf)):
        _cmp(out, "changed file", path, _maybe_change(af.get(path)), _maybe_change(bf.get(path)))
    ar, br = _latest(a.results), _latest(b.results)
    for what in sorted(set(ar) | set(br)):
        _cmp(out, "result", what, ar.get(what), br.get(what))
    return Diff(a, b, tuple(out))


def _patch(o: Overlay | None) -> str | None:
    return f"sha256:{o.sha256[:16]}…" if o is not None else None


def _maybe_change(c: ChangedFile | None) -> str | None:
    return _change(c) if c is not None else None


def _latest(results: Sequence[Result]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in results:
        out[r.what] = r.result if r.what not in out else f"{out[r.what]}, {r.result}"
    return out


def _cmp(out: list[Difference], section: str, item: str, a: str | None, b: str | None) -> None:
    if (a or None) != (b or None):
        out.append(Difference(section, item, a or "(absent)", b or "(absent)"))
