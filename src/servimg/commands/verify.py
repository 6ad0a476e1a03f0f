"""`servimg verify`: the in-image probe, run whole in each image."""

from __future__ import annotations

from collections.abc import Iterator

from servimg.builder.verify import VerifyFailed, verify_ref
from servimg.commands import params
from servimg.commands.context import Context
from servimg.commands.outcome import Outcome, attempt


def verify(p: params.Verify, ctx: Context) -> Iterator[Outcome]:
    """Run the in-image probe in each image; FAIL when any check fails."""
    for image in p.images:

        def run(image: str = image) -> Outcome:
            report = verify_ref(image, ctx.store, ctx.log, audit=p.audit)
            error = None if report.ok else VerifyFailed(report)
            return Outcome(image, {"summary": report.counts()}, report.as_dict(), report, error=error)

        yield attempt(image, run)
