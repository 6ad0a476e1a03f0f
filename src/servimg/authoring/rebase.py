"""`servimg rebase`: carry a definition's overlay stack onto a new base, and say per overlay what happens.

Each overlay, in declared order, gets one verdict with its evidence (docs/rebase.md):

- APPLIES: every hunk's old lines (context and removed) match the new base byte for byte at the declared
  line. APPLIES_AT_OFFSET: they all match byte for byte, some at another line (the hunks and offsets are
  listed). An offset is not fuzz: no context line is ever dropped or loosened, hunks stay in order and never
  overlap, a hunk whose context stops at the file's start or end stays anchored there, and of several exact
  places the nearest to the declared line wins (the number of places is reported when it is more than one).
  These are the overlay engine's own rules (`servimg.patching.overlay`); the rebase reuses them, it has none.
- ABSORBED: the new base already carries the change. Evidence is either the reverse patch applying to the
  new base under the same rules (the patched text is there), or every discriminating sentinel of the
  overlay (`absent_in_base: true`) being present in the new base's code for its qualname (upstream adopted
  the change in its own words, so no text matches; the sentinel is what the overlay promised to prove).
- CONFLICTS: some hunk's old lines match nowhere; each failing hunk is shown with the new base's lines
  where it should have gone, so the user can re-author it.
- TARGET_GONE: a file the overlay changes, a module its sentinels name, or (when it does not apply) the
  qualname a sentinel names and the class holding it, no longer exist in the new base.

Overlays stack: each is judged on the new base plus the earlier overlays that carry over; sentinels are
judged on the new base alone (what `servimg lock` checks). The proposed definition and lock are computed
in full (the lock by the same `resolve` a build runs, for every platform the definition builds) before
anything is written, and only when the stack carries over cleanly: every overlay applies, or is absorbed
and dropped (`drop_absorbed`). A multi-platform definition is judged on this host's platform's child of
the new index (else its first platform's); the lock then resolves each platform and refuses one where
the stack does not apply.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from servimg.assembly import basescan, pipeline
from servimg.assembly.context import Context
from servimg.authoring.defedit import definition_text, scratch_definition
from servimg.backends import transport
from servimg.backends.target import Holds
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest
from servimg.core.errors import OverlayError, RebaseError, ServimgError
from servimg.core.findings import FAIL, PASS, WARN, Finding, Findings, Status
from servimg.definitions.definition import (
    BaseSpec,
    ImageDefinition,
    OverlaySpec,
    PackageSpec,
    Sentinel,
    repo_root_for,
)
from servimg.definitions.lock import lock_path_for
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.patching.overlay import AppliedFile, Reader, apply_file, apply_patch, exact_matches, place_hunks
from servimg.patching.patch import FilePatch, Patch, split_lines
from servimg.proof.sentinels import base_sentinel_lookups, module_sources, sentinel_elsewhere, sentinel_key

SHOWN_LINES = 12  # at most this many of the new base's lines per conflicting hunk


class Verdict(StrEnum):
    APPLIES = "APPLIES"
    APPLIES_AT_OFFSET = "APPLIES_AT_OFFSET"
    ABSORBED = "ABSORBED"
    CONFLICTS = "CONFLICTS"
    RELOCATED = "RELOCATED"
    TARGET_GONE = "TARGET_GONE"


CARRIED = frozenset({Verdict.APPLIES, Verdict.APPLIES_AT_OFFSET})


@dataclass(frozen=True)
class HunkEvidence:
    """One hunk of an overlay on the new base: where it was declared, where it matched (1-based lines),
    and, when it matched nowhere, why and the new base's lines where it should have gone."""

    path: str
    number: int
    declared: int
    at: int | None
    matches: int = 1
    problem: str = ""
    base_lines: tuple[tuple[int, str], ...] = ()

    @property
    def offset(self) -> int:
        return 0 if self.at is None else self.at - self.declared

    def line(self) -> str:
        if self.at is None:
            return f"{self.path}: hunk {self.number} (declared at line {self.declared}): {self.problem}"
        where = f"at line {self.at}" + (f", offset {self.offset:+d}" if self.offset else "")
        many = (
            f"; its lines occur at {self.matches} places, the nearest was taken" if self.matches > 1 else ""
        )
        return f"{self.path}: hunk {self.number} (declared at line {self.declared}) {where}{many}"

    def as_dict(self) -> dict[str, object]:
        return {
            "path": self.path,
            "hunk": self.number,
            "declared_line": self.declared,
            "line": self.at,
            "offset": self.offset,
            "matches": self.matches,
            "problem": self.problem,
            "base_lines": [{"line": n, "text": t} for n, t in self.base_lines],
        }


@dataclass(frozen=True)
class OverlayVerdict:
    """The verdict on one overlay and the evidence it rests on."""

    id: str
    verdict: Verdict
    evidence: tuple[str, ...]
    hunks: tuple[HunkEvidence, ...] = ()
    sentinels: Mapping[str, bool] = field(default_factory=dict)  # discriminating sentinel → in new base
    reverse_applies: bool = False
    dropped: bool = False
    fixes_in_base: tuple[str, ...] = ()  # ABSORBED: what the overlay fixed, now in the base itself
    # RELOCATED: the command that proves the fix is in the new base (the definition's ladder on it)
    proof: str = ""

    @property
    def carried(self) -> bool:
        return self.verdict in CARRIED or (self.verdict == Verdict.ABSORBED and self.dropped)

    def finding(self) -> Finding:
        status: Status = PASS if self.verdict in CARRIED else WARN if self.carried else FAIL
        hint = {
            Verdict.ABSORBED: ""
            if self.dropped
            else "rerun with --drop-absorbed to leave it out of the stack",
            Verdict.CONFLICTS: "re-author the patch against the new base's lines shown (never fuzz)",
            Verdict.RELOCATED: "drop the overlay once the same ladder passes on the new base: "
            + (self.proof or "servimg ladder NEW-BASE --ladder <the definition's ladder>")
            + "; if it fails, re-author the patch against the lines shown",
            Verdict.TARGET_GONE: "upstream moved or removed the code: re-author the overlay or drop it",
        }.get(self.verdict, "")
        message = "; ".join(self.evidence) + (" (dropped)" if self.dropped else "")
        return Finding(self.verdict.value, status, self.id, message, hint, {"verdict": self.as_dict()})

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "verdict": self.verdict.value,
            "evidence": list(self.evidence),
            "hunks": [h.as_dict() for h in self.hunks],
            "sentinels": dict(sorted(self.sentinels.items())),
            "reverse_applies": self.reverse_applies,
            "dropped": self.dropped,
            **({"fixes_in_base": list(self.fixes_in_base)} if self.fixes_in_base else {}),
            **({"proof": self.proof} if self.proof else {}),
        }

    def report(self) -> str:
        """The verdict for people: the evidence, then each hunk (conflicting ones with the base's lines)."""
        lines = [f"{self.id}: {self.verdict.value}" + (" (dropped)" if self.dropped else "")]
        lines += [f"    {e}" for e in self.evidence]
        if self.verdict != Verdict.ABSORBED:
            for hunk in self.hunks:
                lines.append(f"    - {hunk.line()}")
                lines += [f"        {n:>6} | {t}" for n, t in hunk.base_lines]
        return "\n".join(lines)


class RebaseReport(Findings):
    """The verdicts of one rebase, one finding per overlay in declared order."""

    counted = (PASS, WARN, FAIL)

    def title(self) -> str:
        return "overlays on the new base"


@dataclass(frozen=True)
class NewBase:
    """The base the stack moves to: ref and manifest digest, its layers, and the packages it installs."""

    ref: str
    digest: Digest
    image: Image
    fs: LayeredFS
    versions: Mapping[str, str]  # import name → version found in the new base
    sites: Mapping[str, str]  # import name → site-packages (no leading '/')


@dataclass(frozen=True)
class RebaseRequest:
    """What `servimg rebase` asks: the definition, the new base, and what to do with the result."""

    definition: Path
    base: str
    digest: Digest | None = None
    versions: Mapping[str, str] = field(default_factory=dict)  # import name → required new version
    drop_absorbed: bool = False
    write: bool = False  # in place, instead of <name>.rebased.yaml beside it
    runner: str = "auto"


@dataclass(frozen=True)
class RebaseResult:
    definition_path: Path
    base_ref: str
    base_digest: Digest
    packages: Mapping[str, tuple[str, str]]  # import name → (old version, new version)
    verdicts: tuple[OverlayVerdict, ...]
    written: tuple[Path, ...] = ()
    lock_digest: Digest | None = None

    @property
    def carries(self) -> bool:
        return all(v.carried for v in self.verdicts)

    @property
    def report(self) -> RebaseReport:
        return RebaseReport(tuple(v.finding() for v in self.verdicts))

    def counts(self) -> dict[str, int]:
        return {v.value: sum(1 for o in self.verdicts if o.verdict == v) for v in Verdict}

    def text(self) -> str:
        moved = ", ".join(
            f"{name} {a} → {b}" if a != b else f"{name} {a} (unchanged)"
            for name, (a, b) in sorted(self.packages.items())
        )
        head = [f"rebase {self.definition_path} onto {self.base_ref} ({self.base_digest})"]
        head += [f"packages: {moved}"] if moved else []
        return "\n".join(head + [v.report() for v in self.verdicts])

    def as_dict(self) -> dict[str, object]:
        return {
            "definition": str(self.definition_path),
            "base": {"ref": self.base_ref, "digest": str(self.base_digest)},
            "packages": {n: {"from": a, "to": b} for n, (a, b) in sorted(self.packages.items())},
            "carries": self.carries,
            "counts": self.counts(),
            "overlays": [v.as_dict() for v in self.verdicts],
            "written": [str(p) for p in self.written],
            "lock_digest": None if self.lock_digest is None else str(self.lock_digest),
        }

    def error(self) -> RebaseFailed | None:
        return None if self.carries else RebaseFailed(self)


class RebaseFailed(RebaseError):
    """The stack does not carry over cleanly; carries the verdicts (in --json too)."""

    def __init__(self, result: RebaseResult) -> None:
        stuck = [v for v in result.verdicts if not v.carried]
        absorbed_only = all(v.verdict == Verdict.ABSORBED for v in stuck)
        relocated = [v for v in stuck if v.verdict == Verdict.RELOCATED]
        hint = (
            "rerun with --drop-absorbed to leave the absorbed overlays out"
            if absorbed_only
            else f"prove the relocated fix on the new base first: {relocated[0].proof}; drop "
            f"{', '.join(v.id for v in relocated)} from the definition once it passes"
            if relocated
            else "re-author the conflicting overlays against the new base (see the lines shown), then rerun"
        )
        super().__init__(
            f"the overlay stack does not carry over onto {result.base_ref} cleanly "
            f"({len(stuck)} overlay(s)); nothing was written",
            problems=[f"{v.id}: {v.verdict.value}" for v in stuck],
            hint=hint,
        )
        self.result = result

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "rebase": self.result.as_dict()}


# ------------------------------------------------------------------------------------------------ judging


def judge_stack(
    definition: ImageDefinition,
    repo_root: Path,
    new: NewBase,
    *,
    drop_absorbed: bool = False,
) -> tuple[OverlayVerdict, ...]:
    """Every overlay's verdict on `new`, in declared order, each on top of the earlier ones that carry."""
    changes: dict[str, bytes | None] = {}  # image path (no '/') → content after the carried overlays
    verdicts = []
    for spec in definition.overlays:
        site = new.sites[spec.package]

        def read(rel: str, site: str = site) -> bytes | None:
            path = new.fs.resolve(f"{site}/{rel}")
            return changes[path] if path in changes else new.fs.read_or_none(path)

        patch = _load_patch(spec, repo_root)
        verdict = judge(
            spec,
            patch,
            read,
            lambda p: new.fs.read_or_none(p.lstrip("/")),
            list(new.sites.values()),
            proof=_ladder_command(definition, new),
        )
        if verdict.verdict == Verdict.ABSORBED and drop_absorbed:
            verdict = dataclasses.replace(verdict, dropped=True)
        if verdict.verdict in CARRIED:
            for applied in apply_patch(patch, read, spec.package):
                changes[new.fs.resolve(f"{site}/{applied.path}")] = applied.content
        verdicts.append(verdict)
    return tuple(verdicts)


def _ladder_command(definition: ImageDefinition, new: NewBase) -> str:
    """The run that proves a RELOCATED overlay's fix is in the new base: the definition's own ladder."""
    ladder = definition.ladder or "<a ladder that exercises the fix>"
    return f"servimg ladder {new.ref} --ladder {ladder}"


def judge(
    spec: OverlaySpec,
    patch: Patch,
    read: Reader,
    read_base: Callable[[str], bytes | None],
    sites: Sequence[str],
    *,
    proof: str = "",
) -> OverlayVerdict:
    """One overlay's verdict. `read` gives a package-relative path's content on the new base (with the
    earlier carried overlays), `read_base` an absolute path of the new base alone; `sites` are its
    site-packages directories (no leading '/'); `proof` the command a RELOCATED verdict asks for."""
    created = {fp.path for fp in patch.files if fp.kind == "create"}
    gone = [f"{fp.source_path} no longer exists in the new base" for fp in patch.files if _is_gone(fp, read)]
    discriminating = [s for s in spec.sentinels if s.absent_in_base]
    modules = {s.module for s in spec.sentinels}
    sources = module_sources(["/" + s for s in sites], modules, read_base)
    gone += [
        f"module {m} no longer exists in the new base"
        for m in sorted(modules - set(sources))
        if not any(_module_path(m) in (c, c.removesuffix("/__init__.py") + ".py") for c in created)
    ]
    if gone:
        return OverlayVerdict(spec.id, Verdict.TARGET_GONE, tuple(gone))
    lookups = base_sentinel_lookups(sources, spec.sentinels)
    present = {sentinel_key(s): lookups[sentinel_key(s)][0] > 0 for s in discriminating}
    reverse = _applies(patch.reversed(), read, spec.package)
    hunks = _hunk_evidence(patch, read)
    forward = _applies(patch, read, spec.package)
    evidence: list[str] = []
    if reverse:
        evidence.append(
            "the reverse patch applies exactly to the new base: the patched code is already there"
        )
    if present and all(present.values()):
        evidence.append(
            "every discriminating sentinel is already in the new base's code: " + ", ".join(sorted(present))
        )
    if evidence:
        evidence += [f"it backported {', '.join(spec.upstream)}"] if spec.upstream else []
        evidence += [f"its fixes are now in the base: {', '.join(spec.fixes)}"] if spec.fixes else []
        return OverlayVerdict(
            spec.id, Verdict.ABSORBED, tuple(evidence), hunks, present, reverse, fixes_in_base=spec.fixes
        )
    partial = [k for k, has in sorted(present.items()) if has]
    note = [f"already in the new base (not every sentinel is): {', '.join(partial)}"] if partial else []
    if forward:
        moved = [h for h in hunks if h.offset]
        if not moved:
            return OverlayVerdict(
                spec.id,
                Verdict.APPLIES,
                (f"all {len(hunks)} hunk(s) apply at their declared lines", *note),
                hunks,
                present,
            )
        lines = [
            f"{h.path}: hunk {h.number} at line {h.at} (declared {h.declared}, offset {h.offset:+d})"
            for h in moved
        ]
        return OverlayVerdict(spec.id, Verdict.APPLIES_AT_OFFSET, (*lines, *note), hunks, present)
    missing = [
        f"{s.qualname} is not in {s.module} any more"
        for s in spec.sentinels
        if lookups[sentinel_key(s)][1] == 0 and not _owner_exists(s.module, s.qualname, sources)
    ]
    if missing:
        return OverlayVerdict(spec.id, Verdict.TARGET_GONE, tuple(missing), hunks, present)
    stuck = [f"{h.path} hunk {h.number}" for h in hunks if h.at is None]
    failing = [f"{len(stuck)} of {len(hunks)} hunk(s) match nowhere: {', '.join(stuck)}"] if stuck else []
    failing = failing or [
        "the patch does not apply exactly (a file it creates exists, or one it deletes differs)"
    ]
    relocated = _relocated(spec, sources, present)
    if relocated:
        evidence = [*failing, *relocated]
        evidence += [f"the overlay declared fixes: {', '.join(spec.fixes)}"] if spec.fixes else []
        evidence += ["a name is not a fix: drop the overlay only once the same ladder passes on the new base"]
        return OverlayVerdict(spec.id, Verdict.RELOCATED, tuple(evidence), hunks, present, proof=proof)
    return OverlayVerdict(spec.id, Verdict.CONFLICTS, (*failing, *note), hunks, present)


def _relocated(spec: OverlaySpec, sources: Mapping[str, bytes], present: Mapping[str, bool]) -> list[str]:
    """Where each discriminating sentinel missing from its qualname is in the new base under another
    one, one line each; [] unless every missing one is found elsewhere (upstream moved the fix's code)."""
    lines = []
    for sentinel in spec.sentinels:
        if not sentinel.absent_in_base or present.get(sentinel_key(sentinel), False):
            continue
        elsewhere = sentinel_elsewhere(sources, sentinel)
        if not elsewhere:
            return []
        what = sentinel.name or repr(sentinel.const)
        lines.append(
            f"{what} is in the new base under another qualname: {sentinel.module}:"
            f"{', '.join(elsewhere)} (the overlay looks for it in {sentinel.qualname})"
        )
    return lines


def _is_gone(fp: FilePatch, read: Reader) -> bool:
    return fp.kind != "create" and read(fp.source_path) is None


def _module_path(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _owner_exists(module: str, qualname: str, sources: Mapping[str, bytes]) -> bool:
    """Whether the class (or function) that holds `qualname` is still in the module: a method the overlay
    adds to a class that still exists is not gone."""
    owner = qualname.rpartition(".")[0]
    if not owner or module not in sources:
        return False
    return any(
        objects for _, objects in base_sentinel_lookups(sources, [_probe_sentinel(module, owner)]).values()
    )


def _probe_sentinel(module: str, qualname: str) -> Sentinel:
    """A stand-in sentinel that only asks whether `qualname` exists (its name is never looked at)."""
    return Sentinel(module=module, qualname=qualname, name="_")


def _applies(patch: Patch, read: Reader, package: str) -> bool:
    try:
        apply_patch(patch, read, package)
    except OverlayError:
        return False
    return True


def _hunk_evidence(patch: Patch, read: Reader) -> tuple[HunkEvidence, ...]:
    """Per hunk of every file patch, in order: where it lands on the new base (each file patch sees the
    results of the ones before it, as `apply_patch` does), or why not with the lines there."""
    state: dict[str, bytes | None] = {}
    out: list[HunkEvidence] = []
    for fp in patch.files:
        content = state[fp.source_path] if fp.source_path in state else read(fp.source_path)
        if content is not None and fp.kind in ("modify", "rename"):
            out += _file_hunks(fp, content)
        with contextlib.suppress(OverlayError):
            applied: AppliedFile = apply_file(fp, content)
            state[applied.path] = applied.content
    return tuple(out)


def _file_hunks(fp: FilePatch, content: bytes) -> list[HunkEvidence]:
    lines = split_lines(content)
    out = []
    drift = 0  # where the previous placed hunk landed relative to its declared line
    for fit in place_hunks(fp, content):
        declared = fit.hunk.old_index + 1
        if fit.at is not None:
            drift = fit.offset
            out.append(
                HunkEvidence(fp.label, fit.number, declared, fit.at + 1, exact_matches(fit.hunk, content))
            )
            continue
        start, equal = _closest(fit.hunk.old_lines, lines, max(fit.hunk.old_index + drift, 0))
        shown = lines[start : start + min(len(fit.hunk.old_lines), SHOWN_LINES)]
        base_lines = tuple(
            (start + 1 + i, text.decode("utf-8", "replace").rstrip("\r\n")) for i, text in enumerate(shown)
        )
        where = (
            f"; the closest place in the new base is line {start + 1} "
            f"({equal} of {len(fit.hunk.old_lines)} old lines equal there)"
            if equal
            else f"; none of its old lines is anywhere near; shown: line {start + 1}"
        )
        out.append(HunkEvidence(fp.label, fit.number, declared, None, 0, fit.problem + where, base_lines))
    return out


def _closest(old: Sequence[bytes], lines: Sequence[bytes], expected: int) -> tuple[int, int]:
    """Where the new base looks most like the hunk's old lines (most lines equal position by position,
    ties nearest to `expected`): (0-based start, lines equal). Only to show the user where to re-author;
    it never decides whether a hunk applies."""
    fallback = min(expected, max(len(lines) - 1, 0))
    best = (0, 0, fallback)
    for start in range(max(len(lines) - len(old) + 1, 1)):
        equal = [text for k, text in enumerate(old) if start + k < len(lines) and lines[start + k] == text]
        # Blank and bracket-only lines match everywhere: a place counts only when a real line is equal.
        if any(len(text.strip()) > 3 for text in equal):
            best = max(best, (len(equal), -abs(start - expected), start))
    return (best[2], best[0]) if best[0] else (fallback, 0)


def _load_patch(spec: OverlaySpec, repo_root: Path) -> Patch:
    try:
        return pipeline.read_patch(spec, repo_root)[1]
    except ServimgError as exc:
        raise exc.context(f"overlay {spec.id}") from None


# ------------------------------------------------------------------------------------------------ the base


def open_base(
    definition: ImageDefinition,
    ref: str,
    digest: Digest | None,
    versions: Mapping[str, str],
    ctx: Context,
) -> NewBase:
    """Read the new base (refusing another digest than `digest`, when given) and find in it, per
    declared package, the one version installed (or the one asked for in `versions`)."""
    store, seams = ctx.store, ctx.seams
    unknown = sorted(set(versions) - set(definition.packages))
    if unknown:
        raise RebaseError(
            f"--version names package(s) the definition does not declare: {', '.join(unknown)}",
            hint=f"use the import names under `packages`: {', '.join(sorted(definition.packages))}",
        )
    spec = BaseSpec(ref=ref, digest=digest or Digest("sha256", "0" * 64), platform=definition.base.platform)
    try:
        if digest is None:
            image = transport.fetch(ref, ctx)
        else:
            pinned = digest
            if spec.target.holds(Holds.INDEX):  # the pin may name an index: build on this platform's child
                pinned = seams.base_source.platform_manifest(ref, pinned, spec.platform)
            image = seams.base_source.fetch(ref, ctx, expected=pinned)
    except ServimgError as exc:
        raise exc.context(f"reading the new base {ref}") from None
    if digest is not None and image.digest not in (digest, pinned):
        raise RebaseError(
            f"the new base {ref} has manifest digest {image.digest}, --digest says {digest}",
            hint="check the reference, or drop --digest to take the digest the reference has now",
        )
    fs = LayeredFS([store.uncompressed(layer.descriptor.digest, layer.diff_id) for layer in image.layers])
    found: dict[str, str] = {}
    sites: dict[str, str] = {}
    problems = []
    for name, package in sorted(definition.packages.items()):
        installed = basescan.installed_versions(fs, name, package.distribution)
        wanted = versions.get(name)
        if wanted is not None and wanted not in installed:
            problems.append(
                f"{name}: {package.distribution}=={wanted} is not installed (found {installed or 'none'})"
            )
        elif wanted is None and len(installed) != 1:
            problems.append(
                f"{name}: expected one {package.distribution} in the new base, found {installed or 'none'}"
                + (" (say which with --version)" if installed else "")
            )
        else:
            found[name] = wanted or installed[0]
            located = basescan.find_package(fs, name, package.distribution, found[name])
            sites[name] = located.site_packages.lstrip("/")
    if problems:
        raise RebaseError(
            f"the new base {ref} does not provide the definition's packages",
            problems=problems,
            hint="rebase onto a base that installs them, or pass --version NAME=VERSION",
        )
    base_digest = digest if digest is not None else image.digest
    return NewBase(ref, base_digest, image, fs, found, sites)


# ------------------------------------------------------------------------------------------------ writing


def proposed_definition(
    old: ImageDefinition, new: NewBase, verdicts: Sequence[OverlayVerdict]
) -> ImageDefinition:
    """The definition on the new base: its ref and digest, the new package versions, the dropped
    overlays left out; everything else as it was."""
    dropped = {v.id for v in verdicts if v.dropped}
    return dataclasses.replace(
        old,
        base=dataclasses.replace(old.base, ref=new.ref, digest=new.digest),
        packages={
            name: PackageSpec(distribution=spec.distribution, version=new.versions[name])
            for name, spec in old.packages.items()
        },
        overlays=tuple(o for o in old.overlays if o.id not in dropped),
    )


def _open_new_base(old: ImageDefinition, request: RebaseRequest, ctx: Context) -> NewBase:
    """The new base the stack is judged on. A multi-platform definition pins one index over every
    platform (the one `--base` names now, or `--digest`), never one image; its stack is judged on one
    platform's child (this host's, when the definition builds it), and the proposed lock then resolves
    every platform, as `servimg lock` does."""
    if not old.multi_platform:
        return open_base(old, request.base, request.digest, request.versions, ctx)
    _refuse_platforms_with_their_own_base(old, request.definition)
    digest = request.digest or _index_digest(request.base, request.definition)
    new = open_base(old.one_platform(), request.base, digest, request.versions, ctx)
    if new.image.digest == digest:
        raise _one_image(request.base, request.definition)
    return new


def _index_digest(ref: str, path: Path) -> Digest:
    """The digest of the multi-platform index `ref` names now."""
    try:
        index = transport.read_index(ref)
    except ServimgError as exc:
        raise exc.context(f"reading the new base {ref}") from None
    if index is None:
        raise _one_image(ref, path)
    return index.digest


def _one_image(ref: str, path: Path) -> RebaseError:
    return RebaseError(
        f"the new base {ref} is one image; {path} builds several platforms from one index; nothing was "
        "written",
        hint="rebase onto a multi-platform index (`servimg base NAME --platform linux/amd64,linux/arm64 "
        "--to HOST/REPO` builds one): --base HOST/REPO:TAG [--digest sha256:…]",
    )


def _refuse_platforms_with_their_own_base(definition: ImageDefinition, path: Path) -> None:
    """A rebase moves `base.ref` and `base.digest`: a platform that pins a base of its own
    (`base.platforms[].ref`/`digest`) would stay where it was, so it is refused before anything is read."""
    own = [e.platform for e in definition.base.platforms if e.ref is not None or e.digest is not None]
    if own:
        raise RebaseError(
            f"{path}: {', '.join(own)} pin(s) a base of their own; a rebase moves base.ref and base.digest "
            "only; nothing was read or written",
            hint="rebase onto one multi-platform index (docs/platforms.md): list the platforms without "
            "their own ref and digest, or edit each one's pin by hand and run `servimg lock`",
        )


def proposed_paths(definition_path: Path, in_place: bool) -> tuple[Path, Path]:
    """Where the proposed definition and lock go: in place, or `<name>.rebased.yaml` beside the old."""
    if in_place:
        return definition_path, lock_path_for(definition_path)
    stem = definition_path.name.removesuffix(".yaml").removesuffix(".yml")
    target = definition_path.with_name(f"{stem}.rebased.yaml")
    return target, lock_path_for(target)


# ------------------------------------------------------------------------------------------------ command


def propose(request: RebaseRequest, ctx: Context) -> tuple[RebaseResult, dict[Path, bytes]]:
    """Judge the stack on the new base; when it carries over, compute the proposed definition and its lock
    (resolved as a build resolves). Returns the result and the files to write (none when it does not
    carry); nothing is written here."""
    path = request.definition
    old = ImageDefinition.load(path)
    new = _open_new_base(old, request, ctx)
    verdicts = judge_stack(old, repo_root_for(path), new, drop_absorbed=request.drop_absorbed)
    packages = {n: (old.packages[n].version, v) for n, v in new.versions.items()}
    result = RebaseResult(path, new.ref, new.digest, packages, verdicts)
    if not result.carries:
        return result, {}
    proposed = proposed_definition(old, new, verdicts)
    text = definition_text(path.read_text(encoding="utf-8"), old, proposed)
    with scratch_definition(path, text, "rebase") as scratch:
        try:
            lock = pipeline.locks_for(scratch, ctx, request.runner).written
        except ServimgError as exc:
            raise exc.context("locking the rebased definition") from None
    definition_out, lock_out = proposed_paths(path, request.write)
    # The lock first (dicts keep their order): a definition whose lock did not land is refused by the
    # next build (its digest).
    files = {lock_out: lock.pretty_bytes(), definition_out: text.encode("utf-8")}
    written = RebaseResult(
        path, new.ref, new.digest, packages, verdicts, (definition_out, lock_out), lock.digest
    )
    return written, files


def rebase(request: RebaseRequest, ctx: Context) -> RebaseResult:
    """`propose`, then write the proposed lock and definition (each atomically) when the stack carries."""
    result, files = propose(request, ctx)
    for out, data in files.items():
        atomic_write(out, data, 0o644)
    return result
