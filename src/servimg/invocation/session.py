"""One run of one command, as `servimg.cli.main` starts it once the arguments are parsed: the reporter,
the outcomes rendered, the exit status (1 when any target failed, 130 on Ctrl-C). Every outcome is
computed by this run: nothing is replayed from an earlier one (issue 39)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from servimg.cache import hold as cachehold
from servimg.cache import layout as cachelayout
from servimg.cache import state as cachestate
from servimg.cache.location import default_cache_dir
from servimg.core.context import Log
from servimg.core.errors import host_error
from servimg.invocation import context
from servimg.invocation.outcome import Outcome
from servimg.render import Reporter

if TYPE_CHECKING:
    from servimg.assembly.seams import Seams


def execute(args: argparse.Namespace, seams: Seams | None = None) -> int:
    """Run the parsed command (`args.run`): one OK/FAIL per outcome; 1 when any failed, 130 on Ctrl-C."""
    reporter = Reporter(quiet=args.quiet, as_json=args.json)
    failures = 0
    root = getattr(args, "cache", None) or default_cache_dir()
    holds = getattr(args.run, "holds_cache", True)
    try:
        with cachehold.held(root) if holds else contextlib.nullcontext():
            for outcome in _outcomes(args, seams, reporter):
                failures += reporter.outcome(outcome)
    except KeyboardInterrupt:
        reporter.settle()
        print("FAIL: interrupted; nothing was published", file=sys.stderr)
        return 130
    except OSError as exc:
        # Outside any one target (the cache opened, held, or its store made): still the machine's word,
        # with the path (issue 48 item 6), never a traceback.
        if os.environ.get("SERVIMG_DEBUG"):
            raise
        where = f"the cache {root} (--cache, or SERVIMG_CACHE)"
        failures += reporter.outcome(Outcome(str(root), error=host_error(exc, where)))
    finally:
        reporter.settle()
    if holds:
        _keep_to_cap(root, reporter.log)
    return 1 if failures else 0


def _keep_to_cap(root: Path, log: Log) -> None:
    """Prune the cache to its bound (SERVIMG_CACHE_MAX_SIZE, else the default; least recently used first)
    once this command has let go, unless another command still holds it (the last one to end prunes)."""
    try:
        cap, source = cachelayout.max_size(os.environ)
        if cap is None:
            return
        with cachehold.exclusive(root):
            pruned = cachestate.prune(root, cap)
    except ValueError as exc:
        print(f"warning: {cachelayout.MAX_SIZE_ENV} ignored: {exc}", file=sys.stderr)
        return
    except (cachehold.CacheBusy, OSError):
        return
    if pruned.removed:
        log(
            f"cache: removed {len(pruned.removed)} least recently used entries "
            f"({cachelayout.format_size(pruned.freed)}) to stay under {cachelayout.format_size(cap)} "
            f"({source})"
        )


def _outcomes(args: argparse.Namespace, seams: Seams | None, reporter: Reporter) -> Iterable[Outcome]:
    return context.outcomes(args, seams, reporter)
