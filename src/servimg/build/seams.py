"""The seams of a build, as objects passed in: where the base comes from, which runner compiles, who
verifies. Chosen once from the CLI arguments (`servimg.cli.main`) or by a caller (tests' fake base,
the Nix builder); never by patching a module's private names.

- `BaseSource`: fetch the base by the definition's ref (default, `ByReference`), or from another
  location that must hold the same pinned digest (`FromRef`: `servimg build --base-from oci:DIR`, as the
  Nix derivation does with the base assembled from fixed-output blobs).
- `RunnerChoice`: which runner compiles with the image's own interpreter (docker, chroot, auto).
- `Compiler`: how the overlay's sources become bytecode through that runner (`CachedCompiler`: the
  compile cache, keyed by every input, in front of it), so the pipeline imports no cache module.
- `Verifier`: the in-image probe run on every built image before anything is published.
- `Sink`: where the image goes (the target the user named, or `StoreOnly`: the value stays in the blob
  store, for the signed build that pushes it itself with its attestations). A sink that is also
  `Staging` can begin its slow part while the image is verified (the engine's untagged load), publishing
  nothing until verification passes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol, TypedDict, Unpack, runtime_checkable

from servimg.backends import engine, transport
from servimg.backends.target import Target, WriteOptions
from servimg.core.digest import Digest
from servimg.core.errors import BuildError
from servimg.core.platform import Platform
from servimg.core.progress import NULL, Log, Progress
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.oci.index import ImageIndex
from servimg.oci.store import BlobStore, Tap, no_tap
from servimg.patching import resultcache
from servimg.patching.bytecode import (
    ChrootRunner,
    CompileJob,
    DockerRunner,
    InterpreterFacts,
    Runner,
    compile_sources,
)
from servimg.proof import warmroot
from servimg.proof.verify import VerifyFailed, VerifyReport, verify_image_value
from servimg.proof.warmroot import WarmRoot, WarmRunner
from servimg.proof.warmverify import WarmRootUnavailable, verify_in_warm_root


class BaseSource(Protocol):
    """Where a definition's base is read from (it must have the pinned digest either way)."""

    def fetch(self, ref: str, store: BlobStore, log: Log, *, expected: Digest) -> Image: ...

    def platform_manifest(self, ref: str, pinned: Digest, platform: str) -> Digest:
        """The platform manifest a pinned digest stands for (itself unless it names an index)."""
        ...


@dataclass(frozen=True)
class ByReference:
    """The base where the definition's `base.ref` says: engine, registry, OCI layout or archive."""

    def fetch(self, ref: str, store: BlobStore, log: Log, *, expected: Digest) -> Image:
        return transport.fetch(ref, store, log, expected=expected)

    def platform_manifest(self, ref: str, pinned: Digest, platform: str) -> Digest:
        return transport.platform_manifest(ref, pinned, Platform.parse(platform))


@dataclass(frozen=True)
class FromRef:
    """The base read from `source` instead of the definition's ref (which the lock and the labels keep).

    `manifests` answers "which platform manifest does this pinned index stand for" offline (index digest
    → manifest digest), for a pin that names a multi-platform index; without an entry the pin is taken as
    the manifest itself.
    """

    source: str
    manifests: Mapping[str, str] = field(default_factory=dict)

    def fetch(self, ref: str, store: BlobStore, log: Log, *, expected: Digest) -> Image:
        log(f"base {ref}: reading {self.source} (--base-from)")
        return transport.fetch(self.source, store, log, expected=expected)

    def platform_manifest(self, ref: str, pinned: Digest, platform: str) -> Digest:
        found = self.manifests.get(str(pinned))
        return Digest.parse(found) if found else pinned


class RunnerChoice(Protocol):
    """Which runner compiles bytecode with the image's interpreter, by the name the user gave."""

    def choose(self, name: str, base: Image, fs: LayeredFS, store: BlobStore) -> Runner: ...


@dataclass(frozen=True)
class DefaultRunners:
    """auto: the warm daemonless runner where this host can mount overlays (no container, no extraction
    per build), else docker when the engine already has the base, else the extracting chroot runner."""

    def choose(self, name: str, base: Image, fs: LayeredFS, store: BlobStore) -> Runner:
        if name == "chroot":
            return ChrootRunner(fs)
        if name == "warm" or (name == "auto" and warmroot.available()):
            return WarmRunner(WarmRoot.of(fs, base.diff_ids, store.root), ChrootRunner(fs))
        if name == "docker" or (
            name == "auto" and engine.engine_available() and engine.has_image(base.config_digest)
        ):
            return DockerRunner(str(base.config_digest))
        if name != "auto":
            raise BuildError(f"unknown runner {name!r}", hint="use auto, warm, docker or chroot")
        return ChrootRunner(fs)


Compiled = tuple[InterpreterFacts, dict[tuple[str, int], bytes]]


class Compiler(Protocol):
    """The overlay's sources compiled by the image's interpreter through `runner`: its facts and the pyc
    bytes per (source path, optimisation level)."""

    def compile(
        self,
        cache_root: Path,
        base_diff_ids: Sequence[Digest],
        runner: Runner,
        interpreter: str,
        pinned: InterpreterFacts,
        jobs: Sequence[CompileJob],
    ) -> Compiled: ...


@dataclass(frozen=True)
class CachedCompiler:
    """`bytecode.compile_sources`, from the compile cache when an entry for exactly these inputs (the base
    chain, the interpreter and its pinned facts, the runner, the compile step, every source) checks out
    (`patching.resultcache`)."""

    def compile(
        self,
        cache_root: Path,
        base_diff_ids: Sequence[Digest],
        runner: Runner,
        interpreter: str,
        pinned: InterpreterFacts,
        jobs: Sequence[CompileJob],
    ) -> Compiled:
        return resultcache.compile_cached(
            cache_root,
            base_diff_ids,
            interpreter,
            pinned,
            runner.name,
            jobs,
            lambda: compile_sources(runner, interpreter, jobs),
        )


class ProbeRoute(StrEnum):
    """Where the whole probe runs over a built image: in the WARM root (the base's tree + the image's
    layer, `proof.warmverify`), in a CONTAINER of the image, or in a CHROOT of its extracted files."""

    WARM = "warm"
    CONTAINER = "container"
    CHROOT = "chroot"


def probe_route() -> ProbeRoute:
    """The one rule for where this host probes a built image: the warm root where overlays mount, else a
    container where an engine runs, else a chroot."""
    return ProbeRoute.WARM if warmroot.available() else whole_image_route()


def whole_image_route() -> ProbeRoute:
    """Where the probe runs over the whole image (no warm root): a container where an engine runs, else
    a chroot of its extracted files."""
    return ProbeRoute.CONTAINER if engine.engine_available() else ProbeRoute.CHROOT


@dataclass(frozen=True)
class Sandboxes:
    """Where a build runs the image's own interpreter, chosen once per build (`choose_sandboxes`, when
    the build resolves): the compile runner over the base and the probe's route over the built image."""

    runner: Runner
    probe: ProbeRoute


def choose_sandboxes(
    runners: RunnerChoice, name: str, base: Image, fs: LayeredFS, store: BlobStore
) -> Sandboxes:
    return Sandboxes(runners.choose(name, base, fs, store), probe_route())


class VerifyHow(TypedDict, total=False):
    """How a verifier runs: `base_config`, the base's image ID (the engine loads thin over it; None: no
    base there); `probe`, the route the build chose (`Sandboxes.probe`; absent: the verifier's own rule)."""

    base_config: Digest | None
    probe: ProbeRoute | None


class Verifier(Protocol):
    """Verifies an image value whose blobs are in the store; returns the report (the caller decides)."""

    def report(self, image: Image, store: BlobStore, log: Log, **how: Unpack[VerifyHow]) -> VerifyReport: ...


def verify_or_refuse(
    verifier: Verifier,
    image: Image,
    store: BlobStore,
    log: Log,
    *,
    base_config: Digest | None,
    consequence: str,
    probe: ProbeRoute | None = None,
) -> VerifyReport:
    """Stage 3, the one way every command runs it: the verifier's report, or VerifyFailed (carrying the
    report) saying what did not happen because the image failed (`consequence`: "nothing was tagged")."""
    report = verifier.report(image, store, log, base_config=base_config, probe=probe)
    if not report.ok:
        raise VerifyFailed(report, subject=f"the built image {image.digest.short}", consequence=consequence)
    counts = report.counts()
    log(f"verified: {counts.get('PASS', 0)} PASS, {counts.get('WARN', 0)} WARN, 0 FAIL")
    return report


@dataclass(frozen=True)
class ProbeVerifier:
    """The whole in-image probe, run now over the image's own filesystem (no verdict is cached or
    merged): in the warm root where this host can mount overlays, else as `servimg verify` runs it, in a
    container when an engine runs, else in a chroot of the extracted image."""

    def report(self, image: Image, store: BlobStore, log: Log, **how: Unpack[VerifyHow]) -> VerifyReport:
        route = how.get("probe") or probe_route()
        if route is ProbeRoute.WARM:
            try:
                return verify_in_warm_root(image, store, log)
            except WarmRootUnavailable as exc:
                log(f"{exc.message}; running the probe in a container or a chroot instead")
                route = whole_image_route()
        in_container = route is ProbeRoute.CONTAINER
        return verify_image_value(
            image, store, log, base_config=how.get("base_config"), in_container=in_container
        )


class Sink(Protocol):
    """Where a built image goes (stage 4: publish). `check` runs before any work."""

    def check(self, target: Target) -> None: ...

    def publish(
        self, image: Image, target: Target, store: BlobStore, log: Log, **options: Unpack[WriteOptions]
    ) -> str:
        """Write the image (options: tag, base_config, progress); return where it went, for people."""
        ...


class Staged:
    """Work a sink began before the image was verified, running in a thread: `result()` waits for it
    (re-raising its error); `discard()` waits and undoes it (the build failed: nothing may stay)."""

    def __init__(self, work: Callable[[], str], undo: Callable[[], None]) -> None:
        self._undo = undo
        self._outcome: str | BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], str]) -> None:
        try:
            self._outcome = work()
        except BaseException as exc:  # handed to the build's thread by result()
            self._outcome = exc

    def result(self) -> str:
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return str(self._outcome)

    def discard(self) -> None:
        self._thread.join()
        self._undo()


@runtime_checkable
class Staging(Protocol):
    """A sink that can begin publishing before verification without publishing anything (stage 4 early)."""

    def stage(self, image: Image, target: Target, store: BlobStore, base_config: Digest) -> Staged | None:
        """Start the work in the background, or None when this target has none to start."""
        ...


@dataclass(frozen=True)
class Verified:
    """An image together with the probe report that verified it (what a VerifiedSink publishes)."""

    image: Image
    report: VerifyReport


@runtime_checkable
class VerifiedSink(Protocol):
    """A sink that publishes an image together with the report that verified it (the signed route:
    `provenance.attach.AttestingSink` pushes the image with its signed provenance and verify result)."""

    def publish_verified(
        self, verified: Verified, target: Target, store: BlobStore, log: Log, **options: Unpack[WriteOptions]
    ) -> str: ...


@dataclass(frozen=True)
class PlatformImage:
    """One platform's image of a multi-platform build, with the probe report that verified it."""

    platform: Platform
    image: Image
    report: VerifyReport | None


@runtime_checkable
class IndexSink(Protocol):
    """A sink that can publish a multi-platform index: every child, then the index, its name last."""

    def publish_index(
        self,
        index: ImageIndex,
        children: Sequence[PlatformImage],
        target: Target,
        store: BlobStore,
        log: Log,
        *,
        tag: str | None,
        engine_platform: Platform | None = None,
        progress: Progress = NULL,
    ) -> str: ...


@dataclass(frozen=True)
class TargetSink:
    """The target the user named: engine, OCI layout, docker-archive or registry (`backends.transport`).

    For the engine, `stage` loads the image UNTAGGED while it is verified (an untagged image is no
    published image; the tag is applied by `publish`, after verification); a failed build removes it
    again unless the engine held it before."""

    def check(self, target: Target) -> None:
        transport.check_reachable(target)

    def stage(self, image: Image, target: Target, store: BlobStore, base_config: Digest) -> Staged | None:
        if not target.in_engine:
            return None
        held = engine.has_image(image.config_digest)

        def undo() -> None:
            if not held:
                engine.remove(image.config_digest)

        return Staged(lambda: engine.load(image, store, tag=None, base_config=base_config), undo)

    def publish(
        self, image: Image, target: Target, store: BlobStore, log: Log, **options: Unpack[WriteOptions]
    ) -> str:
        return transport.publish(image, target, store, log, **options)

    def publish_index(
        self,
        index: ImageIndex,
        children: Sequence[PlatformImage],
        target: Target,
        store: BlobStore,
        log: Log,
        *,
        tag: str | None,
        engine_platform: Platform | None = None,
        progress: Progress = NULL,
    ) -> str:
        for child in children:
            store.put_bytes(child.image.config_bytes)
        images = {c.platform: c.image for c in children}
        return transport.publish_index(
            index, images, target, store, log, tag=tag, engine_platform=engine_platform, progress=progress
        )


@dataclass(frozen=True)
class StoreOnly:
    """Publish nowhere: the image value stays in the blob store (its layer is there already, its config
    is added), for a caller that publishes it itself later (the signed build pushes with attestations)."""

    def check(self, target: Target) -> None:
        return None

    def publish(
        self, image: Image, target: Target, store: BlobStore, log: Log, **options: Unpack[WriteOptions]
    ) -> str:
        store.put_bytes(image.config_bytes)
        return f"the blob store ({image.digest}; not published)"


@dataclass(frozen=True)
class Seams:
    """Every seam of a build; the defaults are what `servimg` does on a real host."""

    base_source: BaseSource = field(default_factory=ByReference)
    runners: RunnerChoice = field(default_factory=DefaultRunners)
    compiler: Compiler = field(default_factory=CachedCompiler)
    verifier: Verifier = field(default_factory=ProbeVerifier)
    sink: Sink = field(default_factory=TargetSink)
    # Every write into the build's blob cache (fetched blobs, decompressed diffs, the overlay layer) passes
    # through it: the fault tests freeze a build mid-write with it (tests/fakebase.py `stall_seams`).
    store_tap: Tap = no_tap


DEFAULT = Seams()
