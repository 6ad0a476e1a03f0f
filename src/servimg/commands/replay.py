"""`servimg build` answered from the action cache (servimg.builder.actioncache): the very same build run
before, with nothing it read changed and its destination still holding the result, prints the same
OK line (and --json) without importing the pipeline. Asked by the session before the command runs
(servimg.commands.session); None makes the command run. Standard library, servimg.core and the action
cache only."""

from __future__ import annotations

from pathlib import Path

from servimg.builder import actioncache
from servimg.commands import params
from servimg.commands.outcome import Outcome
from servimg.core.cachedir import default_cache_dir
from servimg.core.progress import Log


def build(p: params.Build, cache: Path | None, log: Log) -> list[Outcome] | None:
    """Every definition's outcome from the action cache, or None when any one must be built (then all
    are, in order, as without the cache). A `--sign` build or the default destination never is: the one
    pushes its attestations, the other depends on whether an engine runs; a `--platform` build is not
    recorded (it is a multi-platform one, or refused)."""
    if p.sign is not None or p.to is None or p.platform is not None:
        return None
    root = cache or default_cache_dir()
    found = []
    for path in p.definitions:
        fields = actioncache.lookup(root, actioncache.Action(path, p.to, p.runner, p.tag))
        if fields is None:
            return None
        found.append(Outcome(str(path), fields))
    for outcome in found:
        where = outcome.fields["destination"]
        log(
            f"{outcome.target}: built before from the same inputs and still at {where} "
            "(action cache; SERVIMG_NO_RESULT_CACHE=1 builds it again)"
        )
    return found


def warm() -> None:
    """What a resident server computes once for every build it serves (servimg.cli.preload)."""
    actioncache.running_code_sha256()
