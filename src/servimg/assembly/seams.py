"""The seams of a build, as protocols: where the base comes from, which runner compiles, who verifies,
where the release goes. Pure: no implementation lives here (`assembly.defaults` holds what `servimg`
does on a real host, built once from the host's `Host` value), so importing the protocols loads none.

- `BaseSource`: where a definition's base is read from (it must have the pinned digest either way).
- `RunnerChoice`: which runner compiles with the image's own interpreter (docker, chroot, warm, auto).
- `Compiler`: how the overlay's sources become bytecode through that runner.
- `Verifier` (`proof.verifier`): the in-image probe run on every built image before anything is published;
  `verify_or_refuse` is the one way every command runs it.
- `Sink`: where the release goes: `stage` while the proof runs, `publish` once it is proven.
- `Sandboxes`: the compile runner and the probe's route (`proof.verifier.probe_route`), chosen once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

from servimg.core.digest import Digest
from servimg.core.platform import Host
from servimg.oci.store import Tap, no_tap
from servimg.proof.verifier import ProbeRoute, Verifier, probe_route

if TYPE_CHECKING:  # types only: the protocols import no implementation
    from servimg.assembly.context import Context
    from servimg.assembly.release import ProvenRelease, Release
    from servimg.backends.target import Target
    from servimg.oci.filesystem import LayeredFS
    from servimg.oci.image import Image
    from servimg.oci.store import BlobStore
    from servimg.patching.bytecode import CompileJob, InterpreterFacts, Runner


class BaseSource(Protocol):
    """Where a definition's base is read from (it must have the pinned digest either way)."""

    def fetch(self, ref: str, ctx: Context, *, expected: Digest) -> Image: ...

    def platform_manifest(self, ref: str, pinned: Digest, platform: str) -> Digest:
        """The platform manifest a pinned digest stands for (itself unless it names an index)."""
        ...


class RunnerChoice(Protocol):
    """Which runner compiles bytecode with the image's interpreter, by the name the user gave."""

    def choose(self, name: str, base: Image, fs: LayeredFS, store: BlobStore) -> Runner: ...


Compiled: TypeAlias = "tuple[InterpreterFacts, dict[tuple[str, int], bytes]]"


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
class Sandboxes:
    """Where a build runs the image's own interpreter, chosen once per build (`choose_sandboxes`, when
    the build resolves): the compile runner over the base and the probe's route over the built image."""

    runner: Runner
    probe: ProbeRoute


def choose_sandboxes(seams: Seams, name: str, base: Image, fs: LayeredFS, store: BlobStore) -> Sandboxes:
    return Sandboxes(seams.runners.choose(name, base, fs, store), probe_route(seams.host))


class Staged(Protocol):
    """Work a sink began while the proof runs, publishing nothing (the engine's untagged load): `result()`
    waits for it and says how it went; `discard()` waits and undoes it (the proof failed: nothing stays)."""

    def result(self) -> str: ...

    def discard(self) -> None: ...


class Sink(Protocol):
    """Where a build's release goes (the last stage). `check` runs before any work; `stage` may begin work
    that makes nothing visible while the proof runs (None: nothing to begin); `publish` makes the release
    visible, and takes it proven (`ProvenRelease`, which only the whole probe's passing reports make), so
    no sink can publish an image the proof did not pass."""

    def check(self, target: Target) -> None: ...

    def stage(self, release: Release, ctx: Context) -> Staged | None: ...

    def publish(self, proven: ProvenRelease, staged: Staged | None, ctx: Context) -> str:
        """Publish every image of the release (and its index, its name last); return where it went."""
        ...


@dataclass(frozen=True)
class Seams:
    """Every seam of a build, chosen once: `assembly.defaults.default_seams(host)` is what `servimg` does on
    a real host (the Nix builder and tests replace some of them); `host` is what they were chosen for."""

    base_source: BaseSource
    runners: RunnerChoice
    compiler: Compiler
    verifier: Verifier
    sink: Sink
    host: Host
    # Every write into the build's blob cache (fetched blobs, decompressed diffs, the overlay layer) passes
    # through it: the fault tests freeze a build mid-write with it (tests/fakebase.py `stall_seams`).
    store_tap: Tap = no_tap
