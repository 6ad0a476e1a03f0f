"""One library function per `servimg` command, with typed parameters and a result value.

Every decision the command line used to make lives here (or in the stage module it belongs to): which
build a `--sign` asks for, the ladder's default paths and variables, the policy the flags add up to,
whether two images are compared by their files or by their provenance. `servimg.cli` only parses, turns
its arguments into one of these parameter values, calls, and renders the `Outcome`s.

A command yields one `Outcome` per target, as each finishes (a build of three definitions says OK for
the first while the second builds). A target that fails is an outcome with its error, never an
exception: the other targets still run, and the exit status counts the failures.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servimg.backends import transport
from servimg.bases import catalog as bases
from servimg.build import pipeline
from servimg.build import rebase as rebasing
from servimg.build.lock import lock_path_for
from servimg.build.seams import Seams
from servimg.build.verify import VerifyFailed, VerifyReport, verify_ref
from servimg.core.errors import ServimgError, UsageError
from servimg.core.findings import Findings
from servimg.core.progress import NULL, Log, Progress
from servimg.ladder import k8s, receipt, runner, slurm
from servimg.ladder import witness as witnesses
from servimg.ladder.definition import LadderError, LoadedLadder, load
from servimg.oci import treediff
from servimg.oci.store import BlobStore
from servimg.provenance import attach, card, keys
from servimg.provenance.attest import TEST_RESULT_V01
from servimg.provenance.check import (
    CheckFailed,
    Evidence,
    Policy,
    Rebuild,
    check,
    collect,
    locate,
    predicate_type,
)
from servimg.provenance.dsse import SigningKey

Fields = Mapping[str, object]


def _silent(message: str) -> None:
    del message


@dataclass(frozen=True)
class Context:
    """What every command runs with: the blob cache, where its steps are logged, how long transfers
    show progress, and the build's seams (chosen once by the caller)."""

    store: BlobStore
    log: Log = _silent
    progress: Progress = NULL
    seams: Seams = field(default_factory=Seams)


@dataclass(frozen=True)
class Outcome:
    """What one target gave. `fields` are the OK line's (text), `json` the --json line's where they say
    more; `findings` is drawn as a table and `explanation` printed before the line (text, not --quiet);
    `document` is the output itself (text, even --quiet); `error`, when set, makes it a FAIL."""

    target: str
    fields: Fields = field(default_factory=dict)
    json: Fields | None = None
    findings: Findings | None = None
    explanation: str = ""
    document: str = ""
    error: ServimgError | None = None
    quiet_ok: bool = False  # the document is the whole answer: no OK line after it

    @property
    def ok(self) -> bool:
        return self.error is None


BUG_HINT = "this is a bug in servimg; rerun with SERVIMG_DEBUG=1 for the traceback and report it"


def attempt(target: str, run: Callable[[], Outcome]) -> Outcome:
    """One target: its outcome, or its failure as an outcome. A non-servimg exception is a bug: still
    one FAIL, with the traceback only under SERVIMG_DEBUG."""
    try:
        return run()
    except ServimgError as exc:
        return Outcome(target, error=exc)
    except Exception as exc:
        if os.environ.get("SERVIMG_DEBUG"):
            raise
        return Outcome(
            target, error=ServimgError(f"internal error: {type(exc).__name__}: {exc}", hint=BUG_HINT)
        )


def signing_key(path: Path | None) -> SigningKey | None:
    return keys.load_signing(path) if path is not None else None


# ------------------------------------------------------------------------------------------------ build


@dataclass(frozen=True)
class Lock:
    definitions: tuple[Path, ...]
    runner: str = "auto"


def lock(p: Lock, ctx: Context) -> Iterator[Outcome]:
    for path in p.definitions:

        def run(path: Path = path) -> Outcome:
            locked, changed = pipeline.lock(path, ctx.store, ctx.log, p.runner, ctx.seams)
            fields = {"lock": str(lock_path_for(path)), "lock_digest": str(locked.digest), "changed": changed}
            return Outcome(str(path), fields)

        yield attempt(str(path), run)


@dataclass(frozen=True)
class Build:
    definitions: tuple[Path, ...]
    to: str | None = None
    runner: str = "auto"
    tag: str | None = None
    sign: Path | None = None  # a private key: attach signed provenance and the verify result
    builder_id: str | None = None


def build(p: Build, ctx: Context) -> Iterator[Outcome]:
    """Build each definition as locked; with `sign`, also push it with its signed attestations."""
    for path in p.definitions:

        def run(path: Path = path) -> Outcome:
            if p.sign is not None:
                signed = attach.build_and_push(
                    path,
                    ctx.store,
                    ctx.log,
                    to=p.to or "",
                    key=signing_key(p.sign),
                    runner=p.runner,
                    tag=p.tag,
                    builder=p.builder_id,
                    progress=ctx.progress,
                    seams=ctx.seams,
                )
                return Outcome(str(path), signed)
            built = pipeline.build(
                path,
                ctx.store,
                ctx.log,
                to=p.to,
                runner=p.runner,
                tag=p.tag,
                progress=ctx.progress,
                seams=ctx.seams,
            )
            return Outcome(str(path), built.as_dict())

        yield attempt(str(path), run)


@dataclass(frozen=True)
class Rebase:
    definition: Path
    base: str
    digest: str | None = None
    versions: tuple[str, ...] = ()  # NAME=VERSION
    drop_absorbed: bool = False
    write: bool = False
    runner: str = "auto"

    def request(self) -> rebasing.RebaseRequest:
        versions = dict(v.split("=", 1) for v in self.versions if "=" in v)
        if len(versions) != len(self.versions):
            raise UsageError("--version takes NAME=VERSION", hint="e.g. --version vllm=0.32.0")
        return rebasing.RebaseRequest(
            self.definition, self.base, self.digest, versions, self.drop_absorbed, self.write, self.runner
        )


def rebase(p: Rebase, ctx: Context) -> Iterator[Outcome]:
    """Judge a definition's overlays on a new base; write the proposed definition and lock only when the
    stack carries over cleanly (FAIL, nothing written, otherwise)."""

    def run() -> Outcome:
        result = rebasing.rebase(p.request(), ctx.store, ctx.log, ctx.seams)
        fields: dict[str, object] = {"carries": result.carries, **result.counts()}
        fields["written"] = [str(w) for w in result.written]
        return Outcome(
            str(p.definition),
            fields,
            result.as_dict(),
            result.report,
            explanation=result.text(),
            error=result.error(),
        )

    yield attempt(str(p.definition), run)


@dataclass(frozen=True)
class Verify:
    images: tuple[str, ...]
    audit: bool = False


def verify(p: Verify, ctx: Context) -> Iterator[Outcome]:
    """Run the in-image probe in each image; FAIL when any check fails."""
    for image in p.images:

        def run(image: str = image) -> Outcome:
            report = verify_ref(image, ctx.store, ctx.log, audit=p.audit)
            error = None if report.ok else VerifyFailed(report)
            return Outcome(image, {"summary": report.counts()}, report.as_dict(), report, error=error)

        yield attempt(image, run)


@dataclass(frozen=True)
class WitnessCollect:
    containers: tuple[str, ...]
    out: Path | None = None  # default witness/CONTAINER


def witness_collect(p: WitnessCollect, ctx: Context) -> Iterator[Outcome]:
    """Copy each container's witness files out; FAIL unless a process ran, and only ran, patched code."""
    for container in p.containers:

        def run(container: str = container) -> Outcome:
            collected = witnesses.collect(container, p.out or Path("witness") / container)
            return Outcome(
                container, collected.as_dict(), findings=collected.verdict(), error=collected.error()
            )

        yield attempt(container, run)


@dataclass(frozen=True)
class Ladder:
    image: str  # an IMAGE argument: its arms run as containers (resolved into the engine)
    ladder: Path | None = None  # default: the image's bundled ladder
    gpus: str | None = None
    out: Path | None = None  # default ladder-out/<ladder name>
    variables: tuple[str, ...] = ()  # NAME=VALUE
    endpoint: str | None = None  # every arm against this server instead
    attach: str | None = None  # REPO: attach the receipt there as a test-result
    key: Path | None = None
    on: str = "local"  # local | slurm | k8s (each chain of arms one job)
    slurm: slurm.SlurmOptions = field(default_factory=slurm.SlurmOptions)
    k8s: k8s.K8sOptions | None = None  # with on == "k8s"
    emit: Path | None = None  # --on k8s: the manifests' directory
    collect: Path | None = None  # the results of emitted Jobs: judge them, write the receipt
    k8s_jobs: Path | None = None  # with collect: `kubectl get jobs -o json`, for the Jobs' own states


def ladder(p: Ladder, ctx: Context) -> Iterator[Outcome]:
    """Run the smoke ladder: OK only on PASS; FAIL and NOT_EXERCISED fail (never a pass)."""

    def run() -> Outcome:
        if p.collect is not None:
            jobs = _json_file(p.k8s_jobs) if p.k8s_jobs is not None else None
            doc = k8s.collect(p.collect, p.image, ctx.log, jobs)
            return _ladder_outcome(p, doc, p.collect, "k8s", ctx)
        variables = dict(v.split("=", 1) for v in p.variables if "=" in v)
        if len(variables) != len(p.variables):
            raise UsageError("--var takes NAME=VALUE", hint="e.g. --var model_dir=/models/tiny")
        out, path = p.out, p.ladder
        # Arms and the bundled ladder need the image in the engine: a name or ID it has, else pulled in
        # (emitted Kubernetes Jobs run it on the cluster: only a bundled ladder needs it here).
        needs_engine = path is None or not (p.endpoint or p.on == "k8s")
        image = transport.in_engine(p.image, ctx.store, ctx.log) if needs_engine else p.image
        if path is None:
            out = out or Path("ladder-out") / "bundled"
            path = runner.bundled_ladder(image, out / "ladder")
        loaded = load(path)
        out = out or Path("ladder-out") / loaded.definition.name
        config = runner.RunConfig(
            None if p.endpoint else image, out, variables, p.gpus, p.endpoint, store=ctx.store
        )
        if p.on == "k8s":
            return _emit_k8s(p, loaded, config, ctx)
        if p.on == "slurm":
            doc = slurm.run(loaded, p.image, config, p.slurm, ctx.log)
        else:
            doc = runner.run(loaded, config, ctx.log)
        return _ladder_outcome(p, doc, out, p.on, ctx)

    yield attempt(p.image, run)


def _emit_k8s(p: Ladder, loaded: LoadedLadder, config: runner.RunConfig, ctx: Context) -> Outcome:
    if p.emit is None or p.k8s is None or p.out is None:
        raise UsageError(
            "--on k8s writes manifests: give --emit DIR and --out RESULTS (the results volume's path)",
            hint="servimg ladder IMAGE --on k8s --emit DIR --out /shared/run --results-claim PVC",
        )
    index = k8s.emit(loaded, p.image, config, p.k8s, p.emit, ctx.log, slurm.resolve_image)
    return Outcome(p.image, {"emitted": str(p.emit), **index})


def _ladder_outcome(p: Ladder, doc: dict[str, Any], out: Path, on: str, ctx: Context) -> Outcome:
    """OK only on PASS (FAIL and NOT_EXERCISED fail); the receipt attached when asked."""
    fields: dict[str, object] = {**runner.summary(doc), "receipt": str(out / "receipt.json")}
    if on != "local":
        fields["placement"] = doc["placement"]
    if p.attach:
        attached = attach.attest_file(
            p.image,
            TEST_RESULT_V01,
            out / "receipt.json",
            ctx.store,
            ctx.log,
            key=signing_key(p.key),
            repo=p.attach,
        )
        fields["attestation"] = attached.as_dict()
    error = None
    if doc["verdict"] != "PASS":
        error = LadderError(
            f"ladder {doc['ladder']['name']}: {doc['verdict']}",
            problems=list(doc["verdict_reasons"])[:20],
            hint=f"see {out / 'receipt.json'} and {out / 'receipt.svg'}",
        )
    return Outcome(p.image, fields, findings=receipt.verdict(doc), error=error)


def _json_file(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path}: {exc}", hint="kubectl get jobs -n NS -o json > FILE") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path} is not a JSON object", hint="kubectl get jobs -n NS -o json > FILE")
    return doc


BASES = ("demo", "test-bookworm", "test-trixie")


@dataclass(frozen=True)
class Base:
    name: str  # one of BASES
    to: tuple[str, ...] | None = None  # default: docker when an engine runs
    repin: bool = False
    workdir: Path | None = None


def base(p: Base, ctx: Context) -> Iterator[Outcome]:
    """Build a local base from its pins, or (`repin`) re-pin it deliberately."""

    def run() -> Outcome:
        if p.repin:
            return Outcome(f"{p.name}-base", bases.repin(p.name, ctx.store, ctx.log, workdir=p.workdir))
        built = bases.build_base(p.name, ctx.store, ctx.log, targets=p.to, workdir=p.workdir)
        return Outcome(f"{p.name}-base", built)

    yield attempt(f"{p.name}-base", run)


# ------------------------------------------------------------------------------------------------ provenance


@dataclass(frozen=True)
class KeyGenerate:
    out: Path
    name: str = keys.DEFAULT_NAME
    force: bool = False


def key_generate(p: KeyGenerate, ctx: Context) -> Iterator[Outcome]:
    yield attempt(
        str(p.out), lambda: Outcome(str(p.out), keys.generate(p.out, p.name, force=p.force).as_dict())
    )


@dataclass(frozen=True)
class Push:
    image: str
    dest: str
    key: Path | None = None  # unsigned without
    report: Path | None = None  # a `servimg verify --json` report to attach instead of running the probe
    builder_id: str | None = None


def push(p: Push, ctx: Context) -> Iterator[Outcome]:
    def run() -> Outcome:
        report = None
        if p.report is not None:
            report = VerifyReport.from_json(json.loads(p.report.read_bytes()))
        pushed = attach.push(
            p.image,
            p.dest,
            ctx.store,
            ctx.log,
            key=signing_key(p.key),
            report=report,
            builder=p.builder_id,
            progress=ctx.progress,
        )
        return Outcome(p.image, pushed.as_dict())

    yield attempt(p.image, run)


@dataclass(frozen=True)
class Lookup:
    """Where a ref's attestations are, and whom to trust."""

    keys: tuple[Path, ...] = ()  # trusted public keys
    repo: str | None = None  # where a local image without RepoDigests was pushed
    remote: bool = False  # the registry's image, not a pulled copy


@dataclass(frozen=True)
class Attest:
    ref: str
    predicate_type: str  # test-result | provenance | vsa | a URI
    file: Path
    key: Path | None = None
    lookup: Lookup = Lookup()


def attest(p: Attest, ctx: Context) -> Iterator[Outcome]:
    def run() -> Outcome:
        attached = attach.attest_file(
            p.ref,
            predicate_type(p.predicate_type),
            p.file,
            ctx.store,
            ctx.log,
            key=signing_key(p.key),
            repo=p.lookup.repo,
            remote=p.lookup.remote,
        )
        return Outcome(p.ref, attached.as_dict())

    yield attempt(p.ref, run)


@dataclass(frozen=True)
class PolicyFlags:
    """A policy file (or the default policy) with the command line's flags on top."""

    file: Path | None = None
    ladders: tuple[str, ...] = ()
    builders: tuple[str, ...] = ()
    threshold: int | None = None
    allow_unsigned: bool = False
    deep: bool = False  # also pull the image and run the probe in it again
    rebuilds: int | None = None  # independent rebuild attestations required
    tag_binding: str | None = None  # warn | require
    lock: Path | None = None  # the repository lock the image must be built from

    def policy(self, trusted: Sequence[Path]) -> Policy:
        loaded = Policy.load(self.file) if self.file is not None else Policy()
        return loaded.merged(
            ladders=self.ladders,
            keys=trusted,
            builders=self.builders,
            threshold=self.threshold,
            allow_unsigned=self.allow_unsigned,
            rebuilds=self.rebuilds,
            tag_binding=self.tag_binding,
            lock=self.lock,
        )


@dataclass(frozen=True)
class RebuildFlags:
    """`--rebuild [--definition PATH] [--attach]`: rebuild here; `attach` signs the result with the one
    private key among the --key files and attaches it beside the image."""

    definition: Path | None = None
    attach: bool = False
    rebuilder_id: str | None = None
    requested: bool = True  # False: only its options were given (a usage error)


@dataclass(frozen=True)
class Check:
    ref: str
    policy: PolicyFlags = PolicyFlags()
    lookup: Lookup = Lookup()
    rebuild: RebuildFlags | None = None


def check_ref(p: Check, ctx: Context) -> Iterator[Outcome]:
    """Does REF satisfy the policy? One row per requirement; FAIL when any row fails. With a rebuild
    and `attach`, its signed result is attached beside the image whatever it was."""

    def run() -> Outcome:
        if p.rebuild is not None and not p.rebuild.requested:
            raise UsageError("--definition, --attach and --rebuilder-id go with --rebuild")
        signer = _rebuild_signer(p.lookup.keys) if p.rebuild is not None and p.rebuild.attach else None
        report, evidence = check(
            p.ref,
            ctx.store,
            ctx.log,
            p.policy.policy(p.lookup.keys),
            deep=p.policy.deep,
            repo=p.lookup.repo,
            remote=p.lookup.remote,
            rebuild=Rebuild(p.rebuild.definition, ctx.seams) if p.rebuild is not None else None,
        )
        brief: dict[str, object] = {"digest": report.digest, "summary": report.counts()}
        full: dict[str, object] = dict(report.as_dict())
        if evidence.rebuild is not None:
            full["rebuild"] = evidence.rebuild.as_dict()
            brief["rebuild_seconds"] = round(evidence.rebuild.seconds, 1)
        if signer is not None and evidence.rebuild is not None and p.rebuild is not None:
            attached = attach.attest_rebuild(
                evidence.located, evidence.rebuild, signer, ctx.log, rebuilder=p.rebuild.rebuilder_id
            )
            full["attestation"] = brief["attestation"] = attached.as_dict()
        error = None if report.ok else CheckFailed(report)
        return Outcome(p.ref, brief, full, report, error=error)

    yield attempt(p.ref, run)


def _rebuild_signer(paths: Sequence[Path]) -> SigningKey:
    """The one private key among the --key files: it signs the rebuild attestation (and, as every
    --key, is trusted)."""
    found = []
    for path in paths:
        try:
            found.append(keys.load_signing(path))
        except ServimgError:
            continue  # a public key: trusted only
    if len(found) != 1:
        raise UsageError(
            f"--attach signs the rebuild with a private key: {len(found)} among the --key files",
            hint="pass exactly one --key PRIVATE_KEY (its public half is then trusted too)",
        )
    return found[0]


@dataclass(frozen=True)
class Promote:
    ref: str
    tag: str
    sign: Path | None = None  # signs the verification summary
    verifier_id: str | None = None
    policy: PolicyFlags = PolicyFlags()
    lookup: Lookup = Lookup()


def promote(p: Promote, ctx: Context) -> Iterator[Outcome]:
    """Move a promotion tag only if the policy passes, after attaching a verification summary."""

    def run() -> Outcome:
        try:
            promoted = attach.promote(
                p.ref,
                p.tag,
                ctx.store,
                ctx.log,
                p.policy.policy(p.lookup.keys),
                key=signing_key(p.sign),
                verifier=p.verifier_id,
                deep=p.policy.deep,
                repo=p.lookup.repo,
                remote=p.lookup.remote,
            )
        except CheckFailed as exc:
            return Outcome(p.ref, findings=exc.report, error=exc)
        brief = {"tag": promoted.tag, "vsa": promoted.vsa.artifact}
        return Outcome(p.ref, brief, promoted.as_dict(), promoted.report)

    yield attempt(p.ref, run)


def evidence(ref: str, lookup: Lookup, ctx: Context) -> Evidence:
    """What `show` and `diff` read: REF located, its attestations checked against the trusted keys."""
    located = locate(ref, ctx.store, ctx.log, repo=lookup.repo, remote=lookup.remote)
    return collect(located, ctx.store, ctx.log, trusted=keys.load_trusted(lookup.keys))


@dataclass(frozen=True)
class Show:
    ref: str
    markdown: bool = False
    lookup: Lookup = Lookup()


def show(p: Show, ctx: Context) -> Iterator[Outcome]:
    """The provenance card. As Markdown it is a document on stdout: no OK line after it (a FAIL line
    still says what went wrong)."""

    def run() -> Outcome:
        shown = card.card(evidence(p.ref, p.lookup, ctx))
        document = shown.markdown() if p.markdown else shown.text()
        return Outcome(
            p.ref, {"digest": shown.digest}, shown.as_dict(), document=document, quiet_ok=p.markdown
        )

    yield attempt(p.ref, run)


@dataclass(frozen=True)
class Diff:
    a: str
    b: str
    files: bool = False  # compare the images themselves, not their provenance
    limit: int = 40  # with files: changes shown per layer
    lookup: Lookup = Lookup()


def diff(p: Diff, ctx: Context) -> Iterator[Outcome]:
    """What differs between two images: their provenance cards, or (`files`) config and files layer by
    layer, in which case a difference is a FAIL."""
    target = f"{p.a} {p.b}"

    def files() -> Outcome:
        a = transport.fetch_argument(p.a, ctx.store, ctx.log)
        b = transport.fetch_argument(p.b, ctx.store, ctx.log)
        result = treediff.diff_images(a, b, ctx.store)
        if result.identical:
            return Outcome(target, {"identical": True, "digest": str(result.a)}, result.as_dict())
        explanation = "\n".join(treediff.explain(result, p.limit))
        return Outcome(target, explanation=explanation, error=treediff.ImagesDiffer(result, p.limit))

    def provenance() -> Outcome:
        a = card.card(evidence(p.a, p.lookup, ctx))
        b = card.card(evidence(p.b, p.lookup, ctx))
        result = card.diff(a, b)
        brief = {"identical": result.identical, "differences": len(result.differences)}
        return Outcome(target, brief, result.as_dict(), document=result.text())

    yield attempt(target, files if p.files else provenance)
