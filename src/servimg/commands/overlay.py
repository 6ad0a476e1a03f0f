"""`servimg overlay edit|save|drop`: author an overlay from an edited tree, or take one out
(authoring.overlaytree)."""

from __future__ import annotations

from collections.abc import Iterator

from servimg.authoring import overlaytree as authoring
from servimg.core.platform import Platform
from servimg.invocation import params
from servimg.invocation.context import Context
from servimg.invocation.outcome import Outcome, attempt


def edit(p: params.OverlayEdit, ctx: Context) -> Iterator[Outcome]:
    """Write the package's installed files (the base's bytes, or after its overlays) into --dir."""

    def run() -> Outcome:
        done = authoring.edit(
            p.definition,
            p.package,
            p.dir,
            ctx,
            with_stack=p.with_stack,
            platform=Platform.optional(p.platform),
        )
        return Outcome(
            str(done.directory),
            {
                "package": f"{done.package} ({done.site})",
                "platform": str(done.platform),
                "files": done.files,
                "stack": ", ".join(done.stack) or "none (the base's bytes)",
                "next": f"edit files there, then: servimg overlay save {p.definition} {p.package} --dir "
                f"{p.dir} --id ID",
            },
        )

    yield attempt(str(p.dir), run)


def save(p: params.OverlaySave, ctx: Context) -> Iterator[Outcome]:
    """Write overlays/PACKAGE/ID.patch from the edited tree, add it to the definition, lock again."""

    def run() -> Outcome:
        saved = authoring.save(
            p.definition,
            p.package,
            p.dir,
            p.id,
            ctx,
            description=p.description,
            fixes=p.fixes,
            upstream=p.upstream,
        )
        sentinels = [f"{s.module}:{s.qualname}:{s.name}" for s in saved.sentinels]
        fields: dict[str, object] = {
            "sha256": saved.sha256,
            "files": ", ".join(saved.files),
            "sentinels": ", ".join(sentinels) or "none proposed (add one by hand: docs/getting-started.md)",
        }
        if saved.lock_digest is None:
            fields["lock"] = "not written: the overlay's description is the placeholder"
            fields["next"] = (
                f"say what {p.id} fixes and why in its `description:` in {p.definition}, then "
                f"servimg lock {p.definition}"
            )
        else:
            fields["lock_digest"] = str(saved.lock_digest)
            fields["next"] = f"servimg build {p.definition}"
        return Outcome(str(saved.patch), fields)

    yield attempt(p.id, run)


def drop(p: params.OverlayDrop, ctx: Context) -> Iterator[Outcome]:
    """Take an overlay out of the definition: its entry, its patch file, and the lock, resolved again."""

    def run() -> Outcome:
        dropped = authoring.drop(p.definition, p.id, ctx)
        return Outcome(
            p.id,
            {
                "removed": str(dropped.patch) if dropped.patch else "the entry (its patch is still named)",
                "overlays": ", ".join(dropped.remaining) or "none",
                "lock_digest": str(dropped.lock_digest),
                "next": f"servimg build {p.definition}",
            },
        )

    yield attempt(p.id, run)
