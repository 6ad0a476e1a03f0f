"""Console output: `OK:`/`FAIL:` lines per target, progress to stderr, `--json` results to stdout."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, TextColumn, TransferSpeedColumn
from rich.progress import Progress as RichProgress

from servimg.core.errors import ServimgError


@dataclass
class Reporter:
    quiet: bool = False
    as_json: bool = False
    err: Console = field(default_factory=lambda: Console(stderr=True, highlight=False))

    def log(self, message: str) -> None:
        if not self.quiet and not self.as_json:
            self.err.print(f"[dim]…[/dim] {message}")

    @contextlib.contextmanager
    def transfer(self, description: str, total: int) -> Iterator[Callable[[int], None]]:
        """A byte progress bar on stderr for one transfer (nothing under --quiet or --json)."""
        if self.quiet or self.as_json or total <= 0:
            yield lambda n: None
            return
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with RichProgress(*columns, console=self.err, transient=True) as bar:
            task = bar.add_task(description, total=total)
            yield lambda n: bar.advance(task, n)

    def ok(self, target: str, details: dict[str, Any]) -> None:
        if self.as_json:
            sys.stdout.write(json.dumps({"status": "OK", "target": target, **details}, sort_keys=True) + "\n")
            return
        print(f"OK: {target}")
        for key, value in details.items():
            print(f"  {key}: {value}")

    def fail(self, target: str, error: ServimgError) -> None:
        if self.as_json:
            sys.stdout.write(
                json.dumps({"status": "FAIL", "target": target, **error.as_dict()}, sort_keys=True) + "\n"
            )
            return
        print(f"FAIL: {target}: {error}")
        if error.diagnostics():
            print(f"  hint: {error.diagnostics()}")
