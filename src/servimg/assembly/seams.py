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
- `Sink`: where the release goes, by one operation, `publish(release, ctx)` (the target the user named,
  `TargetSink`; the signed route, `attesting.attach.AttestingSink`; or `StoreOnly`: the values stay in
  the blob store). Staging is an option of the engine sink: it loads the image untagged while the proof
  runs, and tags it only after the proof passed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict, Unpack

from servimg.assembly.release import PlatformImage, Release
from servimg.backends import engine, transport
from servimg.backends.target import Target
from servimg.core.digest import Digest
from servimg.core.errors import BuildError
from servimg.core.platform import Platform
from servimg.core.progress import Log
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
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

if TYPE_CHECKING:  # the context carries the seams: a type only, no import cycle at run time
    from servimg.assembly.context import Context


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
    """Where a build's release goes (the last stage). `check` runs before any work; `publish` makes the
    release visible, and only after `release.proven()` returned (the pipeline refuses a publish that did
    not ask for the proof)."""

    def check(self, target: Target) -> None: ...

    def publish(self, release: Release, ctx: Context) -> str:
        """Publish every image of the release (and its index, its name last); return where it went."""
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


@dataclass(frozen=True)
class TargetSink:
    """The target the user named: engine, OCI layout, docker-archive or registry (`backends.transport`).

    `stage` (the default): for a single image into the engine, load it UNTAGGED while the proof runs (an
    untagged image is no published image; a second CPU does the daemon's part meanwhile); the tag is
    applied after the proof passed, and a failed proof removes the image again unless the engine held it
    before."""

    stage: bool = True

    def check(self, target: Target) -> None:
        transport.check_reachable(target)

    def publish(self, release: Release, ctx: Context) -> str:
        if release.index is not None:
            release.proven()
            for child in release.images:
                ctx.store.put_bytes(child.image.config_bytes)
            images = {c.platform: c.image for c in release.images}
            return transport.publish_index(
                release.index,
                images,
                release.target,
                ctx.store,
                ctx.log,
                tag=release.tag,
                engine_platform=release.engine_platform,
                progress=ctx.progress,
            )
        one = release.image
        staged = self._staged(one, release.target, ctx.store)
        try:
            release.proven()
        except BaseException:
            if staged is not None:
                staged.discard()
            raise
        return transport.publish(
            one.image,
            release.target,
            ctx.store,
            ctx.log,
            tag=release.tag,
            base_config=one.base_config,
            progress=ctx.progress,
            staged=staged.result() if staged is not None else None,
        )

    def _staged(self, one: PlatformImage, target: Target, store: BlobStore) -> Staged | None:
        if not (self.stage and target.in_engine):
            return None
        image = one.image
        held = engine.has_image(image.config_digest)

        def undo() -> None:
            if not held:
                engine.remove(image.config_digest)

        return Staged(lambda: engine.load(image, store, tag=None, base_config=one.base_config), undo)


@dataclass(frozen=True)
class StoreOnly:
    """Publish nowhere: the image values stay in the blob store (their layers are there already, their
    configs are added), for a caller that only wants the value (a rebuild compares digests)."""

    def check(self, target: Target) -> None:
        return None

    def publish(self, release: Release, ctx: Context) -> str:
        proven = release.proven()
        for child in proven:
            ctx.store.put_bytes(child.image.config_bytes)
        digest = release.index.digest if release.index is not None else release.image.image.digest
        return f"the blob store ({digest}; not published)"


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
