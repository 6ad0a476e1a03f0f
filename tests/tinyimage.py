"""The tiny test image on two interpreters, and defects planted into it layer by layer.

`build_tiny` locks and builds tests/fixtures/images/tiny.yaml (one overlay on `tinypkg`) against the local
test base of one Debian release (src/servimg/bases/tiny.py: bookworm = python3.11, trixie = python3.13),
exactly as a user would with `servimg lock` + `servimg build`. `plant` then adds ONE small layer on top
of that clean image, written with `servimg.oci.layer.write_layer` and appended with `Image.with_layer`, as a
broken Dockerfile step would leave it (a COPY of a stale pyc, a vendored copy of the package, an ENV or
CMD line), and loads it into the engine (thin: only the new layer travels).

Stale bytecode is compiled by the IMAGE's own interpreter (`compile_in_image`, a throwaway container),
from the BASE's unpatched source: what a pyc left over from before the overlay holds.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import posixpath
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fakebase import HOST_SEAMS, on_host
from servimg.assembly.context import Context
from servimg.assembly.pipeline import build, lock
from servimg.assembly.plan import BuildPlan
from servimg.backends import engine
from servimg.backends.target import Target
from servimg.bases import catalog as bases
from servimg.bases.assemble import base_image
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import Lock
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Descriptor, Image, Layer
from servimg.oci.layer import Entry, Kind, write_layer
from servimg.oci.store import BlobStore

FIXTURES = Path(__file__).resolve().parent / "fixtures"

_COMPILE = r"""
import json, os, py_compile, sys
for job in json.load(open(sys.argv[1])):
    src = "/work/src/%s.py" % job["name"]
    with open(src, "w") as fh:
        fh.write(job["source"])
    if job.get("stat_like"):  # record the mtime of the image's file (as a pyc made beside it would)
        st = os.stat(job["stat_like"])
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    mode = getattr(py_compile.PycInvalidationMode, job["mode"])
    py_compile.compile(src, cfile="/work/out/%s.pyc" % job["name"], dfile=job["dfile"], doraise=True,
                       optimize=job["opt"], invalidation_mode=mode)
"""


@dataclass
class Tiny:
    """One clean tiny image (built by servimg) and what the planted-defect tests need to know about it."""

    suite: str
    store: BlobStore
    root: Path
    definition_path: Path
    definition: ImageDefinition
    lock: Lock
    image: Image
    base: Image
    python: str
    tag: str
    planted: list[str] = field(default_factory=list)
    pycs: dict[str, bytes] = field(default_factory=dict)  # stale bytecode made by the image's interpreter

    @property
    def interpreter(self) -> str:
        return self.lock.interpreter.path

    @property
    def cache_tag(self) -> str:
        return self.lock.interpreter.cache_tag

    @property
    def site(self) -> str:
        return self.lock.package("tinypkg").site_packages

    @property
    def pkg(self) -> str:
        return f"{self.site}/tinypkg"

    @property
    def core(self) -> str:
        return f"{self.pkg}/core.py"

    def pyc(self, source: str, opt: int = 0, prefix: str | None = None) -> str:
        directory, name = posixpath.split(source)
        cached = f"{name[:-3]}.{self.cache_tag}{'' if opt == 0 else f'.opt-{opt}'}.pyc"
        if prefix is not None:
            return f"{prefix}{directory}/{cached}"
        return f"{directory}/__pycache__/{cached}"

    def base_source(self, path: str) -> bytes:
        """A file as the BASE image has it (before the overlay)."""
        store = self.store
        fs = LayeredFS([store.uncompressed(x.descriptor.digest, x.diff_id) for x in self.base.layers])
        return fs.read(path.lstrip("/"))

    def image_source(self, path: str) -> bytes:
        store = self.store
        fs = LayeredFS([store.uncompressed(x.descriptor.digest, x.diff_id) for x in self.image.layers])
        return fs.read(path.lstrip("/"))


def prepare_repo(root: Path, base: Mapping[str, Any], edit: Callable[[str], str] = lambda t: t) -> Path:
    """A checkout with tests/fixtures' images/ and overlays/, the definition pinned to `base`."""
    shutil.copytree(FIXTURES / "images", root / "images")
    shutil.copytree(FIXTURES / "overlays", root / "overlays")
    path = root / "images" / "tiny.yaml"
    text = path.read_text()
    text = text.replace("oci:FILLED-IN-BY-THE-TEST", str(base["oci_ref"]))
    text = text.replace("sha256:" + "0" * 64, str(base["digest"]))
    path.write_text(edit(text))
    return path


def build_tiny(
    suite: str,
    store: BlobStore,
    root: Path,
    log: Callable[[str], None],
    edit: Callable[[str], str] = lambda t: t,
) -> Tiny:
    """Test base (cached) → lock → build to the engine (the build runs the probe and refuses a failure)."""
    recipe = bases.pinned_recipe(f"test-{suite}")
    base_info = bases.build_base(recipe, on_host(store, log), targets=[Target.engine()])
    path = prepare_repo(root, base_info, edit)
    lock(path, Context(store, log, seams=HOST_SEAMS), "docker")
    result = build(BuildPlan.make(path, to="docker", runner="docker"), Context(store, log, seams=HOST_SEAMS))
    base = base_image(recipe, on_host(store, log))
    definition = ImageDefinition.load(path)
    return Tiny(
        suite=suite,
        store=store,
        root=root,
        definition_path=path,
        definition=definition,
        lock=Lock.load(root / "images" / "tiny.lock.json"),
        image=result.images[0].image,
        base=base,
        python=base.labels["io.servimg.test.python"],
        tag=f"{definition.repository}:{result.tag}",
    )


def compile_in_image(image: str, interpreter: str, jobs: Sequence[Mapping[str, Any]]) -> dict[str, bytes]:
    """Compile each job's source with the image's interpreter (`-I`: no site, no .pth), as if it lived
    at job["dfile"]; returns the pyc bytes by job name."""
    with tempfile.TemporaryDirectory(prefix="servimg-plant-") as tmp:
        work = Path(tmp)
        (work / "src").mkdir()
        (work / "out").mkdir()
        (work / "compile.py").write_text(_COMPILE)
        (work / "jobs.json").write_text(json.dumps(list(jobs)))
        work.chmod(0o755)
        engine.client().containers.run(
            image,
            [interpreter, "-I", "/work/compile.py", "/work/jobs.json"],
            entrypoint=[],
            network_mode="none",
            remove=True,
            user="0:0",
            volumes={str(work): {"bind": "/work", "mode": "rw"}},
        )
        return {str(job["name"]): (work / "out" / f"{job['name']}.pyc").read_bytes() for job in jobs}


def files(items: Mapping[str, bytes]) -> list[Entry]:
    return [Entry(path.lstrip("/"), Kind.FILE, 0o644, data=data) for path, data in items.items()]


def _parents(entries: Iterable[Entry]) -> list[Entry]:
    paths = {e.path for e in entries}
    dirs: set[str] = set()
    for path in paths:
        parent = posixpath.dirname(path)
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    return [Entry(d, Kind.DIR, 0o755) for d in sorted(dirs - paths)]


def plant(
    tiny: Tiny,
    label: str,
    entries: Sequence[Entry] = (),
    *,
    env: Mapping[str, str] | None = None,
    cmd: Sequence[str] | None = None,
    workdir: str | None = None,
) -> str:
    """The clean image + one layer of `entries` (+ Env/Cmd/WorkingDir changes), loaded into the engine
    untagged. Returns its image ID; `cleanup` removes it."""
    store = tiny.store
    tmp = store.root / "tmp"
    tmp.mkdir(exist_ok=True)
    dest = tmp / f"planted-{uuid.uuid4().hex}"
    blob = write_layer([*entries, *_parents(entries)], dest, mtime=tiny.lock.source_date_epoch)
    store.adopt(dest, blob.digest)
    media = tiny.image.layers[-1].descriptor.media_type
    created = dt.datetime.fromtimestamp(tiny.lock.source_date_epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    image = tiny.image.with_layer(
        Layer(Descriptor(media, blob.digest, blob.size), blob.diff_id),
        labels={"io.servimg.test.planted": label},
        created=created,
        history=f"planted defect: {label}",
    )
    if env or cmd is not None or workdir is not None:
        config = json.loads(image.config_bytes)
        section = config["config"]
        if env:
            current = dict(str(e).partition("=")[::2] for e in section.get("Env") or [])
            current.update(env)
            section["Env"] = [f"{k}={v}" for k, v in current.items()]
        if cmd is not None:
            section["Cmd"] = list(cmd)
        if workdir is not None:
            section["WorkingDir"] = workdir
        image = Image.create(config, image.layers, manifest_media_type=image.media_type)
    engine.load(image, store, tag=None, base_config=tiny.image.config_digest)
    tiny.planted.append(str(image.config_digest))
    return str(image.config_digest)


def cleanup(tiny: Tiny) -> None:
    for image_id in tiny.planted:
        with contextlib.suppress(Exception):
            engine.client().images.remove(image_id, force=True)
    tiny.planted.clear()
