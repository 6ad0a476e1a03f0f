"""What a command yields per target (`Outcome`), and `attempt`: one target's failure as an outcome.
Standard library and servimg.core only (what every command runs with is `servimg.invocation.context`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from servimg.core.errors import ServimgError, host_error
from servimg.core.findings import Findings

Fields = Mapping[str, object]


@dataclass(frozen=True)
class Outcome:
    """What one target gave. `fields` are the OK line's (text), `json` the --json line's where they say
    more; `findings` is drawn as a table and `explanation` printed before the line (text, not --quiet);
    `document` is the output itself (text, even --quiet); `error`, when set, makes it a FAIL."""

    target: str
    fields: Fields = field(default_factory=dict)
    json: Fields | None = None
    findings: Findings | None = None
    explanation: str = ""
    document: str = ""
    error: ServimgError | None = None
    quiet_ok: bool = False  # the document is the whole answer: no OK line after it

    @property
    def ok(self) -> bool:
        return self.error is None


def tally(counts: Mapping[str, int]) -> str:
    """A verdict's counts as a person reads them: `34 PASS, 0 WARN, 0 FAIL`."""
    return ", ".join(f"{n} {status}" for status, n in counts.items())


BUG_HINT = "this is a bug in servimg; rerun with SERVIMG_DEBUG=1 for the traceback and report it"


def attempt(target: str, run: Callable[[], Outcome]) -> Outcome:
    """One target: its outcome, or its failure as an outcome. A non-servimg exception is a bug: still
    one FAIL, with the traceback only under SERVIMG_DEBUG. The machine refusing (a file where a directory
    belongs, a full disk) is the user's to mend, not a bug: named with its path and the way out."""
    try:
        return run()
    except ServimgError as exc:
        return Outcome(target, error=exc)
    except OSError as exc:
        if os.environ.get("SERVIMG_DEBUG"):
            raise
        return Outcome(target, error=host_error(exc))
    except Exception as exc:
        if os.environ.get("SERVIMG_DEBUG"):
            raise
        return Outcome(
            target, error=ServimgError(f"internal error: {type(exc).__name__}: {exc}", hint=BUG_HINT)
        )
