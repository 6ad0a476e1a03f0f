"""Image references: `registry/repository[:tag][@digest]`, validated against the distribution grammar.

The grammar is the one of OCI distribution-spec v1.1 §"Pulling manifests" (`<name>` and `<reference>`) and of
CNCF distribution's `reference` package, which decides what is a registry host and what is a path component:
a first component containing `.` or `:`, or equal to `localhost`, names a registry; anything else is a
Docker Hub name (`registry-1.docker.io`, with `library/` for single-component names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from servimg.core.digest import Digest
from servimg.core.errors import ReferenceParseError, ServimgError

DEFAULT_REGISTRY = "registry-1.docker.io"
# Hostnames that mean Docker Hub; they are normalised so that one image has one spelling.
_DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", DEFAULT_REGISTRY})

# Path component: distribution writes the separator as `[-]*`; an empty separator adds nothing to the language
# but nests two unbounded quantifiers, which backtracks exponentially on a near-miss ("aaaa…a!"). `-+` is the
# OCI spec's spelling and matches exactly the same strings.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_COMPONENT_RE = re.compile(_COMPONENT)
_REPOSITORY_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG_RE = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
_HOST_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_REGISTRY_RE = re.compile(rf"(?:{_HOST_LABEL}(?:\.{_HOST_LABEL})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?")
# distribution's NameTotalLengthMax: registry + "/" + repository.
_NAME_MAX = 255


def is_valid_repository(name: str) -> bool:
    """True if `name` is a valid `<name>` (OCI distribution-spec v1.1 §Pulling manifests)."""
    return _REPOSITORY_RE.fullmatch(name) is not None


def is_valid_tag(tag: str) -> bool:
    """True if `tag` is a valid tag: `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`."""
    return _TAG_RE.fullmatch(tag) is not None


def _registry_problems(registry: str) -> list[str]:
    if _REGISTRY_RE.fullmatch(registry):
        return []
    if registry.rstrip(":").lower() in {"http", "https"}:
        return [f"registry {registry!r}: drop the URL scheme (write host[:port]/repository)"]
    return [f"registry {registry!r} is not a host[:port]"]


def _repository_problems(repository: str) -> list[str]:
    if not repository:
        return ["repository is empty"]
    problems: list[str] = []
    for component in repository.split("/"):
        if _COMPONENT_RE.fullmatch(component):
            continue
        if component and _COMPONENT_RE.fullmatch(component.lower()):
            problems.append(f"repository component {component!r} must be lowercase")
        else:
            problems.append(
                f"repository component {component!r} is invalid "
                "(lowercase letters and digits, separated by '.', '_', '__' or dashes)"
            )
    return problems


def _tag_problems(tag: str | None) -> list[str]:
    if tag is None or is_valid_tag(tag):
        return []
    return [f"tag {tag!r} is invalid (1-128 of [A-Za-z0-9_.-], not starting with '.' or '-')"]


def _problems(registry: str, repository: str, tag: str | None) -> list[str]:
    problems = _registry_problems(registry) + _repository_problems(repository) + _tag_problems(tag)
    if len(registry) + 1 + len(repository) > _NAME_MAX:
        problems.append(f"name {registry}/{repository} is longer than {_NAME_MAX} characters")
    return problems


def _split_domain(name: str) -> tuple[str, str]:
    """Split `name` (no tag, no digest) into registry and repository, applying Docker Hub defaults."""
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = DEFAULT_REGISTRY, name
    if registry in _DOCKER_HUB_ALIASES:
        registry = DEFAULT_REGISTRY
        if repository and "/" not in repository:
            repository = f"library/{repository}"
    return registry, repository


def _split_tag(name: str) -> tuple[str, str | None]:
    """Split a trailing `:tag`; a `:` before the last `/` is a port, not a tag."""
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :]
    return name, None


def _parse_digest(text: str, problems: list[str]) -> Digest | None:
    try:
        return Digest.parse(text)
    except ServimgError as exc:
        problems.append(exc.message)
        return None


@dataclass(frozen=True)
class Reference:
    """A validated image reference; construct with `Reference.parse` or directly (both validate)."""

    registry: str
    repository: str
    tag: str | None = None
    digest: Digest | None = None

    def __post_init__(self) -> None:
        problems = _problems(self.registry, self.repository, self.tag)
        if problems:
            raise ReferenceParseError(
                f"invalid image reference {self.registry}/{self.repository}",
                hint="an image reference looks like host[:port]/path/name[:tag][@sha256:<hex>]",
                problems=problems,
            )

    @classmethod
    def parse(cls, text: str) -> Reference:
        """Parse `[registry/]repository[:tag][@digest]`, reporting every problem at once."""
        problems: list[str] = []
        text = text.strip()
        name, at, digest_text = text.partition("@")
        digest = _parse_digest(digest_text, problems) if at else None
        name, tag = _split_tag(name)
        registry, repository = _split_domain(name)
        if tag == "":
            problems.append("tag after ':' is empty")
            tag = None
        problems = _problems(registry, repository, tag) + problems
        if problems:
            raise ReferenceParseError(
                f"invalid image reference {text!r}",
                hint="an image reference looks like host[:port]/path/name[:tag][@sha256:<hex>]",
                problems=problems,
            )
        return cls(registry, repository, tag, digest)

    def with_tag(self, tag: str) -> Reference:
        """A copy with `tag` (the digest, if any, is kept and still wins in `reference`)."""
        return replace(self, tag=tag)

    def with_digest(self, digest: Digest) -> Reference:
        """A copy pinned to `digest` (the tag is kept for display)."""
        return replace(self, digest=digest)

    @property
    def name(self) -> str:
        """`registry/repository`, without tag or digest."""
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """What to put after `/manifests/`: the digest if pinned, else the tag, else `latest`."""
        if self.digest is not None:
            return str(self.digest)
        return self.tag if self.tag is not None else "latest"

    def __str__(self) -> str:
        text = self.name
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text
