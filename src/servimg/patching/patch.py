"""Unified diffs as values: the model (Patch, FilePatch, Hunk, HunkLine) and its strict parser.

A plain or git unified diff is parsed into frozen values, every problem collected and raised once with
line numbers (servimg.patching.overlay applies them). Hunk header counts are checked against the hunk
bodies, because a miscounted hunk makes lenient tools silently ignore the lines past the count. Pure:
bytes in, values out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from servimg.core.errors import OverlayError, collect

PARSE_HINT = (
    "regenerate the patch with `git diff` or `diff -u` rather than editing it by hand; "
    "hunk header counts must match the hunk bodies"
)
Kind: TypeAlias = Literal["modify", "create", "delete", "rename"]

# Nine digits at most: longer numbers are not line numbers, and int() of a huge digit string raises.
_HUNK_HEADER = re.compile(rb"@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@")
_EXTENDED_HEADERS = (
    b"old mode ",
    b"new mode ",
    b"deleted file mode ",
    b"new file mode ",
    b"copy from ",
    b"copy to ",
    b"rename from ",
    b"rename to ",
    b"rename old ",
    b"rename new ",
    b"similarity index ",
    b"dissimilarity index ",
    b"index ",
)
_REGULAR_MODES = (b"100644", b"100755")
_FLIP = {" ": " ", "-": "+", "+": "-"}
# Which sides of the diff a hunk line belongs to.
_SIDES = {" ": frozenset({"old", "new"}), "-": frozenset({"old"}), "+": frozenset({"new"})}
_C_ESCAPES = {ord(k): v for k, v in {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13}.items()}
_C_ESCAPES.update({ord('"'): ord('"'), ord("\\"): ord("\\")})


# ---------------------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class HunkLine:
    """One body line of a hunk: `op` is ' ' (context), '-' (removed) or '+' (added).

    `text` includes the line's ending (b"\\n", or b"\\r\\n" for CRLF files) unless the patch marked it with
    "\\ No newline at end of file".
    """

    op: str
    text: bytes


@dataclass(frozen=True)
class Hunk:
    """One `@@ -old_start,old_len +new_start,new_len @@` hunk, line numbers 1-based as written."""

    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: tuple[HunkLine, ...]

    @property
    def old_lines(self) -> tuple[bytes, ...]:
        """The lines this hunk expects in the original (context and removed)."""
        return tuple(line.text for line in self.lines if line.op != "+")

    @property
    def new_lines(self) -> tuple[bytes, ...]:
        """The lines this hunk leaves in the result (context and added)."""
        return tuple(line.text for line in self.lines if line.op != "-")

    @property
    def old_index(self) -> int:
        """0-based index of the first old line; an empty range names the line *before* it (unified diff)."""
        return self.old_start - 1 if self.old_len else self.old_start

    def reversed(self) -> Hunk:
        """The hunk that undoes this one."""
        lines = tuple(HunkLine(_FLIP[line.op], line.text) for line in self.lines)
        return Hunk(self.new_start, self.new_len, self.old_start, self.old_len, lines)


@dataclass(frozen=True)
class FilePatch:
    """The changes to one file. A path of None stands for /dev/null (the file is absent on that side)."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...]

    @property
    def kind(self) -> Kind:
        """'create', 'delete', 'rename' or 'modify'."""
        if self.old_path is None:
            return "create"
        if self.new_path is None:
            return "delete"
        return "rename" if self.old_path != self.new_path else "modify"

    @property
    def path(self) -> str:
        """The resulting path, or the old path for a delete."""
        if self.new_path is not None:
            return self.new_path
        return self.old_path if self.old_path is not None else ""

    @property
    def source_path(self) -> str:
        """The path whose current content this change starts from (the new path for a create)."""
        return self.old_path if self.old_path is not None else self.path

    @property
    def label(self) -> str:
        """How messages name this change."""
        if self.kind == "rename":
            return f"{self.old_path} -> {self.new_path}"
        return self.path

    def reversed(self) -> FilePatch:
        """The change that undoes this one (create <-> delete, rename back)."""
        return FilePatch(self.new_path, self.old_path, tuple(h.reversed() for h in self.hunks))


@dataclass(frozen=True)
class Patch:
    """A parsed unified diff: changes to one or more files, applied in order."""

    files: tuple[FilePatch, ...]

    @classmethod
    def parse(cls, data: bytes, *, strip: int = 1) -> Patch:
        """Parse a plain or git unified diff, stripping `strip` leading path components (like `patch -p1`).

        Raises one OverlayError listing every problem found (with line numbers); never anything else.
        """
        if not isinstance(data, bytes | bytearray):
            raise OverlayError(f"a patch is bytes, not {type(data).__name__}", hint=PARSE_HINT)
        if not isinstance(strip, int) or strip < 0:
            raise OverlayError(f"strip must be a non-negative integer, not {strip!r}", hint=PARSE_HINT)
        parser = _Parser(bytes(data), strip)
        parser.run()
        if not parser.files and not parser.problems:
            parser.problems.append("no file changes found (empty patch, or not a unified diff)")
        collect(
            parser.problems, OverlayError, f"malformed patch ({len(parser.problems)} problem(s))", PARSE_HINT
        )
        return cls(tuple(parser.files))

    def reversed(self) -> Patch:
        """The patch that undoes this one: each file reversed, in reverse order."""
        return Patch(tuple(fp.reversed() for fp in reversed(self.files)))


# ---------------------------------------------------------------------------------------------------------
# Parsing


def _split_lines(data: bytes) -> list[bytes]:
    """Split on b"\\n" only, keeping the endings, so that CRLF and lone CR survive byte for byte."""
    parts = data.split(b"\n")
    lines = [part + b"\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _chomp(line: bytes) -> bytes:
    """A header line without its ending (a CRLF-converted patch still has readable headers)."""
    line = line.removesuffix(b"\n")
    return line.removesuffix(b"\r")


def _show(line: bytes) -> str:
    """A short repr of a patch line for messages."""
    text = repr(_chomp(line))
    return text if len(text) <= 80 else text[:77] + "..."


def _unquote(data: bytes) -> tuple[bytes, bytes] | None:
    """Split a git C-quoted name ("a/x\\tb") off the front of `data`: (name, rest), or None if malformed."""
    out = bytearray()
    i = 1
    while i < len(data):
        char = data[i]
        if char == ord('"'):
            return bytes(out), data[i + 1 :]
        if char != ord("\\"):
            out.append(char)
            i += 1
            continue
        octal = data[i + 1 : i + 4]
        if len(octal) == 3 and all(ord("0") <= c <= ord("7") for c in octal) and int(octal, 8) < 256:
            out.append(int(octal, 8))
            i += 4
        elif i + 1 < len(data) and data[i + 1] in _C_ESCAPES:
            out.append(_C_ESCAPES[data[i + 1]])
            i += 2
        else:
            return None
    return None


def _raw_name(value: bytes) -> bytes | None:
    """The file name in a ---/+++/rename value: C-quoted, or up to the first tab (a date may follow)."""
    if value.startswith(b'"'):
        parsed = _unquote(value)
        return None if parsed is None else parsed[0]
    return value.split(b"\t", 1)[0]


def _git_header_names(rest: bytes, strip: int) -> tuple[bytes, bytes] | None:
    """The two names of `diff --git A B`, or None when they cannot be told apart."""
    if rest.startswith(b'"'):
        first = _unquote(rest)
        if first is None or not first[1].startswith(b" "):
            return None
        second = first[1][1:]
    else:
        cut = rest.find(b' "')
        if cut < 0:
            return _split_unquoted(rest, strip)
        first, second = (rest[:cut], b""), rest[cut + 1 :]
    if second.startswith(b'"'):
        parsed = _unquote(second)
        if parsed is None or parsed[1]:
            return None
        second = parsed[0]
    return first[0], second


def _split_unquoted(rest: bytes, strip: int) -> tuple[bytes, bytes] | None:
    """Split `a/x y b/x y`: without a rename both names are equal after stripping, which finds the space."""
    spaces = [i for i, char in enumerate(rest) if char == ord(" ")]
    for i in spaces:
        left, right = rest[:i].split(b"/"), rest[i + 1 :].split(b"/")
        if len(left) > strip and left[strip:] == right[strip:]:
            return rest[:i], rest[i + 1 :]
    if len(spaces) == 1:
        return rest[: spaces[0]], rest[spaces[0] + 1 :]
    return None


def _is_binary(line: bytes) -> bool:
    return line.startswith(b"GIT binary patch") or (
        line.startswith(b"Binary files ") and _chomp(line).endswith(b" differ")
    )


def _is_signature(line: bytes) -> bool:
    """`git format-patch` ends a mail with "-- " and the git version; that is not a removed line."""
    return _chomp(line) == b"-- "


@dataclass
class _GitNames:
    """Scratch state while reading one `diff --git` section: every place that names the file."""

    git: tuple[bytes, bytes] | None = None
    dash: tuple[str | None, str | None] | None = None
    renamed: bool = False
    rename_from: str | None = None
    rename_to: str | None = None
    new_file: bool = False
    deleted: bool = False


@dataclass
class _Body:
    """Scratch state while reading one hunk body against its header counts."""

    old_left: int
    new_left: int
    lines: list[HunkLine] = field(default_factory=list)
    # Sides whose last line had "\ No newline at end of file": nothing may follow on that side.
    ended: set[str] = field(default_factory=set)


class _Parser:
    """A line-oriented reader that records problems and resynchronises instead of stopping at the first."""

    def __init__(self, data: bytes, strip: int) -> None:
        self.lines = _split_lines(data)
        self.strip = strip
        self.i = 0
        self.problems: list[str] = []
        self.files: list[FilePatch] = []

    # -- cursor helpers

    def _peek(self) -> bytes | None:
        return self.lines[self.i] if self.i < len(self.lines) else None

    def _problem(self, lineno: int, message: str) -> None:
        self.problems.append(f"line {lineno}: {message}")

    def _at_plain_header(self) -> bool:
        return (
            self.i + 1 < len(self.lines)
            and self.lines[self.i].startswith(b"--- ")
            and self.lines[self.i + 1].startswith(b"+++ ")
        )

    def _at_file_start(self) -> bool:
        line = self._peek()
        return line is not None and (line.startswith(b"diff --git ") or self._at_plain_header())

    def _skip_until_header(self, *, hunks: bool) -> None:
        """After a reported problem, skip to the next file header (or hunk header) so later ones are found."""
        while (line := self._peek()) is not None and not self._at_file_start():
            if hunks and line.startswith(b"@@"):
                return
            self.i += 1

    # -- top level

    def run(self) -> None:
        """Read the whole patch. Text outside file sections (a commit message, a diffstat) is ignored."""
        while (line := self._peek()) is not None:
            if line.startswith(b"diff --git "):
                self._git_file()
            elif self._at_plain_header():
                self._plain_file()
            elif line.startswith(b"@@"):
                self._problem(self.i + 1, f"hunk {_show(line)} has no '---'/'+++' file header before it")
                self.i += 1
                self._skip_until_header(hunks=True)
            elif _is_binary(line):
                self._problem(self.i + 1, "binary patches are not supported: overlays patch text files only")
                self.i += 1
            else:
                self.i += 1

    # -- names

    def _path(self, raw: bytes, lineno: int, strip: int) -> str | None:
        """Decode and strip one file name; None for /dev/null (and on a recorded problem)."""
        if raw == b"/dev/null":
            return None
        if not raw:
            self._problem(lineno, "empty file name")
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self._problem(lineno, f"file name {raw!r} is not valid UTF-8")
            return None
        # Checked before stripping: `-p1` would turn /etc/passwd into etc/passwd and hide the intent.
        if text.startswith("/"):
            self._problem(lineno, f"absolute path {text!r} refused (overlay paths are package-relative)")
            return None
        parts = text.split("/")
        if len(parts) <= strip:
            self._problem(lineno, f"cannot strip {strip} leading component(s) from {text!r}")
            return None
        return "/".join(parts[strip:])

    def _field_path(self, value: bytes, lineno: int, strip: int) -> str | None:
        raw = _raw_name(_chomp(value))
        if raw is None:
            self._problem(lineno, f"malformed quoted file name {_show(value)}")
            return None
        return self._path(raw, lineno, strip)

    def _dash_names(self) -> tuple[str | None, str | None]:
        """Read the `--- old` / `+++ new` pair at the cursor."""
        lineno = self.i + 1
        old = self._field_path(self.lines[self.i][4:], lineno, self.strip)
        new = self._field_path(self.lines[self.i + 1][4:], lineno + 1, self.strip)
        self.i += 2
        return old, new

    # -- file sections

    def _plain_file(self) -> None:
        """A `--- a/x` / `+++ b/x` section, as written by `diff -u`."""
        lineno, before = self.i + 1, len(self.problems)
        old, new = self._dash_names()
        hunks = self._hunks()
        if len(self.problems) > before:
            return
        if old is None and new is None:
            self._problem(lineno, "both sides are /dev/null")
        elif old is not None and new is not None and old != new:
            self._problem(lineno, f"'---' names {old!r} but '+++' names {new!r}; use a git diff for renames")
        else:
            self._add(FilePatch(old, new, hunks), lineno, allow_empty=False)

    def _git_file(self) -> None:
        """A `diff --git` section: extended headers, then ---/+++ and hunks (absent for pure renames)."""
        lineno, before = self.i + 1, len(self.problems)
        rest = _chomp(self.lines[self.i]).removeprefix(b"diff --git ")
        names = _GitNames(git=_git_header_names(rest, self.strip))
        self.i += 1
        while (line := self._peek()) is not None and line.startswith(_EXTENDED_HEADERS):
            self._extended(line, names)
            self.i += 1
        line = self._peek()
        if line is not None and _is_binary(line):
            self._problem(self.i + 1, "binary patches are not supported: overlays patch text files only")
            self.i += 1
            self._skip_until_header(hunks=False)
            return
        if self._at_plain_header():
            names.dash = self._dash_names()
        elif line is not None and line.startswith(b"@@"):
            self._problem(self.i + 1, "hunk without '---'/'+++' lines in a git diff")
        hunks = self._hunks()
        if len(self.problems) > before:
            return
        paths = self._git_paths(names, lineno)
        if paths is not None and len(self.problems) == before:
            self._add(FilePatch(paths[0], paths[1], hunks), lineno, allow_empty=True)

    def _extended(self, line: bytes, names: _GitNames) -> None:
        """Record one git extended header line (mode, rename, copy, index …)."""
        lineno, text = self.i + 1, _chomp(line)
        # git writes rename names without the a/ b/ prefix, so they are stripped one component less.
        rename_strip = max(self.strip - 1, 0)
        if text.startswith((b"rename from ", b"rename old ")):
            names.renamed = True
            names.rename_from = self._field_path(text.split(b" ", 2)[2], lineno, rename_strip)
        elif text.startswith((b"rename to ", b"rename new ")):
            names.renamed = True
            names.rename_to = self._field_path(text.split(b" ", 2)[2], lineno, rename_strip)
        elif text.startswith((b"new file mode ", b"deleted file mode ")):
            names.new_file = names.new_file or text.startswith(b"new")
            names.deleted = names.deleted or text.startswith(b"deleted")
            if text.rsplit(b" ", 1)[1] not in _REGULAR_MODES:
                self._problem(lineno, f"{_show(line)}: only regular files (100644, 100755) are supported")
        elif text.startswith(b"new mode "):
            self._problem(lineno, "mode changes are not supported: overlays change file content only")
        elif text.startswith(b"copy from "):
            self._problem(lineno, "copies are not supported: write the copy as a new file")

    def _git_paths(self, names: _GitNames, lineno: int) -> tuple[str | None, str | None] | None:
        """Resolve old/new paths from the rename lines, the ---/+++ lines or the `diff --git` line."""
        sides = self._git_sides(names, lineno)
        if sides is None:
            return None
        old, new = sides
        if names.new_file and names.deleted:
            self._problem(lineno, "both 'new file mode' and 'deleted file mode'")
        if names.new_file:
            if names.dash is not None and old is not None:
                self._problem(lineno, f"'new file mode' but '---' names {old!r}, not /dev/null")
            old = None
        if names.deleted:
            if names.dash is not None and new is not None:
                self._problem(lineno, f"'deleted file mode' but '+++' names {new!r}, not /dev/null")
            new = None
        if not names.renamed and old is not None and new is not None and old != new:
            self._problem(lineno, f"names {old!r} and {new!r} without 'rename from'/'rename to'")
        return old, new

    def _git_sides(self, names: _GitNames, lineno: int) -> tuple[str | None, str | None] | None:
        if names.renamed:
            if names.rename_from is None or names.rename_to is None:
                self._problem(lineno, "a rename needs both 'rename from' and 'rename to'")
                return None
            sides = (names.rename_from, names.rename_to)
            if names.dash is not None and names.dash != sides:
                self._problem(lineno, f"'---'/'+++' names {names.dash} disagree with the rename {sides}")
            return sides
        if names.dash is not None:
            self._check_git_line(names, lineno)
            return names.dash
        if names.git is None:
            self._problem(lineno, "cannot tell the file names apart in the 'diff --git' line")
            return None
        return self._path(names.git[0], lineno, self.strip), self._path(names.git[1], lineno, self.strip)

    def _check_git_line(self, names: _GitNames, lineno: int) -> None:
        """The `diff --git` names must agree with the ---/+++ names (a hand-edited header is a mistake)."""
        if names.git is None or names.dash is None:
            return
        for raw, dash in zip(names.git, names.dash, strict=True):
            if dash is not None and b"/".join(raw.split(b"/")[self.strip :]) != dash.encode():
                self._problem(lineno, f"'diff --git' names {raw!r} but the ---/+++ lines name {dash!r}")

    def _add(self, fp: FilePatch, lineno: int, *, allow_empty: bool) -> None:
        """Check that the hunks fit the kind of change, then keep the file patch."""
        if fp.kind == "create" and any(h.old_len for h in fp.hunks):
            self._problem(lineno, f"creates {fp.path!r} but a hunk expects existing lines")
        elif fp.kind == "delete" and any(h.new_len for h in fp.hunks):
            self._problem(lineno, f"deletes {fp.path!r} but a hunk keeps or adds lines")
        elif not fp.hunks and (fp.kind == "modify" or not allow_empty):
            self._problem(lineno, f"no hunks for {fp.path!r}: the change does nothing")
        else:
            self.files.append(fp)

    # -- hunks

    def _hunks(self) -> tuple[Hunk, ...]:
        hunks: list[Hunk] = []
        number = 0
        while (line := self._peek()) is not None and line.startswith(b"@@"):
            number += 1
            lineno = self.i + 1
            hunk = self._hunk(number)
            if hunk is None:
                continue
            if hunks and hunk.old_index < hunks[-1].old_index + hunks[-1].old_len:
                self._problem(
                    lineno,
                    f"hunk {number} starts at old line {hunk.old_start}, inside or before "
                    f"hunk {number - 1} (hunks must be in order and must not overlap)",
                )
            hunks.append(hunk)
            self._stray(number)
        return tuple(hunks)

    def _hunk(self, number: int) -> Hunk | None:
        """Read one hunk at the cursor; on a problem, record it, skip to the next header, return None."""
        lineno, header = self.i + 1, self.lines[self.i]
        self.i += 1
        match = _HUNK_HEADER.match(header)
        if match is None:
            self._problem(
                lineno,
                f"hunk {number}: malformed header {_show(header)} "
                "(expected '@@ -start,count +start,count @@')",
            )
            self._skip_until_header(hunks=True)
            return None
        old_start, old_len, new_start, new_len = (int(g) if g is not None else 1 for g in match.groups())
        reason = _header_problem(old_start, old_len, new_start, new_len)
        if reason:
            self._problem(lineno, f"hunk {number}: {_show(header)} {reason}")
        body = None if reason else self._body(number, lineno, old_len, new_len)
        if body is None:
            self._skip_until_header(hunks=True)
            return None
        return Hunk(old_start, old_len, new_start, new_len, tuple(body.lines))

    def _body(self, number: int, lineno: int, old_len: int, new_len: int) -> _Body | None:
        """Read exactly as many lines as the header counts, plus a trailing no-newline marker."""
        body = _Body(old_len, new_len)
        while body.old_left or body.new_left or (self._peek() or b"").startswith(b"\\"):
            line = self._peek()
            if line is None:
                self._problem(
                    lineno,
                    f"hunk {number}: the patch ends inside the hunk; {_counts(body, old_len, new_len)}",
                )
                return None
            reason = self._body_line(body, line)
            if reason:
                self._problem(
                    self.i + 1,
                    f"hunk {number} (header at line {lineno}): {reason}; {_counts(body, old_len, new_len)}",
                )
                return None
            self.i += 1
        return body

    def _body_line(self, body: _Body, line: bytes) -> str:
        """Take one body line into `body`; return why it does not fit (empty when it does)."""
        if line.startswith(b"\\"):
            return _mark_no_newline(body)
        # An empty line is an empty context line whose space was eaten by an editor (GNU diff and git agree).
        op, text = (" ", b"\n") if line == b"\n" else (line[:1].decode("latin-1"), line[1:])
        if line.startswith(b"@@"):
            return f"the next hunk header {_show(line)} comes before this hunk is complete"
        if op not in _SIDES:
            return f"{_show(line)} is not a hunk line (' ', '-', '+' or '\\')"
        if ("old" in _SIDES[op] and not body.old_left) or ("new" in _SIDES[op] and not body.new_left):
            return f"{_show(line)} is more than the header counts"
        if _SIDES[op] & body.ended:
            return f"{_show(line)} follows a line marked '\\ No newline at end of file' on the same side"
        if not text.endswith(b"\n"):
            return f"{_show(line)} has no line ending (truncated patch?)"
        body.lines.append(HunkLine(op, text))
        body.old_left -= "old" in _SIDES[op]
        body.new_left -= "new" in _SIDES[op]
        return ""

    def _stray(self, number: int) -> None:
        """Report hunk-like lines right after a complete hunk: its header counted too few lines."""
        start = self.i
        while (line := self._peek()) is not None and line[:1] in (b" ", b"-", b"+", b"\\"):
            if self._at_file_start() or _is_signature(line):
                break
            self.i += 1
        if self.i > start:
            self._problem(
                start + 1,
                f"{self.i - start} line(s) after hunk {number} belong to no hunk "
                "(the hunk header counts too few lines?)",
            )


def _header_problem(old_start: int, old_len: int, new_start: int, new_len: int) -> str:
    if not old_len and not new_len:
        return "is an empty hunk"
    if (old_start == 0 and old_len) or (new_start == 0 and new_len):
        return "starts a non-empty range at line 0"
    return ""


def _counts(body: _Body, old_len: int, new_len: int) -> str:
    return (
        f"the header counts {old_len} old and {new_len} new lines, the body has "
        f"{old_len - body.old_left} old and {new_len - body.new_left} new lines so far"
    )


def _mark_no_newline(body: _Body) -> str:
    """Apply "\\ No newline at end of file" to the previous line; return why it cannot (empty if it can)."""
    if not body.lines:
        return "'\\ No newline at end of file' with no line before it"
    last = body.lines[-1]
    if not last.text.endswith(b"\n"):
        return "a second '\\ No newline at end of file' for the same line"
    if last.text == b"\n":
        # Without its newline the line would be zero bytes: no line at all, so no diff tool writes this.
        return "'\\ No newline at end of file' after an empty line"
    body.lines[-1] = HunkLine(last.op, last.text[:-1])
    body.ended |= _SIDES[last.op]
    return ""


def split_lines(data: bytes) -> list[bytes]:
    """The lines of `data` as the engine sees them (endings kept)."""
    return _split_lines(data)
