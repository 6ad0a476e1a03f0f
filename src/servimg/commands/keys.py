"""`servimg key generate`: an ed25519 or ECDSA P-256 pair."""

from __future__ import annotations

from collections.abc import Iterator

from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt
from servimg.signing import keys


def key_generate(p: params.KeyGenerate, ctx: Context) -> Iterator[Outcome]:
    yield attempt(
        str(p.out),
        lambda: Outcome(
            str(p.out), keys.generate(p.out, p.name, force=p.force, algorithm=p.algorithm).as_dict()
        ),
    )
