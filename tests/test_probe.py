"""The in-image probe: stdlib only, and every planted defect caught with its own code.

A temp dir plays the image: a fake site-packages holding `svpkg` (patched `svpkg/mod.py`, untouched
`svpkg/util.py`) with a dist-info RECORD made before the patch. The probe always runs in a SUBPROCESS of
a real interpreter (as in an image), and every pyc is written explicitly with py_compile by that same
interpreter: PYTHONDONTWRITEBYTECODE is set here, and the probe must never write bytecode itself.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.machinery
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
import venv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from servimg.core.digest import Digest
from servimg.core.errors import VerifyError
from servimg.definitions.definition import ImageDefinition, Sentinel
from servimg.definitions.lock import BaseLock, FileLock, InterpreterLock, Lock, OverlayLock, PackageLock
from servimg.inimage import probe
from servimg.proof import verify
from servimg.proof.sentinels import base_sentinel_verdicts, base_sources, sentinel_key
from servimg.render import findings_table

PROBE = Path(probe.__file__)

PRE = '''"""svpkg.mod before the overlay."""
LIMIT = 3


class Scheduler:
    def schedule(self, n):
        assert n <= LIMIT
        return legacy_path(n)


def legacy_path(n):
    return n
'''

POST = '''"""svpkg.mod after the overlay."""
LIMIT = 3


def _servimg_gate(n):
    if n > LIMIT:
        raise RuntimeError("servimg-gate")
    return n


class Scheduler:
    def schedule(self, n):
        return _servimg_gate(n)
'''
# Same size as POST, one constant different: a timestamp pyc of it passes importlib's mtime+size check.
POST_SAME_SIZE = POST.replace("LIMIT = 3", "LIMIT = 4")
# Same names, different code: what a stale pyc of an earlier revision holds.
POST_OLD = POST.replace("if n > LIMIT:", "if n >= LIMIT:")
UTIL = "def helper():\n    return 42\n"

# Writes pycs with the interpreter under test (argv: JSON list of jobs).
_WRITE_PYCS = """
import json, os, py_compile, sys
for job in json.loads(sys.argv[1]):
    src = job["src"]
    keep = open(src, "rb").read()
    stat = os.stat(src)
    if job.get("content") is not None:
        open(src, "w").write(job["content"])
        # py_compile stamps the source's mtime: keep the original, or the stamp depends on whether the
        # fixture's write and this one fell in the same second (a flake under load).
        os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    mode = getattr(py_compile.PycInvalidationMode, job["mode"])
    os.makedirs(os.path.dirname(job["cfile"]), exist_ok=True)
    py_compile.compile(src, cfile=job["cfile"], dfile=src, doraise=True, optimize=job["opt"],
                       invalidation_mode=mode)
    if job.get("content") is not None:
        open(src, "wb").write(keep)
        os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
"""


_FACTS = (
    "import importlib.util as u, sys, json; "
    "print(json.dumps([sys.version_info[:3], u.MAGIC_NUMBER.hex(), sys.implementation.cache_tag]))"
)


def sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def record_hash(data: str) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data.encode()).digest()).rstrip(b"=").decode()


def other_pythons() -> list[str]:
    found = []
    for version in ("3.9", "3.10", "3.12", "3.13"):
        for candidate in sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}")):
            found.append(str(candidate))
            break
    return found


class FakeImage:
    """A fake image's site-packages plus the spec the host would generate for it."""

    def __init__(self, root: Path, python: str = sys.executable) -> None:
        self.root, self.python = root, python
        self.site = root / "site"
        self.pkg = self.site / "svpkg"
        self.pkg.mkdir(parents=True)
        self.mod = self.pkg / "mod.py"
        self.util = self.pkg / "util.py"
        (self.pkg / "__init__.py").write_text("")
        self.util.write_text(UTIL)
        self.mod.write_text(POST)
        self.dist_info = self.site / "svpkg-1.0.dist-info"
        self.dist_info.mkdir()
        (self.dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: svpkg\nVersion: 1.0\n")
        rows = [
            ("svpkg/__init__.py", ""),
            ("svpkg/mod.py", PRE),  # RECORD describes the unpatched wheel
            ("svpkg/util.py", UTIL),
            ("svpkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: svpkg\nVersion: 1.0\n"),
        ]
        record = (
            "".join(f"{p},{record_hash(c)},{len(c)}\n" for p, c in rows) + "svpkg-1.0.dist-info/RECORD,,\n"
        )
        (self.dist_info / "RECORD").write_text(record)
        facts = json.loads(
            subprocess.run([python, "-c", _FACTS], capture_output=True, text=True, check=True).stdout
        )
        self.cache_tag = facts[2]
        self.spec: dict[str, Any] = {
            "spec_version": 1,
            "image": "test",
            "lock_digest": "sha256:" + "0" * 64,
            "entry": "none",
            "interpreter": {
                "path": python,
                "version": ".".join(str(v) for v in facts[0]),
                "magic": facts[1],
                "cache_tag": facts[2],
                "opt_levels": [0, 1, 2],
                "pycache_prefix": None,
            },
            "modules": [
                {
                    "module": "svpkg.mod",
                    "path": str(self.mod),
                    "sha256": sha(POST),
                    "site_packages": str(self.site),
                    "package": "svpkg",
                }
            ],
            "sentinels": [
                {
                    "module": "svpkg.mod",
                    "qualname": "Scheduler.schedule",
                    "name": "_servimg_gate",
                    "const": None,
                    "absent_in_base": True,
                    "base_has_sentinel": False,
                },
                {"module": "svpkg.mod", "qualname": "_servimg_gate", "name": None, "const": "servimg-gate"},
            ],
            "forbidden": [{"module": "svpkg.mod", "qualname": "Scheduler.schedule", "name": "legacy_path"}],
            "distributions": [
                {
                    "distribution": "svpkg",
                    "version": "1.0",
                    "import_name": "svpkg",
                    "dist_info": str(self.dist_info),
                    "record_sha256": sha(record),
                    "overlay_files": [{"path": str(self.mod), "post_sha256": sha(POST)}],
                }
            ],
            "packages": [{"import_name": "svpkg", "path": str(self.pkg), "overlay": True}],
        }
        # What a build leaves: fresh CHECKED_HASH pycs at every level for every source.
        self.write_pycs(
            [
                {"src": str(src), "opt": opt, "mode": "CHECKED_HASH"}
                for src in sorted(self.pkg.glob("*.py"))
                for opt in (0, 1, 2)
            ]
        )

    def pyc(self, source: Path, opt: int = 0, prefix: Path | None = None) -> Path:
        name = f"{source.stem}.{self.cache_tag}{'' if opt == 0 else f'.opt-{opt}'}.pyc"
        if prefix is not None:
            return prefix / str(source.parent).lstrip("/") / name
        return source.parent / "__pycache__" / name

    def write_pycs(self, jobs: Sequence[Mapping[str, Any]]) -> None:
        jobs = [{"cfile": str(self.pyc(Path(j["src"]), int(j["opt"]))), **j} for j in jobs]
        subprocess.run([self.python, "-c", _WRITE_PYCS, json.dumps(jobs)], check=True, env=_base_env())

    def stale(self, mode: str, opt: int = 0, cfile: Path | None = None) -> Path:
        """Overwrite mod.py's pyc with bytecode of an older revision of the patched source."""
        target = cfile or self.pyc(self.mod, opt)
        self.write_pycs(
            [{"src": str(self.mod), "opt": opt, "mode": mode, "content": POST_OLD, "cfile": str(target)}]
        )
        return target

    def run(
        self,
        *flags: str,
        env: Mapping[str, str] | None = None,
        pythonpath: Sequence[Path] | None = None,
        python: str | None = None,
        audit: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        spec_path = self.root / "spec.json"
        spec_path.write_text(json.dumps(self.spec))
        full_env = _base_env()
        full_env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (pythonpath or [self.site]))
        full_env.update(env or {})
        argv = [python or self.python, *flags, str(PROBE), str(spec_path), "--json"]
        proc = subprocess.run(
            [*argv, "--audit"] if audit else argv, capture_output=True, text=True, env=full_env, cwd=self.root
        )
        assert proc.returncode in (0, 1), proc.stderr + proc.stdout
        report = json.loads(proc.stdout)
        assert proc.returncode == (0 if report["ok"] else 1)
        assert "summary:" in proc.stderr  # the human report goes to stderr under --json
        return proc.returncode, report


def _base_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"}


def findings(report: Mapping[str, Any], status: str = probe.FAIL) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for check in report["checks"]:
        if check["status"] == status:
            out.setdefault(check["code"], []).append(check)
    return out


def codes(report: Mapping[str, Any], status: str = probe.FAIL) -> set[str]:
    return set(findings(report, status))


@pytest.fixture
def image(tmp_path: Path) -> FakeImage:
    return FakeImage(tmp_path)


# -- clean ------------------------------------------------------------------------------------------
def test_clean_image_has_no_findings(image: FakeImage) -> None:
    rc, report = image.run()
    assert rc == 0 and report["ok"]
    bad = [c for c in report["checks"] if c["status"] != probe.PASS]
    assert bad == []
    assert {c["code"] for c in report["checks"]} == {
        "INTERPRETER",
        "ORIGIN",
        "LOADER_KIND",
        "SOURCE_SHA",
        "LEGACY_PYC",
        "STALE_PYC",
        "SENTINEL",
        "ABSENT_IN_BASE",
        "FORBIDDEN",
        "RECORD",
        "UNCHECKED_PYC",
    }
    stale = findings(report, probe.PASS)["STALE_PYC"][0]
    assert len(stale["details"]["pycs"]) == 3, "levels 0, 1 and 2 were all examined"
    assert report["interpreter"]["dont_write_bytecode"] is True
    assert not any(image.pkg.glob("__pycache__/*.opt-3*")), "nothing unexpected written"


def test_probe_never_writes_bytecode(image: FakeImage) -> None:
    for pyc in image.pkg.glob("__pycache__/*"):
        pyc.unlink()
    _, report = image.run(env={"PYTHONDONTWRITEBYTECODE": ""})
    assert report["ok"]
    assert list(image.pkg.glob("__pycache__/*")) == []


def test_audit_reports_throughput_and_catches_untouched_stale_pyc(image: FakeImage) -> None:
    _, report = image.run(audit=True)
    audit = findings(report, probe.PASS)["AUDIT"][0]
    assert audit["details"]["sources"] == 3 and audit["details"]["files_per_s"] > 0
    assert "files/s" in audit["message"]
    image.write_pycs(
        [
            {
                "src": str(image.util),
                "opt": 0,
                "mode": "UNCHECKED_HASH",
                "content": "def helper():\n    return 41\n",
            }
        ]
    )
    _, report = image.run(audit=True)
    assert codes(report) == {"AUDIT"}
    assert "util" in findings(report)["AUDIT"][0]["message"]


# -- stale bytecode ---------------------------------------------------------------------------------
def test_stale_unchecked_hash_pyc(image: FakeImage) -> None:
    pyc = image.stale("UNCHECKED_HASH")
    rc, report = image.run()
    assert rc == 1 and codes(report) == {"STALE_PYC"}
    check = findings(report)["STALE_PYC"][0]
    assert str(pyc) in check["message"] and "loader's code differs" in check["message"]
    assert check["hint"].startswith(f"rm -f {pyc}")
    assert codes(report, probe.WARN) == {"UNCHECKED_PYC"}
    # Validating every hash pyc rejects it: then it is only a latent risk.
    _, report = image.run("--check-hash-based-pycs", "always")
    assert codes(report) == set() and codes(report, probe.WARN) == {"STALE_PYC", "UNCHECKED_PYC"}


def test_stale_checked_hash_pyc_under_never(image: FakeImage) -> None:
    image.stale("CHECKED_HASH")
    rc, report = image.run("--check-hash-based-pycs", "never")
    assert rc == 1 and codes(report) == {"STALE_PYC"}
    assert report["interpreter"]["check_hash_based_pycs"] == "never"
    rc, report = image.run()  # default mode validates checked pycs: rejected, not run
    assert rc == 0 and codes(report, probe.WARN) == {"STALE_PYC"}
    assert "never" in findings(report, probe.WARN)["STALE_PYC"][0]["message"]


def test_timestamp_pyc_with_matching_mtime_and_size(image: FakeImage) -> None:
    image.write_pycs([{"src": str(image.mod), "opt": 0, "mode": "TIMESTAMP", "content": POST_SAME_SIZE}])
    rc, report = image.run()
    assert rc == 1 and codes(report) == {"STALE_PYC"}
    assert "timestamp" in findings(report)["STALE_PYC"][0]["message"]


def test_stale_opt1_pyc(image: FakeImage) -> None:
    pyc = image.stale("UNCHECKED_HASH", opt=1)
    assert pyc.name.endswith(".opt-1.pyc")
    rc, report = image.run("-O")
    assert rc == 1 and codes(report) == {"STALE_PYC"}
    message = findings(report)["STALE_PYC"][0]["message"]
    assert str(pyc) in message and "loader's code differs" in message  # -O really loads it
    rc, report = image.run()  # without -O the interpreter skips it, but the image is still wrong
    assert rc == 1 and codes(report) == {"STALE_PYC"}


def test_stale_pyc_under_pycache_prefix(image: FakeImage, tmp_path: Path) -> None:
    prefix = tmp_path / "pycache-prefix"
    pyc = image.stale("UNCHECKED_HASH", cfile=image.pyc(image.mod, 0, prefix))
    rc, report = image.run()
    assert rc == 0, "without the prefix the mirror is unknown to the probe"
    rc, report = image.run(env={"PYTHONPYCACHEPREFIX": str(prefix)})
    assert rc == 1 and codes(report) == {"STALE_PYC"}
    assert str(pyc) in findings(report)["STALE_PYC"][0]["message"]
    image.spec["interpreter"]["pycache_prefix"] = str(prefix)  # the lock knows the base's prefix
    rc, report = image.run()
    assert rc == 1 and codes(report) == {"STALE_PYC"}


def test_legacy_sourceless_pyc(image: FakeImage) -> None:
    legacy = image.pkg / "mod.pyc"
    legacy.write_bytes(image.pyc(image.mod).read_bytes())
    rc, report = image.run()
    assert rc == 1 and codes(report) == {"LEGACY_PYC"}
    assert findings(report)["LEGACY_PYC"][0]["hint"] == f"rm -f {legacy}"


# -- origin and loaders -----------------------------------------------------------------------------
def _shadow(tmp_path: Path, name: str = "shadow") -> Path:
    shadow = tmp_path / name
    (shadow / "svpkg").mkdir(parents=True)
    (shadow / "svpkg" / "__init__.py").write_text("")
    (shadow / "svpkg" / "mod.py").write_text(PRE)
    return shadow


def test_shadowing_copy_on_pythonpath(image: FakeImage, tmp_path: Path) -> None:
    shadow = _shadow(tmp_path)
    rc, report = image.run(pythonpath=[shadow, image.site])
    fails = findings(report)
    assert rc == 1 and "ORIGIN" in fails
    assert str(shadow / "svpkg") in fails["ORIGIN"][0]["message"]
    assert "PYTHONPATH" in fails["ORIGIN"][0]["hint"]
    copies = fails["ORIGIN"][0]["details"]["copies"]
    assert [c["entry"] for c in copies] == [str(shadow), str(image.site)]
    assert {"SENTINEL", "FORBIDDEN", "SOURCE_SHA"} <= set(fails), "the shadow's code is what was checked"


def _venv_with_pth(tmp_path: Path, line: str) -> tuple[str, Path]:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    site = next(env.glob("lib/python3*/site-packages"))
    pth = site / "zz-shadow.pth"
    pth.write_text(line + "\n")
    return str(env / "bin" / "python"), pth


def test_pth_inserting_a_shadowing_dir(image: FakeImage, tmp_path: Path) -> None:
    shadow = _shadow(tmp_path)
    python, pth = _venv_with_pth(tmp_path, f"import sys; sys.path.insert(0, {str(shadow)!r})")
    rc, report = image.run(python=python)
    fails = findings(report)
    assert rc == 1 and "ORIGIN" in fails
    assert str(pth) in fails["ORIGIN"][0]["hint"] and f"rm {pth}" in fails["ORIGIN"][0]["hint"]


def test_pth_appending_a_copy_is_a_shadow_warning(image: FakeImage, tmp_path: Path) -> None:
    shadow = _shadow(tmp_path)
    python, pth = _venv_with_pth(tmp_path, str(shadow))
    rc, report = image.run(python=python)
    assert rc == 0 and codes(report, probe.WARN) == {"SHADOW"}
    warn = findings(report, probe.WARN)["SHADOW"][0]
    assert str(shadow / "svpkg") in warn["message"] and str(pth) in warn["hint"]


def test_namespace_package_cannot_be_verified(image: FakeImage) -> None:
    init = image.pkg / "__init__.py"
    image.spec["modules"].append(
        {
            "module": "svpkg",
            "path": str(init),
            "sha256": sha(""),
            "site_packages": str(image.site),
            "package": "svpkg",
        }
    )
    assert image.run()[0] == 0
    init.unlink()
    rc, report = image.run()
    kinds = findings(report)["LOADER_KIND"]
    assert rc == 1 and [c["subject"] for c in kinds] == ["svpkg"]
    assert "cannot verify: namespace" in kinds[0]["message"]


def test_extension_module_beside_the_source_cannot_be_verified(image: FakeImage) -> None:
    (image.pkg / f"mod{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")  # never loaded
    rc, report = image.run()
    fails = findings(report)
    assert rc == 1 and "cannot verify: extension" in fails["LOADER_KIND"][0]["message"]
    assert {"ORIGIN", "SENTINEL", "FORBIDDEN"} <= set(fails), "never a silent pass"
    assert "SENTINEL" not in codes(report, probe.PASS)


def test_deleted_file_must_be_absent(image: FakeImage) -> None:
    image.spec["modules"][0]["sha256"] = None
    image.spec["distributions"][0]["overlay_files"][0]["post_sha256"] = None
    image.spec["sentinels"] = image.spec["forbidden"] = []
    rc, report = image.run()
    assert rc == 1 and codes(report) == {"ORIGIN", "RECORD"}
    image.mod.unlink()
    rc, report = image.run()
    assert rc == 0 and codes(report) == set()


# -- sentinels and forbidden names ------------------------------------------------------------------
def test_sentinel_missing(image: FakeImage) -> None:
    image.spec["sentinels"][1]["const"] = "not-there"
    image.spec["sentinels"].append({"module": "svpkg.mod", "qualname": "Scheduler.schedul", "name": "x"})
    rc, report = image.run()
    fails = findings(report)["SENTINEL"]
    assert rc == 1 and len(fails) == 2
    assert "missing from all 1 code object(s)" in fails[0]["message"]
    assert "Scheduler.schedule" in fails[1]["details"]["nearest"]


def test_sentinel_present_in_base_does_not_discriminate(image: FakeImage) -> None:
    image.spec["sentinels"][0]["base_has_sentinel"] = True
    rc, report = image.run()
    assert rc == 1 and codes(report) == {"ABSENT_IN_BASE"}
    assert "does not discriminate" in findings(report)["ABSENT_IN_BASE"][0]["message"]
    image.spec["sentinels"][0]["base_has_sentinel"] = None
    rc, report = image.run()
    assert rc == 1 and codes(report) == {"ABSENT_IN_BASE"}, "no recorded verdict is never a pass"


def test_forbidden_name_present(image: FakeImage) -> None:
    image.spec["forbidden"].append({"module": "svpkg.mod", "qualname": "Scheduler", "name": "_servimg_gate"})
    rc, report = image.run()
    fails = findings(report)["FORBIDDEN"]
    assert rc == 1 and len(fails) == 1 and "present in 1 of 1" in fails[0]["message"]


# -- RECORD -----------------------------------------------------------------------------------------
def test_record_mismatch_of_an_untouched_file(image: FakeImage) -> None:
    image.util.write_text(UTIL.replace("42", "43"))
    rc, report = image.run()
    assert rc == 1 and codes(report) == {"RECORD"}
    assert findings(report)["RECORD"][0]["details"]["problems"] == [f"{image.util}: differs from RECORD"]
    assert findings(report)["RECORD"][0]["hint"].startswith("reinstall svpkg==1.0 in the base")
    image.util.unlink()
    _, report = image.run()
    assert findings(report)["RECORD"][0]["details"]["problems"] == [f"{image.util}: missing (or unreadable)"]


def test_overlay_file_still_equal_to_record(image: FakeImage) -> None:
    image.mod.write_text(PRE)
    rc, report = image.run()
    assert rc == 1 and {"RECORD", "SOURCE_SHA"} <= codes(report)
    assert findings(report)["RECORD"][0]["details"]["problems"] == [
        f"{image.mod}: overlay file still equals RECORD (the patch is not applied)"
    ]
    assert findings(report)["RECORD"][0]["hint"] == "servimg build images/test.yaml"


# -- other interpreters -----------------------------------------------------------------------------
@pytest.mark.parametrize("python", other_pythons() or [pytest.param(None, marks=pytest.mark.skip("none"))])
def test_other_interpreters(tmp_path: Path, python: str) -> None:
    image = FakeImage(tmp_path, python)
    rc, report = image.run()
    assert rc == 0 and [c for c in report["checks"] if c["status"] != probe.PASS] == []
    image.stale("UNCHECKED_HASH", opt=2)
    rc, report = image.run("-OO")
    assert rc == 1 and codes(report) == {"STALE_PYC"}
    assert "loader's code differs" in findings(report)["STALE_PYC"][0]["message"]


def test_qualname_reconstruction_on_3_9_matches_co_qualname(tmp_path: Path) -> None:
    pythons = [p for p in other_pythons() if "3.9" in p or "3.10" in p]
    if not pythons:
        pytest.skip("no 3.9/3.10 interpreter here")
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import probe; "
        "print(json.dumps(sorted(probe.qualnames(compile(open(sys.argv[2]).read(), 'x', 'exec')))))"
    )
    source = tmp_path / "tricky.py"
    source.write_text(TRICKY)
    expected = sorted(probe.qualnames(compile(TRICKY, "x", "exec"), native=True))  # 3.11: co_qualname
    for python in pythons:
        out = subprocess.run(
            [python, "-c", script, str(PROBE.parent), str(source)], capture_output=True, text=True, check=True
        )
        assert json.loads(out.stdout) == expected, python


# -- pure functions ---------------------------------------------------------------------------------
TRICKY = textwrap.dedent(
    """
    def f():
        global g
        def g(): pass
        x = [lambda: 1 for _ in range(2)]
        class C:
            def m(self): return (y for y in ())
            class Inner:
                def deep(self):
                    def deeper(): return {k: v for k, v in ()}
                    return deeper
        return C, x
    class D:
        def __priv(self): pass
        @property
        def p(self): return 1
        @p.setter
        def p(self, v): pass
        def outer(self):
            def inner(): return lambda: None
            return inner
    async def coro():
        async def nested(): pass
        return [i async for i in nested()]
    """
)


def test_qualname_reconstruction_matches_co_qualname() -> None:
    code = compile(TRICKY, "tricky", "exec")
    native = [(q, c.co_name) for q, c in probe.walk_code(code, native=True)]
    rebuilt = [(q, c.co_name) for q, c in probe.walk_code(code, native=False)]
    assert rebuilt == native
    assert "f.<locals>.C.Inner.deep.<locals>.deeper" in dict(native)
    assert "g" in dict(native) and "D.p" in dict(native)
    assert len(probe.qualnames(code)["D.p"]) == 2, "getter and setter share a qualname"


def test_code_equal_tolerates_nan_and_distinguishes_signed_zero() -> None:
    source = "x = float('nan')\ny = 1e999 * 0\nz = (1e999 * 0, 1j * 1e999 * 0)\n"
    a, b = compile(source, "m", "exec"), compile(source, "m", "exec")
    assert any(isinstance(c, float) and math.isnan(c) for c in a.co_consts), "a real NaN constant"
    assert a != b, "CPython's own == treats two NaN constants as different"
    assert probe.code_equal(a, b)
    assert not probe.code_equal(compile("x = 0.0", "m", "exec"), compile("x = -0.0", "m", "exec"))
    assert not probe.code_equal(compile("x = 1", "m", "exec"), compile("x = True", "m", "exec"))
    assert not probe.code_equal(compile("x = 1", "m", "exec"), compile("\nx = 1", "m", "exec")), "lines"
    nested_a = compile("def f():\n    return float('nan'), 1e999 * 0\n", "m", "exec")
    nested_b = compile("def f():\n    return float('nan'), 1e999 * 0\n", "other-file", "exec")
    assert probe.code_equal(nested_a, nested_b), "co_filename is not compared"
    changed = compile("def f():\n    return float('nan'), 1e999 * 1\n", "m", "exec")
    assert probe.code_diff(nested_a, changed) == "f: co_consts"


def test_code_equal_frozenset_order_and_marshal_round_trip() -> None:
    import marshal

    code = compile(POST + "\nS = x in {'a', 'b', 'c', 1.5, float('nan')}\n", "m", "exec")
    assert probe.code_equal(code, marshal.loads(marshal.dumps(code)))


def test_resolve_module_does_not_import(image: FakeImage) -> None:
    (image.pkg / "__init__.py").write_text("raise SystemExit('imported!')\n")
    sys.path.insert(0, str(image.site))
    try:
        spec = probe.resolve_module("svpkg.mod")
        assert spec.origin == str(image.mod) and probe.loader_kind(spec) == "source"
        assert "svpkg" not in sys.modules
        with pytest.raises(probe.ResolveError, match=r"svpkg\.nope"):
            probe.resolve_module("svpkg.nope")
        with pytest.raises(probe.ResolveError, match="is a module, not a package"):
            probe.resolve_module("svpkg.mod.sub")
    finally:
        sys.path.remove(str(image.site))
        sys.path_importer_cache.pop(str(image.site), None)


def test_pyc_acceptance_mirrors_importlib(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("x = 1\n")
    stat = src.stat()
    data = src.read_bytes()
    magic = importlib.util.MAGIC_NUMBER
    hashed = importlib.util.source_hash(data)
    stamp = (int(stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + stat.st_size.to_bytes(4, "little")

    def pyc(flags: int, key: bytes) -> bytes:
        return magic + flags.to_bytes(4, "little") + key

    assert probe.accepted_modes(pyc(0, stamp), data, stat) == ["default", "always", "never"]
    assert probe.accepted_modes(pyc(0, b"\0" * 8), data, stat) == []
    assert probe.accepted_modes(pyc(0b11, hashed), data, stat) == ["default", "always", "never"]
    assert probe.accepted_modes(pyc(0b11, b"\0" * 8), data, stat) == ["never"]
    assert probe.accepted_modes(pyc(0b01, b"\0" * 8), data, stat) == ["default", "never"]
    assert probe.accepted_modes(pyc(0b100, hashed), data, stat) == [], "unknown flags are refused"
    assert probe.pyc_kind(b"\0\0\0\0" + b"\0" * 12) == "foreign"


def test_run_in_process_restores_dont_write_bytecode(image: FakeImage) -> None:
    before = sys.dont_write_bytecode
    sys.path.insert(0, str(image.site))
    try:
        image.spec["interpreter"]["cache_tag"] = "cpython-0"
        report = probe.run(image.spec)
    finally:
        sys.path.remove(str(image.site))
        sys.path_importer_cache.pop(str(image.site), None)
    assert sys.dont_write_bytecode == before
    assert codes(report) == {"INTERPRETER"}
    with pytest.raises(probe.ProbeError):
        probe.run({"modules": "nope"})


# -- host side: spec from the lock, base verdicts, report -------------------------------------------
DEFINITION = """
name: testimg
repository: local/testimg
base: {{ref: "docker-daemon:base", digest: "sha256:{zeros}"}}
packages:
  svpkg: {{distribution: svpkg, version: "1.0"}}
overlays:
  - id: gate
    package: svpkg
    patch: overlays/svpkg/gate.patch
    sha256: "{zeros}"
    sentinels:
      - {{module: svpkg.mod, qualname: Scheduler.schedule, name: _servimg_gate, absent_in_base: true}}
      - {{module: svpkg.mod, qualname: _servimg_gate, const: servimg-gate}}
    forbidden:
      - {{module: svpkg.mod, qualname: Scheduler.schedule, name: legacy_path}}
"""


def _lock_for(image: FakeImage, definition: ImageDefinition, absent: tuple[str, ...] = ()) -> Lock:
    interp = image.spec["interpreter"]
    return Lock(
        name="testimg",
        definition_sha256=definition.digest.hex,
        base=BaseLock("docker-daemon:base", Digest("sha256", "0" * 64), Digest("sha256", "1" * 64), (), ""),
        interpreter=InterpreterLock(
            sys.executable,
            sys.executable,
            interp["version"],
            interp["magic"],
            interp["cache_tag"],
            (0, 1, 2),
            None,
        ),
        packages=(
            PackageLock(
                "svpkg",
                "svpkg",
                "1.0",
                str(image.site),
                str(image.dist_info),
                sha((image.dist_info / "RECORD").read_bytes()),
            ),
        ),
        overlays=(
            OverlayLock(
                "gate",
                "svpkg",
                "overlays/svpkg/gate.patch",
                "0" * 64,
                (FileLock(str(image.mod), sha(PRE), sha(POST), 0o644),),
                absent,
            ),
        ),
        source_date_epoch=0,
    )


def test_probe_spec_from_lock_runs_clean(image: FakeImage) -> None:
    definition = ImageDefinition.parse(DEFINITION.format(zeros="0" * 64))
    sentinels = definition.overlays[0].sentinels
    verdicts = base_sentinel_verdicts({"svpkg.mod": PRE.encode()}, sentinels)
    assert verdicts == {
        "svpkg.mod:Scheduler.schedule:name=_servimg_gate": False,
        'svpkg.mod:_servimg_gate:const="servimg-gate"': False,
    }
    assert base_sentinel_verdicts({"svpkg.mod": POST.encode()}, sentinels[:1]) == {
        sentinel_key(sentinels[0]): True
    }
    spec = verify.probe_spec(_lock_for(image, definition), definition, verdicts, entry="none")
    assert [m["module"] for m in spec["modules"]] == ["svpkg.mod"]
    assert spec["sentinels"][0]["base_has_sentinel"] is False
    assert spec["distributions"][0]["overlay_files"] == [{"path": str(image.mod), "post_sha256": sha(POST)}]
    files = verify.probe_files(spec)
    assert set(files) == {"opt/servimg/probe.py", "opt/servimg/probe-spec.json"}
    assert json.loads(files["opt/servimg/probe-spec.json"]) == spec
    image.spec = spec
    rc, data = image.run()
    assert rc == 0 and [c for c in data["checks"] if c["status"] != probe.PASS] == []
    report = verify.VerifyReport.from_json(data)
    assert report.ok and report.counts()[probe.PASS] == len(report.findings)
    table = findings_table(report)
    assert "SENTINEL" in table and "RECORD" in table and "OK" in table
    assert report.as_dict()["checks"] == data["checks"]

    # Without explicit verdicts, the lock's `sentinels_absent_in_base` decides; unknown is a FAIL.
    key = sentinel_key(sentinels[0])
    assert (
        verify.probe_spec(_lock_for(image, definition, (key,)), definition)["sentinels"][0][
            "base_has_sentinel"
        ]
        is False
    )
    image.spec = verify.probe_spec(_lock_for(image, definition), definition, entry="none")
    _, data = image.run()
    failed = verify.VerifyReport.from_json(data)
    assert not failed.ok and {c.code for c in failed.failures()} == {"ABSENT_IN_BASE"}
    assert "fix:" in findings_table(failed)


def test_base_sources_reads_each_sentinel_module_from_the_base(image: FakeImage) -> None:
    definition = ImageDefinition.parse(DEFINITION.format(zeros="0" * 64))
    base = {f"{image.site}/svpkg/mod.py": PRE.encode(), f"{image.site}/svpkg/__init__.py": b"# init\n"}
    sentinels = [
        *definition.overlays[0].sentinels,
        Sentinel(module="svpkg", qualname="<module>", name="x"),
        Sentinel(module="svpkg.new", qualname="<module>", name="x"),
    ]
    sources = base_sources(_lock_for(image, definition), sentinels, base.get)
    assert sources == {"svpkg.mod": PRE.encode(), "svpkg": b"# init\n"}
    verdicts = base_sentinel_verdicts(sources, sentinels)
    assert set(verdicts.values()) == {False} and len(verdicts) == 4


def test_module_names_from_paths() -> None:
    site = "/opt/venv/lib/python3.11/site-packages"
    assert (
        verify.module_name(f"{site}/vllm/v1/core/sched/scheduler.py", site) == "vllm.v1.core.sched.scheduler"
    )
    assert verify.module_name(f"{site}/vllm/__init__.py", site) == "vllm"
    assert verify.module_name(f"{site}/vllm/data.json", site) is None
    assert verify.module_name(f"{site}/vllm/bad-name.py", site) is None
    assert verify.module_name("/elsewhere/x.py", site) is None


def test_probe_spec_refuses_a_foreign_definition(image: FakeImage) -> None:
    definition = ImageDefinition.parse(DEFINITION.format(zeros="0" * 64))
    other = ImageDefinition.parse(DEFINITION.format(zeros="0" * 64).replace("local/testimg", "local/x"))
    with pytest.raises(VerifyError, match="another definition"):
        verify.probe_spec(_lock_for(image, definition), other)


def test_report_from_probe_error_is_refused() -> None:
    with pytest.raises(VerifyError, match="the probe failed"):
        verify.VerifyReport.from_json({"probe_version": 1, "error": "bad spec", "ok": False})


# -- the service's command (image Entrypoint + Cmd) -----------------------------------------------------
@pytest.mark.parametrize(
    ("config", "python_args", "entry"),
    [
        ({"Cmd": ["/opt/venv/bin/python", "-O", "-m", "svc"]}, ("-O",), "module"),
        (
            {"Cmd": ["python3.11", "-OO", "--check-hash-based-pycs", "never", "/app/main.py", "-O"]},
            ("-O", "-O", "--check-hash-based-pycs", "never"),
            "script:/app/main.py",
        ),
        (
            {
                "Entrypoint": ["python"],
                "Cmd": ["-Xpycache_prefix=/c", "-Es", "-u", "-W", "ignore", "-m", "x"],
            },
            ("-X", "pycache_prefix=/c", "-E", "-s"),
            "module",
        ),
        (
            {"Cmd": ["python", "--check-hash-based-pycs=always", "-c", "pass"]},
            ("--check-hash-based-pycs", "always"),
            "command",
        ),
        ({"Cmd": ["python", "-I", "-"]}, ("-I",), "command"),
        ({"Cmd": ["python"]}, (), "command"),
        ({"Cmd": ["/bin/sh", "-c", "exec python -O -m x"]}, (), None),
        ({"Entrypoint": ["tini", "--"], "Cmd": ["python", "-O", "-m", "x"]}, (), None),
        ({}, (), None),
    ],
)
def test_service_command(config: dict[str, Any], python_args: tuple[str, ...], entry: str | None) -> None:
    service = verify.service_command(config)
    assert (service.python_args, service.entry) == (python_args, entry)
    assert service.runs_python == (entry is not None)


def test_service_command_names_the_locked_interpreter() -> None:
    config = {"Cmd": ["/usr/local/bin/serve", "-O", "-m", "x"]}
    assert not verify.service_command(config).runs_python
    service = verify.service_command(config, "/usr/local/bin/serve")
    assert (service.python_args, service.entry) == (("-O",), "module")
