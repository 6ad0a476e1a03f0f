"""What binds an image to its inputs: a tag made from the tag template, and a repository lock file.

A definition's tag template (`{name}-{vllm}-{lock12}` by default) puts a prefix of the lock digest into
the tag: such a tag *names one set of inputs*. An image served under it must have been built from that
lock; otherwise the tag was re-pointed (a wrong push, a rollback) and every other check would still pass.
A tag is template-shaped when it matches the image's own definition's template or the default one and
the template carries `{lock12}` or `{lock}`. The image's lock digest is read from three places that must
agree: the `io.servimg.lock.digest` label, the lock inside the image and the signed provenance.

`servimg check --lock FILE` compares the image's lock with a repository lock file field by field.
Everything here is pure: rows (`Finding`s) from facts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from servimg.backends.target import Target
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.core.findings import FAIL, PASS, WARN, Finding, Status
from servimg.core.reference import Reference
from servimg.definitions.definition import DEFAULT_TEMPLATE, named_lock
from servimg.definitions.lock import Lock, drift

MAX_FIELDS = 8


class TagBindingError(ServimgError):
    """A template-shaped tag names another lock than the image's: pushing or promoting it would lie."""


def binding_row(what: str, status: Status, why: str) -> Finding:
    return Finding(re.sub(r"\W+", "_", what).strip("_").upper(), status, what, why)


def tag_of(ref: str) -> str | None:
    """The tag a reference names (registry, engine or OCI layout), None for a digest or no tag."""
    try:
        return Target.parse(ref).named_tag
    except ServimgError:  # a bare engine name (`name:tag`): no place, yet a reference
        try:
            parsed = Reference.parse(ref)
        except ServimgError:
            return None
        return parsed.tag if parsed.digest is None else None


def templates_of(definition: Mapping[str, object] | None) -> tuple[str, ...]:
    """The image's own template (from its definition) first, then the default one."""
    own = (definition or {}).get("tag")
    return tuple(dict.fromkeys([*([own] if isinstance(own, str) else []), DEFAULT_TEMPLATE]))


@dataclass(frozen=True)
class LockSources:
    """The image's lock digest as each place states it (None: that place is missing or unreadable)."""

    label: str | None
    image: Digest | None
    provenance: tuple[str, ...] = ()  # lockDigest of each verified provenance

    def stated(self) -> dict[str, str]:
        out = {"label": self.label or "-", "in-image lock": str(self.image) if self.image else "-"}
        for i, p in enumerate(self.provenance):
            out["provenance" if len(self.provenance) == 1 else f"provenance #{i + 1}"] = p
        return out

    def agreed(self) -> str | None:
        """The one lock digest every place states, or None when they disagree or one is missing."""
        values = set(self.stated().values())
        return values.pop() if len(values) == 1 and self.image is not None else None

    def describe(self) -> str:
        return ", ".join(f"{k} says {v}" for k, v in self.stated().items())


def tag_row(tag: str | None, templates: Sequence[str], sources: LockSources, mode: str) -> Finding:
    """`tag`: bound (PASS), re-pointed (FAIL, naming both locks), or not bound to a lock (WARN; FAIL when
    the policy's tag_binding is `require`)."""
    if tag is None:
        return binding_row("tag", PASS, "checked by digest: no tag to bind")
    named = named_lock(tag, templates)
    if named is None:
        status = FAIL if mode == "require" else WARN
        why = f"tag {tag} is not bound to a lock (not made from the tag template {', '.join(templates)})"
        if mode == "require":
            why += "; the policy requires tag_binding"
        return binding_row("tag", status, why)
    agreed = sources.agreed()
    if agreed is None:
        return binding_row(
            "tag",
            FAIL,
            f"tag {tag} names lock {named}, and the image's lock digest is not one value: "
            f"{sources.describe()}",
        )
    if not Digest.parse(agreed).hex.startswith(named):
        return binding_row(
            "tag",
            FAIL,
            f"tag {tag} names lock {named}, but the image was built from lock {agreed} "
            f"({', '.join(sources.stated())} agree): the tag was re-pointed to an image of other inputs",
        )
    return binding_row(
        "tag", PASS, f"tag {tag} names lock {named}: label = in-image lock = provenance = {agreed}"
    )


def refuse_rebinding(
    tag: str | None, definition: Mapping[str, object] | None, lock: Digest, action: str
) -> None:
    """Raise before anything moves when `tag` is template-shaped and names another lock than `lock`."""
    if tag is None:
        return
    named = named_lock(tag, templates_of(definition))
    if named is not None and not lock.hex.startswith(named):
        raise TagBindingError(
            f"refusing to {action} {tag}: the tag names lock {named}, the image was built from lock {lock}",
            hint="a tag made from the tag template names one set of inputs; use the image's own "
            "lock-derived tag, or a tag that is not template-shaped",
        )


# ------------------------------------------------------------------------------------------------ --lock


def lock_row(path: str, wanted: Lock, sources: LockSources, image_lock: Lock | None) -> Finding:
    """`lock file`: PASS only if the image was built from exactly `wanted`; else every differing field."""
    if image_lock is None:
        return binding_row("lock file", FAIL, f"{path}: the image carries no readable lock to compare")
    problems = [
        f"{place} says {value}" for place, value in sources.stated().items() if value != str(wanted.digest)
    ]
    if wanted.digest == image_lock.digest and not problems:
        return binding_row("lock file", PASS, f"built from exactly {path} ({wanted.digest})")
    fields = lock_differences(wanted, image_lock)
    head = f"{path} is {wanted.digest}, the image's lock is {image_lock.digest}"
    shown = fields[:MAX_FIELDS] + (
        [f"… and {len(fields) - MAX_FIELDS} more"] if len(fields) > MAX_FIELDS else []
    )
    return binding_row("lock file", FAIL, "; ".join([head, *shown] if fields else [head, *problems]))


def lock_differences(wanted: Lock, actual: Lock) -> list[str]:
    """Each field of `actual` (an image's lock) that differs from `wanted` (a lock file); overlays by id,
    so one added or removed overlay is one line, not a shift of every index."""
    names = ("the lock file has", "the image")
    lines = []
    mine = {o.id: o for o in wanted.overlays}
    theirs = {o.id: o for o in actual.overlays}
    for oid in sorted(set(mine) | set(theirs)):
        if oid not in theirs:
            lines.append(f"overlay {oid}: in the lock file, not in the image")
        elif oid not in mine:
            lines.append(f"overlay {oid}: in the image, not in the lock file")
        else:
            lines += [
                f"overlay {oid} {line}" for line in drift(_plain(mine[oid]), _plain(theirs[oid]), "", names)
            ]
    a_json, b_json = wanted.to_json(), actual.to_json()
    a_json.pop("overlays", None)
    b_json.pop("overlays", None)
    return drift(a_json, b_json, "", names) + lines


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(asdict(value)))
