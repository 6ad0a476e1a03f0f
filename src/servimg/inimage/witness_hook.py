"""servimg witness: records, inside every process of the image, which code an overlay module really ran.

Shipped by `servimg build` (definition `witness: true`) as `<site-packages>/servimg_witness.py` next to
`<site-packages>/servimg-witness.pth`, whose single line runs at interpreter start-up (site.py):

    import servimg_witness; servimg_witness.install('/opt/servimg/witness-spec.json', {...the spec...})

(the spec inline as a Python literal, so start-up reads and parses no other file; the JSON copy at that
path is for people and tools).

STANDARD LIBRARY ONLY, CPython 3.9-3.13 (no `match`, no runtime `X | Y`).

How. One `sys.addaudithook` hook; import semantics are untouched (no meta_path finder, no loader or
module is wrapped or replaced). The hook only observes events the import system raises anyway:

    open(path, ...)          a file is opened: the last `.pyc` opened is remembered per thread
    marshal.loads(data)      that pyc's code was unmarshalled
    compile(source, path)    a source was compiled (no pyc, or the pyc was rejected)
    exec(code)               a module body is about to run: `code` IS the code object executed

On an `exec` of a module body (`<module>`) whose module is a declared overlay module (found by its path,
or by name in `sys.modules` for a copy elsewhere on sys.path) it records the module, its origin, the pyc
used (or "compiled from source"), the sha256 of the origin file, the lock's expected path and sha256, and
for every sentinel (and forbidden name) of that module whether it is in that executed code object,
searched under its qualname as the probe does. Each process writes one JSON file into the witness dir
(`SERVIMG_WITNESS_DIR`, default /var/lib/servimg/witness), rewritten atomically (temp file, then
os.replace) at each record. A process that imports no overlay module writes nothing.

Cost. Start-up imports nothing beyond os/sys/time (already loaded by site.py). The hook runs for every
audit event of the process and returns after one set-membership test unless the event is one of the
four above. A record imports nothing heavy either (the sha256 builtin, a small JSON writer of its own;
`json` and `hashlib` only if the process already imported them). Failures are swallowed: they are
listed in the file's `errors` when it can be written, and never raised into the serving process.
`SERVIMG_WITNESS=0` turns the hook off.
"""

import os
import sys
import time
from _thread import allocate_lock, get_ident

TYPE_CHECKING = False  # typing is not imported at start-up; mypy reads the annotations (strings)
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from types import CodeType
    from typing import Any

WITNESS_VERSION = 1
DEFAULT_DIR = "/var/lib/servimg/witness"
_EVENTS = frozenset(("open", "marshal.loads", "compile", "exec"))
_CO_NEWLOCALS = 0x0002
_COMPREHENSIONS = ("<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>")
_MAX_ERRORS = 20

_installed = False
_spec_path = ""
_spec_raw: "Mapping[str, object]" = {}
_by_path: "dict[str, str]" = {}  # watched origin path -> module name
_names: "tuple[str, ...]" = ()  # watched module names
_pyc: "dict[int, list[object]]" = {}  # thread id -> [last pyc path opened, unmarshalled since?]
_compiled: "dict[int, str]" = {}  # thread id -> last filename compiled
_busy: "set[int]" = set()  # thread ids inside the hook's own work (its file I/O raises events too)
_lock = allocate_lock()


class _Spec:
    """The witness spec grouped once: modules by name, sentinels and forbidden names by module."""

    def __init__(self, raw: "Mapping[str, object]") -> None:
        self.image, self.lock_digest = raw.get("image"), raw.get("lock_digest")
        self.modules: dict[str, Mapping[str, object]] = {}
        self.sentinels: dict[str, list[Mapping[str, object]]] = {}
        self.forbidden: dict[str, list[Mapping[str, object]]] = {}
        for module in _items(raw.get("modules")):
            self.modules[str(module["module"])] = module
        for item in _items(raw.get("sentinels")):
            self.sentinels.setdefault(str(item["module"]), []).append(item)
        for item in _items(raw.get("forbidden")):
            self.forbidden.setdefault(str(item["module"]), []).append(item)


class _State:
    """What this process has recorded, and who it is (a forked child records as itself)."""

    def __init__(self) -> None:
        self.spec: _Spec | None = None
        self.records: list[dict[str, object]] = []
        self.errors: list[str] = []
        self.pid = 0
        self.started_ns = 0
        self.inherited_from: int | None = None


_state = _State()


def _items(value: object) -> "list[Mapping[str, object]]":
    """The JSON objects of a spec list; anything else is not the spec servimg writes (the caller records
    the error: the hook never breaks the process)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ValueError(f"the witness spec has {value!r} where a list of objects belongs")
    return value


# -- installation -----------------------------------------------------------------------------------
def install(spec_path: str, spec: "Mapping[str, object]") -> None:
    """Install the hook (once per process) for the overlay modules of `spec` (the witness spec)."""
    global _installed, _spec_path, _spec_raw, _by_path, _names
    try:
        if _installed or os.environ.get("SERVIMG_WITNESS", "1") == "0":
            return
        _spec_path, _spec_raw = str(spec_path), spec
        _by_path = {str(m["path"]): str(m["module"]) for m in _items(spec["modules"])}
        _names = tuple(sorted(_by_path.values()))
        _state.pid, _state.started_ns = os.getpid(), time.time_ns()
        sys.addaudithook(_hook)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork)
        _installed = True
    except Exception:
        pass  # never break interpreter start-up


def _after_fork() -> None:
    """A forked child writes its own file (new pid); what its parent recorded is marked inherited."""
    try:
        _state.inherited_from = _state.pid
        _state.pid, _state.started_ns = os.getpid(), time.time_ns()
        for record in _state.records:
            record["inherited"] = True
        _pyc.clear()
        _compiled.clear()
        _busy.clear()
    except Exception:
        pass


_CODE_TYPE = type(_after_fork.__code__)  # types.CodeType without importing types (or compiling)


# -- the hook ---------------------------------------------------------------------------------------
def _hook(event: str, args: "tuple[Any, ...]") -> None:
    if event not in _EVENTS:
        return
    tid = get_ident()
    if tid in _busy:
        return
    try:
        if event == "open":
            path = args[0]
            if type(path) is str and path.endswith(".pyc"):
                _pyc[tid] = [path, False]
                _compiled.pop(tid, None)
        elif event == "marshal.loads":
            state = _pyc.get(tid)
            if state is not None:
                state[1] = True
        elif event == "compile":
            if len(args) > 1 and type(args[1]) is str:
                _compiled[tid] = args[1]
        else:  # exec
            code = args[0]
            if isinstance(code, _CODE_TYPE) and code.co_name == "<module>":
                name = _watched_name(code.co_filename)
                if name is not None:
                    _busy.add(tid)
                    try:
                        _record(name, code, _pyc.pop(tid, None), _compiled.pop(tid, None))
                    finally:
                        _busy.discard(tid)
    except Exception as exc:  # never raise into the audited operation (that would fail the import)
        _error("hook", exc)


def _watched_name(filename: str) -> "str | None":
    name = _by_path.get(filename)
    if name is not None:
        return name
    modules = sys.modules
    for candidate in _names:  # a copy elsewhere on sys.path: the module being executed is in sys.modules
        module = modules.get(candidate)
        if module is not None and getattr(module, "__file__", None) == filename:
            return candidate
    return None


def _error(where: str, exc: BaseException) -> None:
    try:
        if len(_state.errors) < _MAX_ERRORS:
            _state.errors.append(f"{where}: {exc!r}")
    except Exception:
        pass


# -- one record -------------------------------------------------------------------------------------
def _record(name: str, code: "CodeType", pyc_state: "list[object] | None", compiled: "str | None") -> None:
    origin = code.co_filename
    record: dict[str, object] = {"module": name, "origin": origin, "time": time.time(), "thread": get_ident()}
    try:
        record["bytecode"] = _bytecode(origin, pyc_state, compiled)
        spec = _spec()
        expected = spec.modules.get(name) or {}
        record["expected_path"] = expected.get("path")
        record["expected_sha256"] = expected.get("sha256")
        record["source_sha256"] = _sha256(origin)
        record["origin_is_patched"] = bool(expected.get("path")) and _same_file(origin, str(expected["path"]))
        record["source_matches_lock"] = record["source_sha256"] is not None and record[
            "source_sha256"
        ] == expected.get("sha256")
        sentinels = [_find(code, s, "sentinel") for s in spec.sentinels.get(name, [])]
        forbidden = [_find(code, f, "forbidden") for f in spec.forbidden.get(name, [])]
        record["sentinels"], record["forbidden"] = sentinels, forbidden
        record["patched_code_ran"] = bool(
            record["origin_is_patched"]
            and record["source_matches_lock"]
            and all(s["present"] for s in sentinels)
            and not any(f["present"] for f in forbidden)
        )
    except Exception as exc:
        record["error"] = repr(exc)
        record["patched_code_ran"] = False
        _error("record " + name, exc)
    with _lock:
        _state.records.append(record)
        _write()


def _bytecode(origin: str, pyc_state: "list[object] | None", compiled: "str | None") -> "dict[str, object]":
    """Which bytecode the loader handed to exec: the pyc it unmarshalled, or a compile of the source."""
    if compiled == origin:
        return {"pyc": None, "how": "compiled from source"}
    if pyc_state is not None and pyc_state[1]:
        path = str(pyc_state[0])
        if _source_of(path) == origin:
            level = 0
            for part in path.split(".")[-3:-1]:
                if part.startswith("opt-") and part[4:].isdigit():
                    level = int(part[4:])
            return {"pyc": path, "how": "pyc", "opt_level": level}
    return {"pyc": None, "how": "unknown"}


def _source_of(pyc: str) -> str:
    """importlib.util.source_from_cache without importing it: `__pycache__/m.TAG[.opt-N].pyc` or the
    PYTHONPYCACHEPREFIX mirror of the source's directory → `m.py`; a legacy `m.pyc` → `m.py`."""
    head, name = os.path.split(pyc)
    prefix = (getattr(sys, "pycache_prefix", None) or "").rstrip(os.sep)
    if prefix and head.startswith(prefix + os.sep):
        head = head[len(prefix) :]
    elif os.path.basename(head) == "__pycache__":
        head = os.path.dirname(head)
    else:
        return pyc[:-1]
    return os.path.join(head, name.split(".")[0] + ".py")


def _same_file(a: str, b: str) -> bool:
    try:
        return a == b or os.path.realpath(a) == os.path.realpath(b)
    except Exception:
        return False


def _sha256(path: str) -> "str | None":
    try:
        digest = _sha256_factory()()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        return str(digest.hexdigest())
    except OSError:
        return None


def _sha256_factory() -> "Any":
    """hashlib's sha256 when the process has it already, else the builtin module (no OpenSSL start-up)."""
    hashlib = sys.modules.get("hashlib")
    if hashlib is not None:
        return hashlib.sha256
    try:
        from _sha2 import sha256  # type: ignore[import-not-found]  # 3.12+

        return sha256
    except ImportError:
        pass
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]  # 3.9-3.11

        return sha256
    except ImportError:
        import hashlib as imported

        return imported.sha256


def _spec() -> _Spec:
    """The witness spec, grouped on first use."""
    if _state.spec is None:
        _state.spec = _Spec(_spec_raw)
    return _state.spec


# -- code objects (the probe's rules: co_qualname on 3.11+, reconstructed before) ----------------------
def _walk(code: "CodeType") -> "Iterator[tuple[str, CodeType]]":
    native = sys.version_info >= (3, 11)
    stack = [("<module>", code)]
    while stack:
        qualname, obj = stack.pop()
        yield qualname, obj
        for const in obj.co_consts:
            if type(const) is _CODE_TYPE:
                stack.append((_child_qualname(obj, qualname, const, native), const))


def _child_qualname(parent: "CodeType", parent_qual: str, child: "CodeType", native: bool) -> str:
    if native:
        return str(child.co_qualname)
    name = child.co_name
    if parent_qual == "<module>":
        return name
    if not name.startswith("<") and name in _global_stores(parent):
        return name
    if parent.co_flags & _CO_NEWLOCALS and parent.co_name not in _COMPREHENSIONS:
        return parent_qual + ".<locals>." + name
    return parent_qual + "." + name


def _global_stores(code: "CodeType") -> "set[str]":
    """Names stored with STORE_GLOBAL in `code` (3.9/3.10 wordcode; `dis` would import collections)."""
    import opcode

    store, extended = opcode.opmap["STORE_GLOBAL"], opcode.EXTENDED_ARG
    raw, names, ext = code.co_code, set(), 0
    for i in range(0, len(raw) - 1, 2):
        op, arg = raw[i], raw[i + 1] | ext
        ext = arg << 8 if op == extended else 0
        if op == store:
            names.add(code.co_names[arg])
    return names


def _const_in(consts: "tuple[object, ...]", value: object) -> bool:
    for const in consts:
        if isinstance(const, (tuple, frozenset)):  # code constants are exactly these, never subclasses
            if _const_in(tuple(const), value):
                return True
        elif type(const) is type(value) and const == value:
            return True
    return False


def _holds(code: "CodeType", name: "str | None", const: object) -> bool:
    stack = [code]
    while stack:
        obj = stack.pop()
        if name is not None and name in obj.co_names:
            return True
        if name is None and _const_in(obj.co_consts, const):
            return True
        stack.extend(c for c in obj.co_consts if type(c) is _CODE_TYPE)
    return False


def _find(code: "CodeType", item: "Mapping[str, object]", kind: str) -> "dict[str, object]":
    """Whether `item`'s name (or constant) is in any code object named `item['qualname']` under `code`."""
    qualname, name, const = item.get("qualname"), item.get("name"), item.get("const")
    hits, objects = find_in_qualname(code, str(qualname), None if name is None else str(name), const)
    out = {"kind": kind, "qualname": qualname, "present": hits > 0, "hits": hits, "code_objects": objects}
    out.update({"key": item.get("key"), "name": name, "const": const})
    return out


def find_in_qualname(
    code: "CodeType", qualname: str, name: "str | None" = None, const: object = None
) -> "tuple[int, int]":
    """(code objects named `qualname` that hold the name/const, code objects named `qualname`)."""
    objs = [obj for qual, obj in _walk(code) if qual == qualname]
    return sum(1 for obj in objs if _holds(obj, name, const)), len(objs)


# -- the file ---------------------------------------------------------------------------------------
def witness_dir() -> str:
    return os.environ.get("SERVIMG_WITNESS_DIR") or DEFAULT_DIR


def _write() -> None:
    """Rewrite this process's file atomically (caller holds _lock)."""
    try:
        flags = sys.flags
        try:
            import _imp

            check = str(getattr(_imp, "check_hash_based_pycs", "default"))
        except Exception:
            check = "unknown"
        doc = {
            "witness_version": WITNESS_VERSION,
            "pid": _state.pid,
            "ppid": os.getppid(),
            "inherited_from": _state.inherited_from,
            "started_ns": _state.started_ns,
            "argv": list(getattr(sys, "argv", [])),
            "executable": sys.executable,
            "python": ".".join(str(v) for v in sys.version_info[:3]),
            "cache_tag": sys.implementation.cache_tag,
            "flags": {
                "optimize": flags.optimize,
                "check_hash_based_pycs": check,
                "pycache_prefix": getattr(sys, "pycache_prefix", None),
                "dont_write_bytecode": bool(sys.dont_write_bytecode),
            },
            "image": _spec_raw.get("image"),
            "lock_digest": _spec_raw.get("lock_digest"),
            "records": _state.records,
            "errors": _state.errors,
        }
        directory = witness_dir()
        os.makedirs(directory, exist_ok=True)
        name = f"witness-{_state.pid}-{_state.started_ns}.json"
        final = os.path.join(directory, name)
        tmp = os.path.join(directory, ".tmp-" + name)
        json = sys.modules.get("json")
        text = json.dumps(doc, sort_keys=True, default=repr) if json is not None else _dumps(doc)
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, final)
    except Exception as exc:
        _error("write", exc)


_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\", 10: "\\n", 13: "\\r", 9: "\\t"})


def _dumps(value: object) -> str:
    """A small JSON writer (sorted keys) so that a record never imports `json` (and with it `re`)."""
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str):
        return '"' + value.translate(_ESCAPES) + '"'
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return repr(value) if value == value and value not in (float("inf"), float("-inf")) else "null"
    if isinstance(value, dict):
        items = sorted((str(k), v) for k, v in value.items())
        return "{" + ", ".join(_dumps(k) + ": " + _dumps(v) for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_dumps(v) for v in value) + "]"
    return _dumps(repr(value))
