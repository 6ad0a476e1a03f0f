"""One run of one command, as `servimg.cli.main` starts it once the arguments are parsed: the seams the
arguments ask for, the reporter, the context, the outcomes rendered, the exit status."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Iterator

from servimg.build.seams import FromRef, Seams
from servimg.commands.outcome import Context, Outcome
from servimg.oci.store import BlobStore
from servimg.render import Reporter

Run = Callable[[argparse.Namespace, Context], Iterator[Outcome]]


def seams_from(args: argparse.Namespace, given: Seams) -> Seams:
    """The build's seams as the arguments ask: `given` (the defaults, or a caller's), with the base read
    from `--base-from` when that is set."""
    base_from = getattr(args, "base_from", None)
    return dataclasses.replace(given, base_source=FromRef(base_from)) if base_from else given


def execute(args: argparse.Namespace, seams: Seams | None = None) -> int:
    """Run the parsed command (`args.run`): one OK/FAIL per outcome; 1 when any failed, 130 on Ctrl-C."""
    reporter = Reporter(quiet=args.quiet, as_json=args.json)
    chosen = seams_from(args, seams or Seams())
    context = Context(BlobStore(args.cache, tap=chosen.store_tap), reporter.log, reporter, chosen)
    run: Run = args.run
    failures = 0
    try:
        for outcome in run(args, context):
            failures += reporter.outcome(outcome)
    except KeyboardInterrupt:
        reporter.settle()
        print("FAIL: interrupted; nothing was published", file=sys.stderr)
        return 130
    finally:
        reporter.settle()
    return 1 if failures else 0
