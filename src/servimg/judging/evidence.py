"""Where an image is and what is said about it: the first two stages of `servimg check` (I/O only here;
`judging.check` judges what this module found, by a policy).

1. `locate` resolves REF (registry tag or digest, a local engine image — e.g. after `docker pull` —, or an
   OCI layout) to exact manifest + config bytes, fetched with explicit Accept headers and re-hashed.
2. `collect` gathers evidence: the attestations (referrers API, else the `sha256-<hex>` fallback tag;
   in a layout, its index), each fetched by digest, bound to the image, its DSSE signatures tried against
   the trusted keys; the image's own statements about itself (`/opt/servimg/*` from its overlay layer,
   diffID-verified) and the changed files re-derived from that layer; with `deep`, a fresh probe run.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path

from servimg.assembly.context import Context
from servimg.backends import engine, registry, transport
from servimg.backends.referrers import Referrers
from servimg.backends.registryclient import RegistryClient
from servimg.backends.resolve import Resolved
from servimg.backends.target import (
    ArchiveTarget,
    EngineTarget,
    Holds,
    LayoutTarget,
    ReadOptions,
    RegistryTarget,
    Target,
)
from servimg.core import jsonview as jv
from servimg.core.context import Log
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, ServimgError
from servimg.core.findings import FAIL, PASS, WARN, Finding, Status
from servimg.core.parallel import map_ordered
from servimg.core.reference import Reference
from servimg.definitions.lock import Lock
from servimg.formats import cosign, cosignread, referrers
from servimg.judging import rebuild as rebuilds
from servimg.oci import integrity
from servimg.oci.image import Image
from servimg.oci.layer import diff_id_of
from servimg.proof.verify import VerifyReport, run_probe_in_docker
from servimg.signing import dsse
from servimg.statements import attest
from servimg.statements import derived as provenance
from servimg.statements.derived import ChangedFile, ImageFacts


class CheckError(ServimgError):
    """REF cannot be resolved, or the policy or keys are unusable (nothing could be evaluated)."""


# ------------------------------------------------------------------------------------------------ rows

# A row's code names the requirement it judges; the subject (`what`) may add which one.
_CODE_PREFIXES = {
    "attestation ": "ATTESTATION",
    "ladder ": "LADDER",
    "requires ": "REQUIRES",
    "fix ": "FIX",
}


def row(what: str, verdict: Status, why: str) -> Finding:
    """One row of a check (what, verdict, why) as a finding: `what` is its subject, and its code the
    requirement (`base label` → BASE_LABEL, `attestation KIND DIGEST` → ATTESTATION)."""
    code = next((c for prefix, c in _CODE_PREFIXES.items() if what.startswith(prefix)), None)
    return Finding(code or re.sub(r"\W+", "_", what).strip("_").upper(), verdict, what, why)


def row_dict(finding: Finding) -> dict[str, str]:
    """The JSON shape of a check row, as `servimg check --json` has always printed it."""
    return {"what": finding.subject, "verdict": str(finding.status), "why": finding.message}


# ------------------------------------------------------------------------------------------------ locate


@dataclass(frozen=True)
class Located:
    """REF resolved to exact, re-hashed manifest and config bytes, and where its attestations live."""

    ref: str
    place: Target  # where the image was read: the engine's copy, a registry, a layout or an archive
    image: Image
    registry: str | None = None
    repository: str | None = None
    layout: Path | None = None
    notes: tuple[Finding, ...] = ()

    @property
    def digest(self) -> Digest:
        return self.image.digest

    @property
    def config_digest(self) -> Digest:
        return self.image.config_digest

    @property
    def name(self) -> str:
        if self.registry and self.repository:
            return f"{self.registry}/{self.repository}"
        return str(self.layout or self.ref)

    def referrers(self) -> AbstractContextManager[Referrers]:
        """Where its attestations live (`transport.referrers`): its layout, or its registry repository."""
        if self.layout is not None:
            return transport.referrers(Target.layout(self.layout))
        if self.registry is None or self.repository is None:
            raise CheckError(f"{self.ref} has no registry location", hint="push it with `servimg push`")
        return transport.referrers(Target.parse(f"{self.registry}/{self.repository}"))

    def client(self) -> RegistryClient:
        if self.registry is None or self.repository is None:
            raise CheckError(f"{self.ref} has no registry location", hint="push it with `servimg push`")
        return RegistryClient(self.registry)


def place_of(ref: str, log: Log, *, remote: bool = False) -> Resolved:
    """Where REF points, resolved once (`check` asks whether it names an index and then judges it from
    this one answer): as docker would (`transport.resolve`), a name or (short) ID the local engine holds
    (`docker pull`ed) being the local image; with `remote`, a REF written without its transport is the
    registry's."""
    if remote and not transport.is_explicit(ref):
        return Resolved(ref, RegistryTarget(ref), "as written", None)  # --remote: the registry's, as asked
    return transport.resolve(ref, log)


def locate(found: Resolved, ctx: Context, *, repo: str | None = None) -> Located:
    """The image where REF resolved (`place_of`), its manifest and config re-hashed; `repo` says where
    to look for a local image without RepoDigests."""
    return _LOCATORS[type(found.target)](found, ctx, repo)


def locate_ref(ref: str, ctx: Context, *, repo: str | None = None, remote: bool = False) -> Located:
    """`locate` of REF as typed (`place_of`)."""
    return locate(place_of(ref, ctx.log, remote=remote), ctx, repo=repo)


def _in_engine(found: Resolved, ctx: Context, repo: str | None) -> Located:
    name = found.target.location
    # `docker-daemon:NAME` asks for the engine's copy itself; a bare NAME:TAG is what a node pulls.
    located = _locate_engine(name, name, repo, ctx, as_pulled=not found.explicit)
    if located is None:
        raise CheckError(f"the Docker Engine has no image {found.text!r}", hint="docker pull it first")
    return located


def _in_registry(found: Resolved, ctx: Context, repo: str | None) -> Located:
    with transport.said_where(found):
        return _locate_registry(found.target.location, ctx.log)


def _in_layout(found: Resolved, ctx: Context, repo: str | None) -> Located:
    return _locate_layout(found.ref, found.target, ctx)


def _in_archive(found: Resolved, ctx: Context, repo: str | None) -> Located:
    # It holds the image but no attestations: read it, so every row can say what is missing.
    image = transport.fetch(found.ref, ctx)
    what = f"{found.target.described}: attestations cannot live there"
    note = row("image", WARN, f"{found.ref}: {image.digest} ({what})")
    return Located(found.ref, found.target, image, notes=(note,))


# Where an image is read from, by the kind of place REF resolved to.
_LOCATORS: dict[type[Target], Callable[[Resolved, Context, str | None], Located]] = {
    EngineTarget: _in_engine,
    RegistryTarget: _in_registry,
    LayoutTarget: _in_layout,
    ArchiveTarget: _in_archive,
}


def _locate_registry(ref_text: str, log: Log) -> Located:
    ref = Reference.parse(ref_text)
    with RegistryClient(ref.registry) as client:
        image, media_type = registry.read_image(client, ref.repository, ref.reference)
    log(f"{ref_text} → {image.digest}")
    note = row(
        "image",
        PASS,
        f"{ref} is {image.digest} ({media_type}; manifest and config re-hashed); "
        f"config {image.config_digest}",
    )
    return Located(ref_text, RegistryTarget(str(ref)), image, ref.registry, ref.repository, notes=(note,))


def _locate_engine(
    ref: str, name: str, repo_hint: str | None, ctx: Context, *, as_pulled: bool = True
) -> Located | None:
    log = ctx.log
    try:
        attrs = engine.inspect(name)
    except BackendError:  # no engine, or it lacks the image
        return None
    image_id = Digest.parse(jv.text(attrs["Id"], "Id"))
    wanted = _name_of(ref)
    hint_name = _name_of(repo_hint) if repo_hint else None
    candidates = sorted(
        (Reference.parse(text) for text in jv.texts(attrs.get("RepoDigests") or [], "RepoDigests")),
        key=lambda r: (r.name != wanted, r.name != hint_name, str(r)),
    )
    # A gate judges what a node would pull (issue 48): for a tag in a registry, the registry's answer is
    # the subject, and the engine's copy stands for it only when it is the same image.
    answer = _registry_answer(ref, image_id, candidates, log) if as_pulled else None
    if answer is not None:
        return answer
    notes: list[Finding] = []
    for candidate in candidates:
        assert candidate.digest is not None
        try:
            # One retry: a RepoDigest can name a registry long gone; that is a note, not a wait.
            with RegistryClient(candidate.registry, retries=1, backoff=0.2) as client:
                image, _ = registry.read_image(client, candidate.repository, str(candidate.digest))
        except ServimgError as exc:
            notes.append(row("image", WARN, f"{candidate}: not usable: {exc.message}"))
            continue
        if image.config_digest != image_id:
            notes.append(row("image", FAIL, f"{candidate} has config {image.config_digest}, not {image_id}"))
            continue
        log(f"local image {image_id.short} = {candidate}")
        notes.append(
            row(
                "image",
                PASS,
                f"local image {image_id} is {candidate.name}@{image.digest} (from its RepoDigests; "
                "the registry's manifest re-hashed, its config is the local image ID)",
            )
        )
        return Located(
            ref, Target.engine_image(ref), image, candidate.registry, candidate.repository, notes=tuple(notes)
        )
    if repo_hint:
        found = _scan_by_config(repo_hint, image_id, log)
        if found is not None:
            image, tag, hinted = found
            note = row(
                "image",
                PASS,
                f"local image {image_id} has no RepoDigests; matched by config digest to "
                f"{hinted.name}:{tag} = {image.digest}",
            )
            return Located(
                ref, Target.engine_image(ref), image, hinted.registry, hinted.repository, notes=(*notes, note)
            )
    # Nowhere to look for attestations: still read the image itself (its lock, its changed files), so
    # every row can say what is missing and why.
    log(f"local image {image_id.short} has no registry location; reading it from the engine")
    image = transport.fetch(Target.engine_image(str(image_id)).text(), ctx)
    searched = f"; nothing in {repo_hint} has config {image_id}" if repo_hint else ""
    notes.append(
        row(
            "image",
            WARN,
            f"local image {image_id} (manifest {image.digest} as re-created from `docker save`) has no "
            f"usable registry location (RepoDigests){searched}: attestations cannot be looked up; "
            "pass --repo HOST/REPO where it was pushed, it is then matched by config digest",
        )
    )
    return Located(ref, Target.engine_image(ref), image, notes=tuple(notes))


def _name_of(ref: str | None) -> str | None:
    if not ref:
        return None
    try:
        return Reference.parse(ref).name
    except ServimgError:
        return None


def _registry_tag(ref: str, pulled_from: Sequence[Reference]) -> Reference | None:
    """The registry tag REF names, when a node would pull it from a registry: a `NAME:TAG` whose registry
    is written (`host[:port]/…`, docker's rule) or whose engine copy came from there (a RepoDigest of the
    same name). A bare local name (`servimg/vllm:TAG`, never pushed) is the engine's alone."""
    try:
        parsed = Reference.parse(ref)
    except ServimgError:
        return None
    if parsed.tag is None or parsed.digest is not None:
        return None
    first, slash, _ = ref.partition("/")
    written = bool(slash) and ("." in first or ":" in first or first == "localhost")
    if written or any(candidate.name == parsed.name for candidate in pulled_from):
        return parsed
    return None


def _registry_answer(ref: str, image_id: Digest, candidates: Sequence[Reference], log: Log) -> Located | None:
    """REF as the registry serves it now, when REF is a registry tag (`_registry_tag`): the engine's copy
    when it is that image, else the registry's image with a FAIL naming both digests (the engine holds
    a stale pull). None when REF names no registry tag or the registry cannot be asked (the engine's copy
    is then judged, and its rows say where it came from)."""
    tagged = _registry_tag(ref, candidates)
    if tagged is None or tagged.tag is None:
        return None
    try:
        with RegistryClient(tagged.registry, retries=1, backoff=0.2) as client:
            head = client.head_manifest(tagged.repository, tagged.tag)
            if head is None:
                return _tag_gone(ref, tagged, image_id, candidates)
            image, media_type = registry.read_image(client, tagged.repository, str(head[0]))
    except ServimgError as exc:
        log(f"{ref}: the registry could not be asked ({exc.message}); judging the engine's copy")
        return None
    where = (tagged.registry, tagged.repository)
    if image.config_digest == image_id:
        log(f"local image {image_id.short} = {tagged} ({image.digest}, the registry's answer)")
        note = row(
            "image",
            PASS,
            f"{tagged} is {image.digest} in the registry ({media_type}; manifest re-hashed), and the "
            f"engine's copy is that image (its config {image_id} is the local image ID)",
        )
        return Located(ref, Target.engine_image(ref), image, *where, notes=(note,))
    log(f"{ref}: the registry serves {image.digest}; the engine's copy {image_id.short} is another image")
    stale = row(
        "registry tag",
        FAIL,
        f"{tagged} is {image.digest} in the registry (config {image.config_digest}), but the engine's "
        f"copy is {_engine_copy(tagged, image_id, candidates)}: judged the registry's image, which is "
        f"what a node pulls; `docker pull {tagged}` refreshes the engine's copy",
    )
    read = row("image", PASS, f"{tagged} is {image.digest} ({media_type}; manifest and config re-hashed)")
    return Located(ref, RegistryTarget(str(tagged)), image, *where, notes=(read, stale))


def _engine_copy(tagged: Reference, image_id: Digest, candidates: Sequence[Reference]) -> str:
    pulled = [c for c in candidates if c.name == tagged.name and c.digest is not None]
    if pulled:
        return f"{pulled[0].name}@{pulled[0].digest} (image ID {image_id})"
    return f"image ID {image_id}"


def _tag_gone(
    ref: str, tagged: Reference, image_id: Digest, candidates: Sequence[Reference]
) -> Located | None:
    """The registry has no such tag. A copy pulled from there names an image no node can pull any more:
    FAIL. An image only built into the engine under a registry name is judged as the engine's copy."""
    if not any(c.name == tagged.name for c in candidates):
        return None
    raise CheckError(
        f"{tagged} is not in the registry any more (the engine's copy is "
        f"{_engine_copy(tagged, image_id, candidates)}): a node cannot pull it",
        hint=f"check the tag that is deployed, or `servimg check docker-daemon:{ref}` for the engine's copy",
    )


def _scan_by_config(repo_text: str, image_id: Digest, log: Log) -> tuple[Image, str, Reference] | None:
    hinted = Reference.parse(repo_text)
    with RegistryClient(hinted.registry) as client:
        for tag in sorted(client.list_tags(hinted.repository)):
            if tag.startswith("sha256-"):
                continue  # referrers fallback indexes
            try:
                image, _ = registry.read_image(client, hinted.repository, tag)
            except ServimgError:
                continue
            if image.config_digest == image_id:
                log(f"local image {image_id.short} matches {hinted.name}:{tag} by config digest")
                return image, tag, hinted
    return None


def _locate_layout(ref: str, target: Target, ctx: Context) -> Located:
    root = Path(target.location)
    # Without a tag the layout backend picks its one image (attestations beside it are no candidates).
    image = transport.fetch(ref, ctx, rehash=True)
    note = row(
        "image", PASS, f"OCI layout {root}: {image.digest} (blobs re-hashed); config {image.config_digest}"
    )
    return Located(ref, target, image, layout=root, notes=(note,))


# ------------------------------------------------------------------------------------------------ collect


@dataclass(frozen=True)
class Found:
    """One attestation as discovered, fetched and signature-checked (facts; the policy judges)."""

    artifact: str
    artifact_type: str
    via: str
    envelope: dsse.Envelope | None = None
    problem: str | None = None
    signature: str = "unchecked"  # verified | unsigned | no-keys | untrusted | forged | threshold
    keyids: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()
    statement: attest.Statement | None = None
    statement_problem: str | None = None
    created: str | None = None
    forms: tuple[str, ...] = ("oci",)  # where it was found: formats.cosign.FORMATS

    @property
    def found_as(self) -> str:
        return ", ".join(cosign.FORMAT_NAMES.get(f, f) for f in self.forms)

    @property
    def short(self) -> str:
        return self.artifact.removeprefix("sha256:")[:12]


@dataclass(frozen=True)
class Evidence:
    located: Located
    found: tuple[Found, ...]
    discovery: str
    facts: ImageFacts | None
    facts_problem: str | None
    layer_changes: tuple[ChangedFile, ...] | None
    trusted: tuple[str, ...]  # keyids of the trusted keys
    threshold: int
    deep: VerifyReport | None = None  # a fresh probe run
    deep_problem: str | None = None
    typed_trust: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (predicate type, keyids trusted for it)
    lock_file: tuple[str, Lock] | None = None  # `--lock FILE`: the lock the image must be built from
    rebuild: rebuilds.Rebuilt | None = None  # `--rebuild`: this machine's rebuild
    signatures: tuple[cosignread.CosignSignature, ...] = ()  # cosign's `.sig` layers, each verified


def collect(
    located: Located,
    ctx: Context,
    *,
    trusted: Sequence[dsse.VerifyKey] = (),
    threshold: int = 1,
    deep: bool = False,
) -> Evidence:
    """Every fact `evaluate` needs, fetched and verified; nothing here decides PASS or FAIL. `deep`: a
    fresh probe run by the context's verifier seam."""
    if trusted and threshold > len(set(trusted)):
        raise CheckError(
            f"threshold {threshold} exceeds the {len(set(trusted))} distinct trusted key(s)",
            hint="pass more --key files or lower --threshold",
        )
    found, discovery, signatures = _attestations(located, trusted, threshold)
    facts: ImageFacts | None = None
    facts_problem = None
    changes = None
    try:
        top = top_layer(located.image, ctx, located)
        facts = provenance.read_facts(top)
        changes = provenance.layer_changes(top)
    except ServimgError as exc:
        facts_problem = exc.message
    report, deep_problem = _deep(located, ctx) if deep else (None, None)
    return Evidence(
        located,
        tuple(found),
        discovery,
        facts,
        facts_problem,
        changes,
        tuple(sorted(k.keyid for k in set(trusted))),
        threshold,
        report,
        deep_problem,
        signatures=signatures,
    )


def attestations_only(
    located: Located, trusted: Sequence[dsse.VerifyKey] = (), threshold: int = 1, *, signatures: bool = True
) -> Evidence:
    """The attestations of `located`, fetched and signature-checked, and nothing else: no layer is read
    (`servimg matrix` answers from the signed statements alone, and needs no `.sig`: `signatures=False`)."""
    found, discovery, signed = _attestations(located, trusted, threshold, signatures=signatures)
    return Evidence(
        located,
        tuple(found),
        discovery,
        None,
        "not read: only the attestations were",
        None,
        tuple(sorted(k.keyid for k in set(trusted))),
        threshold,
        signatures=signed,
    )


def top_layer(image: Image, ctx: Context, source: Located | None = None) -> Path:
    """The image's top (overlay) layer, uncompressed, verified against the config's diffID; fetched from
    `source`'s registry when the store lacks it."""
    store, log = ctx.store, ctx.log
    layers = image.layers
    if not layers:
        raise CheckError("the image has no layers")
    top = layers[-1]
    blob = store.path(top.descriptor.digest)
    if store.has(top.descriptor.digest) and not integrity.matches(blob, top.descriptor.digest):
        log(f"the cached overlay layer {top.descriptor.digest.short} does not match its digest; removed")
        store.evict(top.descriptor.digest)  # a store copy altered at rest: fetched again, never relied on
    if not store.has(top.descriptor.digest):
        if source is None or source.registry is None or source.repository is None:
            raise CheckError(f"layer {top.descriptor.digest} is not available")
        log(f"fetching the overlay layer {top.descriptor.digest.short}")
        with source.client() as client:
            client.download_blob(source.repository, top.descriptor.digest, blob)
    path = store.uncompressed(top.descriptor.digest, top.diff_id)
    if path == store.path(top.descriptor.digest) and top.descriptor.digest != top.diff_id:
        actual = diff_id_of(path)
        if actual != top.diff_id:
            raise CheckError(f"the overlay layer is {actual}, the config says diffID {top.diff_id}")
    return path


def _attestations(
    located: Located, trusted: Sequence[dsse.VerifyKey], threshold: int, *, signatures: bool = True
) -> tuple[list[Found], str, tuple[cosignread.CosignSignature, ...]]:
    """Every attestation in every format (servimg's referrers, sigstore bundles, cosign's `.att`), one
    `Found` per statement (`merged`), and cosign's simple signatures of the manifest."""
    subject = located.digest
    if located.layout is None and located.repository is None:
        return [], "nowhere (no registry location, no layout)", ()
    with located.referrers() as place:
        descriptors, via = place.discover(subject)
        entries = cosignread.listed(place, subject, descriptors, via)
        found = map_ordered(
            lambda e: replace(found_from(e.descriptor, e.via, e.fetch, trusted, threshold), forms=(e.form,)),
            entries,
        )
        signed = cosignread.signatures(place, subject, trusted) if signatures else ()
    tags = sorted({e.via for e in entries if e.form == cosignread.ATT})
    return merged(found), "; ".join([via, *tags]), signed


# The better of two copies of one statement: the one whose signature verified, then unsigned, …
_ORDER = {form: i for i, form in enumerate(cosign.FORMATS)}
_RANK = {"verified": 0, "unsigned": 1, "no-keys": 2, "threshold": 3, "untrusted": 4, "forged": 5}


def merged(found: Sequence[Found]) -> list[Found]:
    """One `Found` per envelope however many formats carry it: copies of one statement (a referrer, an
    `.att` layer, a bundle of one of its signatures) whose signatures are the same, or one a subset of
    the other's, are one piece of evidence, kept as the best-verified copy and listing every format it
    was found in. Copies signed differently (unsigned beside signed, another key's) stay apart, each
    judged and reported as before. What could not be read stays as it is, each reported."""
    clusters: list[list[Found]] = []
    out: list[Found] = []
    for f in found:
        if f.envelope is None:
            out.append(f)
            continue
        home = next((c for c in clusters if _same_envelope(c[0], f)), None)
        if home is None:
            clusters.append([f])
        else:
            home.append(f)
            home.sort(key=lambda x: -len(_signatures(x)))  # the widest signature set leads its cluster
    for copies in clusters:
        # The best-verified copy; of equals, the one in servimg's own format (its artifact is named).
        best = min(copies, key=lambda f: (_RANK.get(f.signature, 9), _ORDER.get(f.forms[0], 9)))
        forms = tuple(sorted({form for f in copies for form in f.forms}, key=lambda x: _ORDER.get(x, 9)))
        out.append(replace(best, forms=forms))
    return out


def _signatures(f: Found) -> frozenset[bytes]:
    return frozenset(s.sig for s in f.envelope.signatures) if f.envelope is not None else frozenset()


def _same_envelope(a: Found, b: Found) -> bool:
    if a.envelope is None or b.envelope is None:
        return False
    if (a.envelope.payload_type, a.envelope.payload) != (b.envelope.payload_type, b.envelope.payload):
        return False
    mine, theirs = _signatures(a), _signatures(b)
    return mine == theirs or bool(mine and theirs and (mine <= theirs or theirs <= mine))


def found_from(
    descriptor: Mapping[str, object],
    via: str,
    fetch: Callable[[Digest], bytes],
    trusted: Sequence[dsse.VerifyKey],
    threshold: int,
) -> Found:
    """Fetch one listed attestation (`fetch` re-hashes and checks its binding), classify its signatures,
    and parse the statement only when it is signed by trusted keys or carries no signature at all."""
    artifact = str(descriptor.get("digest"))
    created = jv.member(descriptor, "annotations", referrers.ANNOTATION_CREATED)
    created = created if isinstance(created, str) else None
    base = Found(artifact, str(descriptor.get("artifactType") or "?"), via, created=created)
    try:
        data = fetch(Digest.parse(artifact))
        envelope = dsse.Envelope.parse(data)
    except referrers.ReferrersError as exc:
        problem = exc.message + (": " + "; ".join(exc.problems) if exc.problems else "")
        if "is not an attestation of" in exc.message:
            problem += " (a stale or swapped referrers index: the entry is bound to another image)"
        return replace(base, problem=problem)
    except ServimgError as exc:
        return replace(base, problem=exc.message)
    hints = tuple(sorted({s.keyid for s in envelope.signatures if s.keyid}))
    status, keyids = _signature(envelope, trusted, threshold)
    found = replace(base, envelope=envelope, signature=status, keyids=keyids, hints=hints)
    if status not in ("verified", "unsigned", "no-keys"):
        return found  # unauthenticated bytes are not interpreted
    if envelope.payload_type != attest.PAYLOAD_TYPE:
        return replace(found, statement_problem=f"payloadType {envelope.payload_type!r} is not in-toto")
    try:
        return replace(found, statement=attest.parse_statement(envelope.payload))
    except attest.AttestationError as exc:
        return replace(found, statement_problem="; ".join([exc.message, *exc.problems]))


def _signature(
    envelope: dsse.Envelope, trusted: Sequence[dsse.VerifyKey], threshold: int
) -> tuple[str, tuple[str, ...]]:
    return _signature_of(envelope, tuple(trusted), threshold)


# One statement reaches `check` and the matrix in up to three formats (a referrer, an `.att` layer, a
# bundle's envelope): each signature is verified once per process. The key is every input of the answer
# (the envelope's bytes, the keys, the threshold), so the answer is the one a fresh verification gives.
@functools.lru_cache(maxsize=4096)
def _signature_of(
    envelope: dsse.Envelope, trusted: tuple[dsse.VerifyKey, ...], threshold: int
) -> tuple[str, tuple[str, ...]]:
    if not envelope.signatures:
        return "unsigned", ()
    if not trusted:
        return "no-keys", ()
    result = dsse.verify(envelope, trusted, threshold)
    if result.verified:
        return "verified", result.keyids
    if result.keyids:
        return "threshold", result.keyids
    claimed = {s.keyid for s in envelope.signatures if s.keyid}
    # keyids are hints: they never decide trust, only which of two true explanations the message gives.
    return ("forged" if claimed & {k.keyid for k in trusted} else "untrusted"), ()


def _deep(located: Located, ctx: Context) -> tuple[VerifyReport | None, str | None]:
    """Pull the whole image and run the probe in it again, by the verifier seam (an image the engine holds:
    in a container of it, as `servimg verify` does). From a registry every blob is fetched from it and
    hashed, whatever the local store holds: what the registry serves is what a `docker pull` gets."""
    log = ctx.log
    try:
        if located.place.holds(Holds.RUNNABLE):
            log(f"running the probe in the local image {located.config_digest.short}")
            return VerifyReport.from_json(run_probe_in_docker(str(located.config_digest))), None
        if located.registry is not None:  # the registry's image: what a node pulls
            ref = f"{located.name}@{located.digest}"
            registry.pull(ref, ctx, ReadOptions(expected=located.digest, rehash=True))
        report = ctx.seams.verifier.report(located.image, ctx, base_config=None, whole_image=True)
        return report, None
    except ServimgError as exc:
        return None, exc.message
