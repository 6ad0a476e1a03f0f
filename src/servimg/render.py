"""Console output: `OK:`/`FAIL:` lines per target, progress to stderr, `--json` results to stdout, and the
one table every verdict is drawn as (`findings_table`: verify, check, promote, witness, ladder)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.core.findings import Findings, Status
from servimg.core.lazy import LazyModule
from servimg.invocation.outcome import Outcome

if TYPE_CHECKING:
    from rich import console as rich_console
    from rich import progress as rich_progress
    from rich import table as rich_table
    from rich import text as rich_text
else:  # rich (≈0.05 s) is imported at the first table or line it draws: a --json --quiet run never is
    rich_console = LazyModule("rich.console")
    rich_progress = LazyModule("rich.progress")
    rich_table = LazyModule("rich.table")
    rich_text = LazyModule("rich.text")

_STYLE = {
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.ERROR: "bold magenta",
    Status.NOT_EXERCISED: "bold yellow",
}


def findings_table(findings: Findings, width: int = 150) -> str:
    """Any verdict as text: its notes (what it ran under), one row per finding (status, code, subject,
    message; a not-passing finding's hint as `fix:`), and the counts with the verdict."""
    cells = []
    for finding in findings.findings:
        message = finding.message
        if finding.hint and finding.status != Status.PASS:
            message += f"\nfix: {finding.hint}"
        cells.append((str(finding.status), finding.code, finding.subject, message))
    # Rows wrap between words, never inside a path or a digest: the table is made wide enough for the
    # first three columns whole and the message column's longest word (a wider table, rather than a
    # digest no one can copy).
    names = ("status", "code", "subject", "message")
    whole = [
        max([len(line) for row in cells for line in row[i].splitlines()] + [len(names[i])]) for i in range(3)
    ]
    word = max([len(w) for row in cells for w in row[3].split()] + [len(names[3])])
    table = rich_table.Table(title=findings.title(), title_justify="left")
    for name in names:
        table.add_column(name, overflow="fold")
    for status, code, subject, message in cells:
        style = _STYLE.get(Status(status), "")
        table.add_row(f"[{style}]{status}[/]", code, subject, message)
    buffer = io.StringIO()
    width = max(width, sum(whole) + word + 3 * len(names) + 1)
    console = rich_console.Console(file=buffer, width=width, color_system=None, highlight=False)
    for note in findings.notes():
        console.print(note, markup=False)
    console.print(table)
    counts = ", ".join(f"{n} {status}" for status, n in findings.counts().items())
    console.print(
        f"{counts} → OK" if findings.ok else f"{counts} → NOT OK ({findings.verdict})", markup=False
    )
    return buffer.getvalue()


@dataclass
class Reporter:
    """Progress on stderr, results on stdout. On a terminal, the step in progress (the last log line: a base
    build's step, a ladder arm, a server coming up) stays on a live line with a spinner and the time spent
    in it, so a minutes-long step is visibly alive; in a log file the lines are just printed."""

    quiet: bool = False
    as_json: bool = False
    _err: rich_console.Console | None = field(default=None, init=False, repr=False)
    _activity: rich_progress.Progress | None = field(default=None, init=False, repr=False)
    _step: rich_progress.TaskID | None = field(default=None, init=False, repr=False)

    @property
    def err(self) -> rich_console.Console:
        """stderr as rich draws it, made at the first line printed there."""
        if self._err is None:
            self._err = rich_console.Console(stderr=True, highlight=False)
        return self._err

    def log(self, message: str) -> None:
        if self.quiet or self.as_json:
            return
        # A log line is text, never markup, and never wrapped: a path or digest stays on its line.
        self.err.print(rich_text.Text.assemble(("…", "dim"), " ", message), soft_wrap=True)
        if self.err.is_terminal and not message.startswith(" "):  # indented lines are details of a step
            self._show_step(message)

    def _show_step(self, message: str) -> None:
        if self._activity is None:
            columns = (
                rich_progress.SpinnerColumn(),
                rich_progress.TextColumn("{task.description}", markup=False),
                rich_progress.TimeElapsedColumn(),
            )
            self._activity = rich_progress.Progress(*columns, console=self.err, transient=True)
            self._activity.start()
        if self._step is not None:
            self._activity.remove_task(self._step)
        width = max(20, self.err.width - 20)
        self._step = self._activity.add_task(message[:width], total=None)

    def settle(self) -> None:
        """End the live step line (before results, a transfer bar, or the exit)."""
        if self._activity is not None:
            self._activity.stop()
        self._activity, self._step = None, None

    @contextlib.contextmanager
    def transfer(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        """A byte progress bar on stderr for one transfer (nothing under --quiet or --json)."""
        if self.quiet or self.as_json or total <= 0:
            yield lambda n: None
            return
        self.settle()  # rich shows one live display at a time
        columns = (
            rich_progress.TextColumn("{task.description}"),
            rich_progress.BarColumn(),
            rich_progress.DownloadColumn(),
            rich_progress.TransferSpeedColumn(),
        )
        with rich_progress.Progress(*columns, console=self.err, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task, n)

    def ok(self, target: str, details: Mapping[str, object]) -> None:
        """The OK line (a digest in `details` is printed as its text, `sha256:<hex>`, in both forms)."""
        self.settle()
        if self.as_json:
            line = json.dumps({"status": "OK", "target": target, **details}, sort_keys=True, default=_as_text)
            sys.stdout.write(line + "\n")
            return
        print(f"OK: {target}")
        for line in human_lines(details, "  "):
            print(line)

    def fail(self, target: str, error: ServimgError) -> None:
        self.settle()
        if self.as_json:
            sys.stdout.write(
                json.dumps({"status": "FAIL", "target": target, **error.as_dict()}, sort_keys=True) + "\n"
            )
            return
        print(f"FAIL: {target}: {error}")
        if error.diagnostics():
            print(f"  hint: {error.diagnostics()}")

    def outcome(self, outcome: Outcome) -> bool:
        """One target's outcome: in text, its table and explanation (not under --quiet) and its document,
        then the OK or FAIL line; under --json, the line only. True when it failed."""
        self.settle()
        if not self.as_json:
            if not self.quiet and outcome.findings is not None:
                print(findings_table(outcome.findings))
            if not self.quiet and outcome.explanation:
                print(outcome.explanation)
            if outcome.document:
                print(outcome.document, end="")
        if outcome.error is not None:
            self.fail(outcome.target, outcome.error)
            return True
        if not outcome.quiet_ok:
            fields = outcome.json if self.as_json and outcome.json is not None else outcome.fields
            self.ok(outcome.target, fields)
        return False


def human_lines(fields: Mapping[str, object], indent: str) -> Iterator[str]:
    """Fields as a person reads them, never as Python writes them: a mapping as indented `key: value`
    lines, a list of plain values on one line (`a, b`), a list of mappings as `-` items, booleans as
    yes/no, None as `none`, a digest as its text. A value is never wrapped: a path or a digest stays on
    one line (tests/test_output.py renders every command's output and refuses a repr)."""
    for key, value in fields.items():
        if isinstance(value, Mapping):
            if not value:
                yield f"{indent}{key}: none"
                continue
            yield f"{indent}{key}:"
            yield from human_lines(value, indent + "  ")
        elif isinstance(value, list | tuple) and any(isinstance(v, Mapping) for v in value):
            yield f"{indent}{key}:"
            for item in value:
                if isinstance(item, Mapping):
                    lines = list(human_lines(item, indent + "    "))
                    yield f"{indent}  - {lines[0].lstrip()}" if lines else f"{indent}  -"
                    yield from lines[1:]
                else:
                    yield f"{indent}  - {_plain(item)}"
        elif isinstance(value, list | tuple | set | frozenset):
            yield f"{indent}{key}: {', '.join(_plain(v) for v in value) or 'none'}"
        else:
            yield f"{indent}{key}: {_plain(value)}"


def _plain(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "none"
    if isinstance(value, list | tuple | set | frozenset | Mapping):
        return json.dumps(value, sort_keys=True, default=_as_text)  # nested deeper than a line: JSON
    return str(value)


def _as_text(value: object) -> str:
    """JSON for the values a command's fields may hold beyond JSON's own: a `Digest` as its text."""
    if isinstance(value, Digest):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
