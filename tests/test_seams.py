"""The build's seams are objects passed in: `--base-from` (the base-source seam from the command line),
and the fake base's runner and verifier given to the real CLI (tests/fakebase.py), nothing patched."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import fakebase as fb
from conftest import _require, docker_available
from servimg.assembly import defaults
from servimg.assembly.context import Context
from servimg.assembly.plan import BuildPlan
from servimg.cli import parser
from servimg.definitions.lock import Lock
from servimg.invocation.context import seams_from
from servimg.proof.verifier import ProbeRoute, probe_route
from servimg.proof.verify import VerifyFailed, VerifyReport


def _repo(tmp_path: Path) -> tuple[Path, fb.Base]:
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members())])
    definition = fb.make_repo(tmp_path / "repo", base)
    # The definition names a base this host cannot reach; --base-from says where the same bytes are.
    text = definition.read_text().replace(f"ref: {base.ref}", "ref: docker-daemon:servimg/unreachable:1")
    definition.write_text(text)
    return definition, base


def test_base_from_reads_the_base_elsewhere_and_the_lock_keeps_base_ref(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    definition, base = _repo(tmp_path)
    cache = ["--cache", str(tmp_path / "cache")]
    assert fb.main(["lock", str(definition), "--base-from", base.ref, *cache, "--quiet"]) == 0
    locked = Lock.load(definition.with_name("tiny.lock.json"))
    assert locked.base.ref == "docker-daemon:servimg/unreachable:1"
    assert locked.base.manifest_digest == base.image.digest
    out = tmp_path / "out"
    capsys.readouterr()
    code = fb.main(
        ["build", str(definition), "--base-from", base.ref, "--to", f"oci:{out}", *cache, "--json"]
    )
    assert code == 0, capsys.readouterr()
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["status"] == "OK"


def test_base_from_must_still_hold_the_pinned_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    definition, _ = _repo(tmp_path)
    other = fb.make_base(tmp_path / "other", [fb.tar([*fb.package_members(), fb.M("etc/extra", data=b"x")])])
    capsys.readouterr()
    code = fb.main(["lock", str(definition), "--base-from", other.ref, "--cache", str(tmp_path / "cache")])
    printed = capsys.readouterr().out
    assert code == 1 and printed.startswith("FAIL: ") and "unreachable" in printed
    assert not definition.with_name("tiny.lock.json").exists(), "no lock written"


def test_seams_are_chosen_once_from_the_arguments() -> None:
    args = parser().parse_args(["build", "images/demo.yaml", "--base-from", "oci:/x"])
    chosen = seams_from(args, fb.HOST_SEAMS)
    assert chosen.base_source == defaults.FromRef("oci:/x")
    assert isinstance(chosen.runners, defaults.DefaultRunners) and isinstance(
        chosen.verifier, defaults.ProbeVerifier
    )
    assert seams_from(parser().parse_args(["lock", "images/demo.yaml"]), fb.HOST_SEAMS) == fb.HOST_SEAMS
    assert seams_from(args, fb.FAKE_SEAMS).runners is fb.FAKE_SEAMS.runners


def test_from_ref_answers_a_pinned_index_offline() -> None:
    index, manifest = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    source = defaults.FromRef("oci:/x", manifests={index: manifest})
    from servimg.core.digest import Digest

    assert str(source.platform_manifest("r", Digest.parse(index), "linux/amd64")) == manifest
    assert str(source.platform_manifest("r", Digest.parse(manifest), "linux/amd64")) == manifest


def test_the_sink_is_a_seam_and_build_returns_the_image_value(tmp_path: Path) -> None:
    """Stage 4 (publish) goes through `Seams.sink`: a recording sink sees exactly the built image, and
    StoreOnly leaves it in the blob store without publishing anywhere."""
    import dataclasses

    from servimg.assembly.pipeline import build, lock
    from servimg.assembly.release import ProvenRelease
    from servimg.assembly.seams import Staged
    from servimg.oci.image import Image
    from servimg.oci.store import BlobStore

    seen: list[tuple[Image, str, str | None]] = []

    class Recording(defaults.StoreOnly):
        def publish(self, proven: ProvenRelease, staged: Staged | None, ctx: Context) -> str:
            seen.append((proven.images[0].image, proven.target.kind, proven.tag))
            return "recorded"

    definition, base = _repo(tmp_path)
    store = BlobStore(tmp_path / "cache")
    given = dataclasses.replace(fb.FAKE_SEAMS, base_source=defaults.FromRef(base.ref))
    lock(definition, Context(store, lambda _: None, seams=given))
    out = tmp_path / "never"
    result = build(
        BuildPlan.make(definition, to=f"oci:{out}"),
        Context(store, lambda _: None, seams=dataclasses.replace(given, sink=Recording())),
    )
    assert result.destination == "recorded" and not out.exists()
    assert seen == [(result.images[0].image, "oci", result.tag)]
    kept = build(
        BuildPlan.make(definition, to=f"oci:{out}"),
        Context(store, lambda _: None, seams=dataclasses.replace(given, sink=defaults.StoreOnly())),
    )
    assert kept.images[0].image == result.images[0].image and not out.exists()
    assert store.has(kept.images[0].image.config_digest) and all(
        store.has(d.digest) for d in kept.images[0].image.layer_descriptors
    )


def test_a_sink_publishes_only_a_proven_release(tmp_path: Path) -> None:
    """The order is in the types: `Sink.publish` takes a `ProvenRelease`, which only the whole probe's
    passing reports make. A sink is handed every image with its passing report; when the proof fails,
    publish is never called and what the sink staged is discarded; a plan without the proof (a rebuild
    comparing digests) publishes nothing; and no one can make a proven release of an unproven image."""
    from servimg.assembly.pipeline import build, lock
    from servimg.assembly.release import PlatformImage, ProvenRelease, Release
    from servimg.assembly.seams import Staged
    from servimg.core.errors import BuildError
    from servimg.oci.store import BlobStore

    calls: list[str] = []

    class Staging:
        def result(self) -> str:
            return "staged"

        def discard(self) -> None:
            calls.append("discard")

    class Watching(defaults.StoreOnly):
        def stage(self, release: Release, ctx: Context) -> Staged | None:
            calls.append("stage")
            return Staging()

        def publish(self, proven: ProvenRelease, staged: Staged | None, ctx: Context) -> str:
            assert all(c.report is not None and c.report.ok for c in proven.images)
            calls.append(f"publish {staged.result() if staged else None}")
            return "published"

    class Failing(fb.NoProbe):
        def report(self, image: Any, io: Any, *, base_config: Any, probe: Any = None) -> VerifyReport:
            return VerifyReport.from_json(
                {"checks": [{"code": "X", "status": "FAIL", "subject": "s", "message": "m"}]}
            )

    definition, base = _repo(tmp_path)
    store = BlobStore(tmp_path / "cache")
    given = dataclasses.replace(fb.FAKE_SEAMS, base_source=defaults.FromRef(base.ref), sink=Watching())
    lock(definition, Context(store, seams=given))
    plan = BuildPlan.make(definition, to=f"oci:{tmp_path / 'never'}")
    built = build(plan, Context(store, seams=given))
    assert calls == ["stage", "publish staged"] and built.destination == "published"
    assert built.images[0].image is not None and all(c.report is not None for c in built.images)

    calls.clear()
    with pytest.raises(VerifyFailed, match="nothing was published"):
        build(plan, Context(store, seams=dataclasses.replace(given, verifier=Failing())))
    assert calls == ["stage", "discard"], "a failed proof publishes nothing and undoes what was staged"

    calls.clear()
    unverified = dataclasses.replace(plan, verify=False)  # a rebuild comparing digests asks for none
    kept = build(unverified, Context(store, seams=given))
    assert calls == [] and kept.destination.startswith("the blob store")

    release = Release(built.images, None, plan.target, plan.full_tag)
    unproven = (dataclasses.replace(built.images[0], report=None),)
    with pytest.raises(BuildError, match="no passing probe report"):
        ProvenRelease(release, unproven)
    failed = (dataclasses.replace(built.images[0], report=Failing().report(None, None, base_config=None)),)
    with pytest.raises(BuildError, match="no passing probe report"):
        ProvenRelease(release, failed)
    other = PlatformImage(built.images[0].platform, base.image, VerifyReport(), built.images[0].base_config)
    with pytest.raises(BuildError, match="not the release's"):
        ProvenRelease(release, (other,))


class _WaitsThenRules:
    """A verifier that waits until the staged load has put the image into the engine, then rules."""

    def __init__(self, ok: bool) -> None:
        self.ok = ok
        self.saw_it_loaded = False
        self.image_id: Any = None

    def report(self, image: Any, io: Any, *, base_config: Any, probe: Any = None) -> VerifyReport:
        from servimg.backends import engine

        deadline = time.monotonic() + 60
        while not engine.has_image(image.config_digest) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.saw_it_loaded = engine.has_image(image.config_digest)
        self.image_id = image.config_digest
        status = "PASS" if self.ok else "FAIL"
        return VerifyReport.from_json(
            {"checks": [{"code": "X", "status": status, "subject": "s", "message": "m"}]}
        )


@pytest.mark.docker
def test_the_probe_route_is_chosen_once_with_the_runner_and_given_to_the_verifier(tmp_path: Path) -> None:
    """Where the image's interpreter runs is decided once per build, when it resolves (`choose_sandboxes`:
    the compile runner and the probe's route), and the verifier is handed that route."""
    from servimg.assembly.pipeline import build, lock, resolve
    from servimg.oci.store import BlobStore

    routes: list[object] = []

    class Recording(fb.NoProbe):
        def report(self, image: Any, io: Any, *, base_config: Any, probe: Any = None) -> VerifyReport:
            routes.append(probe)
            return VerifyReport()

    definition, base = _repo(tmp_path)
    store = BlobStore(tmp_path / "cache")
    given = dataclasses.replace(fb.FAKE_SEAMS, base_source=defaults.FromRef(base.ref), verifier=Recording())
    lock(definition, Context(store, lambda _: None, seams=given))
    resolution = resolve(definition, Context(store, lambda _: None, seams=given))
    assert resolution.probe is probe_route(fb.HOST) and isinstance(resolution.probe, ProbeRoute)
    build(
        BuildPlan.make(definition, to=f"oci:{tmp_path / 'out'}"), Context(store, lambda _: None, seams=given)
    )
    assert routes == [probe_route(fb.HOST)]


def test_the_engine_loads_while_verifying_and_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    """`--to docker` loads the image UNTAGGED while it is verified (a second CPU does the daemon's part);
    only a verified image is tagged, and a build that fails verification removes what it loaded."""
    from servimg.assembly.pipeline import build, lock
    from servimg.backends import engine
    from servimg.oci.store import BlobStore

    _require(docker_available(), "needs a running Docker Engine")
    marker = fb.tar([fb.F(f"opt/{uuid.uuid4().hex}", b"x")])  # an image no engine holds yet
    base = fb.make_base(tmp_path / "base", [fb.tar(fb.package_members()), marker])
    definition = fb.make_repo(tmp_path / "repo", base)
    store = BlobStore(tmp_path / "cache")
    given = dataclasses.replace(fb.FAKE_SEAMS, base_source=defaults.FromRef(base.ref))
    lock(definition, Context(store, lambda _: None, seams=given))
    tag = f"staged-{uuid.uuid4().hex[:8]}"  # not 12 hex digits: that names a lock

    def to_docker(verifier: _WaitsThenRules) -> Any:
        return build(
            BuildPlan.make(definition, to="docker", tag=tag),
            Context(store, print, seams=dataclasses.replace(given, verifier=verifier)),
        )

    refusing = _WaitsThenRules(ok=False)
    with pytest.raises(VerifyFailed, match="failed verification; nothing was published") as refused:
        to_docker(refusing)
    assert not refused.value.report.ok, "the refusal carries the report that refused"
    assert refusing.saw_it_loaded, "the load ran while the image was verified"
    assert not engine.has_image(refusing.image_id), "the failed build removed what it loaded"
    image_id = None
    accepting = _WaitsThenRules(ok=True)
    try:
        result = to_docker(accepting)
        image_id = result.images[0].image.config_digest
        assert accepting.saw_it_loaded and result.destination.endswith("(full load)"), result.destination
        assert engine.image_id(result.destination.split()[2]) == image_id, "tagged after verification"
    finally:
        if image_id is not None:
            subprocess.run(["docker", "rmi", "-f", str(image_id)], capture_output=True, check=False)


@pytest.mark.parametrize(
    "text", ["docker", "oci:out/demo", "oci:out/demo:v1", "docker-archive:/tmp/x.tar", "127.0.0.1:5000/a/b:t"]
)
def test_a_target_is_written_back_as_it_is_read(text: str) -> None:
    from servimg.backends.target import Target

    target = Target.parse(text)
    assert target.text() == text and Target.parse(target.text()) == target


def test_the_host_is_one_value_asked_once_and_only_when_needed(tmp_path: Path) -> None:
    """Issue 49: the engine was asked at seven sites. Now a command makes one `Host` (`probe_host`), its
    default seams are built from it without asking anything, and each capability is asked at most once,
    when a choice first needs it: a build from and to OCI layouts on an overlay-capable host never pings
    the engine (nor imports the Docker SDK)."""
    from servimg.assembly.plan import default_target
    from servimg.core.errors import BuildError
    from servimg.core.platform import Host, Platform

    asked: list[str] = []

    def ask(what: str, answer: bool) -> Any:
        return lambda: asked.append(what) is None and answer

    host = Host(ask("engine", False), ask("overlays", True), Platform.host())
    chosen = defaults.default_seams(host)
    assert asked == [] and chosen.host is host
    assert probe_route(host) is ProbeRoute.WARM and probe_route(host) is ProbeRoute.WARM
    assert asked == ["overlays"], "the warm root needs no engine, and each answer is kept"
    assert default_target(tmp_path / "images" / "x.yaml", host).text() == f"oci:{Path('out') / 'x'}"
    assert asked == ["overlays", "engine"]
    assert default_target(tmp_path / "x.yaml", Host.known(engine=True, overlays=False)).text() == "docker"
    with pytest.raises(BuildError, match="no target"):
        default_target(tmp_path / "x.yaml", None)
