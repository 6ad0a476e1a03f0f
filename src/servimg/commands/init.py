"""`servimg init --base REF --name NAME`: a definition skeleton from your own image (authoring.skeleton)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from servimg.authoring import skeleton
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt


def init(p: params.Init, ctx: Context) -> Iterator[Outcome]:
    """Inspect the base and write images/NAME.yaml (or --out); an existing file is kept unless --force."""

    def run() -> Outcome:
        found = skeleton.inspect(p.base, p.name, p.repository, ctx)
        path = p.out or Path("images") / f"{p.name}.yaml"
        skeleton.write(found, path, force=p.force)
        return Outcome(
            str(path),
            {
                "base": f"{found.base_ref}@{found.base_digest}",
                "python": f"{found.python} ({found.python_version})",
                "packages": ", ".join(
                    f"{x.import_name}={x.distribution}=={x.version}" for x in found.packages
                ),
                "next": f"servimg lock {path}",
            },
        )

    yield attempt(p.name, run)
