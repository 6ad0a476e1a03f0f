"""What a build is called: its tag (from the definition's template and the lock), the refusal to put one
lock's tag on another lock's image, and the OCI and servimg labels that name its base and inputs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from servimg.backends.target import Target
from servimg.core.digest import Digest
from servimg.core.errors import BuildError, DefinitionError
from servimg.definitions.definition import (
    DEFAULT_TEMPLATE,
    ImageDefinition,
    named_lock,
)
from servimg.definitions.lock import (
    Lock,
    PackageLock,
)

SERVIMG_DIR = "opt/servimg"


class Locked(Protocol):
    """What a tag is made from: a lock's digest and packages (one platform's `Lock`, or the lock of a
    multi-platform definition, `definitions.platformlock.PlatformLocks`)."""

    @property
    def digest(self) -> Digest: ...

    @property
    def packages(self) -> tuple[PackageLock, ...]: ...


def refuse_tag_of_another_lock(
    definition: ImageDefinition, locked: Locked, tags: Sequence[str | None]
) -> None:
    """A tag made from the tag template names one lock: never publish another lock's image under it."""
    templates = (definition.tag, DEFAULT_TEMPLATE)
    for tag in tags:
        named = named_lock(tag, templates) if tag else None
        if named is not None and not locked.digest.hex.startswith(named):
            raise BuildError(
                f"refusing to tag this build {tag}: the tag names lock {named}, this build's lock is "
                f"{locked.digest}; nothing was built or published",
                hint="drop --tag to use the lock-derived tag, or choose a tag that is not template-shaped",
            )


def full_tag(definition: ImageDefinition, target: Target, tag: str) -> str:
    return target.name_for(definition.repository, tag)


def derive_tag(definition: ImageDefinition, locked: Locked) -> str:
    """`<name>-<vllm version>-<lock sha256[:12]>` by default: one tag names one set of inputs."""
    fields: dict[str, str] = {
        "name": definition.name,
        "lock12": locked.digest.hex[:12],
        "lock": locked.digest.hex,
    }
    for pkg in locked.packages:
        fields[pkg.import_name] = pkg.version
    fields.setdefault("version", fields.get("vllm", "0"))
    try:
        tag = definition.tag.format(**fields)
    except KeyError as exc:
        raise DefinitionError(
            f"tag: template field {exc} has no value for this image",
            hint="declare that package under `packages`",
        ) from None
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise DefinitionError(
            f"tag: {tag!r} is not a valid image tag",
            hint="tags use [A-Za-z0-9_.-] and at most 128 characters",
        )
    return tag


BASE_REF_LABEL = "io.servimg.base.ref"


def base_reference(definition: ImageDefinition) -> str | None:
    """`org.opencontainers.image.base.name` is an image reference (annotations spec, distribution's
    grammar): the registry ref, or the engine's image name, as written; a layout or an archive has none.
    Where the base came from, transport included, is `io.servimg.base.ref`."""
    return definition.base.target.image_reference


def labels(definition: ImageDefinition, locked: Lock, tag: str, created: str) -> dict[str, str]:
    name = base_reference(definition)
    return {
        **({"org.opencontainers.image.base.name": name} if name else {}),
        BASE_REF_LABEL: definition.base.ref,
        "org.opencontainers.image.base.digest": str(locked.base.manifest_digest),
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.version": tag,
        "org.opencontainers.image.source": definition.source,
        "io.servimg.definition": definition.name,
        "io.servimg.lock.digest": str(locked.digest),
        "io.servimg.overlays": ",".join(o.id for o in locked.overlays),
    }
