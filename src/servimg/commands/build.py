"""`servimg lock` and `servimg build`: the build pipeline, nothing of provenance (a `--sign` build is
`servimg.commands.signed`, which the CLI's table names for it)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

from servimg.build import pipeline, platforms
from servimg.commands import params
from servimg.commands.context import Context
from servimg.commands.outcome import Outcome, attempt
from servimg.core.errors import UsageError
from servimg.core.platform import Platform
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import lock_path_for


def lock(p: params.Lock, ctx: Context) -> Iterator[Outcome]:
    for path in p.definitions:

        def run(path: Path = path) -> Outcome:
            definition = ImageDefinition.load(path)
            more: dict[str, object] = {}
            if definition.multi_platform:
                many, changed = platforms.lock_platforms(
                    definition, path, ctx.store, ctx.log, p.runner, ctx.seams
                )
                digest, more = many.digest, {"platforms": sorted(many.platforms)}
            else:
                locked, changed = pipeline.lock(path, ctx.store, ctx.log, p.runner, ctx.seams)
                digest = locked.digest
            fields = {
                "lock": str(lock_path_for(path)),
                "lock_digest": str(digest),
                "changed": changed,
                **more,
            }
            return Outcome(str(path), fields)

        yield attempt(str(path), run)


def build(p: params.Build, ctx: Context) -> Iterator[Outcome]:
    """Build each definition as locked (`--sign`: servimg.commands.signed.build)."""
    for path in p.definitions:
        yield attempt(str(path), functools.partial(build_one, path, p, ctx))


def build_one(path: Path, p: params.Build, ctx: Context) -> Outcome:
    """Build it, every step in this run. A definition with `base.platforms` builds every platform and an
    index over them."""
    definition = ImageDefinition.load(path)
    if definition.multi_platform:
        many = platforms.build_platforms(
            definition,
            path,
            ctx.store,
            ctx.log,
            to=p.to,
            runner=p.runner,
            tag=p.tag,
            progress=ctx.progress,
            seams=ctx.seams,
            engine_platform=Platform.optional(p.platform),
        )
        return Outcome(str(path), many.as_dict())
    if p.platform is not None and Platform.parse(p.platform) not in definition.platforms:
        raise UsageError(
            f"--platform {p.platform}: {path} builds {definition.base.platform} only",
            hint="leave --platform out, or list platforms under base.platforms (docs/platforms.md)",
        )
    built = pipeline.build(
        path,
        ctx.store,
        ctx.log,
        to=p.to,
        runner=p.runner,
        tag=p.tag,
        progress=ctx.progress,
        seams=ctx.seams,
        definition=definition,
    )
    return Outcome(str(path), built.as_dict())
