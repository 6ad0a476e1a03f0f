"""The witness: a `.pth`-installed audit hook that records which code an overlay module really executed.

Host tests run the hook exactly as an image does (a venv whose site-packages holds `servimg_witness.py`
and `servimg-witness.pth`) under every interpreter found (3.9-3.13 where installed). Image tests build the
tiny image with `witness: true` on python3.11 and python3.13, import the patched module for real in a
container, and collect the records with `servimg witness collect`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from servimg.inimage import witness_hook
from servimg.ladder.witness import HOOK_MODULE, PTH_NAME, pth_line, witness_files, witness_spec

HOOK = Path(witness_hook.__file__)
PROBE = Path(__file__).resolve().parent.parent / "src" / "servimg" / "inimage" / "probe.py"

BASE = """LIMIT = 3


def legacy_admit(n):
    assert n <= LIMIT
    return n


class Scheduler:
    def schedule(self, n):
        return legacy_admit(n)
"""
PATCHED = BASE.replace(
    "class Scheduler:",
    'def _servimg_admit(n):\n    if n > LIMIT:\n        raise ValueError("servimg-gate")\n    return n\n\n\n'
    "class Scheduler:",
).replace("return legacy_admit(n)", "return _servimg_admit(n)")

_WRITE_PYC = (
    "import py_compile, sys; py_compile.compile(sys.argv[1], cfile=sys.argv[2], dfile=sys.argv[3], "
    "doraise=True, invalidation_mode=getattr(py_compile.PycInvalidationMode, sys.argv[4]))"
)


def pythons() -> list[str]:
    found = [sys.executable]
    for version in ("3.9", "3.10", "3.12", "3.13"):
        for candidate in sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}")):
            found.append(str(candidate))
            break
    return found


class Venv:
    """A venv of `python` holding the patched `tinypkg` and the witness hook, as a witness image has."""

    def __init__(self, root: Path, python: str) -> None:
        self.root, self.python = root, python
        subprocess.run([python, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
        self.bin = str(root / "venv" / "bin" / "python")
        self.site = Path(self.run("import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
        self.tag = self.run("import sys; print(sys.implementation.cache_tag)").stdout.strip()
        pkg = self.site / "tinypkg"
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        self.core = pkg / "core.py"
        self.core.write_text(PATCHED)
        self.witness_dir = root / "witness"
        probe_spec = {
            "image": "test",
            "lock_digest": "sha256:" + "0" * 64,
            "modules": [
                {
                    "module": "tinypkg.core",
                    "path": str(self.core),
                    "sha256": hashlib.sha256(PATCHED.encode()).hexdigest(),
                    "site_packages": str(self.site),
                }
            ],
            "sentinels": [
                {
                    "key": "k1",
                    "module": "tinypkg.core",
                    "qualname": "Scheduler.schedule",
                    "name": "_servimg_admit",
                },
                {
                    "key": "k2",
                    "module": "tinypkg.core",
                    "qualname": "_servimg_admit",
                    "const": "servimg-gate",
                },
            ],
            "forbidden": [
                {"module": "tinypkg.core", "qualname": "Scheduler.schedule", "name": "legacy_admit"}
            ],
        }
        self.spec = witness_spec(probe_spec)
        shutil.copyfile(HOOK, self.site / f"{HOOK_MODULE}.py")
        self.write_pth(self.spec)

    def write_pth(self, spec: Mapping[str, Any]) -> None:
        (self.site / PTH_NAME).write_bytes(pth_line(spec))

    def pyc(self, mode: str, source: str = PATCHED, path: Path | None = None) -> Path:
        """Write a pyc of `source` for core.py (default: its __pycache__ entry)."""
        target = path or self.core.parent / "__pycache__" / f"core.{self.tag}.pyc"
        target.parent.mkdir(parents=True, exist_ok=True)
        src = self.root / "src.py"
        src.write_text(source)
        subprocess.run(
            [self.python, "-c", _WRITE_PYC, str(src), str(target), str(self.core), mode], check=True
        )
        return target

    def run(
        self, code: str, env: Mapping[str, str] | None = None, args: Sequence[str] = ()
    ) -> subprocess.CompletedProcess[str]:
        full = {"PATH": "/usr/bin:/bin", "SERVIMG_WITNESS_DIR": str(self.root / "witness"), **(env or {})}
        return subprocess.run(
            [getattr(self, "bin", self.python), *args, "-c", code],
            capture_output=True,
            text=True,
            env=full,
            cwd=self.root,
        )

    def documents(self) -> list[dict[str, Any]]:
        if not self.witness_dir.exists():
            return []
        docs = [json.loads(p.read_text()) for p in sorted(self.witness_dir.iterdir())]
        return sorted(docs, key=lambda d: d["started_ns"])


@pytest.fixture(params=pythons(), ids=lambda p: Path(p).name)
def venv(request: pytest.FixtureRequest, tmp_path: Path) -> Venv:
    return Venv(tmp_path, request.param)


IMPORT = "import tinypkg.core as m; print(m.Scheduler().schedule(2))"


def only_record(venv: Venv) -> dict[str, Any]:
    docs = venv.documents()
    assert len(docs) == 1 and len(docs[0]["records"]) == 1, docs
    record: dict[str, Any] = docs[0]["records"][0]
    return record


# -- the hook's own constraints -----------------------------------------------------------------------
def test_hook_start_up_imports_stay_cheap() -> None:
    """Every serving process imports the hook at start-up (stdlib only and 3.9 grammar: test_inimage.py)."""
    tree = ast.parse(HOOK.read_text())
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    at_startup = {alias.name for node in top for alias in node.names}
    assert at_startup <= {"os", "sys", "time", "allocate_lock", "get_ident"}, "start-up imports stay cheap"


def test_witness_files_put_the_hook_beside_each_overlay_package() -> None:
    spec = {
        "image": "x",
        "lock_digest": "sha256:" + "1" * 64,
        "modules": [
            {"module": "a.m", "path": "/s1/a/m.py", "sha256": "0" * 64, "site_packages": "/s1"},
            {"module": "b", "path": "/s2/b/__init__.py", "sha256": "1" * 64, "site_packages": "/s2"},
            {"module": "a.gone", "path": "/s1/a/gone.py", "sha256": None, "site_packages": "/s1"},
        ],
        "sentinels": [],
        "forbidden": [],
    }
    out = witness_files(spec)
    assert sorted(out) == [
        "opt/servimg/witness-spec.json",
        "s1/servimg-witness.pth",
        "s1/servimg_witness.py",
        "s2/servimg-witness.pth",
        "s2/servimg_witness.py",
    ]
    line = out["s1/servimg-witness.pth"].decode()
    assert line.startswith("import servimg_witness; ") and line.endswith("\n") and line.count("\n") == 1
    call = ast.parse(line.partition("; ")[2]).body[0].value  # type: ignore[attr-defined]
    assert ast.unparse(call.func) == "servimg_witness.install"
    path, inline = (ast.literal_eval(arg) for arg in call.args)
    assert path == "/opt/servimg/witness-spec.json"
    assert inline == json.loads(out["opt/servimg/witness-spec.json"]), "the spec inline = the JSON copy"
    assert [m["module"] for m in inline["modules"]] == ["a.m", "b"], "a deleted module never runs"
    assert out["s2/servimg_witness.py"] == HOOK.read_bytes()


# -- what it records ---------------------------------------------------------------------------------
def test_records_the_fresh_pyc_and_the_patched_code(venv: Venv) -> None:
    pyc = venv.pyc("CHECKED_HASH")
    proc = venv.run(IMPORT)
    assert proc.returncode == 0 and proc.stdout == "2\n" and proc.stderr == ""
    record = only_record(venv)
    assert record["module"] == "tinypkg.core" and record["origin"] == str(venv.core)
    assert record["bytecode"] == {"how": "pyc", "pyc": str(pyc), "opt_level": 0}
    assert record["source_sha256"] == hashlib.sha256(PATCHED.encode()).hexdigest()
    assert record["origin_is_patched"] and record["source_matches_lock"]
    assert [(s["key"], s["present"], s["hits"]) for s in record["sentinels"]] == [
        ("k1", True, 1),
        ("k2", True, 1),
    ]
    assert [f["present"] for f in record["forbidden"]] == [False]
    assert record["patched_code_ran"] is True
    doc = venv.documents()[0]
    assert doc["pid"] > 0 and doc["errors"] == [] and doc["argv"] == ["-c"]
    assert not any(p.name.startswith(".tmp") for p in venv.witness_dir.iterdir()), "atomic writes"


def test_a_stale_pyc_is_what_ran(venv: Venv) -> None:
    pyc = venv.pyc("UNCHECKED_HASH", source=BASE)  # the interpreter runs it although core.py is patched
    proc = venv.run("import tinypkg.core as m; print(m.Scheduler().schedule.__code__.co_names)")
    assert proc.returncode == 0 and "legacy_admit" in proc.stdout
    record = only_record(venv)
    assert record["bytecode"]["pyc"] == str(pyc)
    assert record["source_matches_lock"] is True, "the source is patched …"
    assert [s["present"] for s in record["sentinels"]] == [False, False], "… the executed code is not"
    assert [f["present"] for f in record["forbidden"]] == [True]
    assert record["patched_code_ran"] is False


def test_compiled_from_source_when_there_is_no_pyc(venv: Venv) -> None:
    proc = venv.run(IMPORT, env={"PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0
    record = only_record(venv)
    assert record["bytecode"] == {"pyc": None, "how": "compiled from source"}
    assert record["patched_code_ran"] is True


def test_optimised_pyc_under_pythonoptimize(venv: Venv) -> None:
    pyc = venv.pyc("CHECKED_HASH", path=venv.core.parent / "__pycache__" / f"core.{venv.tag}.opt-1.pyc")
    # py_compile wrote it at level 0; what matters is which file the loader opened under -O
    proc = venv.run(IMPORT, env={"PYTHONOPTIMIZE": "1"})
    assert proc.returncode == 0
    record = only_record(venv)
    assert record["bytecode"] == {"how": "pyc", "pyc": str(pyc), "opt_level": 1}


def test_a_shadowing_copy_is_recorded_by_name(venv: Venv, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "tinypkg"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    (shadow / "core.py").write_text(BASE)
    proc = venv.run(IMPORT, env={"PYTHONPATH": str(shadow.parent), "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0
    record = only_record(venv)
    assert record["origin"] == str(shadow / "core.py") and record["origin_is_patched"] is False
    assert record["expected_path"] == str(venv.core) and record["patched_code_ran"] is False


def test_nothing_is_written_without_an_overlay_import_or_when_disabled(venv: Venv) -> None:
    assert venv.run("import json, email.message").returncode == 0
    assert venv.documents() == []
    assert venv.run(IMPORT, env={"SERVIMG_WITNESS": "0"}).returncode == 0
    assert venv.documents() == []


def test_never_breaks_the_process(venv: Venv, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    proc = venv.run(IMPORT, env={"SERVIMG_WITNESS_DIR": str(blocker / "witness")})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "2\n", ""), "unwritable dir: silent"
    broken = {**venv.spec, "sentinels": ["not a mapping"]}
    venv.write_pth(broken)  # a sentinel the hook cannot evaluate
    proc = venv.run(IMPORT)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "2\n", "")
    doc = venv.documents()[0]
    assert doc["errors"] and doc["errors"][0].startswith("record tinypkg.core: "), "the failure is recorded"
    assert doc["records"][0]["patched_code_ran"] is False and "error" in doc["records"][0]
    venv.write_pth({"modules": "not a list"})  # install() itself fails: the interpreter still starts
    proc = venv.run(IMPORT)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "2\n", "")


def test_a_forked_child_writes_its_own_file(venv: Venv) -> None:
    script = (
        "import os, tinypkg\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    import tinypkg.core\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "import tinypkg.core\n"
    )
    assert venv.run(script, env={"PYTHONDONTWRITEBYTECODE": "1"}).returncode == 0
    docs = venv.documents()
    assert len(docs) == 2 and docs[0]["pid"] != docs[1]["pid"]
    child = next(d for d in docs if d["inherited_from"] is not None)
    parent = next(d for d in docs if d["inherited_from"] is None)
    assert child["inherited_from"] == parent["pid"]
    assert [r["module"] for r in child["records"]] == ["tinypkg.core"]
    assert [r["module"] for r in parent["records"]] == ["tinypkg.core"]


_QUALNAMES = r"""
import importlib.util, json, sys
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
hook, probe = load("h", sys.argv[1]), load("p", sys.argv[2])
code = compile(open(sys.argv[3]).read(), "m.py", "exec", dont_inherit=True)
mine = sorted(q for q, _ in hook._walk(code))
theirs = sorted(q for q, objs in probe.qualnames(code).items() for _ in objs)
found = [hook.find_in_qualname(code, q, "x") for q in ("A.f", "g.<locals>.h")]
print(json.dumps([mine == theirs, mine, found]))
"""
_TRICKY = """
class A:
    def f(self):
        return [y for y in range(x)]
    class B:
        def f(self):
            return x
def g():
    def h():
        return x
    return lambda: h
def k():
    global late
    def late():
        return x
"""


@pytest.mark.parametrize("python", pythons(), ids=lambda p: Path(p).name)
def test_qualnames_match_the_probe(python: str, tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(_TRICKY)
    proc = subprocess.run(
        [python, "-c", _QUALNAMES, str(HOOK), str(PROBE), str(tmp_path / "m.py")],
        capture_output=True,
        text=True,
    )
    same, names, found = json.loads(proc.stdout)
    assert same, names
    assert "late" in names and "g.<locals>.h" in names and "A.B.f" in names
    assert found == [[1, 1], [1, 1]]


# -- in images ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["bookworm", "trixie"], ids=["py3.11", "py3.13"])
def witnessed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from conftest import _require, docker_available
    from servimg.oci.store import BlobStore
    from tinyimage import build_tiny, cleanup

    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    _require(docker_available(), "needs a running Docker Engine")
    root = tmp_path_factory.mktemp(f"witness-{request.param}") / "repo"
    built = build_tiny(
        request.param, BlobStore(), root, print, lambda t: t.replace("witness: false", "witness: true")
    )
    assert built.definition.witness
    yield built
    cleanup(built)


def _container(image: str, *argv: str, user: str | None = None, env: Mapping[str, str] | None = None) -> str:
    from servimg.backends.engine import client

    container = client().containers.run(
        image, list(argv), entrypoint=[], network_mode="none", detach=True, user=user, environment=env
    )
    assert container.wait(timeout=120)["StatusCode"] == 0, container.logs().decode()
    return str(container.id)


def _collect(container: str, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    from servimg.cli import main

    code = main(["witness", "collect", container, "--out", str(out), "--json"])
    lines = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(lines[-1])


def _remove(container: str) -> None:
    from servimg.backends.engine import client

    client().containers.get(container).remove(force=True)


@pytest.mark.docker
@pytest.mark.root
def test_witness_image_records_the_patched_code(
    witnessed: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fakebase import HOST_SEAMS, on_host
    from servimg.oci.store import BlobStore
    from servimg.proof.verifier import verify_ref

    report = verify_ref(
        witnessed.tag,
        on_host(BlobStore(), lambda _: None),
        verifier=HOST_SEAMS.verifier,
        host=HOST_SEAMS.host,
    )
    assert report.ok and report.counts()["WARN"] == 0, "the hook does not disturb the probe"
    container = _container(
        witnessed.tag,
        witnessed.interpreter,
        "-c",
        "import tinypkg.core as m; print(m.Scheduler().schedule(2))",
    )
    try:
        code, out = _collect(container, tmp_path / "w", capsys)
    finally:
        _remove(container)
    assert code == 0 and out["status"] == "OK" and out["problems"] == []
    doc = json.loads(next((tmp_path / "w").glob("witness-*.json")).read_text())
    records = {r["module"]: r for r in doc["records"]}
    assert set(records) == {"tinypkg", "tinypkg.core"}
    core = records["tinypkg.core"]
    assert core["origin"] == witnessed.core and core["patched_code_ran"] is True
    assert core["bytecode"]["pyc"] == witnessed.pyc(witnessed.core), "the build's fresh checked-hash pyc ran"
    assert core["source_sha256"] == next(
        f.post_sha256 for o in witnessed.lock.overlays for f in o.files if f.path == witnessed.core
    )
    assert {s["key"]: s["present"] for s in core["sentinels"]} == {
        "tinypkg.core:Scheduler.schedule:name=_servimg_admit": True,
        'tinypkg.core:_servimg_admit:const="servimg-gate: over the limit"': True,
    }
    assert doc["python"] == witnessed.lock.interpreter.version and doc["lock_digest"] == str(
        witnessed.lock.digest
    )


@pytest.mark.docker
@pytest.mark.root
def test_witness_shows_a_stale_pyc_ran_in_a_non_root_process(
    witnessed: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tinyimage import compile_in_image, files, plant

    base_core = witnessed.base_source(witnessed.core).decode()
    job = {"name": "stale", "source": base_core, "mode": "UNCHECKED_HASH", "opt": 0, "dfile": witnessed.core}
    stale = compile_in_image(witnessed.tag, witnessed.interpreter, [job])["stale"]
    pyc = witnessed.pyc(witnessed.core)
    image = plant(witnessed, "witness-stale", files({pyc: stale}))
    container = _container(image, witnessed.interpreter, "-c", "import tinypkg.core", user="65534:65534")
    try:
        code, out = _collect(container, tmp_path / "w", capsys)
    finally:
        _remove(container)
    assert code == 1 and out["status"] == "FAIL"
    assert any("tinypkg.core" in p and "sentinel(s) missing" in p and pyc in p for p in out["problems"])
    doc = json.loads(next((tmp_path / "w").glob("witness-*.json")).read_text())
    core = next(r for r in doc["records"] if r["module"] == "tinypkg.core")
    assert core["bytecode"]["pyc"] == pyc and core["source_matches_lock"] is True
    assert [f["present"] for f in core["forbidden"]] == [True]


@pytest.mark.docker
@pytest.mark.root
def test_collect_fails_when_no_process_imported_an_overlay_module(
    witnessed: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    container = _container(witnessed.tag, witnessed.interpreter, "-c", "import json")
    try:
        code, out = _collect(container, tmp_path / "w", capsys)
    finally:
        _remove(container)
    assert code == 1 and "no witness records" in out["message"]


def test_the_hook_and_a_record_import_nothing_heavy(venv: Venv) -> None:
    venv.pyc("CHECKED_HASH")
    listing = "import tinypkg.core, sys; print('\\n'.join(sorted(sys.modules)))"
    with_hook = set(venv.run(listing).stdout.split())
    without = set(venv.run(listing, env={"SERVIMG_WITNESS": "0"}).stdout.split())
    assert venv.documents(), "the record was written"
    extra = with_hook - without
    assert extra <= {"_sha2", "_sha256", "dis", "opcode", "_opcode", "collections", "keyword", "operator"}, (
        extra
    )
    assert not extra & {"json", "re", "hashlib", "importlib.util", "typing"}


@pytest.mark.parametrize(
    "value",
    [
        {"a": 'quote " backslash \\ newline \n tab \t nul \x00 \x1f é ✓ 🙂', "b": [1, 2.5, -0.0, True, None]},
        {"nested": {"z": [], "a": {}}, "n": 10**20, "f": float("nan")},
    ],
)
def test_the_hooks_json_writer(value: dict[str, Any]) -> None:
    text = witness_hook._dumps(value)
    expected = json.loads(json.dumps(value).replace("NaN", "null"))
    assert json.loads(text) == expected
