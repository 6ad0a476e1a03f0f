"""Console output: `OK:`/`FAIL:` lines per target, progress to stderr, `--json` results to stdout, and the
one table every verdict is drawn as (`findings_table`: verify, check, promote, witness, ladder)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.progress import Progress as RichProgress
from rich.table import Table
from rich.text import Text

from servimg.commands.outcome import Outcome
from servimg.core.errors import ServimgError
from servimg.core.findings import Findings, Status

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
    table = Table(title=findings.title(), title_justify="left")
    for column in ("status", "code", "subject", "message"):
        table.add_column(column, overflow="fold")
    for finding in findings.findings:
        message = finding.message
        if finding.hint and finding.status != Status.PASS:
            message += f"\nfix: {finding.hint}"
        style = _STYLE.get(finding.status, "")
        table.add_row(f"[{style}]{finding.status}[/]", finding.code, finding.subject, message)
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, color_system=None, highlight=False)
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
    err: Console = field(default_factory=lambda: Console(stderr=True, highlight=False))
    _activity: RichProgress | None = field(default=None, init=False, repr=False)
    _step: TaskID | None = field(default=None, init=False, repr=False)

    def log(self, message: str) -> None:
        if self.quiet or self.as_json:
            return
        self.err.print(Text.assemble(("…", "dim"), " ", message))  # a log line is text, never markup
        if self.err.is_terminal and not message.startswith(" "):  # indented lines are details of a step
            self._show_step(message)

    def _show_step(self, message: str) -> None:
        if self._activity is None:
            columns = (SpinnerColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn())
            self._activity = RichProgress(*columns, console=self.err, transient=True)
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
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with RichProgress(*columns, console=self.err, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task, n)

    def ok(self, target: str, details: Mapping[str, object]) -> None:
        self.settle()
        if self.as_json:
            sys.stdout.write(json.dumps({"status": "OK", "target": target, **details}, sort_keys=True) + "\n")
            return
        print(f"OK: {target}")
        for key, value in details.items():
            print(f"  {key}: {value}")

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
