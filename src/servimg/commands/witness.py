"""`servimg witness collect`: a container's witness files, judged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt
from servimg.ladder import witness as witnesses


def witness_collect(p: params.WitnessCollect, ctx: Context) -> Iterator[Outcome]:
    """Copy each container's witness files out; FAIL unless a process ran, and only ran, patched code."""
    for container in p.containers:

        def run(container: str = container) -> Outcome:
            collected = witnesses.collect(container, p.out or Path("witness") / container)
            return Outcome(
                container, collected.as_dict(), findings=collected.verdict(), error=collected.error()
            )

        yield attempt(container, run)
