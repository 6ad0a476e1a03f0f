"""What every command runs with (`Context`, the build's: `servimg.assembly.context`), and the run of a
parsed command with it: this host asked once (`probe_host`), the seams the arguments ask for on top of
its defaults (or a caller's), the blob store, the command's outcomes (`servimg.invocation.session` runs
every parsed command through it)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator

from servimg.assembly.context import Context as Context
from servimg.assembly.defaults import FromRef, default_seams, probe_host
from servimg.assembly.seams import Seams
from servimg.invocation.outcome import Outcome
from servimg.oci.store import BlobStore
from servimg.render import Reporter

Run = Callable[[argparse.Namespace, Context], Iterator[Outcome]]


def seams_from(args: argparse.Namespace, given: Seams) -> Seams:
    """The build's seams as the arguments ask: `given` (the defaults, or a caller's), with the base read
    from `--base-from` when that is set."""
    base_from = getattr(args, "base_from", None)
    return dataclasses.replace(given, base_source=FromRef(base_from)) if base_from else given


def outcomes(args: argparse.Namespace, seams: Seams | None, reporter: Reporter) -> Iterator[Outcome]:
    """The parsed command (`args.run`) run with its context: one outcome per target, as each finishes."""
    chosen = seams_from(args, seams or default_seams(probe_host()))
    context = Context(BlobStore(args.cache, tap=chosen.store_tap), reporter.log, reporter, seams=chosen)
    run: Run = args.run
    return run(args, context)
