"""Host side of the probe (docs/design.md, "probe"): the spec derived from the lock, the base's sentinel
verdicts, running the probe inside an image, and the report.

The probe itself (`servimg/inimage/probe.py`, standard library only) is shipped into every image with its spec
as `/opt/servimg/probe.py` and `/opt/servimg/probe-spec.json` (`probe_files`); it is run there by the
image's own interpreter and answers with a JSON report that `VerifyReport.from_json` reads.
"""

from __future__ import annotations

import io
import json
import posixpath
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from servimg.backends import engine
from servimg.backends.engine import ContainerSpec
from servimg.core import canonical
from servimg.core import jsonview as jv
from servimg.core.digest import Digest, sha256_hex
from servimg.core.errors import BackendError, ServimgError, VerifyError
from servimg.core.findings import Finding, Findings, Status
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import Lock
from servimg.inimage import probe
from servimg.oci import integrity
from servimg.oci.filesystem import LayeredFS
from servimg.oci.image import Image
from servimg.oci.store import Io
from servimg.patching.bytecode import ImageChroot, Sandbox, extract_runtime
from servimg.proof.probespec import (
    SPEC_VERSION,
    ProbeSpec,
    SpecDistribution,
    SpecForbidden,
    SpecLayer,
    SpecModule,
    SpecPackage,
    SpecSentinel,
)
from servimg.proof.sentinels import sentinel_key

PROBE_SOURCE = Path(probe.__file__)
PROBE_IN_IMAGE = "/opt/servimg/probe.py"
SPEC_IN_IMAGE = "/opt/servimg/probe-spec.json"
CHANGES_IN_IMAGE = "/opt/servimg/changes.json"
LOCK_IN_IMAGE = "/opt/servimg/lock.json"
DEFINITION_IN_IMAGE = "/opt/servimg/definition.json"


# -- spec -----------------------------------------------------------------------------------------


def module_name(path: str, site_packages: str) -> str | None:
    """`<site>/vllm/v1/core/sched/scheduler.py` → `vllm.v1.core.sched.scheduler` (`pkg/__init__.py` → `pkg`);
    None for a file that is not an importable Python module."""
    rel = posixpath.relpath(path, site_packages)
    if rel.startswith("../") or not rel.endswith(".py"):
        return None
    parts = rel.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    if not parts or not all(part.isidentifier() for part in parts):
        return None
    return ".".join(parts)


def probe_spec(
    lock: Lock,
    definition: ImageDefinition,
    base_has: Mapping[str, bool] | None = None,
    *,
    entry: str = "module",
    layer: bool = False,
) -> dict[str, object]:
    """The canonical, JSON-able probe spec (`build_probe_spec(...).to_json()`): what the image carries."""
    return build_probe_spec(lock, definition, base_has, entry=entry, layer=layer).to_json()


def build_probe_spec(
    lock: Lock,
    definition: ImageDefinition,
    base_has: Mapping[str, bool] | None = None,
    *,
    entry: str = "module",
    layer: bool = False,
) -> ProbeSpec:
    """The probe spec for an image built from `lock` and `definition`.

    `layer` is for the spec a build carries in its image: the probe then also checks every file the
    overlay layer adds against the changes manifest, and the in-image lock and definition against their
    sha256 here (LAYER), so an image altered after its build fails verify with the file named.

    `base_has` maps `sentinel_key` → whether the BASE already had that sentinel (`base_sentinel_verdicts`);
    without it, a sentinel whose key the lock lists in `sentinels_absent_in_base` counts as absent and any
    other `absent_in_base` sentinel has no verdict (the probe fails it). `entry` is how the service starts
    (`module` for `python -m`, `script:PATH`, `command`, `none`): it decides `sys.path[0]`."""
    if lock.definition_sha256 != definition.digest.hex:
        raise VerifyError(
            f"the lock was made from another definition (sha256 {lock.definition_sha256[:12]}…, "
            f"this one {definition.digest.hex[:12]}…)",
            hint=f"run `servimg lock` for {definition.name}",
        )
    final = _final_files(lock)
    sentinels, forbidden = _spec_sentinels(lock, definition, base_has)
    overlay_packages = {o.package for o in lock.overlays}
    interp = lock.interpreter
    carried = SpecLayer(
        CHANGES_IN_IMAGE,
        (
            (LOCK_IN_IMAGE, lock.digest.hex),
            (DEFINITION_IN_IMAGE, sha256_hex(definition.canonical_bytes())),
        ),
    )
    return ProbeSpec(
        image=lock.name,
        lock_digest=lock.digest,
        entry=entry,
        interpreter=interp,
        modules=_spec_modules(lock, final),
        sentinels=sentinels,
        forbidden=forbidden,
        distributions=tuple(
            SpecDistribution(
                pkg.distribution,
                pkg.version,
                pkg.import_name,
                pkg.dist_info,
                pkg.record_sha256,
                tuple(
                    (path, post)
                    for path, (post, package, _) in sorted(final.items())
                    if package == pkg.import_name
                ),
            )
            for pkg in lock.packages
        ),
        packages=tuple(
            SpecPackage(
                pkg.import_name,
                posixpath.join(pkg.site_packages, pkg.import_name),
                pkg.import_name in overlay_packages,
            )
            for pkg in lock.packages
        ),
        layer=carried if layer else None,
        spec_version=SPEC_VERSION,
    )


def _final_files(lock: Lock) -> dict[str, tuple[str | None, str, list[str]]]:
    """Every file the overlays touch: path → (its final sha256, its package, the overlays, in order)."""
    final: dict[str, tuple[str | None, str, list[str]]] = {}
    for overlay in lock.overlays:
        for file in overlay.files:
            previous = final.get(file.path)
            ids = [*(previous[2] if previous else []), overlay.id]
            final[file.path] = (file.post_sha256, overlay.package, ids)
    return final


def _spec_modules(
    lock: Lock, final: Mapping[str, tuple[str | None, str, list[str]]]
) -> tuple[SpecModule, ...]:
    """The importable modules among the patched files (a file outside its package's site dir refused)."""
    packages = {p.import_name: p for p in lock.packages}
    modules = []
    for path, (post, package, ids) in sorted(final.items()):
        site = packages[package].site_packages
        name = module_name(path, site)
        if name is not None:
            modules.append(SpecModule(name, path, post, site, package, tuple(ids)))
        elif posixpath.relpath(path, site).startswith("../"):
            raise VerifyError(
                f"overlay file {path} is outside its package's site-packages {site}",
                hint="regenerate the lock with `servimg lock`",
            )
    return tuple(modules)


def _spec_sentinels(
    lock: Lock, definition: ImageDefinition, base_has: Mapping[str, bool] | None
) -> tuple[tuple[SpecSentinel, ...], tuple[SpecForbidden, ...]]:
    """Each locked overlay's sentinels (with the base's verdict where known) and forbidden names."""
    specs = {o.id: o for o in definition.overlays}
    sentinels, forbidden = [], []
    for overlay in lock.overlays:
        spec = specs.get(overlay.id)
        if spec is None:
            raise VerifyError(
                f"overlay {overlay.id} is in the lock but not in the definition",
                hint=f"run `servimg lock` for {definition.name}",
            )
        for sentinel in spec.sentinels:
            key = sentinel_key(sentinel)
            verdict: bool | None = None
            if base_has is not None and key in base_has:
                verdict = bool(base_has[key])
            elif key in overlay.sentinels_absent_in_base:
                verdict = False
            sentinels.append(
                SpecSentinel(
                    key,
                    sentinel.module,
                    sentinel.qualname,
                    sentinel.name,
                    sentinel.const,
                    sentinel.absent_in_base,
                    verdict,
                    overlay.id,
                )
            )
        forbidden += [SpecForbidden(f.module, f.qualname, f.name, overlay.id) for f in spec.forbidden]
    return tuple(sentinels), tuple(forbidden)


def probe_files(spec: Mapping[str, object]) -> dict[str, bytes]:
    """The files the image carries for the probe, by image path without the leading `/`."""
    return {
        PROBE_IN_IMAGE.lstrip("/"): PROBE_SOURCE.read_bytes(),
        SPEC_IN_IMAGE.lstrip("/"): canonical.dumps(spec),
    }


# -- the service's command -------------------------------------------------------------------------
# Interpreter options that change what an import resolves to or which bytecode it accepts; the others
# (-u, -v, -W …) are dropped. -I implies -E -s (and -P on 3.11+).
_IMPORT_FLAGS = "BEIOPsS"
_TAKES_ARGUMENT = "cmWX"
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclass(frozen=True)
class ServiceCommand:
    """How the image's own command (Entrypoint + Cmd) runs Python: the import-relevant interpreter
    options and the entry (`module` for -m, `command` for -c or stdin, `script:PATH`)."""

    argv: tuple[str, ...]
    python_args: tuple[str, ...] = ()
    entry: str | None = None

    @property
    def runs_python(self) -> bool:
        return self.entry is not None


def service_command(config: Mapping[str, object], interpreter: str | None = None) -> ServiceCommand:
    """Parse the image config's Entrypoint + Cmd when it execs a Python interpreter directly (a `python*`
    binary, or `interpreter`); anything else (a shell wrapper, a launcher script) gives no flags and no
    entry, and the probe keeps its defaults (it still sees the image's Env and WorkingDir)."""
    argv = tuple(str(a) for a in [*jv.seq(config.get("Entrypoint") or []), *jv.seq(config.get("Cmd") or [])])
    if not argv or not (argv[0] == interpreter or _PYTHON_NAME.match(posixpath.basename(argv[0]))):
        return ServiceCommand(argv)
    flags: list[str] = []
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        if arg == "--check-hash-based-pycs" and rest:
            flags += [arg, rest.pop(0)]
        elif arg.startswith("--check-hash-based-pycs="):
            flags += ["--check-hash-based-pycs", arg.partition("=")[2]]
        elif arg == "--":
            return ServiceCommand(argv, tuple(flags), f"script:{rest[0]}" if rest else "command")
        elif arg == "-" or not arg.startswith("-"):
            return ServiceCommand(argv, tuple(flags), "command" if arg == "-" else f"script:{arg}")
        elif arg.startswith("--"):
            continue  # --help, --version, … : nothing that changes imports
        else:
            for i, char in enumerate(arg[1:], start=1):
                if char in _TAKES_ARGUMENT:
                    value = arg[i + 1 :] or (rest.pop(0) if rest else "")
                    if char == "m":
                        return ServiceCommand(argv, tuple(flags), "module")
                    if char == "c":
                        return ServiceCommand(argv, tuple(flags), "command")
                    if char == "X":
                        flags += ["-X", value]
                    break
                if char in _IMPORT_FLAGS:
                    flags.append(f"-{char}")
    return ServiceCommand(argv, tuple(flags), "command")  # the interactive interpreter reads stdin


# -- running it -----------------------------------------------------------------------------------
def probe_command(
    interpreter: str,
    python_args: Sequence[str],
    spec_path: str,
    *,
    audit: bool = False,
    entry: str | None = None,
) -> list[str]:
    """The probe's command line, wherever it runs (a container, a chroot, the warm root): the image's
    interpreter with the service's flags, the probe, its spec."""
    command = [interpreter, *python_args, PROBE_IN_IMAGE, spec_path, "--json"]
    command += ["--audit"] if audit else []
    return command + (["--entry", entry] if entry else [])


def read_probe_report(returncode: int, stdout: str, stderr: str, where: str, hint: str) -> dict[str, object]:
    """The probe's JSON report from its output, the one reader of it: its last JSON line, with exit 0
    (passed) or 1 (failed checks). Anything else is VerifyError saying what came out `where` it ran."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    try:
        report = json.loads(lines[-1]) if lines else None
    except ValueError:
        report = None
    if returncode not in (0, 1) or not isinstance(report, dict) or "checks" not in report:
        detail = report.get("error") if isinstance(report, dict) else None
        raise VerifyError(
            f"the probe exited {returncode} {where}: {detail or stderr.strip()[-500:] or 'no report'}",
            hint=hint,
        )
    return report


def probe_in(
    sandbox: Sandbox, command: Sequence[str], env: Mapping[str, str], workdir: str | None
) -> dict[str, object]:
    """The probe as a job on `sandbox` (a container of the image, a chroot of its files, the warm root's
    overlay: the same Protocol the compiler runs on), its report read by the one reader."""
    proc = sandbox.execute(command, env, None, workdir)
    return read_probe_report(proc.returncode, proc.stdout, proc.stderr, f"in {sandbox.name}", sandbox.hint)


@dataclass
class ImageContainer:
    """A throwaway container of a loaded image (`--network none`, removed afterwards) started as its
    service would be: the image's Env (plus what a job passes), its user unless one is named."""

    image: str
    name: str
    hint: str
    user: str | None = None
    timeout: float = 1800.0

    def execute(
        self, argv: Sequence[str], env: Mapping[str, str], work: Path | None, workdir: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        if work is not None:
            raise VerifyError("the probe's container mounts no work dir", hint="pass work=None")
        spec = ContainerSpec(self.image, list(argv), env=dict(env) or None, workdir=workdir, user=self.user)
        try:
            exited = engine.run(spec, timeout=self.timeout)
        except BackendError as exc:
            raise VerifyError(f"the probe in {self.image}: {exc.message}", hint=exc.hint) from exc
        return subprocess.CompletedProcess(list(argv), exited.status, exited.stdout, exited.stderr)


def run_probe_in_docker(
    image: str,
    spec_path_in_image: str = SPEC_IN_IMAGE,
    *,
    audit: bool = False,
    env: Mapping[str, str] | None = None,
    workdir: str | None = None,
    user: str | None = None,
    python: str | None = None,
    python_args: Sequence[str] | None = None,
    entry: str | None = None,
    timeout: float = 1800.0,
) -> dict[str, object]:
    """Run the probe in a throwaway container of `image` (`--network none`, removed afterwards) and return
    its JSON report. The image's entrypoint is bypassed; its Env and WorkingDir apply unless `env` /
    `workdir` override them, so the probe sees what the service sees. `python` defaults to the interpreter
    the spec names (read from the image without running it); `python_args` are interpreter flags such as
    `-O` or `--check-hash-based-pycs never`. Left None, the flags and the entry are the image command's
    own (`service_command`), so the probe runs as the service would."""
    interpreter = python or _spec_interpreter(image, spec_path_in_image)
    if python_args is None:
        service = service_command(_engine_config(image), interpreter)
        python_args = service.python_args
        entry = entry or service.entry
    command = probe_command(interpreter, python_args, spec_path_in_image, audit=audit, entry=entry)
    hint = (
        f"run it by hand: docker run --rm --network none --entrypoint {interpreter} {image} "
        f"{PROBE_IN_IMAGE} {spec_path_in_image}"
    )
    container = ImageContainer(image, image, hint, user=user, timeout=timeout)
    return probe_in(container, command, env or {}, workdir)


def run_probe_in_chroot(
    fs: LayeredFS,
    config_env: Mapping[str, str],
    workdir: str,
    *,
    audit: bool = False,
    config: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """The daemonless path: materialise the whole image (packages included) and run the probe under the
    image's interpreter in a chroot (`bytecode.chroot_run`, the compile runner's too), with the image
    config's Env and WorkingDir (and, given the image `config`, its command's interpreter flags and
    entry: `service_command`)."""
    spec = json.loads(fs.read(SPEC_IN_IMAGE.lstrip("/")))
    interpreter = str(spec["interpreter"]["path"])
    service = service_command(config or {}, interpreter)
    with tempfile.TemporaryDirectory(prefix="servimg-verify-") as tmp:
        root = Path(tmp)
        extract_runtime(fs, root, packages=True)
        command = probe_command(
            interpreter, service.python_args, SPEC_IN_IMAGE, audit=audit, entry=service.entry
        )
        return probe_in(ImageChroot(root), command, config_env, workdir or "/")


def _engine_config(image: str) -> dict[str, object]:
    """The engine's view of the image config (`Entrypoint`, `Cmd`, `Env`, `WorkingDir` …)."""
    try:
        return engine.image_config(image)
    except BackendError as exc:
        raise VerifyError(f"cannot inspect {image}: {exc.message}", hint="is the image loaded?") from exc


def _spec_interpreter(image: str, spec_path: str) -> str:
    """The interpreter path the image's probe spec names, copied out of the image without running it."""
    hint = "was the image built by `servimg build`? its probe spec names the interpreter `verify` runs"
    try:
        data = engine.copy_out(image, spec_path)
        if data is None:
            raise VerifyError(f"{image} has no probe spec at {spec_path}", hint=hint)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member is not None else None
            doc = json.loads(handle.read()) if handle is not None else {}
    except BackendError as exc:
        raise VerifyError(exc.message, hint=exc.hint) from exc
    except (tarfile.TarError, ValueError) as exc:
        raise VerifyError(f"{image} has no readable probe spec at {spec_path}: {exc}", hint=hint) from exc
    path = jv.member(doc, "interpreter", "path") if isinstance(doc, dict) else None
    if not isinstance(path, str) or not path:
        raise VerifyError(
            f"the probe spec in {image} names no interpreter", hint="rebuild with `servimg build`"
        )
    return path


# -- report ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VerifyReport(Findings):
    """A probe report: one `Finding` per check the probe printed, plus the facts it ran under."""

    interpreter: Mapping[str, object] = field(default_factory=dict)
    environment: Mapping[str, object] = field(default_factory=dict)
    image: str | None = None
    lock_digest: Digest | None = None
    spec_sha256: str | None = None
    audit: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> VerifyReport:
        if "error" in data and "checks" not in data:
            raise VerifyError(f"the probe failed: {data['error']}", hint="check the probe spec in the image")
        try:
            checks = tuple(
                Finding(
                    str(c["code"]),
                    Status(str(c["status"])),
                    str(c["subject"]),
                    str(c["message"]),
                    str(c.get("hint") or ""),
                    dict(jv.obj(c.get("details") or {})),
                )
                for c in jv.objs(data["checks"], "checks")
            )
        except (KeyError, TypeError, ValueError, jv.JsonShapeError) as exc:
            raise VerifyError(
                f"malformed probe report: {exc!r}", hint="probe and servimg versions differ?"
            ) from None
        return cls(
            checks,
            dict(jv.obj(data.get("interpreter") or {}, "interpreter")),
            dict(jv.obj(data.get("environment") or {}, "environment")),
            jv.optional_text(data.get("image"), "image"),
            _optional_digest(data.get("lock_digest"), "lock_digest"),
            jv.optional_text(data.get("spec_sha256"), "spec_sha256"),
            bool(data.get("audit", False)),
        )

    def notes(self) -> list[str]:
        """What the probe ran under: the image command's flags, Env and WorkingDir."""
        facts, env = self.interpreter, self.environment
        if not facts:
            return []
        flags = " ".join(
            f"{key}={facts.get(key)}" for key in ("optimize", "check_hash_based_pycs", "pycache_prefix")
        )
        return [f"interpreter {facts.get('executable')} {facts.get('version')}: {flags} cwd={env.get('cwd')}"]

    def title(self) -> str:
        return f"probe: {self.image or '?'}"

    def as_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "image": self.image,
            "lock_digest": None if self.lock_digest is None else str(self.lock_digest),
            "spec_sha256": self.spec_sha256,
            "audit": self.audit,
            "summary": self.counts(),
            "interpreter": dict(self.interpreter),
            "environment": dict(self.environment),
            "checks": [c.as_dict() for c in self.findings],
        }


class VerifyFailed(VerifyError):
    """The probe ran and the image failed it; carries the report. `subject` and `consequence` make the
    refusal of a command that needed a verified image ("the built image sha256:… failed verification;
    nothing was tagged"): the one message `proof.verifier.verify_or_refuse` raises wherever it runs."""

    def __init__(self, report: VerifyReport, *, subject: str = "", consequence: str = "") -> None:
        problems = report.problems()
        if subject:
            message = f"{subject} failed verification" + (f"; {consequence}" if consequence else "")
            hint = (
                report.first_hint()
                or "run `servimg verify` on it for the full table; fix the overlay or the base"
            )
        else:
            message, hint = f"{len(problems)} check(s) failed", report.first_hint()
        super().__init__(message, problems=problems, hint=hint)
        self.report = report

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "report": self.report.as_dict()}


# -- whole images ---------------------------------------------------------------------------------
def verify_image_value(
    image: Image,
    io: Io,
    *,
    audit: bool = False,
    base_config: Digest | None = None,
    in_container: bool,
) -> VerifyReport:
    """Probe an image value whose blobs are in the context's store: `in_container` (the route chosen for
    this host, `proof.verifier.ProbeRoute`), in a container of it (the image is loaded untagged, thin over
    its base, and removed again if the probe fails and it was not there before; `docker load` checks every
    layer it takes against its diffID), otherwise in a chroot of its extracted layers, each layer of the
    store hashed first against its digest and diffID."""
    store, log = io.store, io.log
    if not in_container:
        integrity.prove_layers(image, store)
        log("verifying in a chroot (no Docker Engine)")
        fs = LayeredFS.of_layers(image.layers, store)
        config = jv.obj(image.config.get("config") or {}, "config")
        workdir = str(config.get("WorkingDir") or "/")
        report = VerifyReport.from_json(
            run_probe_in_chroot(fs, image.env, workdir, audit=audit, config=config)
        )
        return report
    existed = engine.has_image(image.config_digest)
    if not existed:
        engine.load(image, store, tag=None, base_config=base_config)
    log(f"verifying {image.config_digest.short} in a container (--network none)")
    try:
        report = VerifyReport.from_json(run_probe_in_docker(str(image.config_digest), audit=audit))
    except ServimgError:
        if not existed:
            engine.remove(image.config_digest)
        raise
    if not report.ok and not existed:
        engine.remove(image.config_digest)
    return report


def _optional_digest(value: object, where: str) -> Digest | None:
    text = jv.optional_text(value, where)
    try:
        return None if text is None else Digest.parse(text)
    except ServimgError as exc:
        raise VerifyError(f"malformed probe report: {where}: {exc.message}", hint=exc.hint) from None
