"""A pure unified-diff engine for overlays: check paths, apply exactly (the diffs themselves are
parsed by servimg.patching.patch).

Everything works on bytes and nothing here touches the file system: the caller hands in a `read` function
and receives new contents back (images are values). The engine is deliberately stricter than GNU `patch`:

- context and removed lines must match byte for byte (line endings and a missing final newline included);
- a hunk may be found at an offset from its declared line, but the offset is reported, and context lines are
  never dropped (no fuzz), because a fuzzy match is exactly how a patch lands in the wrong place unnoticed;
- hunk header counts are checked against the hunk bodies, because a miscounted hunk makes lenient tools
  silently ignore the lines past the count;
- every problem found is collected and reported at once, with line numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from servimg.core.errors import OverlayError, collect
from servimg.patching.patch import FilePatch, Hunk, Patch, split_lines

APPLY_HINT = (
    "regenerate the patch against the pinned base (the base file changed), "
    "or pin the base the patch was made for"
)
PATH_HINT = (
    "an overlay may only change files inside its own package directory, "
    "named relative to site-packages (e.g. vllm/v1/core/sched/scheduler.py)"
)

Reader: TypeAlias = Callable[[str], bytes | None]


@dataclass(frozen=True)
class AppliedFile:
    """The outcome for one path. `content` None means the file is deleted (or renamed away).

    `offsets` holds, per hunk, actual start line minus declared start line (0 when it applied where declared).
    """

    path: str
    content: bytes | None
    offsets: tuple[int, ...]


# ---------------------------------------------------------------------------------------------------------
# Path safety


def check_path(path: str, package: str) -> list[str]:
    """Every reason `path` is not a safe, canonical file path inside `<package>/` (empty when it is)."""
    if not package.isidentifier():
        return [f"package {package!r} is not an import name"]
    if not path:
        return ["empty path"]
    problems: list[str] = []
    parts = path.split("/")
    if path.startswith("/"):
        problems.append(f"{path!r} is an absolute path")
    if "\\" in path:
        problems.append(f"{path!r} contains a backslash (only '/' separates components)")
    if any(ord(char) < 32 or ord(char) == 127 for char in path):
        problems.append(f"{path!r} contains a NUL or another control character")
    if ".." in parts:
        problems.append(f"{path!r} has a '..' component (it could escape the package)")
    if "." in parts:
        problems.append(f"{path!r} has a '.' component (not canonical)")
    if "" in parts[1:] or (parts[0] == "" and not path.startswith("/")):
        problems.append(f"{path!r} has an empty component ('//' or a trailing '/')")
    if parts[0] != package:
        problems.append(f"{path!r} is outside package {package!r} (it must start with '{package}/')")
    elif len(parts) < 2:
        problems.append(f"{path!r} names the package directory itself, not a file in it")
    return problems


def validate_paths(patch: Patch, package: str) -> None:
    """Raise one OverlayError listing every unsafe or out-of-package path in `patch`."""
    problems: list[str] = []
    for number, fp in enumerate(patch.files, 1):
        for path in dict.fromkeys(p for p in (fp.old_path, fp.new_path) if p is not None):
            problems.extend(f"file {number}: {problem}" for problem in check_path(path, package))
    collect(problems, OverlayError, f"the patch touches unsafe paths or paths outside {package!r}", PATH_HINT)


# ---------------------------------------------------------------------------------------------------------
# Applying


def _refuse(label: str, problems: Sequence[str]) -> OverlayError:
    """One error for one file: a single problem is the message itself, several are listed."""
    if len(problems) == 1:
        return OverlayError(problems[0], hint=APPLY_HINT)
    return OverlayError(
        f"{label}: {len(problems)} hunks do not apply exactly", hint=APPLY_HINT, problems=problems
    )


def apply_file(fp: FilePatch, original: bytes | None) -> AppliedFile:
    """Apply one file's hunks exactly to `original` (None = the file does not exist).

    For a rename the result carries the new path; removing the old path is the caller's business
    (apply_patch does it). Raises OverlayError naming the file, hunk, declared line and first mismatch.
    """
    if fp.kind == "create":
        return _create(fp, original)
    if original is None:
        raise _refuse(fp.label, [f"{fp.label}: cannot {fp.kind}: the file does not exist"])
    if fp.kind == "delete":
        return _delete(fp, original)
    content, offsets = _apply_hunks(fp, original)
    return AppliedFile(fp.path, content, offsets)


def _create(fp: FilePatch, original: bytes | None) -> AppliedFile:
    if original is not None:
        raise _refuse(
            fp.label, [f"{fp.label}: cannot create: the file already exists ({len(original)} bytes)"]
        )
    lines = [text for hunk in fp.hunks for text in hunk.new_lines]
    origin = [number for number, hunk in enumerate(fp.hunks, 1) for _ in hunk.new_lines]
    problems = _misplaced_eof(fp, lines, origin)
    if problems:
        raise _refuse(fp.label, problems)
    return AppliedFile(fp.path, b"".join(lines), (0,) * len(fp.hunks))


def _delete(fp: FilePatch, original: bytes) -> AppliedFile:
    """A delete must remove exactly the whole file: nothing may be left that the patch did not see."""
    lines = split_lines(original)
    at = 0
    for number, hunk in enumerate(fp.hunks, 1):
        mismatch = _first_mismatch(hunk, lines, at)
        if mismatch:
            raise _refuse(
                fp.label, [f"{fp.label}: hunk {number} at line {hunk.old_start}: cannot delete: {mismatch}"]
            )
        at += len(hunk.old_lines)
    if at < len(lines):
        raise _refuse(
            fp.label,
            [
                f"{fp.label}: cannot delete: the file has {len(lines) - at} more line(s) than "
                f"the patch removes, from line {at + 1}: {lines[at]!r}"
            ],
        )
    return AppliedFile(fp.path, None, (0,) * len(fp.hunks))


@dataclass(frozen=True)
class HunkFit:
    """Where one hunk of a file patch lands in a file under the engine's rules (exact match, offsets
    searched nearest first, hunks in order and never overlapping, no fuzz): `at` is the 0-based index of
    its first old line, or None with `problem` saying why it fits nowhere."""

    number: int  # 1-based, in the file patch
    hunk: Hunk
    at: int | None
    problem: str = ""

    @property
    def offset(self) -> int:
        """Actual minus declared start line (0 when unplaced or where declared)."""
        return 0 if self.at is None else self.at - self.hunk.old_index


def place_hunks(fp: FilePatch, original: bytes) -> tuple[HunkFit, ...]:
    """Place every hunk of `fp` in `original`, in order, exactly as `apply_file` would; a hunk that
    fits nowhere does not move the later ones' search start."""
    return _place(fp, split_lines(original))


def _place(fp: FilePatch, lines: list[bytes]) -> tuple[HunkFit, ...]:
    fits: list[HunkFit] = []
    pos = 0  # hunks apply in order: none may start before the end of the previous one
    for number, hunk in enumerate(fp.hunks, 1):
        found = _locate(hunk, lines, pos)
        if isinstance(found, str):
            fits.append(HunkFit(number, hunk, None, found))
            continue
        fits.append(HunkFit(number, hunk, found))
        pos = found + len(hunk.old_lines)
    return tuple(fits)


def exact_matches(hunk: Hunk, original: bytes) -> int:
    """How many places in `original` hold the hunk's old lines exactly (more than one: the nearest is
    taken, which a reviewer may want to know)."""
    old, lines = list(hunk.old_lines), split_lines(original)
    if not old:
        return 1
    return sum(1 for j in range(len(lines) - len(old) + 1) if lines[j : j + len(old)] == old)


def _apply_hunks(fp: FilePatch, original: bytes) -> tuple[bytes, tuple[int, ...]]:
    """Apply the hunks in order to the lines of `original`; collect a problem per hunk that does not fit."""
    lines = split_lines(original)
    fits = _place(fp, lines)
    problems = [
        f"{fp.label}: hunk {fit.number} at line {fit.hunk.old_start}: {fit.problem}"
        for fit in fits
        if fit.at is None
    ]
    out: list[bytes] = []
    origin: list[int] = []  # per output line, the hunk that wrote it (0 = kept from the original)
    pos = 0
    for fit in fits:
        if fit.at is None:
            continue
        out += lines[pos : fit.at] + list(fit.hunk.new_lines)
        origin += [0] * (fit.at - pos) + [fit.number] * len(fit.hunk.new_lines)
        pos = fit.at + len(fit.hunk.old_lines)
    out += lines[pos:]
    origin += [0] * (len(lines) - pos)
    problems = problems or _misplaced_eof(fp, out, origin)
    if problems:
        raise _refuse(fp.label, problems)
    return b"".join(out), tuple(fit.offset for fit in fits)


def _misplaced_eof(fp: FilePatch, lines: list[bytes], origin: list[int]) -> list[str]:
    """A line without a newline is only valid last; anywhere else it would silently join two lines."""
    for index, line in enumerate(lines[:-1]):
        if not line.endswith(b"\n"):
            number = origin[index] or origin[index + 1]
            hunk = fp.hunks[number - 1]
            return [
                f"{fp.label}: hunk {number} at line {hunk.old_start}: line {line!r} has no newline at end "
                "of file but is not the last line of the result"
            ]
    return []


def _anchor(hunk: Hunk) -> str:
    """'start' or 'end' when the hunk's context was cut short by the file's start or end, else ''.

    A diff takes as much context as it can on both sides; fewer lines on one side means the file ended
    there, so the hunk may only apply at that end of the file (as GNU patch does without fuzz).
    """
    ops = [line.op for line in hunk.lines]
    leading = next((i for i, op in enumerate(ops) if op != " "), len(ops))
    trailing = next((i for i, op in enumerate(reversed(ops)) if op != " "), len(ops))
    if leading < trailing:
        return "start"
    return "end" if trailing < leading else ""


def _nearest(declared: int, lo: int, hi: int) -> Iterator[int]:
    """Start indexes in [lo, hi], nearest to `declared` first; ties go forward (code tends to grow above)."""
    up, down = max(declared, lo), min(declared - 1, hi)
    while up <= hi or down >= lo:
        if up <= hi and (down < lo or up - declared <= declared - down):
            yield up
            up += 1
        else:
            yield down
            down -= 1


def _locate(hunk: Hunk, lines: list[bytes], pos: int) -> int | str:
    """The index where the hunk's old lines match exactly at or after `pos`, or why there is none."""
    old = list(hunk.old_lines)
    declared = hunk.old_index
    if not old:
        # Nothing to search with: a pure insertion without context goes exactly where it says or nowhere.
        if pos <= declared <= len(lines):
            return declared
        where = "overlaps the previous hunk" if declared < pos else f"is past the end ({len(lines)} lines)"
        return f"an insertion without context {where}"
    hi = len(lines) - len(old)
    anchor = _anchor(hunk)
    candidates: Iterator[int] | list[int] = _nearest(declared, pos, hi)
    if anchor:
        candidates = [j for j in ([0] if anchor == "start" else [hi]) if pos <= j <= hi]
    for j in candidates:
        if lines[j] == old[0] and lines[j : j + len(old)] == old:
            return j
    return _explain(hunk, lines, pos, anchor)


def _explain(hunk: Hunk, lines: list[bytes], pos: int, anchor: str) -> str:
    """Why `_locate` found no place: the first differing line where the hunk should have gone."""
    declared = hunk.old_index
    if anchor:
        at = 0 if anchor == "start" else max(len(lines) - len(hunk.old_lines), 0)
        rule = f"its context stops at the file's {anchor}, so it may only apply at the {anchor}"
    else:
        at, rule = declared, "no exact match anywhere (offsets are searched, fuzz is never used)"
    mismatch = _first_mismatch(hunk, lines, at)
    if not mismatch:
        return f"{rule}; it matches at line {at + 1} only, which overlaps the previous hunk"
    return f"{rule}; {'there' if anchor else 'at the declared place'}, {mismatch}"


def _first_mismatch(hunk: Hunk, lines: list[bytes], at: int) -> str:
    """The first old line of `hunk` that differs from `lines` starting at index `at` (empty if none)."""
    old = [line for line in hunk.lines if line.op != "+"]
    for k, expected in enumerate(old):
        index = at + k
        found = repr(lines[index]) if 0 <= index < len(lines) else "end of file"
        if index >= len(lines) or lines[index] != expected.text:
            what = "context" if expected.op == " " else "removed"
            return f"line {index + 1}: expected {what} line {expected.text!r}, found {found}"
    return ""


def apply_patch(patch: Patch, read: Reader, package: str) -> tuple[AppliedFile, ...]:
    """Apply every file patch in order, each seeing the results of the ones before it.

    `read(path)` returns the current content of a package-relative path, or None when it does not exist.
    The result lists what each file patch produced, in order (a rename gives the old path with content
    None, then the new path); when a path appears more than once, its last entry is its final state.
    Feed the result into the next overlay's `read` to stack overlays (or use `apply_overlays`).
    """
    validate_paths(patch, package)
    state: dict[str, bytes | None] = {}

    def current(path: str) -> bytes | None:
        return state[path] if path in state else read(path)

    results: list[AppliedFile] = []
    problems: list[str] = []
    failed: set[str] = set()
    for fp in patch.files:
        touched = {p for p in (fp.old_path, fp.new_path) if p is not None}
        if touched & failed:
            # Its input would be a guess: the earlier change it builds on did not apply.
            problems.append(f"{fp.label}: not attempted: an earlier change to this file failed")
            continue
        try:
            produced = _apply_one(fp, current)
        except OverlayError as exc:
            problems.extend(exc.problems or (exc.message,))
            failed |= touched
            continue
        state.update((applied.path, applied.content) for applied in produced)
        results.extend(produced)
    collect(
        problems, OverlayError, f"the patch does not apply exactly ({len(problems)} problem(s))", APPLY_HINT
    )
    return tuple(results)


def _apply_one(fp: FilePatch, current: Reader) -> tuple[AppliedFile, ...]:
    applied = apply_file(fp, current(fp.source_path))
    if fp.kind != "rename":
        return (applied,)
    if current(fp.path) is not None:
        raise _refuse(fp.label, [f"{fp.label}: cannot rename: the target {fp.path!r} already exists"])
    return AppliedFile(fp.source_path, None, ()), applied


def apply_overlays(
    patches: Sequence[tuple[str, Patch]], read: Reader, package_of: Callable[[Patch], str]
) -> dict[str, bytes | None]:
    """Apply named overlays in declared order, each on top of the ones before; return every changed path.

    The first overlay that does not apply stops the run (later ones were made on top of it); its error is
    prefixed with "overlay <name>".
    """
    changes: dict[str, bytes | None] = {}

    def current(path: str) -> bytes | None:
        return changes[path] if path in changes else read(path)

    for name, patch in patches:
        try:
            applied = apply_patch(patch, current, package_of(patch))
        except OverlayError as exc:
            raise exc.context(f"overlay {name}") from exc
        changes.update((item.path, item.content) for item in applied)
    return changes
