"""A signed build (`servimg build --sign KEY`): built, then pushed with its signed attestations; and the
one way every command reads a private key."""

from __future__ import annotations

from pathlib import Path

from servimg.commands import params
from servimg.commands.context import Context
from servimg.commands.outcome import Outcome
from servimg.provenance import attach, keys
from servimg.provenance.dsse import SigningKey


def signing_key(path: Path | None) -> SigningKey | None:
    return keys.load_signing(path) if path is not None else None


def build_one(path: Path, p: params.Build, ctx: Context) -> Outcome:
    """Build one definition as locked and push it with its signed provenance and verify result."""
    signed = attach.build_and_push(
        path,
        ctx.store,
        ctx.log,
        to=p.to or "",
        key=signing_key(p.sign),
        runner=p.runner,
        tag=p.tag,
        builder=p.builder_id,
        progress=ctx.progress,
        seams=ctx.seams,
    )
    return Outcome(str(path), signed)
