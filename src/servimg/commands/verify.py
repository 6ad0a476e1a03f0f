"""`servimg verify`: the in-image probe, run whole in each image."""

from __future__ import annotations

from collections.abc import Iterator

from servimg.commands.platformref import each_platform
from servimg.core.errors import ServimgError
from servimg.core.platform import Platform
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt, tally
from servimg.proof.verifier import verify_ref
from servimg.proof.verify import VerifyFailed


def verify(p: params.Verify, ctx: Context) -> Iterator[Outcome]:
    """Run the in-image probe in each image (each platform of an index, or the one `--platform` names);
    FAIL when any check fails."""
    for given in p.images:
        try:
            images = each_platform(given, Platform.optional(p.platform), ctx.log)
        except ServimgError as exc:
            yield Outcome(given, error=exc)
            continue
        for chosen in images:

            def run(label: str = chosen.label, image: str = chosen.ref) -> Outcome:
                report = verify_ref(
                    image, ctx, verifier=ctx.seams.verifier, host=ctx.seams.host, audit=p.audit
                )
                error = None if report.ok else VerifyFailed(report)
                return Outcome(
                    label, {"summary": tally(report.counts())}, report.as_dict(), report, error=error
                )

            yield attempt(chosen.label, run)
