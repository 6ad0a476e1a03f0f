"""The Nix wrapper (flake.nix, nix/): what can be checked without nixpkgs and without a network.

Every Nix command runs against a private store under tmp (NIX_STORE_DIR/NIX_STATE_DIR/…, sandbox off,
no substituters), with the host's /bin/sh, /usr/bin and this venv's python as the builders' tools
(nix/default.nix's `toolchain`). What needs nixpkgs (the servimg package, the pytest check, the
formatter) is evaluated against an inert stand-in only; docs/nix.md lists exactly what is verified.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, _require, docker
from servimg.core.digest import Digest
from servimg.definitions.lock import (
    BaseLock,
    FileLock,
    InterpreterLock,
    Lock,
    OverlayLock,
    PackageLock,
    lock_path_for,
)

pytestmark = pytest.mark.nix

NIX_FILES = [REPO / "flake.nix", *sorted((REPO / "nix").glob("*.nix"))]
DRIFT = "inputs drifted from the lock"

# A stand-in for nixpkgs with only what flake.nix and nix/servimg.nix use: every package is an inert
# derivation (builder /bin/false, never built) that records what it was made from.
STUB_NIXPKGS = r"""
let
  system = "x86_64-linux";
  inert = name: extra: builtins.derivation { inherit name system; builder = "/bin/false"; } // extra;
  letters = s: builtins.filter (c: builtins.isString c && c != "") (builtins.split "" s);
  upper = letters "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  lower = letters "abcdefghijklmnopqrstuvwxyz";
  lib = {
    genAttrs = names: f: builtins.listToAttrs (map (n: { name = n; value = f n; }) names);
    makeBinPath = ps: builtins.concatStringsSep ":" (map (p: "${p}/bin") ps);
    mapAttrs' = f: set: builtins.listToAttrs (map (n: f n set.${n}) (builtins.attrNames set));
    nameValuePair = name: value: { inherit name value; };
    toLower = builtins.replaceStrings upper lower;
    optionals = cond: list: if cond then list else [ ];
    fileset = { unions = list: list; toSource = { root, fileset }: root; };
    licenses.asl20 = "asl20";
    platforms.linux = [ "x86_64-linux" "aarch64-linux" ];
  };
  python3Packages = builtins.listToAttrs (map (n: { name = n; value = inert n { }; }) [
    "setuptools" "pydantic" "pyyaml" "docker" "requests" "rich" "cryptography" "pynacl" "python-pkcs11"
    "packaging" "pytestCheckHook" "hypothesis"
  ]) // {
    buildPythonApplication = attrs: inert "${attrs.pname}-${attrs.version}" { stubArgs = attrs; };
    toPythonModule = drv: drv;
  };
  pkgs = {
    inherit lib python3Packages;
    python3.withPackages = f: inert "python3-env" { };
    writeShellScriptBin = name: text: inert name { inherit text; };
  } // builtins.listToAttrs (map (n: { name = n; value = inert n { }; }) [
    "bash" "coreutils" "util-linux" "cacert" "nixpkgs-fmt"
  ]);
in
{ inherit lib; legacyPackages = lib.genAttrs [ "x86_64-linux" "aarch64-linux" ] (_: pkgs); }
"""


# -- harness --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A private Nix store and configuration: the environment for every nix command in this module."""
    _require(shutil.which("nix-instantiate") is not None, "needs Nix (Debian: apt-get install nix-bin)")
    root = tmp_path_factory.mktemp("nix")
    (root / "conf").mkdir()
    (root / "conf" / "nix.conf").write_text(
        "sandbox = false\nbuild-users-group =\nsubstituters =\nexperimental-features = nix-command\n"
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        "XDG_CONFIG_HOME": str(root / "xdg"),
        "NIX_STORE_DIR": str(root / "store"),
        "NIX_STATE_DIR": str(root / "var"),
        "NIX_LOG_DIR": str(root / "log"),
        "NIX_CONF_DIR": str(root / "conf"),
    }
    yield env
    subprocess.run(["chmod", "-R", "u+w", str(root)], check=False)  # the store is read-only
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def toolchain(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The host's tools as nix/default.nix's `toolchain` (a Nix expression). Nix starts a builder with
    argv[0] = its basename and PATH from the derivation, so the venv's python is called through a
    wrapper that execs it by its full path (nixpkgs' python3.withPackages is such a wrapper too)."""
    wrapper = tmp_path_factory.mktemp("toolchain") / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return (
        '{ system = builtins.currentSystem; shell = "/bin/sh"; path = "/usr/bin:/bin"; '
        f'python = "{wrapper}"; sandboxPath = "/usr/sbin:/usr/bin:/sbin:/bin"; cacert = null; }}'
    )


def run_nix(
    env: dict[str, str], *args: str, check: bool = True, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """Run a nix command in `cwd` (relative paths in --expr resolve against it)."""
    proc = subprocess.run(list(args), env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(args[:3])} … failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def nix_eval(env: dict[str, str], expr: str) -> Any:
    return json.loads(run_nix(env, "nix-instantiate", "--eval", "--strict", "--json", "--expr", expr).stdout)


def nix_lock(env: dict[str, str], repo: Path, attr: str) -> subprocess.CompletedProcess[str]:
    return run_nix(
        env,
        "nix-instantiate",
        "--eval",
        "--strict",
        "--json",
        str(repo / "nix/lock.nix"),
        "-A",
        attr,
        check=False,
    )


def locked_definitions(repo: Path = REPO) -> list[Path]:
    """The single-platform definitions with a lock: what the flake builds (a multi-platform lock is listed
    in `multiPlatform` instead, nix/lock.nix)."""
    return sorted(
        p
        for p in (repo / "images").iterdir()
        if p.suffix in (".yaml", ".yml") and lock_path_for(p).exists() and not _multi_platform(p)
    )


def _multi_platform(definition: Path) -> bool:
    return "platforms" in json.loads(lock_path_for(definition).read_bytes())


def copy_repo(dest: Path) -> Path:
    for name in ("images", "overlays", "nix", "verify"):
        shutil.copytree(REPO / name, dest / name)
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


# -- parse ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", NIX_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_nix_file_parses(nix: dict[str, str], path: Path) -> None:
    run_nix(nix, "nix-instantiate", "--parse", str(path))


def test_every_builder_script_is_valid() -> None:
    for script in sorted((REPO / "nix").glob("*.sh")):
        subprocess.run(["/bin/sh", "-n", str(script)], check=True)
    for script in sorted((REPO / "nix").glob("*.py")):
        compile(script.read_text(), str(script), "exec")


# -- nix/lock.nix against the Python lock reader --------------------------------------------------
def _schema_of(cls: Any) -> dict[str, Any]:
    required, defaults = [], {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
        else:
            required.append(f.name)
    return {"required": required, "defaults": json.loads(json.dumps(defaults))}


def test_lock_schema_mirrors_the_dataclasses(nix: dict[str, str]) -> None:
    """nix/lock.nix refuses unknown keys like Lock.from_json; its key lists must follow lock.py."""
    schema = nix_eval(nix, "(import ./nix/lock.nix { }).schema")
    classes = {
        "lock": Lock,
        "base": BaseLock,
        "interpreter": InterpreterLock,
        "package": PackageLock,
        "overlay": OverlayLock,
        "file": FileLock,
    }
    for kind, cls in classes.items():
        expected = _schema_of(cls)
        assert sorted(schema[kind]["required"]) == sorted(expected["required"]), kind
        assert schema[kind]["defaults"] == expected["defaults"], kind


def test_lock_nix_reads_every_lock_like_the_python_reader(nix: dict[str, str]) -> None:
    definitions = locked_definitions()
    assert definitions, "the repository has at least the demo lock"
    names = nix_eval(nix, "(import ./nix/lock.nix { }).names")
    assert names == [p.stem for p in definitions]
    multi = nix_eval(nix, "(import ./nix/lock.nix { }).multiPlatform")
    assert multi == sorted(
        p.stem for p in (REPO / "images").glob("*.yaml") if lock_path_for(p).exists() and _multi_platform(p)
    )
    assert multi == ["tiny-multiarch"]
    for definition in definitions:
        lock = Lock.load(lock_path_for(definition))
        got = nix_eval(nix, f"(import ./nix/lock.nix {{ }}).images.{definition.stem}")
        expected = lock.to_json()
        assert {k: got[k] for k in expected} == expected  # every lock value, defaults included
        assert got["digest"] == str(lock.digest)  # the canonical-JSON digest, recomputed by builtins
        assert got["definition"] == f"images/{definition.name}"
        assert got["lock_file"] == f"images/{lock_path_for(definition).name}"
        transport = {"docker-daemon:": "engine", "oci:": "oci", "docker-archive:": "archive"}
        kind = next((v for k, v in transport.items() if lock.base.ref.startswith(k)), "registry")
        assert got["base_transport"] == kind
        # The aliases the derivations use.
        assert got["source_date_epoch"] == lock.source_date_epoch
        assert got["base"]["manifest_digest"] == str(lock.base.manifest_digest)
        assert got["base"]["diff_ids"] == [str(d) for d in lock.base.diff_ids]
        assert [o["id"] for o in got["overlays"]] == [o.id for o in lock.overlays]
    assert nix_eval(nix, "(import ./nix/lock.nix { }).ok") is True


def test_a_tampered_patch_makes_evaluation_throw(nix: dict[str, str], tmp_path: Path) -> None:
    repo = copy_repo(tmp_path)
    lock = Lock.load(repo / "images/demo.lock.json")
    overlay = lock.overlays[0]
    patch = repo / overlay.patch
    patch.write_bytes(patch.read_bytes() + b"x")
    proc = nix_lock(nix, repo, "images.demo")
    assert proc.returncode != 0
    assert DRIFT in proc.stderr
    assert f"overlays[0].patch_sha256: locked {json.dumps(overlay.patch_sha256)}" in proc.stderr
    assert Digest.of_bytes(patch.read_bytes()).hex in proc.stderr
    assert overlay.patch in proc.stderr and overlay.id in proc.stderr
    assert "servimg lock images/demo.yaml" in proc.stderr
    # Every consumer of the lock refuses too: the `ok` summary and the image derivation's inputs.
    assert nix_lock(nix, repo, "ok").returncode != 0


def test_a_definition_that_no_longer_pins_the_lock_throws(nix: dict[str, str], tmp_path: Path) -> None:
    repo = copy_repo(tmp_path)
    lock = Lock.load(repo / "images/demo.lock.json")
    definition = repo / "images/demo.yaml"
    text = definition.read_text()
    definition.write_text(text.replace(lock.overlays[1].patch_sha256, "0" * 64))
    proc = nix_lock(nix, repo, "images.demo")
    assert proc.returncode != 0 and DRIFT in proc.stderr
    assert f"images/demo.yaml does not pin the locked {lock.overlays[1].patch_sha256}" in proc.stderr
    definition.write_text(text.replace(str(lock.base.manifest_digest), "sha256:" + "0" * 64))
    proc = nix_lock(nix, repo, "images.demo")
    assert proc.returncode != 0 and f"does not pin the locked {lock.base.manifest_digest}" in proc.stderr


def test_a_malformed_lock_is_refused_by_both_readers(nix: dict[str, str], tmp_path: Path) -> None:
    from servimg.core.errors import LockError

    repo = copy_repo(tmp_path)
    path = repo / "images/demo.lock.json"
    data = json.loads(path.read_text())
    data["base"]["surprise"] = True
    del data["interpreter"]["magic"]
    path.write_text(json.dumps(data))
    with pytest.raises(LockError, match="malformed lock"):
        Lock.load(path)
    proc = nix_lock(nix, repo, "images.demo")
    assert proc.returncode != 0
    assert "malformed lock (2 problem(s))" in proc.stderr
    assert "base.surprise: unknown key" in proc.stderr
    assert "interpreter.magic: required key is missing" in proc.stderr


# -- builds without nixpkgs -----------------------------------------------------------------------
def test_the_lock_pins_check_builds_offline(nix: dict[str, str], toolchain: str) -> None:
    expr = f"(import ./nix/default.nix {{ toolchain = {toolchain}; }}).checks.lock-demo"
    out = Path(run_nix(nix, "nix-build", "--no-out-link", "--expr", expr).stdout.strip())
    report = out.read_text()
    lock = Lock.load(REPO / "images/demo.lock.json")
    assert report.splitlines()[0] == f"lock {lock.digest}"
    assert report.count(": OK") == len(lock.overlays)


def test_the_lock_pins_builder_refuses_a_wrong_pin(nix: dict[str, str], toolchain: str) -> None:
    """The check's own builder refuses drift too (not only the evaluation before it)."""
    expr = (
        f"let checks = import ./nix/checks.nix {{ toolchain = {toolchain}; }}; in checks.lockPins {{"
        ' name = "wrong"; digest = "sha256:x"; lock_file = "images/demo.lock.json";'
        ' overlays = [ { patch = "overlays/vllm/computed-tokens-gate.patch";'
        f' patch_sha256 = "{"0" * 64}"; }} ]; }}'
    )
    proc = run_nix(nix, "nix-build", "--no-out-link", "--expr", expr, check=False)
    assert proc.returncode != 0
    assert "an overlay patch drifted" in proc.stderr


def test_a_local_only_base_asks_for_its_blobs(nix: dict[str, str], toolchain: str) -> None:
    """The demo base cannot be fetched: its manifest FOD fails with the add-fixed instructions (and
    nothing is fetched from anywhere)."""
    expr = f"(import ./nix/default.nix {{ toolchain = {toolchain}; }}).bases.demo.drvPath"
    proc = run_nix(nix, "nix-instantiate", "--eval", "--read-write-mode", "--expr", expr, check=False)
    assert proc.returncode != 0
    assert "nix-store --add-fixed sha256" in proc.stderr
    assert "servimg base demo --to oci:" in proc.stderr


# -- flake.nix wiring, against an inert nixpkgs ---------------------------------------------------
def test_flake_outputs_are_wired(nix: dict[str, str], tmp_path: Path) -> None:
    stub = tmp_path / "stub-nixpkgs.nix"
    stub.write_text(STUB_NIXPKGS)
    lock = Lock.load(REPO / "images/demo.lock.json")
    expr = f"""
      let
        flake = import ./flake.nix;
        out = flake.outputs {{ self = {{ }}; nixpkgs = import {stub}; }};
        sys = "x86_64-linux";
        names = builtins.attrNames;
        demo = out.packages.${{sys}}.demo.drvAttrs;
        cli = out.packages.${{sys}}.servimg;
      in {{
        inputs = flake.inputs.nixpkgs.url;
        systems = map names [ out.packages out.apps out.checks out.formatter ];
        packages = names out.packages.${{sys}};
        apps = builtins.mapAttrs (_: a: a.type) out.apps.${{sys}};
        appProgram = out.apps.${{sys}}.check.program;
        checks = names out.checks.${{sys}};
        demo = {{
          inherit (demo) name SOURCE_DATE_EPOCH SERVIMG_DEFINITION SERVIMG_LOCK_DIGEST SERVIMG_BASE_MANIFEST
            SERVIMG_BASE_INDEX DOCKER_HOST;
          mode = builtins.elemAt demo.args 1;
        }};
        servimg = {{
          inherit (cli.stubArgs) pname version pyproject doCheck;
          dependencies = map (d: d.name) cli.stubArgs.dependencies;
        }};
        tests = {{ inherit (out.checks.${{sys}}.tests.stubArgs) doCheck pytestFlagsArray; }};
        lockDigest = out.lib.locks.images.demo.digest;
      }}
    """
    got = nix_eval(nix, expr)
    assert got["inputs"] == "github:NixOS/nixpkgs/nixos-24.11"
    assert got["systems"] == [["aarch64-linux", "x86_64-linux"]] * 4
    images = [p.stem for p in locked_definitions()]
    assert sorted(got["packages"]) == sorted(["default", "servimg", *images, *(f"{i}-base" for i in images)])
    assert got["apps"] == {"default": "app", "check": "app", "ladder": "app"}
    assert got["appProgram"].endswith("/bin/servimg-check")
    assert sorted(got["checks"]) == sorted(
        ["tests", *(f"lock-{i}" for i in images), *(f"probe-{i}" for i in images)]
    )
    assert got["demo"] == {
        "name": "servimg-image-demo",
        "SOURCE_DATE_EPOCH": str(lock.source_date_epoch),
        "SERVIMG_DEFINITION": "images/demo.yaml",
        "SERVIMG_LOCK_DIGEST": str(lock.digest),
        "SERVIMG_BASE_MANIFEST": str(lock.base.manifest_digest),
        "SERVIMG_BASE_INDEX": str(lock.base.index_digest or ""),
        "DOCKER_HOST": "unix:///nonexistent/servimg-nix-build-has-no-docker.sock",
        "mode": "build-image",
    }
    assert got["servimg"] == {
        "pname": "servimg",
        "version": "0.1.0",
        "pyproject": True,
        "doCheck": False,
        "dependencies": [
            "pyyaml",
            "docker",
            "requests",
            "rich",
            "cryptography",
            "pynacl",
            "python-pkcs11",
            "packaging",
        ],
    }
    assert got["tests"]["doCheck"] is True
    assert (
        "not docker and not registry and not demo and not root and not nix"
        in got["tests"]["pytestFlagsArray"]
    )
    assert got["lockDigest"] == str(lock.digest)


def test_flake_lock_pins_nixpkgs_by_rev_and_nar_hash() -> None:
    lock = json.loads((REPO / "flake.lock").read_text())
    assert lock["version"] == 7 and lock["root"] == "root"
    assert lock["nodes"]["root"]["inputs"] == {"nixpkgs": "nixpkgs"}
    node = lock["nodes"]["nixpkgs"]
    assert node["original"] == {"owner": "NixOS", "repo": "nixpkgs", "ref": "nixos-24.11", "type": "github"}
    locked = node["locked"]
    assert locked["type"] == "github" and locked["owner"] == "NixOS" and locked["repo"] == "nixpkgs"
    assert len(locked["rev"]) == 40 and int(locked["rev"], 16) >= 0
    assert locked["narHash"].startswith("sha256-") and len(locked["narHash"]) == 51
    assert set(lock["nodes"]) == {"root", "nixpkgs"}  # no flake-utils


# -- the claim: `nix build .#demo` has the CLI's digest -------------------------------------------
def servimg(argv: list[str]) -> dict[str, Any]:
    """The servimg CLI as a user runs it; its --json result."""
    proc = subprocess.run(
        [sys.executable, "-m", "servimg.cli", *argv, "--json"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def nix_built_demo(
    nix: dict[str, str], toolchain: str, tmp_path_factory: pytest.TempPathFactory, demo_base: dict[str, Any]
) -> Path:
    """The image derivation, built by Nix itself (empty environment + the derivation's attributes) inside
    `unshare --net`, from a base whose blobs entered the store by digest (nix-store --add-fixed)."""
    _require(shutil.which("unshare") is not None, "needs util-linux unshare")
    layout = tmp_path_factory.mktemp("demo-base") / "oci"
    servimg(["base", "demo", "--to", f"oci:{layout}"])
    blobs = sorted(str(p) for p in (layout / "blobs" / "sha256").iterdir())
    run_nix(nix, "nix-store", "--add-fixed", "sha256", *blobs)
    shutil.rmtree(layout.parent)  # the store holds the blobs now; a second 4+ GB copy only fills the disk
    expr = f"(import ./nix/default.nix {{ toolchain = {toolchain}; }}).images.demo"
    proc = run_nix(nix, "unshare", "--net", "nix-build", "--no-out-link", "--expr", expr)
    return Path(proc.stdout.strip())


@pytest.mark.demo
@pytest.mark.docker
@pytest.mark.root
def test_nix_build_has_the_cli_digest(nix_built_demo: Path, tmp_path: Path) -> None:
    archive = tmp_path / "cli.tar"
    # A plain `servimg build` in this environment (default runner: docker when the engine has the base).
    cli = servimg(["build", str(REPO / "images/demo.yaml"), "--to", f"docker-archive:{archive}"])
    built = json.loads((nix_built_demo / "build.json").read_text())
    assert (nix_built_demo / "digest").read_text().strip() == cli["digest"]
    assert built["config_digest"] == cli["config_digest"] and built["lock_digest"] == cli["lock_digest"]
    assert Digest.of_file(str(nix_built_demo / "image.tar")) == Digest.of_file(str(archive))


@pytest.mark.demo
@pytest.mark.docker
@pytest.mark.root
def test_docker_loads_the_nix_built_archive(nix_built_demo: Path) -> None:
    """`docker load < result/image.tar` gives the image whose ID is the config digest."""
    built = json.loads((nix_built_demo / "build.json").read_text())
    with (nix_built_demo / "image.tar").open("rb") as fh:
        load = subprocess.run(["docker", "load", "-q"], stdin=fh, capture_output=True, text=True)
    assert load.returncode == 0, load.stderr
    image_id = docker("image", "inspect", "-f", "{{.Id}}", built["config_digest"]).stdout.strip()
    assert image_id == built["config_digest"]


@pytest.mark.demo
@pytest.mark.docker
@pytest.mark.root
def test_the_probe_check_passes_on_the_nix_built_image(
    nix: dict[str, str], toolchain: str, nix_built_demo: Path
) -> None:
    expr = f"(import ./nix/default.nix {{ toolchain = {toolchain}; }}).checks.probe-demo"
    proc = run_nix(nix, "unshare", "--net", "nix-build", "--no-out-link", "--expr", expr)
    report = json.loads((Path(proc.stdout.strip()) / "verify.json").read_text())
    assert report["status"] == "OK"
