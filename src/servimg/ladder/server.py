"""The servers a ladder's arms talk to, from start to removal: a container of the image under test (the
docker SDK: ports on 127.0.0.1 only, GPUs when asked, health wait with a timeout, logs captured, ALWAYS
removed), a local command (inside the image under test: mounts as symlinks), or an existing endpoint;
their cache directories (`wipe`, `retain-from:<arm>`) and the witness records they leave."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import requests

from servimg.backends import engine
from servimg.backends.engine import ContainerSpec, Mount
from servimg.core import jsonview as jv
from servimg.core.context import Log
from servimg.core.digest import sha256_hex
from servimg.core.errors import LadderRunError, ServimgError
from servimg.inimage import cpu_permissions
from servimg.ladder.definition import ArmSpec, substitute
from servimg.ladder.loading import LoadedLadder
from servimg.ladder.witness import collect, collect_dir
from servimg.oci.store import BlobStore

WITNESS_SPEC = "/opt/servimg/witness-spec.json"


# Where a fresh server finds the ladder's instrument (read-only, on PYTHONPATH) and reports from it.
INSTRUMENT_TARGET = "/opt/servimg/instrument"
INSTRUMENT_REPORT = "/var/lib/servimg/instrument"
# Where a fresh server finds the ladder's CPU permission request (its `sitecustomize`, read-only).
STARTUP_TARGET = "/opt/servimg/startup"
# Environment every container arm gets: no hub, no telemetry.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


@dataclass(frozen=True)
class RunConfig:
    image: str | None  # an engine ref/ID; None with `endpoint`
    out: Path
    variables: Mapping[str, str] = field(default_factory=dict)
    gpus: str | None = None
    endpoint: str | None = None  # every arm against this URL (no servers started)
    command: bool = False  # arms as local commands (server.command on the host) instead of containers
    # with `command`: realise each mount as a symlink TARGET -> SOURCE (inside the container under test,
    # e.g. a Kubernetes pod, where no engine can mount; `remote --in-container`)
    link_mounts: bool = False
    # with `link_mounts`: the image's witness spec, here (its serving processes record beside the results)
    witness_spec: Path = Path(WITNESS_SPEC)
    store: BlobStore | None = None


@dataclass
class Server:
    """A running server an arm talks to; `stop()` captures the logs and removes what was started."""

    url: str
    kind: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    facts: dict[str, object] = field(default_factory=dict)
    container: engine.Container | None = None
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    witness: bool = False
    overlay_modules: tuple[str, ...] = ()  # from the image's witness spec
    witness_dir: Path | None = None  # a local server's SERVIMG_WITNESS_DIR (inside the image under test)
    instrument_dir: Path | None = None  # where the ladder's instrument reports (host side)

    def stop(self) -> None:
        if self.container is not None:
            try:
                self.container.stop(timeout=10)
                with contextlib.suppress(Exception):
                    self.facts["exit_code"] = self.container.exit_code()
                with contextlib.suppress(Exception):
                    logs = self.container.logs()
                    if self.log_path is not None:
                        self.log_path.write_bytes(logs)
                    self.facts["logs_sha256"] = sha256_hex(logs)
            finally:
                self.container.remove()
                self.container = None
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.facts["exit_code"] = self.process.returncode
            self.process = None


def wait_healthy(server: Server, health_path: str, timeout_s: float, log: Log) -> float:
    """Seconds until GET <health_path> answered 200; raise with the log tail if the server died or hung."""
    started = time.monotonic()
    last = started
    while time.monotonic() - started < timeout_s:
        if server.container is not None and server.container.status() in ("exited", "dead"):
            tail = server.container.logs(tail=25).decode("utf-8", "replace").strip().splitlines()
            raise LadderRunError("the server exited before it was healthy", problems=tail)
        if server.process is not None and server.process.poll() is not None:
            raise LadderRunError(
                f"the server process exited ({server.process.returncode}) before it was healthy"
            )
        with contextlib.suppress(requests.RequestException):
            if requests.get(server.url + health_path, timeout=2).status_code == 200:
                return time.monotonic() - started
        if time.monotonic() - last > 30:
            log(f"  … waiting for {server.url}{health_path} ({time.monotonic() - started:.0f}s)")
            last = time.monotonic()
        time.sleep(1)
    last_lines: list[str] = []
    if server.container is not None:
        last_lines = server.container.logs(tail=25).decode("utf-8", "replace").strip().splitlines()
    raise LadderRunError(f"the server was not healthy within {timeout_s:.0f}s", problems=last_lines)


def start_server(
    loaded: LoadedLadder,
    arm: ArmSpec,
    config: RunConfig,
    variables: Mapping[str, str],
    caches: dict[tuple[str, str], Path],
    run_id: str,
    facts: dict[str, object],
    log: Log,
) -> Server:
    """The arm's server as the run asks: the endpoint itself, a local command, or a container of the
    image (mounts, caches and environment applied as the ladder says)."""
    spec = loaded.definition.server
    args = [substitute(a, variables) for a in (*spec.args, *arm.args)]
    env = {**OFFLINE_ENV, **{k: substitute(v, variables) for k, v in {**spec.env, **arm.env}.items()}}
    mounts: dict[str, Mount] = {}  # by host path: a later mount of one path replaces an earlier one
    for mount in spec.mounts:
        source = str(Path(substitute(mount.source, variables)).resolve())
        mounts[source] = Mount(source, mount.target, mount.read_only)
    facts["caches"] = _arm_caches(loaded, arm, config, variables, caches, mounts, env)
    instrument_dir = _mount_instrument(loaded, arm, config, mounts, env, facts)
    argv = (*spec.command, *args)
    if config.endpoint is not None:
        deviate(facts, f"{arm.id}: endpoint mode: no fresh server; args, env and caches not applied")
        return Server(config.endpoint.rstrip("/"), "endpoint", argv, env)
    if config.command:
        server = _start_command(arm, config, spec.port, argv, env, mounts, facts)
    else:
        server = _start_container(loaded, arm, config, args, env, mounts, run_id, log)
    server.instrument_dir = instrument_dir
    return server


def _mount_instrument(
    loaded: LoadedLadder,
    arm: ArmSpec,
    config: RunConfig,
    mounts: dict[str, Mount],
    env: dict[str, str],
    facts: dict[str, object],
) -> Path | None:
    """What the ladder adds to every fresh server, read-only on PYTHONPATH, with a new writable
    directory for what it reports (`$SERVIMG_INSTRUMENT_DIR`); that directory (None when it adds nothing):

    - its instrument at INSTRUMENT_TARGET (so a connector arm's `kv_connector_module_path` finds it; an
      arm that names no module never imports it);
    - with `cpu_permissions`, servimg's request for them (servimg/inimage/cpu_permissions.py, part of
      the pre-registered harness) as the `sitecustomize` of STARTUP_TARGET, run by every Python process.
    """
    ladder = loaded.definition
    if (loaded.instrument_path is None or ladder.instrument is None) and not ladder.cpu_permissions:
        return None
    report = config.out / "instrument" / arm.id
    shutil.rmtree(report, ignore_errors=True)
    report.mkdir(parents=True)
    report.chmod(0o777)  # the server may run as another user
    mounts[str(report.resolve())] = Mount(str(report.resolve()), INSTRUMENT_REPORT, read_only=False)
    env["SERVIMG_INSTRUMENT_DIR"] = INSTRUMENT_REPORT
    path: list[str] = []
    if loaded.instrument_path is not None and ladder.instrument is not None:
        source = str(loaded.instrument_path.resolve())
        mounts[source] = Mount(source, f"{INSTRUMENT_TARGET}/{loaded.instrument_path.name}")
        path.append(INSTRUMENT_TARGET)
        facts["instrument"] = {  # its bytes were checked against the pin when the ladder was loaded
            "path": ladder.instrument.path,
            "sha256": ladder.instrument.sha256,
            "target": f"{INSTRUMENT_TARGET}/{loaded.instrument_path.name}",
            "report": str(report),
        }
    if ladder.cpu_permissions:
        source = str(Path(cpu_permissions.__file__).resolve())
        mounts[source] = Mount(source, f"{STARTUP_TARGET}/sitecustomize.py")
        path.append(STARTUP_TARGET)
        env["SERVIMG_CPU_PERMISSIONS"] = ",".join(ladder.cpu_permissions)
    env["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [env.get("PYTHONPATH")])])
    return report


def cpu_permission_answers(server: Server, requested: tuple[str, ...]) -> dict[str, object]:
    """What Linux answered each of the server's Python processes that asked for the ladder's CPU
    permissions: per permission, how many processes got which answer ("granted", or an errno name)."""
    answers: dict[str, dict[str, int]] = {name: {} for name in requested}
    processes = 0
    for line in report_lines(server, cpu_permissions.REPORT_NAME):
        said = line.get("answers") if isinstance(line, dict) else None
        if not isinstance(said, dict):
            continue  # a line cut short by a dying process
        processes += 1
        for name, answer in said.items():
            counts = answers.setdefault(str(name), {})
            counts[str(answer)] = counts.get(str(answer), 0) + 1
    return {"requested": list(requested), "processes": processes, "answers": answers}


def instrument_requests(server: Server) -> list[object]:
    """The instrument's per-request lines so far."""
    return report_lines(server, "requests.jsonl")


def report_lines(server: Server, name: str) -> list[object]:
    """The lines of a JSON-lines report in the server's report directory so far (a line cut short by a
    dying process is kept as its text); none before the first line or without a report directory."""
    if server.instrument_dir is None:
        return []
    try:
        lines = (server.instrument_dir / name).read_text().splitlines()
    except FileNotFoundError:
        return []
    parsed: list[object] = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            parsed.append(line)
    return parsed


def instrument_metrics(server: Server) -> str:
    """The instrument's counters (Prometheus text) as of now; "" before its first report."""
    if server.instrument_dir is None:
        return ""
    try:
        return (server.instrument_dir / "metrics.prom").read_text()
    except FileNotFoundError:
        return ""


def _arm_caches(
    loaded: LoadedLadder,
    arm: ArmSpec,
    config: RunConfig,
    variables: Mapping[str, str],
    caches: dict[tuple[str, str], Path],
    mounts: dict[str, Mount],
    env: dict[str, str],
) -> dict[str, object]:
    """The arm's cache dirs (`wipe`: new and empty; `retain-from:<arm>`: that arm's), mounted at their
    targets with their environment; what each held at the start."""
    cache_facts: dict[str, object] = {}
    for name, mode in sorted(arm.caches.items()):
        cache = loaded.definition.caches[name]
        if mode == "wipe":
            path = config.out / "caches" / f"{arm.id}-{name}"
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True)
        else:
            path = caches[(mode.removeprefix("retain-from:"), name)]
        caches[(arm.id, name)] = path
        files = [p for p in path.rglob("*") if p.is_file()]
        cache_facts[name] = {
            "mode": mode,
            "host": str(path),
            "target": cache.target,
            "files_at_start": len(files),
            "bytes_at_start": sum(p.stat().st_size for p in files),
        }
        mounts[str(path.resolve())] = Mount(str(path.resolve()), cache.target)
        env.update({k: substitute(v, variables) for k, v in cache.env.items()})
    return cache_facts


def _start_command(
    arm: ArmSpec,
    config: RunConfig,
    port: int,
    argv: tuple[str, ...],
    env: dict[str, str],
    mounts: Mapping[str, Mount],
    facts: dict[str, object],
) -> Server:
    """The server as a local process (inside the image under test with `link_mounts`: its mounts as
    symlinks and its witness records beside the results, as a container would have them)."""
    log_path = config.out / "logs" / f"{arm.id}.log"
    witness_dir = None
    if config.link_mounts:
        for bound in mounts.values():
            link_mount(bound)
        if config.witness_spec.is_file():
            witness_dir = config.out / "witness-raw" / arm.id
            shutil.rmtree(witness_dir, ignore_errors=True)
            witness_dir.mkdir(parents=True)
            env["SERVIMG_WITNESS_DIR"] = str(witness_dir)
    elif mounts:
        deviate(facts, f"{arm.id}: local command: mounts not applied ({', '.join(mounts)})")
    base = image_env(os.environ) if config.link_mounts else dict(os.environ)
    with log_path.open("wb") as fh:
        process = subprocess.Popen(list(argv), env={**base, **env}, stdout=fh, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", "command", argv, env, process=process, log_path=log_path)
    if witness_dir is not None:
        server.witness, server.witness_dir = True, witness_dir
        server.overlay_modules = spec_modules(json.loads(config.witness_spec.read_bytes()))
    return server


def _start_container(
    loaded: LoadedLadder,
    arm: ArmSpec,
    config: RunConfig,
    args: list[str],
    env: dict[str, str],
    mounts: Mapping[str, Mount],
    run_id: str,
    log: Log,
) -> Server:
    """A container of the image under test, labelled with the run (so the run removes it whatever
    happens), its port published on 127.0.0.1; the witness spec read from it."""
    ladder = loaded.definition
    spec = ladder.server
    assert config.image is not None
    container = engine.start(
        ContainerSpec(
            config.image,
            args,
            entrypoint=spec.command,
            env=env,
            mounts=tuple(mounts.values()),
            network=True,
            ports=(spec.port,),
            shm_size=spec.shm_size,
            gpus=config.gpus,
            labels={
                "io.servimg.ladder": ladder.name,
                "io.servimg.ladder.run": run_id,
                "io.servimg.ladder.arm": arm.id,
            },
            name=f"servimg-ladder-{run_id}-{arm.id}",
        )
    )
    argv = (*spec.command, *args)
    server = Server(
        "", "docker", argv, env, container=container, log_path=config.out / "logs" / f"{arm.id}.log"
    )
    try:
        port = container.host_port(spec.port, timeout=30)
        if port is None:
            raise LadderRunError(f"the container never published port {spec.port}")
        server.url = f"http://127.0.0.1:{port}"
        server.facts.update(
            {
                "container": container.id[:12],
                "image": container.image_id,
                "port": port,
                "gpus": config.gpus,
                "shm_size": spec.shm_size,
                "mounts": {k: f"{m.target}:{m.mode}" for k, m in sorted(mounts.items())},
            }
        )
        spec_tar = container.archive(WITNESS_SPEC)
        server.witness = spec_tar is not None
        server.overlay_modules = overlay_modules(spec_tar) if spec_tar is not None else ()
        log(f"  started container {container.id[:12]} on 127.0.0.1:{port}")
    except BaseException:
        server.stop()
        raise
    return server


# What a Kubernetes Job adds to the image's environment for the harness (`servimg.placement.k8s`): not for
# the servers, which get the environment a container of the image would.
HARNESS_ENV = ("PYTHONDONTWRITEBYTECODE", "SERVIMG_JOB_ID", "SERVIMG_NODE")


def image_env(environ: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without what was added for the harness: its variables, and its own
    directory on PYTHONPATH (the servers must not import servimg's copy of the docker SDK)."""
    harness = str(Path(__file__).resolve().parents[2])
    out = {k: v for k, v in environ.items() if k not in HARNESS_ENV}
    path = [p for p in out.pop("PYTHONPATH", "").split(os.pathsep) if p and str(Path(p).resolve()) != harness]
    if path:
        out["PYTHONPATH"] = os.pathsep.join(path)
    return out


def link_mount(mount: Mount) -> None:
    """Make `mount.target` a symlink to `mount.source` (what a bind mount does for a container, done from
    inside one). An earlier link is replaced (a restart arm over a retained cache points it again); a real
    file or a non-empty directory there is refused: it would be shadowed, not mounted over."""
    target = Path(mount.target)
    if target.is_symlink():
        target.unlink()
    elif target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    elif target.exists():
        raise LadderRunError(
            f"cannot mount {mount.source} at {mount.target} inside this container: something is there",
            hint="the image under test must not ship files at a ladder mount or cache target",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to(mount.source, target_is_directory=True)


def overlay_modules(spec_tar: bytes) -> tuple[str, ...]:
    """The overlay modules a witness spec (as `docker cp` streams it) lists."""
    with tarfile.open(fileobj=io.BytesIO(spec_tar)) as tar:
        for member in tar.getmembers():
            handle = tar.extractfile(member) if member.isfile() else None
            if handle is not None:
                return spec_modules(json.loads(handle.read()))
    return ()


def spec_modules(spec: Mapping[str, object]) -> tuple[str, ...]:
    return tuple(sorted({str(m["module"]) for m in jv.objs(spec.get("modules") or [], "modules")}))


def fact_list(facts: dict[str, object], key: str) -> list[object]:
    """The list an arm's (or image's) facts collect under `key`, started when absent."""
    value = facts.setdefault(key, [])
    if not isinstance(value, list):
        raise TypeError(f"facts[{key!r}] is a {type(value).__name__}, not a list")
    return value


def fact_map(facts: dict[str, object], key: str) -> dict[str, object]:
    """The mapping an arm's facts collect under `key`, started when absent."""
    value = facts.setdefault(key, {})
    if not isinstance(value, dict):
        raise TypeError(f"facts[{key!r}] is a {type(value).__name__}, not a mapping")
    return value


def deviate(facts: dict[str, object], text: str) -> None:
    """Record in an arm's facts how its run deviated from the ladder as written (the receipt lists it)."""
    fact_list(facts, "deviations").append(text)


def remove_run_containers(run_id: str) -> None:
    """Belt and braces: remove any container of this run still there (e.g. created just before Ctrl-C)."""
    engine.remove_labelled(f"io.servimg.ladder.run={run_id}")


def collect_witness(server: Server, out: Path, log: Log) -> tuple[tuple[str, ...], dict[str, object]]:
    """Witness records of the serving processes (`witness.collect`); none recorded is a problem."""
    try:
        if server.container is not None:
            result = collect(server.container.id, out)
        else:
            assert server.witness_dir is not None
            result = collect_dir(server.witness_dir, out)
    except ServimgError as exc:
        return (f"witness files could not be collected: {exc.message}",), {"error": exc.message}
    problems = list(result.problems())
    if not result.records() and server.overlay_modules:  # an image without overlays has none to record
        problems.append("no serving process recorded loading an overlay module")
    log(f"  witness: {len(result.records())} record(s), {len(problems)} problem(s)")
    return tuple(problems), result.as_dict()
