"""A signed build (`servimg build --sign KEY`): built, then pushed with its signed attestations; and the
one way every command reads a private key."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

from servimg.attesting import attach
from servimg.core.errors import UsageError
from servimg.formats import cosign
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt
from servimg.signing import gpgsign, keys
from servimg.signing.dsse import Signer


def signing_key(path: Path | None) -> Signer | None:
    return keys.load_signing(path) if path is not None else None


def formats(p: params.Publish) -> frozenset[str]:
    return cosign.parse_formats(p.formats)


def gpg_plan(p: params.Publish) -> attach.GpgPlan | None:
    """`--gpg-key FPR [--lookaside DIR]`; the key is looked up now, before anything is pushed."""
    if p.gpg_key is None:
        if p.lookaside is not None:
            raise UsageError("--lookaside goes with --gpg-key", hint="--gpg-key FPR --lookaside DIR")
        return None
    signer = gpgsign.GpgSigner(p.gpg_key)
    signer.fingerprint()
    return attach.GpgPlan(signer, gpgsign.Lookaside(p.lookaside) if p.lookaside is not None else None)


def build(p: params.Build, ctx: Context) -> Iterator[Outcome]:
    """`servimg build --sign KEY`: each definition built as locked and pushed with its attestations."""
    for path in p.definitions:
        yield attempt(str(path), functools.partial(build_one, path, p, ctx))


def build_one(path: Path, p: params.Build, ctx: Context) -> Outcome:
    """Build one definition as locked and push it with its signed provenance and verify result."""
    signed = attach.build_and_push(
        path,
        ctx,
        to=p.to or "",
        key=signing_key(p.sign),
        runner=p.runner,
        tag=p.tag,
        builder=p.builder_id,
        formats=formats(p.publish),
        gpg=gpg_plan(p.publish),
    )
    return Outcome(str(path), signed)
