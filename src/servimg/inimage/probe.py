"""servimg probe: proves, inside the image, which code the interpreter will execute for each overlay module.

Copied into every image as /opt/servimg/probe.py and run by the image's own interpreter under the
service's flags and environment (PYTHONPATH, PYTHONOPTIMIZE, PYTHONPYCACHEPREFIX, PYTHONSAFEPATH, cwd):

    python /opt/servimg/probe.py /opt/servimg/probe-spec.json [--audit] [--json] [--entry KIND]

STANDARD LIBRARY ONLY, CPython 3.9-3.13 (no `match`, no runtime `X | Y`, no 3.10+ APIs unguarded).
It NEVER executes a module it checks: modules are resolved through the `sys.meta_path` finders and their
code is asked of the loader. Exit status: 0 no FAIL, 1 at least one FAIL, 2 the probe itself failed.

Verification steps, in order (each check line carries a stable code):

 1. Facts. Record the interpreter (version, magic, cache tag, flags, `--check-hash-based-pycs` mode,
    pycache prefix), the PYTHON* environment, the cwd and `sys.path`; then set
    `sys.dont_write_bytecode` so that asking a loader for code never writes a pyc.
 2. Entry. Make `sys.path[0]` what the service sees (`--entry`, default from the spec: `module` =
    `python -m` puts the cwd first; `script:PATH` its directory; `none`), not the probe's own directory;
    PYTHONSAFEPATH (3.11+) keeps it off entirely.
 3. INTERPRETER: version, magic number and cache tag equal the ones the lock pinned.
 4. For every overlay module (dotted name derived from the patched file's path):
    a. ORIGIN: resolve it prefix by prefix (`a`, then `a.b` on the search locations of `a`'s spec, ...)
       through every finder on `sys.meta_path`; the origin must be the patched path. Every other
       `sys.path` entry holding the same top-level name is listed; an inactive one is a SHADOW warning.
       A file the overlays deleted must be absent.
    b. LOADER_KIND: only a source file loader can be verified; extension, namespace, zip, frozen,
       builtin, sourceless or unknown loaders FAIL ("cannot verify"), never a silent pass.
    c. SOURCE_SHA: the resolved source's sha256 equals the lock's post-overlay sha256.
    d. LEGACY_PYC: no sourceless `<stem>.pyc` beside the source.
    e. STALE_PYC: every pyc the interpreter could accept for the source - `__pycache__` and the
       PYTHONPYCACHEPREFIX mirror, optimisation levels 0, 1 and 2 - is validated the way importlib
       does (magic, flags, checked/unchecked hash against the `--check-hash-based-pycs` mode, or
       mtime+size against the source's stat); each acceptable one is unmarshalled and compared
       SEMANTICALLY (`code_equal`, never pyc bytes) with `compile()` of the source at its level. Stale
       and accepted under the running mode: FAIL; accepted only under another hash-check mode: WARN.
       The code the loader actually returns (`loader.get_code`) is compared the same way.
 5. SENTINEL: on the code object the loader returns, every code object whose qualname equals the
    sentinel's (co_qualname on 3.11+, reconstructed on 3.9/3.10) is searched, nested code included;
    PASS when at least one holds the name (co_names) or constant (co_consts), with the count. A missing
    qualname FAILs and names the nearest qualnames. ABSENT_IN_BASE: a sentinel required absent from the
    base must carry the lock's verdict `base_has_sentinel: false` ("sentinel does not discriminate"
    otherwise). FORBIDDEN: the name must appear in no code object under the qualname.
 6. RECORD: per declared distribution, every hashed RECORD entry matches the file on disk, except the
    declared overlay files, which must differ from RECORD and equal the lock's post sha256 (or be absent
    where an overlay deleted them). RECORD itself must be the one the lock pinned.
 7. UNCHECKED_PYC (warning): unchecked-hash pycs for this interpreter in the overlay packages.
    LAYER (specs of built images): every entry of the changes manifest (`/opt/servimg/changes.json`)
    is as the layer wrote it - a file with its sha256 (patched sources, their pycs, the witness hook,
    its `.pth` and spec, the bundled ladder and probe set), a deletion absent, a directory a directory -
    and servimg's own files the spec pins (the in-image lock and definition) hash to the spec's sha256.
 8. AUDIT (`--audit`): every pyc of the declared packages that this interpreter could accept is compared
    with its source like step 4e; throughput is reported in files/s.
 9. Report: the facts, one line per check (`fix:` hint beneath failures), a summary; `--json` writes the
    JSON report to stdout and the human text to stderr.
"""

from __future__ import annotations

import _imp
import argparse
import base64
import concurrent.futures
import csv
import difflib
import dis
import functools
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import marshal
import math
import os
import stat
import sys
import time
import types
import zipimport
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

PROBE_VERSION = 1
PASS, WARN, FAIL, ERROR = "PASS", "WARN", "FAIL", "ERROR"
STATUSES = (PASS, WARN, FAIL, ERROR)
CHECK_MODES = ("default", "always", "never")
OPT_LEVELS = (0, 1, 2)
CODES = (
    "INTERPRETER",
    "ORIGIN",
    "SHADOW",
    "LOADER_KIND",
    "SOURCE_SHA",
    "LEGACY_PYC",
    "STALE_PYC",
    "SENTINEL",
    "ABSENT_IN_BASE",
    "FORBIDDEN",
    "RECORD",
    "UNCHECKED_PYC",
    "AUDIT",
)
_CO_NEWLOCALS = 0x0002
_COMPREHENSIONS = ("<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>")
_CODE_ATTRS = (
    "co_argcount",
    "co_posonlyargcount",
    "co_kwonlyargcount",
    "co_nlocals",
    "co_stacksize",
    "co_flags",
    "co_code",
    "co_names",
    "co_varnames",
    "co_freevars",
    "co_cellvars",
    "co_name",
    "co_qualname",  # 3.11+
    "co_firstlineno",
    "co_exceptiontable",  # 3.11+
)
_ENV_EXTRA = ("VIRTUAL_ENV",)
_MAX_LISTED = 20


class ProbeError(Exception):
    """The probe itself cannot proceed (bad spec, unreadable file it must read): exit status 2."""


class ResolveError(Exception):
    """A module does not resolve through sys.meta_path; the message names the prefix that failed."""


# -- code objects -----------------------------------------------------------------------------------
def _float_equal(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def const_equal(a: object, b: object) -> bool:
    """Equality of two code constants: exact types, NaN equals NaN, -0.0 differs from 0.0, code objects
    and containers compared recursively (frozensets order-insensitively)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, types.CodeType) and isinstance(b, types.CodeType):
        return code_diff(a, b) is None
    if isinstance(a, float) and isinstance(b, float):
        return _float_equal(a, b)
    if isinstance(a, complex) and isinstance(b, complex):
        return _float_equal(a.real, b.real) and _float_equal(a.imag, b.imag)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(const_equal(x, y) for x, y in zip(a, b))  # noqa: B905 (3.9)
    if isinstance(a, frozenset) and isinstance(b, frozenset):
        return len(a) == len(b) and all(any(const_equal(x, y) for y in b) for x in a)
    return bool(a == b)


def _line_starts(code: types.CodeType) -> list[tuple[int, Any]]:
    """Line numbers per instruction start, independent of how the line table is encoded (column ranges,
    PYTHONNODEBUGRANGES)."""
    return list(dis.findlinestarts(code))


def code_diff(a: types.CodeType, b: types.CodeType, where: str | None = None) -> str | None:
    """None when `a` and `b` are semantically the same code, else `qualname: attribute` of the first
    difference. co_filename is not compared (importlib rewrites it to the source path on load)."""
    here = where if where is not None else _qualname_of(a, "<module>")
    for attr in _CODE_ATTRS:
        if getattr(a, attr, None) != getattr(b, attr, None):
            return f"{here}: {attr}"
    if _line_starts(a) != _line_starts(b):
        return f"{here}: line numbers"
    if len(a.co_consts) != len(b.co_consts):
        return f"{here}: co_consts"
    for x, y in zip(a.co_consts, b.co_consts):  # noqa: B905 (3.9)
        if isinstance(x, types.CodeType) and isinstance(y, types.CodeType):
            inner = code_diff(x, y, _qualname_of(x, f"{here}.{x.co_name}"))  # names messages only
            if inner is not None:
                return inner
        elif not const_equal(x, y):
            return f"{here}: co_consts"
    return None


def code_equal(a: types.CodeType, b: types.CodeType) -> bool:
    """Semantic equality of two code objects, recursively (see `code_diff`)."""
    return code_diff(a, b) is None


def _qualname_of(code: types.CodeType, default: str) -> str:
    native = getattr(code, "co_qualname", None)
    return native if isinstance(native, str) else default


@functools.lru_cache(maxsize=256)
def _global_stores(parent: types.CodeType) -> frozenset[str]:
    return frozenset(str(i.argval) for i in dis.get_instructions(parent) if i.opname == "STORE_GLOBAL")


def _child_qualname(parent: types.CodeType, parent_qual: str, child: types.CodeType, native: bool) -> str:
    """The qualname the compiler gives `child`, nested in `parent` (whose qualname is `parent_qual`).

    3.11+ records it (co_qualname). Before, rebuild it with the compiler's rule: a function or class
    declared `global` in its parent is top-level; under a module it is its name; under a function or
    lambda `<parent>.<locals>.<name>`; under a class body or comprehension `<parent>.<name>`."""
    if native:
        recorded = getattr(child, "co_qualname", None)
        if isinstance(recorded, str):
            return recorded
    name = child.co_name
    if parent_qual == "<module>":
        return name
    if not name.startswith("<") and name in _global_stores(parent):
        return name
    if parent.co_flags & _CO_NEWLOCALS and parent.co_name not in _COMPREHENSIONS:
        return f"{parent_qual}.<locals>.{name}"
    return f"{parent_qual}.{name}"


def walk_code(
    code: types.CodeType, qualname: str = "<module>", native: bool = True
) -> Iterator[tuple[str, types.CodeType]]:
    """Yield `(qualname, code)` for `code` and every code object nested in it, depth first."""
    yield qualname, code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from walk_code(const, _child_qualname(code, qualname, const, native), native)


def qualnames(code: types.CodeType, native: bool = True) -> dict[str, list[types.CodeType]]:
    """Every code object under a module's code, grouped by qualname (`<module>` for the module itself).

    `native=False` forces the 3.9/3.10 reconstruction even where co_qualname exists (for tests)."""
    out: dict[str, list[types.CodeType]] = {}
    for qual, obj in walk_code(code, native=native):
        out.setdefault(qual, []).append(obj)
    return out


def _consts_contain(consts: Iterable[object], value: object) -> bool:
    for const in consts:
        if isinstance(const, (tuple, frozenset)):
            if _consts_contain(const, value):
                return True
        elif not isinstance(const, types.CodeType) and const_equal(const, value):
            return True
    return False


def code_has(code: types.CodeType, name: str | None = None, const: object = None) -> bool:
    """Whether `name` is in co_names (or `const` in co_consts, containers included) of `code` or of any
    code object nested in it."""
    for _, obj in walk_code(code):
        if name is not None and name in obj.co_names:
            return True
        if name is None and _consts_contain(obj.co_consts, const):
            return True
    return False


def find_in_qualname(
    module_code: types.CodeType, qualname: str, name: str | None = None, const: object = None
) -> tuple[int, int, list[str]]:
    """(code objects named `qualname` that hold the name/const, code objects named `qualname`, nearest
    qualnames when there is none)."""
    table = qualnames(module_code)
    objs = table.get(qualname, [])
    if not objs:
        known = sorted(table)
        near = difflib.get_close_matches(qualname, known, n=5, cutoff=0.5)
        head = qualname.split(".")[0]
        near += [q for q in known if q.split(".")[0] == head and q not in near][: 5 - len(near)]
        return 0, 0, near or known[:5]
    return sum(1 for obj in objs if code_has(obj, name, const)), len(objs), []


# -- module resolution ------------------------------------------------------------------------------
def resolve_module(name: str, meta_path: Sequence[Any] | None = None) -> importlib.machinery.ModuleSpec:
    """The spec the import system would find for `name`, without importing anything: `a` is found by
    the finders on `sys.meta_path`, `a.b` by the same finders on the search locations of `a`'s spec,
    and so on (importlib.util.find_spec would import the parents)."""
    finders = list(sys.meta_path if meta_path is None else meta_path)
    parts = name.split(".")
    spec: importlib.machinery.ModuleSpec | None = None
    for i in range(len(parts)):
        prefix = ".".join(parts[: i + 1])
        path: list[str] | None = None
        if spec is not None:
            if spec.submodule_search_locations is None:
                raise ResolveError(f"{spec.name} ({spec.origin}) is a module, not a package")
            path = list(spec.submodule_search_locations)
        spec = _find_spec(prefix, path, finders)
        if spec is None:
            where = "sys.path" if path is None else ", ".join(path)
            raise ResolveError(f"no finder on sys.meta_path finds {prefix} (searched {where})")
    assert spec is not None
    return spec


def _find_spec(
    name: str, path: list[str] | None, finders: Sequence[Any]
) -> importlib.machinery.ModuleSpec | None:
    for finder in finders:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            spec = find_spec(name, path, None)
        except Exception as exc:
            raise ResolveError(f"finder {finder!r} raised for {name}: {exc!r}") from exc
        if spec is not None:
            return spec  # type: ignore[no-any-return]
    return None


def loader_kind(spec: importlib.machinery.ModuleSpec) -> str:
    """source | sourceless | extension | namespace | zip | frozen | builtin | unknown:<class>."""
    loader = spec.loader
    loader_type = loader if isinstance(loader, type) else type(loader)
    if spec.submodule_search_locations is not None and (
        loader is None or loader_type.__name__ in ("NamespaceLoader", "_NamespaceLoader")
    ):
        return "namespace"
    if isinstance(loader, importlib.machinery.SourceFileLoader):
        return "source"
    if isinstance(loader, importlib.machinery.SourcelessFileLoader):
        return "sourceless"
    if isinstance(loader, importlib.machinery.ExtensionFileLoader):
        return "extension"
    if isinstance(loader, zipimport.zipimporter):
        return "zip"
    if isinstance(loader_type, type) and issubclass(loader_type, importlib.machinery.FrozenImporter):
        return "frozen"
    if isinstance(loader_type, type) and issubclass(loader_type, importlib.machinery.BuiltinImporter):
        return "builtin"
    return f"unknown:{loader_type.__module__}.{loader_type.__qualname__}"


def top_level_copies(top: str) -> list[dict[str, object]]:
    """Every sys.path entry holding `top` (package, module, extension, namespace portion), in order."""
    out: list[dict[str, object]] = []
    for entry in sys.path:
        try:
            spec = importlib.machinery.PathFinder.find_spec(top, [entry])
        except Exception:
            continue
        if spec is None:
            continue
        kind = loader_kind(spec)
        if kind == "namespace":
            locations = list(spec.submodule_search_locations or [])
            where = locations[0] if locations else entry
        else:
            where = spec.origin or entry
            if spec.submodule_search_locations is not None:
                where = os.path.dirname(where)  # a package: name its directory, not __init__.py
        out.append({"entry": entry, "kind": kind, "path": where})
    return out


class _ModuleState:
    """What the probe learned of one overlaid module: its loader kind, its code, why there is none."""

    def __init__(self, why: str = "") -> None:
        self.kind: str | None = None
        self.code: types.CodeType | None = None
        self.why = why


def _obj(value: object) -> dict[str, object]:
    """A JSON object of the spec or a report, or ValueError naming what was found instead."""
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, found {type(value).__name__}")
    return value


def _seq(value: object) -> list[object]:
    if not isinstance(value, list):
        raise ValueError(f"expected a JSON array, found {type(value).__name__}")
    return value


def _objs(value: object) -> list[dict[str, object]]:
    return [_obj(item) for item in _seq(value)]


def _strs(value: object) -> list[str]:
    return [str(item) for item in _seq(value)]


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise ValueError(f"expected an integer, found {type(value).__name__}")
    return value


def _real(path: str) -> str:
    return os.path.realpath(path or os.getcwd())


def entry_source(entry: str, copy: str | None = None) -> dict[str, str]:
    """Where a sys.path entry comes from, with the command that removes it (or the `copy` in it)."""
    real = _real(entry)
    for item in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if item and _real(item) == real:
            return {
                "via": "PYTHONPATH",
                "fix": f"drop {entry} from PYTHONPATH (now {os.environ['PYTHONPATH']})",
            }
    for site in dict.fromkeys(sys.path):
        if not site or not os.path.isdir(site):
            continue
        try:
            names = sorted(n for n in os.listdir(site) if n.endswith(".pth"))
        except OSError:
            continue
        for pth in names:
            full = os.path.join(site, pth)
            try:
                with open(full, encoding="utf-8", errors="replace") as fh:
                    lines = fh.read().splitlines()
            except OSError:
                continue
            for line in lines:
                stripped = line.strip()
                if not stripped or stripped.startswith("#"):
                    continue
                if stripped.startswith(("import ", "import\t")):
                    if entry and entry in stripped:
                        return {"via": full, "fix": f"rm {full}  (or edit it)"}
                elif _real(os.path.join(site, stripped)) == real:
                    return {"via": full, "fix": f"rm {full}  (or edit it)"}
    if sys.path and entry == sys.path[0]:
        return {
            "via": "sys.path[0] (the entry point's directory)",
            "fix": "run the service from another working directory, or set PYTHONSAFEPATH=1 (3.11+)",
        }
    fix = f"rm -rf {copy}" if copy else f"take {entry} off sys.path"
    return {"via": "the interpreter's default path", "fix": fix}


# -- bytecode ---------------------------------------------------------------------------------------
def opt_levels() -> tuple[int, ...]:
    """0, 1, 2, and the running level when PYTHONOPTIMIZE asks for more (importlib reads `.opt-N.pyc`)."""
    running = sys.flags.optimize
    return OPT_LEVELS if running in OPT_LEVELS else (*OPT_LEVELS, running)


def pyc_candidates(source: str, prefixes: Iterable[str]) -> list[dict[str, object]]:
    """Every pyc location this interpreter could read for `source`: `__pycache__` and each pycache
    prefix mirror, at optimisation levels 0, 1, 2 (PEP 3147/488, bpo-33499)."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return []
    head, tail = os.path.split(os.path.abspath(source))
    stem, _, rest = tail.rpartition(".")
    base = stem if stem else rest
    out = []
    for level in opt_levels():
        name = f"{base}.{tag}{'' if level == 0 else f'.opt-{level}'}.pyc"
        out.append(
            {"level": level, "location": "__pycache__", "path": os.path.join(head, "__pycache__", name)}
        )
        for prefix in prefixes:
            mirror = os.path.join(prefix, head.lstrip(os.sep), name)
            out.append({"level": level, "location": "prefix", "path": mirror})
    return out


def pyc_kind(data: bytes) -> str:
    """timestamp | checked-hash | unchecked-hash | foreign (other magic) | invalid (importlib refuses)."""
    if len(data) < 16:
        return "invalid"
    if data[:4] != importlib.util.MAGIC_NUMBER:
        return "foreign"
    flags = int.from_bytes(data[4:8], "little")
    if flags & ~0b11:
        return "invalid"
    if flags & 0b1:
        return "checked-hash" if flags & 0b10 else "unchecked-hash"
    return "timestamp"


def accepted_modes(data: bytes, source: bytes, stat: os.stat_result) -> list[str]:
    """The `--check-hash-based-pycs` modes under which importlib would use this pyc for `source`
    (SourceLoader.get_code: _classify_pyc, then _validate_hash_pyc or _validate_timestamp_pyc)."""
    kind = pyc_kind(data)
    if kind in ("foreign", "invalid"):
        return []
    if kind == "timestamp":
        mtime_ok = int.from_bytes(data[8:12], "little") == (int(stat.st_mtime) & 0xFFFFFFFF)
        size_ok = int.from_bytes(data[12:16], "little") == (stat.st_size & 0xFFFFFFFF)
        return list(CHECK_MODES) if mtime_ok and size_ok else []
    hash_ok = data[8:16] == importlib.util.source_hash(source)
    out = []
    for mode in CHECK_MODES:
        validated = mode != "never" and (kind == "checked-hash" or mode == "always")
        if hash_ok or not validated:
            out.append(mode)
    return out


class _Compiled:
    """`compile()` of one source at each optimisation level, computed once."""

    def __init__(self, source: bytes, path: str) -> None:
        self.source, self.path = source, path
        self._cache: dict[int, types.CodeType] = {}

    def at(self, level: int) -> types.CodeType:
        if level not in self._cache:
            # dont_inherit: this file's `from __future__ import annotations` must not leak in.
            # optimize=-1 is the running level: the only way to compile for PYTHONOPTIMIZE > 2.
            optimize = level if level in OPT_LEVELS else -1
            self._cache[level] = compile(self.source, self.path, "exec", dont_inherit=True, optimize=optimize)
        return self._cache[level]


def pyc_verdict(
    candidate: Mapping[str, object], compiled: _Compiled, stat: os.stat_result, mode: str
) -> dict[str, object]:
    """What the interpreter would make of one candidate pyc: kind, modes accepting it, and whether its
    code equals the source's (`fresh`); `stale` = accepted under `mode` and not fresh."""
    out = dict(candidate)
    try:
        with open(str(candidate["path"]), "rb") as fh:
            data = fh.read()
    except OSError:
        out.update(exists=False)
        return out
    out.update(exists=True, kind=pyc_kind(data), accepted_modes=accepted_modes(data, compiled.source, stat))
    out.update(
        accepted=mode in _strs(out["accepted_modes"]), fresh=None, diff=None, stale=False, latent=False
    )
    if out["accepted_modes"]:
        try:
            loaded = marshal.loads(data[16:])
        except Exception as exc:
            loaded, out["diff"] = None, f"unreadable: {exc!r}"
        if isinstance(loaded, types.CodeType):
            out["diff"] = code_diff(loaded, compiled.at(_int(candidate["level"])))
        elif out["diff"] is None:
            out["diff"] = f"not a code object: {type(loaded).__name__}"
        out["fresh"] = out["diff"] is None
        out["stale"] = out["accepted"] and not out["fresh"]
        out["latent"] = not out["accepted"] and not out["fresh"]
    return out


def check_mode() -> str:
    return str(getattr(_imp, "check_hash_based_pycs", "default"))


# -- checks -----------------------------------------------------------------------------------------
def _check(
    code: str, status: str, subject: str, message: str, hint: str = "", **details: object
) -> dict[str, object]:
    return {
        "code": code,
        "status": status,
        "subject": subject,
        "message": message,
        "hint": hint,
        "details": details,
    }


def _sha256_file(path: str, algorithm: str = "sha256") -> bytes | None:
    try:
        digest = hashlib.new(algorithm)
        with open(path, "rb") as fh:
            buffer = bytearray(1 << 18)  # read into one buffer: no bytes object per chunk
            view = memoryview(buffer)
            while True:
                size = fh.readinto(buffer)
                if not size:
                    break
                digest.update(view[:size])
        return digest.digest()
    except (OSError, ValueError):
        return None


def _hash_files(jobs: Sequence[tuple[str, str]]) -> list[bytes | None]:
    """`_sha256_file` of each (path, algorithm), in order, on one thread per core: file reads and hashlib
    release the GIL, and a RECORD check hashes thousands of files (563 MB in the demo image), the bulk of
    the probe's time. Every file is still hashed, whole."""
    workers = min(8, os.cpu_count() or 1)
    if workers < 2 or len(jobs) < 64:
        return [_sha256_file(path, algorithm) for path, algorithm in jobs]
    slices = [jobs[i::workers] for i in range(workers)]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        hashed = list(pool.map(lambda part: [_sha256_file(p, a) for p, a in part], slices))
    out: list[bytes | None] = [None] * len(jobs)
    for i, part in enumerate(hashed):
        out[i::workers] = part
    return out


def _resolver() -> Callable[[str], str]:
    """`os.path.realpath` of normalised absolute paths, each directory resolved once: realpath walks (and
    lstats) every component of every path, and a RECORD lists thousands of files in a few hundred
    directories. realpath(dir/name) is realpath(dir)/name unless `name` itself is a link."""
    directories: dict[str, str] = {}

    def resolve(path: str) -> str:
        head, tail = os.path.split(path)
        real_head = directories.get(head)
        if real_head is None:
            real_head = directories[head] = _real(head)
        joined = os.path.join(real_head, tail)
        return _real(joined) if not tail or os.path.islink(joined) else joined

    return resolve


def _listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    return shown + (f" (+{len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else "")


class _Probe:
    def __init__(self, spec: Mapping[str, object]) -> None:
        self.spec = spec
        self.checks: list[dict[str, object]] = []
        self.mode = check_mode()
        interp = _obj(spec.get("interpreter") or {})
        prefixes = [sys.pycache_prefix, interp.get("pycache_prefix")]
        self.prefixes = [str(p) for p in dict.fromkeys(prefixes) if p]
        self.rebuild = f"servimg build images/{spec.get('image', '<name>')}.yaml"
        self.modules: dict[str, _ModuleState] = {}
        self.shadow_reported: set[str] = set()

    def add(self, check: dict[str, object]) -> None:
        self.checks.append(check)

    def guarded(self, code: str, subject: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            self.add(_check(code, ERROR, subject, f"probe error: {exc!r}", "report this probe failure"))

    # step 3
    def interpreter(self) -> None:
        if not self.spec.get("interpreter"):
            return
        want = _obj(self.spec.get("interpreter"))
        have = {
            "version": ".".join(str(v) for v in sys.version_info[:3]),
            "magic": importlib.util.MAGIC_NUMBER.hex(),
            "cache_tag": sys.implementation.cache_tag,
        }
        bad = [
            f"{k} {have[k]} (lock: {want.get(k)})" for k in sorted(have) if want.get(k) not in (None, have[k])
        ]
        if bad:
            self.add(
                _check(
                    "INTERPRETER",
                    FAIL,
                    sys.executable,
                    "not the interpreter the lock pinned: " + ", ".join(bad),
                    f"run the probe with the service's interpreter ({want.get('path')})",
                )
            )
        else:
            self.add(
                _check("INTERPRETER", PASS, sys.executable, f"CPython {have['version']} {have['cache_tag']}")
            )

    # step 4
    def module(self, mod: Mapping[str, object]) -> None:
        name, expected = str(mod["module"]), str(mod["path"])
        state = _ModuleState(why="deleted by the overlays")
        self.modules[name] = state
        if mod.get("sha256") is None:
            self._deleted(name, expected)
            return
        state.why = ""
        try:
            spec = resolve_module(name)
        except ResolveError as exc:
            state.why = f"does not resolve: {exc}"
            self.add(
                _check(
                    "ORIGIN",
                    FAIL,
                    name,
                    state.why,
                    f"the overlay file {expected} must be importable as {name}",
                )
            )
            spec = None
        if spec is not None:
            self._origin(mod, spec)
            state.kind = loader_kind(spec)
            self._loader_kind(name, spec, state)
        origin = spec.origin if spec is not None and state.kind == "source" and spec.origin else expected
        self._source_sha(mod, origin)
        self._legacy(name, origin)
        self._stale(name, origin, spec, state)

    def _deleted(self, name: str, expected: str) -> None:
        present = [p for p in (expected, os.path.splitext(expected)[0] + ".pyc") if os.path.lexists(p)]
        if present:
            self.add(
                _check(
                    "ORIGIN",
                    FAIL,
                    name,
                    f"deleted by the overlays but present: {_listed(present)}",
                    "rm -f " + " ".join(present),
                )
            )
        else:
            self.add(_check("ORIGIN", PASS, name, f"absent as the overlays require ({expected})"))

    def _origin(self, mod: Mapping[str, object], spec: importlib.machinery.ModuleSpec) -> None:
        name, expected = str(mod["module"]), str(mod["path"])
        top = name.split(".")[0]
        site = mod.get("site_packages")
        copies = top_level_copies(top)
        for copy in copies:
            copy["ours"] = bool(site) and _real(str(copy["entry"])) == _real(str(site))
        origin = spec.origin or ""
        active = spec.origin is not None and _real(origin) == _real(expected)
        if active:
            self.add(_check("ORIGIN", PASS, name, f"resolves to {origin}", copies=copies))
        else:
            others = [c for c in copies if not c["ours"]]
            culprit = others[0] if others else None
            loader = type(spec.loader).__name__
            hint = f"{loader} found it (not a sys.path copy); the patched file is {expected}"
            if culprit is not None:
                source = entry_source(str(culprit["entry"]), str(culprit["path"]))
                hint = f"{culprit['path']} shadows it (added by {source['via']}): {source['fix']}"
            self.add(
                _check(
                    "ORIGIN",
                    FAIL,
                    name,
                    f"resolves to {origin or spec.name + ' (no file)'}, not {expected}",
                    hint,
                    copies=copies,
                )
            )
        if top in self.shadow_reported:
            return
        self.shadow_reported.add(top)
        inactive = [c for c in copies if not c["ours"]] if active else []
        if inactive:
            fixes = [entry_source(str(c["entry"]), str(c["path"]))["fix"] for c in inactive]
            self.add(
                _check(
                    "SHADOW",
                    WARN,
                    top,
                    f"{len(inactive)} other copy(ies) of {top} on sys.path, not imported now: "
                    + _listed([str(c["path"]) for c in inactive]),
                    "; ".join(dict.fromkeys(fixes)),
                    copies=copies,
                )
            )

    def _loader_kind(self, name: str, spec: importlib.machinery.ModuleSpec, state: _ModuleState) -> None:
        kind = state.kind
        loader = type(spec.loader).__name__ if spec.loader is not None else None
        if kind != "source":
            state.why = f"cannot verify: {kind} loader ({spec.origin})"
            hint = "only modules loaded from a .py source file can be verified; remove the " + (
                "extension module " + str(spec.origin) if kind == "extension" else f"{kind} copy"
            )
            self.add(_check("LOADER_KIND", FAIL, name, state.why, hint, loader=loader, origin=spec.origin))
            return
        try:
            code = spec.loader.get_code(name)  # type: ignore[union-attr]
        except Exception as exc:
            state.why = f"the loader cannot produce code: {exc!r}"
            self.add(
                _check("LOADER_KIND", FAIL, name, state.why, "fix the file so it compiles, then rebuild")
            )
            return
        state.code = code
        self.add(_check("LOADER_KIND", PASS, name, f"source file loader ({loader})", loader=loader))

    def _source_sha(self, mod: Mapping[str, object], path: str) -> None:
        digest = _sha256_file(path)
        name, want = str(mod["module"]), str(mod["sha256"])
        if digest is None:
            self.add(_check("SOURCE_SHA", FAIL, name, f"cannot read {path}", self.rebuild))
        elif digest.hex() != want:
            self.add(
                _check(
                    "SOURCE_SHA",
                    FAIL,
                    name,
                    f"{path} has sha256 {digest.hex()}, the lock says {want}",
                    f"the file is not the one the build wrote: {self.rebuild}",
                )
            )
        else:
            self.add(_check("SOURCE_SHA", PASS, name, f"sha256 {want[:16]}… = lock"))

    def _legacy(self, name: str, source: str) -> None:
        legacy = os.path.splitext(source)[0] + ".pyc"
        if os.path.lexists(legacy):
            self.add(
                _check(
                    "LEGACY_PYC",
                    FAIL,
                    name,
                    f"sourceless {legacy} beside the source (imported whenever the .py is missing)",
                    f"rm -f {legacy}",
                )
            )
        else:
            self.add(_check("LEGACY_PYC", PASS, name, "no sourceless pyc beside the source"))

    def _stale(
        self, name: str, source: str, spec: importlib.machinery.ModuleSpec | None, state: _ModuleState
    ) -> None:
        try:
            with open(source, "rb") as fh:
                data = fh.read()
            stat = os.stat(source)
        except OSError as exc:
            self.add(
                _check(
                    "STALE_PYC", FAIL, name, f"cannot read the source {source}: {exc.strerror}", self.rebuild
                )
            )
            return
        compiled = _Compiled(data, source)
        try:
            compiled.at(sys.flags.optimize)
        except (SyntaxError, ValueError) as exc:
            self.add(_check("STALE_PYC", FAIL, name, f"the source does not compile: {exc}", self.rebuild))
            return
        verdicts = [pyc_verdict(c, compiled, stat, self.mode) for c in pyc_candidates(source, self.prefixes)]
        present = [v for v in verdicts if v.get("exists")]
        stale = [v for v in present if v["stale"]]
        latent = [v for v in present if v["latent"]]
        problems = [f"{v['path']} ({v['kind']}, {v['diff']})" for v in stale]
        if state.code is not None:
            diff = code_diff(state.code, compiled.at(sys.flags.optimize))
            if diff is not None:
                problems.append(f"the loader's code differs from the source ({diff})")
        summary = (
            f"{len(present)} pyc(s) checked at levels "
            + ",".join(map(str, opt_levels()))
            + (f" + prefix {', '.join(self.prefixes)}" if self.prefixes else "")
        )
        if problems:
            paths = [str(v["path"]) for v in stale]
            hint = (
                ("rm -f " + " ".join(paths) + f"  (or {self.rebuild}: it whiteouts stale pycs)")
                if paths
                else self.rebuild
            )
            self.add(
                _check(
                    "STALE_PYC",
                    FAIL,
                    name,
                    "stale bytecode would run: " + "; ".join(problems),
                    hint,
                    pycs=present,
                )
            )
        elif latent:
            paths = [str(v["path"]) for v in latent]
            self.add(
                _check(
                    "STALE_PYC",
                    WARN,
                    name,
                    f"stale pyc(s) rejected under --check-hash-based-pycs {self.mode} but accepted under "
                    + "/".join(sorted({m for v in latent for m in _strs(v["accepted_modes"])}))
                    + ": "
                    + _listed(paths),
                    "rm -f " + " ".join(paths),
                    pycs=present,
                )
            )
        else:
            self.add(_check("STALE_PYC", PASS, name, summary + ": none stale", pycs=present))

    # step 5
    def _module_code(self, module: str) -> tuple[types.CodeType | None, str]:
        state = self.modules.get(module)
        if state is None:
            state = _ModuleState()
            self.modules[module] = state
            try:
                spec = resolve_module(module)
                state.kind = loader_kind(spec)
                if state.kind != "source":
                    state.why = f"cannot verify: {state.kind} loader ({spec.origin})"
                else:
                    state.code = spec.loader.get_code(module)  # type: ignore[union-attr]
            except Exception as exc:
                state.why = f"cannot load its code: {exc}"
        return state.code, state.why

    def sentinel(self, sentinel: Mapping[str, object]) -> None:
        module, qualname = str(sentinel["module"]), str(sentinel["qualname"])
        name = None if sentinel.get("name") is None else str(sentinel.get("name"))
        const = sentinel.get("const")
        what = f"name {name!r} in co_names" if name is not None else f"constant {const!r} in co_consts"
        subject = f"{module}:{qualname}"
        if sentinel.get("absent_in_base"):
            verdict = sentinel.get("base_has_sentinel")
            if verdict is False:
                self.add(
                    _check("ABSENT_IN_BASE", PASS, subject, f"{what}: absent from the base (lock verdict)")
                )
            elif verdict is True:
                self.add(
                    _check(
                        "ABSENT_IN_BASE",
                        FAIL,
                        subject,
                        f"sentinel does not discriminate: the base already has {what}",
                        "upstream adopted this name; choose a sentinel only the overlay introduces, "
                        "then `servimg lock`",
                    )
                )
            else:
                self.add(
                    _check(
                        "ABSENT_IN_BASE",
                        FAIL,
                        subject,
                        f"no base verdict recorded for {what}",
                        "run `servimg lock` to record it",
                    )
                )
        code, why = self._module_code(module)
        if code is None:
            self.add(
                _check("SENTINEL", FAIL, subject, f"{what}: {why}", "see ORIGIN/LOADER_KIND for this module")
            )
            return
        hits, total, near = find_in_qualname(code, qualname, name, const)
        if total == 0:
            self.add(
                _check(
                    "SENTINEL",
                    FAIL,
                    subject,
                    f"no code object named {qualname} in {module}; nearest: {_listed(near) or 'none'}",
                    self.rebuild,
                    nearest=near,
                )
            )
        elif hits == 0:
            self.add(
                _check(
                    "SENTINEL",
                    FAIL,
                    subject,
                    f"{what} missing from all {total} code object(s) named {qualname}",
                    f"the overlay is not in the code the loader returns: {self.rebuild}",
                )
            )
        else:
            self.add(
                _check(
                    "SENTINEL",
                    PASS,
                    subject,
                    f"{what} in {hits} of {total} code object(s)",
                    hits=hits,
                    total=total,
                )
            )

    def forbidden(self, item: Mapping[str, object]) -> None:
        module, qualname, name = str(item["module"]), str(item["qualname"]), str(item["name"])
        subject = f"{module}:{qualname}"
        code, why = self._module_code(module)
        if code is None:
            self.add(
                _check(
                    "FORBIDDEN",
                    FAIL,
                    subject,
                    f"name {name!r}: {why}",
                    "see ORIGIN/LOADER_KIND for this module",
                )
            )
            return
        hits, total, near = find_in_qualname(code, qualname, name)
        if total == 0:
            self.add(
                _check(
                    "FORBIDDEN",
                    FAIL,
                    subject,
                    f"no code object named {qualname} in {module}; nearest: {_listed(near) or 'none'}",
                    self.rebuild,
                    nearest=near,
                )
            )
        elif hits:
            self.add(
                _check(
                    "FORBIDDEN",
                    FAIL,
                    subject,
                    f"forbidden name {name!r} present in {hits} of {total} code object(s)",
                    f"the unpatched code runs: {self.rebuild}",
                )
            )
        else:
            self.add(_check("FORBIDDEN", PASS, subject, f"{name!r} absent from {total} code object(s)"))

    # step 6
    def record(self, dist: Mapping[str, object]) -> None:
        subject = f"{dist['distribution']} {dist.get('version', '')}".strip()
        dist_info = str(dist["dist_info"])
        site = os.path.dirname(dist_info)
        record_path = os.path.join(dist_info, "RECORD")
        reinstall = (
            f"reinstall {dist['distribution']}=={dist.get('version')} in the base, then `servimg lock`"
        )
        try:
            with open(record_path, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            self.add(_check("RECORD", FAIL, subject, f"cannot read {record_path}: {exc.strerror}", reinstall))
            return
        problems: list[str] = []  # the installed distribution differs from its RECORD
        overlay_problems: list[str] = []  # the overlay files are not what the build wrote
        pinned = dist.get("record_sha256")
        if pinned and hashlib.sha256(raw).hexdigest() != pinned:
            problems.append(f"{record_path} is not the RECORD the lock pinned")
        overlay = {_real(str(f["path"])): f for f in _objs(dist.get("overlay_files", []))}
        seen: set[str] = set()
        verified = 0
        resolve = _resolver()
        hashed: list[tuple[str, str, str]] = []  # (path, algorithm, expected) of every other hashed row
        for row in csv.reader(io.StringIO(raw.decode("utf-8", "replace"))):
            if not row or not row[0]:
                continue
            path = os.path.normpath(os.path.join(site, row[0]))
            real = resolve(path)
            algorithm, _, expected = (row[1] if len(row) > 1 else "").partition("=")
            if real in overlay:
                seen.add(real)
                overlay_problems += self._overlay_file(path, overlay[real], algorithm, expected)
                continue
            if expected:
                hashed.append((path, algorithm, expected))
        digests = _hash_files([(path, algorithm) for path, algorithm, _ in hashed])
        for (path, _, expected), actual in zip(hashed, digests):  # noqa: B905 (3.9)
            if actual is None:
                problems.append(f"{path}: missing (or unreadable)")
            elif base64.urlsafe_b64encode(actual).rstrip(b"=").decode() != expected:
                problems.append(f"{path}: differs from RECORD")
            else:
                verified += 1
        for real, item in sorted(overlay.items()):
            if real not in seen:
                overlay_problems += self._overlay_file(str(item["path"]), item, "", "")
        if problems or overlay_problems:
            hints = ([reinstall] if problems else []) + ([self.rebuild] if overlay_problems else [])
            problems += overlay_problems
            self.add(
                _check(
                    "RECORD",
                    FAIL,
                    subject,
                    f"{len(problems)} problem(s): {_listed(problems)}",
                    "; ".join(hints),
                    problems=problems,
                )
            )
        else:
            self.add(
                _check(
                    "RECORD",
                    PASS,
                    subject,
                    f"{verified} RECORD entries match; {len(overlay)} overlay file(s) differ as declared",
                    verified=verified,
                )
            )

    @staticmethod
    def _overlay_file(path: str, item: Mapping[str, object], algorithm: str, expected: str) -> list[str]:
        post = item.get("post_sha256")
        if post is None:
            return [f"{path}: deleted by the overlays but present"] if os.path.lexists(path) else []
        digest = _sha256_file(path)
        if digest is None:
            return [f"{path}: overlay file missing"]
        if expected and algorithm:
            recorded = _sha256_file(path, algorithm)
            if recorded is not None and base64.urlsafe_b64encode(recorded).rstrip(b"=").decode() == expected:
                return [f"{path}: overlay file still equals RECORD (the patch is not applied)"]
        if digest.hex() != post:
            return [f"{path}: overlay file is neither RECORD's nor the lock's post sha256"]
        return []

    # step 7
    def unchecked(self, package: Mapping[str, object]) -> None:
        root = str(package["path"])
        roots = [root] + [os.path.join(p, os.path.abspath(root).lstrip(os.sep)) for p in self.prefixes]
        found = [p for p in _pycs_under(roots) if _header_kind(p) == "unchecked-hash"]
        name = str(package["import_name"])
        if found:
            self.add(
                _check(
                    "UNCHECKED_PYC",
                    WARN,
                    name,
                    f"{len(found)} unchecked-hash pyc(s), never validated against their source: "
                    + _listed(found),
                    f"{sys.executable} -m compileall -q -f --invalidation-mode checked-hash "
                    f"-o 0 -o 1 -o 2 {root}",
                    pycs=found,
                )
            )
        else:
            self.add(_check("UNCHECKED_PYC", PASS, name, "no unchecked-hash pycs"))

    # step 8
    def layer(self, layer: Mapping[str, object]) -> None:
        """LAYER: what the overlay layer added is still what the changes manifest says it wrote."""
        manifest = str(layer.get("changes"))
        hint = "the image was altered after it was built; rebuild it and do not run this copy"
        try:
            with open(manifest, "rb") as fh:
                entries = json.loads(fh.read())
        except (OSError, ValueError) as exc:
            self.add(_check("LAYER", FAIL, manifest, f"cannot read the changes manifest: {exc}", hint))
            return
        expected = [(str(e.get("path")), str(e.get("kind")), e.get("sha256")) for e in entries]
        expected += [(str(f.get("path")), "file", f.get("sha256")) for f in _objs(layer.get("files", []))]
        problems = [p for p in (_layer_problem(*item) for item in expected) if p]
        kinds = [kind for _, kind, _ in expected]
        counted = ", ".join(
            f"{kinds.count(k)} {word}"
            for k, word in (("file", "file(s)"), ("whiteout", "deletion(s)"), ("dir", "directory(ies)"))
        )
        if problems:
            message = f"{len(problems)} of {len(expected)} entries differ: {_listed(problems)}"
            self.add(_check("LAYER", FAIL, manifest, message, hint, problems=problems))
        else:
            message = f"{counted} as the changes manifest lists them; lock and definition as pinned"
            self.add(_check("LAYER", PASS, manifest, message))

    def audit_package(self, package: Mapping[str, object]) -> None:
        root, name = str(package["path"]), str(package["import_name"])
        started = time.monotonic()
        sources = pycs = 0
        stale: list[str] = []
        latent: list[str] = []
        unreadable: list[str] = []
        for source in _sources_under(root):
            sources += 1
            candidates = [c for c in pyc_candidates(source, self.prefixes) if os.path.exists(str(c["path"]))]
            if not candidates:
                continue
            try:
                with open(source, "rb") as fh:
                    compiled = _Compiled(fh.read(), source)
                stat = os.stat(source)
            except OSError:
                unreadable.append(source)
                continue
            for candidate in candidates:
                pycs += 1
                try:
                    verdict = pyc_verdict(candidate, compiled, stat, self.mode)
                except (SyntaxError, ValueError) as exc:
                    unreadable.append(f"{source} ({exc})")
                    break
                if verdict.get("stale"):
                    stale.append(f"{candidate['path']} ({verdict['diff']})")
                elif verdict.get("latent"):
                    latent.append(str(candidate["path"]))
        seconds = max(time.monotonic() - started, 1e-9)
        rate = sources / seconds
        stats: dict[str, object] = {
            "sources": sources,
            "pycs": pycs,
            "seconds": round(seconds, 3),
            "files_per_s": round(rate, 1),
        }
        head = f"{sources} sources, {pycs} pycs in {seconds:.2f}s ({rate:.0f} files/s)"
        if stale:
            self.add(
                _check(
                    "AUDIT",
                    FAIL,
                    name,
                    f"{head}: {len(stale)} stale pyc(s) would run: {_listed(stale)}",
                    f"{self.rebuild}, or rm -f the listed pycs",
                    stale=stale,
                    **stats,
                )
            )
        elif latent or unreadable:
            self.add(
                _check(
                    "AUDIT",
                    WARN,
                    name,
                    f"{head}: {len(latent)} stale pyc(s) accepted only under another hash-check mode, "
                    f"{len(unreadable)} unreadable source(s): {_listed(latent + unreadable)}",
                    "rm -f the listed pycs",
                    latent=latent,
                    unreadable=unreadable,
                    **stats,
                )
            )
        else:
            self.add(_check("AUDIT", PASS, name, f"{head}: none stale", "", **stats))


def _layer_problem(path: str, kind: str, sha256: object) -> str | None:
    """What is wrong with one entry the layer wrote (None: as written). Never follows a symlink: a file
    the layer wrote that is now a link is a change too."""
    try:
        st: os.stat_result | None = os.lstat(path)
    except OSError:
        st = None
    if kind == "whiteout":
        return f"{path} exists, but the layer deletes it" if st is not None else None
    if kind == "dir":
        return None if st is not None and stat.S_ISDIR(st.st_mode) else f"{path} is not a directory"
    if kind != "file":
        return None  # links and devices: the layer does not write them (a manifest of a later format)
    if st is None or not stat.S_ISREG(st.st_mode):
        return f"{path} is missing or not a regular file"
    actual = _sha256_file(path)
    if actual is None or actual.hex() != sha256:
        got = actual.hex()[:12] if actual is not None else "unreadable"
        return f"{path} has sha256 {got}..., the manifest says {str(sha256)[:12]}..."
    return None


def _walk_files(roots: Iterable[str]) -> Iterator[str]:
    for root in roots:
        for directory, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                yield os.path.join(directory, name)


def _sources_under(root: str) -> Iterator[str]:
    return (p for p in _walk_files([root]) if p.endswith(".py") and "__pycache__" not in p)


def _pycs_under(roots: Iterable[str]) -> Iterator[str]:
    return (p for p in _walk_files(roots) if p.endswith(".pyc"))


def _header_kind(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return pyc_kind(fh.read(16))
    except OSError:
        return "invalid"


# -- facts and the run ------------------------------------------------------------------------------
def interpreter_facts() -> dict[str, object]:
    flags = sys.flags
    return {
        "executable": sys.executable,
        "implementation": sys.implementation.name,
        "version": ".".join(str(v) for v in sys.version_info[:3]),
        "magic": importlib.util.MAGIC_NUMBER.hex(),
        "cache_tag": sys.implementation.cache_tag,
        "optimize": flags.optimize,
        "check_hash_based_pycs": check_mode(),
        "pycache_prefix": sys.pycache_prefix,
        "dont_write_bytecode": bool(flags.dont_write_bytecode),
        "safe_path": bool(getattr(flags, "safe_path", False)),
        "isolated": bool(flags.isolated),
        "no_site": bool(flags.no_site),
        "no_user_site": bool(flags.no_user_site),
        "ignore_environment": bool(flags.ignore_environment),
    }


def environment() -> dict[str, object]:
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("PYTHON") or k in _ENV_EXTRA}
    return {
        "env": env,
        "cwd": os.getcwd(),
        "sys_path": list(sys.path),
        "meta_path": [
            f"{type(f).__module__}.{type(f).__qualname__}"
            if not isinstance(f, type)
            else f"{f.__module__}.{f.__qualname__}"
            for f in sys.meta_path
        ],
    }


def run(
    spec: Mapping[str, object], audit: bool = False, facts: Mapping[str, object] | None = None
) -> dict[str, object]:
    """Run every check of `spec` in this interpreter and return the JSON-able report (never raises for a
    failing check; raises ProbeError for a malformed spec)."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("modules", []), list):
        raise ProbeError("the spec must be a JSON object with a `modules` list")
    facts = dict(facts) if facts is not None else interpreter_facts()
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # asking a SourceFileLoader for code must not write a pyc
    probe = _Probe(spec)
    try:
        probe.guarded("INTERPRETER", sys.executable, probe.interpreter)
        for mod in _objs(spec.get("modules", [])):
            probe.guarded("ORIGIN", str(mod.get("module")), probe.module, mod)
        for sentinel in _objs(spec.get("sentinels", [])):
            probe.guarded(
                "SENTINEL", f"{sentinel.get('module')}:{sentinel.get('qualname')}", probe.sentinel, sentinel
            )
        for item in _objs(spec.get("forbidden", [])):
            probe.guarded("FORBIDDEN", f"{item.get('module')}:{item.get('qualname')}", probe.forbidden, item)
        for dist in _objs(spec.get("distributions", [])):
            probe.guarded("RECORD", str(dist.get("distribution")), probe.record, dist)
        for package in _objs(spec.get("packages", [])):
            if package.get("overlay"):
                probe.guarded("UNCHECKED_PYC", str(package.get("import_name")), probe.unchecked, package)
        layer = spec.get("layer")
        if layer:
            probe.guarded("LAYER", str(_obj(layer).get("changes")), probe.layer, layer)
        if audit:
            for package in _objs(spec.get("packages", [])):
                probe.guarded("AUDIT", str(package.get("import_name")), probe.audit_package, package)
    finally:
        sys.dont_write_bytecode = saved
    counts = {s: sum(1 for c in probe.checks if c["status"] == s) for s in STATUSES}
    return {
        "probe_version": PROBE_VERSION,
        "image": spec.get("image"),
        "lock_digest": spec.get("lock_digest"),
        "interpreter": facts,
        "environment": environment(),
        "audit": audit,
        "checks": probe.checks,
        "summary": counts,
        "ok": counts[FAIL] == 0 and counts[ERROR] == 0,
    }


def exit_status(report: Mapping[str, object]) -> int:
    summary = _obj(report["summary"])
    return 2 if summary.get(ERROR) else 1 if summary.get(FAIL) else 0


def render(report: Mapping[str, object]) -> str:
    """The human report: facts, one line per check (hint beneath), summary."""
    facts, env = _obj(report["interpreter"]), _obj(report["environment"])
    lines = [
        f"servimg probe {report['probe_version']}: image {report.get('image')} "
        f"lock {report.get('lock_digest')}",
        f"interpreter: {facts['executable']} {facts['implementation']} {facts['version']} "
        f"cache_tag {facts['cache_tag']} magic {facts['magic']}",
        "flags: "
        + " ".join(
            f"{k}={facts[k]}"
            for k in (
                "optimize",
                "check_hash_based_pycs",
                "pycache_prefix",
                "dont_write_bytecode",
                "safe_path",
                "isolated",
                "no_site",
            )
        ),
        "env: " + (" ".join(f"{k}={v}" for k, v in _obj(env["env"]).items()) or "(no PYTHON* variables)"),
        f"cwd: {env['cwd']}",
        "sys.path: " + " ".join(str(p or "''") for p in _seq(env["sys_path"])),
    ]
    checks = _objs(report["checks"])
    width = max([len(str(c["code"])) for c in checks] + [4])
    for check in checks:
        lines.append(f"{check['status']:<5} {check['code']:<{width}} {check['subject']}: {check['message']}")
        if check["hint"] and check["status"] != PASS:
            lines.append(f"{'':<5} {'':<{width}} fix: {check['hint']}")
    summary = _obj(report["summary"])
    lines.append(
        "summary: "
        + ", ".join(f"{summary[s]} {s}" for s in STATUSES)
        + f" -> {'OK' if report['ok'] else 'NOT OK'}"
    )
    return "\n".join(lines) + "\n"


def prepare_sys_path(entry: str) -> None:
    """Step 2: drop the probe's own directory from sys.path[0]; put the service's entry there instead."""
    if getattr(sys.flags, "safe_path", False):
        return
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and _real(sys.path[0]) == here:
        del sys.path[0]
    if entry == "module":
        sys.path.insert(0, os.getcwd())
    elif entry == "command":
        sys.path.insert(0, "")
    elif entry.startswith("script:"):
        sys.path.insert(0, os.path.dirname(os.path.realpath(entry[len("script:") :])))
    elif entry != "none":
        raise ProbeError(f"unknown --entry {entry!r} (module, command, script:PATH, none)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="probe.py", description="servimg in-image verifier (never imports what it checks)"
    )
    parser.add_argument("spec", help="probe spec JSON (e.g. /opt/servimg/probe-spec.json)")
    parser.add_argument(
        "--audit", action="store_true", help="also compare every pyc of the declared packages"
    )
    parser.add_argument("--json", action="store_true", help="JSON report on stdout (human text on stderr)")
    parser.add_argument(
        "--entry", default=None, help="sys.path[0] as the service sees it: module|command|script:PATH|none"
    )
    args = parser.parse_args(argv)
    facts = interpreter_facts()  # before anything changes
    try:
        with open(args.spec, "rb") as fh:
            raw = fh.read()
        spec = json.loads(raw)
        prepare_sys_path(args.entry or str(spec.get("entry") or "module"))
        report = run(spec, audit=args.audit, facts=facts)
    except (OSError, ValueError, ProbeError) as exc:
        sys.stderr.write(f"servimg probe: error: {exc}\n")
        if args.json:
            sys.stdout.write(
                json.dumps({"probe_version": PROBE_VERSION, "error": str(exc), "ok": False}) + "\n"
            )
        return 2
    report["spec_sha256"] = hashlib.sha256(raw).hexdigest()
    (sys.stderr if args.json else sys.stdout).write(render(report))
    if args.json:
        sys.stdout.write(json.dumps(report, sort_keys=True, default=str) + "\n")
    return exit_status(report)


if __name__ == "__main__":
    sys.exit(main())
