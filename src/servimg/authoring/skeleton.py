"""`servimg init`: start from your own image. Inspect a base (engine, OCI layout, archive or registry) and
write `images/<name>.yaml`, a definition skeleton that locks as it is: the base pinned by digest, the
interpreter found beside the packages (asked for its version by the image itself), the vllm and lmcache
distributions and versions it installs, and the repository; the tag template and a ladder as comments.

Facts only from the image: the packages are found by their dist-info RECORDs in every site-packages and
dist-packages directory (a venv like the demo's, or the official image's system Python with packages in
/usr/local/lib/python3.X/dist-packages), and the interpreter is run (the build's runner) for its version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servimg.assembly.basescan import guess_interpreter, interpreter_facts, providers
from servimg.assembly.context import Context
from servimg.assembly.pipeline import base_fs
from servimg.backends import transport
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest
from servimg.core.errors import DefinitionError
from servimg.definitions.definition import DEFAULT_TEMPLATE, ImageDefinition

SERVING_PACKAGES = ("vllm", "lmcache")


@dataclass(frozen=True)
class FoundPackage:
    import_name: str
    distribution: str
    version: str
    site: str


@dataclass(frozen=True)
class Skeleton:
    """What `init` found in a base, and the definition text it makes of it."""

    name: str
    repository: str
    base_ref: str
    base_digest: Digest
    python: str
    python_version: str
    packages: tuple[FoundPackage, ...]

    def text(self) -> str:
        found = {p.import_name for p in self.packages}
        lines = [
            f"# images/{self.name}.yaml, written by `servimg init --base {self.base_ref}`: every key is in",
            "# docs/definition.md. Next: add overlays (docs/getting-started.md), then",
            f"# `servimg lock images/{self.name}.yaml` and `servimg build images/{self.name}.yaml`.",
            f"name: {self.name}",
            f"repository: {self.repository}",
            "base:",
            f"  ref: {self.base_ref}",
            f"  digest: {self.base_digest}",
            f"# The interpreter beside the packages (Python {self.python_version}, asked in the image).",
            f"python: {self.python}",
            "packages:",
            *(
                f"  {p.import_name}: {{distribution: {p.distribution}, version: '{p.version}'}}  # {p.site}"
                for p in self.packages
            ),
            *(f"  # {name}: not installed in this base" for name in SERVING_PACKAGES if name not in found),
            "overlays: []",
            "# The smoke ladder the image carries (the witness then records which overlay code ran):",
            "# ladder: verify/ladders/cpu-smoke.yaml",
            f'# tag: "{DEFAULT_TEMPLATE}"',
        ]
        return "\n".join(lines) + "\n"


def inspect(ref: str, name: str, repository: str | None, ctx: Context) -> Skeleton:
    """The skeleton of a definition over the base `ref` (an IMAGE argument, resolved as docker would)."""
    store, log, seams = ctx.store, ctx.log, ctx.seams
    found = transport.resolve(ref, log)
    base = transport.fetch(found.ref, ctx)
    fs = base_fs(base, store)
    packages = []
    for import_name in SERVING_PACKAGES:
        hits = providers(fs, import_name)
        if len(hits) > 1:
            where = ", ".join(f"{d}=={v} in {s}" for d, v, s in hits)
            raise DefinitionError(
                f"{found.ref}: more than one distribution provides {import_name}: {where}",
                hint="remove all but one from the base; servimg patches exactly one installed copy",
            )
        packages += [FoundPackage(import_name, *hit) for hit in hits]
    if not packages:
        raise DefinitionError(
            f"{found.ref}: no installed distribution provides vllm or lmcache (looked in every "
            "site-packages and dist-packages directory)",
            hint="point --base at a serving image with vLLM installed",
        )
    python = guess_interpreter(fs, packages[0].site)
    runner = seams.runners.choose("auto", base, fs, store)
    facts = interpreter_facts(base, python, runner, ctx)
    return Skeleton(
        name,
        repository or f"servimg/{name}",
        found.ref,
        base.digest,
        python,
        facts.version,
        tuple(packages),
    )


def write(skeleton: Skeleton, path: Path, *, force: bool = False) -> None:
    """Write the definition (read back first: it must parse); an existing file is kept unless `force`."""
    text = skeleton.text()
    ImageDefinition.parse(text, origin=str(path))
    if path.exists() and not force:
        raise DefinitionError(
            f"{path} exists; nothing was written", hint="choose another --name or --out, or pass --force"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text.encode(), 0o644)
