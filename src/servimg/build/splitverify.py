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
- Per-build part: the image's probe over the FINAL tree (base + the new layer, `warmroot`) with the full
  spec, except that each distribution's RECORD is cut down to the rows the layer can change: a row is
  kept when any path its resolution visits in the base (the row's path, every symlink on the way) is a
  path of the new layer or lies under one. A layer that touches a distribution's dist-info (its RECORD)
  gets that distribution checked whole. Everything else runs as in the whole probe, in the final tree:
  INTERPRETER, ORIGIN and SHADOW (import resolution through every finder, `.pth` files and `sys.path`
  entries included: a planted `.pth` in the new layer is seen), SOURCE_SHA, STALE_PYC, LEGACY_PYC,
  SENTINEL, FORBIDDEN, UNCHECKED_PYC.

The cut-down RECORD is a real RECORD file, laid beside the real one in the run's overlay (never in the
image), so the probe's own row logic (resolution, overlay files, hash algorithms) judges it. The two
RECORD answers are merged per distribution: a problem in either fails it; counts add up to what the
whole probe would count.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import posixpath
import shutil
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servimg.build.verify import (
    PROBE_IN_IMAGE,
    SPEC_IN_IMAGE,
    VerifyError,
    VerifyReport,
    service_command,
)
from servimg.build.warmroot import MOUNT_FAILED, WarmRoot, lay_out, new_upper
from servimg.core import canonical
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest, sha256_hex
from servimg.core.progress import Log
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.oci.layerindex import LayerIndex
from servimg.oci.store import BlobStore

SPLIT_FORMAT = "split-v1"
BASE_SPEC = "/opt/servimg/.base-spec.json"
BUILD_SPEC = "/opt/servimg/.build-spec.json"
TOUCHED_DIST_INFO = ".servimg-touched-{n}.dist-info"


class WarmRootUnavailable(VerifyError):
    """This host cannot mount the run's overlay: verify the other way (whole probe)."""


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
        argv = [self.interpreter, *self.python_args, PROBE_IN_IMAGE, spec_path, "--json"]
        return argv + (["--entry", self.entry] if self.entry else [])


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
    config = image.config.get("config") or {}
    interpreter = str(spec["interpreter"]["path"])
    service = service_command(config, interpreter)
    setting = Setting(
        interpreter, service.python_args, service.entry, image.env, str(config.get("WorkingDir") or "/")
    )
    root = WarmRoot.of(base_fs, [d for _, d in base_chain], store.root)
    base_checks = _base_part(root, spec, probe_bytes, setting, [d for _, d in base_chain], store, log)
    touched = _touched(LayerIndex.read(top_tar, len(base_layers)), base_fs)
    report, cut = _build_part(root, top_tar, spec, base_fs, touched, setting)
    merged = _merged(report, base_checks, cut)
    # The merged verdict answers the image's own spec (what the attestations name), so it carries that
    # spec's sha256; what actually ran is kept beside it for anyone tracing the report.
    merged["split"] = {
        "build_spec_sha256": report.get("spec_sha256"),
        "base_verdict": str(base_key([d for _, d in base_chain], probe_bytes, spec, setting)),
    }
    merged["spec_sha256"] = sha256_hex(top_fs.read(SPEC_IN_IMAGE.lstrip("/")))
    return VerifyReport.from_json(merged)


# -- the base part --------------------------------------------------------------------------------
def base_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
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
        "distributions": [{**d, "overlay_files": []} for d in spec.get("distributions", [])],
        "packages": [],
    }


def base_key(
    diff_ids: Sequence[Digest], probe_bytes: bytes, spec: Mapping[str, Any], setting: Setting
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


def _base_part(
    root: WarmRoot,
    spec: Mapping[str, Any],
    probe_bytes: bytes,
    setting: Setting,
    diff_ids: Sequence[Digest],
    store: BlobStore,
    log: Log,
) -> list[dict[str, Any]]:
    key = base_key(diff_ids, probe_bytes, spec, setting)
    cached = store.root / "verdicts" / f"{key.hex}.json"
    try:
        checks: list[dict[str, Any]] = json.loads(cached.read_bytes())
        log(f"base verdict: cached ({key.short}: RECORD of {len(checks)} distribution(s))")
        return checks
    except (OSError, ValueError):
        pass
    log("base verdict: running the probe over the base (once per base, probe and spec)")
    files = {PROBE_IN_IMAGE: probe_bytes, BASE_SPEC: canonical.dumps(base_spec(spec))}
    report = _run(root, files, None, setting, BASE_SPEC)
    checks = [c for c in report["checks"] if c["code"] == "RECORD"]
    cached.parent.mkdir(exist_ok=True)
    atomic_write(cached, canonical.dumps(checks), 0o644)
    return checks


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


def _rows_touched(record: bytes, site: str, base_fs: LayeredFS, touched: frozenset[str]) -> list[list[str]]:
    """The RECORD rows (as the probe reads them) whose file the new layer can change."""
    rows = []
    trace = ResolutionTrace(base_fs)
    for row in csv.reader(io.StringIO(record.decode("utf-8", "replace"))):
        if not row or not row[0]:
            continue
        path = posixpath.normpath(posixpath.join(site, row[0])).lstrip("/")
        if any(_affected(p, touched) for p in trace(path)):
            rows.append(row)
    return rows


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


def _build_part(
    root: WarmRoot,
    top_tar: Path,
    spec: Mapping[str, Any],
    base_fs: LayeredFS,
    touched: frozenset[str],
    setting: Setting,
) -> tuple[dict[str, Any], dict[str, Cut]]:
    """Run the full spec (RECORD cut to the touched rows) over base + new layer. Returns the report and,
    per distribution checked cut down, its cut rows (to merge with the base verdict)."""
    files: dict[str, bytes] = {}
    distributions = []
    cut: dict[str, Cut] = {}
    for n, dist in enumerate(spec.get("distributions", [])):
        dist_info = str(dist["dist_info"]).strip("/")
        if _affected(dist_info, touched) or any(p.startswith(dist_info + "/") for p in touched):
            distributions.append(dist)  # the layer changes the dist-info itself: checked whole
            continue
        site = "/" + posixpath.dirname(dist_info)
        rows = _rows_touched(base_fs.read(f"{dist_info}/RECORD"), site, base_fs, touched)
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
    build_spec = {**spec, "distributions": distributions}
    files[BUILD_SPEC] = canonical.dumps(build_spec)
    return _run(root, files, top_tar, setting, BUILD_SPEC), cut


def _subject(dist: Mapping[str, Any]) -> str:
    return f"{dist['distribution']} {dist.get('version', '')}".strip()  # the probe's RECORD subject


# -- running and merging --------------------------------------------------------------------------
def _run(
    root: WarmRoot, files: Mapping[str, bytes], layer: Path | None, setting: Setting, spec_path: str
) -> dict[str, Any]:
    upper = new_upper("servimg-verify-")
    try:
        if layer is not None:
            lay_out(layer, upper)
        for path, data in files.items():
            dest = upper / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        proc = root.run(upper, setting.command(spec_path), env=setting.env, workdir=setting.workdir)
    finally:
        shutil.rmtree(upper.parent, ignore_errors=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    report = json.loads(lines[-1]) if lines else None
    if proc.returncode == MOUNT_FAILED:
        raise WarmRootUnavailable(
            f"the warm root's overlay could not be mounted: {proc.stderr.strip()[-300:]}"
        )
    if proc.returncode not in (0, 1) or not isinstance(report, dict) or "checks" not in report:
        raise VerifyError(
            f"the probe exited {proc.returncode} in the warm root: "
            f"{proc.stderr.strip()[-500:] or 'no report'}",
            hint="run `servimg verify` on the image for the whole probe",
        )
    return report


def _merged(
    report: Mapping[str, Any], base_checks: Sequence[Mapping[str, Any]], cut: Mapping[str, Cut]
) -> dict[str, Any]:
    """The per-build report with each cut-down RECORD check merged with the base's for that distribution."""
    base = {str(c["subject"]): c for c in base_checks}
    checks = []
    for check in report["checks"]:
        subject = str(check["subject"])
        if check["code"] == "RECORD" and subject in cut:
            check = _merge_record(check, base.get(subject), cut[subject])
        checks.append(check)
    statuses = ("PASS", "WARN", "FAIL", "ERROR")
    summary = {s: sum(1 for c in checks if c["status"] == s) for s in statuses}
    return {
        **report,
        "checks": checks,
        "summary": summary,
        "ok": summary["FAIL"] == 0 and summary["ERROR"] == 0,
    }


def _merge_record(touched: Mapping[str, Any], base: Mapping[str, Any] | None, cut: Cut) -> dict[str, Any]:
    """A problem in either part fails the distribution; a base problem on a row the build re-checked in
    the final tree is replaced by that answer (the whole probe judges those files only there)."""
    if base is None:
        return {**touched, "status": "FAIL", "message": "no base verdict for this distribution"}
    details = dict(touched.get("details") or {})
    if base["status"] == "PASS" and touched["status"] == "PASS":
        base_verified = int((base.get("details") or {}).get("verified", 0))
        verified = base_verified - cut.hashed + int(details.get("verified", 0))
        overlay_part = str(touched["message"]).partition("; ")[2]
        return {
            **touched,
            "message": f"{verified} RECORD entries match; {overlay_part} (base verdict cached)",
            "details": {**details, "verified": verified},
        }
    problems = [
        *[
            p
            for p in (base.get("details") or {}).get("problems", [])
            if isinstance(p, str) and p.partition(": ")[0] not in cut.paths
        ],
        *[p for p in details.get("problems", []) if isinstance(p, str)],
    ]
    if not problems:  # the base's only problems were on rows the build re-checked, and they pass now
        return {**touched, "message": "RECORD entries match; the base's mismatches were all replaced"}
    hints = "; ".join(dict.fromkeys(h for h in (base.get("hint"), touched.get("hint")) if h))
    return {
        **touched,
        "status": "FAIL",
        "message": f"{len(problems)} problem(s): "
        + "; ".join(problems[:8])
        + ("; …" if len(problems) > 8 else ""),
        "hint": hints,
        "details": {**details, "problems": problems},
    }
