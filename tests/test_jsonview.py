"""core.jsonview: JSON read back is narrowed by shape, and a document of another shape names its key."""

from __future__ import annotations

import pytest

from servimg.core import jsonview as jv
from servimg.core.digest import Digest
from servimg.core.errors import ServimgError
from servimg.definitions.lock import InterpreterLock
from servimg.proof.probespec import ProbeSpec, SpecLayer, SpecSentinel


def test_accessors_return_the_value_of_the_shape_asked_for() -> None:
    doc = {"a": {"b": [{"c": "x"}]}, "n": 3, "f": 0.5, "t": True, "s": ["p", "q"]}
    assert jv.obj(doc) is doc
    assert jv.objs(jv.member(doc, "a", "b")) == [{"c": "x"}]
    assert jv.texts(doc["s"]) == ["p", "q"]
    assert (jv.integer(doc["n"]), jv.number(doc["n"]), jv.number(doc["f"]), jv.flag(doc["t"])) == (
        3,
        3.0,
        0.5,
        True,
    )
    assert jv.optional_text(None) is None and jv.optional_text("v") == "v"
    assert jv.member(doc, "a", "missing", "deeper") is None
    assert jv.member(doc, "n", "below-a-number") is None


@pytest.mark.parametrize(
    ("read", "value", "expected"),
    [
        (jv.obj, [1], "expected an object, found list"),
        (jv.seq, {"k": 1}, "expected an array, found dict"),
        (jv.text, 7, "expected a string, found int"),
        (jv.integer, True, "expected an integer, found bool"),  # a JSON boolean is no count
        (jv.number, "1.5", "expected a number, found str"),
        (jv.flag, 1, "expected true or false, found int"),
    ],
)
def test_another_shape_is_refused_with_where_and_what(read: object, value: object, expected: str) -> None:
    assert callable(read)
    with pytest.raises(jv.JsonShapeError) as caught:
        read(value, "report.checks[2]")
    assert str(caught.value) == f"report.checks[2]: {expected}"
    assert isinstance(caught.value, ServimgError) and "this servimg version" in caught.value.diagnostics()


def test_objs_names_the_item_that_is_no_object() -> None:
    with pytest.raises(jv.JsonShapeError, match=r"^arms\[1\]: expected an object, found str$"):
        jv.objs([{}, "arm"], "arms")


def _spec() -> ProbeSpec:
    interp = InterpreterLock(
        "/usr/bin/python3", "/usr/bin/python3.11", "3.11.2", "a70d0d0a", "cpython-311", (0,), None
    )
    sentinel = SpecSentinel("k", "m", "f", "NAME", None, True, False, "gate")
    return ProbeSpec(
        "demo", Digest("sha256", "0" * 64), "module", interp, (), (sentinel,), (), (), (), SpecLayer("c", ())
    )


def test_a_probe_spec_round_trips_and_a_damaged_one_names_its_key() -> None:
    spec = _spec()
    assert ProbeSpec.from_json(spec.to_json()) == spec
    damaged = {**spec.to_json(), "sentinels": [{**spec.sentinels[0].to_json(), "absent_in_base": "yes"}]}
    with pytest.raises(
        jv.JsonShapeError, match=r"sentinels\[\]\.absent_in_base: expected true or false, found str"
    ):
        ProbeSpec.from_json(damaged)
    with pytest.raises(jv.JsonShapeError, match=r"^interpreter: expected an object, found NoneType$"):
        ProbeSpec.from_json({k: v for k, v in spec.to_json().items() if k != "interpreter"})
