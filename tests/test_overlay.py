"""Tests for the unified-diff engine: parsing, path safety, exact application, reversal."""

from __future__ import annotations

import contextlib
import difflib
import posixpath
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from servimg.core.errors import OverlayError
from servimg.patching.overlay import (
    APPLY_HINT,
    AppliedFile,
    apply_file,
    apply_overlays,
    apply_patch,
    check_path,
    validate_paths,
)
from servimg.patching.patch import FilePatch, Hunk, HunkLine, Patch

BASE = b"".join(b"line %d\n" % n for n in range(1, 21))


def reader(files: dict[str, bytes]) -> Callable[[str], bytes | None]:
    """A `read` callable over a dict (absent keys are absent files)."""
    return files.get


def one(data: bytes, strip: int = 1) -> FilePatch:
    (fp,) = Patch.parse(data, strip=strip).files
    return fp


def parse_problems(data: bytes, **kwargs: int) -> tuple[str, ...]:
    with pytest.raises(OverlayError) as info:
        Patch.parse(data, **kwargs)
    return info.value.problems


def modify(path: str, body: bytes) -> bytes:
    return b"--- a/%s\n+++ b/%s\n" % (path.encode(), path.encode()) + body


# A modification of BASE: line 10 becomes "ten", declared at line 7 with three lines of context.
CHANGE_10 = modify(
    "vllm/f.py",
    b"@@ -7,7 +7,7 @@ def f():\n line 7\n line 8\n line 9\n-line 10\n+ten\n line 11\n line 12\n line 13\n",
)


# --------------------------------------------------------------------------------------------------------
# Parsing


def test_parse_plain_diff() -> None:
    fp = one(CHANGE_10)
    assert (fp.old_path, fp.new_path, fp.kind, fp.path) == ("vllm/f.py", "vllm/f.py", "modify", "vllm/f.py")
    (hunk,) = fp.hunks
    assert (hunk.old_start, hunk.old_len, hunk.new_start, hunk.new_len) == (7, 7, 7, 7)
    assert hunk.lines[3] == HunkLine("-", b"line 10\n")
    assert hunk.lines[4] == HunkLine("+", b"ten\n")


def test_parse_plain_diff_with_dates_preamble_and_default_counts() -> None:
    data = (
        b"Some commit message\n- a bullet that is not a removed line\n\n"
        b"--- a/vllm/f.py\t2024-01-01 00:00:00.000000000 +0000\n"
        b"+++ b/vllm/f.py\t2024-01-02 00:00:00.000000000 +0000\n"
        b"@@ -1 +1 @@\n-a\n+b\n"
    )
    hunk = one(data).hunks[0]
    assert (hunk.old_start, hunk.old_len, hunk.new_start, hunk.new_len) == (1, 1, 1, 1)


def test_parse_git_modify_with_index_line() -> None:
    data = b"diff --git a/vllm/f.py b/vllm/f.py\nindex 83db48f..bf269f4 100644\n" + CHANGE_10
    assert one(data).kind == "modify"


def test_parse_git_create_and_delete() -> None:
    create = one(
        b"diff --git a/vllm/new.py b/vllm/new.py\nnew file mode 100755\nindex 0000000..e69de29\n"
        b"--- /dev/null\n+++ b/vllm/new.py\n@@ -0,0 +1,2 @@\n+a\n+b\n"
    )
    assert (create.kind, create.old_path, create.path) == ("create", None, "vllm/new.py")
    delete = one(
        b"diff --git a/vllm/old.py b/vllm/old.py\ndeleted file mode 100644\nindex e69de29..0000000\n"
        b"--- a/vllm/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n"
    )
    assert (delete.kind, delete.new_path, delete.path) == ("delete", None, "vllm/old.py")


def test_parse_git_empty_new_file_without_hunks() -> None:
    fp = one(b"diff --git a/vllm/empty.py b/vllm/empty.py\nnew file mode 100644\nindex 0000000..e69de29\n")
    assert (fp.kind, fp.path, fp.hunks) == ("create", "vllm/empty.py", ())
    assert apply_file(fp, None).content == b""


def test_parse_git_rename_with_hunks_and_pure_rename() -> None:
    data = (
        b"diff --git a/vllm/a.py b/vllm/b.py\nsimilarity index 90%\nrename from vllm/a.py\n"
        b"rename to vllm/b.py\nindex 1..2 100644\n--- a/vllm/a.py\n+++ b/vllm/b.py\n@@ -1 +1 @@\n-x\n+y\n"
        b"diff --git a/vllm/c.py b/vllm/d.py\nsimilarity index 100%\n"
        b"rename from vllm/c.py\nrename to vllm/d.py\n"
    )
    renamed, pure = Patch.parse(data).files
    assert (renamed.kind, renamed.old_path, renamed.new_path, len(renamed.hunks)) == (
        "rename",
        "vllm/a.py",
        "vllm/b.py",
        1,
    )
    assert (pure.kind, pure.old_path, pure.path, pure.hunks) == ("rename", "vllm/c.py", "vllm/d.py", ())


def test_parse_git_quoted_names() -> None:
    data = (
        b'diff --git "a/vllm/sp ace\\tx.py" "b/vllm/sp ace\\tx.py"\n'
        b'--- "a/vllm/sp ace\\tx.py"\n+++ "b/vllm/sp ace\\tx.py"\n@@ -1 +1 @@\n-x\n+y\n'
    )
    assert one(data).path == "vllm/sp ace\tx.py"


def test_parse_git_names_with_spaces_unquoted() -> None:
    assert one(b"diff --git a/vllm/a b.py b/vllm/a b.py\nnew file mode 100644\n").path == "vllm/a b.py"


def test_parse_strip_levels() -> None:
    assert one(CHANGE_10.replace(b"a/vllm", b"vllm").replace(b"b/vllm", b"vllm"), strip=0).path == "vllm/f.py"
    deep = CHANGE_10.replace(b"a/vllm", b"x/y/vllm").replace(b"b/vllm", b"x/y/vllm")
    assert Patch.parse(deep, strip=2).files[0].path == "vllm/f.py"
    assert any(
        "cannot strip 3" in p for p in parse_problems(b"--- a/b\n+++ a/b\n@@ -1 +1 @@\n-x\n+y\n", strip=3)
    )


def test_format_patch_mail_with_signature_is_accepted() -> None:
    mail = (
        b"From 1234 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] fix\n\n---\n vllm/f.py | 2 +-\n\n"
        + b"diff --git a/vllm/f.py b/vllm/f.py\n"
        + CHANGE_10
        + b"-- \n2.39.2\n\n"
    )
    assert one(mail).kind == "modify"


@pytest.mark.parametrize(
    "data",
    [
        b"diff --git a/vllm/x.so b/vllm/x.so\nindex 1..2\nGIT binary patch\nliteral 3\nKcmZ?l00002\n\n",
        b"diff --git a/vllm/x.so b/vllm/x.so\nindex 1..2\nBinary files a/vllm/x.so and b/vllm/x.so differ\n",
        b"Binary files a/vllm/x.so and b/vllm/x.so differ\n",
    ],
)
def test_binary_patches_refused(data: bytes) -> None:
    assert any("binary patches are not supported" in p for p in parse_problems(data))


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"", "no file changes found"),
        (b"just some text\n", "no file changes found"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n", "no hunks"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1,2 +1,2\n x\n-y\n+z\n", "malformed header"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -a,2 +1,2 @@\n", "malformed header"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1,99999999999 +1 @@\n", "malformed header"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1,3 +1,3 @@\n x\n-y\n+z\n", "patch ends inside"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1,1 +1,1 @@\n x\n-y\n+z\n", "belong to no hunk"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1,2 +1,2 @@\n x\n*y\n+z\n", "is not a hunk line"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1,2 +1 @@\n-x\n-y\n-z\n", "more than the header counts"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -0,2 +1 @@\n-x\n-y\n+z\n", "line 0"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1,0 +1,0 @@\n", "empty hunk"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1 +1 @@\n-x\n+y", "no line ending"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1 +1 @@\n\\ No newline at end of file\n-x\n+y\n", "no line"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1,2 +1 @@\n-x\n\\ No newline\n-y\n+z\n", "on the same side"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1 +1 @@\n-x\n+y\n\\ No newline\n\\ again\n", "a second"),
        (b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -1 +1 @@\n-x\n+\n\\ No newline\n", "after an empty line"),
        (b"--- a/vllm/f.py\n+++ b/vllm/g.py\n@@ -1 +1 @@\n-x\n+y\n", "use a git diff for renames"),
        (b"--- /dev/null\n+++ /dev/null\n@@ -1 +1 @@\n-x\n+y\n", "both sides are /dev/null"),
        (b"--- /dev/null\n+++ b/vllm/f.py\n@@ -1 +1 @@\n-x\n+y\n", "expects existing lines"),
        (b"--- a/vllm/f.py\n+++ /dev/null\n@@ -1 +1 @@\n-x\n+y\n", "keeps or adds lines"),
        (b"@@ -1 +1 @@\n-x\n+y\n", "no '---'/'+++' file header"),
        (b"--- a/\xff.py\n+++ b/\xff.py\n@@ -1 +1 @@\n-x\n+y\n", "not valid UTF-8"),
        (b'--- "a/vllm/\\q"\n+++ "a/vllm/\\q"\n@@ -1 +1 @@\n-x\n+y\n', "malformed quoted file name"),
        (b"--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-x\n+y\n", "absolute path '/etc/passwd'"),
        (b"diff --git a/vllm/f.py b/vllm/f.py\nold mode 100644\nnew mode 100755\n", "mode changes"),
        (
            b"diff --git a/vllm/l b/vllm/l\nnew file mode 120000\n--- /dev/null\n+++ b/vllm/l\n",
            "regular files",
        ),
        (b"diff --git a/vllm/a b/vllm/b\ncopy from vllm/a\ncopy to vllm/b\n", "copies are not supported"),
        (
            b"diff --git a/vllm/a b/vllm/a\n--- a/vllm/b\n+++ b/vllm/b\n@@ -1 +1 @@\n-x\n+y\n",
            "'diff --git' names",
        ),
        (b"diff --git a/vllm/a b/vllm/b\nrename from vllm/a\n", "both 'rename from' and 'rename to'"),
        (b"diff --git a/vllm/a b/vllm/a\n@@ -1 +1 @@\n-x\n+y\n", "hunk without '---'/'+++'"),
        (
            b"diff --git a/vllm/a b/vllm/a\nnew file mode 100644\n--- a/vllm/a\n+++ b/vllm/a\n",
            "not /dev/null",
        ),
        (
            b"diff --git a/vllm/a b/vllm/b\nrename from vllm/a\nrename to vllm/b\n"
            b"--- a/vllm/a\n+++ b/vllm/c\n@@ -1 +1 @@\n-x\n+y\n",
            "disagree with the rename",
        ),
        (
            b"--- a/vllm/f.py\n+++ b/vllm/f.py\n@@ -5,1 +5,1 @@\n-x\n+y\n@@ -3,1 +3,1 @@\n-x\n+y\n",
            "inside or before hunk 1",
        ),
    ],
)
def test_malformed_patches_raise_overlay_error(data: bytes, fragment: str) -> None:
    problems = parse_problems(data)
    assert any(fragment in p for p in problems), problems
    assert all(p.startswith("line ") or p.startswith("no file") for p in problems)


def test_parse_collects_every_bad_hunk() -> None:
    data = modify(
        "vllm/f.py",
        b"@@ -1,3 +1,3 @@\n a\n-b\n+B\n"  # one context line short
        b"@@ -10,2 +10,2 @@\n j\n-k\n+K\n l\n m\n"  # two lines too many
        b"@@ -20,3 +20,3 @@\n t\n-u\n+U\n",  # the patch ends inside the hunk
    )
    problems = parse_problems(data)
    assert len(problems) == 3, problems
    assert [p.split(":")[0] for p in problems] == ["line 7", "line 11", "line 13"]


def test_parse_rejects_non_bytes_and_negative_strip() -> None:
    with pytest.raises(OverlayError):
        Patch.parse("--- a/x\n", strip=1)  # type: ignore[arg-type]
    with pytest.raises(OverlayError):
        Patch.parse(CHANGE_10, strip=-1)


# --------------------------------------------------------------------------------------------------------
# Applying one file


def test_exact_apply() -> None:
    applied = apply_file(one(CHANGE_10), BASE)
    assert applied == AppliedFile("vllm/f.py", BASE.replace(b"line 10\n", b"ten\n"), (0,))


@pytest.mark.parametrize("shift", [2, -3])
def test_offset_is_found_and_reported(shift: int) -> None:
    lines = BASE.splitlines(keepends=True)
    shifted = b"".join([b"new\n"] * shift + lines) if shift > 0 else b"".join(lines[-shift:])
    applied = apply_file(one(CHANGE_10), shifted)
    assert applied.offsets == (shift,)
    assert applied.content == shifted.replace(b"line 10\n", b"ten\n")


def test_nearest_match_wins_and_ties_go_forward() -> None:
    # "x" appears at lines 3 and 7; a context-free hunk declared at line 5 is equally near both.
    original = b"a\nb\nx\nc\nd\ne\nx\nf\n"
    fp = one(modify("vllm/f.py", b"@@ -5 +5 @@\n-x\n+y\n"))
    assert apply_file(fp, original).offsets == (2,)
    fp = one(modify("vllm/f.py", b"@@ -4 +4 @@\n-x\n+y\n"))
    assert apply_file(fp, original).offsets == (-1,)


def test_context_mismatch_refused_without_fuzz() -> None:
    # Only one of six context lines differs: a fuzzy tool would apply this; it must be refused.
    changed = BASE.replace(b"line 12\n", b"line twelve\n")
    with pytest.raises(OverlayError) as info:
        apply_file(one(CHANGE_10), changed)
    message = str(info.value)
    assert message.startswith("vllm/f.py: hunk 1 at line 7: no exact match")
    assert "line 12: expected context line b'line 12\\n', found b'line twelve\\n'" in message
    assert info.value.hint == APPLY_HINT


def test_removed_line_mismatch_names_it() -> None:
    with pytest.raises(OverlayError, match=r"expected removed line b'line 10\\n', found b'line X\\n'"):
        apply_file(one(CHANGE_10), BASE.replace(b"line 10\n", b"line X\n"))


def test_every_failing_hunk_reported() -> None:
    body = b"".join(
        b"@@ -%d,3 +%d,3 @@\n line %d\n-line %d\n+x\n line %d\n" % (n, n, n, n + 1, n + 2) for n in (2, 8, 14)
    )
    fp = one(modify("vllm/f.py", body))
    assert apply_file(fp, BASE).offsets == (0, 0, 0)
    with pytest.raises(OverlayError) as info:
        apply_file(fp, BASE.replace(b"line", b"LINE"))
    assert [p.split(": no exact")[0] for p in info.value.problems] == [
        "vllm/f.py: hunk 1 at line 2",
        "vllm/f.py: hunk 2 at line 8",
        "vllm/f.py: hunk 3 at line 14",
    ]


def test_hunk_cut_short_at_file_start_must_apply_there() -> None:
    # One line of leading context and three trailing: the hunk was made at the start of the file.
    fp = one(modify("vllm/f.py", b"@@ -1,5 +1,5 @@\n line 1\n-line 2\n+two\n line 3\n line 4\n line 5\n"))
    assert apply_file(fp, BASE).content == BASE.replace(b"line 2\n", b"two\n")
    with pytest.raises(OverlayError, match="may only apply at the start"):
        apply_file(fp, b"header\n" + BASE)


def test_hunk_cut_short_at_file_end_must_apply_there() -> None:
    fp = one(modify("vllm/f.py", b"@@ -17,4 +17,4 @@\n line 17\n line 18\n line 19\n-line 20\n+twenty\n"))
    assert apply_file(fp, BASE).content == BASE.replace(b"line 20\n", b"twenty\n")
    with pytest.raises(OverlayError, match="may only apply at the end"):
        apply_file(fp, BASE + b"footer\n")


def test_hunks_must_not_overlap_when_searched() -> None:
    # Both hunks match only at line 2: the second would have to reuse lines the first consumed.
    original = b"a\nx\nb\n"
    fp = one(modify("vllm/f.py", b"@@ -2 +2 @@\n-x\n+y\n@@ -3 +3 @@\n-x\n+z\n"))
    with pytest.raises(OverlayError, match="hunk 2 at line 3: no exact match"):
        apply_file(fp, original)


def test_no_newline_at_end_of_file_both_sides() -> None:
    marker = b"\\ No newline at end of file\n"
    add_newline = one(modify("vllm/f.py", b"@@ -1,2 +1,2 @@\n a\n-b\n" + marker + b"+b\n"))
    assert apply_file(add_newline, b"a\nb").content == b"a\nb\n"
    with pytest.raises(OverlayError, match=r"expected removed line b'b', found b'b\\n'"):
        apply_file(add_newline, b"a\nb\n")
    drop_newline = add_newline.reversed()
    assert apply_file(drop_newline, b"a\nb\n").content == b"a\nb"
    both = one(modify("vllm/f.py", b"@@ -1,2 +1,2 @@\n a\n-b\n" + marker + b"+c\n" + marker))
    assert both.hunks[0].lines[-1] == HunkLine("+", b"c")
    assert apply_file(both, b"a\nb").content == b"a\nc"


def test_no_newline_line_must_stay_last() -> None:
    # A context-free hunk whose new last line has no newline, applied where more lines follow.
    fp = one(modify("vllm/f.py", b"@@ -1 +1 @@\n-a\n+b\n\\ No newline at end of file\n"))
    with pytest.raises(OverlayError, match="not the last line of the result"):
        apply_file(fp, b"a\nc\n")


def test_crlf_lines_kept_exactly() -> None:
    original = b"a\r\nb\r\nc\r\n"
    fp = one(modify("vllm/f.py", b"@@ -1,3 +1,3 @@\n a\r\n-b\r\n+B\r\n c\r\n"))
    assert fp.hunks[0].lines[0].text == b"a\r\n"
    assert apply_file(fp, original).content == b"a\r\nB\r\nc\r\n"
    with pytest.raises(OverlayError, match=r"expected context line b'a\\r\\n', found b'a\\n'"):
        apply_file(fp, original.replace(b"\r\n", b"\n"))


def test_empty_line_in_hunk_is_empty_context() -> None:
    fp = one(modify("vllm/f.py", b"@@ -1,3 +1,3 @@\n a\n\n-b\n+c\n"))
    assert fp.hunks[0].lines[1] == HunkLine(" ", b"\n")
    assert apply_file(fp, b"a\n\nb\n").content == b"a\n\nc\n"


def test_create_over_existing_refused() -> None:
    fp = one(b"--- /dev/null\n+++ b/vllm/n.py\n@@ -0,0 +1 @@\n+x\n")
    assert apply_file(fp, None) == AppliedFile("vllm/n.py", b"x\n", (0,))
    with pytest.raises(OverlayError, match=r"vllm/n\.py: cannot create: the file already exists"):
        apply_file(fp, b"")


def test_delete_requires_exact_content() -> None:
    fp = one(b"--- a/vllm/o.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n")
    assert apply_file(fp, b"a\nb\n") == AppliedFile("vllm/o.py", None, (0,))
    with pytest.raises(OverlayError, match=r"hunk 1 at line 1: cannot delete: line 2: expected removed"):
        apply_file(fp, b"a\nB\n")
    with pytest.raises(OverlayError, match=r"1 more line\(s\) than the patch removes, from line 3: b'c\\n'"):
        apply_file(fp, b"a\nb\nc\n")
    with pytest.raises(OverlayError, match="cannot delete: the file does not exist"):
        apply_file(fp, None)


def test_modify_absent_file_refused() -> None:
    with pytest.raises(OverlayError, match=r"vllm/f\.py: cannot modify: the file does not exist"):
        apply_file(one(CHANGE_10), None)


# --------------------------------------------------------------------------------------------------------
# Paths


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        ("/etc/passwd", "is an absolute path"),
        ("../x", "has a '..' component"),
        ("vllm/../../x", "has a '..' component"),
        ("other/x", "is outside package 'vllm'"),
        ("vllm\\x.py", "contains a backslash"),
        ("vllm/a\x00b", "contains a NUL"),
        ("vllm//x.py", "has an empty component"),
        ("vllm/x/", "has an empty component"),
        ("vllm/./x.py", "has a '.' component"),
        ("vllm", "names the package directory itself"),
        ("", "empty path"),
    ],
)
def test_check_path_refuses(path: str, fragment: str) -> None:
    problems = check_path(path, "vllm")
    assert any(fragment in p for p in problems), problems


def test_check_path_accepts_package_files() -> None:
    assert check_path("vllm/v1/core/sched/scheduler.py", "vllm") == []
    assert check_path("vllm/x.py", "not-an-import") == ["package 'not-an-import' is not an import name"]


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"a/../x", "has a '..' component"),
        (b"a/vllm/../../x", "has a '..' component"),
        (b"a/other/x", "is outside package 'vllm'"),
        (b"a/vllm\\x.py", "contains a backslash"),
        (b'"a/vllm/\\000x"', "contains a NUL"),
    ],
)
def test_path_escapes_in_patches_refused(raw: bytes, fragment: str) -> None:
    patch = Patch.parse(b"--- /dev/null\n+++ " + raw + b"\n@@ -0,0 +1 @@\n+x\n")
    with pytest.raises(OverlayError) as info:
        apply_patch(patch, reader({}), "vllm")
    assert any(fragment in p for p in info.value.problems), info.value.problems
    with pytest.raises(OverlayError):
        validate_paths(patch, "vllm")


def test_absolute_path_refused_before_strip() -> None:
    # -p1 would silently turn /etc/passwd into etc/passwd; the parser refuses it first.
    problems = parse_problems(b"--- /dev/null\n+++ /etc/passwd\n@@ -0,0 +1 @@\n+root::0:0::/:/bin/sh\n")
    assert problems == ("line 2: absolute path '/etc/passwd' refused (overlay paths are package-relative)",)


def test_validate_paths_collects_every_file() -> None:
    patch = Patch(
        (
            FilePatch(None, "other/a.py", ()),
            FilePatch("vllm/ok.py", "vllm/../b.py", ()),
        )
    )
    with pytest.raises(OverlayError) as info:
        validate_paths(patch, "vllm")
    assert [p.split(":")[0] for p in info.value.problems] == ["file 1", "file 2"]


# --------------------------------------------------------------------------------------------------------
# Applying patches and overlays


def test_apply_patch_rename_gives_two_entries() -> None:
    patch = Patch.parse(
        b"diff --git a/vllm/a.py b/vllm/b.py\nrename from vllm/a.py\nrename to vllm/b.py\n"
        b"--- a/vllm/a.py\n+++ b/vllm/b.py\n@@ -1 +1 @@\n-x\n+y\n"
    )
    result = apply_patch(patch, reader({"vllm/a.py": b"x\n"}), "vllm")
    assert result == (AppliedFile("vllm/a.py", None, ()), AppliedFile("vllm/b.py", b"y\n", (0,)))
    with pytest.raises(OverlayError, match=r"cannot rename: the target 'vllm/b\.py' already exists"):
        apply_patch(patch, reader({"vllm/a.py": b"x\n", "vllm/b.py": b""}), "vllm")
    back = apply_patch(patch.reversed(), reader({"vllm/b.py": b"y\n"}), "vllm")
    assert back == (AppliedFile("vllm/b.py", None, ()), AppliedFile("vllm/a.py", b"x\n", (0,)))


def test_apply_patch_same_file_twice_uses_updated_state() -> None:
    first = modify("vllm/f.py", b"@@ -1 +1 @@\n-a\n+b\n")
    second = modify("vllm/f.py", b"@@ -1 +1 @@\n-b\n+c\n")
    result = apply_patch(Patch.parse(first + second), reader({"vllm/f.py": b"a\n"}), "vllm")
    assert [r.content for r in result] == [b"b\n", b"c\n"]


def test_apply_patch_create_then_modify_and_delete_then_create() -> None:
    data = (
        b"--- /dev/null\n+++ b/vllm/n.py\n@@ -0,0 +1 @@\n+a\n"
        + modify("vllm/n.py", b"@@ -1 +1,2 @@\n a\n+b\n")
        + b"--- a/vllm/o.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-o\n"
        + b"--- /dev/null\n+++ b/vllm/o.py\n@@ -0,0 +1 @@\n+p\n"
    )
    result = apply_patch(Patch.parse(data), reader({"vllm/o.py": b"o\n"}), "vllm")
    assert [(r.path, r.content) for r in result] == [
        ("vllm/n.py", b"a\n"),
        ("vllm/n.py", b"a\nb\n"),
        ("vllm/o.py", None),
        ("vllm/o.py", b"p\n"),
    ]


def test_apply_patch_errors_name_path_hunk_and_line() -> None:
    data = modify("vllm/f.py", b"@@ -2 +2 @@\n-b\n+B\n@@ -41 +41 @@\n-zz\n+ZZ\n") + modify(
        "vllm/g.py", b"@@ -1 +1 @@\n-q\n+r\n"
    )
    files = {"vllm/f.py": b"a\nb\nc\n", "vllm/g.py": b"x\n"}
    with pytest.raises(OverlayError) as info:
        apply_patch(Patch.parse(data), reader(files), "vllm")
    assert info.value.message == "the patch does not apply exactly (2 problem(s))"
    assert info.value.problems[0].startswith("vllm/f.py: hunk 2 at line 41: no exact match")
    assert info.value.problems[1].startswith("vllm/g.py: hunk 1 at line 1: no exact match")


def test_apply_patch_skips_later_changes_to_a_failed_file() -> None:
    data = modify("vllm/f.py", b"@@ -1 +1 @@\n-x\n+y\n") + modify("vllm/f.py", b"@@ -1 +1 @@\n-y\n+z\n")
    with pytest.raises(OverlayError) as info:
        apply_patch(Patch.parse(data), reader({"vllm/f.py": b"a\n"}), "vllm")
    assert "not attempted: an earlier change to this file failed" in info.value.problems[1]


def test_two_overlays_on_one_file_applied_sequentially() -> None:
    first = Patch.parse(CHANGE_10)
    # Made against the output of the first overlay: its context includes "ten".
    second = Patch.parse(modify("vllm/f.py", b"@@ -9,3 +9,3 @@\n line 9\n-ten\n+TEN\n line 11\n"))
    files = {"vllm/f.py": BASE}
    after_first = {a.path: a.content for a in apply_patch(first, reader(files), "vllm")}
    threaded = apply_patch(second, lambda p: after_first[p] if p in after_first else files.get(p), "vllm")
    expected = BASE.replace(b"line 10\n", b"TEN\n")
    assert threaded[-1].content == expected
    with pytest.raises(OverlayError):  # on its own, the second overlay does not fit the base
        apply_patch(second, reader(files), "vllm")
    changes = apply_overlays([("one", first), ("two", second)], reader(files), lambda _: "vllm")
    assert changes == {"vllm/f.py": expected}


def test_apply_overlays_names_the_failing_overlay() -> None:
    bad = Patch.parse(modify("vllm/f.py", b"@@ -1 +1 @@\n-nope\n+x\n"))
    with pytest.raises(OverlayError, match=r"^overlay broken: the patch does not apply") as info:
        apply_overlays([("broken", bad)], reader({"vllm/f.py": BASE}), lambda _: "vllm")
    assert info.value.hint == APPLY_HINT


def test_reversed_swaps_everything() -> None:
    create = Patch.parse(b"--- /dev/null\n+++ b/vllm/n.py\n@@ -0,0 +1,2 @@\n+a\n+b\n")
    (delete,) = create.reversed().files
    assert (delete.kind, delete.path) == ("delete", "vllm/n.py")
    assert delete.hunks[0] == Hunk(1, 2, 0, 0, (HunkLine("-", b"a\n"), HunkLine("-", b"b\n")))
    assert create.reversed().reversed() == create
    assert apply_file(delete, b"a\nb\n").content is None


# --------------------------------------------------------------------------------------------------------
# Properties

_BODIES = st.sampled_from([b"a", b"b", b"c", b"", b"  d", b"x\r", b"\xff"])


@st.composite
def _texts(draw: st.DrawFn) -> list[bytes]:
    lines = [body + b"\n" for body in draw(st.lists(_BODIES, max_size=14))]
    if lines and lines[-1] != b"\n" and draw(st.booleans()):
        lines[-1] = lines[-1][:-1]  # no newline at end of file (an empty last line cannot lack one)
    return lines


def _udiff(a: list[bytes], b: list[bytes], context: int) -> bytes:
    """A patch from difflib, with the "\\ No newline" marker difflib leaves out."""
    out = []
    for line in difflib.diff_bytes(difflib.unified_diff, a, b, b"a/pkg/f.py", b"b/pkg/f.py", n=context):
        out.append(line if line.endswith(b"\n") else line + b"\n\\ No newline at end of file\n")
    return b"".join(out)


@settings(max_examples=300, deadline=None)
@given(_texts(), _texts(), st.integers(min_value=0, max_value=3))
def test_difflib_patches_apply_and_reverse(a: list[bytes], b: list[bytes], context: int) -> None:
    assume(a != b)
    patch = Patch.parse(_udiff(a, b, context))
    old, new = b"".join(a), b"".join(b)
    (forward,) = apply_patch(patch, reader({"pkg/f.py": old}), "pkg")
    assert forward.content == new
    assert set(forward.offsets) <= {0}
    (backward,) = apply_patch(patch.reversed(), reader({"pkg/f.py": new}), "pkg")
    assert backward.content == old
    assert patch.reversed().reversed() == patch


_FRAGMENTS = st.sampled_from(
    [
        b"diff --git a/pkg/f b/pkg/f\n",
        b"--- a/pkg/f\n",
        b"+++ b/pkg/f\n",
        b"--- /dev/null\n",
        b"+++ /dev/null\n",
        b"@@ -1,2 +1,2 @@\n",
        b"@@ -0,0 +1 @@\n",
        b"@@ -1 +0,0 @@\n",
        b"@@ -3 +3,0 @@ f\n",
        b" ctx\n",
        b"-old\n",
        b"+new\n",
        b"\\ No newline at end of file\n",
        b"\n",
        b"new file mode 100644\n",
        b"deleted file mode 100644\n",
        b"rename from pkg/f\n",
        b"rename to pkg/g\n",
        b"GIT binary patch\n",
        b'--- "a/\\377"\n',
        b"-- \n",
        b"\r\n",
    ]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=300), st.lists(_FRAGMENTS, max_size=20).map(b"".join)))
def test_parse_never_raises_anything_else(data: bytes) -> None:
    try:
        patch = Patch.parse(data)
    except OverlayError:
        return
    assert patch.files
    with contextlib.suppress(OverlayError):
        apply_patch(patch, reader({"pkg/f": b"old\nctx\n", "pkg/g": b"x\n"}), "pkg")


_COMPONENTS = st.sampled_from(["pkg", "other", "..", ".", "", "a.py", "b\\c", "x"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_COMPONENTS, min_size=1, max_size=5), st.lists(_COMPONENTS, min_size=1, max_size=5))
def test_applied_paths_never_leave_the_package(old: list[str], new: list[str]) -> None:
    old_path, new_path = "/".join(old), "/".join(new)
    create = b"--- /dev/null\n+++ b/%s\n@@ -0,0 +1 @@\n+x\n" % new_path.encode()
    rename = b"diff --git a/%s b/%s\nrename from %s\nrename to %s\n" % (
        old_path.encode(),
        new_path.encode(),
        old_path.encode(),
        new_path.encode(),
    )
    files = {"pkg/" + "/".join(old[1:]): b"x\n"} if old[0] == "pkg" else {}
    for data in (create, rename):
        try:
            applied = apply_patch(Patch.parse(data), reader(files), "pkg")
        except OverlayError:
            continue
        for item in applied:
            assert item.path.startswith("pkg/")
            assert posixpath.normpath(item.path) == item.path
            assert check_path(item.path, "pkg") == []
