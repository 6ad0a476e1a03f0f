"""What every command runs with (`Context`) and what it yields per target (`Outcome`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from servimg.build.seams import Seams
from servimg.core.errors import ServimgError
from servimg.core.findings import Findings
from servimg.core.progress import NULL, Log, Progress
from servimg.oci.store import BlobStore

Fields = Mapping[str, object]


def _silent(message: str) -> None:
    del message


@dataclass(frozen=True)
class Context:
    """What every command runs with: the blob cache, where its steps are logged, how long transfers
    show progress, and the build's seams (chosen once by the caller)."""

    store: BlobStore
    log: Log = _silent
    progress: Progress = NULL
    seams: Seams = field(default_factory=Seams)


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


BUG_HINT = "this is a bug in servimg; rerun with SERVIMG_DEBUG=1 for the traceback and report it"


def attempt(target: str, run: Callable[[], Outcome]) -> Outcome:
    """One target: its outcome, or its failure as an outcome. A non-servimg exception is a bug: still
    one FAIL, with the traceback only under SERVIMG_DEBUG."""
    try:
        return run()
    except ServimgError as exc:
        return Outcome(target, error=exc)
    except Exception as exc:
        if os.environ.get("SERVIMG_DEBUG"):
            raise
        return Outcome(
            target, error=ServimgError(f"internal error: {type(exc).__name__}: {exc}", hint=BUG_HINT)
        )
