"""The local Docker Engine, via the SDK: a base source (`docker save`), a sink (thin `docker load`), and the
one way servimg runs a container of an image (compile, probe, witness, ladder servers, the tiny model).
What a build's sink asks (inspect, load, tag, ping) goes over the unix socket by hand first
(`backends.enginesocket`: no SDK import, no client set-up), and the SDK's way when that cannot answer.

The tag is applied only after the engine reports the complete image under the expected ID (= config
digest), so a failed or interrupted load never moves a tag. The SDK's objects stay inside this module:
callers get a `Container` handle and `Exited` results with plain types.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from servimg.backends import enginesocket
from servimg.backends.archive import read_archive, write_archive
from servimg.backends.enginesocket import Answer, socket_image_id
from servimg.backends.referrers import Referrers, ReferrersError
from servimg.backends.resolve import EngineImage
from servimg.backends.target import ReadOptions, Target, WriteOptions, one_child, only_child_said
from servimg.core import jsonview as jv
from servimg.core.atomic import atomic_write
from servimg.core.digest import Digest
from servimg.core.errors import BackendError, ServimgError
from servimg.core.lazy import LazyModule
from servimg.oci.image import Image
from servimg.oci.index import IndexedImages
from servimg.oci.store import BlobStore, Io

# The SDK (requests, urllib3, its API modules: ≈0.2 s) is imported when an engine is first asked: a
# build that neither reads from nor writes to the engine never pays for it.
docker = LazyModule("docker")
LOAD_TIMEOUT = 600.0  # the SDK client's: a full load of a multi-GB base takes minutes


def client() -> Any:
    """A docker SDK client from the environment (DOCKER_HOST …), or a clear error."""
    try:
        c = docker.from_env(timeout=600)
        c.ping()
        return c
    except Exception as exc:  # the SDK raises several unrelated types for "no engine"
        raise BackendError(
            f"cannot reach the Docker Engine: {exc}",
            hint="start dockerd (e.g. `dockerd &`) or choose another sink with --to oci:DIR",
        ) from exc


def server_version() -> str:
    """The engine's version (`docker version`'s Server.Version), "?" when it does not say."""
    answer = enginesocket.request("GET", "/version")
    if answer is None or answer.status != 200:
        return "?"
    try:
        return str(answer.json().get("Version") or "?")
    except (ValueError, AttributeError):
        return "?"


def engine_available() -> bool:
    try:
        client()
    except BackendError:
        return False
    return True


class _ChunkStream(io.RawIOBase):
    """Adapt the SDK's chunk generator to a readable stream for tarfile's streaming mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def read_engine(ref: str, store: BlobStore) -> Image:
    """`docker save` the image and read it like a docker-archive (manifest re-created canonically); an
    image read before (same ID) comes from the store, asked of the engine in one plain API call."""
    quick = socket_image_id(ref)
    known = cached(quick, store) if quick is not None else None
    if known is not None:
        return known
    c = client()
    try:
        engine_image = c.images.get(ref)
    except Exception as exc:
        raise BackendError(
            f"the Docker Engine has no image {ref!r}: {exc}",
            hint="build or pull the base first (demo: `servimg base demo`)",
        ) from exc
    config_digest = Digest.parse(engine_image.id)
    known = cached(config_digest, store)
    if known is not None:
        return known
    stream = io.BufferedReader(_ChunkStream(iter(engine_image.save(named=False))), buffer_size=1 << 20)
    image = read_archive(stream, store)
    _remember(image, store)
    return image


def _index_path(config_digest: Digest, store: BlobStore) -> Path:
    return store.layout.engine / config_digest.hex


def cached(config_digest: Digest, store: BlobStore) -> Image | None:
    """An engine image already read once: same image ID (= config digest) means the same content, so
    skip the multi-GB `docker save` when every blob is still in the store."""
    try:
        manifest_digest = Digest.parse(_index_path(config_digest, store).read_text().strip())
        image = Image.parse(store.read(manifest_digest), store.read(config_digest))
    except (OSError, ServimgError):
        return None
    # With sizes: a blob truncated under its name is dropped, and the base is read from the engine again.
    if all(store.has(d.digest, d.size) for d in image.layer_descriptors):
        return image
    return None


def _remember(image: Image, store: BlobStore) -> None:
    path = _index_path(image.config_digest, store)
    path.parent.mkdir(exist_ok=True)
    # A unique temp name: two builds reading the same base concurrently must not share one.
    atomic_write(path, str(image.digest).encode(), 0o644)


def image_id(ref: str) -> Digest | None:
    """The engine's image ID for `ref`; None when it has no such image."""
    answer = enginesocket.image_answer(ref)
    if answer is not None and answer.status == 404:
        return None
    found = enginesocket.image_id_in(answer)
    if found is not None:
        return found
    try:
        return Digest.parse(client().images.get(ref).id)
    except BackendError:
        raise
    except Exception:
        return None


def list_images() -> list[EngineImage] | None:
    """Every image the engine holds (intermediate ones included: an ID may name one), or None when no
    engine is reachable. One API call (`GET /images/json?all=1`), however many images there are."""
    try:
        raw = client().api.images(all=True)
    except BackendError:
        return None
    found: list[EngineImage] = []
    for attrs in raw:
        try:
            image = Digest.parse(str(attrs.get("Id")))
        except ServimgError:
            continue  # not a sha256 image ID (a foreign store): it cannot be named by one either
        tags = tuple(t for t in attrs.get("RepoTags") or () if t != "<none>:<none>")
        digests = tuple(d for d in attrs.get("RepoDigests") or () if not d.startswith("<none>@"))
        found.append(EngineImage(image, tags, digests))
    return found


def pull_by_digest(repository: str, manifest: Digest, expected_config: Digest) -> Digest:
    """`docker pull REPOSITORY@MANIFEST`; refuse unless the engine then holds `expected_config` (a node
    that pulled other bytes than the submitter resolved must not run them). Returns the image ID."""
    ref = f"{repository}@{manifest}"
    try:
        pulled = Digest.parse(client().images.pull(ref).id)
    except BackendError:
        raise
    except Exception as exc:
        raise BackendError(
            f"cannot pull {ref}: {exc}", hint="can this host reach the registry, and does it hold the digest?"
        ) from exc
    if pulled != expected_config:
        raise BackendError(f"{ref} pulled as image {pulled}, not the expected {expected_config}")
    return pulled


def has_image(config_digest: Digest) -> bool:
    return image_id(str(config_digest)) == config_digest


def load(image: Image, store: BlobStore, *, tag: str | None, base_config: Digest | None = None) -> str:
    """Load `image` into the engine; thin (only layers the engine lacks) when it holds the base.

    Returns "present" (nothing sent), "thin" or "full". Tags only after verifying that the engine holds
    the image under the expected ID (= config digest).
    """
    _remember(image, store)  # the engine ID alone does not name the manifest: remember which one it is
    if has_image(image.config_digest):
        _tag(image, tag)
        return "present"
    thin = base_config is not None and has_image(base_config)
    skip: frozenset[Digest] = frozenset()
    if thin:
        skip = frozenset(
            Digest.parse(d) for d in jv.texts(jv.member(inspect(str(base_config)), "RootFS", "Layers"))
        )
    spool = store.layout.tmp
    spool.mkdir(exist_ok=True)  # a store made for one image (a layout's) may never have spooled before
    with tempfile.TemporaryFile(dir=spool) as fh:
        write_archive(image, fh, store, skip_layers=skip)
        fh.seek(0)
        _load_archive(fh)
    loaded = image_id(str(image.config_digest))
    if loaded != image.config_digest:
        raise BackendError(
            f"docker load did not produce image {image.config_digest}",
            hint="the engine rejected the image; no tag was moved",
        )
    _tag(image, tag)
    return "thin" if thin else "full"


def _load_archive(fh: BinaryIO) -> None:
    """`docker load` of the archive in `fh` (at its start): POST /images/load on the socket, else the SDK."""
    hint = "see the dockerd log; no tag was moved"
    answer = enginesocket.request("POST", "/images/load?quiet=1", body=fh, timeout=LOAD_TIMEOUT)
    if answer is not None:
        problem = _load_problem(answer)
        if problem is not None:
            raise BackendError(f"docker load failed: {problem}", hint=hint)
        return
    fh.seek(0)
    try:
        client().api.load_image(fh, quiet=True)
    except BackendError:
        raise
    except Exception as exc:
        raise BackendError(f"docker load failed: {exc}", hint=hint) from exc


def _load_problem(answer: Answer) -> str | None:
    """The engine's refusal of a load: a failing status, or an `error` event in its JSON stream."""
    if answer.status != 200:
        return _message(answer)
    for line in answer.body.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict) and event.get("error"):
                return str(event["error"])
    return None


def _message(answer: Answer) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        return f"{answer.status}: {answer.json().get('message')}"
    return f"{answer.status}: {answer.body[:300].decode('utf-8', 'replace')}"


def _tag(image: Image, tag: str | None) -> None:
    if not tag:
        return
    repo, _, name = tag.rpartition(":") if ":" in tag.rpartition("/")[2] else (tag, "", "latest")
    query = urllib.parse.urlencode({"repo": repo, "tag": name, "force": 1})
    answer = enginesocket.request("POST", f"/images/{image.config_digest}/tag?{query}")
    if answer is not None and answer.status in (200, 201):
        return
    if answer is not None:
        raise BackendError(f"could not tag {image.config_digest} as {tag}: {_message(answer)}")
    if not client().api.tag(str(image.config_digest), repo, name, force=True):
        raise BackendError(f"could not tag {image.config_digest} as {tag}")


def remove(config_digest: Digest) -> None:
    """Remove an untagged image servimg loaded (used when the loaded image failed verification)."""
    # Best effort: it may be in use or already gone; nothing was tagged either way.
    with contextlib.suppress(Exception):
        client().images.remove(str(config_digest), force=False, noprune=False)


def destination(tag: str | None, config_digest: Digest, how: str) -> str:
    """Where a load put the image, for people: its tag (or ID) and how it went (`load`'s answer)."""
    return f"docker engine {tag or config_digest} ({how} load)"


class EngineBackend:
    """`docker-daemon:NAME` / `docker`: read with `docker save`, written by a thin `docker load`."""

    def read(self, target: Target, io: Io, how: ReadOptions) -> Image:
        # The engine verifies each layer against its diffID itself (`docker load`) and names the image by
        # its config digest; with `rehash` the caller proves the store's copy (integrity.prove_layers).
        io.log(f"reading {target.location} from the Docker Engine")
        return read_engine(target.location, io.store)

    def write(self, image: Image, target: Target, io: Io, options: WriteOptions) -> str:
        tag = options.get("tag")
        how = load(image, io.store, tag=tag, base_config=options.get("base_config"))
        # After a staged load this load only tags ("present"); say how the image itself came in.
        return destination(tag, image.config_digest, options.get("staged") or how)

    def write_index(self, indexed: IndexedImages, target: Target, io: Io, options: WriteOptions) -> str:
        platform, child = one_child(indexed, options, "the Docker Engine")
        where = self.write(child, target, io, options)
        why = f"Docker Engine {server_version()} stores single-platform images"
        return only_child_said(where, platform, indexed, why)

    def check_reachable(self, target: Target) -> None:
        answer = enginesocket.request("GET", "/_ping")
        if answer is None or answer.status != 200:
            client()  # the SDK's way, with its error when no engine answers

    def referrers(self, target: Target) -> AbstractContextManager[Referrers]:
        raise ReferrersError(
            f"{target.text()}: attestations cannot live in the Docker Engine",
            hint="push to HOST/REPO[:TAG] or oci:DIR[:TAG]",
        )


BACKEND = EngineBackend()


# ------------------------------------------------------------------------------------------ containers


@dataclass(frozen=True)
class Mount:
    """A host path bound into the container."""

    source: str
    target: str
    read_only: bool = False

    @property
    def mode(self) -> str:
        return "ro" if self.read_only else "rw"


@dataclass(frozen=True)
class ContainerSpec:
    """A container of `image` running `command`.

    The image's entrypoint is bypassed unless `entrypoint` is None (a given list replaces it); its Env and
    WorkingDir apply unless `env` / `workdir` override them. Without `network` the container has no network
    at all (`--network none`: compilers and probes must not reach anything); `ports` are published on
    127.0.0.1 only, each on an ephemeral host port (`Container.host_port`)."""

    image: str
    command: Sequence[str] = ()
    entrypoint: Sequence[str] | None = ()
    mounts: Sequence[Mount] = ()
    env: Mapping[str, str] | None = None
    workdir: str | None = None
    user: str | None = None
    network: bool = False
    ports: Sequence[int] = ()
    shm_size: str | None = None
    gpus: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None

    def sdk_arguments(self) -> dict[str, object]:
        """The docker SDK's `containers.create` keyword arguments for this spec."""
        return {
            "entrypoint": list(self.entrypoint) if self.entrypoint is not None else None,
            "environment": dict(self.env) if self.env is not None else None,
            "working_dir": self.workdir,
            "user": self.user,
            "network_mode": None if self.network else "none",
            "ports": {f"{p}/tcp": ("127.0.0.1", None) for p in self.ports} or None,
            "shm_size": self.shm_size,
            "device_requests": device_requests(self.gpus) or None,
            "volumes": {m.source: {"bind": m.target, "mode": m.mode} for m in self.mounts} or None,
            "labels": dict(self.labels) or None,
            "name": self.name,
        }


def device_requests(gpus: str | None) -> list[Any]:
    """`--gpus all` or `--gpus 0,1` as docker device requests (none without the flag)."""
    if not gpus:
        return []
    if gpus == "all":
        return [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return [docker.types.DeviceRequest(device_ids=gpus.split(","), capabilities=[["gpu"]])]


@dataclass(frozen=True)
class Exited:
    """A container that ran to the end: its exit status and what it printed."""

    status: int
    stdout: str
    stderr: str


class Container:
    """A handle on one container (the SDK object stays inside)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    @property
    def id(self) -> str:
        return str(self._raw.id)

    @property
    def image_id(self) -> str:
        return str(self._raw.image.id)

    def env(self) -> dict[str, str]:
        """The container's environment (its config's Env)."""
        items = jv.seq(jv.member(self._raw.attrs, "Config", "Env") or [], "Config.Env")
        return {key: value for key, _, value in (str(item).partition("=") for item in items)}

    def status(self) -> str:
        """created | running | exited | dead …, as the engine says now."""
        self._raw.reload()
        return str(self._raw.status)

    def exit_code(self) -> int | None:
        self._raw.reload()
        code = jv.member(self._raw.attrs, "State", "ExitCode")
        return jv.integer(code, "State.ExitCode") if code is not None else None

    def host_port(self, port: int, timeout: float = 30) -> int | None:
        """The 127.0.0.1 port `port` is published on; None if the container exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._raw.reload()
            bindings = jv.member(self._raw.attrs, "NetworkSettings", "Ports", f"{port}/tcp")
            if bindings:
                return int(jv.text(jv.objs(bindings)[0].get("HostPort"), "HostPort"))
            if self._raw.status in ("exited", "dead"):
                return None
            time.sleep(0.2)
        return None

    def start(self) -> None:
        self._raw.start()

    def wait(self, timeout: float) -> int:
        return int(self._raw.wait(timeout=timeout).get("StatusCode", -1))

    def logs(self, *, stdout: bool = True, stderr: bool = True, tail: int | None = None) -> bytes:
        kwargs: dict[str, object] = {"stdout": stdout, "stderr": stderr}
        if tail is not None:
            kwargs["tail"] = tail
        return bytes(self._raw.logs(**kwargs))

    def archive(self, path: str) -> bytes | None:
        """`path` in the container as a tar stream (`docker cp`); None only when it does not exist. Any
        other engine error is raised, never read as "absent"."""
        try:
            chunks, _ = self._raw.get_archive(path)
            return b"".join(chunks)
        except docker.errors.NotFound:
            return None
        except Exception as exc:
            raise BackendError(f"cannot copy {path} out of container {self.id[:12]}: {exc}") from exc

    def stop(self, timeout: float = 10) -> None:
        with contextlib.suppress(Exception):
            self._raw.stop(timeout=timeout)

    def remove(self) -> None:
        """Remove it, running or not (best effort: it may be gone already)."""
        with contextlib.suppress(Exception):
            self._raw.remove(force=True)


def create(spec: ContainerSpec) -> Container:
    """Create (not start) a container of the spec; BackendError if the engine refuses."""
    c = client()
    try:
        return Container(c.containers.create(spec.image, list(spec.command), **spec.sdk_arguments()))
    except Exception as exc:
        raise BackendError(
            f"cannot create a container of {spec.image}: {exc}", hint="is the image loaded?"
        ) from exc


def start(spec: ContainerSpec) -> Container:
    """A detached container of the spec, started (a server); the caller removes it."""
    container = create(spec)
    try:
        container.start()
    except Exception as exc:
        container.remove()
        raise BackendError(
            f"cannot start a container of {spec.image}: {exc}", hint="see the dockerd log"
        ) from exc
    return container


def run(spec: ContainerSpec, *, timeout: float = 1800.0) -> Exited:
    """Run a container of the spec to the end and return what it printed; it is always removed."""
    container = create(spec)
    try:
        container.start()
        status = container.wait(timeout)
        stdout = container.logs(stderr=False).decode("utf-8", "replace")
        stderr = container.logs(stdout=False).decode("utf-8", "replace")
    except Exception as exc:
        raise BackendError(
            f"running a container of {spec.image} failed: {exc}", hint="see the dockerd log"
        ) from exc
    finally:
        container.remove()
    return Exited(status, stdout, stderr)


def copy_out(image: str, path: str) -> bytes | None:
    """`path` in `image` as a tar stream, copied from a created, never started, container: nothing of the
    image runs. None when the image has no such path."""
    created = create(ContainerSpec(image, ["/servimg-never-run"]))
    try:
        return created.archive(path)
    finally:
        created.remove()


def container(name: str) -> Container:
    """An existing container by name or ID."""
    try:
        return Container(client().containers.get(name))
    except BackendError:
        raise
    except Exception as exc:
        raise BackendError(f"no container {name!r}: {exc}", hint="docker ps -a") from exc


def remove_labelled(label: str) -> None:
    """Remove every container carrying `label` (`key=value`), best effort."""
    with contextlib.suppress(Exception):
        for leftover in client().containers.list(all=True, filters={"label": label}):
            Container(leftover).remove()


def image_config(ref: str) -> dict[str, object]:
    """The engine's view of an image's config (`Entrypoint`, `Cmd`, `Env`, `WorkingDir` …)."""
    return dict(jv.obj(inspect(ref).get("Config") or {}, "Config"))


def inspect(ref: str) -> dict[str, object]:
    """`docker image inspect REF` (Id, RepoDigests, Config …); BackendError if the engine lacks it."""
    answer = enginesocket.image_answer(ref)
    if answer is not None and answer.status == 200:
        with contextlib.suppress(ValueError):
            found = answer.json()
            if isinstance(found, dict):
                return found
    if answer is not None and answer.status == 404:
        raise BackendError(
            f"the Docker Engine has no image {ref!r}: {_message(answer)}", hint="build or pull it first"
        )
    c = client()
    try:
        return dict(c.images.get(ref).attrs)
    except Exception as exc:
        raise BackendError(
            f"the Docker Engine has no image {ref!r}: {exc}", hint="build or pull it first"
        ) from exc
