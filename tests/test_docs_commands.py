"""Docs that cannot drift: every `servimg …` command line in README.md and docs/*.md names a subcommand the
CLI has and only flags that subcommand takes, checked against the real argument parser (`servimg.cli`).

A command is taken from fenced code blocks (a line starting with `servimg `, continuation lines joined)
and from inline code spans (`` `servimg …` ``). Placeholders stay as they are written (`IMAGE`, `HOST/REPO`,
`[--digest D]`: brackets only mark an option as optional, its flag is checked), `a | b` alternatives keep
the first, and an ellipsis is dropped. Prose may name a command without its arguments (`servimg build`),
so missing positionals are not an error; an unknown subcommand or flag is.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from servimg import cli

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_STOP = {"&&", "||", ";", ">", ">>", "2>&1", "<"}


@dataclass(frozen=True)
class DocCommand:
    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def doc_commands(page: Path) -> Iterator[DocCommand]:
    lines = page.read_text().splitlines()
    fenced = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            fenced = not fenced
        elif fenced:
            text = line.strip().removeprefix("$ ")
            if text.startswith("servimg "):
                start = i
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1] + " " + lines[i].strip()
                yield DocCommand(page.name, start + 1, text)
        else:
            for match in re.finditer(r"`(servimg [^`]+)`", line):
                yield DocCommand(page.name, i + 1, match.group(1))
        i += 1


def argv_of(text: str) -> list[str]:
    """The words after `servimg`, as a reader would type them (see the module docstring)."""
    text = re.sub(r"\s+#.*$", "", text).replace("[", " ").replace("]", " ")
    argv: list[str] = []
    alternative = False
    for word in shlex.split(text)[1:]:
        if alternative:
            alternative = False
            continue
        if word == "|":
            alternative = True
            continue
        if word in SHELL_STOP:
            break
        if word.strip("…."):
            argv.append(word.split("|")[0] if not word.startswith("-") else word)
    return argv


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def problems_of(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """Unknown subcommand or flag in `argv` for `parser` (the CLI's own, or a variant of it)."""
    where, path = parser, ["servimg"]
    words = list(argv)
    while words and (choices := subparsers(where)):
        if words[0].startswith("-"):
            break
        name = words.pop(0)
        if name not in choices:
            return [f"`{' '.join(path)}` has no subcommand {name!r} (it has {', '.join(sorted(choices))})"]
        where, path = choices[name], [*path, name]
    if subparsers(where) and not words:
        return []  # a group named in prose (`servimg server`)
    known = where._option_string_actions
    return [
        f"`{' '.join(path)}` has no flag {flag}"
        for flag in (w.split("=", 1)[0] for w in words if w.startswith("-") and w != "-")
        if flag not in known
    ]


ALL = [c for page in PAGES for c in doc_commands(page)]


def test_the_pages_hold_commands() -> None:
    assert len(ALL) > 100, len(ALL)
    pages = {c.page for c in ALL}
    assert pages >= {"README.md", "policy.md", "ladder.md", "nix.md", "definition.md", "getting-started.md"}


@pytest.mark.parametrize("command", ALL, ids=str)
def test_every_documented_command_parses(command: DocCommand) -> None:
    assert problems_of(argv_of(command.text), cli.parser()) == [], str(command)


def test_a_flag_removed_from_the_parser_fails_the_docs_test() -> None:
    """The test can fail: the same documented commands against a parser without `check --deep`."""
    variant = cli.parser.__wrapped__()  # a fresh parser, not the cached one
    check = subparsers(variant)["check"]
    deep = check._option_string_actions.pop("--deep")
    check._remove_action(deep)
    using_deep = [c for c in ALL if "check" in argv_of(c.text)[:1] and "--deep" in argv_of(c.text)]
    assert using_deep, "README documents `servimg check … --deep`"
    for command in using_deep:
        assert problems_of(argv_of(command.text), variant) == ["`servimg check` has no flag --deep"]
        assert problems_of(argv_of(command.text), cli.parser()) == []
    assert problems_of(["no-such-command"], cli.parser()) != []
    assert problems_of(["verify", "IMAGE", "--no-such-flag"], cli.parser()) == [
        "`servimg verify` has no flag --no-such-flag"
    ]
