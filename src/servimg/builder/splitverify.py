"""Build-time verification in two parts: what only the base decides (cached), and what the new layer can
change (run on every build). `servimg verify IMAGE` still runs the whole probe; this is the build's path.

The probe's expensive step is RECORD: hashing every file of every declared distribution (4,200 files,
563 MB in the demo). Over the files the new layer does not touch, its answer is a function of the base
alone, so:

- Base part: the image's own probe (same bytes) runs over the BASE with a spec that has only the
  distributions (no overlay files, no modules): each distribution's RECORD verdict over the base tree.
  Cached under `<cache>/verdicts/` by the ordered base diffIDs, the probe's sha256, that part of the spec
  and everything the probe runs under (interpreter flags, entry, Env, WorkingDir): another base, another
  probe or another command is another key, never a reused verdict.
  The base run also answers UNCHECKED_PYC (step 7: the header of every pyc under each overlay
  package, 3,500 files in the demo) over the base, and records which package roots a symlink leads to
  or lies under in the base.
- Per-build part: the image's probe over the FINAL tree (base + the new layer, `warmroot`) with the full
  spec, except that each distribution's RECORD is cut down to the rows the layer can change: a row is
  kept when any path its resolution visits in the base (the row's path, every symlink on the way) is a
  path of the new layer or lies under one. A layer that touches a distribution's dist-info (its RECORD)
  gets that distribution checked whole. Everything else runs as in the whole probe, in the final tree:
  INTERPRETER, ORIGIN and SHADOW (import resolution through every finder, `.pth` files and `sys.path`
  entries included: a planted `.pth` in the new layer is seen), SOURCE_SHA, STALE_PYC, LEGACY_PYC,
  SENTINEL, FORBIDDEN.
- UNCHECKED_PYC per build: the whole probe's walk lists the files under the package root (and its
  PYTHONPYCACHEPREFIX mirrors) and reads each pyc's header. Where no symlink is involved (none on the
  way to a root or under it in the base, none in the layer under it) and the layer does not replace a
  root or a directory above it, that list is the base's list minus what the layer deletes or replaces,
  plus the layer's own pycs, in the walk's order; the headers of the layer's pycs are read from its tar.
  Anything else, or a run whose pycache prefix is not the base run's (a `.pth` in the layer can set
  it), gets the package walked whole in the final tree.

The cut-down RECORD is a real RECORD file, laid beside the real one in the run's overlay (never in the
image), so the probe's own row logic (resolution, overlay files, hash algorithms) judges it. The two
RECORD answers are merged per distribution: a problem in either fails it; counts add up to what the
whole probe would count.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import posixpath
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servimg.builder import basefacts, resultstore
from servimg.builder.verify import (
    PROBE_IN_IMAGE,
    SPEC_IN_IMAGE,
    VerifyError,
    VerifyReport,
    probe_command,
    probe_in,
    service_command,
)
from servimg.builder.warmroot import MOUNT_FAILED, WarmRoot, lay_out, new_upper
from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import ServimgError
from servimg.core.progress import Log
from servimg.inimage import probe
from servimg.oci import filesystem, fsindex
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.oci.layerindex import LayerIndex
from servimg.oci.store import BlobStore

SPLIT_FORMAT = "split-v2"  # v2: the base verdict holds UNCHECKED_PYC too
BASE_SPEC = "/opt/servimg/.base-spec.json"
BUILD_SPEC = "/opt/servimg/.build-spec.json"
TOUCHED_DIST_INFO = ".servimg-touched-{n}.dist-info"
RECORD, UNCHECKED = "RECORD", "UNCHECKED_PYC"
AFTER_UNCHECKED = frozenset({"LAYER", "AUDIT"})  # the probe's steps after UNCHECKED_PYC


class WarmRootUnavailable(VerifyError):
    """This host cannot mount the run's overlay: verify the other way (whole probe)."""


@dataclass(frozen=True)
class BaseVerdict:
    """What the base alone answers: RECORD and UNCHECKED_PYC checks over the base tree, the pycache
    prefix the probe ran under, and the package roots (image paths, no leading `/`) a symlink leads to
    or lies under in the base (their UNCHECKED_PYC is never merged)."""

    checks: tuple[Mapping[str, object], ...]
    pycache_prefix: str | None
    linked_roots: frozenset[str]

    def check(self, code: str, subject: str) -> Mapping[str, object] | None:
        return next((c for c in self.checks if c["code"] == code and c["subject"] == subject), None)

    def to_json(self) -> dict[str, object]:
        return {
            "checks": list(self.checks),
            "pycache_prefix": self.pycache_prefix,
            "linked_roots": sorted(self.linked_roots),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> BaseVerdict:
        return cls(
            tuple(jv.objs(data["checks"], "checks")),
            jv.optional_text(data["pycache_prefix"], "pycache_prefix"),
            frozenset(jv.texts(data["linked_roots"], "linked_roots")),
        )


@dataclass(frozen=True)
class Cut:
    """A distribution's RECORD as checked per build: how many of its rows carry a hash, and their paths."""

    hashed: int
    paths: frozenset[str]


@dataclass(frozen=True)
class Setting:
    """What the probe runs under: the image command's interpreter flags and entry, Env, WorkingDir."""

    interpreter: str
    python_args: tuple[str, ...]
    entry: str | None
    env: Mapping[str, str]
    workdir: str

    def command(self, spec_path: str) -> list[str]:
        return probe_command(self.interpreter, self.python_args, spec_path, entry=self.entry)


def verify_split(image: Image, store: BlobStore, log: Log) -> VerifyReport:
    """Verify a built image (base + one servimg layer) through the cached base verdict and the per-build
    run (module docstring). Raises VerifyError when the probe cannot run at all."""
    if len(image.layers) < 2:
        raise VerifyError("split verification needs a base and a servimg layer")
    *base_layers, top = image.layers
    base_chain = [(store.uncompressed(x.descriptor.digest, x.diff_id), x.diff_id) for x in base_layers]
    base_fs = LayeredFS.cached(base_chain, store.root)
    top_tar = store.uncompressed(top.descriptor.digest, top.diff_id)
    top_fs = LayeredFS([top_tar])
    spec = json.loads(top_fs.read(SPEC_IN_IMAGE.lstrip("/")))
    probe_bytes = top_fs.read(PROBE_IN_IMAGE.lstrip("/"))
    config = jv.obj(image.config.get("config") or {}, "config")
    interpreter = str(jv.member(spec, "interpreter", "path"))
    service = service_command(config, interpreter)
    setting = Setting(
        interpreter, service.python_args, service.entry, image.env, str(config.get("WorkingDir") or "/")
    )
    root = WarmRoot.of(base_fs, [d for _, d in base_chain], store.root)
    verdict = _base_part(root, spec, probe_bytes, setting, [d for _, d in base_chain], base_fs, store, log)
    layer = LayerIndex.read(top_tar, len(base_layers))
    touched = _touched(layer, base_fs)
    mergeable = _pycs_mergeable(spec, verdict, layer, touched)
    base = BaseChain(tuple(d for _, d in base_chain), store.root)
    report, cut = _build_part(root, top_tar, spec, base_fs, base, touched, setting, mergeable)
    if jv.member(report, "interpreter", "pycache_prefix") != verdict.pycache_prefix and mergeable:
        mergeable = {}  # the layer moved the pycache prefix (a .pth can): the walk's roots are others
        report, cut = _build_part(root, top_tar, spec, base_fs, base, touched, setting, mergeable)
    _log_unchecked_plan(spec, mergeable, log)
    unchecked = _unchecked(report, spec, verdict, mergeable, layer, top_tar, touched)
    merged = _merged(report, verdict, cut, unchecked)
    # The merged verdict answers the image's own spec (what the attestations name), so it carries that
    # spec's sha256; what actually ran is kept beside it for anyone tracing the report.
    merged["split"] = {
        "build_spec_sha256": report.get("spec_sha256"),
        "base_verdict": str(base_key([d for _, d in base_chain], probe_bytes, spec, setting)),
    }
    merged["spec_sha256"] = sha256_hex(top_fs.read(SPEC_IN_IMAGE.lstrip("/")))
    return VerifyReport.from_json(merged)


# -- the base part --------------------------------------------------------------------------------
def base_spec(spec: Mapping[str, object]) -> dict[str, object]:
    """The part of a probe spec the base alone answers: each distribution's RECORD, no overlay files."""
    return {
        "spec_version": spec.get("spec_version"),
        "image": None,
        "lock_digest": None,
        "entry": spec.get("entry"),
        "interpreter": spec["interpreter"],
        "modules": [],
        "sentinels": [],
        "forbidden": [],
        "distributions": [
            {**d, "overlay_files": []} for d in jv.objs(spec.get("distributions", []), "distributions")
        ],
        "packages": [
            p for p in jv.objs(spec.get("packages", []), "packages") if p.get("overlay")
        ],  # their UNCHECKED_PYC
    }


def base_key(
    diff_ids: Sequence[Digest], probe_bytes: bytes, spec: Mapping[str, object], setting: Setting
) -> Digest:
    return Digest.of_bytes(
        canonical.dumps(
            {
                "format": SPLIT_FORMAT,
                "base_diff_ids": [str(d) for d in diff_ids],
                "probe_sha256": sha256_hex(probe_bytes),
                "spec": base_spec(spec),
                "python_args": list(setting.python_args),
                "entry": setting.entry,
                "env": dict(sorted(setting.env.items())),
                "workdir": setting.workdir,
            }
        )
    )


# The base's RECORD verdict per base_key (diffIDs, probe, spec part, command): a fact of the base alone.
BASE_VERDICT = "base-verdict"


def _base_part(
    root: WarmRoot,
    spec: Mapping[str, object],
    probe_bytes: bytes,
    setting: Setting,
    diff_ids: Sequence[Digest],
    base_fs: LayeredFS,
    store: BlobStore,
    log: Log,
) -> BaseVerdict:
    key = base_key(diff_ids, probe_bytes, spec, setting)
    cached = resultstore.read(store.root, BASE_VERDICT, {"base_key": str(key)}, per_base=True)
    with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
        if cached is not None:
            verdict = BaseVerdict.from_json(cached)
            records = sum(1 for c in verdict.checks if c["code"] == RECORD)
            log(f"base verdict: cached ({key.short}: RECORD of {records} distribution(s))")
            return verdict
    log("base verdict: running the probe over the base (once per base, probe and spec)")
    files = {PROBE_IN_IMAGE: probe_bytes, BASE_SPEC: canonical.dumps(base_spec(spec))}
    report = _run(root, files, None, setting, BASE_SPEC)
    prefix = jv.optional_text(
        jv.member(report, "interpreter", "pycache_prefix"), "interpreter.pycache_prefix"
    )
    verdict = BaseVerdict(
        tuple(c for c in jv.objs(report["checks"], "checks") if c["code"] in (RECORD, UNCHECKED)),
        prefix,
        _linked_roots(base_fs, spec, prefix),
    )
    resultstore.write(store.root, BASE_VERDICT, {"base_key": str(key)}, verdict.to_json())
    return verdict


def _linked_roots(base_fs: LayeredFS, spec: Mapping[str, object], prefix: str | None) -> frozenset[str]:
    """The walk roots of the overlay packages that a symlink leads to, or that hold one, in the base."""
    out = set()
    for package in jv.objs(spec.get("packages", []), "packages"):
        for walk_root in _walk_roots(str(package["path"]), _prefixes(spec, prefix)):
            name = walk_root.lstrip("/")
            try:
                linked = base_fs.resolve(name) != name or any(n.is_symlink for n in base_fs.below(name))
            except ServimgError:  # a link loop on the way: certainly not a plain walk
                linked = True
            if linked:
                out.add(name)
    return frozenset(out)


# -- the per-build part ---------------------------------------------------------------------------
def _touched(index: LayerIndex, base_fs: LayeredFS) -> frozenset[str]:
    """Every path the new layer changes: its files, links, whiteouts and opaque dirs, and a directory
    only where the base has no directory (a directory entry over a directory changes no content)."""
    out = {path for path, _ in index.deletions}
    for member in index.members:
        node = base_fs.lstat(member.path)
        if member.type != tarfile.DIRTYPE or node is None or not node.is_dir:
            out.add(member.path)
    return frozenset(out)


def _affected(path: str, touched: frozenset[str]) -> bool:
    """`path` or a directory above it is touched (normalised paths: no empty or trailing component)."""
    return path in touched or path.startswith(_below(touched))


@functools.lru_cache(maxsize=8)
def _below(touched: frozenset[str]) -> tuple[str, ...]:
    return tuple(f"{t}/" for t in touched)


def _record_rows(record: bytes) -> list[list[str]]:
    """A RECORD's rows as the probe reads them (a row without a path is no row)."""
    return [r for r in csv.reader(io.StringIO(record.decode("utf-8", "replace"))) if r and r[0]]


def _any_affected(trace: Sequence[str], touched: frozenset[str]) -> bool:
    return any(_affected(p, touched) for p in trace)


@dataclass(frozen=True)
class BaseChain:
    """Which base a per-base fact is of (servimg.builder.basefacts): its ordered diffIDs, and the cache."""

    diff_ids: tuple[Digest, ...]
    cache_root: Path


def row_traces(
    rows: Sequence[Sequence[str]], site: str, base_fs: LayeredFS, base: BaseChain
) -> list[list[str]]:
    """For each RECORD row, every path its resolution visits in the base (`ResolutionTrace`): a fact of
    the base and the RECORD alone, so kept per base (≈30–50 ms of a cold demo build, issue 13)."""
    paths = [posixpath.normpath(posixpath.join(site, r[0])).lstrip("/") for r in rows]

    def derive() -> list[list[str]]:
        trace = ResolutionTrace(base_fs)
        return [trace(path) for path in paths]

    def encode(traces: list[list[str]]) -> dict[str, object]:
        # Most rows resolve to their own path: keep only the others, by row number.
        return {str(n): t for n, (t, p) in enumerate(zip(traces, paths, strict=True)) if t != [p]}

    def decode(value: Any) -> list[list[str]]:
        if not isinstance(value, dict) or not all(isinstance(t, list) for t in value.values()):
            raise TypeError("not a map of row numbers to traces")
        return [[str(x) for x in value[str(n)]] if str(n) in value else [p] for n, p in enumerate(paths)]

    key = {
        "diff_ids": [str(d) for d in base.diff_ids],
        "site": site,
        "paths_sha256": sha256_hex("\n".join(paths).encode()),
    }
    return basefacts.remembered(
        base.cache_root, "record-traces", key, derive, code=_TRACE_CODE, encode=encode, decode=decode
    )


class ResolutionTrace:
    """`resolution_path` with each directory resolved once, from its parent's resolution (a RECORD's
    rows share a few hundred directories), and the links in a directory read in one query (not one
    `lstat` per row and per path component: ≈0.3 s of a cold demo build). The walk is `resolve`'s:
    a component that is no link extends the parent's resolution; one that is a link (or `..`) takes
    the full walk."""

    def __init__(self, fs: LayeredFS) -> None:
        self.fs = fs
        self.dirs: dict[str, tuple[list[str], set[str]]] = {"": ([""], fs.symlinks_in(""))}

    def __call__(self, path: str) -> list[str]:
        parent, _, name = path.rpartition("/")
        if parent not in self.dirs:
            resolved = self(parent)
            self.dirs[parent] = resolved, self.fs.symlinks_in(resolved[-1])
        visited, links = self.dirs[parent]
        candidate = f"{visited[-1]}/{name}" if visited[-1] else name
        if candidate in links or name in ("", ".", ".."):
            return self.fs.resolution_path(path)  # the file itself is a link: the full walk
        return [*visited[:-1], candidate]


# The code that decides a row's trace: another version of it is another cached fact.
_TRACE_CODE = (sys.modules[__name__], filesystem, fsindex)


def _build_part(
    root: WarmRoot,
    top_tar: Path,
    spec: Mapping[str, object],
    base_fs: LayeredFS,
    base: BaseChain,
    touched: frozenset[str],
    setting: Setting,
    mergeable: Mapping[str, tuple[str, ...]],
) -> tuple[dict[str, object], dict[str, Cut]]:
    """Run the full spec (RECORD cut to the touched rows, no UNCHECKED_PYC walk for the `mergeable`
    packages) over base + new layer. Returns the report and, per distribution checked cut down, its
    cut rows (to merge with the base verdict)."""
    files: dict[str, bytes] = {}
    distributions = []
    cut: dict[str, Cut] = {}
    for n, dist in enumerate(jv.objs(spec.get("distributions", []), "distributions")):
        dist_info = str(dist["dist_info"]).strip("/")
        if _affected(dist_info, touched) or any(p.startswith(dist_info + "/") for p in touched):
            distributions.append(dist)  # the layer changes the dist-info itself: checked whole
            continue
        site = "/" + posixpath.dirname(dist_info)
        record_rows = _record_rows(base_fs.read(f"{dist_info}/RECORD"))
        traces = row_traces(record_rows, site, base_fs, base)
        rows = [row for row, trace in zip(record_rows, traces, strict=True) if _any_affected(trace, touched)]
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        record = out.getvalue().encode()
        stand_in = posixpath.join(site, TOUCHED_DIST_INFO.format(n=n))
        files[f"{stand_in}/RECORD"] = record
        distributions.append({**dist, "dist_info": stand_in, "record_sha256": sha256_hex(record)})
        cut[_subject(dist)] = Cut(
            sum(1 for r in rows if len(r) > 1 and r[1].partition("=")[2]),
            frozenset(posixpath.normpath(posixpath.join(site, r[0])) for r in rows),
        )
    packages = [
        {**p, "overlay": False} if p.get("overlay") and p["import_name"] in mergeable else p
        for p in jv.objs(spec.get("packages", []), "packages")
    ]
    build_spec = {**spec, "distributions": distributions, "packages": packages}
    files[BUILD_SPEC] = canonical.dumps(build_spec)
    return _run(root, files, top_tar, setting, BUILD_SPEC), cut


def _subject(dist: Mapping[str, object]) -> str:
    return f"{dist['distribution']} {dist.get('version', '')}".strip()  # the probe's RECORD subject


# -- running and merging --------------------------------------------------------------------------
def _run(
    root: WarmRoot, files: Mapping[str, bytes], layer: Path | None, setting: Setting, spec_path: str
) -> dict[str, object]:
    overlay = LayerOverlay(root, files, layer)
    return probe_in(overlay, setting.command(spec_path), setting.env, setting.workdir)


@dataclass
class LayerOverlay:
    """The warm root (the base's files, extracted once) with the build's layer and the probe's files laid
    over it in a fresh upper dir per run: the probe's sandbox when the verification is split."""

    root: WarmRoot
    files: Mapping[str, bytes]
    layer: Path | None
    name: str = "the warm root"
    hint: str = "run `servimg verify` on the image for the whole probe"

    def execute(
        self, argv: Sequence[str], env: Mapping[str, str], work: Path | None, workdir: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        if work is not None:
            raise VerifyError("the warm root's probe overlay mounts no work dir", hint="pass work=None")
        upper = new_upper("servimg-verify-")
        try:
            if self.layer is not None:
                lay_out(self.layer, upper)
            for path, data in self.files.items():
                dest = upper / path.lstrip("/")
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
            proc = self.root.run(upper, argv, env=env, workdir=workdir)
        finally:
            shutil.rmtree(upper.parent, ignore_errors=True)
        if proc.returncode == MOUNT_FAILED:
            raise WarmRootUnavailable(
                f"the warm root's overlay could not be mounted: {proc.stderr.strip()[-300:]}"
            )
        return proc


def _merged(
    report: Mapping[str, object],
    verdict: BaseVerdict,
    cut: Mapping[str, Cut],
    unchecked: Sequence[Mapping[str, object]],
) -> dict[str, object]:
    """The per-build report with each cut-down RECORD check merged with the base's for that distribution,
    and the UNCHECKED_PYC checks in the spec's package order, where the whole probe reports them: before
    the steps that follow it (LAYER)."""
    kept = []
    for check in jv.objs(report["checks"], "checks"):
        subject = str(check["subject"])
        if check["code"] == RECORD and subject in cut:
            check = _merge_record(check, verdict.check(RECORD, subject), cut[subject])
        if check["code"] != UNCHECKED:
            kept.append(check)
    after = [c for c in kept if c["code"] in AFTER_UNCHECKED]
    checks = [*(c for c in kept if c["code"] not in AFTER_UNCHECKED), *unchecked, *after]
    statuses = ("PASS", "WARN", "FAIL", "ERROR")
    summary = {s: sum(1 for c in checks if c["status"] == s) for s in statuses}
    return {
        **report,
        "checks": checks,
        "summary": summary,
        "ok": summary["FAIL"] == 0 and summary["ERROR"] == 0,
    }


def _merge_record(
    touched: Mapping[str, object], base: Mapping[str, object] | None, cut: Cut
) -> dict[str, object]:
    """A problem in either part fails the distribution; a base problem on a row the build re-checked in
    the final tree is replaced by that answer (the whole probe judges those files only there)."""
    if base is None:
        return {**touched, "status": "FAIL", "message": "no base verdict for this distribution"}
    details = dict(jv.obj(touched.get("details") or {}))
    if base["status"] == "PASS" and touched["status"] == "PASS":
        base_verified = jv.integer(jv.member(base, "details", "verified") or 0, "details.verified")
        verified = base_verified - cut.hashed + jv.integer(details.get("verified", 0), "details.verified")
        overlay_part = str(touched["message"]).partition("; ")[2]
        return {
            **touched,
            "message": f"{verified} RECORD entries match; {overlay_part} (base verdict cached)",
            "details": {**details, "verified": verified},
        }
    problems = [
        *[
            p
            for p in jv.seq(jv.member(base, "details", "problems") or [])
            if isinstance(p, str) and p.partition(": ")[0] not in cut.paths
        ],
        *[p for p in jv.seq(details.get("problems", [])) if isinstance(p, str)],
    ]
    if not problems:  # the base's only problems were on rows the build re-checked, and they pass now
        return {**touched, "message": "RECORD entries match; the base's mismatches were all replaced"}
    hints = "; ".join(dict.fromkeys(str(h) for h in (base.get("hint"), touched.get("hint")) if h))
    return {
        **touched,
        "status": "FAIL",
        "message": f"{len(problems)} problem(s): "
        + "; ".join(problems[:8])
        + ("; …" if len(problems) > 8 else ""),
        "hint": hints,
        "details": {**details, "problems": problems},
    }


# -- UNCHECKED_PYC: the base's list, what the layer changes, in the walk's order ---------------------
def _prefixes(spec: Mapping[str, object], pycache_prefix: str | None) -> list[str]:
    """The probe's pycache prefixes: the running interpreter's, then the spec's (probe `_Probe`)."""
    named = [pycache_prefix, jv.member(spec, "interpreter", "pycache_prefix")]
    return [str(p) for p in dict.fromkeys(named) if p]


def _walk_roots(root: str, prefixes: Sequence[str]) -> list[str]:
    """The directories the probe's step 7 walks for a package, in its order."""
    return [root, *(posixpath.join(p, posixpath.abspath(root).lstrip("/")) for p in prefixes)]


def _log_unchecked_plan(spec: Mapping[str, object], mergeable: Mapping[str, object], log: Log) -> None:
    whole = [str(p["import_name"]) for p in jv.objs(spec.get("packages", []), "packages") if p.get("overlay")]
    whole = [name for name in whole if name not in mergeable]
    log(
        f"UNCHECKED_PYC: merged from the base verdict for {', '.join(sorted(mergeable)) or 'no package'}"
        + (f"; walked whole for {', '.join(whole)}" if whole else "")
    )


def _pycs_mergeable(
    spec: Mapping[str, object], verdict: BaseVerdict, layer: LayerIndex, touched: frozenset[str]
) -> dict[str, tuple[str, ...]]:
    """Per overlay package whose UNCHECKED_PYC can be merged (module docstring), its walk roots."""
    prefixes = _prefixes(spec, verdict.pycache_prefix)
    linked_in_layer = [m.path for m in layer.members if m.type not in _PLAIN]
    out = {}
    for package in jv.objs(spec.get("packages", []), "packages"):
        name, roots = str(package["import_name"]), _walk_roots(str(package["path"]), prefixes)
        base = verdict.check(UNCHECKED, name)
        keys = frozenset(r.lstrip("/") for r in roots)
        if (
            not package.get("overlay")
            # a relative or unnormal root: the walk's paths are not the index's (left to the probe)
            or any(not r.startswith("/") or posixpath.normpath(r) != r for r in roots)
            or base is None
            or base["status"] not in ("PASS", "WARN")
            or any(k in verdict.linked_roots or _affected(k, touched) for k in keys)
            or any(_affected(p, keys) for p in linked_in_layer)
        ):
            continue
        out[name] = tuple(roots)
    return out


_PLAIN = (tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)


def _unchecked(
    report: Mapping[str, object],
    spec: Mapping[str, object],
    verdict: BaseVerdict,
    mergeable: Mapping[str, tuple[str, ...]],
    layer: LayerIndex,
    top_tar: Path,
    touched: frozenset[str],
) -> list[Mapping[str, object]]:
    """The UNCHECKED_PYC checks the whole probe would report, in the spec's package order: the run's
    own for a package walked whole, the merged list for the others."""
    ran = {c["subject"]: c for c in jv.objs(report["checks"], "checks") if c["code"] == UNCHECKED}
    facts = jv.obj(report.get("interpreter") or {}, "interpreter")
    out: list[Mapping[str, object]] = []
    for package in jv.objs(spec.get("packages", []), "packages"):
        name = str(package["import_name"])
        if name in ran:
            out.append(ran[name])
        elif name in mergeable:
            base = verdict.check(UNCHECKED, name)
            assert base is not None  # mergeable only with a base check
            found = _merged_pycs(base, mergeable[name], layer, top_tar, touched, str(facts.get("magic")))
            out.append(
                _unchecked_check(base, name, str(package["path"]), found, str(facts.get("executable")))
            )
    return out


def _merged_pycs(
    base: Mapping[str, object],
    roots: Sequence[str],
    layer: LayerIndex,
    top_tar: Path,
    touched: frozenset[str],
    magic_hex: str,
) -> list[str]:
    kept = [
        p for p in jv.texts(jv.member(base, "details", "pycs") or []) if not _affected(p.lstrip("/"), touched)
    ]
    added = []
    with top_tar.open("rb") as tar:
        for member in {m.path: m for m in layer.members}.values():  # the last of a path wins
            if member.type == tarfile.DIRTYPE or not member.path.endswith(".pyc"):
                continue
            under = [r for r in roots if member.path.startswith(r.lstrip("/") + "/")]
            if under:
                tar.seek(member.offset_data)
                if _unchecked_hash(tar.read(min(member.size, 16)), magic_hex):
                    added.append("/" + member.path)  # roots are absolute and normal (_pycs_mergeable)
    return sorted([*kept, *added], key=lambda p: _walk_order(p, roots))


def _unchecked_hash(header: bytes, magic_hex: str) -> bool:
    """What the probe's `pyc_kind` calls unchecked-hash, for the image's interpreter (not this one)."""
    if len(header) < 16 or header[:4].hex() != magic_hex:
        return False
    return int.from_bytes(header[4:8], "little") == 0b01  # hash-based, unchecked, no unknown flag


def _walk_order(path: str, roots: Sequence[str]) -> tuple[int, tuple[tuple[int, str], ...]]:
    """`os.walk` top-down with sorted names: a root's files, then each subdirectory's, by name."""
    index = next(i for i, r in enumerate(roots) if path.startswith(r + "/"))
    *dirs, name = path[len(roots[index]) + 1 :].split("/")
    return index, (*((1, d) for d in dirs), (0, name))


def _unchecked_check(
    base: Mapping[str, object], name: str, root: str, found: list[str], executable: str
) -> Mapping[str, object]:
    """The whole probe's step 7 check for `found`, in its words (`_Probe.unchecked`; the probe's own
    helpers, since probe.py is copied into every image and cannot grow a public name for this)."""
    if found == list(jv.seq(jv.member(base, "details", "pycs") or [])):
        return base
    if not found:
        return probe._check(UNCHECKED, probe.PASS, name, "no unchecked-hash pycs")
    return probe._check(
        UNCHECKED,
        probe.WARN,
        name,
        f"{len(found)} unchecked-hash pyc(s), never validated against their source: " + probe._listed(found),
        f"{executable} -m compileall -q -f --invalidation-mode checked-hash -o 0 -o 1 -o 2 {root}",
        pycs=found,
    )
