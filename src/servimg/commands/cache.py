"""`servimg cache verify [--repair]`: the blob store's health check (docs/reliability.md)."""

from __future__ import annotations

from collections.abc import Iterator

from servimg.commands import params
from servimg.commands.context import Context
from servimg.commands.outcome import Outcome, attempt
from servimg.core.errors import StoreError


def cache_verify(p: params.CacheVerify, ctx: Context) -> Iterator[Outcome]:
    """Re-hash every blob and uncompressed layer copy in the store against its name; FAIL naming each one
    that does not match, unless `--repair` removed them (the next read fetches them again)."""

    def run() -> Outcome:
        audit = ctx.store.audit(repair=p.repair)
        bad = [
            f"{b.kind}/{b.name}: its {b.size} bytes hash to {b.actual}"
            + (" (removed)" if audit.repaired else "")
            for b in audit.bad
        ]
        fields = {
            "checked": audit.checked,
            "corrupt": len(bad),
            **({"removed": len(bad)} if audit.repaired and bad else {}),
            "store": str(audit.root),
        }
        if not audit.ok:
            error = StoreError(
                f"{len(bad)} of {audit.checked} cached file(s) do not match their names",
                problems=bad,
                hint="`servimg cache verify --repair` removes them; the next command that needs one reads "
                "it again from its source",
            )
            return Outcome("cache", fields, {**fields, "problems": bad}, error=error)
        return Outcome("cache", fields, {**fields, "problems": bad})

    yield attempt("cache", run)
