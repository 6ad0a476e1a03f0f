"""A definition's YAML edited in place into another definition (`servimg rebase`, `servimg base --repin`):
line by line, so comments, order and layout survive; rendered afresh only when the layout is one these
edits do not understand. The result must parse back to exactly the definition asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

from servimg.core.atomic import atomic_write
from servimg.core.errors import ServimgError
from servimg.definitions.definition import (
    ImageDefinition,
)
from servimg.definitions.lock import lock_path_for


@contextlib.contextmanager
def scratch_definition(definition_path: Path, text: str, purpose: str) -> Iterator[Path]:
    """A proposed definition as a hidden file beside the real one (overlay paths resolve the same way),
    removed afterwards with its lock whatever happens: the real definition and lock are untouched until
    the caller writes them."""
    scratch = definition_path.with_name(f".{definition_path.stem}.{purpose}-{os.getpid()}.yaml")
    atomic_write(scratch, text.encode(), 0o644)
    try:
        yield scratch
    finally:
        scratch.unlink(missing_ok=True)
        lock_path_for(scratch).unlink(missing_ok=True)


def definition_text(text: str, old: ImageDefinition, new: ImageDefinition) -> str:
    """`text` (the old definition's YAML) edited into `new` line by line, so comments and layout
    survive; when the layout is one these edits do not understand, the definition rendered afresh."""
    edited = _edit(text, old, new)
    if edited is not None:
        with contextlib.suppress(ServimgError):
            if ImageDefinition.parse(edited) == new:
                return edited
    rendered = yaml.safe_dump(new.to_json(exclude_defaults=True), sort_keys=False)
    return "# Written by `servimg rebase` (the original layout could not be edited in place).\n" + rendered


_TOP = re.compile(r"^(?P<key>[A-Za-z_][\w-]*):")


def _blocks(lines: list[str]) -> dict[str, tuple[int, int]]:
    """Top-level key → (first line, end line) of its block."""
    starts = [(i, m["key"]) for i, line in enumerate(lines) if (m := _TOP.match(line))]
    return {
        key: (i, (starts[n + 1][0] if n + 1 < len(starts) else len(lines)))
        for n, (i, key) in enumerate(starts)
    }


def _scalar(value: str) -> str:
    """`value` as a YAML scalar that reads back as the same string (plain when it can be)."""
    with contextlib.suppress(yaml.YAMLError):
        if yaml.safe_load(f"k: {value}") == {"k": value}:
            return value
    return json.dumps(value)


def _set_value(line: str, key: str, value: str) -> str:
    """`  key: old  # comment` with the value replaced, the comment and the line ending kept."""
    match = re.match(rf"^(\s+{key}:\s*)(\S.*?)(\s+#.*)?(\r?\n)?$", line)
    if match is None:
        return line
    return f"{match[1]}{_scalar(value)}{match[3] or ''}{match[4] or ''}"


def _edit(text: str, old: ImageDefinition, new: ImageDefinition) -> str | None:
    lines = text.splitlines(keepends=True)
    blocks = _blocks(lines)
    if "base" not in blocks or "packages" not in blocks:
        return None
    start, end = blocks["base"]
    for key, value in (("ref", new.base.ref), ("digest", new.base.digest)):
        hits = [i for i in range(start + 1, end) if re.match(rf"^\s+{key}:\s*\S", lines[i])]
        if len(hits) != 1:
            return None
        lines[hits[0]] = _set_value(lines[hits[0]], key, str(value))
    start, end = blocks["packages"]
    for name, spec in new.packages.items():
        if old.packages[name].version == spec.version:
            continue
        rows = [i for i in range(start + 1, end) if re.match(rf"^\s+{re.escape(name)}:", lines[i])]
        if len(rows) != 1:
            return None
        scan = [rows[0], *_nested(lines, rows[0], end)]
        for i in scan:
            pattern = rf"(version:\s*)[\"']?{re.escape(old.packages[name].version)}[\"']?"
            replaced, count = re.subn(pattern, rf"\g<1>{_scalar(spec.version)}", lines[i], count=1)
            if count:
                lines[i] = replaced
                break
        else:
            return None
    kept = {o.id for o in new.overlays}
    for overlay in old.overlays:
        if overlay.id not in kept:
            cut = _overlay_lines(lines, overlay.id)
            if cut is None:
                return None
            del lines[cut[0] : cut[1]]
    if not new.overlays and "overlays" in _blocks(lines):
        start, end = _blocks(lines)["overlays"]
        lines[start:end] = ["overlays: []\n"]
    return "".join(lines)


def _nested(lines: list[str], row: int, end: int) -> list[int]:
    """The lines after `row` (up to `end`) indented deeper than it: its block-style mapping."""
    depth = len(lines[row]) - len(lines[row].lstrip())
    out = []
    for i in range(row + 1, end):
        if lines[i].strip() and len(lines[i]) - len(lines[i].lstrip()) <= depth:
            break
        out.append(i)
    return out


def _overlay_lines(lines: list[str], overlay_id: str) -> tuple[int, int] | None:
    blocks = _blocks(lines)
    if "overlays" not in blocks:
        return None
    start, end = blocks["overlays"]
    dashes = [i for i in range(start + 1, end) if re.match(r"^\s*- ", lines[i])]
    if not dashes:
        return None
    depth = min(len(lines[i]) - len(lines[i].lstrip()) for i in dashes)  # the list's own items
    items = [i for i in dashes if len(lines[i]) - len(lines[i].lstrip()) == depth]
    for n, i in enumerate(items):
        if re.match(rf"^\s*- id:\s*[\"']?{re.escape(overlay_id)}[\"']?\s*$", lines[i]):
            stop = items[n + 1] if n + 1 < len(items) else end
            # Blank and comment lines at its end introduce what follows (the next item, the next key):
            # they stay.
            while stop > i + 1 and (not lines[stop - 1].strip() or lines[stop - 1].lstrip().startswith("#")):
                stop -= 1
            return i, stop
    return None
