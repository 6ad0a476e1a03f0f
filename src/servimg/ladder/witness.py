"""Host side of the witness (docs/design.md, "witness"): what a `witness: true` build ships, and collecting
the records from a container.

The hook itself is `servimg/inimage/witness_hook.py` (standard library only), shipped as `servimg_witness.py`
into the site-packages of every overlay package, with a `servimg-witness.pth` there that installs it at
interpreter start-up, and `/opt/servimg/witness-spec.json` (modules, expected sha256, sentinels and
forbidden names from the lock). Each process that imports an overlay module writes one JSON file into
`/var/lib/servimg/witness` (or `$SERVIMG_WITNESS_DIR`); `collect` copies them out of a container.
"""

from __future__ import annotations

import io
import json
import posixpath
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servimg.backends import engine
from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.errors import BackendError, WitnessError
from servimg.core.findings import ERROR, FAIL, PASS, Finding, Findings
from servimg.inimage import witness_hook

HOOK_SOURCE = Path(witness_hook.__file__)
HOOK_MODULE = "servimg_witness"
PTH_NAME = "servimg-witness.pth"
SPEC_IN_IMAGE = "/opt/servimg/witness-spec.json"
WITNESS_DIR = witness_hook.DEFAULT_DIR
WITNESS_VERSION = witness_hook.WITNESS_VERSION


# -- what the build ships ---------------------------------------------------------------------------
def witness_spec(probe_spec: Mapping[str, object]) -> dict[str, object]:
    """The part of a probe spec the hook needs: overlay modules, sentinels, forbidden names."""
    return {
        "witness_version": WITNESS_VERSION,
        "image": probe_spec.get("image"),
        "lock_digest": probe_spec.get("lock_digest"),
        "modules": [
            {"module": m["module"], "path": m["path"], "sha256": m["sha256"]}
            for m in jv.objs(probe_spec.get("modules", []), "modules")
            if m.get("sha256") is not None  # a module the overlays deleted is never executed
        ],
        "sentinels": [
            {k: s.get(k) for k in ("key", "module", "qualname", "name", "const")}
            for s in jv.objs(probe_spec.get("sentinels", []), "sentinels")
        ],
        "forbidden": [
            {k: f.get(k) for k in ("module", "qualname", "name")}
            for f in jv.objs(probe_spec.get("forbidden", []), "forbidden")
        ],
    }


def pth_line(spec: Mapping[str, object]) -> bytes:
    """The `.pth` line (site.py executes lines starting with `import`): install the hook with the witness
    spec inline as a Python literal, so that start-up reads and parses no other file."""
    literal = repr(json.loads(canonical.dumps(spec)))  # plain JSON data: its repr is a Python literal
    return f"import {HOOK_MODULE}; {HOOK_MODULE}.install({SPEC_IN_IMAGE!r}, {literal})\n".encode()


def witness_files(probe_spec: Mapping[str, object]) -> dict[str, bytes]:
    """Every file a `witness: true` image carries for the hook, by image path without the leading `/`:
    the hook module and its `.pth` in each overlay package's site-packages, and the witness spec."""
    spec = witness_spec(probe_spec)
    sites = sorted({str(m["site_packages"]) for m in jv.objs(probe_spec.get("modules", []), "modules")})
    out = {SPEC_IN_IMAGE.lstrip("/"): canonical.dumps(spec)}
    for site in sites:
        out[posixpath.join(site, f"{HOOK_MODULE}.py").lstrip("/")] = HOOK_SOURCE.read_bytes()
        out[posixpath.join(site, PTH_NAME).lstrip("/")] = pth_line(spec)
    return out


# -- collecting -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WitnessVerdict(Findings):
    """What one container's witness records say: did every process run the patched code?"""

    container: str = ""

    def title(self) -> str:
        return f"witness: {self.container}"


@dataclass(frozen=True)
class WitnessCollection:
    """The witness files of one container: one document per process that imported an overlay module."""

    container: str
    directory: str
    documents: tuple[Mapping[str, object], ...]
    files: tuple[Path, ...] = ()

    def records(self) -> list[Mapping[str, object]]:
        return [r for doc in self.documents for r in jv.objs(doc.get("records", []), "records")]

    def problems(self) -> list[str]:
        """Every record whose executed code is not the patched code, and every hook error."""
        out = []
        for doc in self.documents:
            pid = doc.get("pid")
            for record in jv.objs(doc.get("records", []), "records"):
                if not record.get("patched_code_ran"):
                    out.append(f"pid {pid}: {record.get('module')}: {describe(record)}")
            for error in jv.objs(doc.get("errors", []), "errors"):
                out.append(f"pid {pid}: hook error: {error}")
        return out

    @property
    def ok(self) -> bool:
        return self.verdict().ok

    def verdict(self) -> WitnessVerdict:
        """One finding per record (PASS when the patched code ran) and per hook error; no record at all
        is a FAIL: a module never imported proves nothing."""
        found: list[Finding] = []
        for doc in self.documents:
            pid = doc.get("pid")
            for record in jv.objs(doc.get("records", []), "records"):
                ran = bool(record.get("patched_code_ran"))
                subject = f"pid {pid}: {record.get('module')}"
                found.append(Finding("WITNESS", PASS if ran else FAIL, subject, describe(record)))
            for error in jv.objs(doc.get("errors", []), "errors"):
                found.append(Finding("HOOK_ERROR", ERROR, f"pid {pid}", f"hook error: {error}"))
        if not self.records():
            found.append(
                Finding(
                    "NO_RECORDS",
                    FAIL,
                    self.directory,
                    f"no witness records in {self.directory}: no process imported an overlay module",
                    hint="exercise the service first; a module never imported proves nothing",
                )
            )
        return WitnessVerdict(tuple(found), container=self.container)

    def error(self) -> WitnessError | None:
        """Why this collection does not prove the patched code ran (no records, or a process ran other
        code), or None."""
        if not self.records():
            missing = self.verdict().failures()[-1]
            return WitnessError(missing.message, hint=missing.hint)
        if self.problems():
            return WitnessError("a process ran code that is not the patched code", problems=self.problems())
        return None

    def as_dict(self) -> dict[str, object]:
        return {
            "container": self.container,
            "directory": self.directory,
            "files": [str(f) for f in self.files],
            "processes": len(self.documents),
            "records": [
                {
                    "pid": doc.get("pid"),
                    "module": r.get("module"),
                    "origin": r.get("origin"),
                    "pyc": jv.member(r, "bytecode", "pyc"),
                    "patched_code_ran": bool(r.get("patched_code_ran")),
                    # the overlay's sentinels the hook found in the code object this process executed
                    "sentinels_ran": sorted(
                        str(x.get("name") or x.get("const"))
                        for x in jv.objs(r.get("sentinels", []), "sentinels")
                        if x.get("present")
                    ),
                }
                for doc in self.documents
                for r in jv.objs(doc.get("records", []), "records")
            ],
            "problems": self.problems(),
        }


def describe(record: Mapping[str, object]) -> str:
    """One line: why a record does (not) show the patched code."""
    if record.get("error"):
        return f"the hook failed: {record['error']}"
    parts = []
    if not record.get("origin_is_patched"):
        parts.append(f"ran {record.get('origin')}, not {record.get('expected_path')}")
    if not record.get("source_matches_lock"):
        parts.append(f"source sha256 {str(record.get('source_sha256'))[:12]}… is not the lock's")
    missing = [
        s.get("key") or s.get("qualname")
        for s in jv.objs(record.get("sentinels", []), "sentinels")
        if not s.get("present")
    ]
    if missing:
        parts.append("sentinel(s) missing from the executed code: " + ", ".join(map(str, missing)))
    present = [
        f"{f.get('qualname')}:{f.get('name')}"
        for f in jv.objs(record.get("forbidden", []), "forbidden")
        if f.get("present")
    ]
    if present:
        parts.append("forbidden name(s) in the executed code: " + ", ".join(present))
    bytecode = jv.obj(record.get("bytecode") or {}, "bytecode")
    via = bytecode.get("pyc") or bytecode.get("how") or "?"
    return ("; ".join(parts) or "the patched code ran") + f" (code from {via})"


def read_documents(data: bytes) -> tuple[list[tuple[str, bytes]], list[Mapping[str, object]]]:
    """The witness JSON files in a tar stream (what `get_archive` returns): (name, bytes) and parsed."""
    files: list[tuple[str, bytes]] = []
    docs: list[Mapping[str, object]] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            name = posixpath.basename(member.name)
            if not member.isfile() or not name.endswith(".json") or name.startswith("."):
                continue
            handle = tar.extractfile(member)
            if handle is None:
                continue
            raw = handle.read()
            try:
                doc = json.loads(raw)
            except ValueError as exc:
                raise WitnessError(f"witness file {name} is not JSON: {exc}") from None
            if not isinstance(doc, dict) or "records" not in doc:
                raise WitnessError(f"witness file {name} is not a witness document")
            files.append((name, raw))
            docs.append(doc)
    order = sorted(
        range(len(docs)),
        key=lambda i: (jv.integer(docs[i].get("started_ns") or 0, "started_ns"), files[i][0]),
    )
    return [files[i] for i in order], [docs[i] for i in order]


def collect(container: str, out: Path | None = None) -> WitnessCollection:
    """Copy the witness files out of a container (running or stopped; `backends.engine`), into `out`
    when given. The directory is the container's `SERVIMG_WITNESS_DIR`, else /var/lib/servimg/witness."""
    hint = "was the image built with `witness: true`, and did a process import an overlay module?"
    try:
        handle = engine.container(container)
        directory = handle.env().get("SERVIMG_WITNESS_DIR") or WITNESS_DIR
        data = handle.archive(directory)
    except BackendError as exc:
        raise WitnessError(exc.message, hint=exc.hint or hint) from exc
    if data is None:
        raise WitnessError(f"{container} has no witness directory {directory}", hint=hint)
    return _gathered(container, directory, data, out)


def collect_dir(directory: Path, out: Path | None = None) -> WitnessCollection:
    """The same, from a directory of this machine: the serving processes ran here, inside the image
    under test (a Kubernetes pod, `runner.RunConfig.link_mounts`). Read as one tar stream, so both
    paths parse the files the same way."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:") as tar:
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
            tar.add(path, arcname=path.name, recursive=False)
    return _gathered(f"local:{directory}", str(directory), buffer.getvalue(), out)


def _gathered(source: str, directory: str, data: bytes, out: Path | None) -> WitnessCollection:
    files, docs = read_documents(data)
    written: list[Path] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for name, raw in files:
            target = out / name
            tmp = out / f".{name}.tmp"
            tmp.write_bytes(raw)
            tmp.replace(target)
            written.append(target)
    return WitnessCollection(source, directory, tuple(docs), tuple(written))
