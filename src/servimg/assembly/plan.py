"""A build's plan: everything decided before any work, decided once at the command edge.

`BuildPlan.make` reads the definition once and its lock once, parses the
target once into a typed value (a registry target carries its parsed reference), derives the tag once and
names the platforms, one or several. `pipeline.build(plan, ctx)` then does the work; nothing below it
reads either file again or re-parses the target. Every refusal the plan can make it makes here, before a
base is read: a tag of another lock, a `--platform` the definition does not build, a lock of the wrong
shape. An index goes whole to a place that holds one; the engine and an archive take the one child
`--platform` names, else the host's (`Backend.write_index`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from servimg.backends.target import Target
from servimg.core.errors import BuildError, UsageError
from servimg.core.platform import Host, Platform
from servimg.definitions import naming
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import Lock
from servimg.definitions.platformlock import Locks
from servimg.definitions.remembered import recall


@dataclass(frozen=True)
class BuildPlan:
    definition_path: Path
    definition: ImageDefinition
    lock: Locks  # as written by `servimg lock`: one platform's, or one over every platform
    target: Target
    tag: str  # the image's tag: given, or derived from the definition's template and the lock
    full_tag: str  # as the destination names it (the engine and an archive want `repository:tag`)
    runner: str = "auto"
    verify: bool = True
    engine_platform: Platform | None = None  # which child of an index the engine or an archive gets
    # The definition as it was locked, when remembered (definitions.remembered): a drift then names the
    # definition's fields that moved, not only its sha256.
    locked_definition: Mapping[str, object] | None = None

    @property
    def platforms(self) -> tuple[Platform, ...]:
        return self.definition.platforms

    def lock_for(self, platform: Platform) -> Lock:
        """`platform`'s part of the lock, whichever shape it has."""
        return self.lock.part(platform)

    @classmethod
    def make(
        cls,
        definition_path: Path,
        *,
        to: str | None = None,
        tag: str | None = None,
        runner: str = "auto",
        platform: str | None = None,
        verify: bool = True,
        definition: ImageDefinition | None = None,
        cache_root: Path | None = None,
        host: Host | None = None,
    ) -> BuildPlan:
        """The plan for building `definition_path` as locked (`definition`: the caller's read of it;
        `cache_root`: where the definition as locked may be remembered; `host`: what chooses the target
        when `to` names none)."""
        definition = definition or ImageDefinition.load(definition_path)
        definition.refuse_placeholders(str(definition_path))
        lock = Locks.read(definition, definition_path)
        target = Target.parse(to) if to else default_target(definition_path, host)
        engine_platform = _engine_platform(definition, definition_path, platform)
        naming.refuse_tag_of_another_lock(definition, lock, [tag, target.named_tag])
        chosen = tag or naming.derive_tag(definition, lock)
        return cls(
            definition_path,
            definition,
            lock,
            target,
            chosen,
            naming.full_tag(definition, target, chosen),
            runner,
            verify,
            engine_platform,
            recall(cache_root, lock.definition_sha256) if cache_root is not None else None,
        )


def default_target(definition_path: Path, host: Host | None) -> Target:
    """Without `--to`: the Docker Engine when one answers, else an OCI layout under out/."""
    if host is None:
        raise BuildError(f"no target for {definition_path}", hint="name one with --to")
    if host.engine:
        return Target.parse("docker")
    return Target.layout(Path("out") / definition_path.stem.removesuffix(".lock"))


def _engine_platform(
    definition: ImageDefinition, definition_path: Path, platform: str | None
) -> Platform | None:
    """`--platform`: which child of a multi-platform build the engine or an archive gets; a definition's
    own platforms only."""
    if platform is None:
        return None
    chosen = Platform.parse(platform)
    if chosen not in definition.platforms:
        raise UsageError(
            f"--platform {platform}: {definition_path} builds "
            f"{', '.join(str(p) for p in definition.platforms)} only",
            hint="leave --platform out, or list platforms under base.platforms (docs/platforms.md)",
        )
    return chosen
