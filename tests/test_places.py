"""A place is a closed sum (`backends.target`): one parser, one printer, and what a place can hold or
names asked of the place, never its kind (issue 49)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakebase import main, make_base, package_members, tar
from servimg.backends import transport
from servimg.backends.resolve import Resolved
from servimg.backends.target import (
    ArchiveTarget,
    EngineTarget,
    Holds,
    LayoutTarget,
    RegistryTarget,
    Target,
)
from servimg.core.digest import Digest
from servimg.core.errors import BackendError
from servimg.core.progress import Log

DIGEST = Digest("sha256", "a" * 64)

SPELLINGS = [
    ("docker", EngineTarget, "docker"),
    ("engine", EngineTarget, "docker"),
    ("docker-daemon:servimg/demo:v1", EngineTarget, "docker-daemon:servimg/demo:v1"),
    ("oci:/out/demo", LayoutTarget, "oci:/out/demo"),
    ("oci:/out/demo:v1", LayoutTarget, "oci:/out/demo:v1"),
    ("docker-archive:/out/demo.tar", ArchiveTarget, "docker-archive:/out/demo.tar"),
    ("docker://127.0.0.1:5000/demo:v1", RegistryTarget, "127.0.0.1:5000/demo:v1"),
    ("127.0.0.1:5000/demo:v1", RegistryTarget, "127.0.0.1:5000/demo:v1"),
]


@pytest.mark.parametrize(("text", "kind", "printed"), SPELLINGS)
def test_one_parser_one_printer(text: str, kind: type[Target], printed: str) -> None:
    place = Target.parse(text)
    assert type(place) is kind and place.text() == printed
    assert Target.parse(place.text()) == place


def test_the_sum_is_closed() -> None:
    with pytest.raises(TypeError, match="sum of its kinds"):
        Target("somewhere")
    with pytest.raises(BackendError, match="not a target"):
        Target.parse("nowhere")
    # Same location, another kind: another place.
    assert Target.parse("oci:/x") != Target.parse("docker-archive:/x")


def test_what_each_place_holds() -> None:
    held = {
        text: {h for h in Holds if Target.parse(text).holds(h)}
        for text in ("docker", "oci:/l", "docker-archive:/a.tar", "r.example/x")
    }
    assert held == {
        "docker": {Holds.RUNNABLE},
        "oci:/l": {Holds.ATTESTATIONS, Holds.INDEX, Holds.TAGS},
        "docker-archive:/a.tar": set(),
        "r.example/x": {Holds.ATTESTATIONS, Holds.INDEX, Holds.SIMPLE_SIGNATURES, Holds.TAGS},
    }


def test_what_a_place_names() -> None:
    registry = Target.parse("r.example/team/x:v1")
    assert registry.named_tag == "v1" and registry.image_reference == "r.example/team/x:v1"
    assert registry.digest_ref(DIGEST) == f"r.example/team/x@{DIGEST}"
    assert registry.untagged() == Target.parse("r.example/team/x")
    assert Target.parse(f"r.example/x@{DIGEST}").named_tag is None

    layout = Target.parse("oci:/out/demo:v1")
    assert layout.named_tag == "v1" and layout.image_reference is None and layout.digest_ref(DIGEST) is None
    assert layout.untagged() == Target.layout("/out/demo")
    assert layout.is_layout_in(Path("/out")) and not layout.is_layout_in(Path("/elsewhere"))

    engine = Target.parse("docker-daemon:servimg/demo:v1")
    assert engine.named_tag == "v1" and engine.image_reference == "servimg/demo:v1"
    assert engine.is_engine_image_of("servimg/demo") and not engine.is_engine_image_of("servimg/other")
    assert Target.engine_image("sha256:" + "b" * 64).image_reference is None  # an ID names no reference

    # docker load refuses a bare tag in RepoTags: the engine and an archive take REPOSITORY:TAG.
    names = {
        t: Target.parse(t).name_for("servimg/demo", "v1") for t in ("docker", "docker-archive:/a", "oci:/l")
    }
    assert names == {"docker": "servimg/demo:v1", "docker-archive:/a": "servimg/demo:v1", "oci:/l": "v1"}


def test_check_resolves_its_ref_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`check` asks whether REF names an index and judges the image from one resolution (it resolved
    twice: once to look for an index, once to locate the image)."""
    layout = make_base(tmp_path / "layout", [tar(package_members())]).layout
    calls: list[str] = []
    resolve = transport.resolve

    def counted(text: str, log: Log) -> Resolved:
        calls.append(text)
        return resolve(text, log)

    monkeypatch.setattr(transport, "resolve", counted)
    code = main(["check", f"oci:{layout}", "--cache", str(tmp_path / "cache")])
    assert code == 1, "no attestation in the layout: the check fails, having judged the image"
    assert calls == [f"oci:{layout}"]
