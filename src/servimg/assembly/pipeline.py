"""lock and build: definition ─resolve─▶ lock; plan ─build─▶ layer ─▶ image(s) ─proof─▶ sink
(docs/architecture.md, "The main data path").

`resolve` computes every fact the lock pins from the real inputs (base layers, overlay files, the
image's interpreter), per platform. `lock` writes those facts; `build(plan, ctx)` resolves again,
refuses any drift from the lock the plan read, assembles one deterministic overlay layer per platform
and hands the release to the sink, which publishes only after the whole probe proved every image.
"""

from __future__ import annotations

import datetime as dt
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from servimg.assembly.basescan import find_package, interpreter_lock, sentinels_in_base
from servimg.assembly.context import Context
from servimg.assembly.plan import BuildPlan
from servimg.assembly.platforms import (
    BytecodeComparison,
    child_labels,
    compare_bytecode,
    index_annotations,
)
from servimg.assembly.release import PlatformImage, ProvenRelease, Release, keep_in_store
from servimg.assembly.seams import Compiler, choose_sandboxes
from servimg.backends.target import Holds
from servimg.core import canonical
from servimg.core.context import Log
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import DefinitionError, LockError, OverlayError, ServimgError
from servimg.core.platform import Platform
from servimg.definitions import naming
from servimg.definitions.definition import ImageDefinition, OverlaySpec, repo_root_for
from servimg.definitions.lock import (
    BaseLock,
    FileLock,
    LadderLock,
    Lock,
    OverlayLock,
    PackageLock,
    lock_path_for,
)
from servimg.definitions.platformlock import Locks, PlatformLocks
from servimg.ladder.loading import load as load_ladder
from servimg.ladder.witness import WITNESS_DIR, witness_files
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import DOCKER_LAYER, DOCKER_MANIFEST, Descriptor, Image, Layer
from servimg.oci.index import ImageIndex
from servimg.oci.layer import Entry, Kind, write_layer
from servimg.oci.store import BlobStore
from servimg.patching import emulation
from servimg.patching.bytecode import (
    CompileJob,
    InterpreterFacts,
    Runner,
    pyc_path,
    stale_pycs,
)
from servimg.patching.overlay import apply_patch
from servimg.patching.patch import Patch
from servimg.proof.sentinels import base_sources
from servimg.proof.verifier import ProbeRoute, verify_or_refuse
from servimg.proof.verify import probe_files, probe_spec

SERVIMG_DIR = "opt/servimg"


@dataclass(frozen=True)
class Change:
    """The final state of one file the overlays touched (content None = deleted)."""

    path: str
    content: bytes | None
    mode: int


@dataclass(frozen=True)
class Resolution:
    definition: ImageDefinition
    definition_path: Path
    base: Image
    fs: LayeredFS
    lock: Lock
    changes: tuple[Change, ...]
    runner: Runner
    # The bundled ladder's files by image path (definition `ladder:`), verified against the lock.
    ladder_files: Mapping[str, bytes]
    # How the built image is probed: chosen with the runner, once, when the build resolves.
    probe: ProbeRoute
    # How the overlay's sources become bytecode (seams.compiler: the compile cache behind it).
    compiler: Compiler


@dataclass(frozen=True)
class BuildResult:
    """What one build made: one image, or one per platform and the index over them."""

    images: tuple[PlatformImage, ...]
    index: ImageIndex | None
    digest: Digest  # what the tag names: the one image's manifest, or the index's
    tag: str
    lock_digest: Digest
    destination: str
    changed_files: int  # files the overlays changed (per platform: the same overlays on each)
    layers: tuple[Descriptor, ...]  # each image's overlay layer, in `images` order
    bytecode: BytecodeComparison | None = None  # several platforms: did their interpreters agree?

    def as_dict(self) -> dict[str, object]:
        common = {"tag": self.tag, "lock_digest": str(self.lock_digest), "destination": self.destination}
        if self.index is None:
            (one,) = self.images
            return {
                "digest": str(one.image.digest),
                "config_digest": str(one.image.config_digest),
                **common,
                "changed_files": self.changed_files,
                "layer": self.layers[0].to_json(),
            }
        return {
            "digest": str(self.index.digest),
            "media_type": self.index.media_type,
            **common,
            "platforms": {
                str(c.platform): {"digest": str(c.image.digest), "config_digest": str(c.image.config_digest)}
                for c in self.images
            },
            "bytecode": self.bytecode.as_dict() if self.bytecode is not None else None,
        }


# -- resolve --------------------------------------------------------------------------------------
def resolve(
    definition_path: Path,
    ctx: Context,
    runner: str = "auto",
    *,
    definition: ImageDefinition | None = None,
    platform: Platform | None = None,
) -> Resolution:
    """Stage 1 for one platform: definition + base (from the context's `seams.base_source`) → the
    resolution, with that platform's lock. `definition`: the caller's read of it (else it is read);
    `platform`: which of its platforms (`ImageDefinition.one_platform`: else this host's, else the
    first). `resolve_all` resolves every one."""
    definition = (definition or ImageDefinition.load(definition_path)).one_platform(platform)
    store, seams = ctx.store, ctx.seams
    base, index = _fetch_base(definition, ctx)
    fs = base_fs(base, store)
    packages = tuple(
        find_package(fs, name, spec.distribution, spec.version)
        for name, spec in sorted(definition.packages.items())
    )
    sandboxes = choose_sandboxes(seams, runner, base, fs, store)
    chosen = sandboxes.runner
    interpreter = interpreter_lock(definition, fs, base, packages, chosen, ctx)
    repo_root = repo_root_for(definition_path)  # overlay and ladder paths are relative to it
    overlays, changes = _apply_overlays(definition, repo_root, fs, packages)
    lock = Lock(
        name=definition.name,
        definition_sha256=definition.digest.hex,
        base=BaseLock(
            definition.base.ref,
            base.digest,
            base.config_digest,
            tuple(base.diff_ids),
            str(base.config.get("created", "")),
            index,
        ),
        interpreter=interpreter,
        packages=packages,
        overlays=overlays,
        source_date_epoch=_source_date_epoch(definition, base),
    )
    lock = _with_base_verdicts(lock, definition, fs, store, chosen)
    ladder_lock, ladder_files = _ladder(definition, repo_root)
    lock = replace(lock, ladder=ladder_lock)
    return Resolution(
        definition,
        definition_path,
        base,
        fs,
        lock,
        changes,
        chosen,
        ladder_files,
        sandboxes.probe,
        seams.compiler,
    )


def base_fs(base: Image, store: BlobStore) -> LayeredFS:
    """The base's merged filesystem through the layer and chain indexes cached in the store (docs/
    architecture.md, "Indexes"): a build of a cached base reads no tar headers."""
    return LayeredFS.of_layers(base.layers, store, keep_chain=True)


def _ladder(definition: ImageDefinition, repo_root: Path) -> tuple[LadderLock | None, dict[str, bytes]]:
    """The definition's `ladder:`: validated with its sha256-pinned probe set, locked by hash,
    and carried under /opt/servimg/ladder/ so the tag carries its own smoke test. None without one."""
    if definition.ladder is None:
        return None, {}
    try:
        loaded = load_ladder(repo_root / definition.ladder, root=repo_root)
    except ServimgError as exc:
        raise exc.context(f"ladder {definition.ladder}") from None
    locked = LadderLock(
        definition.ladder,
        loaded.ladder_sha256,
        loaded.definition.probes.path,
        loaded.probes_sha256,
    )
    image_dir = locked.image_dir.strip("/")
    files = {
        f"{image_dir}/{loaded.ladder_path.name}": loaded.ladder_bytes,
        f"{image_dir}/{loaded.probes_path.name}": loaded.probes_bytes,
    }
    if loaded.instrument_path is not None:  # data beside the ladder, on no Python path of the image
        files[f"{image_dir}/{loaded.instrument_path.name}"] = loaded.instrument_bytes
    return locked, files


def _with_base_verdicts(
    lock: Lock, definition: ImageDefinition, fs: LayeredFS, store: BlobStore, runner: Runner
) -> Lock:
    """Record, per overlay, the `absent_in_base` sentinels verified missing from the BASE's code. A sentinel
    the base already has does not discriminate (vLLM 0.33.0 adopted `supports_divergent_local_hybrid_hits`):
    a grep or co_names check would pass on an unpatched image, so refuse to lock it."""
    overlays = []
    for spec, locked in zip(definition.overlays, lock.overlays, strict=True):
        wanted = [s for s in spec.sentinels if s.absent_in_base]
        sources = base_sources(lock, wanted, lambda p: fs.read_or_none(p.lstrip("/")))
        verdicts = sentinels_in_base(store, sources, wanted, runner, lock.interpreter)
        present = sorted(key for key, has in verdicts.items() if has)
        if present:
            raise DefinitionError(
                f"overlay {spec.id}: sentinel(s) already present in the base: {', '.join(present)}",
                hint="upstream adopted the name, so it proves nothing; choose a sentinel the base lacks, "
                "or set absent_in_base: false",
            )
        overlays.append(replace(locked, sentinels_absent_in_base=tuple(sorted(verdicts))))
    return replace(lock, overlays=tuple(overlays))


def _fetch_base(definition: ImageDefinition, ctx: Context) -> tuple[Image, Digest | None]:
    """The base image (from the context's `seams.base_source`), and the index digest when the pin names
    a multi-platform index."""
    source = ctx.seams.base_source
    pinned = definition.base.manifest_digest
    index: Digest | None = None
    try:
        if definition.base.target.holds(Holds.INDEX):
            platform = source.platform_manifest(definition.base.ref, pinned, definition.base.platform)
            index, pinned = (pinned, platform) if platform != pinned else (None, pinned)
        base = source.fetch(definition.base.ref, ctx, expected=pinned)
    except ServimgError as exc:
        raise exc.context(f"fetching base {definition.base.ref}") from None
    if base.digest != pinned:
        raise DefinitionError(
            f"base {definition.base.ref} has manifest digest {base.digest}, the definition pins {pinned}",
            hint="the base changed under its name; pin the new digest in base.digest deliberately "
            "(then `servimg lock`), or restore the pinned base",
        )
    _refuse_another_platform(definition, base)
    return base, index


def _refuse_another_platform(definition: ImageDefinition, base: Image) -> None:
    """The base must be an image for the platform it is resolved for: a multi-platform definition whose
    pin names one image (or a platform's own base of another architecture) would otherwise lock and
    label one architecture's files as another's. A config that names no architecture is not judged."""
    (wanted,) = definition.platforms
    found = Platform.of_config(base.config)
    if found.architecture and found != wanted:
        raise DefinitionError(
            f"base {definition.base.ref} ({base.digest.short}) is a {found} image; {definition.name} "
            f"resolves it for {wanted}",
            hint=f"pin a base built for {wanted} (a multi-platform index names one per platform), or set "
            f"base.platform to {found}",
        )


def _source_date_epoch(definition: ImageDefinition, base: Image) -> int:
    if isinstance(definition.source_date_epoch, int):
        return definition.source_date_epoch
    created = str(base.config.get("created") or "")
    try:
        return int(dt.datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp())
    except ValueError:
        raise DefinitionError(
            f"source_date_epoch: base: the base config has no usable `created` ({created!r})",
            hint="set source_date_epoch to an integer in the definition",
        ) from None


# -- overlays -------------------------------------------------------------------------------------
def _apply_overlays(
    definition: ImageDefinition, repo_root: Path, fs: LayeredFS, packages: tuple[PackageLock, ...]
) -> tuple[tuple[OverlayLock, ...], tuple[Change, ...]]:
    state: dict[str, bytes | None] = {}
    modes: dict[str, int] = {}
    locks = []
    sites = {p.import_name: p.site_packages.lstrip("/") for p in packages}
    for index, spec in enumerate(definition.overlays):
        try:
            locks.append(_apply_one(spec, repo_root, fs, sites[spec.package], state, modes))
        except ServimgError as exc:
            raise exc.context(f"applying overlay {spec.id} (overlays[{index}])") from None
    changes = tuple(Change(p, state[p], modes[p]) for p in sorted(state))
    return tuple(locks), changes


def read_patch(spec: OverlaySpec, repo_root: Path) -> tuple[str, Patch]:
    """An overlay's patch (its sha256 hex, parsed), refused unless it hashes to the definition's pin."""
    patch_path = (repo_root / spec.patch).resolve()
    try:
        data = patch_path.read_bytes()
    except OSError as exc:
        raise OverlayError(
            f"cannot read {spec.patch}: {exc.strerror}",
            hint="patch paths are relative to the repository root (overlays/<package>/<id>.patch)",
        ) from None
    actual = sha256_hex(data)
    if actual != spec.sha256:
        raise OverlayError(
            f"{spec.patch} has sha256 {actual}, the definition pins {spec.sha256}",
            hint=f"if you changed the patch on purpose, set sha256: {actual} and run `servimg lock`",
        )
    return actual, Patch.parse(data, strip=spec.strip)


def _apply_one(
    spec: OverlaySpec,
    repo_root: Path,
    fs: LayeredFS,
    site: str,
    state: dict[str, bytes | None],
    modes: dict[str, int],
) -> OverlayLock:
    actual, patch = read_patch(spec, repo_root)
    package_root = fs.resolve(f"{site}/{spec.package}")

    def image_path(rel: str) -> str:
        resolved = fs.resolve(f"{site}/{rel}")
        if not (resolved + "/").startswith(package_root + "/"):
            raise OverlayError(
                f"{rel} resolves to /{resolved}, outside the package root /{package_root}",
                hint="a symlink in the base redirects this path; refusing to write through it",
            )
        return resolved

    def read(rel: str) -> bytes | None:
        path = image_path(rel)
        return state[path] if path in state else fs.read_or_none(path)

    touched = sorted({p for f in patch.files for p in (f.old_path, f.new_path) if p})
    before = {image_path(rel): read(rel) for rel in touched}
    applied = apply_patch(patch, read, spec.package)
    files = []
    for result in applied:
        path = image_path(result.path)
        node = fs.lstat(path)
        modes.setdefault(path, (node.mode & 0o777) if node is not None and node.is_file else 0o644)
        state[path] = result.content
        pre = before.get(path, fs.read_or_none(path))
        files.append(
            FileLock(
                "/" + path,
                None if pre is None else sha256_hex(pre),
                None if result.content is None else sha256_hex(result.content),
                modes[path],
            )
        )
    files_locked = tuple(sorted(files, key=lambda f: f.path))
    return OverlayLock(spec.id, spec.package, spec.patch, actual, files_locked, fixes=spec.fixes)


# -- lock -----------------------------------------------------------------------------------------
def resolve_all(
    definition: ImageDefinition, definition_path: Path, ctx: Context, runner: str = "auto"
) -> dict[Platform, Resolution]:
    """Every platform the definition builds, resolved as its own single-platform definition (one entry for
    a single-platform definition). Every emulator is checked before the first platform starts."""
    for platform in definition.platforms:
        emulation.require(platform, f"resolving {definition.name}")
    resolutions = {}
    for platform in definition.platforms:
        ctx.log(f"{definition.name}: {platform}" + (" (under qemu emulation)" if platform.emulated else ""))
        try:
            resolutions[platform] = resolve(
                definition_path, ctx, runner, definition=definition, platform=platform
            )
        except ServimgError as exc:
            raise exc.context(f"platform {platform}") from None
    return resolutions


def lock_of(definition: ImageDefinition, resolutions: Mapping[Platform, Resolution]) -> Locks:
    """The lock the resolutions make: one platform's, or one over every platform's."""
    return Locks.made(definition, {platform: r.lock for platform, r in resolutions.items()})


def locks_for(
    definition_path: Path, ctx: Context, runner: str = "auto", *, definition: ImageDefinition | None = None
) -> Locks:
    """The lock every platform's resolution makes, written nowhere (`lock` writes it)."""
    definition = definition or ImageDefinition.load(definition_path)
    return lock_of(definition, resolve_all(definition, definition_path, ctx, runner))


def lock(
    definition_path: Path,
    ctx: Context,
    runner: str = "auto",
    *,
    definition: ImageDefinition | None = None,
) -> tuple[Lock | PlatformLocks, bool]:
    """Resolve every platform and write the lock. Returns (lock, changed?). Nothing is written if any
    platform fails to resolve."""
    definition = definition or ImageDefinition.load(definition_path)
    definition.refuse_placeholders(str(definition_path))
    locked = locks_for(definition_path, ctx, runner, definition=definition).written
    path = lock_path_for(definition_path)
    previous = path.read_bytes() if path.exists() else None
    locked.write(path)
    return locked, previous != path.read_bytes()


# -- build ----------------------------------------------------------------------------------------
def build(plan: BuildPlan, ctx: Context) -> BuildResult:
    """Build `plan` as locked, every step in this run: resolve every platform, refuse any drift from the
    written lock, assemble each image; the sink stages what makes nothing visible while the whole probe
    proves every image, and publishes the `ProvenRelease` only that proof makes (a failed proof discards
    what was staged). One platform makes an image; several make an image each and the index over them,
    its name last."""
    sink = ctx.seams.sink
    sink.check(plan.target)
    resolutions = resolve_all(plan.definition, plan.definition_path, ctx, plan.runner)
    _refuse_drift(plan, lock_of(plan.definition, resolutions))
    built = tuple(_assembled(plan, platform, resolution, ctx) for platform, resolution in resolutions.items())
    images = tuple(image for image, _ in built)
    index, comparison, over = None, None, plan.lock.index
    if over is not None:  # several platforms: the index over their images
        comparison = compare_bytecode(images, ctx.store)
        ctx.log(f"bytecode: {comparison.summary()}")
        index = ImageIndex.of({c.platform: c.image for c in images}, index_annotations(plan.definition, over))
    release = Release(images, index, plan.target, plan.full_tag, plan.engine_platform)
    if not plan.verify:  # a rebuild comparing digests: no proof, so nothing is published
        destination, built_images = keep_in_store(release, ctx.store), images
    else:
        staged = sink.stage(release, ctx)
        try:
            proven = ProvenRelease(release, _prove(images, resolutions, ctx))
        except BaseException:
            if staged is not None:
                staged.discard()
            raise
        destination, built_images = sink.publish(proven, staged, ctx), proven.images
    changed = len(plan.lock_for(plan.platforms[0]).changed_files)
    return BuildResult(
        built_images,
        index,
        release.named.digest,
        plan.tag,
        plan.lock.digest,
        destination,
        changed,
        tuple(layer for _, layer in built),
        comparison,
    )


def _refuse_drift(plan: BuildPlan, actual: Locks) -> None:
    definitions = (plan.locked_definition, plan.definition.to_json())
    plan.lock.check_drift(actual, plan.definition_path, definitions)


def _assembled(
    plan: BuildPlan, platform: Platform, resolution: Resolution, ctx: Context
) -> tuple[PlatformImage, Descriptor]:
    """One platform's image as resolved: its overlay layer planned, compiled and written."""
    over = plan.lock.index  # a child of an index names the lock over it and its platform
    labels = child_labels(over, platform) if over is not None else None
    try:
        image, layer = assemble(resolution, plan.lock_for(platform), ctx, labels)
    except ServimgError as exc:
        raise exc.context(f"platform {platform}") from None
    ctx.log(f"{platform}: {image.digest}")
    return PlatformImage(platform, image, None, resolution.base.config_digest), layer


def _prove(
    images: tuple[PlatformImage, ...],
    resolutions: Mapping[Platform, Resolution],
    ctx: Context,
) -> tuple[PlatformImage, ...]:
    """The whole probe over each image's own filesystem, now (nothing cached or merged): each image with
    its passing report, or VerifyFailed."""
    proven = []
    for child in images:
        try:
            report = verify_or_refuse(
                ctx.seams.verifier,
                child.image,
                ctx,
                base_config=child.base_config,
                consequence="nothing was published",
                probe=resolutions[child.platform].probe,
            )
        except ServimgError as exc:
            raise exc.context(f"platform {child.platform}") from None
        proven.append(replace(child, report=report))
    return tuple(proven)


def assemble(
    resolution: Resolution, locked: Lock, ctx: Context, extra_labels: Mapping[str, str] | None = None
) -> tuple[Image, Descriptor]:
    """Plan the overlay layer, compile bytecode with the image's interpreter, write the layer, return the
    new image (a value: the base is unchanged). `extra_labels`: a platform image's tie to its index's
    lock (`assembly.platforms`)."""
    store, log = ctx.store, ctx.log
    entries = plan_layer(resolution, locked, log, store.root)
    tmp = store.layout.tmp
    tmp.mkdir(exist_ok=True)
    # One name per process: concurrent builds of the same lock must not move each other's layer file.
    written = tmp / f"layer-{locked.digest.hex}-{os.getpid()}"
    try:
        blob = write_layer(
            entries, written, mtime=locked.source_date_epoch, through=lambda raw: store.tap(tmp, raw)
        )
        store.adopt(written, blob.digest)
    finally:
        written.unlink(missing_ok=True)
    docker_media = resolution.base.media_type == DOCKER_MANIFEST
    descriptor = Descriptor(DOCKER_LAYER if docker_media else blob.media_type, blob.digest, blob.size)
    created = dt.datetime.fromtimestamp(locked.source_date_epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    tag = naming.derive_tag(resolution.definition, locked)
    image = resolution.base.with_layer(
        Layer(descriptor, blob.diff_id),
        labels={**naming.labels(resolution.definition, locked, tag, created), **(extra_labels or {})},
        created=created,
        history=f"servimg build {resolution.definition.name} "
        f"overlays={','.join(o.id for o in locked.overlays) or '-'}",
    )
    return image, descriptor


def plan_layer(resolution: Resolution, locked: Lock, log: Log, cache_root: Path) -> list[Entry]:
    """Every entry of the overlay layer: patched files, fresh CHECKED_HASH pycs at each optimisation level
    the base carried, whiteouts for deleted files and every stale pyc, the lock and a changes manifest."""
    fs, interp = resolution.fs, locked.interpreter
    spec = probe_spec(locked, resolution.definition, layer=True)  # once: the witness spec derives from it
    files: dict[str, Entry] = {}
    jobs = []
    for change in resolution.changes:
        if change.content is None:
            files[change.path] = Entry(change.path, Kind.WHITEOUT)
        else:
            files[change.path] = Entry(change.path, Kind.FILE, change.mode, data=change.content)
        if change.path.endswith(".py"):
            for stale in stale_pycs(fs, change.path, interp.pycache_prefix):
                files[stale] = Entry(stale, Kind.WHITEOUT)
            if change.content is not None:
                jobs.append(CompileJob("/" + change.path, change.content, interp.opt_levels))
    # Witness (opt-in, `witness: true`): the hook module (compiled like a patched source), its .pth and
    # spec (servimg.ladder.witness), and a world-writable witness dir for the serving processes' records.
    if resolution.definition.witness:
        for path, data in witness_files(spec).items():
            files[path] = Entry(path, Kind.FILE, 0o644, data=data)
            if path.endswith(".py"):
                files.update(
                    {s: Entry(s, Kind.WHITEOUT) for s in stale_pycs(fs, path, interp.pycache_prefix)}
                )
                jobs.append(CompileJob("/" + path, data, interp.opt_levels))
        files[WITNESS_DIR.lstrip("/")] = Entry(WITNESS_DIR.lstrip("/"), Kind.DIR, 0o1777)
    if jobs:
        log(
            f"compiling {len(jobs)} file(s) × {len(interp.opt_levels)} opt level(s) with {interp.path} "
            f"({resolution.runner.name} runner)"
        )
        pinned = InterpreterFacts(interp.resolved, interp.version, interp.magic, interp.cache_tag)
        facts, pycs = resolution.compiler.compile(
            cache_root, resolution.base.diff_ids, resolution.runner, interp.path, pinned, jobs
        )
        _check_interpreter(facts, locked)
        for (source, opt), data in sorted(pycs.items()):
            path = pyc_path(source.lstrip("/"), interp.cache_tag, opt)
            files[path] = Entry(path, Kind.FILE, 0o644, data=data)
    # The bundled ladder (nothing without `ladder:`), listed in the changes manifest like every
    # other file the layer adds, so `servimg check` re-derives the same set from the layer.
    for path, data in resolution.ladder_files.items():
        files[path] = Entry(path, Kind.FILE, 0o644, data=data)
    manifest = [
        {
            "path": "/" + e.path,
            "kind": e.kind.value,
            "mode": e.mode,
            "sha256": sha256_hex(e.data) if e.data is not None else None,
        }
        for e in files.values()
    ]
    servimg_files = {
        f"{SERVIMG_DIR}/lock.json": locked.canonical_bytes(),
        f"{SERVIMG_DIR}/definition.json": resolution.definition.canonical_bytes(),
        f"{SERVIMG_DIR}/changes.json": canonical.dumps(sorted(manifest, key=lambda m: str(m["path"]))),
    }
    servimg_files.update(probe_files(spec))
    for path, data in servimg_files.items():
        files[path] = Entry(path, Kind.FILE, 0o644, data=data)
    return [*files.values(), *_parents(fs, files)]


def _check_interpreter(facts: InterpreterFacts, locked: Lock) -> None:
    if (facts.magic, facts.cache_tag, facts.version) != (
        locked.interpreter.magic,
        locked.interpreter.cache_tag,
        locked.interpreter.version,
    ):
        raise LockError(
            f"the image's interpreter is {facts.version} (magic {facts.magic}), the lock says "
            f"{locked.interpreter.version} (magic {locked.interpreter.magic})",
            hint="run `servimg lock` to re-resolve the interpreter",
        )


def _parents(fs: LayeredFS, files: Mapping[str, Entry]) -> list[Entry]:
    """Explicit directory entries (with the base's modes) so unpacking never invents directory metadata."""
    dirs: set[str] = set()
    for path in files:
        parent = posixpath.dirname(path)
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    out = []
    for d in sorted(dirs):
        node = fs.lstat(d)
        out.append(Entry(d, Kind.DIR, node.mode if node is not None and node.is_dir else 0o755))
    return out
