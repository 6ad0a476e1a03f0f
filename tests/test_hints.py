"""Every hint names only commands and flags that exist (issue 40: "start it, or check `--to`" on commands
without --to; "pass python=", a library argument). The hints are collected from the source (every
`hint=` argument and every module-level `*HINT*` constant, f-strings with their literal parts) and checked
against the CLI's own parser: a `servimg WORDS` must be a command, a `--flag` after it one of that
command's flags, and a bare `--flag` one of some command's.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from pathlib import Path

from servimg import cli

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "servimg"

# Flags of other programs that hints quote, with the program (checked: never a servimg flag by mistake).
FOREIGN_FLAGS = {
    "--no-trunc": "docker images",
    "--rm": "docker run",
    "--network": "docker run",
    "--entrypoint": "docker run",
    "--sparse": "tar",
    "--list-secret-keys": "gpg",
    "--raw": "skopeo inspect",
    "--show-slots": "softhsm2-util",
}


def _literal(node: ast.AST) -> str | None:
    """A hint's text: a string, an f-string's literal parts (each value as `{}`), or a concatenation."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left), _literal(node.right)
        return None if left is None or right is None else left + right
    return None


def hints() -> Iterator[tuple[str, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            is_hint = isinstance(node, ast.keyword) and node.arg == "hint"
            is_constant = isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and "HINT" in t.id.upper() for t in node.targets
            )
            value = (
                node.value
                if isinstance(node, ast.keyword | ast.Assign) and (is_hint or is_constant)
                else None
            )
            text = _literal(value) if value is not None else None
            if text:
                yield f"{path.relative_to(PACKAGE)}:{getattr(value, 'lineno', 0)}", text


def commands() -> dict[tuple[str, ...], set[str]]:
    """Every command's words and its option strings, read from the parser itself."""
    found: dict[tuple[str, ...], set[str]] = {}

    def walk(p: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[words] = {s for a in p._actions for s in a.option_strings}
        for action in subs:
            for name, child in action.choices.items():
                walk(child, (*words, name))

    walk(cli.parser(), ())
    return found


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SERVIMG = re.compile(r"\bservimg((?: [a-z][a-z-]*)+)")


def problems(where: str, text: str, known: dict[tuple[str, ...], set[str]]) -> Iterator[str]:
    every_flag = set().union(*known.values())
    claimed: set[int] = set()
    for match in SERVIMG.finditer(text):
        words = tuple(match.group(1).split())
        command = next((words[:n] for n in range(len(words), 0, -1) if words[:n] in known), None)
        quoted = text[: match.start()].endswith("`")  # `servimg …` in backticks: meant as a command line
        if command is None:
            if quoted and words[0] not in {c[0] for c in known}:  # not even a command group
                yield f"{where}: `servimg {' '.join(words)}` is no command: {text!r}"
            continue  # prose ("servimg patches one copy"), or a group named without its subcommand
        start = match.start() + len("servimg ") + len(" ".join(command))
        segment = re.split(r"[`;()]|, or |\bor\b", text[start:])[0]
        for flag in FLAG.finditer(segment):
            claimed.add(start + flag.start())
            if flag.group() not in known[command]:
                yield f"{where}: `servimg {' '.join(command)}` has no {flag.group()}: {text!r}"
    for flag in FLAG.finditer(text):
        if flag.start() in claimed or flag.group() in FOREIGN_FLAGS:
            continue
        if flag.group() not in every_flag:
            yield f"{where}: no command has {flag.group()}: {text!r}"


def test_every_hint_names_only_commands_and_flags_that_exist() -> None:
    known = commands()
    collected = list(hints())
    assert len(collected) > 200, "the collector finds the hints"
    found = [p for where, text in collected for p in problems(where, text, known)]
    assert not found, "\n".join(found)


def test_no_hint_names_a_library_argument_or_a_flag_the_command_lacks() -> None:
    """The two hints issue 40 found: `check --to` on commands without --to, `python=` from verify."""
    texts = [text for _, text in hints()]
    assert not [t for t in texts if "check `--to`" in t]
    assert not [t for t in texts if "python=" in t]


def test_the_checker_catches_what_it_looks_for() -> None:
    known = commands()
    assert list(problems("x", "run `servimg lock --to docker`", known))
    assert list(problems("x", "run `servimg frobnicate`", known))
    assert not list(problems("x", "servimg reads layers without unpacking them", known))
    assert list(problems("x", "pass --no-such-flag", known))
    assert not list(problems("x", "run `servimg build --to docker` or `servimg lock`", known))
    assert not list(problems("x", "`docker images --no-trunc` lists them", known))
