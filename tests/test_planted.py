"""Planted defects: one image per failure mode, each caught by `servimg verify` with its own code, on two
interpreters inside real images (Debian 12's python3.11, Debian 13's python3.13).

Every defect image is the clean tiny image that `servimg build` made (tests/fixtures/images/tiny.yaml on
the local test base) plus one small layer, as a broken Dockerfile step would leave it (tests/tinyimage.py).
The clean image itself passes with zero findings: no FAIL, no WARN.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import _require, docker_available
from fakebase import HOST_SEAMS, on_host
from servimg.assembly.context import Context
from servimg.cli import main
from servimg.core.errors import DefinitionError
from servimg.inimage import probe
from servimg.oci.layer import Entry, Kind
from servimg.oci.store import BlobStore
from servimg.proof.sentinels import base_sentinel_verdicts
from servimg.proof.verifier import verify_ref
from servimg.proof.verify import VerifyReport, probe_spec, run_probe_in_docker
from tinyimage import Tiny, build_tiny, cleanup, compile_in_image, files, plant

pytestmark = [pytest.mark.docker, pytest.mark.root]

SAME_SIZE = ("servimg-gate: over the limit", "servimg-gate: past the limit")  # an earlier revision
# tinypkg 1.1 as upstream might release it: it adopted our sentinel's name for its own (different) check.
ADOPTED_CORE = '''"""tinypkg.core 1.1"""

from tinypkg.util import clamp

LIMIT = 3


def _servimg_admit(n, limit):
    return min(n, limit)


class Scheduler:
    def __init__(self, limit=LIMIT):
        self.limit = limit

    def schedule(self, n):
        return clamp(_servimg_admit(n, self.limit), self.limit)
'''


@pytest.fixture(scope="module", params=["bookworm", "trixie"], ids=["py3.11", "py3.13"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiny]:
    _require(os.geteuid() == 0 and shutil.which("mmdebstrap") is not None, "needs root and mmdebstrap")
    _require(docker_available(), "needs a running Docker Engine")
    store = BlobStore()
    built = build_tiny(request.param, store, tmp_path_factory.mktemp(request.param) / "repo", print)
    expected = {"bookworm": "3.11", "trixie": "3.13"}[request.param]
    assert built.lock.interpreter.version.startswith(expected + ".")
    base_core = built.base_source(built.core).decode()
    patched = built.image_source(built.core).decode()
    assert patched.count(SAME_SIZE[0]) == 1
    revision = patched.replace(*SAME_SIZE)
    stale = [
        ("base-unchecked-0", base_core, "UNCHECKED_HASH", 0, None),
        ("base-checked-0", base_core, "CHECKED_HASH", 0, None),
        ("base-unchecked-1", base_core, "UNCHECKED_HASH", 1, None),
        ("base-timestamp-0", base_core, "TIMESTAMP", 0, None),
        ("revision-timestamp-0", revision, "TIMESTAMP", 0, built.core),
    ]
    jobs = [
        {"name": n, "source": src, "mode": m, "opt": o, "dfile": built.core, "stat_like": like}
        for n, src, m, o, like in stale
    ]
    built.pycs = compile_in_image(str(built.image.config_digest), built.interpreter, jobs)
    yield built
    cleanup(built)


def verify(image: str) -> VerifyReport:
    return verify_ref(
        image, on_host(BlobStore(), lambda _: None), verifier=HOST_SEAMS.verifier, host=HOST_SEAMS.host
    )


def fails(report: VerifyReport, status: str = probe.FAIL) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for check in report.findings:
        if check.status == status:
            out.setdefault(check.code, []).append(check)
    return out


def codes(report: VerifyReport, status: str = probe.FAIL) -> set[str]:
    return set(fails(report, status))


def shadow_copy(tiny: Tiny, where: str) -> list[Entry]:
    """The unpatched package vendored into `where` (a second source tree, e.g. COPY of the app)."""
    return files(
        {
            f"{where}/tinypkg/{name}": tiny.base_source(f"{tiny.pkg}/{name}")
            for name in ("__init__.py", "core.py", "util.py")
        }
    )


# -- the clean image ---------------------------------------------------------------------------------
def test_clean_image_has_zero_findings(tiny: Tiny, capsys: pytest.CaptureFixture[str]) -> None:
    report = verify(tiny.tag)
    assert [c for c in report.findings if c.status != probe.PASS] == []
    assert {c.code for c in report.findings} == {
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
        "LAYER",
    }
    assert report.interpreter["version"] == tiny.lock.interpreter.version
    assert main(["verify", tiny.tag, "--json"]) == 0
    assert '"status": "OK"' in capsys.readouterr().out


# -- stale bytecode ----------------------------------------------------------------------------------
def test_unchecked_hash_pyc_of_the_base(tiny: Tiny) -> None:
    pyc = tiny.pyc(tiny.core)
    image = plant(tiny, "unchecked", files({pyc: tiny.pycs["base-unchecked-0"]}))
    report = verify(image)
    # The pyc replaces the one servimg's layer wrote there: LAYER names it too.
    assert codes(report) == {"STALE_PYC", "SENTINEL", "FORBIDDEN", "LAYER"}
    assert f"/{pyc.lstrip('/')} has sha256" in fails(report)["LAYER"][0].message
    assert codes(report, probe.WARN) == {"UNCHECKED_PYC"}
    stale = fails(report)["STALE_PYC"][0]
    assert pyc in stale.message and "unchecked-hash" in stale.message
    assert "loader's code differs" in stale.message, "the interpreter really loads it"
    assert stale.hint.startswith(f"rm -f {pyc}")


def test_checked_hash_pyc_under_check_hash_based_pycs_never(tiny: Tiny) -> None:
    service = [tiny.interpreter, "--check-hash-based-pycs", "never", "-m", "tinypkg.core"]
    pyc = tiny.pyc(tiny.core)
    image = plant(tiny, "never", files({pyc: tiny.pycs["base-checked-0"]}), cmd=service)
    report = verify(image)  # the probe runs under the image command's flags
    assert report.interpreter["check_hash_based_pycs"] == "never"
    assert codes(report) == {"STALE_PYC", "SENTINEL", "FORBIDDEN", "LAYER"}
    assert "checked-hash" in fails(report)["STALE_PYC"][0].message
    # Under the default mode the interpreter rejects it: only a latent risk, a warning.
    default = VerifyReport.from_json(run_probe_in_docker(image, python_args=[]))
    # The file is not the one the layer wrote (LAYER, whatever the mode); as bytecode it is a latent risk.
    assert codes(default) == {"LAYER"} and codes(default, probe.WARN) == {"STALE_PYC"}
    assert "never" in fails(default, probe.WARN)["STALE_PYC"][0].message


def test_timestamp_pyc_whose_mtime_and_size_match(tiny: Tiny) -> None:
    pyc = tiny.pyc(tiny.core)
    image = plant(tiny, "timestamp", files({pyc: tiny.pycs["revision-timestamp-0"]}))
    report = verify(image)
    # The earlier revision still calls the gate; only its constant differs: the const sentinel sees it.
    assert codes(report) == {"STALE_PYC", "SENTINEL", "LAYER"}
    stale = fails(report)["STALE_PYC"][0]
    assert "(timestamp, " in stale.message and "loader's code differs" in stale.message
    assert [c.subject for c in fails(report)["SENTINEL"]] == ["tinypkg.core:_servimg_admit"]


def test_stale_opt1_pyc_under_pythonoptimize(tiny: Tiny) -> None:
    pyc = tiny.pyc(tiny.core, opt=1)
    image = plant(tiny, "opt-1", files({pyc: tiny.pycs["base-unchecked-1"]}), env={"PYTHONOPTIMIZE": "1"})
    report = verify(image)
    assert report.interpreter["optimize"] == 1
    assert codes(report) == {"STALE_PYC", "SENTINEL", "FORBIDDEN"}
    message = fails(report)["STALE_PYC"][0].message
    assert pyc in message and "loader's code differs" in message, "-O loads the .opt-1 pyc"


def test_stale_tree_under_pycache_prefix_from_the_image_env(tiny: Tiny) -> None:
    prefix = "/var/cache/pycache"
    pyc = tiny.pyc(tiny.core, prefix=prefix)
    image = plant(
        tiny, "prefix", files({pyc: tiny.pycs["base-unchecked-0"]}), env={"PYTHONPYCACHEPREFIX": prefix}
    )
    report = verify(image)
    assert report.interpreter["pycache_prefix"] == prefix
    assert codes(report) == {"STALE_PYC", "SENTINEL", "FORBIDDEN"}
    assert pyc in fails(report)["STALE_PYC"][0].message
    assert codes(report, probe.WARN) == {"UNCHECKED_PYC"}


def test_legacy_sourceless_pyc(tiny: Tiny) -> None:
    legacy = f"{tiny.pkg}/core.pyc"
    image = plant(tiny, "legacy", files({legacy: tiny.pycs["base-timestamp-0"]}))
    report = verify(image)
    assert codes(report) == {"LEGACY_PYC"}
    assert fails(report)["LEGACY_PYC"][0].hint == f"rm -f {legacy}"


# -- origin --------------------------------------------------------------------------------------------
def test_shadowing_copy_on_pythonpath(tiny: Tiny) -> None:
    image = plant(tiny, "pythonpath", shadow_copy(tiny, "/srv/app"), env={"PYTHONPATH": "/srv/app"})
    report = verify(image)
    assert {"ORIGIN", "SOURCE_SHA", "SENTINEL", "FORBIDDEN"} <= codes(report)
    origin = fails(report)["ORIGIN"]
    assert {c.subject for c in origin} == {"tinypkg", "tinypkg.core"}
    assert "/srv/app/tinypkg/core.py" in " ".join(c.message for c in origin)
    assert all("PYTHONPATH" in c.hint for c in origin)


def test_shadowing_copy_inserted_by_a_pth_file(tiny: Tiny) -> None:
    pth = f"{tiny.site}/zz-vendored.pth"
    entries = [
        *shadow_copy(tiny, "/srv/vendor"),
        *files({pth: b"import sys; sys.path.insert(0, '/srv/vendor')\n"}),
    ]
    report = verify(plant(tiny, "pth", entries))
    assert {"ORIGIN", "SOURCE_SHA", "SENTINEL", "FORBIDDEN"} <= codes(report)
    hint = fails(report)["ORIGIN"][0].hint
    assert pth in hint and f"rm {pth}" in hint


def test_shadowing_copy_in_the_working_directory_of_python_m(tiny: Tiny) -> None:
    service = [tiny.interpreter, "-m", "tinypkg.core"]
    image = plant(tiny, "cwd", shadow_copy(tiny, "/srv/app"), cmd=service, workdir="/srv/app")
    report = verify(image)  # `python -m` puts the working directory first on sys.path
    assert report.environment["cwd"] == "/srv/app"
    assert {"ORIGIN", "SOURCE_SHA", "SENTINEL", "FORBIDDEN"} <= codes(report)
    assert "sys.path[0]" in fails(report)["ORIGIN"][0].hint
    # Without the image's command the probe would not know: the same image, probed as `python -c`.
    other = VerifyReport.from_json(run_probe_in_docker(image, python_args=[], entry="none"))
    assert codes(other) == set()


# -- loaders ---------------------------------------------------------------------------------------
def test_extension_module_beside_the_source(tiny: Tiny) -> None:
    extension = f"{tiny.pkg}/core.{tiny.cache_tag}-x86_64-linux-gnu.so"
    report = verify(plant(tiny, "extension", files({extension: b""})))  # never loaded by the probe
    loader = fails(report)["LOADER_KIND"]
    assert [c.subject for c in loader] == ["tinypkg.core"]
    assert loader[0].message.startswith("cannot verify: extension") and extension in loader[0].message
    assert {"ORIGIN", "SENTINEL", "FORBIDDEN"} <= codes(report), "never a silent pass"
    assert "SENTINEL" not in codes(report, probe.PASS)


def test_package_turned_into_a_namespace_package(tiny: Tiny) -> None:
    report = verify(plant(tiny, "namespace", [Entry(f"{tiny.pkg}/__init__.py".lstrip("/"), Kind.WHITEOUT)]))
    loader = fails(report)["LOADER_KIND"]
    assert [c.subject for c in loader] == ["tinypkg"]
    assert loader[0].message.startswith("cannot verify: namespace")
    assert "tinypkg.core" not in {c.subject for c in loader}, "its submodule still loads from source"


# -- sentinels ---------------------------------------------------------------------------------------
def test_sentinel_adopted_upstream(tiny: Tiny) -> None:
    wanted = [s for o in tiny.definition.overlays for s in o.sentinels if s.absent_in_base]
    verdicts = base_sentinel_verdicts({"tinypkg.core": ADOPTED_CORE.encode()}, wanted)
    assert list(verdicts.values()) == [True]
    spec = probe_spec(tiny.lock, tiny.definition, base_has=verdicts)
    from servimg.core import canonical
    from servimg.proof.verify import SPEC_IN_IMAGE

    report = verify(plant(tiny, "adopted", files({SPEC_IN_IMAGE: canonical.dumps(spec)})))
    assert codes(report) == {"ABSENT_IN_BASE"}
    assert "does not discriminate" in fails(report)["ABSENT_IN_BASE"][0].message
    assert "SENTINEL" in codes(report, probe.PASS), "a sentinel grep alone would have passed"


def test_lock_refuses_a_sentinel_the_base_already_has(tiny: Tiny, tmp_path: Path) -> None:
    from servimg.assembly.pipeline import lock
    from tinyimage import prepare_repo

    base = {"oci_ref": tiny.definition.base.ref, "digest": str(tiny.definition.base.digest)}
    extra = (
        "      - module: tinypkg.core\n        qualname: Scheduler.schedule\n"
        "        name: clamp\n        absent_in_base: true\n    forbidden:\n"
    )
    path = prepare_repo(tmp_path / "repo", base, lambda t: t.replace("    forbidden:\n", extra, 1))
    refused = r"already present in the base: tinypkg\.core:Scheduler\.schedule:name=clamp"
    with pytest.raises(DefinitionError, match=refused):
        lock(path, Context(tiny.store, lambda _: None, seams=HOST_SEAMS), "docker")
    assert not (tmp_path / "repo" / "images" / "tiny.lock.json").exists()
