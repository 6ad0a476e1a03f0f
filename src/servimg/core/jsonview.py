"""Reading parsed JSON by shape: each accessor narrows `object` to the type the caller reads, or says where
the document is not what servimg wrote.

JSON that servimg reads back (probe reports, receipts, attestation predicates, manifests, engine answers)
is typed `object` at the border, never `Any`: a reader states the shape it relies on through these
accessors, so mypy checks every use after them, and a damaged or foreign document fails with the key that
was wrong instead of an AttributeError three calls later. Definitions and locks, which users write, go
through the collecting validators of `core.fields` instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from servimg.core.errors import ServimgError

JsonObject = Mapping[str, object]


class JsonShapeError(ServimgError):
    """A JSON document read back does not have the shape this servimg version writes."""

    def __init__(self, where: str, expected: str, value: object) -> None:
        super().__init__(
            f"{where or 'document'}: expected {expected}, found {type(value).__name__}",
            hint="the document was written by another tool or version, or is damaged: "
            "write it again with this servimg version (build, push or ladder) and retry",
        )


def obj(value: object, where: str = "") -> JsonObject:
    """`value` as a JSON object."""
    if isinstance(value, Mapping):
        return value
    raise JsonShapeError(where, "an object", value)


def seq(value: object, where: str = "") -> Sequence[object]:
    """`value` as a JSON array."""
    if isinstance(value, (list, tuple)):
        return value
    raise JsonShapeError(where, "an array", value)


def objs(value: object, where: str = "") -> list[JsonObject]:
    """`value` as a JSON array of objects."""
    return [obj(item, f"{where}[{i}]") for i, item in enumerate(seq(value, where))]


def text(value: object, where: str = "") -> str:
    if isinstance(value, str):
        return value
    raise JsonShapeError(where, "a string", value)


def texts(value: object, where: str = "") -> list[str]:
    return [text(item, f"{where}[{i}]") for i, item in enumerate(seq(value, where))]


def optional_text(value: object, where: str = "") -> str | None:
    return None if value is None else text(value, where)


def integer(value: object, where: str = "") -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise JsonShapeError(where, "an integer", value)


def number(value: object, where: str = "") -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise JsonShapeError(where, "a number", value)


def flag(value: object, where: str = "") -> bool:
    if isinstance(value, bool):
        return value
    raise JsonShapeError(where, "true or false", value)


def member(document: JsonObject, *keys: str) -> object:
    """The value at `keys` under nested objects, or None where a key is missing or a level is no object
    (for optional facts; use `obj`/`text` on the parts a reader relies on)."""
    value: object = document
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value
