"""Image arguments as docker users type them: which place an `IMAGE` argument names.

An explicit transport is taken as written: `docker-daemon:NAME|ID`, `oci:DIR[:TAG]`,
`docker-archive:FILE`, `docker://HOST/REPO[:TAG]` (skopeo's spelling of "the registry"). Anything else is
resolved the way `docker inspect` / `docker push` resolve it against the engine's images (moby's
`daemon/images.GetImage`): a full image ID, then a name (`name[:tag]`, `host/name[:tag]`, `name@digest`,
Docker Hub names normalised as docker does), then an unambiguous image ID prefix (`3f2a9c`,
`sha256:3f2a9c`). A name the engine does not hold is a registry reference (`docker pull` would fetch it
from there). Ambiguity (a prefix of several IDs, or a word that is one image's name and another's ID
prefix) is refused with the candidates, never guessed.

`resolve` is pure: it decides from the engine's image list (`EngineImage`s, or None when no engine is
reachable); `backends.transport.resolve` lists them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from servimg.backends.target import EngineTarget, RegistryTarget, Target
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, ServimgError
from servimg.core.reference import Reference

REGISTRY_PREFIX = "docker://"
_EXPLICIT = ("docker-daemon:", "oci:", "docker-archive:")
_FULL_ID = re.compile(r"(?:sha256:)?([a-f0-9]{64})")
_ID_PREFIX = re.compile(r"(sha256:)?([a-f0-9]{1,63})")
_SHOWN = 8  # candidates listed in an ambiguity error


@dataclass(frozen=True)
class EngineImage:
    """One image the engine holds: its ID (config digest), `RepoTags` and `RepoDigests`."""

    id: Digest
    tags: tuple[str, ...] = ()
    digests: tuple[str, ...] = ()

    def describe(self) -> str:
        names = ", ".join(self.tags[:3]) or "untagged"
        return f"{self.id.short} ({names})"


@dataclass(frozen=True)
class Resolved:
    """Where an image argument points: `target` (its backend kind and location) and why."""

    text: str
    target: Target
    why: str
    image_id: Digest | None = None  # the engine image, when it resolved to one

    @property
    def kind(self) -> str:
        return self.target.kind

    @property
    def ref(self) -> str:
        """The argument with its transport written out (what `transport.fetch` takes)."""
        return self.target.text()

    @property
    def explicit(self) -> bool:
        return self.why == "as written"


def _normalised(text: str) -> str | None:
    """`ubuntu` → `registry-1.docker.io/library/ubuntu:latest`; None for what is no reference at all."""
    try:
        ref = Reference.parse(text)
    except ServimgError:
        return None
    if ref.digest is not None:
        return f"{ref.name}@{ref.digest}"
    return f"{ref.name}:{ref.tag or 'latest'}"


def _by_name(text: str, images: Sequence[EngineImage]) -> list[EngineImage]:
    wanted = _normalised(text)
    if wanted is None:
        return []
    return [
        image
        for image in images
        if any(_normalised(name) == wanted for name in (*image.tags, *image.digests))
    ]


def _explicit(text: str) -> Resolved | None:
    if text.startswith(REGISTRY_PREFIX):
        # Parsed now: every problem at once, before anything is fetched.
        location = str(Reference.parse(text[len(REGISTRY_PREFIX) :]))
        return Resolved(text, RegistryTarget(location), "as written")
    if text.startswith(_EXPLICIT):
        return Resolved(text, Target.parse(text), "as written")
    return None


def _ambiguous(text: str, candidates: Sequence[EngineImage], why: str) -> BackendError:
    shown = [c.describe() for c in candidates[:_SHOWN]]
    if len(candidates) > _SHOWN:
        shown.append(f"… and {len(candidates) - _SHOWN} more")
    return BackendError(
        f"{text!r} is ambiguous: {why}",
        hint="name it exactly: docker-daemon:NAME, a longer or full image ID (sha256:…), or docker://HOST/REPO",
        problems=shown,
    )


def _engine(text: str, location: str, image: EngineImage, why: str) -> Resolved:
    return Resolved(text, EngineTarget(location), why, image.id)


def _registry(text: str, why: str) -> Resolved:
    try:
        ref = Reference.parse(text)
    except ServimgError as exc:
        raise exc.context(f"{text!r} is not an engine image and not a registry reference") from None
    return Resolved(text, RegistryTarget(str(ref)), f"{why}; the registry {ref.registry} ({ref})")


def resolve(text: str, images: Sequence[EngineImage] | None) -> Resolved:
    """Where `text` points, given the engine's images (None: no engine reachable)."""
    explicit = _explicit(text)
    if explicit is not None:
        return explicit
    full = _FULL_ID.fullmatch(text)
    prefix = _ID_PREFIX.fullmatch(text)
    if images is None:
        if full or (prefix and prefix.group(1)):
            raise BackendError(
                f"{text!r} is an image ID, but no Docker Engine is reachable",
                hint="start dockerd, or name the image as oci:DIR, docker-archive:FILE or HOST/REPO:TAG",
            )
        return _registry(text, "no Docker Engine is reachable")
    if full:
        wanted = f"sha256:{full.group(1)}"
        for image in images:
            if str(image.id) == wanted:
                return _engine(text, wanted, image, f"the Docker Engine's image {image.describe()}")
        raise BackendError(
            f"the Docker Engine has no image with ID {wanted}", hint="`docker images --no-trunc` lists them"
        )
    named = [] if prefix and prefix.group(1) else _by_name(text, images)
    by_id = [i for i in images if prefix and i.id.hex.startswith(prefix.group(2))] if prefix else []
    if named and by_id and {i.id for i in by_id} != {named[0].id}:
        raise _ambiguous(text, [*named, *by_id], "it names one engine image and prefixes other IDs")
    if named:
        return _engine(text, text, named[0], f"the Docker Engine's image {named[0].describe()}")
    if len(by_id) > 1:
        raise _ambiguous(text, by_id, f"it is a prefix of {len(by_id)} engine image IDs")
    if by_id:
        image = by_id[0]
        why = f"the Docker Engine's image {image.describe()} (by ID prefix)"
        return _engine(text, str(image.id), image, why)
    if prefix and prefix.group(1):
        raise BackendError(
            f"the Docker Engine has no image whose ID starts with {text}",
            hint="`docker images --no-trunc` lists them",
        )
    return _registry(text, "the Docker Engine has no such image")
