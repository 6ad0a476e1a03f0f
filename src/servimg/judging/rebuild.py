"""`servimg check REF --rebuild`: verification by independent rebuild.

The image's signed provenance names its definition (externalParameters) and its lock (lockDigest). A
rebuild materialises exactly those in a scratch checkout — the definition as the provenance states it, the
image's lock (whose digest must be the provenance's), and the overlay patches (and ladder files) from the
local checkout, each pinned by sha256 in the definition or the lock — and runs the ordinary build on this
machine: the base by its pinned digest, the overlay layer written here. The registry's copy of the
overlay layer is never an input: the rebuilt layer's digest is computed from the bytes written locally.
The rebuild passes only when the rebuilt manifest digest is bit-identical to REF's; otherwise
`oci.treediff` says which files differ.

A rebuild's result can be attached as a signed statement (predicate `REBUILD_V1`: who rebuilt, which
digest, the rebuilt digest, match or not), and a policy can require N of them from distinct trusted keys.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from servimg import __version__
from servimg.assembly.context import Context
from servimg.assembly.defaults import StoreOnly
from servimg.assembly.pipeline import build
from servimg.assembly.plan import BuildPlan
from servimg.backends.target import Target
from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.core.findings import FAIL, PASS, Finding
from servimg.definitions.definition import ImageDefinition, repo_root_for
from servimg.definitions.lock import Lock, lock_path_for
from servimg.oci import treediff
from servimg.oci.image import Image, Layer
from servimg.oci.store import BlobStore
from servimg.patching import resultcache
from servimg.statements.binding import binding_row
from servimg.statements.derived import ImageFacts

DEFAULT_REBUILDER_ID = "https://servimg.invalid/rebuilder/v1"
EXPLAINED = 12  # file-level lines kept in a row and an attestation


class RebuildError(ServimgError):
    """The inputs the provenance names cannot be assembled here (no checkout, another lock, …)."""


@dataclass(frozen=True)
class Rebuilt:
    """One rebuild's result. `problem` set: no image was rebuilt (the row says why)."""

    reference: Digest
    rebuilt: Digest | None = None
    seconds: float = 0.0
    definition: str = ""
    lock_digest: Digest | None = None
    differences: tuple[str, ...] = ()
    problem: str | None = None

    @property
    def match(self) -> bool:
        return self.rebuilt is not None and self.rebuilt == self.reference

    def row(self) -> Finding:
        if self.problem is not None:
            return binding_row("rebuild", FAIL, f"could not rebuild: {self.problem}")
        if self.match:
            return binding_row(
                "rebuild",
                PASS,
                f"rebuilt here from {self.definition} + lock {self.lock_digest} in {self.seconds:.1f}s: "
                f"{self.rebuilt} = this image's digest (bit-identical)",
            )
        why = "; ".join(self.differences[:EXPLAINED]) or "no file-level difference found"
        return binding_row(
            "rebuild",
            FAIL,
            f"rebuilt {self.rebuilt}, this image is {self.reference} (this image → the rebuild): {why}",
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "reference": str(self.reference),
            "rebuilt": str(self.rebuilt) if self.rebuilt else None,
            "match": self.match,
            "seconds": round(self.seconds, 3),
            "definition": self.definition,
            "lock_digest": str(self.lock_digest) if self.lock_digest else "",
            "differences": list(self.differences),
            "problem": self.problem,
        }


def named_inputs(facts: ImageFacts, predicate: Mapping[str, object] | None) -> tuple[dict[str, object], Lock]:
    """The definition and lock the provenance names: its externalParameters and the image's lock, whose
    digest must be the provenance's lockDigest (without provenance, the image's own files)."""
    if predicate is None:
        return dict(facts.definition), facts.lock
    build_def = jv.obj(predicate.get("buildDefinition") or {}, "buildDefinition")
    definition = build_def.get("externalParameters")
    internal = jv.obj(build_def.get("internalParameters") or {}, "buildDefinition.internalParameters")
    named = internal.get("lockDigest")
    if not isinstance(definition, dict):
        raise RebuildError("the provenance names no definition (buildDefinition.externalParameters)")
    if named != str(facts.lock_digest):
        raise RebuildError(
            f"the provenance names lock {named}, the lock inside the image is {facts.lock_digest}",
            hint="the image and its provenance disagree: `servimg check` without --rebuild says more",
        )
    return definition, facts.lock


def rebuild(
    image: Image,
    facts: ImageFacts,
    predicate: Mapping[str, object] | None,
    checkout_definition: Path | None,
    ctx: Context,
    *,
    fetch_layer: Callable[[Layer], None] = lambda layer: None,
) -> Rebuilt:
    """Rebuild `image` from the inputs its provenance names (see the module docstring); never raises for
    a rebuild that cannot be done: the result's `problem` says why."""
    try:
        definition, lock = named_inputs(facts, predicate)
        source = checkout_definition or Path("images") / f"{definition.get('name')}.yaml"
        if not source.is_file():
            raise RebuildError(
                f"no definition {source} here to take the overlay files from",
                hint="run in the repository checkout, or pass --definition images/<name>.yaml",
            )
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="servimg-rebuild-") as scratch:
            path = _materialise(Path(scratch), definition, lock, repo_root_for(source))
            ctx.log(f"rebuilding {image.digest.short} from {source} (lock {lock.digest.short}) in {scratch}")
            with resultcache.bypassed():  # a rebuild compiles again: it must not take the first build's pycs
                plan = BuildPlan.make(path, to=Target.layout(Path(scratch) / "out").text(), verify=False)
                # The rebuild is kept in the store only: nothing is published by a check.
                only_stored = dataclasses.replace(ctx.seams, sink=StoreOnly())
                result = build(plan, dataclasses.replace(ctx, seams=only_stored))
        seconds = time.monotonic() - started
    except ServimgError as exc:
        return Rebuilt(image.digest, problem="; ".join([exc.message, *exc.problems[:4]]))
    (built,) = result.images  # a provenance names one platform's lock: the rebuild made one image
    rebuilt = built.image
    done = Rebuilt(image.digest, rebuilt.digest, seconds, str(source), lock.digest)
    if done.match:
        return done
    return dataclasses.replace(done, differences=tuple(_explain(image, rebuilt, ctx.store, fetch_layer)))


def _materialise(root: Path, definition: Mapping[str, object], lock: Lock, checkout: Path) -> Path:
    """A scratch checkout: the named definition and lock, and the files they pin, from `checkout`."""
    parsed = ImageDefinition.from_mapping(definition, origin="the provenance's definition")
    path = root / "images" / f"{parsed.name}.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(parsed.to_json(), sort_keys=True))
    lock.write(lock_path_for(path))
    pinned = [o.patch for o in parsed.overlays]
    if lock.ladder is not None:
        pinned += [lock.ladder.path, lock.ladder.probes_path]
    for relative in pinned:
        origin = checkout / relative
        if not origin.is_file():
            raise RebuildError(
                f"{origin} is missing: the definition pins it", hint="check out the image's source revision"
            )
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(origin, root / relative)  # sha256-checked by the build against the pins
    return path


def _explain(a: Image, b: Image, store: BlobStore, fetch_layer: Callable[[Layer], None]) -> list[str]:
    """File-level lines: what differs between REF (a) and the rebuild (b)."""
    rebuilt_layers = {layer.diff_id for layer in b.layers}
    try:
        for layer in a.layers:
            if layer.diff_id not in rebuilt_layers and not store.has(layer.descriptor.digest):
                fetch_layer(layer)
        lines = treediff.explain(treediff.diff_images(a, b, store), EXPLAINED)
    except ServimgError as exc:
        return [f"cannot list the differing files: {exc.message}"]
    return [line.strip() for line in lines if line.strip() and not line.endswith(": identical")]


# ------------------------------------------------------------------------------------------------ statement


def rebuild_predicate(result: Rebuilt, rebuilder: str, when: str) -> dict[str, object]:
    """The rebuild statement's predicate: who rebuilt which digest, from which inputs, with what result."""
    return {
        "rebuilder": {"id": rebuilder},
        "image": {"digest": {"sha256": result.reference.hex}},
        "rebuilt": {"digest": {"sha256": result.rebuilt.hex}} if result.rebuilt else None,
        "match": result.match,
        "lockDigest": str(result.lock_digest) if result.lock_digest else "",
        "differences": list(result.differences[:EXPLAINED]),
        "timeRebuilt": when,
        "servimg": __version__,
    }


def matching(predicate: Mapping[str, object], digest: Digest) -> bool:
    """A rebuild statement vouches for `digest` only if it says match and names that digest twice."""
    want = {"sha256": digest.hex}
    return (
        predicate.get("match") is True
        and jv.member(predicate, "image", "digest") == want
        and jv.member(predicate, "rebuilt", "digest") == want
    )


def rebuilder_of(predicate: Mapping[str, object]) -> str:
    return str(jv.member(predicate, "rebuilder", "id") or "?")


def count_rows(
    required: int, attested: Sequence[tuple[tuple[str, ...], Mapping[str, object]]], digest: Digest
) -> Finding:
    """`rebuilds`: at least `required` matching rebuild attestations, from distinct trusted keys."""
    keys: set[str] = set()
    rebuilders = set()
    for keyids, predicate in attested:
        if keyids and matching(predicate, digest):
            keys.update(keyids)
            rebuilders.add(rebuilder_of(predicate))
    who = f" by {', '.join(sorted(rebuilders))}" if rebuilders else ""
    why = (
        f"{len(keys)} independent matching rebuild(s) (distinct trusted keys){who}; "
        f"the policy requires {required}"
    )
    return binding_row("rebuilds", PASS if len(keys) >= required else FAIL, why)
