"""What `servimg` does on a real host, for every seam (`assembly.seams`), built once per command from
the host's one `Host` value (`probe_host`, asked once: is an engine there, can overlays mount, which
platform): `default_seams(host)`. Callers replace single seams on the value (`dataclasses.replace`): the
Nix builder's base source, tests' fake base and runners; never by patching a module's private names.

- `ByReference` / `FromRef`: the base by the definition's ref, or from another location that must hold
  the same pinned digest (`servimg build --base-from oci:DIR`, as the Nix derivation does).
- `DefaultRunners`: auto picks the warm root where overlays mount, else docker when the engine has the
  base, else the extracting chroot.
- `CachedCompiler`: the compile cache, keyed by every input, in front of the image's interpreter.
- `ProbeVerifier`: the whole in-image probe, every build, where `probe_route(host)` says.
- `TargetSink` (the target the user named; staging an untagged engine load while the proof runs) and
  `StoreOnly` (the values stay in the blob store); the signed route is `attesting.attach.AttestingSink`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Unpack

from servimg.assembly.release import ProvenRelease, Release, keep_in_store
from servimg.assembly.seams import Compiled, Seams, Staged
from servimg.backends import engine, transport
from servimg.backends.target import Holds, Target, WriteOptions
from servimg.core.digest import Digest
from servimg.core.errors import BuildError
from servimg.core.platform import Host, Platform
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.oci.store import BlobStore, Io
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
from servimg.proof.verifier import ProbeRoute, VerifyHow, probe_route, whole_image_route
from servimg.proof.verify import VerifyReport, verify_image_value
from servimg.proof.warmroot import WarmRoot, WarmRunner
from servimg.proof.warmverify import WarmRootUnavailable, verify_in_warm_root

if TYPE_CHECKING:
    from servimg.assembly.context import Context


def probe_host() -> Host:
    """This host: the engine pinged, overlays judged from /proc (no process started), each once, when
    first asked."""
    return Host(engine.engine_available, warmroot.available, Platform.host())


def default_seams(host: Host) -> Seams:
    """What `servimg` does on `host`."""
    return Seams(
        base_source=ByReference(),
        runners=DefaultRunners(host),
        compiler=CachedCompiler(),
        verifier=ProbeVerifier(host),
        sink=TargetSink(),
        host=host,
    )


@dataclass(frozen=True)
class ByReference:
    """The base where the definition's `base.ref` says: engine, registry, OCI layout or archive."""

    def fetch(self, ref: str, ctx: Context, *, expected: Digest) -> Image:
        return transport.fetch(ref, ctx, expected=expected)

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

    def fetch(self, ref: str, ctx: Context, *, expected: Digest) -> Image:
        ctx.log(f"base {ref}: reading {self.source} (--base-from)")
        return transport.fetch(self.source, ctx, expected=expected)

    def platform_manifest(self, ref: str, pinned: Digest, platform: str) -> Digest:
        found = self.manifests.get(str(pinned))
        return Digest.parse(found) if found else pinned


@dataclass(frozen=True)
class DefaultRunners:
    """auto: the warm daemonless runner where this host can mount overlays (no container, no extraction
    per build), else docker when the engine already has the base, else the extracting chroot runner."""

    host: Host

    def choose(self, name: str, base: Image, fs: LayeredFS, store: BlobStore) -> Runner:
        if name == "chroot":
            return ChrootRunner(fs)
        if name == "warm" or (name == "auto" and self.host.overlays):
            return WarmRunner(WarmRoot.of(fs, base.diff_ids, store.root), ChrootRunner(fs))
        if name == "docker" or (name == "auto" and self.host.engine and engine.has_image(base.config_digest)):
            return DockerRunner(str(base.config_digest))
        if name != "auto":
            raise BuildError(f"unknown runner {name!r}", hint="use auto, warm, docker or chroot")
        return ChrootRunner(fs)


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


@dataclass(frozen=True)
class ProbeVerifier:
    """The whole in-image probe, run now over the image's own filesystem (no verdict is cached or
    merged): in the warm root where this host can mount overlays, else as `servimg verify` runs it, in a
    container when an engine runs, else in a chroot of the extracted image."""

    host: Host

    def report(self, image: Image, io: Io, **how: Unpack[VerifyHow]) -> VerifyReport:
        whole = how.get("whole_image", False) or how.get("audit", False)  # the warm root has no audit
        route = how.get("probe") or (whole_image_route(self.host) if whole else probe_route(self.host))
        if route is ProbeRoute.WARM:
            try:
                return verify_in_warm_root(image, io)
            except WarmRootUnavailable as exc:
                io.log(f"{exc.message}; running the probe in a container or a chroot instead")
                route = whole_image_route(self.host)
        in_container = route is ProbeRoute.CONTAINER
        return verify_image_value(
            image,
            io,
            audit=how.get("audit", False),
            base_config=how.get("base_config"),
            in_container=in_container,
        )


class Staging:
    """Work a sink began while the proof runs, in a thread: `result()` waits for it (re-raising its
    error); `discard()` waits and undoes it (the build failed: nothing may stay)."""

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

    `load_early` (the default): for a single image into the engine, `stage` loads it UNTAGGED while the
    proof runs (an untagged image is no published image; a second CPU does the daemon's part meanwhile);
    `publish` applies the tag once the release is proven, and a failed proof removes the image again
    (`Staging.discard`) unless the engine held it before."""

    load_early: bool = True

    def check(self, target: Target) -> None:
        transport.check_reachable(target)

    def stage(self, release: Release, ctx: Context) -> Staging | None:
        if not (self.load_early and release.target.holds(Holds.RUNNABLE)):
            return None
        one = release.runnable()
        image = one.image
        held = engine.has_image(image.config_digest)

        def undo() -> None:
            if not held:
                engine.remove(image.config_digest)

        return Staging(lambda: engine.load(image, ctx.store, tag=None, base_config=one.base_config), undo)

    def publish(self, proven: ProvenRelease, staged: Staged | None, ctx: Context) -> str:
        """What the tag names, its name last: the one image, or every child and then the index (the
        engine and an archive take the one child the release names, `Release.runnable`)."""
        release = proven.release
        for child in proven.images:
            ctx.store.put_bytes(child.image.config_bytes)
        options = WriteOptions(
            tag=proven.tag,
            platform=release.platform,
            progress=ctx.progress,
            staged=staged.result() if staged is not None else None,
        )
        if release.target.holds(Holds.RUNNABLE):
            one = release.runnable()
            options["platform"], options["base_config"] = one.platform, one.base_config
        return transport.publish(release.named, proven.target, ctx, **options)


@dataclass(frozen=True)
class StoreOnly:
    """Publish nowhere: the image values stay in the blob store (their layers are there already, their
    configs are added), for a caller that only wants the value (a rebuild compares digests)."""

    def check(self, target: Target) -> None:
        return None

    def stage(self, release: Release, ctx: Context) -> Staged | None:
        return None

    def publish(self, proven: ProvenRelease, staged: Staged | None, ctx: Context) -> str:
        return keep_in_store(proven.release, ctx.store)
