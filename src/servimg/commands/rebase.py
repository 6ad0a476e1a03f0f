"""`servimg rebase`: a definition's overlays judged on a new base, and the proposed definition and lock."""

from __future__ import annotations

from collections.abc import Iterator

from servimg.build import rebase as rebasing
from servimg.commands import params
from servimg.commands.context import Context
from servimg.commands.outcome import Outcome, attempt
from servimg.core.errors import UsageError


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
