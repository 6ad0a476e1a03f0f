"""`servimg lock` and `servimg build`: the build pipeline, nothing of provenance (a `--sign` build is
`servimg.commands.signed`, which the CLI's table names for it)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

from servimg.assembly import pipeline
from servimg.assembly.plan import BuildPlan
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import lock_path_for
from servimg.definitions.remembered import remember
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt


def lock(p: params.Lock, ctx: Context) -> Iterator[Outcome]:
    for path in p.definitions:

        def run(path: Path = path) -> Outcome:
            definition = ImageDefinition.load(path)
            locked, changed = pipeline.lock(path, ctx, p.runner, definition=definition)
            remember(ctx.store.root, definition)  # so a later drift names the fields that moved
            fields: dict[str, object] = {
                "lock": str(lock_path_for(path)),
                "lock_digest": str(locked.digest),
                "changed": changed,
                # N >= 1 (issue 49): every lock names the platforms it pins, one or several.
                "platforms": sorted(str(p) for p in definition.platforms),
            }
            return Outcome(str(path), fields)

        yield attempt(str(path), run)


def build(p: params.Build, ctx: Context) -> Iterator[Outcome]:
    """Build each definition as locked (`--sign`: servimg.commands.signed.build)."""
    for path in p.definitions:
        yield attempt(str(path), functools.partial(build_one, path, p, ctx))


def build_one(path: Path, p: params.Build, ctx: Context) -> Outcome:
    """Build it, every step in this run: one image, or for a definition with `base.platforms` one image
    per platform and an index over them."""
    plan = BuildPlan.make(
        path,
        to=p.to,
        tag=p.tag,
        runner=p.runner,
        platform=p.platform,
        cache_root=ctx.store.root,
        host=ctx.seams.host,
    )
    built = pipeline.build(plan, ctx).as_dict()
    return Outcome(str(path), {**built, **_described(built)}, json=built)


def _described(built: dict[str, object]) -> dict[str, object]:
    """The fields a person reads differently from a program: what the changed-files count counts."""
    if "changed_files" not in built:
        return {}
    return {"changed_files": f"{built['changed_files']} (the files the overlays changed)"}
