"""`servimg base NAME`: build a local base from its pins, or re-pin it."""

from __future__ import annotations

from collections.abc import Iterator

from servimg.bases import catalog as bases
from servimg.commands import params
from servimg.commands.context import Context
from servimg.commands.outcome import Outcome, attempt


def base(p: params.Base, ctx: Context) -> Iterator[Outcome]:
    """Build a local base from its pins, or (`repin`) re-pin it deliberately."""

    def run() -> Outcome:
        if p.repin:
            return Outcome(f"{p.name}-base", bases.repin(p.name, ctx.store, ctx.log, workdir=p.workdir))
        built = bases.build_base(p.name, ctx.store, ctx.log, targets=p.to, workdir=p.workdir)
        return Outcome(f"{p.name}-base", built)

    yield attempt(f"{p.name}-base", run)
