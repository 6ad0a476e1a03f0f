"""Tiny hostile (or honest) base images built locally with `tarfile`, for the issue-7 tests.

A base is a list of raw layer tarballs wrapped into an image with `Image.create` and written as an OCI
layout with `write_layout`, so a definition can use it as `base.ref: oci:DIR`. The honest part is a fake
`tinypkg` installed in /usr/lib/python3/dist-packages (dist-info + RECORD + modules) and a stand-in
/usr/bin/python3; a definition with one overlay on `tinypkg/mod.py` builds against it.

The base has no real interpreter, so builds of it run with `FakeRunner` (the host's Python compiles the
patched sources, exactly as `_incontainer_compile.py` would in the image) and without the probe. Nothing
here weakens what is under test: layer reading, overlay application, the cache, publishing.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from servimg.assembly.context import Context
from servimg.assembly.defaults import ByReference, TargetSink, default_seams, probe_host
from servimg.assembly.release import ProvenRelease, Release
from servimg.assembly.seams import Seams, Staged
from servimg.backends.target import Target
from servimg.core.context import Log
from servimg.core.digest import Digest
from servimg.oci.image import OCI_LAYER, OCI_LAYER_GZIP, Descriptor, Image, Layer
from servimg.oci.store import BlobStore, Tap
from servimg.patching.bytecode import WORK_IN_IMAGE, InterpreterFacts, read_result
from servimg.proof.verify import VerifyReport

SITE = "usr/lib/python3/dist-packages"
MOD = b"def answer():\n    return 41\n"
PATCHED = b"def answer():\n    return 42\n"
PATCH = (
    b"--- a/tinypkg/mod.py\n+++ b/tinypkg/mod.py\n"
    b"@@ -1,2 +1,2 @@\n def answer():\n-    return 41\n+    return 42\n"
)
EPOCH = 1_700_000_000
TESTS = Path(__file__).resolve().parent


# ------------------------------------------------------------------------------------------ raw tar members
@dataclass
class M:
    """One raw tar member: anything tarfile can write, hostile names and types included."""

    name: str
    type: bytes = tarfile.REGTYPE
    data: bytes = b""
    mode: int = 0o644
    linkname: str = ""
    devmajor: int = 0
    devminor: int = 0


def F(name: str, data: bytes = b"", mode: int = 0o644) -> M:
    return M(name, tarfile.REGTYPE, data, mode)


def D(name: str, mode: int = 0o755) -> M:
    return M(name, tarfile.DIRTYPE, mode=mode)


def S(name: str, target: str) -> M:
    return M(name, tarfile.SYMTYPE, mode=0o777, linkname=target)


def H(name: str, target: str) -> M:
    return M(name, tarfile.LNKTYPE, linkname=target)


def tar(members: Iterable[M], *, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A tar of exactly these members, in this order (no sorting, no normalisation: fixtures may lie)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as t:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.type = m.type
            info.mode = m.mode
            info.mtime = EPOCH
            info.linkname = m.linkname
            info.devmajor, info.devminor = m.devmajor, m.devminor
            info.size = len(m.data) if m.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            t.addfile(info, io.BytesIO(m.data) if info.size else None)
    return out.getvalue()


def package_members(mod_mode: int = 0o644) -> list[M]:
    """The honest part of a base: /usr/bin/python3 (a stand-in) and tinypkg 1.0 with dist-info."""
    record = b"tinypkg/__init__.py,,\ntinypkg/mod.py,,\ntinypkg-1.0.dist-info/RECORD,,\n"
    return [
        D("usr"),
        D("usr/bin"),
        F("usr/bin/python3", b"#!not-a-real-interpreter\n", 0o755),
        D("usr/lib"),
        D("usr/lib/python3"),
        D(SITE),
        D(f"{SITE}/tinypkg"),
        F(f"{SITE}/tinypkg/__init__.py", b""),
        F(f"{SITE}/tinypkg/mod.py", MOD, mod_mode),
        D(f"{SITE}/tinypkg-1.0.dist-info"),
        F(f"{SITE}/tinypkg-1.0.dist-info/METADATA", b"Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n"),
        F(f"{SITE}/tinypkg-1.0.dist-info/RECORD", record),
    ]


# --------------------------------------------------------------------------------------------- images
@dataclass(frozen=True)
class Base:
    layout: Path
    image: Image

    @property
    def ref(self) -> str:
        return f"oci:{self.layout}"

    def blob(self, digest: Digest) -> Path:
        return self.layout / "blobs" / digest.algorithm / digest.hex


@dataclass(frozen=True)
class Blob:
    """A layer given as its exact blob bytes (e.g. an already-gzipped bomb) and the diffID to claim."""

    data: bytes
    diff_id: Digest
    media_type: str = OCI_LAYER_GZIP


def make_base(
    root: Path,
    layers: Sequence[bytes | Blob],
    *,
    gzip_layers: Sequence[bool] | None = None,
    diff_ids: Sequence[Digest] | None = None,
    config_extra: dict[str, Any] | None = None,
) -> Base:
    """Wrap raw layer tars into an image (Image.create) and write it as an OCI layout at `root`.

    `diff_ids` overrides the config's diffIDs (to make them lie)."""
    store = BlobStore(root.parent / f".{root.name}-store")
    built: list[Layer] = []
    for i, raw in enumerate(layers):
        if isinstance(raw, Blob):
            built.append(
                Layer(Descriptor(raw.media_type, store.put_bytes(raw.data), len(raw.data)), raw.diff_id)
            )
            continue
        compressed = bool(gzip_layers and gzip_layers[i])
        blob = gzip.compress(raw, mtime=0) if compressed else raw
        digest = store.put_bytes(blob)
        diff_id = diff_ids[i] if diff_ids else Digest.of_bytes(raw)
        media = OCI_LAYER_GZIP if compressed else OCI_LAYER
        built.append(Layer(Descriptor(media, digest, len(blob)), diff_id))
    config: dict[str, Any] = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2023-11-14T22:13:20Z",
        "config": {"Env": ["PATH=/usr/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [str(layer.diff_id) for layer in built]},
        **(config_extra or {}),
    }
    image = Image.create(config, built)
    from servimg.backends.layout import write_layout

    write_layout(image, root, store, tag=None)
    return Base(root, image)


def definition_text(
    base: Base, *, name: str = "tiny", patch_sha: str | None = None, python: bool = True
) -> str:
    sha = patch_sha or hashlib.sha256(PATCH).hexdigest()
    return (
        f"name: {name}\n"
        "repository: servimg/tiny\n"
        "base:\n"
        f"  ref: {base.ref}\n"
        f"  digest: {base.image.digest}\n" + ("python: /usr/bin/python3\n" if python else "") + "packages:\n"
        "  tinypkg: {distribution: tinypkg, version: '1.0'}\n"
        "overlays:\n"
        "  - id: tiny-fix\n"
        "    package: tinypkg\n"
        "    patch: overlays/tinypkg/fix.patch\n"
        f"    sha256: {sha}\n"
        "tag: '{name}-{lock12}'\n"
        f"source_date_epoch: {EPOCH}\n"
    )


def make_repo(root: Path, base: Base, *, name: str = "tiny", patch: bytes = PATCH) -> Path:
    """A repository with images/<name>.yaml over `base` and its overlay; returns the definition path."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "overlays" / "tinypkg").mkdir(parents=True, exist_ok=True)
    (root / "overlays" / "tinypkg" / "fix.patch").write_bytes(patch)
    path = root / "images" / f"{name}.yaml"
    path.write_text(definition_text(base, name=name, patch_sha=hashlib.sha256(patch).hexdigest()))
    return path


# --------------------------------------------------------------------------------------------- runner
@dataclass(frozen=True)
class FakeRunner:
    """The compile runner for a base without an interpreter: a Python of the host's (its own, unless
    `python` names another) runs the same `_incontainer_compile.py` over the same jobs (paths mapped from
    WORK_IN_IMAGE to the jobs dir), standing in for the image's interpreter."""

    python: str = sys.executable
    name = "host"

    def run(self, jobs_dir: Path, interpreter: str) -> InterpreterFacts:
        jobs = (jobs_dir / "jobs.json").read_text().replace(WORK_IN_IMAGE, str(jobs_dir))
        (jobs_dir / "jobs.json").write_text(jobs)
        subprocess.run(
            [self.python, "-S", "-s", str(jobs_dir / "compile.py"), "jobs.json", "result.json"],
            cwd=jobs_dir,
            env={"PATH": os.environ.get("PATH", "/usr/bin"), "PYTHONHASHSEED": "0"},
            check=True,
        )
        return read_result(jobs_dir, self.name)


@dataclass(frozen=True)
class HostRunners:
    """RunnerChoice seam: every build compiles with `FakeRunner` (the fake base has no interpreter)."""

    python: str = sys.executable

    def choose(self, name: str, base: Image, fs: Any, store: Any) -> FakeRunner:
        return FakeRunner(self.python)


class NoProbe:
    """Verifier seam: the fake base has no interpreter to run the in-image probe, so nothing is checked
    (an empty report); the real probe runs in every test on a real base."""

    def report(self, image: Image, io: Any, **how: Any) -> VerifyReport:
        return VerifyReport()


# This machine, as every command sees it (each capability asked once, when first needed), and what servimg
# does on it: the seams every test that builds for real runs with.
HOST = probe_host()
HOST_SEAMS = default_seams(HOST)
FAKE_SEAMS = dataclasses.replace(HOST_SEAMS, runners=HostRunners(), verifier=NoProbe())


def on_host(store: BlobStore, log: Log = print) -> Context:
    """A command's context on this host: its real seams (what a test of code below the CLI passes)."""
    return Context(store, log, seams=HOST_SEAMS)


def main(argv: list[str], seams: Seams = FAKE_SEAMS) -> int:
    """The real CLI with the fake base's seams (passed in; nothing in servimg is patched)."""
    from servimg.cli import main as cli_main

    return cli_main(argv, seams=seams)


# ------------------------------------------------------------------------------------------ assertions
def snapshot(directory: Path) -> dict[str, tuple[int, str]]:
    """Every path under `directory` with its mode and content hash (or link target): a sentinel."""
    out: dict[str, tuple[int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        for name in dirnames + filenames:
            full = Path(dirpath, name)
            st = full.lstat()
            if full.is_symlink():
                what = "->" + os.readlink(full)
            elif full.is_file():
                what = hashlib.sha256(full.read_bytes()).hexdigest()
            else:
                what = "dir"
            out[str(full.relative_to(directory))] = (st.st_mode, what)
    return out


def cache_is_sound(cache: Path) -> list[str]:
    """Every blob in a BlobStore hashes to its name; returns the problems (empty when sound)."""
    problems = []
    for sub in ("blobs", "diffs"):
        base = cache / sub / "sha256"
        if not base.is_dir():
            continue
        for path in base.iterdir():
            if path.name.startswith("."):
                continue  # a stray temp file of an interrupted writer: ignored by every reader
            h = hashlib.sha256()
            with path.open("rb") as fh:
                while block := fh.read(1 << 20):
                    h.update(block)
            if h.hexdigest() != path.name:
                problems.append(f"{sub}/{path.name} hashes to {h.hexdigest()}")
    return problems


def layer_members(path: Path) -> dict[str, tarfile.TarInfo]:
    from servimg.oci.layer import open_uncompressed

    with open_uncompressed(path) as stream, tarfile.open(fileobj=stream, mode="r|") as t:
        return {m.name: m for m in t}


def read_json(path: Path) -> Any:
    return json.loads(path.read_bytes())


# A `servimg` entry point for subprocess tests (concurrency, signals, secrets): the real CLI with the
# fake runner installed. Usage: python tests/fakebase.py build DEF --to ... --cache ...
def cli_env(**extra: str) -> dict[str, str]:
    """The environment of the CLI run through this module (`cli_popen`): no FAKEBASE_ setting or size cap
    of the caller's, this module importable, `extra` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKEBASE_", "SERVIMG_CACHE_MAX"))}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), *sys.path])
    env.update(extra)
    return env


def cli_popen(*args: str, **env: str) -> subprocess.Popen[str]:
    """`servimg ARGS` with the fake base seams (this module as the entry point), started, output piped."""
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(**env),
    )


def cli_run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`servimg ARGS` with the fake base seams, run to its end."""
    return subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, env=cli_env(**env), timeout=600
    )


def stall(marker: Path) -> None:
    """Freeze the process (for SIGINT/SIGKILL tests): `marker` is created, then it sleeps until killed,
    or, with FAKEBASE_RESUME set, until that file exists (then the command goes on)."""
    marker.write_text(str(os.getpid()))
    resume = os.environ.get("FAKEBASE_RESUME")
    while not (resume and Path(resume).exists()):
        time.sleep(0.05)


def stalling_tap(where: str, marker: Path) -> Tap:
    """A BlobStore tap that freezes inside the first write into `<cache>/<where>/` (blobs, diffs; `tmp`:
    the overlay layer), after its first block reached the temp file."""

    def tap(directory: Path, stream: BinaryIO) -> BinaryIO:
        if where not in (directory.name, directory.parent.name):
            return stream

        class Stalling(io.RawIOBase):
            stalled = False  # once: cleanup after the interrupt (a tar's end blocks) writes through

            def writable(self) -> bool:
                return True

            def write(self, data: Any) -> int:
                stream.write(data)
                stream.flush()
                if not self.stalled:
                    self.stalled = True
                    stall(marker)
                return len(data)

        return Stalling()  # type: ignore[return-value]

    return tap


@dataclass(frozen=True)
class StallingSource:
    """BaseSource seam: the real fetch, through a view of the build's own store (same root) whose writes
    pass through `tap`; the layers are then decompressed through it too, as the build does next (so a
    stall in `diffs` freezes inside a decompression write of the build's cache)."""

    tap: Tap
    inner: ByReference = dataclasses.field(default_factory=ByReference)

    def fetch(self, ref: str, ctx: Context, *, expected: Digest) -> Image:
        tapped = ctx.store.tapped(self.tap)
        image = self.inner.fetch(ref, dataclasses.replace(ctx, store=tapped), expected=expected)
        for layer in image.layers:
            tapped.uncompressed(layer.descriptor.digest, layer.diff_id)
        return image

    def platform_manifest(self, ref: str, pinned: Digest, platform: str) -> Digest:
        return self.inner.platform_manifest(ref, pinned, platform)


class _StallOnLookup(BlobStore):
    """A view of the build's store that freezes the first time a blob's path is looked up: the sink has
    begun writing the output (an OCI layout's temp directory exists) and nothing is in place yet."""

    def __init__(self, root: Path, marker: Path) -> None:
        super().__init__(root)
        self.marker = marker

    def path(self, digest: Digest) -> Path:
        stall(self.marker)
        return super().path(digest)


@dataclass(frozen=True)
class StallingSink:
    """Sink seam: the real publish, reading blobs through a store view that freezes on the first one."""

    marker: Path
    inner: TargetSink = dataclasses.field(default_factory=TargetSink)

    def check(self, target: Target) -> None:
        self.inner.check(target)

    def stage(self, release: Release, ctx: Context) -> Staged | None:
        return self.inner.stage(release, ctx)

    def publish(self, proven: ProvenRelease, staged: Staged | None, ctx: Context) -> str:
        stalling = dataclasses.replace(ctx, store=_StallOnLookup(ctx.store.root, self.marker))
        return self.inner.publish(proven, staged, stalling)


def stall_seams(spec: str, marker: Path) -> Seams:
    """The fake base's seams with a freeze at a chosen point, for the SIGINT/SIGKILL tests:
    `writer:<dir>` inside the first cache write into `<dir>` (blobs, diffs), after its first block;
    `publish` inside the sink's first blob lookup; `layer` inside the overlay layer's write into the
    cache, after its first block."""
    kind, _, where = spec.partition(":")
    if kind == "writer":
        return dataclasses.replace(FAKE_SEAMS, base_source=StallingSource(stalling_tap(where, marker)))
    if kind == "publish":
        return dataclasses.replace(FAKE_SEAMS, sink=StallingSink(marker))
    if kind == "layer":
        # The build's own store (made by the CLI from --cache) writes through the store_tap seam.
        return dataclasses.replace(FAKE_SEAMS, store_tap=stalling_tap("tmp", marker))
    raise ValueError(f"unknown stall {spec!r}")


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    chosen = FAKE_SEAMS
    if os.environ.get("FAKEBASE_STALL"):
        chosen = stall_seams(os.environ["FAKEBASE_STALL"], Path(os.environ["FAKEBASE_MARKER"]))
    sys.exit(main(sys.argv[1:], chosen))
