"""`servimg base NAME`: build a local base from its pins, or re-pin it."""

from __future__ import annotations

from collections.abc import Iterator

from servimg.backends.target import Target
from servimg.bases import catalog as bases
from servimg.bases import platforms
from servimg.bases.assemble import default_targets
from servimg.core.platform import Platform
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt
from servimg.patching import emulation


def base(p: params.Base, ctx: Context) -> Iterator[Outcome]:
    """Build a local base from its pins, or (`repin`) re-pin it deliberately."""

    def run() -> Outcome:
        chosen = Platform.parse_list(p.platforms) if p.platforms else ()
        # The places are parsed here, once, at the command's edge; the bases room takes them as values.
        targets = [Target.parse(t) for t in p.to] if p.to is not None else default_targets(ctx.seams.host)
        if p.repin:
            repinned = [
                bases.repin(p.name, ctx, workdir=p.workdir, platform=platform)
                for platform in chosen or (None,)
            ]
            return Outcome(f"{p.name}-base", repinned[0] if len(repinned) == 1 else {"repinned": repinned})
        if len(chosen) > 1:
            built = platforms.build_platforms(p.name, chosen, ctx, targets=targets, workdir=p.workdir)
            return Outcome(f"{p.name}-base", built)
        recipe = bases.pinned_recipe(p.name, chosen[0] if chosen else None)
        if chosen:
            emulation.require(chosen[0], f"building the {p.name} base")
        built = bases.build_base(recipe, ctx, targets=targets, workdir=p.workdir)
        return Outcome(f"{p.name}-base", built)

    yield attempt(f"{p.name}-base", run)
