"""One finding model for every verdict servimg gives: the probe's checks (`servimg verify`), a policy
check's rows (`servimg check`, `promote`), a container's witness records and a ladder's arms.

A `Finding` is one line of a verdict: a stable `code` (what kind of check), a `status`, the `subject` it is
about, a human `message` and, where there is one, a `hint` (what to do next). `Findings` is an ordered
set of them and the verdict they give; the report types (`VerifyReport`, `CheckReport`, …) extend it with
what they ran under. One renderer (`servimg.render.findings_table`) draws any of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar


class Status(StrEnum):
    """A StrEnum, so that a status compares equal to, and serialises as, the word the probe prints and
    the receipts and attestations carry ("PASS", …)."""

    PASS = "PASS"
    WARN = "WARN"  # reported, never failing
    FAIL = "FAIL"
    ERROR = "ERROR"  # the check itself could not run (the probe's own failure): as bad as FAIL
    NOT_EXERCISED = "NOT_EXERCISED"  # a ladder gate was not met: never a pass, not a defect either


PASS, WARN, FAIL, ERROR = Status.PASS, Status.WARN, Status.FAIL, Status.ERROR
NOT_EXERCISED = Status.NOT_EXERCISED
FAILING = frozenset({Status.FAIL, Status.ERROR})
NOT_PASSING = FAILING | {Status.NOT_EXERCISED}


@dataclass(frozen=True)
class Finding:
    code: str
    status: Status
    subject: str
    message: str
    hint: str = ""
    details: Mapping[str, object] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    def line(self) -> str:
        """`CODE subject: message`, as a problem line of an error."""
        return f"{self.code} {self.subject}: {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {
            "code": self.code,
            "status": str(self.status),
            "subject": self.subject,
            "message": self.message,
            "hint": self.hint,
            "details": dict(self.details),
        }


@dataclass(frozen=True)
class Findings:
    """An ordered set of findings and their verdict: FAIL when any finding fails (FAIL or ERROR), else
    NOT_EXERCISED when any is, else PASS. WARN never changes the verdict."""

    findings: tuple[Finding, ...] = ()
    # The statuses a summary always counts (zero included), in this order; a report type narrows it.
    counted: ClassVar[tuple[Status, ...]] = (PASS, WARN, FAIL, ERROR)

    def title(self) -> str:
        """The heading of this verdict's table."""
        return "findings"

    def notes(self) -> list[str]:
        """Lines printed above the table: what the verdict was reached under."""
        return []

    @property
    def verdict(self) -> Status:
        statuses = {f.status for f in self.findings}
        if statuses & FAILING:
            return FAIL
        return NOT_EXERCISED if NOT_EXERCISED in statuses else PASS

    @property
    def ok(self) -> bool:
        return self.verdict == PASS

    def failures(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status in FAILING)

    def not_passing(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status in NOT_PASSING)

    def counts(self) -> dict[str, int]:
        counted = list(self.counted) + sorted({f.status for f in self.findings} - set(self.counted))
        return {str(s): sum(1 for f in self.findings if f.status == s) for s in counted}

    def problems(self, limit: int | None = None) -> list[str]:
        """The not-passing findings as problem lines (for an error that carries the verdict)."""
        return [f.line() for f in self.not_passing()][:limit]

    def first_hint(self) -> str:
        return next((f.hint for f in self.not_passing() if f.hint), "")
