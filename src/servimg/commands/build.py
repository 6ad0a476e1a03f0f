"""`servimg lock`, `servimg build`, `servimg rebase`: the build pipeline, nothing of provenance (a
`--sign` build is `servimg.commands.signed`, loaded only then)."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

from servimg.build import pipeline
from servimg.build import rebase as rebasing
from servimg.build.lock import lock_path_for
from servimg.commands import params
from servimg.commands.outcome import Context, Outcome, attempt
from servimg.core.errors import UsageError

# A signed build pushes with attestations (servimg.provenance): loaded only when --sign asks for it.
SIGNED_BUILD = "servimg.commands.signed"


def lock(p: params.Lock, ctx: Context) -> Iterator[Outcome]:
    for path in p.definitions:

        def run(path: Path = path) -> Outcome:
            locked, changed = pipeline.lock(path, ctx.store, ctx.log, p.runner, ctx.seams)
            fields = {"lock": str(lock_path_for(path)), "lock_digest": str(locked.digest), "changed": changed}
            return Outcome(str(path), fields)

        yield attempt(str(path), run)


def build(p: params.Build, ctx: Context) -> Iterator[Outcome]:
    """Build each definition as locked; with `sign`, also push it with its signed attestations."""
    one = signed_build() if p.sign is not None else build_one
    for path in p.definitions:
        yield attempt(str(path), functools.partial(one, path, p, ctx))


BuildOne = Callable[[Path, params.Build, Context], Outcome]


def signed_build() -> BuildOne:
    return cast(BuildOne, importlib.import_module(SIGNED_BUILD).build_one)


def build_one(path: Path, p: params.Build, ctx: Context) -> Outcome:
    built = pipeline.build(
        path, ctx.store, ctx.log, to=p.to, runner=p.runner, tag=p.tag, progress=ctx.progress, seams=ctx.seams
    )
    return Outcome(str(path), built.as_dict())


def rebase_request(p: params.Rebase) -> rebasing.RebaseRequest:
    versions = dict(v.split("=", 1) for v in p.versions if "=" in v)
    if len(versions) != len(p.versions):
        raise UsageError("--version takes NAME=VERSION", hint="e.g. --version vllm=0.32.0")
    return rebasing.RebaseRequest(
        p.definition, p.base, p.digest, versions, p.drop_absorbed, p.write, p.runner
    )


def rebase(p: params.Rebase, ctx: Context) -> Iterator[Outcome]:
    """Judge a definition's overlays on a new base; write the proposed definition and lock only when the
    stack carries over cleanly (FAIL, nothing written, otherwise)."""

    def run() -> Outcome:
        result = rebasing.rebase(rebase_request(p), ctx.store, ctx.log, ctx.seams)
        fields: dict[str, object] = {"carries": result.carries, **result.counts()}
        fields["written"] = [str(w) for w in result.written]
        return Outcome(
            str(p.definition),
            fields,
            result.as_dict(),
            result.report,
            explanation=result.text(),
            error=result.error(),
        )

    yield attempt(str(p.definition), run)
