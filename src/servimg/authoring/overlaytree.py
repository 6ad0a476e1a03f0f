"""`servimg overlay edit|save`: author an overlay from an edited tree, as npm's patch-package does.

- `edit` writes the installed files of one package (its sources and data: no pycs, no compiled
  extensions) from the locked base into a directory, read through the base's layers — the bytes the
  overlay engine will patch — or, with `with_stack`, as the definition's overlays for that package leave
  them. A manifest (`.servimg-edit.json`) records where they came from and each file's sha256.
- `save` diffs the directory against that manifest: every modified file becomes a hunk of one unified
  diff with `a/` and `b/` roots relative to the package's site-packages (`strip: 1`, applied exactly, no
  fuzz), written to `overlays/<package>/<id>.patch`. The overlay is added to the definition with its
  sha256 and proposed sentinels, and the definition is locked again (the lock verifies the patch applies
  and each `absent_in_base` sentinel in the image's own interpreter). Nothing changed: refused.

A proposed sentinel is a name a changed function gains: in the new code's `co_names` under a qualname,
not under that qualname in the old code, and nowhere in the base's module (checked by the image's
interpreter, `sentinels.base_sentinel_verdicts_in_image`).
"""

from __future__ import annotations

import builtins
import json
import re
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from servimg.assembly.context import Context
from servimg.assembly.pipeline import Resolution, lock, resolve
from servimg.authoring.defedit import definition_text, scratch_definition
from servimg.core import fixid
from servimg.core import jsonview as jv
from servimg.core.atomic import atomic_write
from servimg.core.context import Log
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import BytecodeError, OverlayError
from servimg.core.platform import Platform
from servimg.definitions.definition import (
    PLACEHOLDER_DESCRIPTION,
    ImageDefinition,
    Sentinel,
    repo_root_for,
)
from servimg.definitions.lock import lock_path_for
from servimg.definitions.remembered import remember
from servimg.oci.store import BlobStore
from servimg.patching.bytecode import CompileJob, InterpreterFacts
from servimg.proof.sentinels import base_sentinel_verdicts_in_image, sentinel_key
from servimg.proof.verify import module_name

MANIFEST = ".servimg-edit.json"
SKIPPED = (".pyc", ".so", ".pyd")  # compiled: servimg recompiles pycs, and a diff cannot patch a binary


@dataclass(frozen=True)
class Edited:
    directory: Path
    package: str
    site: str
    files: int
    stack: tuple[str, ...]
    platform: Platform  # whose base the files came from (one of a multi-platform definition's)


@dataclass(frozen=True)
class Saved:
    patch: Path
    sha256: str
    files: tuple[str, ...]
    sentinels: tuple[Sentinel, ...]
    lock_digest: Digest | None  # None: saved with the placeholder description, not locked yet


def edit(
    definition: Path,
    package: str,
    directory: Path,
    ctx: Context,
    *,
    with_stack: bool = False,
    platform: Platform | None = None,
) -> Edited:
    """The package's files from `platform`'s base (`ImageDefinition.one_platform`: else this host's, or
    the definition's first), into `directory`. The overlay is a source patch, the same for every
    platform; `save` diffs against the same platform's files and `lock` applies it to each."""
    if directory.exists() and any(directory.iterdir()):
        raise OverlayError(f"{directory} is not empty; nothing was written", hint="name a new directory")
    resolution = resolve(definition, ctx, platform=platform)
    (chosen,) = resolution.definition.platforms
    site = _site(resolution, package)
    stack = tuple(o.id for o in resolution.lock.overlays if o.package == package) if with_stack else ()
    stacked = {c.path: c.content for c in resolution.changes} if with_stack else {}
    files: dict[str, str] = {}
    directory.mkdir(parents=True, exist_ok=True)
    for path in sorted(resolution.fs.paths_below(f"{site}/{package}")):
        node = resolution.fs.lstat(path)
        if node is None or not node.is_file or "/__pycache__/" in f"/{path}" or path.endswith(SKIPPED):
            continue
        data = stacked[path] if path in stacked else resolution.fs.read(path)
        if data is None:
            continue  # deleted by an overlay of the stack
        rel = path[len(site) + 1 :]
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        files[rel] = sha256_hex(data)
    manifest = EditManifest(
        str(definition.resolve()),
        package,
        "/" + site,
        str(resolution.lock.base.manifest_digest),
        tuple(stack),
        files,
        str(chosen),
    )
    _write_manifest(directory, manifest)
    return Edited(directory, package, "/" + site, len(files), stack, chosen)


def save(
    definition: Path,
    package: str,
    directory: Path,
    overlay_id: str,
    ctx: Context,
    *,
    description: str | None = None,
    fixes: tuple[str, ...] = (),
    upstream: tuple[str, ...] = (),
) -> Saved:
    """The edits as overlays/PACKAGE/ID.patch, added to the definition and locked. Without `description`
    the entry gets the placeholder and the definition is not locked (lock and build refuse it until the
    description says what the overlay fixes). `fixes` and `upstream` are written into the entry, so no
    YAML is edited by hand; a fix needs a sentinel to be proven by, so one without is refused."""
    if description is not None and not description.strip():
        raise OverlayError("--description is empty", hint="say what the overlay fixes and why")
    bad = [f"--fixes {fix}: {fixid.why_not(fix)}" for fix in fixes if fixid.kind(fix) is None]
    bad += [f"--upstream {ref!r} is empty" for ref in upstream if not ref.strip()]
    if bad:
        raise OverlayError(f"{len(bad)} bad value(s); nothing was written", problems=bad, hint=fixid.HINT)
    manifest = _manifest(directory, package)
    changed = [rel for rel, sha in sorted(manifest.files.items()) if _changed(directory / rel, sha)]
    missing = [rel for rel in manifest.files if not (directory / rel).is_file()]
    if missing:
        raise OverlayError(
            f"{len(missing)} file(s) of the package were deleted in {directory}",
            problems=sorted(missing)[:20],
            hint="save writes modifications of installed files; write a deletion by hand "
            "(docs/getting-started.md)",
        )
    if not changed:
        raise OverlayError(
            f"no change in {directory}: nothing to save", hint="edit a file of the package first"
        )
    repo = definition.resolve().parent.parent
    patch_path = repo / "overlays" / package / f"{overlay_id}.patch"
    if patch_path.exists():
        raise OverlayError(
            f"{patch_path} exists; nothing was written",
            hint=f"choose another --id, or take the old overlay out first: servimg overlay drop {definition} "
            f"{overlay_id}",
        )
    resolution = resolve(definition, ctx, platform=Platform.optional(manifest.platform))
    site = _site(resolution, package)
    stacked = {c.path: c.content for c in resolution.changes}
    old = {rel: _before(resolution, stacked, f"{site}/{rel}", manifest) for rel in changed}
    patch = b"".join(_diff(rel, old[rel], (directory / rel).read_bytes()) for rel in changed)
    if not patch:
        raise OverlayError(
            f"no change in {directory}: the files are what the definition's overlays already make",
            hint="edit a file of the package first",
        )
    _refuse_what_does_not_compile(resolution, site, directory, changed, ctx.store)
    sentinels = _proposals(resolution, site, old, directory, changed, ctx.log)
    if fixes and not sentinels:
        raise OverlayError(
            f"--fixes {', '.join(fixes)}: no sentinel could be proposed for this change, and a fix is proven "
            "by its overlay's sentinels; nothing was written",
            hint="save without --fixes, add `sentinels:` to the entry by hand (docs/getting-started.md), "
            "then add `fixes:` and run `servimg lock`",
        )
    patch_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(patch_path, patch, 0o644)
    original = definition.read_bytes()
    try:
        _add_overlay(
            definition,
            overlay_id,
            package,
            patch_path.relative_to(repo),
            sha256_hex(patch),
            sentinels,
            description or PLACEHOLDER_DESCRIPTION,
            fixes=fixes,
            upstream=upstream,
        )
        lock_digest = None
        if description is not None:
            saved = ImageDefinition.load(definition)
            locked, _ = lock(definition, ctx, definition=saved)
            lock_digest = locked.digest
            remember(ctx.store.root, saved)
    except BaseException:
        atomic_write(definition, original, 0o644)  # nothing half-done: the definition as it was
        patch_path.unlink(missing_ok=True)
        raise
    # The tree is now what the stack, this overlay included, leaves: a second save of it is "no change".
    files = {**manifest.files, **{rel: sha256_hex((directory / rel).read_bytes()) for rel in changed}}
    _write_manifest(directory, replace(manifest, stack=(*manifest.stack, overlay_id), files=files))
    return Saved(patch_path, sha256_hex(patch), tuple(changed), sentinels, lock_digest)


def _yaml_scalar(text: str) -> str:
    """`text` as one YAML scalar on its line (JSON's string quoting is valid YAML)."""
    return json.dumps(text, ensure_ascii=False)


def _refuse_what_does_not_compile(
    resolution: Resolution, site: str, directory: Path, changed: list[str], store: BlobStore
) -> None:
    """Every edited Python file compiled by the image's own interpreter (as the build will) before
    anything is written: a file that does not compile is refused with its path in `directory`, its line
    and the interpreter's message, instead of a patch that only the build would reject."""
    jobs = [
        CompileJob(f"/{site}/{rel}", (directory / rel).read_bytes(), (0,))
        for rel in changed
        if rel.endswith(".py")
    ]
    if not jobs:
        return
    interp = resolution.lock.interpreter
    pinned = InterpreterFacts(interp.resolved, interp.version, interp.magic, interp.cache_tag)
    try:
        resolution.compiler.compile(
            store.root, resolution.base.diff_ids, resolution.runner, interp.path, pinned, jobs
        )
    except BytecodeError as exc:
        where = f"{directory}/"
        raise OverlayError(
            f"{len(exc.problems) or 'an'} edited file(s) do not compile with the image's interpreter "
            f"({interp.path}, Python {interp.version}); nothing was written",
            problems=[p.replace(f"/{site}/", where) for p in exc.problems],
            hint=f"fix the line named in {directory}, then run `servimg overlay save` again",
        ) from None


@dataclass(frozen=True)
class Dropped:
    overlay_id: str
    patch: Path | None  # the patch file removed (None: another overlay still names it)
    lock_digest: Digest
    remaining: tuple[str, ...]  # the definition's overlays now, in order


def drop(definition_path: Path, overlay_id: str, ctx: Context) -> Dropped:
    """Take overlay `overlay_id` out of a definition: its entry (the YAML edited in place), its patch file,
    and the lock, resolved again without it. Refused, with nothing changed, when the overlays after it no
    longer apply without it (their hunks depend on its lines)."""
    text = definition_path.read_text(encoding="utf-8")
    old = ImageDefinition.parse(text.encode(), origin=str(definition_path))
    ids = [o.id for o in old.overlays]
    if overlay_id not in ids:
        raise OverlayError(
            f"{definition_path} has no overlay {overlay_id!r}; nothing was changed",
            hint=f"its overlays: {', '.join(ids)}" if ids else "it has no overlays",
        )
    dropped = next(o for o in old.overlays if o.id == overlay_id)
    new = replace(old, overlays=tuple(o for o in old.overlays if o.id != overlay_id))
    new_text = definition_text(text, old, new)
    after = ids[ids.index(overlay_id) + 1 :]
    with scratch_definition(definition_path, new_text, "drop") as scratch:
        try:
            locked, _ = lock(scratch, ctx)
        except OverlayError as exc:
            raise OverlayError(
                f"cannot drop {overlay_id}: an overlay after it ({', '.join(after)}) no longer applies "
                "without it; nothing was changed",
                problems=[exc.message, *exc.problems],
                hint="drop the overlay that depends on it first (`servimg overlay drop DEFINITION ID`), "
                "or fold the two into one with `servimg overlay edit --with-stack` and `overlay save`",
            ) from None
        lock_bytes = lock_path_for(scratch).read_bytes()
    lock_path = lock_path_for(definition_path)
    previous_lock = lock_path.read_bytes() if lock_path.exists() else None
    # The lock first: a definition whose lock did not land is refused by the next build (its digest).
    atomic_write(lock_path, lock_bytes, 0o644)
    try:
        atomic_write(definition_path, new_text.encode("utf-8"), 0o644)
    except BaseException:
        if previous_lock is not None:
            atomic_write(lock_path, previous_lock, 0o644)
        raise
    repo = repo_root_for(definition_path)
    still_named = any(o.patch == dropped.patch for o in new.overlays)
    patch = None if still_named else repo / dropped.patch
    if patch is not None:
        patch.unlink(missing_ok=True)
    remember(ctx.store.root, new)
    return Dropped(overlay_id, patch, locked.digest, tuple(o.id for o in new.overlays))


@dataclass(frozen=True)
class EditManifest:
    """What `edit` unpacked (`.servimg-edit.json`): the definition and base it came from, the overlays
    already applied to the tree (`stack`), each file's sha256 as unpacked (or as last saved), and the
    platform whose base it is (absent from a manifest written before platforms: the definition's own)."""

    definition: str
    package: str
    site: str
    base: str
    stack: tuple[str, ...]
    files: dict[str, str]
    platform: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "definition": self.definition,
            "package": self.package,
            "site": self.site,
            "base": self.base,
            "stack": list(self.stack),
            "files": dict(self.files),
            "platform": self.platform,
        }

    @classmethod
    def from_json(cls, doc: object) -> EditManifest:
        d = jv.obj(doc, MANIFEST)
        files = jv.obj(d.get("files") or {}, "files")
        return cls(
            jv.text(d.get("definition"), "definition"),
            jv.text(d.get("package"), "package"),
            jv.text(d.get("site"), "site"),
            jv.text(d.get("base"), "base"),
            tuple(jv.texts(d.get("stack") or [], "stack")),
            {rel: jv.text(sha, f"files.{rel}") for rel, sha in files.items()},
            jv.optional_text(d.get("platform"), "platform"),
        )


def _write_manifest(directory: Path, manifest: EditManifest) -> None:
    text = json.dumps(manifest.to_json(), indent=1, sort_keys=True) + "\n"
    atomic_write(directory / MANIFEST, text.encode(), 0o644)


def _site(resolution: Resolution, package: str) -> str:
    for pkg in resolution.lock.packages:
        if pkg.import_name == package:
            return pkg.site_packages.lstrip("/")
    raise OverlayError(
        f"{package!r} is not a package of {resolution.definition.name}",
        hint=f"one of: {', '.join(p.import_name for p in resolution.lock.packages)}",
    )


def _manifest(directory: Path, package: str) -> EditManifest:
    try:
        manifest = EditManifest.from_json(json.loads((directory / MANIFEST).read_text()))
    except (OSError, ValueError, jv.JsonShapeError):
        raise OverlayError(
            f"{directory} has no readable {MANIFEST}",
            hint="make the directory with `servimg overlay edit` first",
        ) from None
    if manifest.package != package:
        raise OverlayError(f"{directory} holds package {manifest.package!r}, not {package!r}")
    return manifest


def _changed(path: Path, sha: str) -> bool:
    return path.is_file() and sha256_hex(path.read_bytes()) != sha


def _before(
    resolution: Resolution, stacked: dict[str, bytes | None], path: str, manifest: EditManifest
) -> bytes:
    """The bytes the new patch applies to: after the overlays before it (the whole stack of this package,
    when the tree was edited with it), else the base's."""
    if manifest.stack and path in stacked and stacked[path] is not None:
        return stacked[path] or b""
    return resolution.fs.read(path)


def _diff(rel: str, old: bytes, new: bytes) -> bytes:
    """One file's unified diff with a/ and b/ roots (diff(1): exact, with its no-newline markers)."""
    with tempfile.TemporaryDirectory(prefix="servimg-diff-") as tmp:
        a, b = Path(tmp, "a"), Path(tmp, "b")
        a.write_bytes(old)
        b.write_bytes(new)
        done = subprocess.run(
            ["diff", "-u", "--label", f"a/{rel}", "--label", f"b/{rel}", str(a), str(b)],
            capture_output=True,
            check=False,
        )
    if done.returncode == 0:
        return b""  # the same bytes: nothing for this file
    if done.returncode != 1:
        raise OverlayError(f"diff of {rel} failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def _proposals(
    resolution: Resolution,
    site: str,
    old: dict[str, bytes],
    directory: Path,
    changed: list[str],
    log: Log,
) -> tuple[Sentinel, ...]:
    """Names the changed functions gain, absent from the base's module (asked of the image's interpreter)."""
    candidates: list[Sentinel] = []
    sources: dict[str, bytes] = {}
    for rel in changed:
        module = module_name(f"/{site}/{rel}", f"/{site}")
        if module is None:
            continue
        before, after = _names(old[rel]), _names((directory / rel).read_bytes())
        for qualname, names in sorted(after.items()):
            for name in sorted(names - before.get(qualname, set()) - set(dir(builtins))):
                candidates.append(Sentinel(module, qualname, name=name, absent_in_base=True))
        base = resolution.fs.read_or_none(f"{site}/{rel}")
        if base is not None:
            sources[module] = base
    if not candidates:
        return ()
    verdicts = base_sentinel_verdicts_in_image(
        resolution.runner, resolution.lock.interpreter.path, sources, candidates
    )
    absent = [c for c in candidates if not verdicts.get(sentinel_key(c), True)]
    best = sorted(absent, key=lambda s: (not str(s.name).startswith("_servimg"), len(str(s.name))))
    log(f"sentinels proposed: {', '.join(f'{s.qualname}:{s.name}' for s in best[:3]) or 'none'}")
    return tuple(best[:1])


def _names(source: bytes) -> dict[str, set[str]]:
    """co_names per qualname (nested code included), compiled on the host for the proposal only; the
    proposal is then checked in the image (a source the host cannot compile proposes nothing)."""
    try:
        code = compile(source, "<edited>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return {}
    out: dict[str, set[str]] = {}
    stack = [code]
    while stack:
        current = stack.pop()
        if current is not code:
            out.setdefault(current.co_qualname, set()).update(current.co_names)
        stack += [c for c in current.co_consts if hasattr(c, "co_code")]
    return out


def _add_overlay(
    definition: Path,
    overlay_id: str,
    package: str,
    patch: Path,
    sha: str,
    sentinels: tuple[Sentinel, ...],
    description: str,
    *,
    fixes: tuple[str, ...] = (),
    upstream: tuple[str, ...] = (),
) -> None:
    """Add the overlay to the definition's text (its comments and order kept) and check it parses."""
    text = definition.read_text()
    # The entry is indented as the list's entries are: `  - id:` by hand, `- id:` as PyYAML writes it
    # (an entry indented otherwise would read as part of the last entry's last key).
    dash = re.search(r"^overlays:[^\n]*\n(?:[ \t]*(?:#[^\n]*)?\n)*( *)- ", text, re.MULTILINE)
    pad = dash[1] if dash is not None else "  "
    entry = [
        f"- id: {overlay_id}",
        f"  package: {package}",
        f"  patch: {patch}",
        f"  sha256: {sha}",
        f"  description: {_yaml_scalar(description)}",
    ]
    if upstream:
        entry.append(f"  upstream: [{', '.join(_yaml_scalar(u) for u in upstream)}]")
    if fixes:
        entry.append(f"  fixes: [{', '.join(_yaml_scalar(f) for f in fixes)}]")
    if sentinels:
        entry.append("  sentinels:")
        for s in sentinels:
            entry += [
                f"    - module: {s.module}",
                f"      qualname: {s.qualname}",
                f"      name: {s.name}",
                "      absent_in_base: true",
            ]
    block = "".join(f"{pad}{line}\n" for line in entry)
    if re.search(r"^overlays: *\[\] *$", text, re.MULTILINE):
        text = re.sub(
            r"^overlays: *\[\] *$", "overlays:\n" + block.rstrip("\n"), text, count=1, flags=re.MULTILINE
        )
    elif re.search(r"^overlays:", text, re.MULTILINE):
        lines = text.splitlines(keepends=True)
        start = next(i for i, line in enumerate(lines) if line.startswith("overlays:"))
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "#", "-")),
            len(lines),
        )
        while end > start + 1 and lines[end - 1].strip().startswith("#"):
            end -= 1  # comments before the next key belong to it
        text = "".join([*lines[:end], block, *lines[end:]])
    else:
        text = text.rstrip("\n") + "\noverlays:\n" + block
    parsed = ImageDefinition.parse(text, origin=str(definition))
    if not any(o.id == overlay_id for o in parsed.overlays):
        raise OverlayError(
            f"{definition}: could not add overlay {overlay_id} to its `overlays:`",
            hint="add the entry by hand; the patch and its sha256 are in the output",
        )
    atomic_write(definition, text.encode(), 0o644)
